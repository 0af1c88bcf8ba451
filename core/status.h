// Status and Result<T>: how every library function reports failure.
// Library code never prints and never exits; it returns one of these.
#ifndef TESSERA_CORE_STATUS_H_
#define TESSERA_CORE_STATUS_H_

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong (bad strategy, bad shape)
  kNotFound,         // a file, tensor or rank that should exist does not
  kAlreadyExists,
  kOutOfRange,
  kDataLoss,  // checksum mismatch, truncated or corrupt file
  kFailedPrecondition,
  kUnimplemented,
  kIOError,            // the operating system refused
  kResourceExhausted,  // out of memory for a size a file asked for
  kDeadlineExceeded,   // a collective or wait did not complete in time
  kAborted,            // a peer left (died or failed) and took the group down
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  // The message is kept as PrintableText (core/utf8.h): bytes taken from a
  // damaged file never reach a terminal raw.
  Status(StatusCode code, std::string message);

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "InvalidArgument: tensor 'w': ..." (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "<context>: <message>", so errors name
  // the object at fault as they propagate up (file, tensor, rank).
  Status Annotate(std::string_view context) const;

  bool operator==(const Status& other) const {
    return code_ == other.code_ && message_ == other.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status OutOfRangeError(std::string message);
Status DataLossError(std::string message);
Status FailedPreconditionError(std::string message);
Status UnimplementedError(std::string message);
Status IOError(std::string message);
Status ResourceExhaustedError(std::string message);
Status DeadlineExceededError(std::string message);
Status AbortedError(std::string message);
Status InternalError(std::string message);

// Result<T>: a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "Result constructed from an OK status");
    if (status_.ok()) status_ = InternalError("Result built from OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::tessera::Status tessera_status_ = (expr);        \
    if (!tessera_status_.ok()) return tessera_status_; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, F()) : evaluates F() (a Result), returns its
// status on failure, else moves the value into `lhs`.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(tessera_result_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // TESSERA_CORE_STATUS_H_
