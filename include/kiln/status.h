// Errors are values: library code returns Status or Expected<T>; the CLI prints the message.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace kiln {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }
  template <typename... Args>
  static Status Errorf(fmt::format_string<Args...> f, Args&&... args) {
    return Status(fmt::format(f, std::forward<Args>(args)...));
  }

  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }
  // Returns a copy with `prefix` prepended (for adding context such as a node name).
  Status with_context(const std::string& prefix) const {
    if (ok()) return *this;
    return Status(prefix + ": " + *message_);
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}  // NOLINT(implicit)
  Expected(Status status) : v_(std::move(status)) {}  // NOLINT(implicit); must be an error

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)

// Returns early with the error of a Status-returning expression.
#define KILN_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::kiln::Status _kiln_st = (expr);               \
    if (!_kiln_st.ok()) return _kiln_st;            \
  } while (0)

// `KILN_ASSIGN_OR_RETURN(auto x, f());` unwraps an Expected<T> or returns its error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_ex_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// Error helper: `return KILN_ERROR("bad axis {} for rank {}", a, r);`
#define KILN_ERROR(...) ::kiln::Status::Errorf(__VA_ARGS__)
