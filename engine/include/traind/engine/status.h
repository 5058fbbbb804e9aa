// Status and Result<T>: how every traind component reports success or failure.
// A small fixed set of codes (mapped to gRPC codes in one place in server/, and from RocksDB's in
// one place in server/ and offload/). Messages are one sentence a person can act on: what, where,
// the bad value and the limit, and what to do next.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace traind {

// Both types are [[nodiscard]]: a dropped Status is a dropped error. The build makes the warning an
// error (-Werror=unused-result in the top CMakeLists.txt); where ignoring a result is right, the call
// site says why and casts it to void.
class [[nodiscard]] Status {
 public:
  enum class Code : int {
    kOk = 0,
    kInvalidArgument,     // the caller's input is wrong (spec field, file contents)
    kNotFound,            // a named file, job or tensor does not exist
    kFailedPrecondition,  // the input is valid but cannot run here (too big for the budget, no GPU)
    kResourceExhausted,   // out of memory or disk
    kDataLoss,            // stored data is corrupt or truncated
    kCancelled,           // the operation was cancelled on request
    kUnimplemented,       // a feature that has not been built yet
    kUnauthenticated,     // missing or wrong credentials
    kPermissionDenied,    // authenticated but not allowed
    kUnavailable,         // a dependency (daemon, device) cannot be reached
    kInternal,            // a bug: an invariant did not hold
    kAborted,             // stopped early on request (preemption) and resumable from its checkpoint
  };

  Status() = default;  // OK
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
  static Status DataLoss(std::string m) { return {Code::kDataLoss, std::move(m)}; }
  static Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {Code::kUnimplemented, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
  static Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: training.lerning_rate: unknown field"
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// The stable upper-case name of a code ("INVALID_ARGUMENT").
const char* StatusCodeName(Status::Code code);

// A value or the Status that explains why there is none. Never holds an OK status without a value.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace traind

// Propagate a non-OK Status from an expression that yields a Status.
#define TRAIND_RETURN_IF_ERROR(expr)            \
  do {                                          \
    ::traind::Status _traind_st = (expr);       \
    if (!_traind_st.ok()) return _traind_st;    \
  } while (0)

#define TRAIND_CONCAT_INNER_(a, b) a##b
#define TRAIND_CONCAT_(a, b) TRAIND_CONCAT_INNER_(a, b)
// `TRAIND_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result or returns its Status.
#define TRAIND_ASSIGN_OR_RETURN(lhs, expr) \
  TRAIND_ASSIGN_OR_RETURN_IMPL_(TRAIND_CONCAT_(_traind_res_, __LINE__), lhs, expr)
#define TRAIND_ASSIGN_OR_RETURN_IMPL_(res, lhs, expr) \
  auto res = (expr);                                  \
  if (!res.ok()) return res.status();                 \
  lhs = std::move(res).value()
