// Ops on global tensors match the single-process result, forward and
// backward. Each case runs an op on full local tensors (the reference) and
// on global tensors laid out under several SBP signatures (including ones
// that produce partial sums and ones that force boxing), on a 1-D mesh of
// all ranks and, with 4 ranks, on a 2x2 mesh; the gathered outputs and
// input gradients must agree within 1e-5.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "core/comm/process_group.h"
#include "core/init.h"
#include "graph/autograd.h"
#include "graph/global_tensor_ops.h"
#include "ops/functional.h"
#include "sbp/global_tensor.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

using testing::RelError;

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

struct Case {
  std::string name;
  std::vector<Tensor> inputs;                // full values (same on every rank)
  std::vector<std::vector<Sbp>> layouts_1d;  // one Sbp per input, per layout
  OpFn op;
};

uint64_t g_seed = 100;
Tensor Randn(const Shape& s) { return randn(s, g_seed++); }

std::vector<Case> Cases() {
  Tensor labels = Tensor::FromVector<int64_t>({3, 0, 9, 1, -100, 7, 2}, {7});
  Tensor mask = Tensor::Empty({2, 1, 1, 5}, DType::kBool);
  for (int64_t i = 0; i < 10; ++i) mask.data<bool>()[i] = i != 9;  // batch 1 pads its last key
  return {
      {"matmul",
       {Randn({7, 6}), Randn({6, 5})},
       {{S(0), B()}, {B(), S(1)}, {S(1), S(0)}, {P(), B()}, {S(1), S(1)}, {B(), B()}},
       [](const std::vector<Tensor>& in) { return fn::matmul(in[0], in[1]); }},
      {"matmul_nt_batched",
       {Randn({3, 7, 6}), Randn({5, 6})},
       {{S(0), B()}, {S(1), B()}, {S(2), S(1)}, {B(), S(0)}},
       [](const std::vector<Tensor>& in) { return fn::matmul(in[0], in[1], false, true); }},
      {"add_broadcast",
       {Randn({7, 5}), Randn({5})},
       {{S(0), B()}, {S(1), S(0)}, {P(), P()}, {S(0), S(0)}},
       [](const std::vector<Tensor>& in) { return fn::add(in[0], in[1]); }},
      {"mul",
       {Randn({7, 5}), Randn({7, 5})},
       {{S(0), S(0)}, {P(), B()}, {S(1), S(0)}},
       [](const std::vector<Tensor>& in) { return fn::mul(in[0], in[1]); }},
      {"div",
       {Randn({7, 5}), fn::add_scalar(rand({7, 5}, 77), 0.5)},
       {{S(0), S(0)}, {P(), B()}},
       [](const std::vector<Tensor>& in) { return fn::div(in[0], in[1]); }},
      {"gelu",
       {Randn({7, 5})},
       {{S(0)}, {S(1)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::gelu(in[0]); }},
      {"tanh_scaled",
       {Randn({7, 5})},
       {{S(1)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::mul_scalar(fn::tanh(in[0]), 3.0); }},
      {"softmax",
       {Randn({7, 5})},
       {{S(0)}, {S(1)}, {B()}},
       [](const std::vector<Tensor>& in) { return fn::softmax(in[0]); }},
      {"layer_norm",
       {Randn({7, 5}), Randn({5}), Randn({5})},
       {{S(0), B(), B()}, {S(1), S(0), B()}},
       [](const std::vector<Tensor>& in) { return fn::layer_norm(in[0], in[1], in[2]); }},
      {"sum_axis1",
       {Randn({7, 5, 3})},
       {{S(1)}, {S(0)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::sum(in[0], {1}); }},
      {"mean_axis0_keepdim",
       {Randn({7, 5})},
       {{S(0)}, {S(1)}},
       [](const std::vector<Tensor>& in) { return fn::mean(in[0], {0}, true); }},
      {"cross_entropy_rows",
       {Randn({7, 10}), labels},
       {{S(0), S(0)}, {S(1), B()}, {B(), B()}},
       [](const std::vector<Tensor>& in) { return fn::cross_entropy_rows(in[0], in[1]); }},
      {"transpose",
       {Randn({7, 5})},
       {{S(0)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::transpose(in[0], 0, 1); }},
      {"reshape",
       {Randn({7, 6})},
       {{S(0)}, {S(1)}},
       [](const std::vector<Tensor>& in) {
         return fn::reshape(in[0], {7, 2, 3});
       }},
      // Vocab-parallel (table split on V: partial sums), hidden-split, row-split.
      {"embedding",
       {Randn({11, 6}), Tensor::FromVector<int64_t>({3, 0, 10, 3, 9, 1, 5, 0}, {2, 4})},
       {{S(0), B()}, {S(1), B()}, {B(), S(1)}, {B(), S(0)}},
       [](const std::vector<Tensor>& in) { return fn::embedding(in[0], in[1]); }},
      {"pick",
       {Randn({7, 10}), labels},
       {{S(1), B()}, {S(0), S(0)}},
       [](const std::vector<Tensor>& in) { return fn::pick(in[0], in[1]); }},
      // The same logical mask under every layout.
      {"dropout",
       {Randn({7, 5, 3})},
       {{S(0)}, {S(1)}, {S(2)}, {B()}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::dropout(in[0], 0.25, 7, 3); }},
      {"max_axis1",
       {Randn({7, 5})},
       {{S(1)}, {S(0)}},
       [](const std::vector<Tensor>& in) { return fn::max(in[0], {1}); }},
      {"exp_log_sqrt",
       {fn::add_scalar(rand({7, 5}, 78), 0.5)},
       {{S(0)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::sqrt(fn::log(fn::exp(in[0]))); }},
      {"scale_mask_softmax_causal",
       {Randn({2, 3, 5, 5}), mask},
       {{S(0), S(0)}, {S(1), B()}, {S(3), B()}, {S(2), B()}},
       [](const std::vector<Tensor>& in) { return fn::scale_mask_softmax(in[0], in[1], 0.5, true); }},
      // Heads, batch or queries split (a query shard keeps its causal limit),
      // and a layout that must be converted first.
      {"attention_causal",
       {Randn({2, 4, 6, 8}), Randn({2, 4, 9, 8}), Randn({2, 4, 9, 8})},
       {{S(0), S(0), S(0)}, {S(1), S(1), S(1)}, {S(2), B(), B()}, {B(), B(), B()}, {S(2), S(0), S(1)}},
       [](const std::vector<Tensor>& in) { return fn::attention(in[0], in[1], in[2], 0.3, true); }},
      // The fused projection into heads and back: batch, sequence, heads
      // or partial, and a split of the features (across q, k and v) that
      // must be converted first.
      {"split_qkv",
       {Randn({4, 6, 4, 15})},
       {{S(0)}, {S(1)}, {S(2)}, {P()}, {S(3)}},
       [](const std::vector<Tensor>& in) { return fn::concat(fn::split_qkv(in[0]), 0); }},
      {"merge_qkv",
       {Randn({4, 4, 6, 5}), Randn({4, 4, 6, 5}), Randn({4, 4, 6, 5})},
       {{S(0), S(0), S(0)}, {S(1), S(1), S(1)}, {S(2), S(2), S(2)}, {P(), P(), P()}, {S(1), S(2), B()}},
       [](const std::vector<Tensor>& in) { return fn::merge_qkv(in[0], in[1], in[2]); }},
      // The linear ops: rows split, a column split of the weight (and bias),
      // a row split (partial products, the bias partial too), partial x;
      // with GELU only the rows and columns (the rest converted first).
      {"linear",
       {Randn({4, 8, 8}), Randn({8, 12}), Randn({12})},
       {{S(0), B(), B()},
        {S(1), B(), B()},
        {B(), S(1), S(0)},
        {S(2), S(0), P()},
        {S(2), S(0), B()},
        {P(), B(), B()}},
       [](const std::vector<Tensor>& in) { return fn::linear(in[0], in[1], in[2]); }},
      {"linear_gelu_tanh",
       {Randn({4, 8, 8}), Randn({8, 12}), Randn({12})},
       {{S(0), B(), B()}, {S(1), B(), B()}, {B(), S(1), S(0)}, {S(2), S(0), B()}, {P(), B(), B()}},
       [](const std::vector<Tensor>& in) { return fn::linear_gelu_tanh(in[0], in[1], in[2]); }},
      {"linear_residual",
       {Randn({4, 8, 8}), Randn({8, 12}), Randn({12}), Randn({4, 8, 12})},
       {{S(0), B(), B(), S(0)},
        {B(), S(1), S(0), S(2)},
        {S(2), S(0), P(), P()},
        {S(2), S(0), B(), B()},
        {P(), B(), B(), S(1)}},
       [](const std::vector<Tensor>& in) { return fn::linear_residual(in[0], in[1], in[2], in[3]); }},
      // Attention from the fused projection: batch or heads split; a split
      // sequence is gathered first.
      {"qkv_attention",
       {Randn({4, 8, 4, 15})},
       {{S(0)}, {S(2)}, {S(1)}, {P()}},
       [](const std::vector<Tensor>& in) { return fn::qkv_attention(in[0], 0.3, true); }},
      {"patch_embed",
       {Randn({4, 3, 4, 6}), Randn({5, 12}), Randn({5})},
       {{S(0), B(), B()}, {B(), S(0), S(0)}},
       [](const std::vector<Tensor>& in) {
         return fn::add(fn::matmul(fn::patchify(in[0], 2), in[1], false, true), in[2]);
       }},
      {"global_norm",
       {Randn({7, 5}), Randn({4})},
       {{P(), S(0)}, {S(1), B()}},
       [](const std::vector<Tensor>& in) { return fn::global_norm(in); }},
      {"concat_slice",
       {Randn({7, 2}), Randn({7, 3})},
       {{S(0), S(0)}, {S(1), B()}, {P(), P()}},
       [](const std::vector<Tensor>& in) { return fn::slice(fn::concat(in, 1), 1, 1, 4); }},
      {"permute",
       {Randn({7, 5, 3})},
       {{S(0)}, {S(2)}, {P()}},
       [](const std::vector<Tensor>& in) {
         return fn::permute(in[0], {2, 0, 1});
       }},
      {"adamw_step",
       {Randn({7, 5}), Randn({7, 5})},
       {{S(0), S(0)}, {B(), P()}, {S(1), B()}},
       [](const std::vector<Tensor>& in) {
         // In place: on copies (the inputs are reused), states on their own memory.
         NoGradGuard no_grad;
         Tensor p = fn::mul_scalar(in[0], 1.0), m = fn::mul_scalar(in[0], 0.0),
                v = fn::mul_scalar(in[0], 0.0);
         return fn::adamw_update(p, in[1], m, v, ReplicatedScalar(0, p, DType::kInt64),
                                 ReplicatedScalar(0.1, p, DType::kFloat32), {})
             .at(0);
       }},
  };
}

// The op's output and the gradients of sum(output * r) for its float inputs.
struct Result {
  Tensor out;
  std::vector<Tensor> grads;
};

Result RunLocal(const Case& c, const Tensor& r) {
  std::vector<Tensor> in;
  for (const Tensor& t : c.inputs) {
    in.push_back(t.Clone());
    if (IsFloating(t.dtype())) in.back().set_requires_grad(true);
  }
  Tensor out = c.op(in);
  if (out.requires_grad()) fn::sum(fn::mul(out, r), {}).backward();
  Result res{out.detach(), {}};
  for (const Tensor& t : in) res.grads.push_back(IsFloating(t.dtype()) ? t.grad() : Tensor());
  return res;
}

Result RunGlobal(const Case& c, const Tensor& r, const Placement& p, const std::vector<NdSbp>& layout) {
  const NdSbp all_b(std::vector<Sbp>(p.ndim(), B()));
  std::vector<Tensor> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    in.push_back(FromLocal(c.inputs[i], p, all_b).to_global(p, layout[i]));
    if (IsFloating(in.back().dtype())) in.back().set_requires_grad(true);
  }
  Tensor out = c.op(in);
  if (out.requires_grad()) fn::sum(fn::mul(out, FromLocal(r, p, all_b)), {}).backward();
  Result res{GatherLogical(out), {}};
  for (const Tensor& t : in) res.grads.push_back(t.grad().defined() ? GatherLogical(t.grad()) : Tensor());
  return res;
}

// Issue 50's reproducer: a [5] i64 tensor on rank 0 alone, made with
// FromLocal while the other ranks pass an empty shard (they hold nothing of
// it), then spread over every rank. With lockstep checks off (the default)
// every rank learns the logical shape [5] from the exchange, so the spread
// agrees; it used to leave the others with [0] and hang in the next
// collective for the whole communication timeout.
TEST(GlobalOps, ARankOutsideThePlacementLearnsTheLogicalShape) {
  const bool lockstep = LockstepChecksEnabled();
  SetLockstepChecks(false);
  const int rank = comm::World().rank(), world = comm::World().size();
  const Placement first(DeviceType::kCPU, {0});
  const Tensor local = rank == 0 ? Tensor::FromVector<int64_t>({10, 11, 12, 13, 14}, {5})
                                 : Tensor::Empty(Shape({0}), DType::kInt64);
  const auto start = std::chrono::steady_clock::now();
  Tensor g = FromLocal(local, first, {B()});
  EXPECT_EQ(g.shape(), (Shape{5}));
  Tensor spread = g.to_global(WorldPlacement(DeviceType::kCPU), {S(0)});
  // 5 rows over the world, larger shards first.
  const int64_t base = 5 / world, extra = 5 % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra), rows = base + (rank < extra ? 1 : 0);
  std::vector<int64_t> want;
  for (int64_t r = begin; r < begin + rows; ++r) want.push_back(10 + r);
  EXPECT_EQ(spread.to_local().ToVector<int64_t>(), want);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  SetLockstepChecks(lockstep);
}

TEST(GlobalOps, MatchTheSingleProcessResult) {
  auto& world = comm::World();
  std::vector<int> ranks(world.size());
  for (int i = 0; i < world.size(); ++i) ranks[i] = i;
  std::vector<Placement> meshes = {Placement("cpu", ranks)};
  if (world.size() == 4) meshes.push_back(Placement("cpu", {{0, 1}, {2, 3}}));
  int checked = 0;
  for (const Case& c : Cases()) {
    Tensor probe = c.op(c.inputs);
    Tensor r = randn(probe.shape(), 999);
    Result want = RunLocal(c, r);
    for (const Placement& p : meshes) {
      const size_t n = c.layouts_1d.size();
      for (size_t li = 0; li < n; ++li) {
        // On a 2-D mesh, pair each layout with the next one on the second axis.
        std::vector<NdSbp> layout;
        for (size_t i = 0; i < c.inputs.size(); ++i) {
          std::vector<Sbp> nd = {c.layouts_1d[li][i]};
          if (p.ndim() == 2) nd.push_back(c.layouts_1d[(li + 1) % n][i]);
          layout.push_back(NdSbp(nd));
        }
        std::string what = c.name + " on " + p.ToString() + " with input layouts";
        for (const NdSbp& l : layout) what.append(" ").append(l.ToString());
        SCOPED_TRACE(what);
        Result got = RunGlobal(c, r, p, layout);
        ASSERT_EQ(got.out.shape(), want.out.shape());
        EXPECT_LE(RelError(got.out, want.out), 1e-5) << "forward";
        for (size_t i = 0; i < c.inputs.size(); ++i) {
          if (!want.grads[i].defined()) continue;  // not differentiable
          ASSERT_TRUE(got.grads[i].defined()) << "no gradient for input " << i;
          EXPECT_LE(RelError(got.grads[i], want.grads[i]), 1e-5) << "gradient of input " << i;
        }
        ++checked;
      }
    }
  }
  if (world.rank() == 0)
    std::printf("global ops: %d op/layout cases on %d ranks matched\n", checked, world.size());
}

TEST(GlobalOps, SignaturesMatchProducersAndGradientsKeepTheirSbp) {
  std::vector<int> ranks(comm::World().size());
  for (int i = 0; i < comm::World().size(); ++i) ranks[i] = i;
  Placement line("cpu", ranks);
  Tensor x = randn({8, 6}, line, {S(0)}, 1), w = randn({6, 4}, line, {B()}, 2);
  Tensor x_cols = randn({8, 6}, line, {S(1)}, 3), w_rows = randn({6, 4}, line, {S(0)}, 4);
  EXPECT_EQ(fn::matmul(x, w).nd_sbp(), NdSbp{S(0)});           // data parallel: no boxing
  EXPECT_EQ(fn::matmul(x_cols, w_rows).nd_sbp(), NdSbp{P()});  // row parallel: partial sums
  EXPECT_EQ(fn::matmul(randn({8, 6}, line, {B()}, 5), randn({6, 4}, line, {S(1)}, 6)).nd_sbp(), NdSbp{S(1)});
  // Tensor-parallel heads stay split from the fused projection into q, k, v.
  for (const Tensor& part : fn::split_qkv(randn({2, 6, 4, 24}, line, {S(2)}, 7)))
    EXPECT_EQ(part.nd_sbp(), NdSbp{S(1)});
  EXPECT_EQ(fn::qkv_attention(randn({2, 6, 4, 24}, line, {S(2)}, 7), 0.5, true).nd_sbp(), NdSbp{S(2)});
  // A column-parallel linear keeps its output split on the features; a
  // row-parallel one leaves partial sums with the bias in them once.
  EXPECT_EQ(
      fn::linear(randn({8, 6}, line, {B()}, 5), randn({6, 4}, line, {S(1)}, 6), randn({4}, line, {S(0)}, 8))
          .nd_sbp(),
      NdSbp{S(1)});
  EXPECT_EQ(fn::linear(x_cols, w_rows, randn({4}, line, {B()}, 9).to_global(line, {P()})).nd_sbp(),
            NdSbp{P()});
  // A random-stream counter moves on by the logical element count of the
  // tensor drawn for, whatever its layout; the offset read before stays.
  Tensor counter = ReplicatedScalar(5, x, DType::kInt64);
  const Tensor offset = fn::rng_offset(counter, x);
  fn::rng_advance(counter, x);
  fn::rng_advance(counter, x_cols.to_global(line, {P()}));
  EXPECT_EQ(offset.nd_sbp(), NdSbp{B()});
  EXPECT_EQ(offset.to_local().ToVector<int64_t>(), std::vector<int64_t>{5});
  EXPECT_EQ(counter.to_local().ToVector<int64_t>(), std::vector<int64_t>{5 + 48 + 48});
  // A replicated weight used with split data gets a partial-sum gradient.
  w.set_requires_grad(true);
  x.set_requires_grad(true);
  fn::sum(fn::matmul(x, w), {}).backward();
  EXPECT_EQ(w.grad().nd_sbp(), NdSbp{P()});
  EXPECT_EQ(x.grad().nd_sbp(), NdSbp{S(0)});
}

TEST(GlobalOps, BadInputNamesOpShapesAndLayouts) {
  std::vector<int> ranks(comm::World().size());
  for (int i = 0; i < comm::World().size(); ++i) ranks[i] = i;
  Placement line("cpu", ranks);
  std::string e = testing::ErrorOf([&] {
    fn::matmul(randn({8, 6}, line, {S(0)}, 1), randn({5, 4}, line, {B()}, 2));
  });
  EXPECT_NE(e.find("op 'matmul' on a f32 [8, 6] [S(0)] on cpu:"), std::string::npos) << e;
  EXPECT_NE(e.find("inner sizes differ"), std::string::npos) << e;
  e = testing::ErrorOf([&] { fn::add(randn({8, 6}, line, {S(0)}, 1), randn({8, 6}, 2)); });
  EXPECT_NE(e.find("op 'add' mixes local and global inputs"), std::string::npos) << e;
  e = testing::ErrorOf([&] { fn::add(randn({4, 3}, 1), randn({5}, 2)); });
  EXPECT_NE(e.find("shapes [4, 3] and [5] do not broadcast"), std::string::npos) << e;
  e = testing::ErrorOf([&] { fn::add(randn({4}, 1), Tensor::FromVector<int64_t>({1, 2, 3, 4}, {4})); });
  EXPECT_NE(e.find("dtypes differ"), std::string::npos) << e;
  if (comm::World().size() >= 2) {
    e = testing::ErrorOf([&] {
      fn::add(randn({4}, Placement("cpu", {0}), {B()}, 1), randn({4}, Placement("cpu", {1}), {B()}, 2));
    });
    EXPECT_NE(e.find("inputs are on different placements"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace tessel
