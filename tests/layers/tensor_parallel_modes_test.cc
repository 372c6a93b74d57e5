// The multi-axis tensor-parallel modes (layers/parallel_mode.h: 2d, 2.5d,
// 3d) planned for worlds of 4 and 8 ranks from one process (graph/ir/meta.h):
// sizes that do not form a mode's mesh are named; the placements carry the
// tensor mesh; a column layer's output is the row layer's input and the row
// layer's output the column layer's, the hidden states' layout; and each
// move a linear layer makes (the input gathered, the weight gathered, the
// product reduced) is one collective along one mesh axis, the pattern of the
// SUMMA / Tesseract / 3-D papers. Losses under each mode are the training
// tests' (tests/dist/test_train_tensor_modes.py).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "graph/ir/meta.h"
#include "layers/dist.h"
#include "ops/functional.h"
#include "sbp/boxing_plan.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

struct ModeCase {
  std::string name;
  int world;
  int64_t tp;
  std::map<std::string, std::string> options;
  std::vector<int64_t> hierarchy;  // of every layer's placement
};

std::vector<ModeCase> Cases() {
  return {{"2d", 4, 4, {}, {2, 2}},
          {"2d", 8, 4, {}, {2, 2, 2}},  // dp 2 in front
          {"2.5d", 8, 8, {{"depth", "2"}}, {2, 2, 2}},
          {"2.5d", 4, 4, {{"depth", "1"}}, {2, 2}},  // a depth of 1 is 2d
          {"3d", 8, 8, {}, {2, 2, 2}}};
}

void SetupMode(const ModeCase& c) {
  dist::Setup({.tensor_parallel_size = c.tp,
               .tensor_parallel_mode = c.name,
               .tensor_parallel_mode_options = c.options});
}

std::string Named(const ModeCase& c) {
  return c.name + " world " + std::to_string(c.world) + " tp " + std::to_string(c.tp);
}

TEST(TensorParallelModes, SizesThatDoNotFormTheMeshAreNamed) {
  MetaScope meta(8, 0);
  struct Bad {
    dist::Config config;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {{.tensor_parallel_size = 8, .tensor_parallel_mode = "2d"},
       "tensor_parallel_mode '2d' needs tensor_parallel_size = q x q with q >= 2 (4, 9, 16, ...); got 8"},
      {{.tensor_parallel_size = 8, .tensor_parallel_mode = "2.5d"},
       "tensor_parallel_mode '2.5d' needs the option depth"},
      {{.tensor_parallel_size = 8,
        .tensor_parallel_mode = "2.5d",
        .tensor_parallel_mode_options = {{"depth", "3"}}},
       "depth 3 does not divide tensor_parallel_size 8"},
      {{.tensor_parallel_size = 4,
        .tensor_parallel_mode = "2.5d",
        .tensor_parallel_mode_options = {{"depth", "2"}}},
       "needs tensor_parallel_size = depth x q x q with q >= 2; got 4 = depth 2 x 2"},
      {{.tensor_parallel_size = 8,
        .tensor_parallel_mode = "2.5d",
        .tensor_parallel_mode_options = {{"depth", "two"}}},
       "depth 'two'; expected a positive integer"},
      {{.tensor_parallel_size = 8,
        .tensor_parallel_mode = "2.5d",
        .tensor_parallel_mode_options = {{"depth", "2"}, {"dept", "2"}}},
       "takes the option 'depth'; got 'dept'"},
      {{.tensor_parallel_size = 4, .tensor_parallel_mode = "3d"},
       "tensor_parallel_mode '3d' needs tensor_parallel_size = q x q x q with q >= 2 (8, 27, 64, ...); got "
       "4"},
      {{.tensor_parallel_size = 8,
        .tensor_parallel_mode = "3d",
        .tensor_parallel_mode_options = {{"depth", "2"}}},
       "tensor_parallel_mode '3d' takes no options; got 'depth'"},
      {{.tensor_parallel_size = 4, .sequence_parallel = true, .tensor_parallel_mode = "2d"},
       "sequence_parallel (Megatron's) works with tensor_parallel_mode '1d'"},
      {{.tensor_parallel_size = 4, .all_to_all_sequence_parallel = true, .tensor_parallel_mode = "2d"},
       "all-to-all sequence parallelism works with tensor_parallel_mode '1d', not '2d'"},
  };
  for (const Bad& bad : cases) {
    const std::string e = ErrorOf([&] { dist::Setup(bad.config); });
    EXPECT_NE(e.find(bad.message), std::string::npos) << "expected: " << bad.message << "\ngot: " << e;
  }
}

TEST(TensorParallelModes, PlacementsCarryTheTensorMesh) {
  for (const ModeCase& c : Cases()) {
    SCOPED_TRACE(Named(c));
    MetaScope meta(c.world, 0);
    SetupMode(c);
    EXPECT_EQ(dist::GetLayerPlacement(0).hierarchy(), c.hierarchy);
    EXPECT_TRUE(dist::MultiAxisTensorParallel());
    // A split over "tp" names no axis of a multi-axis mesh.
    EXPECT_NE(ErrorOf([] { dist::GetNdSbp({B(), S(0)}); }).find("names no axis"), std::string::npos);
  }
}

// One step of `kind` along one mesh axis.
void ExpectOneCollective(const Placement& p, const NdSbp& from, const NdSbp& to, const Shape& shape,
                         BoxingOp kind, const std::string& what) {
  const BoxingPlan plan = PlanBoxing(p, from, p, to, shape, DType::kFloat32);
  ASSERT_EQ(plan.steps.size(), 1u) << what << ": " << plan.Explain();
  EXPECT_EQ(plan.steps[0].op, kind) << what << ": " << plan.Explain();
}

TEST(TensorParallelModes, LinearLayoutsChainAndEachMoveIsOneCollective) {
  for (const ModeCase& c : Cases()) {
    SCOPED_TRACE(Named(c));
    MetaScope meta(c.world, 0);
    SetupMode(c);
    const Placement p = dist::GetLayerPlacement(0);
    const dist::LinearLayouts col = dist::MultiAxisLinearLayouts(true, false, 3);
    const dist::LinearLayouts row = dist::MultiAxisLinearLayouts(false, false, 3);
    EXPECT_EQ(col.input, dist::GetActivationSbp(3));
    EXPECT_EQ(col.output, row.input) << "a column layer's output is the row layer's input";
    EXPECT_EQ(row.output, col.input) << "the row layer's output is the hidden states' layout";
    const Shape x({16, 16, 64}), w({64, 256});
    for (const auto* l : {&col, &row}) {
      const std::string which = l == &col ? "column" : "row";
      ExpectOneCollective(p, l->input, l->input_compute, x, BoxingOp::kAllGather, which + " input");
      ExpectOneCollective(p, l->weight, l->weight_compute, w, BoxingOp::kAllGather, which + " weight");
      // The product: in place (2d, 2.5d) or reduce-scattered along one axis (3d).
      const Tensor y = fn::matmul(MakeMetaGlobal(x, DType::kFloat32, p, l->input_compute),
                                  MakeMetaGlobal(w, DType::kFloat32, p, l->weight_compute));
      if (c.name == "3d")
        ExpectOneCollective(p, y.nd_sbp(), l->output, y.shape(), BoxingOp::kReduceScatter,
                            which + " product");
      else
        EXPECT_EQ(y.nd_sbp(), l->output) << which;
    }
    // The tied vocabulary table: the column weight transposed, its lookup
    // reduced into the hidden states' layout by one collective.
    const dist::EmbeddingLayouts e = dist::MultiAxisEmbeddingLayouts();
    ExpectOneCollective(p, e.table, e.table_compute, Shape({256, 64}), BoxingOp::kAllGather, "table");
    const Tensor looked_up =
        fn::embedding(MakeMetaGlobal(Shape({256, 64}), DType::kFloat32, p, e.table_compute),
                      MakeMetaGlobal(Shape({16, 16}), DType::kInt64, p, e.ids));
    ExpectOneCollective(p, looked_up.nd_sbp(), dist::GetActivationSbp(3), looked_up.shape(),
                        BoxingOp::kReduceScatter, "lookup");
  }
}

}  // namespace
}  // namespace tessel
