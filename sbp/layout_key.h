// Binary cache keys for layouts, for the dispatch caches (signatures, boxing
// plans): no number formatting and O(1) per placement (its interned id).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "sbp/placement.h"
#include "sbp/sbp.h"

namespace tessel {

template <typename T>
void AppendKeyBytes(std::string* key, const T& v) {
  key->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

inline void AppendKey(std::string* key, const Placement& placement) { AppendKeyBytes(key, placement.id()); }

inline void AppendKey(std::string* key, const NdSbp& nd_sbp) {
  AppendKeyBytes(key, static_cast<uint8_t>(nd_sbp.sbps().size()));
  for (const Sbp& sbp : nd_sbp.sbps()) {
    AppendKeyBytes(key, sbp.type());
    AppendKeyBytes(key, static_cast<int8_t>(sbp.axis()));
  }
}

inline void AppendKey(std::string* key, const Shape& shape) {
  AppendKeyBytes(key, static_cast<uint8_t>(shape.ndim()));
  key->append(reinterpret_cast<const char*>(shape.dims().data()), shape.dims().size() * sizeof(int64_t));
}

inline void AppendKey(std::string* key, DType dtype) { AppendKeyBytes(key, dtype); }

}  // namespace tessel
