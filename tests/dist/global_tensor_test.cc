// Global tensors on 4 ranks: construction from local shards (shape
// inference, metadata checks across ranks), layout-invariant factories,
// to_local, and the errors for bad placements and layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/comm/process_group.h"
#include "core/half.h"
#include "core/init.h"
#include "graph/autograd.h"
#include "graph/eager_interpreter.h"
#include "graph/global_tensor_ops.h"
#include "layers/optimizer.h"
#include "ops/functional.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::ErrorOf;

int Me() { return comm::World().rank(); }
const Placement kLine("cpu", {0, 1, 2, 3});
const Placement kSquare("cpu", {{0, 1}, {2, 3}});

TEST(GlobalTensor, FromLocalInfersUnevenLogicalShape) {
  // 7 rows over 4 ranks: 2, 2, 2, 1 (larger shards first).
  const int64_t rows[] = {2, 2, 2, 1};
  Tensor local = full({rows[Me()], 5}, Me(), DType::kInt64);
  Tensor g = FromLocal(local, kLine, {S(0)});
  EXPECT_TRUE(g.is_global());
  EXPECT_EQ(g.shape(), (Shape{7, 5}));
  EXPECT_EQ(g.to_local().shape(), (Shape{rows[Me()], 5}));
  EXPECT_EQ(g.placement(), kLine);
  Tensor all = GatherLogical(g);
  std::vector<int64_t> v = all.ToVector<int64_t>();
  const int64_t owner[] = {0, 0, 1, 1, 2, 2, 3};
  for (int64_t i = 0; i < 35; ++i) ASSERT_EQ(v[i], owner[i / 5]);
  // to_global on a local tensor is FromLocal, as in OneFlow.
  EXPECT_EQ(local.to_global(kLine, {S(0)}).shape(), (Shape{7, 5}));
}

// Layout changes are ops: an interpreter pushed on the stack (a tracer, say)
// sees to_global and from_local with their layouts as attributes, and
// autograd differentiates them like any other op.
class Recorder final : public Interpreter {
 public:
  std::vector<Tensor> Apply(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs) override {
    seen.push_back(op.name + (attrs.Has("nd_sbp") ? " " + attrs.Get<std::string>("nd_sbp") : ""));
    return EagerInterpreter().Apply(op, inputs, attrs);
  }
  std::vector<std::string> seen;
};

TEST(GlobalTensor, LayoutChangesAreOpsTheInterpreterSees) {
  Recorder recorder;
  AutogradInterpreter autograd(recorder);
  InterpreterScope scope(autograd);
  Tensor w = full({4, 3}, 1.0 + Me(), DType::kFloat32).set_requires_grad(true);
  Tensor g = FromLocal(w, kLine, {S(0)});                // [16, 3]
  Tensor b = g.to_global(kLine, {B()});                  // all-gather
  Tensor same = b.to_global(kLine, {B()});               // no change: not an op
  Tensor loss = fn::sum(fn::mul_scalar(same, 2.0), {});  // d loss / d w = 2 everywhere
  loss.backward();
  ASSERT_GE(recorder.seen.size(), 3u);
  EXPECT_EQ(recorder.seen[0], "from_local [S(0)]");
  EXPECT_EQ(recorder.seen[1], "to_global [B]");
  EXPECT_EQ(recorder.seen[2], "mul_scalar");
  // Backward ran the layout ops' gradients through the same stack.
  EXPECT_GT(std::count_if(recorder.seen.begin(), recorder.seen.end(),
                          [](const std::string& s) { return s.rfind("to_global", 0) == 0; }),
            1);
  EXPECT_EQ(g.shape(), (Shape{16, 3}));
  ASSERT_TRUE(w.grad().defined());
  EXPECT_FALSE(w.grad().is_global());
  EXPECT_EQ(w.grad().ToVector<float>(), std::vector<float>(12, 2.0f));
}

TEST(GlobalTensor, PartialFromLocalSumsOnGather) {
  Tensor g = FromLocal(full({3}, Me() + 1, DType::kFloat32), kSquare, {P(), P()});
  EXPECT_EQ(GatherLogical(g).ToVector<float>(), (std::vector<float>{10, 10, 10}));
}

TEST(GlobalTensor, FactoriesDoNotDependOnLayout) {
  const Shape shape{7, 5, 3};
  Tensor want = rand(shape, /*seed=*/11);
  for (const auto& [placement, nd_sbp] :
       std::vector<std::pair<Placement, NdSbp>>{{kLine, {S(0)}},
                                                {kLine, {B()}},
                                                {kLine, {P()}},
                                                {kSquare, {S(1), S(0)}},
                                                {kSquare, {S(2), P()}},
                                                {Placement("cpu", {1, 3}), {S(1)}}}) {
    Tensor g = rand(shape, placement, nd_sbp, /*seed=*/11);
    Tensor all = GatherLogical(g);
    if (placement.Contains(Me())) {
      EXPECT_EQ(all.ToVector<float>(), want.ToVector<float>()) << nd_sbp << " on " << placement;
    } else {
      EXPECT_FALSE(all.defined());
      EXPECT_EQ(g.to_local().numel(), 0);  // non-members keep metadata, no data
      EXPECT_EQ(g.shape(), shape);
    }
  }
  EXPECT_EQ(GatherLogical(arange({6}, kLine, {S(0)}, DType::kInt64)).ToVector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(GlobalTensor, InconsistentMetadataNamesTheRank) {
  // Rank 2 disagrees about the SBP: every rank fails, none hangs.
  std::string err = ErrorOf([] { FromLocal(zeros({2, 5}), kLine, {Me() == 2 ? B() : S(0)}); });
  EXPECT_NE(err.find("inconsistent global tensor metadata: rank 2 passed cpu:[0, 1, 2, 3] [B] f32"),
            std::string::npos)
      << err;
  // Shards that cannot come from one balanced split.
  err = ErrorOf([] { FromLocal(zeros({Me() == 0 ? 1 : 3, 5}), kLine, {S(0)}); });
  EXPECT_NE(err.find("rank 0 holds a shard of shape [1, 5]"), std::string::npos) << err;
  // Broadcast shards must agree in shape too.
  err = ErrorOf([] { FromLocal(zeros({Me() == 3 ? 4 : 3}), kLine, {B()}); });
  EXPECT_NE(err.find("rank 3 holds a shard of shape [4]"), std::string::npos) << err;
}

TEST(GlobalTensor, BadLayoutsAreNamed) {
  Tensor x = zeros({7, 5}, kLine, {S(0)});
  EXPECT_NE(ErrorOf([&] {
              x.to_global(Placement("cpu", {0, 9}), {B()});
            }).find("names rank 9, outside the world of WORLD_SIZE=4"),
            std::string::npos);
  EXPECT_NE(
      ErrorOf([&] { x.to_global(kLine, {S(2)}); }).find("splits axis 2 but the tensor has 2 dimension(s)"),
      std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              x.to_global(kSquare, {S(0)});
            }).find("has 1 entries but the placement's hierarchy has 2 axes"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { x.data<float>(); }).find("element access to a global tensor"), std::string::npos);
}

// Half-precision partial sums are reduced in f32 and rounded once: bf16
// 1 + 3 * 2^-9 is 1.005859375 exactly, which rounds to 1.0078125; rounding
// after each pairwise step would stay at 1.0.
TEST(GlobalTensor, HalfPartialSumsRoundOnce) {
  const float mine = Me() == 0 ? 1.0f : std::ldexp(1.0f, -9);
  Tensor p = FromLocal(full({4}, mine, DType::kBFloat16), kLine, {P()});
  Tensor all = p.to_global(kLine, {B()}).to_local();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<float>(all.data<BFloat16>()[i]), 1.0078125f) << i;
  Tensor part = p.to_global(kLine, {S(0)}).to_local();  // reduce-scatter
  ASSERT_EQ(part.numel(), 1);
  EXPECT_EQ(static_cast<float>(part.data<BFloat16>()[0]), 1.0078125f);
}

// P(max) propagates NaN whichever rank holds it, as PyTorch's max does.
TEST(GlobalTensor, PartialMaxPropagatesNaN) {
  for (int nan_rank : {0, 1, 3}) {
    Tensor p = FromLocal(full({3}, Me() == nan_rank ? NAN : Me(), DType::kFloat32), kLine, {PMax()});
    Tensor all = p.to_global(kLine, {B()}).to_local();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(all.data<float>()[i])) << "NaN on rank " << nan_rank;
  }
}

// With lockstep checks on (the tests run with TESSEL_CHECK_LOCKSTEP=1),
// ranks that ask for different layouts fail at once on every rank, naming
// what each asked for, instead of hanging in mismatched collectives.
TEST(GlobalTensor, DisagreeingRequestsFailFastOnEveryRank) {
  ASSERT_TRUE(LockstepChecksEnabled());
  Tensor x = zeros({8, 4}, kLine, {B()});
  auto start = std::chrono::steady_clock::now();
  std::string err = ErrorOf([&] { x.to_global(kLine, {Me() == 2 ? S(0) : S(1)}); });
  EXPECT_NE(err.find("ranks disagree"), std::string::npos) << err;
  EXPECT_NE(err.find("rank 2 asked for to_global of f32 [8, 4] [B] on cpu:[0, 1, 2, 3] -> [S(0)]"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("ranks 0-1,3 asked for"), std::string::npos) << err;
  // Different placements too.
  err = ErrorOf([&] { x.to_global(Me() == 1 ? Placement("cpu", {0, 1}) : kLine, {B()}); });
  EXPECT_NE(err.find("rank 1 asked for to_global of f32 [8, 4] [B] on cpu:[0, 1, 2, 3] -> [B] on cpu:[0, 1]"),
            std::string::npos)
      << err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(GlobalTensor, FromLocalUndefinedShards) {
  const Placement pair("cpu", {0, 1});
  // Ranks outside the placement may pass nothing.
  Tensor g = FromLocal(Me() < 2 ? full({2, 3}, 1.0) : Tensor(), pair, {S(0)});
  EXPECT_EQ(g.shape(), (Shape{4, 3}));
  // A member passing nothing fails on every rank, named.
  std::string err = ErrorOf([&] { FromLocal(Me() == 1 ? Tensor() : full({2, 3}, 1.0), pair, {S(0)}); });
  EXPECT_NE(err.find("rank 1 passed an undefined tensor as its shard"), std::string::npos) << err;
}

TEST(GlobalTensor, BadShardNamesTheRankThatPassedIt) {
  // Shards [2,3], [2,3], [3,3], [2,3]: a balanced split of 8 rows is 2 each,
  // so rank 2 is wrong (not rank 0, which a 9-row sum would blame).
  std::string err = ErrorOf([] { FromLocal(zeros({Me() == 2 ? 3 : 2, 3}), kLine, {S(0)}); });
  EXPECT_NE(err.find("rank 2 holds a shard of shape [3, 3] where [2, 3] was expected"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("rank 0 holds"), std::string::npos) << err;
  // With the logical shape given, the rank checks its own shard.
  err = ErrorOf([] { FromLocal(zeros({Me() == 2 ? 3 : 2, 3}), kLine, {S(0)}, Shape{8, 3}); });
  EXPECT_NE(err.find("rank 2 holds a shard of shape [3, 3]"), std::string::npos) << err;
}

// The values a training loop logs (the loss on the last stage, the gradient
// norm on the first, partial sums and maxima, a rank's own) reach every
// rank, those outside the placements included, with the numbers every rank
// adds (a stop request) in the same all-reduce.
TEST(GlobalTensor, ScalarValuesOfEveryLayoutReachEveryRankInOneCall) {
  const Placement first("cpu", {0, 1}), last("cpu", {2, 3});
  auto scalar = [](double v) { return full({1}, v, DType::kFloat32); };
  const Tensor on_first = FromLocal(scalar(3), first, {B()}, Shape{1});                  // 3 on ranks 0, 1
  const Tensor partial_last = FromLocal(scalar(Me()), last, {P()}, Shape{1});            // 2 + 3
  const Tensor square = FromLocal(scalar(1 + Me() / 2), kSquare, {P(), B()}, Shape{1});  // 1 + 2
  const Tensor max_line = FromLocal(scalar(2 * Me()), kLine, {Sbp::PartialMax()}, Shape{1});    // 6
  const Tensor max_first = FromLocal(scalar(10 + Me()), first, {Sbp::PartialMax()}, Shape{1});  // 11
  const Tensor world = FromLocal(scalar(7), kLine, {B()}, Shape{1});
  const Tensor own = scalar(Me());
  std::vector<double> summed = {Me() == 2 ? 1.0 : 0.0, 1.0};
  const std::vector<double> v =
      optim::ScalarValues({on_first, partial_last, square, max_line, max_first, world, own}, &summed);
  EXPECT_EQ(v, (std::vector<double>{3, 5, 3, 6, 11, 7, static_cast<double>(Me())}));
  EXPECT_EQ(summed, (std::vector<double>{1, 4}));
  EXPECT_EQ(optim::ScalarValue(partial_last), 5);
  // Only local tensors and nothing to add: no exchange at all (a rank alone
  // could not be waited for).
  EXPECT_EQ(optim::ScalarValues({own}), (std::vector<double>{static_cast<double>(Me())}));
}

}  // namespace
}  // namespace tessel
