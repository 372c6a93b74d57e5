#include "graph/passes/pass_manager.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "graph/passes/passes.h"
#include "sbp/global_tensor.h"

DEFINE_double(grad_bucket_mb, 25,
              "graph mode: MiB of data-parallel gradients fused into one all-reduce (0: one all-reduce "
              "per gradient); env TESSEL_GRAD_BUCKET_MB");
DEFINE_string(debug_pass, "",
              "graph mode: write the graph before and after this compiler pass (a pass name, or ALL) as "
              "text and Graphviz dot; env TESSEL_DEBUG_PASS");
DEFINE_string(debug_pass_dir, ".", "where --debug_pass writes; env TESSEL_DEBUG_PASS_DIR");

namespace tessel::passes {
namespace {

// The flag's value, or the environment variable's when the flag was not set.
std::string FlagOrEnv(const char* flag, const std::string& value, const char* env) {
  if (!gflags::GetCommandLineFlagInfoOrDie(flag).is_default) return value;
  const char* e = std::getenv(env);
  return e != nullptr ? std::string(e) : value;
}

// A file-name-safe form of a graph name.
std::string FileStem(const std::string& name) {
  std::string out;
  for (char c : name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  return out.empty() ? "graph" : out;
}

void Dump(const ir::Graph& graph, const CompileOptions& options, size_t index, const std::string& pass,
          const char* side) {
  std::ostringstream stem;
  stem << FileStem(graph.name()) << ".rank" << CurrentRank() << "." << (index < 9 ? "0" : "") << index + 1
       << "-" << pass << "." << side;
  const std::filesystem::path dir(options.debug_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [ext, text] : {std::pair<const char*, std::string>{".txt", graph.ToText()},
                                  std::pair<const char*, std::string>{".dot", graph.ToDot()}}) {
    const std::filesystem::path path = dir / (stem.str() + ext);
    std::ofstream out(path);
    out << text;
    TESSEL_CHECK(out.good()) << "--debug_pass: cannot write " << path.string();
  }
}

}  // namespace

CompileOptions CompileOptions::FromFlags() {
  CompileOptions o;
  double mib = FLAGS_grad_bucket_mb;
  const std::string env = FlagOrEnv("grad_bucket_mb", "", "TESSEL_GRAD_BUCKET_MB");
  if (!env.empty()) {
    char* end = nullptr;
    mib = std::strtod(env.c_str(), &end);
    TESSEL_CHECK(end != env.c_str() && *end == '\0')
        << "TESSEL_GRAD_BUCKET_MB is '" << env << "'; expected a number of MiB";
  }
  TESSEL_CHECK(mib >= 0 && mib < 1e6)
      << "--grad_bucket_mb / TESSEL_GRAD_BUCKET_MB is " << mib << "; expected MiB from 0 to 1e6";
  o.grad_bucket_bytes = static_cast<int64_t>(mib * (1 << 20));
  o.debug_pass = FlagOrEnv("debug_pass", FLAGS_debug_pass, "TESSEL_DEBUG_PASS");
  o.debug_dir = FlagOrEnv("debug_pass_dir", FLAGS_debug_pass_dir, "TESSEL_DEBUG_PASS_DIR");
  return o;
}

const std::vector<Pass>& PassOrder() {
  static const std::vector<Pass> order = {
      {"activation_checkpointing",
       "recompute checkpointed forward regions in backward instead of keeping them",
       [](ir::Graph& g, const CompileOptions&) { RecomputeCheckpointedRegions(g); }},
      {"dead_code_elimination", "drop ops whose results nothing reads (in-place updates stay)",
       [](ir::Graph& g, const CompileOptions&) { EliminateDeadCode(g); }},
      {"gradient_accumulation",
       "forward and backward as micro-batch units, compiled once; average gradients and scalar results",
       [](ir::Graph& g, const CompileOptions& o) { AccumulateGradients(g, o.micro_batches); }},
      {"boxing_insertion", "one to_global op per value and layout a reader needs; identity ones removed",
       [](ir::Graph& g, const CompileOptions&) { InsertBoxing(g); }, /*makes_boxing_explicit=*/true},
      {"stage_assignment",
       "give each op its pipeline stage; values crossing stages become send / recv pairs",
       [](ir::Graph& g, const CompileOptions& o) { AssignStages(g, o.stage_ranks, o.layer_stages); }},
      {"gradient_bucketing", "fuse partial-to-broadcast reductions along one mesh axis into buckets",
       [](ir::Graph& g, const CompileOptions& o) { BucketGradients(g, o.grad_bucket_bytes); }},
  };
  return order;
}

std::string DescribePassOrder() {
  std::ostringstream os;
  int n = 0;
  for (const Pass& p : PassOrder()) os << ++n << ". " << p.name << ": " << p.does << "\n";
  return os.str();
}

std::vector<PassTiming> CompileGraph(ir::Graph& graph, const CompileOptions& options) {
  const std::vector<Pass>& order = PassOrder();
  if (!options.debug_pass.empty() && options.debug_pass != "ALL") {
    bool known = false;
    for (const Pass& p : order) known |= p.name == options.debug_pass;
    TESSEL_CHECK(known) << "--debug_pass / TESSEL_DEBUG_PASS is '" << options.debug_pass
                        << "'; expected ALL or one of the passes:\n"
                        << DescribePassOrder();
  }
  std::vector<PassTiming> timings;
  bool boxing_explicit = false;
  for (size_t i = 0; i < order.size(); ++i) {
    const Pass& pass = order[i];
    const bool dump = options.debug_pass == "ALL" || options.debug_pass == pass.name;
    if (dump) Dump(graph, options, i, pass.name, "before");
    PassTiming t{pass.name, 0, graph.ops().size(), 0};
    const auto start = std::chrono::steady_clock::now();
    try {
      pass.run(graph, options);
      boxing_explicit |= pass.makes_boxing_explicit;
      ir::Verify(graph, boxing_explicit);
    } catch (const Error& e) {
      TESSEL_THROW(e.code()) << "graph '" << graph.name() << "': compiler pass " << pass.name
                             << " failed: " << e.what();
    }
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.ops_after = graph.ops().size();
    if (dump) Dump(graph, options, i, pass.name, "after");
    VLOG(CurrentRank() == 0 ? 0 : 1) << "graph '" << graph.name() << "': pass " << pass.name << " "
                                     << t.seconds * 1e3 << " ms (" << t.ops_before << " -> " << t.ops_after
                                     << " ops)";
    timings.push_back(t);
  }
  return timings;
}

}  // namespace tessel::passes
