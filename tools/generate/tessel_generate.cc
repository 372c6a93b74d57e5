// tessel-generate: continues prompts with a trained GPT-2 or Llama, or scores text
// with it, from a checkpoint saved under any layout, on the layout this
// launch gives (--tp, --pp; one model replica).
//
//   tessel-launch --nproc_per_node 2 -- tessel-generate --checkpoint CKPT --tp 2 --prompt_ids 464,3290,318
//   tessel-generate --checkpoint CKPT --prompt_ids 464,3290 --max_new_tokens 20 --tokenizer data/tiny_corpus
//   tessel-generate --checkpoint CKPT --prompt_ids "1,2,3;4,5" --score
//
// Greedy by default (the most likely token each step, as Hugging Face's
// generate(do_sample=False)); --sample draws from the softmax of
// logits / --temperature, cut to the --top_k most likely tokens and to the
// smallest set whose probability reaches --top_p. Every rank computes the
// same draw from the same broadcast logits and --seed, so no rank waits
// for another's choice. Each new token reruns the forward over the whole
// sequence (no key-value cache): short continuations, not serving.
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hugging_face_tokenizer.h"
#include "graph/global_tensor_ops.h"
#include "layers/dist.h"
#include "tools/train/model_config.h"
#include "zoo/config.h"
#include "zoo/vocabulary.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_string(checkpoint, "",
              "a checkpoint directory (with index.json) or a directory of them (its `latest`) of a GPT-2 or "
              "Llama");
DEFINE_string(config, "",
              "the training config of the model, for a checkpoint that does not hold one (one "
              "`tessel-checkpoint import-hf` made; --set path=value overrides its fields); by default the "
              "config the checkpoint was saved with");
DEFINE_int64(tp, 1, "tensor parallel size (the launch's ranks are tp x pp)");
DEFINE_int64(pp, 1, "pipeline parallel size");
DEFINE_string(
    prompt_ids, "",
    "the prompts as token ids: comma-separated ids, prompts separated by ';' (e.g. \"464,3290;50,7\")");
DEFINE_int64(max_new_tokens, 20,
             "tokens to add to each prompt (fewer if --eos_id comes or the positions end)");
DEFINE_bool(sample, false, "draw each token (temperature, top-k, top-p) instead of taking the most likely");
DEFINE_double(temperature, 1.0, "with --sample: logits are divided by this (> 0)");
DEFINE_int64(top_k, 0, "with --sample: draw among the k most likely tokens only (0: all)");
DEFINE_double(top_p, 1.0,
              "with --sample: draw among the fewest most likely tokens whose probability reaches p");
DEFINE_uint64(seed, 1234, "with --sample: the random stream's seed");
DEFINE_int64(eos_id, -2,
             "stop a prompt's continuation after this id (-1: never; -2: the vocabulary's <|endoftext|> (or "
             "<|end_of_text|>, </s>) when "
             "--tokenizer or the config's data.vocab_file gives one, else never)");
DEFINE_string(
    tokenizer, "",
    "a directory with the data's vocab.json (GPT-2's byte-level BPE) or tokenizer.json: the output also "
    "as text where its pieces are byte-level "
    "(by default the config's data.vocab_file, when it has one)");
DEFINE_bool(score, false,
            "score each prompt instead of continuing it: its mean next-token loss and perplexity");

namespace tessel {
namespace {

// "464,3290;50,7" -> {{464, 3290}, {50, 7}}; throws naming what is not an id.
std::vector<std::vector<int64_t>> ParsePrompts(const std::string& text) {
  std::vector<std::vector<int64_t>> prompts;
  std::stringstream by_prompt(text);
  for (std::string prompt; std::getline(by_prompt, prompt, ';');) {
    prompts.emplace_back();
    std::stringstream by_id(prompt);
    for (std::string piece; std::getline(by_id, piece, ',');) {
      piece.erase(std::remove(piece.begin(), piece.end(), ' '), piece.end());
      int64_t id = -1;
      const auto [end, error] = std::from_chars(piece.data(), piece.data() + piece.size(), id);
      TESSEL_CHECK(!piece.empty() && error == std::errc() && end == piece.data() + piece.size() && id >= 0)
          << "--prompt_ids '" << text.substr(0, 200) << "': '" << piece.substr(0, 40)
          << "' is not a token id; expected non-negative integers separated by ',', prompts by ';'";
      prompts.back().push_back(id);
    }
  }
  return prompts;
}

// The next token from the last position's logits (the real vocabulary's).
int64_t NextToken(std::vector<float> logits, std::mt19937_64& random) {
  if (!FLAGS_sample) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (FLAGS_top_k > 0 && static_cast<size_t>(FLAGS_top_k) < order.size()) order.resize(FLAGS_top_k);
  std::vector<double> probability(order.size());
  const double top = logits[order[0]] / FLAGS_temperature;
  double sum = 0;
  for (size_t i = 0; i < order.size(); ++i)
    sum += probability[i] = std::exp(logits[order[i]] / FLAGS_temperature - top);
  size_t keep = order.size();
  double reached = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    reached += probability[i] / sum;
    if (reached >= FLAGS_top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<size_t> draw(probability.begin(), probability.begin() + static_cast<long>(keep));
  return order[draw(random)];
}

// A global tensor whole on every rank, as host floats.
std::vector<float> WholeOnEveryRank(const Tensor& t) {
  std::vector<int> all(dist::WorldSize());
  std::iota(all.begin(), all.end(), 0);
  const Tensor whole = GatherLogical(t.to_global(Placement(DeviceType::kCPU, all), NdSbp({B()})));
  return (whole.dtype() == DType::kFloat32 ? whole : fn::cast(whole, DType::kFloat32)).ToVector<float>();
}

int Main(const std::vector<std::string>& overrides) {
  TESSEL_CHECK(!FLAGS_checkpoint.empty())
      << "--checkpoint is required: a checkpoint of a GPT-2 or Llama (see --help)";
  TESSEL_CHECK(!FLAGS_prompt_ids.empty())
      << "--prompt_ids is required: token ids, e.g. --prompt_ids 464,3290";
  TESSEL_CHECK(FLAGS_max_new_tokens >= 0) << "--max_new_tokens " << FLAGS_max_new_tokens << "; expected >= 0";
  TESSEL_CHECK(FLAGS_temperature > 0) << "--temperature " << FLAGS_temperature << "; expected > 0";
  TESSEL_CHECK(FLAGS_top_k >= 0) << "--top_k " << FLAGS_top_k << "; expected >= 0 (0: every token)";
  TESSEL_CHECK(FLAGS_top_p > 0 && FLAGS_top_p <= 1) << "--top_p " << FLAGS_top_p << "; expected 0 < p <= 1";
  const std::vector<std::vector<int64_t>> prompts = ParsePrompts(FLAGS_prompt_ids);
  const std::filesystem::path found = checkpoint::Find(FLAGS_checkpoint);
  TESSEL_CHECK(!found.empty())
      << "--checkpoint " << FLAGS_checkpoint
      << " holds no complete checkpoint (a directory with index.json, or `latest` naming one)";
  std::optional<config::Config> c;
  if (!FLAGS_config.empty()) {
    c = zoo::LoadConfig(FLAGS_config);
    zoo::ApplyOverrides(&*c, overrides);
  } else {
    TESSEL_CHECK(overrides.empty()) << "--set " << overrides.front() << " needs --config";
    c = checkpoint::SavedConfig(found);
    TESSEL_CHECK(c.has_value()) << "checkpoint " << found.string()
                                << " holds no training config; give the model's with --config";
  }
  const std::string arch = zoo::CanonicalArch(c->model().arch());
  TESSEL_CHECK(arch == "gpt2" || arch == "llama")
      << "tessel-generate runs GPT-2 and Llama models; the config's model.arch is '" << c->model().arch()
      << "'";
  // The checkpoint's model on this launch's layout: one replica, tp x pp.
  config::DistConfig& d = *c->mutable_train()->mutable_dist();
  d.set_tensor_parallel_size(FLAGS_tp);
  d.set_pipeline_parallel_size(FLAGS_pp);
  d.set_data_parallel_size(1);
  d.set_virtual_pipeline_size(1);
  d.clear_custom_pipeline_stage_id();
  d.set_device("cpu");
  d.set_sequence_parallel(false);
  c->mutable_train()->mutable_amp()->set_enabled(false);
  c->mutable_train()->set_activation_checkpoint(false);
  c->mutable_train()->clear_micro_batch_size();
  c->mutable_train()->clear_global_batch_size();
  c->mutable_train()->clear_num_accumulation_steps();
  // Nothing is read from the data: a config without any (import-hf's) resolves too.
  if (c->data().data_prefix().empty() && c->data().blend_size() == 0)
    c->mutable_data()->set_data_prefix("(no data: tessel-generate)");
  TESSEL_CHECK(FLAGS_tp * FLAGS_pp == dist::WorldSize())
      << "--tp " << FLAGS_tp << " x --pp " << FLAGS_pp << " = " << FLAGS_tp * FLAGS_pp << " ranks, but "
      << dist::WorldSize() << " were launched; tessel-generate runs one model replica";
  zoo::ResolveConfig(&*c, dist::WorldSize());
  const config::ModelConfig& m = c->model();
  dist::Setup({.tensor_parallel_size = FLAGS_tp,
               .pipeline_parallel_size = FLAGS_pp,
               .pipeline_num_layers = m.hidden_layers()});
  train::CausalLM lm = train::BuildCausalLM(*c);
  lm.module->Eval();
  {
    checkpoint::NamedTensors weights;
    for (auto& [name, p] : lm.module->NamedParameters()) weights.emplace_back("model." + name, p);
    checkpoint::LoadOptions options;
    for (const auto& [name, rows] : lm.padded_rows) options.padded_rows["model." + name] = rows;
    checkpoint::Load(found, weights, options);
  }
  const int64_t vocab = m.vocab_size(), positions = m.max_position_embeddings();
  // The vocabulary for text: --tokenizer's vocab.json (or tokenizer.json),
  // else the config's data.vocab_file when it is a .json that is still
  // there. Its end-of-text token ends a continuation; its pieces print as
  // text when they are byte-level (GPT-2's, Llama 3's).
  std::filesystem::path vocab_json;
  if (!FLAGS_tokenizer.empty()) {
    const std::filesystem::path dir(FLAGS_tokenizer);
    vocab_json =
        std::filesystem::is_regular_file(dir / "vocab.json") ? dir / "vocab.json" : dir / "tokenizer.json";
  } else if (std::filesystem::path(c->data().vocab_file()).extension() == ".json" &&
             std::filesystem::is_regular_file(c->data().vocab_file())) {
    vocab_json = c->data().vocab_file();
  }
  std::vector<std::string> vocabulary;
  bool text = false;
  int64_t eos = FLAGS_eos_id == -2 ? -1 : FLAGS_eos_id;
  if (!vocab_json.empty()) {
    vocabulary = zoo::ReadVocabulary(vocab_json);
    text = zoo::IsByteLevelVocabulary(vocab_json);
    TESSEL_CHECK(static_cast<int64_t>(vocabulary.size()) <= vocab)
        << vocab_json.string() << " holds ids beyond the model's vocabulary of " << vocab;
    vocabulary.resize(static_cast<size_t>(vocab));
    for (const char* end : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
      const auto it = std::find(vocabulary.begin(), vocabulary.end(), end);
      if (FLAGS_eos_id == -2 && eos < 0 && it != vocabulary.end()) eos = it - vocabulary.begin();
    }
  }
  const bool rank0 = dist::Rank() == 0;
  if (rank0)
    std::printf("tessel-generate: %s (%ld layers, hidden %ld, vocabulary %ld) on tp %ld x pp %ld\n",
                found.c_str(), static_cast<long>(m.hidden_layers()), static_cast<long>(m.hidden_size()),
                static_cast<long>(vocab), static_cast<long>(FLAGS_tp), static_cast<long>(FLAGS_pp));
  auto print_ids = [](const char* label, const std::vector<int64_t>& ids) {
    std::printf("%s", label);
    for (int64_t id : ids) std::printf(" %ld", static_cast<long>(id));
    std::printf("\n");
  };
  NoGradGuard no_grad;
  std::mt19937_64 random(FLAGS_seed);
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<int64_t> ids = prompts[p];
    TESSEL_CHECK(!ids.empty()) << "--prompt_ids: prompt " << p << " is empty";
    for (int64_t id : ids)
      TESSEL_CHECK(id < vocab) << "--prompt_ids: id " << id << " of prompt " << p
                               << " is outside the vocabulary of " << vocab;
    TESSEL_CHECK(static_cast<int64_t>(ids.size()) <= positions)
        << "--prompt_ids: prompt " << p << " has " << ids.size() << " tokens; the model has " << positions
        << " positions";
    if (FLAGS_score) {
      TESSEL_CHECK(ids.size() >= 2) << "--score: prompt " << p << " has one token; a score needs two or more";
      const int64_t n = static_cast<int64_t>(ids.size());
      std::vector<int64_t> labels(ids.begin() + 1, ids.end());
      labels.push_back(-100);
      const Tensor loss =
          lm.loss(Tensor::FromVector<int64_t>(ids, {1, n}), Tensor::FromVector<int64_t>(labels, {1, n}));
      const double value = WholeOnEveryRank(loss)[0];
      if (rank0)
        std::printf("prompt %zu: %ld tokens, loss %.6f per predicted token, perplexity %.4f\n", p,
                    static_cast<long>(n), value, std::exp(value));
      continue;
    }
    std::vector<int64_t> added;
    while (static_cast<int64_t>(added.size()) < FLAGS_max_new_tokens &&
           static_cast<int64_t>(ids.size()) < positions) {
      const int64_t n = static_cast<int64_t>(ids.size());
      const Tensor logits = lm.logits(Tensor::FromVector<int64_t>(ids, {1, n}));  // [1, n, padded vocabulary]
      std::vector<float> last = WholeOnEveryRank(fn::slice(logits, 1, n - 1, n));
      last.resize(static_cast<size_t>(vocab));  // the padded columns are never drawn
      const int64_t next = NextToken(std::move(last), random);
      ids.push_back(next);
      added.push_back(next);
      if (next == eos) break;
    }
    if (rank0) {
      std::printf("prompt %zu: %zu tokens, %zu new (%s)\n", p, prompts[p].size(), added.size(),
                  FLAGS_sample ? "sampled" : "greedy");
      print_ids("  new ids:", added);
      if (text) {
        std::printf("  text: %s|%s\n", checkpoint::DecodeGpt2(vocabulary, prompts[p]).c_str(),
                    checkpoint::DecodeGpt2(vocabulary, added).c_str());
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tessel

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "continues prompts (token ids) with a GPT-2 or Llama checkpoint saved under any layout, greedily or by "
      "sampling, "
      "or scores them (--score); run it under tessel-launch with tp x pp processes");
  const std::vector<std::string> overrides = tessel::zoo::TakeSetFlags(&argc, argv, "tessel-generate");
  tessel::Init(&argc, &argv);
  return tessel::Main(overrides);
}
