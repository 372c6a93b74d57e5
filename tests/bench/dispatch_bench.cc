// Eager dispatch overhead: the time per functional op on tiny tensors (4
// elements), where the kernel is negligible and what is measured is
// dispatch: signature lookup, boxing check, kernel call, autograd off. Local
// tensors and global tensors (B on a placement of this process alone, so no
// communication) are timed; rank 0 prints one JSON line per case.
//   tessel-launch --nproc_per_node 1 -- dispatch_bench
#include <gflags/gflags.h>
#include <tessel/tessel.h>

#include <chrono>
#include <cstdio>

#include "graph/autograd.h"
#include "graph/boxing_executor.h"
#include "graph/global_tensor_ops.h"
#include "graph/plan/graph.h"
#include "graph/sbp_inference.h"
#include "runtime/actor_runtime.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

DEFINE_int64(iterations, 200000, "ops per case");
DEFINE_int64(graph_ops, 512, "tiny ops in the graph whose executed instructions are timed");
DEFINE_int64(graph_steps, 0, "runs of that graph per executor (0: --iterations / --graph_ops, at least 10)");

using namespace tessel;

namespace {
template <typename Fn>
double MicrosPerOp(Fn&& fn) {
  for (int i = 0; i < 1000; ++i) fn();  // warm caches
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < FLAGS_iterations; ++i) fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
         static_cast<double>(FLAGS_iterations);
}
}  // namespace

int main(int argc, char** argv) {
  tessel::Init(&argc, &argv);
  NoGradGuard no_grad;
  const Placement self(DeviceType::kCPU, {CurrentRank()});
  Tensor a = full({4}, 1.0), b = full({4}, 2.0);
  Tensor ga = full({4}, 1.0, self, {B()}), gb = full({4}, 2.0, self, {B()});
  const double local_add = MicrosPerOp([&] { (void)fn::add(a, b); });
  const double global_add = MicrosPerOp([&] { (void)fn::add(ga, gb); });
  const double global_scale = MicrosPerOp([&] { (void)fn::mul_scalar(ga, 0.5); });
  // Cache lookups on a 16 x 16 mesh (specs: no world of 256 needed): keys
  // hold placements by interned id, so their cost does not grow with the
  // rank count. For scale, the string key they replaced (two placements
  // printed) is timed too.
  std::vector<int> ranks(256);
  for (int r = 0; r < 256; ++r) ranks[r] = r;
  const Placement mesh(DeviceType::kCPU, ranks, {16, 16});
  const std::vector<GlobalTensorSpec> specs = {{Shape({64, 32}), DType::kFloat32, mesh, NdSbp({S(0), B()})},
                                               {Shape({32, 64}), DType::kFloat32, mesh, NdSbp({B(), S(1)})}};
  const OpDef& matmul = GetOpDef("matmul");
  const Attrs attrs{{"transpose_a", false}, {"transpose_b", false}};
  const double signature_256 = MicrosPerOp([&] { (void)InferNdSignature(matmul, attrs, specs, mesh); });
  const NdSbp from({S(0), B()}), to({B(), B()});
  const double plan_256 = MicrosPerOp([&] {
    (void)GetBoxingPlan(mesh, from, mesh, to, Shape({64, 32}), DType::kFloat32);
  });
  const double string_key_256 = MicrosPerOp([&] {
    std::string key = mesh.ToString() + from.ToString() + ">" + mesh.ToString() + to.ToString();
    (void)key;
  });
  // FromLocal without the logical shape exchanges the ranks' metadata (one
  // small all-gather over the world); with it, nothing is exchanged.
  const Tensor shard = full({4}, 1.0);
  const Placement world = WorldPlacement(DeviceType::kCPU);
  const int64_t all_iterations = FLAGS_iterations;
  FLAGS_iterations = std::max<int64_t>(all_iterations / 100, 100);
  const double from_local_exchange = MicrosPerOp([&] { (void)FromLocal(shard, world, {B()}); });
  FLAGS_iterations = all_iterations;
  const double from_local_shape = MicrosPerOp([&] { (void)FromLocal(shard, world, {B()}, Shape({4})); });

  // Graph mode: a chain of tiny ops captured once and run as its executable
  // plan's instructions, on the in-order executor and on the actor runtime;
  // the time per executed instruction is the host overhead a compiled
  // step pays per op.
  auto chain = [&](const Graph::Tensors& in) -> Graph::Tensors {
    Tensor x = in.at("x");
    for (int64_t i = 0; i < FLAGS_graph_ops / 2; ++i) x = fn::add(fn::mul_scalar(x, 0.5), in.at("y"));
    return {{"x", x}};
  };
  const Graph::Tensors graph_inputs = {{"x", ga}, {"y", gb}};
  runtime::ActorRuntime actors;
  Graph in_order_graph("chain", chain), actor_graph("chain", chain, {.executor = actors.Executor()});
  const double instructions = static_cast<double>(in_order_graph.Trace(graph_inputs).ops().size());
  const int64_t iterations = FLAGS_iterations;
  FLAGS_iterations =
      FLAGS_graph_steps > 0 ? FLAGS_graph_steps : std::max<int64_t>(iterations / FLAGS_graph_ops, 10);
  const double in_order_instruction = MicrosPerOp([&] { (void)in_order_graph(graph_inputs); }) / instructions;
  const double actor_instruction = MicrosPerOp([&] { (void)actor_graph(graph_inputs); }) / instructions;
  FLAGS_iterations = iterations;
  if (CurrentRank() == 0) {
    std::printf("{\"case\": \"signature lookup, matmul on a 16x16 mesh\", \"us\": %.3f}\n", signature_256);
    std::printf("{\"case\": \"boxing-plan lookup on a 16x16 mesh\", \"us\": %.3f}\n", plan_256);
    std::printf("{\"case\": \"(the former string key of that lookup, alone)\", \"us\": %.3f}\n",
                string_key_256);
    std::printf("{\"case\": \"local add [4]\", \"us\": %.3f}\n", local_add);
    std::printf("{\"case\": \"global add [4] B\", \"us\": %.3f}\n", global_add);
    std::printf("{\"case\": \"global mul_scalar [4] B\", \"us\": %.3f}\n", global_scale);
    std::printf("{\"case\": \"FromLocal [4] B, metadata exchanged (%d ranks)\", \"us\": %.3f}\n",
                CurrentWorldSize(), from_local_exchange);
    std::printf("{\"case\": \"FromLocal [4] B, logical shape given\", \"us\": %.3f}\n", from_local_shape);
    std::printf("{\"case\": \"graph instruction [4] B, in-order executor (%.0f per step)\", \"us\": %.3f}\n",
                instructions, in_order_instruction);
    std::printf("{\"case\": \"graph instruction [4] B, actor runtime (%.0f per step)\", \"us\": %.3f}\n",
                instructions, actor_instruction);
  }
  return 0;
}
