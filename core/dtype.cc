#include "core/dtype.h"

#include "core/error.h"

namespace tessel {

size_t ElementSize(DType dtype) {
  return VisitDType(dtype, [](auto v) { return sizeof(v); });
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "f32";
    case DType::kFloat16:
      return "f16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kInt32:
      return "i32";
    case DType::kInt64:
      return "i64";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

DType ParseDType(std::string_view text) {
  for (DType d : kAllDTypes) {
    if (text == DTypeName(d)) return d;
  }
  if (text == "float32" || text == "float") return DType::kFloat32;
  if (text == "float16" || text == "half") return DType::kFloat16;
  if (text == "bfloat16") return DType::kBFloat16;
  if (text == "int32" || text == "int") return DType::kInt32;
  if (text == "int64" || text == "long") return DType::kInt64;
  TESSEL_THROW(StatusCode::kInvalidArgument)
      << "unknown dtype '" << text << "'; expected one of f32, f16, bf16, i32, i64, bool";
}

bool IsFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << DTypeName(dtype); }

}  // namespace tessel
