// The registries a program extends tessel through (docs/extending.md):
// gradient handlers (layers/gradient_handler.h) — the built-in clip_value's
// values, a registered handler run by name, the errors naming unknown names
// and bad options — and parallel modes (layers/parallel_mode.h): a mode's
// grid reaches dist::StageRanks, and grids that are not a partition of the
// world, sizes a mode's check refuses and unknown names are named; named
// axes (dist::AxisRank, AxisGroup, AxisSize): the built-in dp, tp, pp and a
// tensor mesh's, and one a mode adds, with the groups that are not a
// partition of the world named.
// Multi-rank runs of registered modes, handlers and schedules are the
// out-of-tree example's test (tests/install/check_extensions.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/join.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "graph/ir/meta.h"
#include "layers/dist.h"
#include "layers/gradient_handler.h"
#include "layers/parallel_mode.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

// A parameter whose gradient is `grad` (loss = sum(w * g) gives dL/dw = g).
Tensor ParameterWithGradient(const std::vector<float>& grad) {
  const Placement one("cpu", {0});
  const int64_t n = static_cast<int64_t>(grad.size());
  Tensor w = randn({n}, one, NdSbp{B()}, 3);
  w.set_requires_grad(true);
  const Tensor g = FromLocal(Tensor::FromVector(grad, {n}), one, NdSbp{B()}, Shape({n}));
  fn::sum(fn::mul(w, g), {0}).backward();
  return w;
}

TEST(GradientHandlers, ClipValueClampsEveryElementAndLeavesTheRestBitForBit) {
  const std::vector<float> grad = {-3.0f, -0.5f, -0.1f, 0.0f, 0.25f, 0.5f, 0.7f, 2.0f};
  Tensor w = ParameterWithGradient(grad);
  const optim::NamedParams params = {{"w", &w}};
  optim::ApplyGradientHandlers({optim::MakeGradientHandler("clip_value", {{"max_value", "0.5"}})}, params);
  std::vector<float> want;
  for (float g : grad) want.push_back(std::clamp(g, -0.5f, 0.5f));
  EXPECT_EQ(w.grad().to_local().ToVector<float>(), want);
}

TEST(GradientHandlers, ARegisteredHandlerRunsByNameInTheOrderGiven) {
  optim::RegisterGradientHandler("test_scale", [](const optim::HandlerOptions& options) {
    const double factor = optim::NumberOption(options, "factor", "test_scale");
    return [factor](const optim::NamedParams& params) {
      for (auto& [name, p] : params) p->set_grad(fn::mul_scalar(p->grad(), factor));
    };
  });
  const std::vector<std::string> names = optim::GradientHandlerNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "test_scale"), names.end());
  // Scale then clip, and clip then scale: the order shows in the values.
  Tensor a = ParameterWithGradient({1.0f, -0.1f}), b = ParameterWithGradient({1.0f, -0.1f});
  const auto scale = optim::MakeGradientHandler("test_scale", {{"factor", "4"}});
  const auto clip = optim::MakeGradientHandler("clip_value", {{"max_value", "1"}});
  optim::ApplyGradientHandlers({scale, clip}, {{"a", &a}});
  optim::ApplyGradientHandlers({clip, scale}, {{"b", &b}});
  EXPECT_EQ(a.grad().to_local().ToVector<float>(), (std::vector<float>{1.0f, -0.4f}));
  EXPECT_EQ(b.grad().to_local().ToVector<float>(), (std::vector<float>{4.0f, -0.4f}));
}

TEST(GradientHandlers, UnknownNamesAndBadOptionsAreNamed) {
  std::string e = ErrorOf([] { optim::MakeGradientHandler("zero_grad", {}); });
  EXPECT_NE(e.find("gradient handler 'zero_grad' is not registered; registered: clip_value"),
            std::string::npos)
      << e;
  e = ErrorOf([] { optim::MakeGradientHandler("clip_value", {}); });
  EXPECT_NE(e.find("'clip_value' needs option 'max_value'"), std::string::npos) << e;
  e = ErrorOf([] { optim::MakeGradientHandler("clip_value", {{"max_value", "half"}}); });
  EXPECT_NE(e.find("option max_value is 'half'; expected a number"), std::string::npos) << e;
  e = ErrorOf([] { optim::MakeGradientHandler("clip_value", {{"max_value", "-1"}}); });
  EXPECT_NE(e.find("max_value is -1; expected a positive number"), std::string::npos) << e;
  e = ErrorOf([] { optim::MakeGradientHandler("clip_value", {{"max_value", "1"}, {"norm", "2"}}); });
  EXPECT_NE(e.find("'clip_value' has no option 'norm'"), std::string::npos) << e;
  e = ErrorOf([] {
    optim::RegisterGradientHandler("clip_value",
                                   [](const optim::HandlerOptions&) { return optim::GradientHandler(); });
  });
  EXPECT_NE(e.find("'clip_value' is already registered"), std::string::npos) << e;
}

TEST(ParallelModes, TheModesGridIsTheStagesRanks) {
  dist::Setup({});
  EXPECT_EQ(dist::StageRanks(), (std::vector<std::vector<int>>{{0}}));
  EXPECT_EQ(dist::AxisRank("dp", 0), 0);
  EXPECT_EQ(dist::StageGridText(), "stage 0 [dp x tp] = [[0]]");
  // A mode's options reach it; Setup keeps the grid it gives.
  // Shared with the registered mode, which outlives this test.
  auto seen = std::make_shared<std::vector<std::string>>();
  dist::RegisterParallelMode("test_single", {.check = nullptr,
                                             .stage_ranks =
                                                 [seen](const dist::ParallelModeSizes& s) {
                                                   for (const auto& [k, v] : s.options)
                                                     seen->push_back(k + "=" + v);
                                                   return std::vector<std::vector<int>>{{0}};
                                                 },
                                             .tensor_mesh = {},
                                             .axes = {}});
  dist::Setup(
      {.tensor_parallel_mode = "test_single", .tensor_parallel_mode_options = {{"order", "reversed"}}});
  EXPECT_EQ(*seen, std::vector<std::string>{"order=reversed"});
  EXPECT_EQ(dist::GetConfig().tensor_parallel_mode, "test_single");
  dist::Setup({});
}

TEST(ParallelModes, GridsThatAreNotAPartitionAndRefusedSizesAreNamed) {
  auto mode = [](std::vector<std::vector<int>> grid) {
    return dist::ParallelMode{.check = nullptr,
                              .stage_ranks = [grid](const dist::ParallelModeSizes&) { return grid; },
                              .tensor_mesh = {},
                              .axes = {}};
  };
  dist::RegisterParallelMode("test_outside", mode({{3}}));
  dist::RegisterParallelMode("test_two_stages", mode({{0}, {0}}));
  dist::RegisterParallelMode("test_empty_stage", mode({{}}));
  dist::RegisterParallelMode(
      "test_needs_tp4",
      {.check =
           [](const dist::ParallelModeSizes& s) {
             TESSEL_CHECK(s.tensor_parallel_size == 4)
                 << "test_needs_tp4 needs tensor_parallel_size 4, got " << s.tensor_parallel_size;
           },
       .stage_ranks = [](const dist::ParallelModeSizes&) { return std::vector<std::vector<int>>{{0}}; },
       .tensor_mesh = {},
       .axes = {}});
  std::string e = ErrorOf([] { dist::Setup({.tensor_parallel_mode = "test_outside"}); });
  EXPECT_NE(e.find("gave stage 0 rank 3, outside the world of 1"), std::string::npos) << e;
  e = ErrorOf([] { dist::Setup({.tensor_parallel_mode = "test_two_stages"}); });
  EXPECT_NE(e.find("formed 2 stages; expected pipeline_parallel_size=1"), std::string::npos) << e;
  e = ErrorOf([] { dist::Setup({.tensor_parallel_mode = "test_empty_stage"}); });
  EXPECT_NE(e.find("gave stage 0 the ranks []; expected dp 1 x tp 1 of them"), std::string::npos) << e;
  e = ErrorOf([] { dist::Setup({.tensor_parallel_mode = "test_needs_tp4"}); });
  EXPECT_NE(e.find("test_needs_tp4 needs tensor_parallel_size 4, got 1"), std::string::npos) << e;
  e = ErrorOf([] { dist::Setup({.tensor_parallel_mode_options = {{"depth", "2"}}}); });
  EXPECT_NE(e.find("tensor_parallel_mode '1d' takes no options; got 'depth'"), std::string::npos) << e;
  e = ErrorOf([] { dist::Setup({.tensor_parallel_mode = "4d"}); });
  EXPECT_NE(e.find("tensor_parallel_mode '4d' is not registered; registered: 1d, 2.5d, 2d, 3d, test_"),
            std::string::npos)
      << e;
  e = ErrorOf([] {
    dist::RegisterParallelMode("1d",
                               {.check = nullptr, .stage_ranks = nullptr, .tensor_mesh = {}, .axes = {}});
  });
  EXPECT_NE(e.find("no stage_ranks given"), std::string::npos) << e;
  dist::Setup({});
}

// dp, tp and pp of a world of 8 as 1d lays it out (stages of 4 contiguous
// ranks, tp innermost): [dp, tp] = [[0 1] [2 3]] on stage 0, [[4 5] [6 7]]
// on stage 1; and the two axes of 2d's tensor mesh (tp index = 2 i + j).
TEST(NamedAxes, TheBuiltInAxesFollowTheStagesGrids) {
  {
    MetaScope meta(8, 5);
    dist::Setup({.data_parallel_size = 2,
                 .tensor_parallel_size = 2,
                 .pipeline_parallel_size = 2,
                 .pipeline_num_layers = 2});
    EXPECT_EQ(dist::AxisNames(), (std::vector<std::string>{"dp", "pp", "tp"}));
    EXPECT_EQ(dist::AxisGroup("dp", 0), (std::vector<int>{0, 2}));
    EXPECT_EQ(dist::AxisGroup("dp", 7), (std::vector<int>{5, 7}));
    EXPECT_EQ(dist::AxisGroup("tp", 2), (std::vector<int>{2, 3}));
    EXPECT_EQ(dist::AxisGroup("pp", 1), (std::vector<int>{1, 5}));
    EXPECT_EQ(dist::AxisGroup("pp"), (std::vector<int>{1, 5}));  // this rank's: 5
    EXPECT_EQ(dist::AxisRank("pp"), 1);
    EXPECT_EQ(dist::AxisRank("dp"), 0);
    EXPECT_EQ(dist::AxisRank("tp"), 1);
    const int64_t dp_index[] = {0, 0, 1, 1, 0, 0, 1, 1};  // [[0 1] [2 3]], [[4 5] [6 7]]
    for (int r = 0; r < 8; ++r) EXPECT_EQ(dist::AxisRank("dp", r), dp_index[r]) << r;
    EXPECT_EQ(dist::AxisSize("dp"), 2);
    EXPECT_EQ(dist::AxisSize("pp"), 2);
  }
  {
    MetaScope meta(4, 0);
    dist::Setup({.tensor_parallel_size = 4, .tensor_parallel_mode = "2d"});
    EXPECT_EQ(dist::AxisNames(), (std::vector<std::string>{"dp", "pp", "tp", "tp0", "tp1"}));
    EXPECT_EQ(dist::AxisGroup("tp0", 0), (std::vector<int>{0, 2}));
    EXPECT_EQ(dist::AxisGroup("tp0", 3), (std::vector<int>{1, 3}));
    EXPECT_EQ(dist::AxisGroup("tp1", 2), (std::vector<int>{2, 3}));
    EXPECT_EQ(dist::AxisRank("tp0", 3), 1);
    EXPECT_EQ(dist::AxisRank("tp1", 2), 0);
  }
  dist::Setup({});
}

// A mode's own axis: ranks grouped two by two ("machine"), reachable by
// name and printed with the layout; groups that are not a partition of the
// world, built-in or repeated names and unknown axes are named.
TEST(NamedAxes, AModeAddsAnAxis) {
  auto machines = [](std::vector<std::vector<int>> groups, std::string name = "machine") {
    return dist::ParallelMode{.check = nullptr,
                              .stage_ranks =
                                  [](const dist::ParallelModeSizes& s) {
                                    std::vector<int> all(static_cast<size_t>(s.world_size));
                                    for (int r = 0; r < s.world_size; ++r) all[static_cast<size_t>(r)] = r;
                                    return std::vector<std::vector<int>>{all};
                                  },
                              .tensor_mesh = {},
                              .axes =
                                  [groups, name](const dist::ParallelModeSizes&) {
                                    return std::vector<dist::NamedAxis>{{name, groups}};
                                  }};
  };
  dist::RegisterParallelMode("test_machines", machines({{0, 1}, {2, 3}}));
  dist::RegisterParallelMode("test_axis_twice", machines({{0, 1}, {1, 3}}));
  dist::RegisterParallelMode("test_axis_missing", machines({{0, 1}, {2}}));
  dist::RegisterParallelMode("test_axis_outside", machines({{0, 1}, {2, 4}}));
  dist::RegisterParallelMode("test_axis_short", machines({{0, 1, 2}}));
  dist::RegisterParallelMode("test_axis_builtin", machines({{0, 1}, {2, 3}}, "tp1"));
  {
    MetaScope meta(4, 3);
    dist::Setup({.data_parallel_size = 4, .tensor_parallel_mode = "test_machines"});
    EXPECT_EQ(dist::AxisNames(), (std::vector<std::string>{"dp", "machine", "pp", "tp"}));
    EXPECT_EQ(dist::AxisRank("machine"), 1);
    EXPECT_EQ(dist::AxisGroup("machine"), (std::vector<int>{2, 3}));
    EXPECT_EQ(dist::AxisGroup("machine", 0), (std::vector<int>{0, 1}));
    EXPECT_EQ(dist::AxisSize("machine"), 2);
    const std::vector<std::string> lines = dist::LayoutLines();
    EXPECT_NE(std::find(lines.begin(), lines.end(), "axis machine (test_machines): [0 1] [2 3]"), lines.end())
        << Join(lines, "\n");
    std::string e = ErrorOf([] { dist::AxisRank("expert"); });
    EXPECT_NE(e.find("axis 'expert' is not defined; the axes are dp, machine, pp, tp"), std::string::npos)
        << e;
    const std::pair<const char*, const char*> bad[] = {
        {"test_axis_twice", "axis 'machine': rank 1 is in group 0 and again in group 1"},
        {"test_axis_missing", "group 1 [2] has 1 ranks, group 0 [0, 1] 2; expected groups of one size"},
        {"test_axis_outside", "group 1 holds rank 4, outside the world of 4"},
        {"test_axis_short", "rank 3 is in no group; expected every rank of the world of 4"},
        {"test_axis_builtin", "axis 'tp1': dp, tp, pp and tp0, tp1, ... are built in"}};
    for (const auto& [mode, message] : bad) {
      e = ErrorOf([mode = std::string(mode)] {
        dist::Setup({.data_parallel_size = 4, .tensor_parallel_mode = mode});
      });
      EXPECT_NE(e.find(message), std::string::npos) << mode << ": " << e;
    }
  }
  dist::Setup({});
}

}  // namespace
}  // namespace tessel
