// tessel-train: trains a model of the zoo from a config (configs/*.prototxt,
// schema zoo/config.proto) under the layout the config and the launch give.
//
//   tessel-launch --nproc_per_node 4 -- tessel-train --config configs/gpt2_tiny.prototxt
//   tessel-train --config configs/gpt2_tiny.prototxt --set train.train_iter=50 --set optim.lr=3e-4
//
// Before the first step it resolves and checks the config against the world
// (batch sizes, dist sizes, model sizes), opens the dataset and checks its
// token ids against the vocabulary; any mismatch is an error naming the
// field. Rank 0 saves the resolved config as <output_dir>/config.prototxt,
// prints a line every train.log_period iterations and appends it to
// <output_dir>/metrics.jsonl and as TensorBoard scalars (events.out.tfevents.*),
// with an evaluation (loss, perplexity) every evaluation.eval_period
// iterations and at the end.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/plan/graph.h"
#include "layers/dist.h"
#include "layers/optimizer.h"
#include "models/gpt.h"
#include "runtime/actor_runtime.h"
#include "zoo/config.h"
#include "zoo/event_writer.h"
#include "zoo/gpt_dataset.h"
#include "zoo/indexed_dataset.h"

DEFINE_string(
    config, "",
    "the training config (protobuf text, schema zoo/config.proto), e.g. configs/gpt2_tiny.prototxt");
DEFINE_bool(fast_dev_run, false,
            "a smoke run: 2 training iterations and 1 evaluation batch, a log line each, nothing written to "
            "the output directory (also --fast-dev-run)");

using namespace tessel;

namespace {

// --set path=value (repeatable; also --set=path=value) and --fast-dev-run are
// taken out of argv before gflags sees it: gflags keeps only the last of a
// repeated flag and knows no dashes in names.
std::vector<std::string> TakeOverrides(int* argc, char** argv) {
  std::vector<std::string> overrides;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--set" || arg == "-set") {
      if (i + 1 >= *argc) {
        std::fprintf(stderr,
                     "tessel-train: --set needs a value, e.g. --set train.dist.tensor_parallel_size=2\n");
        std::exit(2);
      }
      overrides.push_back(argv[++i]);
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else if (arg == "--fast-dev-run") {
      argv[out++] = const_cast<char*>("--fast_dev_run");
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return overrides;
}

double PeakResidentMiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

std::string HoursMinutesSeconds(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char text[32];
  std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  return text;
}

double LearningRate(const config::Config& c, int64_t iteration) {
  const auto& s = c.scheduler();
  const double lr = c.optim().lr();
  if (s.name() == "constant") return lr;
  if (s.name() == "warmup_linear")
    return optim::WarmupLinearLr(iteration, lr, s.warmup_iter(), c.train().train_iter(), s.min_lr());
  return optim::WarmupCosineLr(iteration, lr, s.warmup_iter(), c.train().train_iter(), s.min_lr());
}

// One global batch as this rank's inputs: the rows of its data-parallel
// index, ids on the first stage's ranks and labels on the last's (a rank
// of neither reads nothing). Rows are samples first + r·L .. first + (r+1)·L
// of a global batch of `rows` samples split over dp (L = rows / dp).
struct BatchReader {
  const zoo::GPTDataset& data;
  int64_t rows, dp, seq;
  Placement first, last;
  NdSbp first_sbp, last_sbp;

  int DataParallelIndex() const {
    const int64_t tp = dist::GetConfig().tensor_parallel_size;
    return static_cast<int>(dist::Rank() % (dp * tp) / tp);
  }
  // The micro-batch `part` of `parts` of this rank's rows, as global inputs.
  std::map<std::string, Tensor> Read(int64_t first_sample, int part = 0, int parts = 1) const {
    const int me = dist::Rank();
    const bool needs_ids = first.Contains(me), needs_labels = last.Contains(me);
    const int64_t local_rows = rows / dp / parts;
    std::vector<int64_t> ids, labels, tokens;
    if (needs_ids || needs_labels) {
      const int64_t begin = first_sample + DataParallelIndex() * (rows / dp) + part * local_rows;
      for (int64_t i = 0; i < local_rows; ++i) {
        tokens.clear();
        data.Sample((begin + i) % data.size(), &tokens);
        ids.insert(ids.end(), tokens.begin(), tokens.end() - 1);
        labels.insert(labels.end(), tokens.begin() + 1, tokens.end());
      }
    }
    const Shape shape({rows / parts, seq});
    // A rank outside a placement gives no rows, but in the inputs' dtype
    // (an undefined tensor would read as f32 and change the graph's specs).
    const Tensor none = Tensor::FromVector<int64_t>({}, {0, seq});
    Tensor local_ids = needs_ids ? Tensor::FromVector<int64_t>(ids, {local_rows, seq}) : none;
    Tensor local_labels = needs_labels ? Tensor::FromVector<int64_t>(labels, {local_rows, seq}) : none;
    return {{"ids", FromLocal(local_ids, first, first_sbp, shape)},
            {"labels", FromLocal(local_labels, last, last_sbp, shape)}};
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> overrides = TakeOverrides(&argc, argv);
  gflags::SetUsageMessage(
      "tessel-train --config FILE [--set path.to.field=value ...] [--fast_dev_run]\n"
      "Trains a model of the zoo from a config; run it under tessel-launch for several ranks.");
  tessel::Init(&argc, &argv);
  TESSEL_CHECK(!FLAGS_config.empty())
      << "tessel-train: --config is required (e.g. configs/gpt2_tiny.prototxt)";
  config::Config c = zoo::LoadConfig(FLAGS_config);
  for (const std::string& o : overrides) zoo::ApplyOverride(&c, o);
  const int world = dist::WorldSize(), rank = dist::Rank();
  zoo::ResolveConfig(&c, world);
  config::TrainConfig& t = *c.mutable_train();
  if (FLAGS_fast_dev_run) {
    t.set_train_iter(2);
    t.set_log_period(1);
    c.mutable_evaluation()->set_eval_iter(1);
    c.mutable_evaluation()->set_eval_period(2);
    c.mutable_scheduler()->set_warmup_iter(0);
  }
  const config::ModelConfig& m = c.model();
  const config::DistConfig& d = t.dist();
  dist::Setup({.data_parallel_size = d.data_parallel_size(),
               .tensor_parallel_size = d.tensor_parallel_size(),
               .pipeline_parallel_size = d.pipeline_parallel_size(),
               .pipeline_num_layers = d.pipeline_num_layers(),
               .custom_pipeline_stage_ids = {d.custom_pipeline_stage_id().begin(),
                                             d.custom_pipeline_stage_id().end()}});

  // Data: checked before the model is built.
  zoo::IndexedDataset corpus(c.data().data_prefix());
  const int64_t max_token = corpus.MaxToken();
  TESSEL_CHECK(max_token < m.vocab_size())
      << "tessel-train: dataset " << c.data().data_prefix() << " holds token id " << max_token
      << " but model.vocab_size is " << m.vocab_size() << "; expected a vocabulary larger than every id";
  const std::vector<zoo::DocumentRange> splits =
      zoo::SplitDocuments(c.data().split(), corpus.num_documents());
  const int64_t global = t.global_batch_size(), seq = m.max_seq_length();
  zoo::GPTDataset train_data(corpus, splits[0], seq, t.train_iter() * global, t.seed(), "train");
  const bool evaluate = c.evaluation().enabled();
  TESSEL_CHECK(!evaluate || splits[1].size() > 0)
      << "tessel-train: data.split '" << c.data().split() << "' gives the validation split no documents of "
      << corpus.num_documents() << "; give it a share or set evaluation.enabled false";
  std::unique_ptr<zoo::GPTDataset> eval_data;
  if (evaluate)
    eval_data = std::make_unique<zoo::GPTDataset>(corpus, splits[1], seq, c.evaluation().eval_iter() * global,
                                                  t.seed() + 1, "validation");

  models::GPTConfig gpt_config{
      .vocab_size = m.vocab_size(),
      .hidden = m.hidden_size(),
      .heads = m.num_attention_heads(),
      .layers = m.hidden_layers(),
      .max_seq = m.max_seq_length(),
      .ffn_hidden = m.ffn_hidden_size(),
      .layernorm_epsilon = m.layernorm_epsilon(),
      .init_std = m.initializer_range(),
      .seed = t.seed(),
      .activation = m.hidden_act() == "gelu" ? layers::Activation::kGelu : layers::Activation::kGeluTanh,
      .embedding_dropout = m.embedding_dropout_prob(),
      .attention_dropout = m.attention_dropout_prob(),
      .hidden_dropout = m.hidden_dropout_prob(),
      .make_vocab_size_divisible_by = m.make_vocab_size_divisible_by(),
      .activation_checkpoint = t.activation_checkpoint()};
  models::GPT gpt(gpt_config);
  auto params = gpt.NamedParameters();
  const config::OptimConfig& o = c.optim();
  optim::AdamW adamw(params, {.lr = o.lr(),
                              .beta1 = o.beta1(),
                              .beta2 = o.beta2(),
                              .eps = o.eps(),
                              .weight_decay = o.weight_decay()});
  const int micro_batches = static_cast<int>(t.num_accumulation_steps());
  const bool graph = t.graph().enabled(), in_order = t.graph().pipeline() == "in_order";
  runtime::ActorRuntime actors(
      {.schedule = in_order ? runtime::Schedule::kOneFOneB : runtime::ParseSchedule(t.graph().pipeline())});
  const double clip = o.clip_grad_norm();
  Graph train_step("train_step",
                   [&](const Graph::Tensors& in) {
                     Tensor loss = gpt.Loss(in.at("ids"), in.at("labels"));
                     loss.backward();
                     Tensor grad_norm = optim::ClipGradNormTensor(params, clip);
                     adamw.Step();
                     return Graph::Tensors{{"loss", loss}, {"grad_norm", grad_norm}};
                   },
                   {.micro_batches = micro_batches,
                    .stage_ranks = dist::StageRanks(),
                    .layer_stages = dist::LayerStages(),
                    .executor = in_order ? nullptr : actors.Executor()});
  // Evaluation runs forward only, one op after another.
  Graph eval_step("eval_step",
                  [&](const Graph::Tensors& in) {
                    return Graph::Tensors{{"loss", gpt.Loss(in.at("ids"), in.at("labels"))}};
                  },
                  {.micro_batches = micro_batches,
                   .stage_ranks = dist::StageRanks(),
                   .layer_stages = dist::LayerStages()});

  const int64_t dp = d.data_parallel_size();
  const Placement first = dist::GetLayerPlacement(0), last = dist::GetLayerPlacement(-1);
  const NdSbp hidden = dist::GetHiddenSbp();
  const BatchReader train_reader{train_data, global, dp, seq, first, last, hidden, hidden};

  const std::filesystem::path out_dir = t.output_dir();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics(nullptr, &std::fclose);
  std::unique_ptr<zoo::EventWriter> events;  // TensorBoard scalars, beside metrics.jsonl
  if (rank == 0 && !FLAGS_fast_dev_run) {
    std::filesystem::create_directories(out_dir);
    std::ofstream(out_dir / "config.prototxt") << zoo::ConfigText(c);
    metrics.reset(std::fopen((out_dir / "metrics.jsonl").c_str(), "w"));
    TESSEL_CHECK(metrics != nullptr) << "tessel-train: cannot write " << (out_dir / "metrics.jsonl").string()
                                     << ": " << std::strerror(errno);
    events = std::make_unique<zoo::EventWriter>(out_dir);
  }
  if (rank == 0) {
    std::printf(
        "tessel-train: %s, %ld layers, hidden %ld, vocab %ld, sequence %ld; world %d = dp %ld x tp %ld x "
        "pp %ld; global batch %ld = micro %ld x dp %ld x accumulation %d; %s%s; %ld iterations; "
        "train %ld samples (%d epochs of %zu documents), validation %zu documents\n",
        m.arch().c_str(), static_cast<long>(m.hidden_layers()), static_cast<long>(m.hidden_size()),
        static_cast<long>(m.vocab_size()), static_cast<long>(seq), world, static_cast<long>(dp),
        static_cast<long>(d.tensor_parallel_size()), static_cast<long>(d.pipeline_parallel_size()),
        static_cast<long>(global), static_cast<long>(t.micro_batch_size()), static_cast<long>(dp),
        micro_batches, graph ? "graph mode, " : "eager", graph ? t.graph().pipeline().c_str() : "",
        static_cast<long>(t.train_iter()), static_cast<long>(train_data.size()), train_data.epochs(),
        splits[0].size(), splits[1].size());
    std::fflush(stdout);
  }

  auto evaluate_now = [&](int64_t iteration) {
    double total = 0;
    const BatchReader reader{*eval_data, global, dp, seq, first, last, hidden, hidden};
    for (int64_t k = 0; k < c.evaluation().eval_iter(); ++k) {
      if (graph) {
        total += optim::ScalarValue(eval_step(reader.Read(k * global)).at("loss"));
      } else {
        NoGradGuard no_grad;
        gpt.Eval();  // no dropout
        double batch = 0;
        for (int part = 0; part < micro_batches; ++part) {
          auto in = reader.Read(k * global, part, micro_batches);
          batch += optim::ScalarValue(gpt.Loss(in.at("ids"), in.at("labels")));
        }
        total += batch / micro_batches;
        gpt.Train();
      }
    }
    const double loss = total / static_cast<double>(c.evaluation().eval_iter());
    if (rank == 0) {
      std::printf("evaluation at iteration %ld: loss %.6f perplexity %.3f\n", static_cast<long>(iteration),
                  loss, std::exp(loss));
      std::fflush(stdout);
      if (metrics)
        std::fprintf(metrics.get(), "{\"iteration\": %ld, \"eval_loss\": %.7f, \"eval_perplexity\": %.5f}\n",
                     static_cast<long>(iteration), loss, std::exp(loss));
      if (events) {
        events->AddScalar("eval/loss", iteration, loss);
        events->AddScalar("eval/perplexity", iteration, std::exp(loss));
        events->Flush();
      }
    }
  };

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto period_start = start;
  double period_data_seconds = 0;
  int64_t period_iterations = 0;
  for (int64_t it = 0; it < t.train_iter(); ++it) {
    adamw.set_lr(LearningRate(c, it));
    double loss = 0, grad_norm = 0;
    if (graph) {
      const auto data_start = Clock::now();
      auto in = train_reader.Read(it * global);
      period_data_seconds += std::chrono::duration<double>(Clock::now() - data_start).count();
      Graph::Tensors out = train_step(in);
      loss = optim::ScalarValue(out.at("loss"));
      grad_norm = optim::ScalarValue(out.at("grad_norm"));
    } else {
      // Eagerly, micro-batches are a loop: each backward adds its share.
      for (int part = 0; part < micro_batches; ++part) {
        const auto data_start = Clock::now();
        auto in = train_reader.Read(it * global, part, micro_batches);
        period_data_seconds += std::chrono::duration<double>(Clock::now() - data_start).count();
        Tensor part_loss = gpt.Loss(in.at("ids"), in.at("labels"));
        if (micro_batches > 1) part_loss = fn::mul_scalar(part_loss, 1.0 / micro_batches);
        part_loss.backward();
        loss += optim::ScalarValue(part_loss);
      }
      grad_norm = optim::ClipGradNorm(params, clip);
      adamw.Step();
    }
    ++period_iterations;
    const int64_t done = it + 1;
    if (done == 1 || done % t.log_period() == 0 || done == t.train_iter()) {
      const auto now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - period_start).count();
      const double per_iter = seconds / static_cast<double>(period_iterations);
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double eta = elapsed / static_cast<double>(done) * static_cast<double>(t.train_iter() - done);
      const double samples = static_cast<double>(global) / per_iter,
                   tokens = samples * static_cast<double>(seq);
      const double data_ms = 1e3 * period_data_seconds / static_cast<double>(period_iterations);
      const double peak = PeakResidentMiB();
      if (rank == 0) {
        std::printf(
            "iteration %ld/%ld loss %.7f lr %.3e grad_norm %.4f samples/s %.1f tokens/s %.0f "
            "time/iter %.1f ms data %.2f ms peak_rss %.0f MiB eta %s\n",
            static_cast<long>(done), static_cast<long>(t.train_iter()), loss, adamw.lr(), grad_norm, samples,
            tokens, 1e3 * per_iter, data_ms, peak, HoursMinutesSeconds(eta).c_str());
        std::fflush(stdout);
        if (metrics) {
          std::fprintf(
              metrics.get(),
              "{\"iteration\": %ld, \"loss\": %.7f, \"lr\": %.6e, \"grad_norm\": %.6f, \"samples_per_s\": "
              "%.3f, \"tokens_per_s\": %.1f, \"time_per_iter_ms\": %.3f, \"data_ms\": %.3f, "
              "\"peak_rss_mib\": %.1f, \"eta_s\": %.1f}\n",
              static_cast<long>(done), loss, adamw.lr(), grad_norm, samples, tokens, 1e3 * per_iter, data_ms,
              peak, eta);
          std::fflush(metrics.get());
        }
        if (events) {
          for (const auto& [tag, value] : {std::pair<const char*, double>{"train/loss", loss},
                                           {"train/lr", adamw.lr()},
                                           {"train/grad_norm", grad_norm},
                                           {"train/samples_per_s", samples},
                                           {"train/tokens_per_s", tokens},
                                           {"train/time_per_iter_ms", 1e3 * per_iter},
                                           {"train/data_ms", data_ms},
                                           {"train/peak_rss_mib", peak}})
            events->AddScalar(tag, done, value);
          events->Flush();
        }
      }
      period_start = now;
      period_data_seconds = 0;
      period_iterations = 0;
    }
    if (evaluate && (done % c.evaluation().eval_period() == 0 || done == t.train_iter())) {
      evaluate_now(done);
      period_start = Clock::now();  // evaluation time is not training time
    }
  }
  if (rank == 0) {
    std::printf("tessel-train: %ld iterations in %s%s\n", static_cast<long>(t.train_iter()),
                HoursMinutesSeconds(std::chrono::duration<double>(Clock::now() - start).count()).c_str(),
                FLAGS_fast_dev_run ? "" : (", metrics in " + (out_dir / "metrics.jsonl").string()).c_str());
  }
  return 0;
}
