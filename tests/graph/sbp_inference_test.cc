// SBP signature inference on specs (shape, dtype, placement, NdSbp; no
// data), as compiler passes call it: Megatron's column- and row-parallel
// layouts come out of matmul, producers' layouts are kept when they fit,
// 2-D meshes combine per-axis signatures, and results are cached.
#include "graph/sbp_inference.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "ops/op_def.h"
#include "sbp/global_tensor.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"
#include "tests/testing/test_util.h"

using namespace tessel::sbp_shorthand;  // S(d), B(), P()

namespace tessel {
namespace {

const Attrs kMatmul{{"transpose_a", false}, {"transpose_b", false}};

GlobalTensorSpec Spec(Shape shape, Placement placement, std::vector<Sbp> sbps,
                      DType dtype = DType::kFloat32) {
  return {std::move(shape), dtype, std::move(placement), NdSbp(std::move(sbps))};
}

TEST(SbpInferenceOnSpecs, DataParallelMatmulKeepsTheBatchSplit) {
  const Placement two("cpu", {0, 1});
  const auto sig = InferNdSignature(GetOpDef("matmul"), kMatmul,
                                    {Spec(Shape({8, 4}), two, {S(0)}), Spec(Shape({4, 6}), two, {B()})}, two);
  EXPECT_EQ(sig->inputs[0], NdSbp({S(0)}));
  EXPECT_EQ(sig->inputs[1], NdSbp({B()}));
  EXPECT_EQ(sig->outputs[0], NdSbp({S(0)}));
  EXPECT_EQ(sig->boxing_seconds, 0);
}

TEST(SbpInferenceOnSpecs, ColumnThenRowParallelMatmul) {
  const Placement two("cpu", {0, 1});
  // Column parallel: replicated activations times a column-split weight.
  const auto column = InferNdSignature(
      GetOpDef("matmul"), kMatmul, {Spec(Shape({8, 4}), two, {B()}), Spec(Shape({4, 6}), two, {S(1)})}, two);
  EXPECT_EQ(column->outputs[0], NdSbp({S(1)})) << column->ToString();
  EXPECT_EQ(column->boxing_seconds, 0);
  // Row parallel: the column-split activations times a row-split weight
  // give a partial sum, with nothing converted.
  const auto row = InferNdSignature(
      GetOpDef("matmul"), kMatmul, {Spec(Shape({8, 6}), two, {S(1)}), Spec(Shape({6, 4}), two, {S(0)})}, two);
  EXPECT_EQ(row->inputs[0], NdSbp({S(1)}));
  EXPECT_EQ(row->inputs[1], NdSbp({S(0)}));
  EXPECT_EQ(row->outputs[0], NdSbp({P()})) << row->ToString();
}

TEST(SbpInferenceOnSpecs, TwoDimensionalMeshCombinesPerAxisSignatures) {
  const Placement mesh("cpu", {{0, 1}, {2, 3}});
  // dp on axis 0, tp (column parallel) on axis 1.
  const auto sig = InferNdSignature(
      GetOpDef("matmul"), kMatmul,
      {Spec(Shape({8, 4}), mesh, {S(0), B()}), Spec(Shape({4, 6}), mesh, {B(), S(1)})}, mesh);
  EXPECT_EQ(sig->inputs[0], NdSbp({S(0), B()}));
  EXPECT_EQ(sig->inputs[1], NdSbp({B(), S(1)}));
  EXPECT_EQ(sig->outputs[0], NdSbp({S(0), S(1)})) << sig->ToString();
}

TEST(SbpInferenceOnSpecs, MismatchedInputsAreConverted) {
  const Placement two("cpu", {0, 1});
  const auto sig = InferNdSignature(
      GetOpDef("add"), {}, {Spec(Shape({8, 6}), two, {S(0)}), Spec(Shape({8, 6}), two, {S(1)})}, two);
  // Element-wise: both inputs end in one layout, so at least one moved.
  // (Today the cheapest is P + P -> P: a split becomes a partial sum for
  // free, and the reduction is left to the consumer.)
  EXPECT_EQ(sig->inputs[0], sig->inputs[1]) << sig->ToString();
  EXPECT_EQ(sig->outputs[0], sig->inputs[0]);
  EXPECT_TRUE(sig->inputs[0] != NdSbp({S(0)}) || sig->inputs[1] != NdSbp({S(1)}));
}

TEST(SbpInferenceOnSpecs, InPlaceInputsKeepTheirLayouts) {
  const Placement two("cpu", {0, 1});
  // adamw_update writes param, exp_avg and exp_avg_sq: the split gradient
  // is brought to the replicated parameter's layout, never the reverse.
  const auto sig = InferNdSignature(
      GetOpDef("adamw_update"), {},
      {Spec(Shape({8, 6}), two, {B()}), Spec(Shape({8, 6}), two, {S(0)}), Spec(Shape({8, 6}), two, {B()}),
       Spec(Shape({8, 6}), two, {B()}), Spec(Shape(std::vector<int64_t>{}), two, {B()}, DType::kInt64),
       Spec(Shape(std::vector<int64_t>{}), two, {B()})},
      two);
  for (const NdSbp& in : sig->inputs) EXPECT_EQ(in, NdSbp({B()})) << sig->ToString();
  // States in another layout than the parameter: no signature keeps all
  // three, and the error says why.
  try {
    InferNdSignature(
        GetOpDef("adamw_update"), {},
        {Spec(Shape({8, 6}), two, {B()}), Spec(Shape({8, 6}), two, {B()}), Spec(Shape({8, 6}), two, {S(0)}),
         Spec(Shape({8, 6}), two, {B()}), Spec(Shape(std::vector<int64_t>{}), two, {B()}, DType::kInt64),
         Spec(Shape(std::vector<int64_t>{}), two, {B()})},
        two);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'adamw_update' has no SBP signature"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("exp_avg [8, 6] [S(0)]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in place keep their layouts"), std::string::npos) << e.what();
  }
}

TEST(SbpInferenceOnSpecs, ReplicatedInputsGiveReplicatedOutputs) {
  const Placement two("cpu", {0, 1});
  const auto sig = InferNdSignature(GetOpDef("add"), {},
                                    {Spec(Shape({8, 6}), two, {B()}), Spec(Shape({8, 6}), two, {B()})}, two);
  EXPECT_EQ(sig->outputs[0], NdSbp({B()}));
}

TEST(SbpInferenceOnSpecs, RepeatedQueriesHitTheCache) {
  const Placement two("cpu", {0, 1});
  const std::vector<GlobalTensorSpec> in = {Spec(Shape({16, 4}), two, {S(0)}),
                                            Spec(Shape({4, 2}), two, {B()})};
  const auto first = InferNdSignature(GetOpDef("matmul"), kMatmul, in, two);
  const size_t entries = SignatureCacheSize();
  const auto again = InferNdSignature(GetOpDef("matmul"), kMatmul, in, two);
  EXPECT_EQ(first.get(), again.get());
  EXPECT_EQ(SignatureCacheSize(), entries);
  // Another shape is another entry.
  InferNdSignature(GetOpDef("matmul"), kMatmul, {Spec(Shape({32, 4}), two, {S(0)}), in[1]}, two);
  EXPECT_EQ(SignatureCacheSize(), entries + 1);
}

// A lazy global tensor carries exactly what inference needs: its spec is
// read off the handle, and an eager global tensor of the same layout gives
// the same spec.
TEST(SbpInferenceOnSpecs, LazyGlobalTensorsGiveTheirSpecs) {
  const Placement one("cpu", std::vector<int>{0});
  Tensor lazy = MakeLazyGlobal(Shape({8, 4}), DType::kFloat32, one, {S(0)});
  EXPECT_TRUE(lazy.is_lazy());
  EXPECT_TRUE(lazy.is_global());
  EXPECT_EQ(lazy.kind(), TensorKind::kLazy);
  EXPECT_EQ(lazy.placement(), one);
  EXPECT_EQ(lazy.nd_sbp(), NdSbp({S(0)}));
  EXPECT_EQ(lazy.ToString(), "Tensor(f32, [8, 4], cpu, global, lazy)");
  EXPECT_NE(testing::ErrorOf([&] { lazy.to_local(); }).find("to_local() of a lazy tensor"),
            std::string::npos);
  Tensor eager = MakeGlobal(zeros({8, 4}), Shape({8, 4}), one, {S(0)});
  EXPECT_EQ(eager.kind(), TensorKind::kGlobal);
  const GlobalTensorSpec a = GlobalTensorSpec::Of(lazy), b = GlobalTensorSpec::Of(eager);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.placement, b.placement);
  EXPECT_EQ(a.nd_sbp, b.nd_sbp);
  const auto sig = InferNdSignature(GetOpDef("relu"), Attrs{}, {a}, one);
  EXPECT_EQ(sig->outputs[0], NdSbp({S(0)}));
  // The layout is checked as for eager tensors.
  EXPECT_NE(testing::ErrorOf([&] { MakeLazyGlobal(Shape({8}), DType::kFloat32, one, {S(1)}); }), "");
}

}  // namespace
}  // namespace tessel
