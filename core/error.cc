#include "core/error.h"

#include <cstring>

namespace tessel {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kTimeout:
      return "TIMEOUT";
    case StatusCode::kInternal:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

void ThrowIfError(const Status& status) {
  if (!status.ok()) throw Error(status.code(), status.message());
}

namespace detail {
ErrorBuilder::~ErrorBuilder() noexcept(false) {
  // The location helps developers; the message itself is for users.
  const char* base = std::strrchr(file_, '/');
  stream_ << " [" << (base ? base + 1 : file_) << ":" << line_ << "]";
  throw Error(code_, stream_.str());
}
}  // namespace detail

}  // namespace tessel
