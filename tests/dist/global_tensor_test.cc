// Global tensors on 4 ranks: construction from local shards (shape
// inference, metadata checks across ranks), layout-invariant factories,
// to_local, and the errors for bad placements and layouts.
#include <gtest/gtest.h>

#include "core/comm/process_group.h"
#include "graph/global_tensor_ops.h"
#include "tests/testing/test_util.h"

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

}  // namespace
}  // namespace tessel
