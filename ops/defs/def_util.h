// Helpers shared by op definitions: common inference and SBP patterns.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"
#include "ops/op_def.h"

namespace tessel::defs {

// OpDef::grad_unsupported of the ops that compute another op's gradient.
inline constexpr const char* kGradientOp =
    "it computes another op's gradient, and tessel has no double backward";

inline std::vector<TensorSpec> SameAsInput(const std::vector<TensorSpec>& in, const Attrs&) {
  return {in[0]};
}

// Elementwise unary: split on any dimension stays split there.
inline std::vector<SbpSignature> SplitAnyDim(const std::vector<TensorSpec>& in, const Attrs&) {
  std::vector<SbpSignature> out;
  for (int d = 0; d < in[0].shape.ndim(); ++d) out.push_back({{Sbp::Split(d)}, {Sbp::Split(d)}});
  return out;
}

// As SplitAnyDim, plus P -> P for ops linear in their input.
inline std::vector<SbpSignature> SplitAnyDimOrPartial(const std::vector<TensorSpec>& in, const Attrs& a) {
  std::vector<SbpSignature> out = SplitAnyDim(in, a);
  out.push_back({{Sbp::PartialSum()}, {Sbp::PartialSum()}});
  return out;
}

// Several same-shaped inputs, split alike on any dimension but `except`
// (-1: none), each output split alike.
inline std::vector<SbpSignature> AllSplitAlike(int64_t ndim, size_t inputs, size_t outputs, int64_t except) {
  std::vector<SbpSignature> out;
  for (int d = 0; d < ndim; ++d) {
    if (d == except) continue;
    out.push_back({std::vector<Sbp>(inputs, Sbp::Split(d)), std::vector<Sbp>(outputs, Sbp::Split(d))});
  }
  return out;
}

// Splits on each dimension of the broadcast result `out`: an operand that
// has the dimension (not broadcast) is split there too, one that broadcasts
// it stays B.
inline std::vector<SbpSignature> BroadcastSplits(const std::vector<TensorSpec>& in, const Shape& out) {
  std::vector<SbpSignature> sigs;
  for (int64_t d = 0; d < out.ndim(); ++d) {
    SbpSignature s{{}, {Sbp::Split(static_cast<int>(d))}};
    for (const TensorSpec& t : in) {
      int64_t td = d - (out.ndim() - t.shape.ndim());
      bool has = td >= 0 && t.shape.dims()[td] == out.dims()[d];
      s.inputs.push_back(has ? Sbp::Split(static_cast<int>(td)) : Sbp::Broadcast());
    }
    sigs.push_back(s);
  }
  return sigs;
}

// f32, or f16/bf16 (which only the CUDA kernels compute in).
inline void CheckFloat(const std::string& op, const TensorSpec& t, const char* what) {
  TESSEL_CHECK(IsFloating(t.dtype)) << op << ": " << what << " must be floating (f32, bf16 or f16), got "
                                    << t.dtype << " " << t.shape;
}

}  // namespace tessel::defs
