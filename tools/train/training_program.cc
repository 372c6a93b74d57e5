// The training program behind tessel-train (tools/train/training_program.h):
// it trains a model of the zoo from a config (configs/*.prototxt, schema
// zoo/config.proto) under the layout the config and the launch give.
//
// Before the first step it resolves and checks the config against the world
// (batch sizes, dist sizes, model sizes, the registered parallel mode,
// schedule and gradient handlers), opens the dataset and checks its token
// ids against the vocabulary; any mismatch is an error naming the field.
// Rank 0 saves the resolved config as <output_dir>/config.prototxt, prints
// a line every train.log_period iterations and appends it to
// <output_dir>/metrics.jsonl and as TensorBoard scalars (events.out.tfevents.*),
// with an evaluation (loss, perplexity) every evaluation.eval_period
// iterations and at the end. With train.save_period it saves checkpoints
// (checkpoint/checkpoint.h), and on SIGTERM/SIGUSR1 or past
// train.max_duration it saves one and stops; train.resume (auto by default)
// continues from the latest one, under this job's layout whatever the
// saving job's was. train.load_weight starts from a checkpoint's model
// weights only (one tessel-checkpoint import-hf made from a Hugging Face
// model, say).
#include "tools/train/training_program.h"

#include <gflags/gflags.h>
#include <pthread.h>
#include <tessel/tessel.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/allocator.h"
#include "core/comm/process_group.h"
#include "core/join.h"
#include "graph/autograd.h"
#include "graph/plan/graph.h"
#include "layers/dist.h"
#include "layers/gradient_handler.h"
#include "layers/mixed_precision.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "runtime/actor_runtime.h"
#include "tools/train/model_registry.h"
#include "tools/train/task.h"
#include "zoo/config.h"
#include "zoo/event_writer.h"
#include "zoo/foreign_settings.h"

DEFINE_string(
    config, "",
    "the training config (protobuf text, schema zoo/config.proto), e.g. configs/gpt2_tiny.prototxt");
DEFINE_bool(resume, false,
            "continue from the latest complete checkpoint in train.checkpoint_dir (model, optimizer state, "
            "iteration; any layout); an error if there is none (train.resume required; the default, auto, "
            "resumes when there is one)");
DEFINE_int64(resume_step, -1,
             "continue from the checkpoint of this iteration in train.checkpoint_dir (iter_<N>) instead of "
             "the latest; an error if there is none");
DEFINE_bool(print_actions, false,
            "graph mode: after the first step, every rank prints its pipeline stage's forward and backward "
            "units in the order it ran them (\"rank 2 stage 1 1f1b: F0 F1 B0 F2 B1 B2\")");
DEFINE_bool(fast_dev_run, false,
            "a smoke run: 2 training iterations and 1 evaluation batch, a log line each, nothing written to "
            "the output directory (also --fast-dev-run)");

namespace tessel::train {

namespace {

// --set path=value (zoo::TakeSetFlags) and --fast-dev-run are taken out of
// argv before gflags sees it: gflags keeps only the last of a repeated flag
// and knows no dashes in names.
std::vector<std::string> TakeOverrides(int* argc, char** argv) {
  std::vector<std::string> overrides = zoo::TakeSetFlags(argc, argv, "tessel-train");
  for (int i = 1; i < *argc; ++i)
    if (std::string(argv[i]) == "--fast-dev-run") argv[i] = const_cast<char*>("--fast_dev_run");
  return overrides;
}

// Moves what an earlier run wrote into `out_dir` (metrics.jsonl,
// config.prototxt, TensorBoard event files, timeline/) into
// <out_dir>/earlier_runs/<n>/ (n one past the last there); returns that
// folder, or "" if there was nothing to move. Checkpoints stay: they are
// train.checkpoint_dir's, and train.resume decides about them.
std::string ArchiveEarlierRun(const std::filesystem::path& out_dir) {
  namespace fs = std::filesystem;
  std::vector<fs::path> earlier;
  for (const fs::directory_entry& entry : fs::directory_iterator(out_dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "metrics.jsonl" || name == "config.prototxt" || name == "timeline" ||
        name.rfind("events.out.tfevents.", 0) == 0)
      earlier.push_back(entry.path());
  }
  const bool logged = std::any_of(earlier.begin(), earlier.end(),
                                  [](const fs::path& p) { return p.filename() != "config.prototxt"; });
  if (!logged) return "";  // a config alone: a run that stopped before its first log line
  int n = 1;
  while (fs::exists(out_dir / "earlier_runs" / std::to_string(n))) ++n;
  const fs::path to = out_dir / "earlier_runs" / std::to_string(n);
  fs::create_directories(to);
  for (const fs::path& p : earlier) fs::rename(p, to / p.filename());
  return to.string();
}

// Flags gflags would refuse with a bare "unknown command line flag", told
// what they are here instead: another trainer's flag (with tessel-train's
// way), or a near miss of one of its own. Exits 2, before any work.
void CheckFlagNames(int argc, char** argv) {
  std::vector<std::string> known;
  for (const gflags::CommandLineFlagInfo& info : [] {
         std::vector<gflags::CommandLineFlagInfo> all;
         gflags::GetAllFlags(&all);
         return all;
       }())
    known.push_back(info.name);
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const std::string name(arg.substr(0, arg.find('=')));
    gflags::CommandLineFlagInfo info;
    if (name.empty()) continue;
    if (gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      if (info.type != "bool" && arg.find('=') == std::string_view::npos) ++i;  // its value
      continue;
    }
    if (name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
        info.type == "bool")
      continue;
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "version" || name == "h")
      continue;
    const std::string instead = zoo::ForeignSettingInstead(name);
    if (!instead.empty()) {
      std::fprintf(stderr,
                   "tessel-train: --%s is not a tessel-train flag (Megatron-LM's or torchrun's); here: %s. "
                   "The model, data and training settings are config fields (docs/training.md)\n",
                   name.c_str(), instead.c_str());
      std::exit(2);
    }
    const std::string closest = zoo::ClosestName(name, known);
    std::fprintf(stderr,
                 "tessel-train: unknown flag --%s%s; --help lists the flags, and config fields are set with "
                 "--set path=value\n",
                 name.c_str(), closest.empty() ? "" : (" (did you mean --" + closest + "?)").c_str());
    std::exit(2);
  }
}

// --help (also -h, --helpshort): the program's own flags and the runtime's,
// not the 140 lines of logging flags (those stay under --helpfull).
bool PrintHelpIfAsked(int argc, char** argv) {
  bool asked = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    asked |= arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpshort" || arg == "-helpshort";
  }
  if (!asked) return false;
  std::vector<gflags::CommandLineFlagInfo> all;
  gflags::GetAllFlags(&all);
  std::printf("%s\n", gflags::ProgramUsage());
  auto section = [&](const char* title, auto wanted) {
    std::printf("\n%s:\n", title);
    for (const gflags::CommandLineFlagInfo& f : all) {
      if (!wanted(f.filename)) continue;
      std::printf("  --%s (%s) default: %s\n      %s\n", f.name.c_str(), f.type.c_str(),
                  f.type == "string" ? ("\"" + f.default_value + "\"").c_str() : f.default_value.c_str(),
                  f.description.c_str());
    }
  };
  auto ours = [](const std::string& file) { return file.find("tools/train/") != std::string::npos; };
  auto runtime = [](const std::string& file) { return file.find("core/") != std::string::npos; };
  section("tessel-train", ours);
  section("tessel's runtime (also as TESSEL_<FLAG> in the environment)", runtime);
  std::printf(
      "\nConfig fields (zoo/config.proto) are set with --set path=value, repeatable, e.g. --set "
      "train.dist.tensor_parallel_size=2. --helpfull lists every flag, the logging library's too.\n");
  return true;
}

// TFLOP/s of a dense matmul on `device` in `dtype`, timed here: the
// reference for MFU when the config gives no peak. Large enough that launch
// costs vanish on a GPU, small enough for a CPU core's second.
double MeasuredMatmulTflops(const Device& device, DType dtype) {
  NoGradGuard no_grad;
  const int64_t n = device.is_cuda() ? 8192 : 512;
  const Tensor a = full(Shape{n, n}, 0.5, dtype, device), b = full(Shape{n, n}, 0.25, dtype, device);
  // Copying one element to the host waits for the product (in any dtype).
  auto finish = [](const Tensor& t) { (void)fn::sum(t, {}).To(Device::CPU()); };
  finish(fn::matmul(a, b));  // warm up (kernel choice, caches)
  const int reps = 3;
  const auto start = std::chrono::steady_clock::now();
  Tensor c;
  for (int i = 0; i < reps; ++i) c = fn::matmul(a, b);
  finish(c);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * static_cast<double>(n * n * n) * reps / seconds / 1e12;
}

// "1.23M": a count for the log.
std::string Count(double n) {
  char text[32];
  if (n >= 1e9)
    std::snprintf(text, sizeof(text), "%.3gG", n / 1e9);
  else if (n >= 1e6)
    std::snprintf(text, sizeof(text), "%.3gM", n / 1e6);
  else if (n >= 1e3)
    std::snprintf(text, sizeof(text), "%.3gK", n / 1e3);
  else
    std::snprintf(text, sizeof(text), "%.0f", n);
  return text;
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

// A request to save and stop: SIGTERM or SIGUSR1 (preemption notices),
// recorded here and acted on between iterations. A second one ends the
// process at once (the default action), as does one before the training
// loop is armed to save (or with train.save_on_signal false).
//
// The two signals are blocked in every thread from the program's start
// (threads inherit the mask) and taken by one thread in sigwait, so no
// thread has a system call interrupted by them: delivered to an arbitrary
// thread, a SIGTERM could interrupt a communication thread's wait, and a
// rank aborted with a corrupted heap right after one (1 run in 3 under
// load).
volatile std::sig_atomic_t g_stop_signal = 0;
std::atomic<bool> g_save_on_signal{false};

void EndOnSignal(int sig) {
  std::signal(sig, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);  // in this thread: the default action ends the process
  ::kill(::getpid(), sig);
  ::pause();
}

void TakeStopSignalsInOneThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (!g_save_on_signal.load() || g_stop_signal != 0) EndOnSignal(sig);
      g_stop_signal = sig;
    }
  }).detach();
}

// Why the run stops early, as counts of ranks: signalled with SIGTERM,
// with SIGUSR1, past train.max_duration. Summed over the ranks in the
// all-reduce that brings the step's loss and gradient norm to every rank
// (optim::ScalarValues), so all agree, save the same iteration and stop
// together at no extra collective.
std::vector<double> StopCounts(double max_duration_s, double elapsed_s) {
  return {g_stop_signal == SIGTERM ? 1.0 : 0.0, g_stop_signal == SIGUSR1 ? 1.0 : 0.0,
          max_duration_s > 0 && elapsed_s > max_duration_s ? 1.0 : 0.0};
}

double LearningRate(const config::Config& c, int64_t iteration) {
  const auto& s = c.scheduler();
  const double lr = c.optim().lr();
  if (s.name() == "constant") return lr;
  if (s.name() == "warmup_linear")
    return optim::WarmupLinearLr(iteration, lr, s.warmup_iter(), c.train().train_iter(), s.min_lr());
  return optim::WarmupCosineLr(iteration, lr, s.warmup_iter(), c.train().train_iter(), s.min_lr());
}

}  // namespace

int RunTrainingProgram(int argc, char** argv) {
  TakeStopSignalsInOneThread();  // before any other thread starts
  std::vector<std::string> overrides = TakeOverrides(&argc, argv);
  gflags::SetUsageMessage(
      "tessel-train --config FILE [--set path.to.field=value ...] [--fast_dev_run]\n"
      "Trains a model of the zoo from a config; run it under tessel-launch for several ranks.");
  if (PrintHelpIfAsked(argc, argv)) return 0;
  CheckFlagNames(argc, argv);
  tessel::Init(&argc, &argv);
  TESSEL_CHECK(!FLAGS_config.empty())
      << "tessel-train: --config is required (e.g. configs/gpt2_tiny.prototxt)";
  config::Config c = zoo::LoadConfig(FLAGS_config);
  zoo::ApplyOverrides(&c, overrides);
  const int world = dist::WorldSize(), rank = dist::Rank();
  zoo::ResolveConfig(&c, world, train::ModelNames());
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
  // The registries' names (the program may have added its own), checked
  // before any data is read.
  const bool graph = t.graph().enabled(), in_order = t.graph().pipeline() == "in_order";
  const std::string schedule = in_order ? "1f1b" : runtime::ParseSchedule(t.graph().pipeline());
  std::vector<optim::GradientHandler> handlers;
  for (const config::GradientHandlerConfig& h : t.gradient_handler())
    handlers.push_back(optim::MakeGradientHandler(h.name(), {h.options().begin(), h.options().end()}));
  TESSEL_CHECK(handlers.empty() || !t.amp().enabled())
      << "tessel-train: train.gradient_handler with train.amp is not supported yet (the handlers would see "
         "loss-scaled gradients); turn one of them off";
  optim::GradientReducer reducer;
  TESSEL_CHECK(!t.gradient_reducer().name().empty() || t.gradient_reducer().options().empty())
      << "config: train.gradient_reducer has options but no name; expected e.g. name: \"bf16_all_reduce\"";
  if (!t.gradient_reducer().name().empty()) {
    const config::GradientHandlerConfig& r = t.gradient_reducer();
    reducer = optim::MakeGradientReducer(r.name(), {r.options().begin(), r.options().end()});
    TESSEL_CHECK(!t.amp().enabled())
        << "tessel-train: train.gradient_reducer with train.amp is not supported "
           "yet (it would reduce loss-scaled gradients); turn one of them off";
    TESSEL_CHECK(!t.zero_optimization().enabled() || t.zero_optimization().stage() < 2)
        << "tessel-train: train.gradient_reducer '" << r.name() << "' with train.zero_optimization.stage "
        << t.zero_optimization().stage() << ": from stage 2 on, backward reduce-scatters each gradient into "
        << "its shard as it makes it, so there is nothing left for a reducer; use stage 1 or no reducer";
  }
  dist::Setup({.data_parallel_size = d.data_parallel_size(),
               .tensor_parallel_size = d.tensor_parallel_size(),
               .pipeline_parallel_size = d.pipeline_parallel_size(),
               .pipeline_num_layers = d.pipeline_num_layers(),
               .virtual_pipeline_size = d.virtual_pipeline_size(),
               .custom_pipeline_stage_ids = {d.custom_pipeline_stage_id().begin(),
                                             d.custom_pipeline_stage_id().end()},
               .device_type = ParseDeviceType(d.device()),
               .zero_stage = t.zero_optimization().enabled() ? t.zero_optimization().stage() : 0,
               .sequence_parallel = zoo::MegatronSequenceParallel(d),
               .all_to_all_sequence_parallel = zoo::AllToAllSequenceParallel(d),
               .context_parallel = zoo::ContextParallel(d),
               .tensor_parallel_mode = d.tensor_parallel_mode(),
               .tensor_parallel_mode_options = {d.tensor_parallel_mode_options().begin(),
                                                d.tensor_parallel_mode_options().end()}});

  const int micro_batches = static_cast<int>(t.num_accumulation_steps());
  // Data and model: the data is checked against the config before the
  // model is built.
  // Evaluation in graph mode runs forward units only, under the training
  // schedule's order on actors of their own (the reference executor when
  // training takes it).
  runtime::ActorRuntime eval_actors({.schedule = schedule});
  const train::TaskContext context{.config = c,
                                   .eval_graph = {.micro_batches = micro_batches,
                                                  .stage_ranks = dist::StageRanks(),
                                                  .layer_stages = dist::LayerStages(),
                                                  .executor = in_order ? nullptr : eval_actors.Executor()},
                                   .micro_batches = micro_batches};
  std::unique_ptr<train::Task> task = train::MakeTask(context);
  if (!t.best_checkpoint_metric().empty()) {
    std::vector<std::string> metrics;
    for (const std::string& name : task->MetricNames()) metrics.push_back("eval_" + name);
    TESSEL_CHECK(std::find(metrics.begin(), metrics.end(), t.best_checkpoint_metric()) != metrics.end())
        << "config: train.best_checkpoint_metric is '" << t.best_checkpoint_metric() << "'; expected one of "
        << Join(metrics) << " (model.arch " << m.arch() << "'s evaluation)";
  }
  const int64_t global = t.global_batch_size(), tokens_per_sample = task->tokens_per_sample();
  const bool evaluate = c.evaluation().enabled();
  auto params = task->model().NamedParameters();
  // Mixed precision: the model computes in f16/bf16; the optimizer, the
  // clipping and checkpoints see the f32 masters under the same names.
  std::unique_ptr<optim::MixedPrecision> amp;
  if (t.amp().enabled()) {
    amp = std::make_unique<optim::MixedPrecision>(
        params, ParseDType(t.amp().dtype()),
        optim::LossScaleConfig{.initial_scale = t.amp().initial_loss_scale(),
                               .growth_interval = t.amp().loss_scale_window(),
                               .min_scale = t.amp().min_loss_scale()});
    params = amp->master_params();
  }
  const config::OptimConfig& o = c.optim();
  optim::AdamW adamw(params, {.lr = o.lr(),
                              .beta1 = o.beta1(),
                              .beta2 = o.beta2(),
                              .eps = o.eps(),
                              .weight_decay = o.weight_decay(),
                              .zero_stage = dist::GetConfig().zero_stage});
  const std::vector<NdSbp> grad_layouts = adamw.GradientLayouts();
  // What a checkpoint holds: the model's parameters and the optimizer's state.
  checkpoint::NamedTensors saved;
  for (auto& [name, p] : params) saved.emplace_back("model." + name, p);
  for (auto& [name, s] : adamw.NamedState()) saved.emplace_back("optim." + name, s);
  const auto rng_counters = task->model().NamedRngCounters();
  int64_t start_iteration = 0;
  // The checkpoint `path` names (`what` says which field or flag gave it),
  // checked to be of this config's model.
  auto find_checkpoint = [&](const std::string& path, const std::string& what, const std::string& expected) {
    const std::filesystem::path found = checkpoint::Find(path);
    TESSEL_CHECK(!found.empty()) << "tessel-train: " << what << " " << path
                                 << " holds no complete checkpoint (a directory with index.json, or `latest` "
                                    "naming one); expected "
                                 << expected;
    const checkpoint::CheckpointIndex index = checkpoint::ReadIndex(found);
    const auto arch = index.metadata.find("arch");
    const std::string saved_arch = arch == index.metadata.end() ? "" : zoo::CanonicalArch(arch->second);
    TESSEL_CHECK(saved_arch == m.arch())
        << "tessel-train: checkpoint " << found.string() << " (" << what << ") is of model.arch '"
        << saved_arch << "' but this config trains '" << m.arch() << "'";
    return std::make_pair(found, index);
  };
  // Loads `keys` (model.* alone, or with optim.*) into this job's layout.
  auto load = [&](const std::filesystem::path& found, const checkpoint::NamedTensors& tensors,
                  bool optimizer) {
    checkpoint::LoadOptions options;
    for (const auto& [name, rows] : task->PaddedRows()) {
      options.padded_rows["model." + name] = rows;
      if (optimizer)
        for (const char* moment : {".exp_avg", ".exp_avg_sq"})
          options.padded_rows["optim." + name + moment] = rows;
    }
    const auto meta = checkpoint::Load(found, tensors, options);
    if (amp) amp->CopyMastersToModel();
    return meta;
  };
  // A number the checkpoint's metadata holds, named if it is not one.
  auto metadata_number = [&](const std::map<std::string, std::string>& meta, const std::string& key,
                             const std::filesystem::path& found) {
    const auto it = meta.find(key);
    TESSEL_CHECK(it != meta.end()) << "tessel-train: checkpoint " << found.string() << " has no '" << key
                                   << "'";
    int64_t value = 0;
    const char* end = it->second.data() + it->second.size();
    const auto [ptr, ec] = std::from_chars(it->second.data(), end, value);
    TESSEL_CHECK(ec == std::errc() && ptr == end)
        << "tessel-train: checkpoint " << found.string() << ": '" << key << "' is '" << it->second
        << "'; expected an integer";
    return value;
  };
  // Where the run starts: the flags ask for a checkpoint; train.resume auto
  // takes one if there is one. A smoke run (--fast_dev_run) starts afresh
  // unless a flag asks.
  TESSEL_CHECK(FLAGS_resume_step >= -1) << "tessel-train: --resume_step " << FLAGS_resume_step
                                        << "; expected the iteration of a checkpoint (0 or more)";
  const bool resume_required = FLAGS_resume || FLAGS_resume_step >= 0 || t.resume() == "required";
  std::filesystem::path resume_from;
  std::string resume_what;
  if (FLAGS_resume_step >= 0) {
    resume_from = std::filesystem::path(t.checkpoint_dir()) / checkpoint::IterationName(FLAGS_resume_step);
    resume_what = "--resume_step " + std::to_string(FLAGS_resume_step) + " but";
  } else if (resume_required) {
    resume_from = t.checkpoint_dir();
    resume_what =
        FLAGS_resume ? "--resume but train.checkpoint_dir" : "train.resume required but train.checkpoint_dir";
  } else if (t.resume() == "auto" && !FLAGS_fast_dev_run && !checkpoint::Find(t.checkpoint_dir()).empty()) {
    resume_from = t.checkpoint_dir();
    resume_what = "train.resume auto: train.checkpoint_dir";
  }
  const bool resumed = !resume_from.empty();
  if (resumed) {
    const auto [found, index] =
        find_checkpoint(resume_from, resume_what, "train.checkpoint_dir of an earlier run");
    const auto meta = load(found, saved, /*optimizer=*/true);
    // Dropout's counters: the masks go on where the saving run's would have.
    for (auto& [name, counter] : rng_counters)
      if (meta.count("rng." + name)) counter->Set(metadata_number(meta, "rng." + name, found));
    start_iteration = metadata_number(meta, "iteration", found);
    TESSEL_CHECK(start_iteration <= t.train_iter())
        << "tessel-train: checkpoint " << found.string() << " is at iteration " << start_iteration
        << ", past train.train_iter " << t.train_iter();
    if (rank == 0) {
      std::printf("tessel-train: resumed from %s at iteration %ld (saved by %d rank%s as %s)\n",
                  found.c_str(), static_cast<long>(start_iteration), index.world_size,
                  index.world_size == 1 ? "" : "s", meta.count("layout") ? meta.at("layout").c_str() : "?");
      std::fflush(stdout);
    }
  } else if (!t.load_weight().empty()) {
    // Weights only (a fine-tuning start): the optimizer and the iteration start afresh.
    const auto [found, index] =
        find_checkpoint(t.load_weight(), "train.load_weight",
                        "one tessel-checkpoint import-hf made, or a run's train.save_period");
    // What shapes do not show: a model computing another function on the same weights.
    if (const std::optional<config::Config> saved_config = checkpoint::SavedConfig(found)) {
      const config::ModelConfig& saved_model = saved_config->model();
      TESSEL_CHECK(saved_model.hidden_act() == m.hidden_act())
          << "tessel-train: train.load_weight " << found.string() << " was trained with model.hidden_act '"
          << saved_model.hidden_act() << "' but this config has '" << m.hidden_act() << "'";
      TESSEL_CHECK(saved_model.layernorm_epsilon() == m.layernorm_epsilon())
          << "tessel-train: train.load_weight " << found.string()
          << " was trained with model.layernorm_epsilon " << saved_model.layernorm_epsilon()
          << " but this config has " << m.layernorm_epsilon();
    }
    checkpoint::NamedTensors weights;
    for (auto& [name, p] : params) weights.emplace_back("model." + name, p);
    load(found, weights, /*optimizer=*/false);
    if (rank == 0) {
      std::printf("tessel-train: loaded the %s weights of %s (%zu tensors)\n", m.arch().c_str(),
                  found.c_str(), weights.size());
      std::fflush(stdout);
    }
  }
  runtime::ActorRuntime actors({.schedule = schedule});
  const double clip = o.clip_grad_norm();
  Graph train_step("train_step",
                   [&](const Graph::Tensors& in) {
                     Tensor loss = task->Loss(in);
                     loss.backward();
                     optim::ApplyGradientHandlers(handlers, params, grad_layouts, reducer,
                                                  t.gradient_reducer().name());
                     Tensor grad_norm = optim::ClipGradNormTensor(params, clip, grad_layouts);
                     adamw.Step();
                     return Graph::Tensors{{"loss", loss}, {"grad_norm", grad_norm}};
                   },
                   {.micro_batches = micro_batches,
                    .stage_ranks = dist::StageRanks(),
                    .layer_stages = dist::LayerStages(),
                    .executor = in_order ? nullptr : actors.Executor()});
  const int64_t dp = d.data_parallel_size();
  const std::filesystem::path out_dir = t.output_dir();
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics(nullptr, &std::fclose);
  std::unique_ptr<zoo::EventWriter> events;  // TensorBoard scalars, beside metrics.jsonl
  if (rank == 0 && !FLAGS_fast_dev_run) {
    std::filesystem::create_directories(out_dir);
    // A run that starts afresh where an earlier run wrote its log moves
    // that log aside first, so the two runs' metrics, TensorBoard scalars
    // and timelines do not mix and neither is lost.
    if (!resumed) {
      const std::string moved = ArchiveEarlierRun(out_dir);
      if (!moved.empty())
        std::printf("tessel-train: %s held an earlier run's log; moved it to %s (this run starts afresh)\n",
                    out_dir.c_str(), moved.c_str());
    }
    std::ofstream(out_dir / "config.prototxt") << zoo::ConfigText(c);
    // A resumed run adds to the metrics of the run it continues.
    metrics.reset(std::fopen((out_dir / "metrics.jsonl").c_str(), resumed ? "a" : "w"));
    TESSEL_CHECK(metrics != nullptr) << "tessel-train: cannot write " << (out_dir / "metrics.jsonl").string()
                                     << ": " << std::strerror(errno);
    events = std::make_unique<zoo::EventWriter>(out_dir);
  }
  if (rank == 0) {
    std::printf(
        "tessel-train: %s, %ld layers, hidden %ld; world %d = dp %ld x tp %ld x "
        "pp %ld; global batch %ld = micro %ld x %s x accumulation %d; %s%s; %ld iterations; %s\n",
        m.arch().c_str(), static_cast<long>(d.pipeline_num_layers()), static_cast<long>(m.hidden_size()),
        world, static_cast<long>(dp), static_cast<long>(d.tensor_parallel_size()),
        static_cast<long>(d.pipeline_parallel_size()), static_cast<long>(global),
        static_cast<long>(t.micro_batch_size()),
        zoo::SequencesSplitOverDataParallel(d)
            ? ("1 (each sequence split over the " + std::to_string(dp) + " data-parallel ranks)").c_str()
            : ("dp " + std::to_string(dp)).c_str(),
        micro_batches, graph ? "graph mode, " : "eager", graph ? t.graph().pipeline().c_str() : "",
        static_cast<long>(t.train_iter()), task->DataSummary().c_str());
    for (const std::string& line : dist::LayoutLines()) std::printf("tessel-train: %s\n", line.c_str());
    if (reducer)
      std::printf("tessel-train: gradient reducer %s\n", t.gradient_reducer().ShortDebugString().c_str());
    for (const config::GradientHandlerConfig& h : t.gradient_handler())
      std::printf("tessel-train: gradient handler %s\n", h.ShortDebugString().c_str());
    std::fflush(stdout);
  }

  auto evaluate_now = [&](int64_t iteration) {
    const std::vector<train::Metric> metrics_now = task->Evaluate(graph);
    if (rank != 0) return metrics_now;
    std::string line = "evaluation at iteration " + std::to_string(iteration) + ":";
    std::string json = "{\"iteration\": " + std::to_string(iteration);
    char value[64];
    for (const train::Metric& metric : metrics_now) {
      std::snprintf(value, sizeof(value), "%.6f", metric.value);
      line.append(" ").append(metric.name).append(" ").append(value);
      std::snprintf(value, sizeof(value), "%.7g", metric.value);
      json.append(", \"eval_").append(metric.name).append("\": ").append(value);
      if (events) events->AddScalar("eval/" + metric.name, iteration, metric.value);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (metrics) {
      std::fprintf(metrics.get(), "%s}\n", json.c_str());
      std::fflush(metrics.get());
    }
    if (events) events->Flush();
    return metrics_now;
  };

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto period_start = start;
  double period_data_seconds = 0;
  int64_t period_iterations = 0;
  double period_loss_sum = 0;  // the logged loss is the period's mean
  // Model FLOPs per iteration, and the device peak they are measured
  // against: the config's, or a matmul timed now in the compute dtype.
  const double flops_per_iteration = task->TrainFlopsPerSample() * static_cast<double>(global);
  const Device device = RankDevice(ParseDeviceType(d.device()));
  const DType compute_dtype = amp ? ParseDType(t.amp().dtype()) : DType::kFloat32;
  const double peak_tflops = t.peak_tflops_per_device() > 0 ? t.peak_tflops_per_device()
                                                            : MeasuredMatmulTflops(device, compute_dtype);
  if (rank == 0) {
    std::printf(
        "tessel-train: %.4g GFLOP per iteration (model FLOPs); MFU against %.4g TFLOP/s per device (%s)\n",
        flops_per_iteration / 1e9, peak_tflops,
        t.peak_tflops_per_device() > 0 ? "train.peak_tflops_per_device"
                                       : ("a matmul in " + std::string(DTypeName(compute_dtype)) +
                                          " timed on rank 0's device; set "
                                          "train.peak_tflops_per_device for a datasheet figure")
                                             .c_str());
    std::fflush(stdout);
  }
  Allocator* allocator = GetAllocator(device);
  allocator->ResetPeak();
  const bool save = t.save_period() > 0 && !FLAGS_fast_dev_run;
  // Saves the checkpoint of iteration `done` (a collective); `why` says
  // what asked for it when not train.save_period.
  // The checkpoint directory is claimed before the first step when saves
  // are periodic (rank 0 writes its index): a path that cannot be one, or
  // one another job writes, is named now rather than at the first save.
  // Otherwise at the first save (a signal's, a resumed run's end).
  std::optional<checkpoint::DirectoryLock> checkpoint_lock;
  if (save && rank == 0) checkpoint_lock.emplace(t.checkpoint_dir());
  // Saves the model, optimizer state and dropout counters of iteration
  // `done` as a checkpoint in `dir` (a collective), with `extra` metadata,
  // keeping the last `keep_last`; `what` ends rank 0's line.
  auto save_into = [&](const std::filesystem::path& dir, int64_t done,
                       const std::map<std::string, std::string>& extra, int64_t keep_last,
                       const std::string& what) {
    if (rank == 0 && !checkpoint_lock) checkpoint_lock.emplace(t.checkpoint_dir());
    const auto save_start = Clock::now();
    char layout[96];
    std::snprintf(layout, sizeof(layout), "dp %ld x tp %ld x pp %ld", static_cast<long>(dp),
                  static_cast<long>(d.tensor_parallel_size()), static_cast<long>(d.pipeline_parallel_size()));
    std::map<std::string, std::string> state = extra;
    state.insert({{"iteration", std::to_string(done)}, {"arch", m.arch()}, {"layout", layout}});
    // Read on every rank: a counter on another pipeline stage comes by broadcast.
    for (const auto& [name, counter] : rng_counters) state["rng." + name] = std::to_string(counter->Get());
    checkpoint::SaveOptions options;
    options.keep_last = keep_last;
    options.config_text = zoo::ConfigText(c);
    const std::filesystem::path where = checkpoint::Save(dir, done, saved, state, options);
    if (rank == 0) {
      std::printf("saved checkpoint %s in %.2f s%s\n", where.c_str(),
                  std::chrono::duration<double>(Clock::now() - save_start).count(),
                  what.empty() ? "" : (" (" + what + ")").c_str());
      std::fflush(stdout);
    }
    period_start = Clock::now();  // saving time is not training time
  };
  auto save_checkpoint = [&](int64_t done, const std::string& why) {
    save_into(t.checkpoint_dir(), done, {}, t.keep_last_checkpoints(), why);
  };
  // The best checkpoint by an evaluation metric, in <checkpoint_dir>/best:
  // a resumed run compares with what its best/ holds, a fresh one starts
  // anew.
  const std::string best_metric = t.best_checkpoint_metric();
  const bool higher_is_better =
      best_metric.size() >= 8 && best_metric.compare(best_metric.size() - 8, 8, "accuracy") == 0;
  const std::filesystem::path best_dir = std::filesystem::path(t.checkpoint_dir()) / "best";
  std::optional<double> best_value;
  if (!best_metric.empty() && resumed && !checkpoint::Find(best_dir).empty()) {
    const std::filesystem::path found = checkpoint::Find(best_dir);
    const auto meta = checkpoint::ReadIndex(found).metadata;
    const auto it = meta.find("best_value");
    if (meta.count("best_metric") && meta.at("best_metric") == best_metric && it != meta.end()) {
      char* end = nullptr;
      const double value = std::strtod(it->second.c_str(), &end);
      TESSEL_CHECK(end != it->second.c_str() && *end == '\0')
          << "tessel-train: checkpoint " << found.string() << ": 'best_value' is '"
          << it->second.substr(0, 64) << "'; expected a number";
      best_value = value;
    }
  }
  auto keep_if_best = [&](int64_t done, const std::vector<train::Metric>& scored) {
    // Rank 0 read the evaluation; every rank takes its figure, so all
    // decide alike (the save is collective).
    double value = 0;
    for (const train::Metric& metric : scored)
      if ("eval_" + metric.name == best_metric) value = metric.value;
    comm::World().Broadcast(&value, 1, DType::kInt64, 0);  // 8 bytes, copied as they are
    if (!std::isfinite(value)) return;
    if (best_value && (higher_is_better ? value <= *best_value : value >= *best_value)) return;
    best_value = value;
    char text[32];
    std::snprintf(text, sizeof(text), "%.9g", value);
    save_into(best_dir, done, {{"best_metric", best_metric}, {"best_value", text}}, 1,
              "best " + best_metric + " so far: " + text);
  };
  // Stopping early with a checkpoint: on a signal (preemption) or past
  // train.max_duration. Not in a smoke run, which saves nothing.
  const double max_duration_s = zoo::MaxDurationSeconds(t);
  const bool stop_on_request = !FLAGS_fast_dev_run && (t.save_on_signal() || max_duration_s > 0);
  if (t.save_on_signal() && !FLAGS_fast_dev_run) g_save_on_signal = true;
  const std::set<int64_t> timeline_iterations(t.timeline_iterations().begin(), t.timeline_iterations().end());
  if (start_iteration == t.train_iter() && rank == 0) {
    std::printf(
        "tessel-train: the checkpoint is at train.train_iter %ld: nothing left to train (raise "
        "train.train_iter to go on, or set train.resume off, or use another train.checkpoint_dir, "
        "to start afresh)\n",
        static_cast<long>(t.train_iter()));
    std::fflush(stdout);
  }
  for (int64_t it = start_iteration; it < t.train_iter(); ++it) {
    adamw.set_lr(LearningRate(c, it));
    const bool timeline = timeline_iterations.count(it + 1) > 0 && !FLAGS_fast_dev_run;
    const std::filesystem::path timeline_dir = out_dir / "timeline" / checkpoint::IterationName(it + 1);
    if (timeline) actors.set_timeline_dir(timeline_dir.string());
    double loss = 0, grad_norm = 0;
    // Why to stop, read after the step and summed over the ranks with its
    // scalars (below).
    std::vector<double> stop;
    if (graph) {
      const auto data_start = Clock::now();
      auto in = task->ReadTrain(it, 0, 1);
      period_data_seconds += std::chrono::duration<double>(Clock::now() - data_start).count();
      Graph::Tensors out = train_step(in);
      if (timeline) {
        actors.set_timeline_dir("");
        if (rank == 0) {
          std::printf(
              "tessel-train: the timeline of iteration %ld is in %s (draw it: python3 "
              "tools/pipeline_timeline.py %s --out %s/pipeline.png)\n",
              static_cast<long>(it + 1), timeline_dir.c_str(), timeline_dir.c_str(), timeline_dir.c_str());
          std::fflush(stdout);
        }
      }
      // The loss, the gradient norm and the stop counts in one all-reduce.
      stop = StopCounts(max_duration_s, std::chrono::duration<double>(Clock::now() - start).count());
      const std::vector<double> scalars =
          optim::ScalarValues({out.at("loss"), out.at("grad_norm")}, stop_on_request ? &stop : nullptr);
      loss = scalars[0];
      grad_norm = scalars[1];
      if (FLAGS_print_actions && it == start_iteration && !in_order) {
        const runtime::StepReport& r = actors.last_step();
        std::printf("rank %d stage %d %s: %s\n", rank, r.stage, r.schedule.c_str(),
                    runtime::ActionsText(r.actions).c_str());
        std::fflush(stdout);
      }
    } else {
      // Eagerly, micro-batches are a loop: each backward adds its share.
      std::vector<Tensor> part_losses;
      for (int part = 0; part < micro_batches; ++part) {
        const auto data_start = Clock::now();
        auto in = task->ReadTrain(it, part, micro_batches);
        period_data_seconds += std::chrono::duration<double>(Clock::now() - data_start).count();
        Tensor part_loss = task->Loss(in);
        if (micro_batches > 1) part_loss = fn::mul_scalar(part_loss, 1.0 / micro_batches);
        (amp ? amp->ScaleLoss(part_loss) : part_loss).backward();
        part_losses.push_back(part_loss.detach());
      }
      stop = StopCounts(max_duration_s, std::chrono::duration<double>(Clock::now() - start).count());
      for (double part : optim::ScalarValues(part_losses, stop_on_request ? &stop : nullptr)) loss += part;
      optim::ApplyGradientHandlers(handlers, params, grad_layouts, reducer, t.gradient_reducer().name());
      grad_norm = amp ? amp->UnscaleAndClip(clip) : optim::ClipGradNorm(params, clip, grad_layouts);
      if (!amp || amp->StepIsFinite(grad_norm)) {
        adamw.Step();
        if (amp) amp->CopyMastersToModel();
      } else if (rank == 0) {
        std::printf("iteration %ld: gradients overflowed f16; step skipped, loss scale now %g\n",
                    static_cast<long>(it + 1), amp->loss_scale());
      }
    }
    // A non-finite loss, or gradient norm without a loss scale to skip the
    // step, ruins every later step: stop at once, naming the iteration,
    // before anything is logged as progress or saved (every rank sees the
    // same values, so all stop together).
    TESSEL_CHECK(std::isfinite(loss) && (amp != nullptr || std::isfinite(grad_norm)))
        << "iteration " << it + 1 << ": the loss is " << loss << " and the gradient norm " << grad_norm
        << "; training stops at the first non-finite value (lower optim.lr, check the data, or train with a "
           "loss scale: train.amp with f16)";
    ++period_iterations;
    period_loss_sum += loss;
    const int64_t done = it + 1;
    if (done == 1 || done % t.log_period() == 0 || done == t.train_iter()) {
      const auto now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - period_start).count();
      const double per_iter = seconds / static_cast<double>(period_iterations);
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double eta =
          elapsed / static_cast<double>(done - start_iteration) * static_cast<double>(t.train_iter() - done);
      const double samples = static_cast<double>(global) / per_iter,
                   tokens = samples * static_cast<double>(tokens_per_sample);
      const double data_ms = 1e3 * period_data_seconds / static_cast<double>(period_iterations);
      const double peak = PeakResidentMiB();
      const double mean_loss = period_loss_sum / static_cast<double>(period_iterations);
      const double tokens_seen = static_cast<double>(done) * static_cast<double>(global * tokens_per_sample);
      const double tflops = flops_per_iteration / per_iter / world / 1e12, mfu = tflops / peak_tflops;
      // Rank 0's device memory: the most its tensors held since the last
      // line, and what the allocator holds from the system (their cache too).
      const AllocatorStats memory = allocator->stats();
      const double memory_peak = static_cast<double>(memory.peak_allocated_bytes) / (1 << 20),
                   memory_reserved =
                       static_cast<double>(memory.allocated_bytes + memory.cached_bytes) / (1 << 20);
      allocator->ResetPeak();
      if (rank == 0) {
        std::printf(
            "iteration %ld/%ld loss %.7f lr %.3e grad_norm %.4f tokens %s samples/s %.1f tokens/s %.0f "
            "tflops %.3g mfu %.1f%% time/iter %.1f ms data %.2f ms memory %.0f/%.0f MiB peak_rss %.0f MiB "
            "eta %s\n",
            static_cast<long>(done), static_cast<long>(t.train_iter()), mean_loss, adamw.lr(), grad_norm,
            Count(tokens_seen).c_str(), samples, tokens, tflops, 100 * mfu, 1e3 * per_iter, data_ms,
            memory_peak, memory_reserved, peak, HoursMinutesSeconds(eta).c_str());
        std::fflush(stdout);
        // One record: metrics.jsonl's keys, and TensorBoard's train/<key>
        // scalars but for the ETA.
        struct Field {
          const char* key;
          const char* format;
          double value;
        };
        const Field fields[] = {{"loss", "%.7f", mean_loss},
                                {"lr", "%.6e", adamw.lr()},
                                {"grad_norm", "%.6f", grad_norm},
                                {"tokens_seen", "%.0f", tokens_seen},
                                {"samples_per_s", "%.3f", samples},
                                {"tokens_per_s", "%.1f", tokens},
                                {"tflops_per_device", "%.9g", tflops},
                                {"mfu", "%.9g", mfu},
                                {"time_per_iter_ms", "%.3f", 1e3 * per_iter},
                                {"data_ms", "%.3f", data_ms},
                                {"memory_peak_mib", "%.1f", memory_peak},
                                {"memory_reserved_mib", "%.1f", memory_reserved},
                                {"peak_rss_mib", "%.1f", peak},
                                {"eta_s", "%.1f", eta}};
        if (metrics) {
          std::fprintf(metrics.get(), "{\"iteration\": %ld", static_cast<long>(done));
          for (const Field& f : fields) {
            std::fprintf(metrics.get(), ", \"%s\": ", f.key);
            std::fprintf(metrics.get(), f.format, f.value);
          }
          std::fprintf(metrics.get(), "}\n");
          std::fflush(metrics.get());
        }
        if (events) {
          for (const Field& f : fields)
            if (std::strcmp(f.key, "eta_s") != 0)
              events->AddScalar(std::string("train/") + f.key, done, f.value);
          events->Flush();
        }
      }
      period_start = now;
      period_data_seconds = 0;
      period_iterations = 0;
      period_loss_sum = 0;
    }
    if (evaluate && (done % c.evaluation().eval_period() == 0 || done == t.train_iter())) {
      const std::vector<train::Metric> scored = evaluate_now(done);
      if (!best_metric.empty() && !FLAGS_fast_dev_run) keep_if_best(done, scored);
      period_start = Clock::now();  // evaluation time is not training time
    }
    // A run that resumed saves its end as well, whatever save_period is:
    // `latest` is then the finished iteration, and the same command run
    // again has nothing left to train (rather than repeating the iterations
    // after a preemption's checkpoint).
    const bool finished_resumed_run = resumed && done == t.train_iter() && !FLAGS_fast_dev_run;
    const bool saved_now =
        (save && (done % t.save_period() == 0 || done == t.train_iter())) || finished_resumed_run;
    if (saved_now) save_checkpoint(done, save ? "" : "the end of a resumed run");
    if (stop_on_request && done < t.train_iter()) {
      if (stop[0] + stop[1] + stop[2] > 0) {
        const std::string why = stop[0] > 0   ? "on SIGTERM"
                                : stop[1] > 0 ? "on SIGUSR1"
                                              : "past train.max_duration " + t.max_duration();
        if (!saved_now) save_checkpoint(done, why);
        if (rank == 0) {
          std::printf(
              "tessel-train: stopped at iteration %ld of %ld %s; run the same command to continue "
              "(train.resume auto)\n",
              static_cast<long>(done), static_cast<long>(t.train_iter()), why.c_str());
          std::fflush(stdout);
        }
        return 0;
      }
    }
  }
  if (rank == 0) {
    std::printf("tessel-train: %ld iterations in %s%s\n", static_cast<long>(t.train_iter()),
                HoursMinutesSeconds(std::chrono::duration<double>(Clock::now() - start).count()).c_str(),
                FLAGS_fast_dev_run ? "" : (", metrics in " + (out_dir / "metrics.jsonl").string()).c_str());
  }
  return 0;
}

}  // namespace tessel::train
