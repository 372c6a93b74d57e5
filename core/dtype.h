// Element types of tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "core/half.h"

namespace tessel {

enum class DType : int8_t { kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kBool };

inline constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                       DType::kInt32,   DType::kInt64,   DType::kBool};

size_t ElementSize(DType dtype);
// "f32", "f16", "bf16", "i32", "i64", "bool" (PyTorch spellings also parse).
std::string_view DTypeName(DType dtype);
DType ParseDType(std::string_view text);  // throws, naming the text, if unknown
bool IsFloating(DType dtype);
std::ostream& operator<<(std::ostream& os, DType dtype);

// Compile-time map from C++ type to DType.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

// Calls fn(T{}) with T the C++ type of `dtype`.
template <typename Fn>
decltype(auto) VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(Float16{});
    case DType::kBFloat16:
      return fn(BFloat16{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kBool:
      return fn(bool{});
  }
  return fn(float{});
}

}  // namespace tessel
