// Helpers shared by tessel's tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "sbp/sbp.h"

namespace tessel::testing {

// The message of the tessel::Error that fn throws, or "" if it throws none.
inline std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every NdSbp of `mesh_ndim` entries over {B, P, S(0) .. S(tensor_ndim-1)}.
inline std::vector<NdSbp> AllNdSbps(int mesh_ndim, int64_t tensor_ndim) {
  std::vector<Sbp> one = {Sbp::Broadcast(), Sbp::PartialSum()};
  for (int d = 0; d < tensor_ndim; ++d) one.push_back(Sbp::Split(d));
  std::vector<NdSbp> out = {NdSbp{}};
  for (int a = 0; a < mesh_ndim; ++a) {
    std::vector<NdSbp> next;
    for (const NdSbp& n : out) {
      for (const Sbp& s : one) {
        std::vector<Sbp> v = n.sbps();
        v.push_back(s);
        next.push_back(NdSbp(v));
      }
    }
    out = std::move(next);
  }
  return out;
}

// Worst |got - want| / (|want| + mean |want|) over f32 tensors: relative to
// each element where it is large, to the tensor's typical size where it is
// tiny. The parity tests require <= 1e-5.
inline double RelError(const Tensor& got, const Tensor& want) {
  // Different shapes (not just element counts) never match.
  if (got.shape() != want.shape()) return INFINITY;
  std::vector<float> a = got.ToVector<float>(), b = want.ToVector<float>();
  double mean = 0, worst = 0;
  size_t finite = 0;
  for (float v : b) {
    if (std::isfinite(v)) mean += std::abs(v), ++finite;
  }
  mean = std::max(mean / static_cast<double>(std::max<size_t>(finite, 1)), 1e-12);
  for (size_t i = 0; i < b.size(); ++i) {
    // NaN must meet NaN and an infinity the same infinity; neither may
    // scale the tolerance of the finite elements.
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    worst = std::max(
        worst, std::abs(static_cast<double>(a[i]) - b[i]) / (std::abs(static_cast<double>(b[i])) + mean));
  }
  return worst;
}

}  // namespace tessel::testing
