// Errors and status values.
//
// tessel reports bad input by throwing tessel::Error with a message that names
// the offending value and what was expected. TESSEL_CHECK builds such messages
// with stream syntax so call sites stay short:
//
//   TESSEL_CHECK(rank < world, "RANK") << "RANK=" << rank << " but WORLD_SIZE="
//                                      << world << "; expected 0 <= RANK < WORLD_SIZE";
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace tessel {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kOutOfRange,
  kNotFound,
  kAlreadyExists,
  kUnavailable,
  kTimeout,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

// A result without a value: kOk or a code with a message.
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// The exception every tessel API throws for bad input or failed work.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  StatusCode code() const { return code_; }
  Status status() const { return {code_, what()}; }

 private:
  StatusCode code_;
};

// Throws `status` as an Error unless it is ok.
void ThrowIfError(const Status& status);

namespace detail {
// Collects a message with operator<< and throws when it goes out of scope.
class ErrorBuilder {
 public:
  ErrorBuilder(StatusCode code, const char* file, int line) : code_(code), file_(file), line_(line) {}
  ErrorBuilder(const ErrorBuilder&) = delete;
  ErrorBuilder& operator=(const ErrorBuilder&) = delete;
  [[noreturn]] ~ErrorBuilder() noexcept(false);

  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  StatusCode code_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};
}  // namespace detail

}  // namespace tessel

// Throws tessel::Error(code, message) where the message is streamed after it.
#define TESSEL_THROW(code) ::tessel::detail::ErrorBuilder(code, __FILE__, __LINE__)

// Throws kInvalidArgument unless `cond` holds.
#define TESSEL_CHECK(cond) \
  if (cond) {              \
  } else                   \
    TESSEL_THROW(::tessel::StatusCode::kInvalidArgument)

#define TESSEL_CHECK_CODE(cond, code) \
  if (cond) {                         \
  } else                              \
    TESSEL_THROW(code)
