// Errors as values for the scheduling core: Status and Result<T>.
//
// Library code never exits or throws for bad input; it returns a Status that names what was wrong
// (for scenarios: the JSON path and the offending value). Only main() turns a Status into an exit code:
// kInvalidInput -> 2, kInternal / kUnimplemented -> 1.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace hzp {

enum class StatusCode { kOk, kInvalidInput, kUnimplemented, kInternal };

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidInput(std::string msg) { return Status(StatusCode::kInvalidInput, std::move(msg)); }
  static Status Unimplemented(std::string msg) { return Status(StatusCode::kUnimplemented, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The same error with `prefix` before its message ("--scenario: "), to say which input it is about.
  Status prefixed(std::string_view prefix) const { return Status(code_, std::string(prefix) + message_); }

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace hzp

// Propagate a failed Status / Result from the current function.
#define HZP_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::hzp::Status hzp_status_ = (expr);        \
    if (!hzp_status_.ok()) return hzp_status_; \
  } while (0)

#define HZP_CONCAT_INNER_(a, b) a##b
#define HZP_CONCAT_(a, b) HZP_CONCAT_INNER_(a, b)
#define HZP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
#define HZP_ASSIGN_OR_RETURN(lhs, expr) HZP_ASSIGN_OR_RETURN_IMPL_(HZP_CONCAT_(hzp_result_, __LINE__), lhs, expr)
