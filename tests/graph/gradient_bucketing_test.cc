// Gradient bucketing on small graphs over a 2x2 (dp x tp) mesh: partial-sum
// to broadcast conversions along one mesh axis are fused, in the order
// their inputs are produced, into buckets of at most the given bytes,
// each placed right after its last input is produced and before any
// reader; other conversions and lone gradients stay to_global ops.
#include <gtest/gtest.h>

#include <vector>

#include "graph/passes/passes.h"
#include "tests/graph/small_graph.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::SmallGraph;

const NdSbp kPB({P(), B()}), kPS0({P(), S(0)}), kBB({B(), B()}), kBS0({B(), S(0)}), kS0P({S(0), P()}),
    kS0B({S(0), B()});

struct Grads {
  std::vector<int> partial, reduced;  // per gradient: the partial value, the to_global result
};

// Backward-like: gradient i is produced by a neg op (4 x n_i floats, laid
// out as `layouts[i]`), then all are reduced along dp by to_global ops
// placed just before a reader, as boxing insertion leaves them.
Grads AddGradients(SmallGraph& g, const std::vector<int64_t>& cols, const std::vector<NdSbp>& layouts) {
  Grads grads;
  const int seed = g.Input("seed", {4, 64}, kBB);
  for (size_t i = 0; i < cols.size(); ++i)
    grads.partial.push_back(g.Op("neg", {seed}, {kBB}, {4, cols[i]}, layouts[i]));
  for (size_t i = 0; i < cols.size(); ++i) {
    NdSbp to = layouts[i];
    for (int a = 0; a < to.size(); ++a)
      if (to[a] == Sbp::PartialSum()) to[a] = Sbp::Broadcast();
    grads.reduced.push_back(g.ToGlobal(grads.partial[i], to));
    g.graph.MarkOutput(std::string("g").append(std::to_string(i)),
                       g.Op("tanh", {grads.reduced[i]}, {to}, {4, cols[i]}, to));
  }
  return grads;
}

TEST(GradientBucketing, FusesReductionsAlongOneAxisIntoBucketsOfTheGivenSize) {
  SmallGraph g("grads", Placement("cpu", {{0, 1}, {2, 3}}));
  // Five gradients reduced along dp (axis 0) of 4x16 floats = 256 bytes
  // each (the tensor-parallel layout on axis 1 does not matter), and one
  // reduced along tp (axis 1): another group, never in a dp bucket.
  const Grads grads = AddGradients(g, {16, 16, 16, 16, 16, 16}, {kPB, kPS0, kPB, kS0P, kPS0, kPB});
  passes::BucketGradients(g.graph, /*bucket_bytes=*/512);
  ir::Verify(g.graph, true);
  // dp: [0, 1], [2, 4] (3 is along tp), [5] alone stays a to_global; tp: [3].
  ASSERT_EQ(g.Count("all_reduce_bucket"), 2);
  EXPECT_EQ(g.Count("to_global"), 2);
  std::vector<std::vector<int>> buckets;
  for (const ir::Op& op : g.graph.ops()) {
    if (op.name != "all_reduce_bucket") continue;
    EXPECT_EQ(op.attrs.Get<int64_t>("mesh_axis"), 0);
    EXPECT_EQ(op.attrs.Get<int64_t>("bytes"), 512);
    buckets.push_back(op.inputs);
    // Results keep their value ids (readers are untouched) and layouts.
    for (size_t m = 0; m < op.inputs.size(); ++m) {
      EXPECT_EQ(g.graph.value(op.outputs[m]).nd_sbp[0], B());
      EXPECT_EQ(g.graph.value(op.outputs[m]).nd_sbp[1], g.graph.value(op.inputs[m]).nd_sbp[1]);
    }
    // Right after the last of its inputs is produced.
    int last = -1;
    for (int in : op.inputs) last = std::max(last, g.graph.value(in).producer);
    EXPECT_EQ(op.id, last + 1);
  }
  EXPECT_EQ(buckets, (std::vector<std::vector<int>>{{grads.partial[0], grads.partial[1]},
                                                    {grads.partial[2], grads.partial[4]}}));
  const ir::Op& lone = g.graph.ops()[g.graph.value(grads.reduced[5]).producer];
  EXPECT_EQ(lone.name, "to_global");
  EXPECT_EQ(g.graph.ops()[g.graph.value(grads.reduced[3]).producer].name, "to_global");

  // One bucket when all fit; none when the pass is off.
  SmallGraph all("grads", Placement("cpu", {{0, 1}, {2, 3}}));
  AddGradients(all, {16, 16, 16}, {kPB, kPS0, kPB});
  SmallGraph off = all;
  passes::BucketGradients(all.graph, 1 << 20);
  EXPECT_EQ(all.Count("all_reduce_bucket"), 1);
  EXPECT_EQ(all.Count("to_global"), 0);
  passes::BucketGradients(off.graph, 0);
  EXPECT_EQ(off.Count("all_reduce_bucket"), 0);
  EXPECT_EQ(off.Count("to_global"), 3);
}

TEST(GradientBucketing, AReductionNeverSharesABucketWithWhatIsComputedFromIt) {
  SmallGraph g("interleaved", Placement("cpu", std::vector<int>{0, 1}));
  const NdSbp p({P()}), b({B()});
  const int x = g.Input("x", {8}, b);
  // g1 and g2 are computed from g0's reduction: g0 cannot share their
  // bucket (the bucket would wait for its own result).
  const int g0 = g.Op("neg", {x}, {b}, {8}, p);
  const int r0 = g.ToGlobal(g0, b);
  const int y = g.Op("tanh", {r0}, {b}, {8}, b);
  const int g1 = g.Op("neg", {y}, {b}, {8}, p);
  const int g2 = g.Op("exp", {y}, {b}, {8}, p);
  const int r1 = g.ToGlobal(g1, b);
  const int r2 = g.ToGlobal(g2, b);
  g.graph.MarkOutput("r1", r1);
  g.graph.MarkOutput("r2", r2);
  g.graph.MarkOutput("y", y);
  passes::BucketGradients(g.graph, 1 << 20);
  ir::Verify(g.graph, true);
  ASSERT_EQ(g.Count("all_reduce_bucket"), 1);
  EXPECT_EQ(g.graph.ops()[g.graph.value(r0).producer].name, "to_global");
  const ir::Op& bucket = g.graph.ops()[g.graph.value(r1).producer];
  EXPECT_EQ(bucket.name, "all_reduce_bucket");
  EXPECT_EQ(bucket.inputs, (std::vector<int>{g1, g2}));
}

TEST(GradientBucketing, IndependentReductionsFuseAndTheirReadersWaitForTheBucket) {
  SmallGraph g("loss", Placement("cpu", std::vector<int>{0, 1}));
  const NdSbp p({P()}), b({B()});
  const int x = g.Input("x", {8}, b);
  // A loss's sum is reduced and read before its token count is computed:
  // the two reductions are independent, so they become one bucket and the
  // sum's reader moves after it. A reduction of what the reader made
  // depends on the bucket and stays alone.
  const int sum = g.Op("neg", {x}, {b}, {8}, p);
  const int sum_reduced = g.ToGlobal(sum, b);
  const int scaled = g.Op("tanh", {sum_reduced}, {b}, {8}, b);
  const int count = g.Op("exp", {x}, {b}, {8}, p);
  const int count_reduced = g.ToGlobal(count, b);
  const int later = g.Op("neg", {scaled}, {b}, {8}, p);
  const int later_reduced = g.ToGlobal(later, b);
  g.graph.MarkOutput("ratio", g.Op("div", {scaled, count_reduced}, {b, b}, {8}, b));
  g.graph.MarkOutput("later", later_reduced);
  passes::BucketGradients(g.graph, 1 << 20);
  ir::Verify(g.graph, true);
  ASSERT_EQ(g.Count("all_reduce_bucket"), 1);
  const ir::Op& bucket = g.graph.ops()[g.graph.value(sum_reduced).producer];
  EXPECT_EQ(bucket.name, "all_reduce_bucket");
  EXPECT_EQ(bucket.inputs, (std::vector<int>{sum, count}));
  EXPECT_EQ(bucket.outputs, (std::vector<int>{sum_reduced, count_reduced}));
  std::vector<std::string> order;
  for (const ir::Op& op : g.graph.ops()) order.push_back(op.name);
  EXPECT_EQ(order,
            (std::vector<std::string>{"neg", "exp", "all_reduce_bucket", "tanh", "neg", "to_global", "div"}));
  EXPECT_EQ(g.graph.ops()[g.graph.value(later_reduced).producer].name, "to_global");
}

TEST(GradientBucketing, MicroBatchesNeverShareABucket) {
  SmallGraph g("micro", Placement("cpu", std::vector<int>{0, 1}));
  const NdSbp p({P()}), b({B()});
  const int x = g.Input("x", {8}, b);
  std::vector<int> reduced;
  for (int k = 0; k < 4; ++k) reduced.push_back(g.ToGlobal(g.Op("neg", {x}, {b}, {8}, p), b));
  for (size_t k = 0; k < reduced.size(); ++k)
    g.graph.MarkOutput(std::string("r").append(std::to_string(k)), reduced[k]);
  // Reductions 0, 1 belong to micro-batch 0 and 2, 3 to micro-batch 1 (as
  // gradient accumulation copies a forward): fusing across them would run
  // the micro-batches' forwards together.
  std::vector<ir::Op> ops = g.graph.ops();
  for (size_t k = 0; k < reduced.size(); ++k)
    ops[static_cast<size_t>(g.graph.value(reduced[k]).producer)].micro_batch = static_cast<int>(k / 2);
  g.graph.SetOps(std::move(ops));
  passes::BucketGradients(g.graph, 1 << 20);
  ASSERT_EQ(g.Count("all_reduce_bucket"), 2);
  for (const ir::Op& op : g.graph.ops()) {
    if (op.name != "all_reduce_bucket") continue;
    EXPECT_EQ(op.outputs.size(), 2u);
    const int k = op.micro_batch;
    EXPECT_EQ(op.outputs, (std::vector<int>{reduced[2 * k], reduced[2 * k + 1]}));
  }
}

TEST(GradientBucketing, LeavesOtherConversionsAlone) {
  SmallGraph g("others", Placement("cpu", {{0, 1}, {2, 3}}));
  const int x = g.Input("x", {4, 8}, kBB);
  const int a = g.Op("neg", {x}, {kBB}, {4, 8}, kPB);
  const int b = g.Op("exp", {x}, {kBB}, {4, 8}, kPB);
  const int c = g.Op("tanh", {x}, {kBB}, {4, 8}, kPB);
  g.graph.MarkOutput("scattered", g.ToGlobal(a, kS0B));           // reduce-scatter, not all-reduce
  g.graph.MarkOutput("both", g.ToGlobal(b, NdSbp({B(), S(1)})));  // two axes change
  g.graph.MarkOutput("max", g.ToGlobal(g.Op("neg", {x}, {kBB}, {4, 8}, NdSbp({PMax(), B()})), kBB));
  g.graph.MarkOutput("one", g.ToGlobal(c, kBB));
  passes::BucketGradients(g.graph, 1 << 20);
  EXPECT_EQ(g.Count("all_reduce_bucket"), 0);
  EXPECT_EQ(g.Count("to_global"), 4);
  // Along a mesh axis of size 1 a partial sum is already whole: nothing to fuse.
  SmallGraph single("single", Placement("cpu", {{0}, {1}}));
  const int y = single.Input("y", {4, 8}, NdSbp({B(), B()}));
  for (int i = 0; i < 3; ++i) {
    const int part = single.Op("neg", {y}, {NdSbp({B(), B()})}, {4, 8}, NdSbp({B(), P()}));
    single.graph.MarkOutput(std::string("r").append(std::to_string(i)),
                            single.ToGlobal(part, NdSbp({B(), B()})));
  }
  passes::BucketGradients(single.graph, 1 << 20);
  EXPECT_EQ(single.Count("all_reduce_bucket"), 0);
}

}  // namespace
}  // namespace tessel
