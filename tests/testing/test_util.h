// Helpers shared by tessel's tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
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
  std::vector<Sbp> one = {B(), P()};
  for (int d = 0; d < tensor_ndim; ++d) one.push_back(S(d));
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

}  // namespace tessel::testing
