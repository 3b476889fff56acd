// What `kiln serve`'s front ends and core share: a decoded inference request, its errors (an
// HTTP status and a one-line message: front ends map the status to their protocol's code), and
// the Open Inference Protocol's datatypes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/tensor.h"
#include "kiln/types.h"

namespace kiln::serve {

// A request the server cannot honour. `status` is the HTTP status (400 bad request, 404 unknown
// model or region, 409 a region registered twice, 413 body too large, 429 queue full, 503 not
// ready or draining); gRPC front ends map it (grpc_code()).
struct ApiError {
  int status = 400;
  std::string message;
  ApiError() = default;
  // The message is kept to one line: a control character (a newline in a name the client
  // sent, say) is written as an escape, \n or \xNN.
  ApiError(int s, std::string m) : status(s), message(one_line(std::move(m))) {}
  static std::string one_line(std::string m);
};

template <typename... Args>
ApiError api_error(int status, fmt::format_string<Args...> f, Args&&... args) {
  return ApiError{status, fmt::format(f, std::forward<Args>(args)...)};
}

// A value or an ApiError (kiln's Expected<T>, with a status).
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(implicit)
  Result(ApiError error) : v_(std::move(error)) {}  // NOLINT(implicit)
  bool ok() const { return std::holds_alternative<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  const ApiError& error() const { return std::get<ApiError>(v_); }

 private:
  std::variant<T, ApiError> v_;
};

// Nothing, or an ApiError.
using Check = std::optional<ApiError>;

#define KILN_SERVE_CHECK(expr)        \
  do {                                \
    ::kiln::serve::Check _c = (expr); \
    if (_c) return std::move(*_c);    \
  } while (0)

// The v2 datatype of a kiln element type ("FP32"), "" where the protocol has none.
std::string_view v2_datatype(DataType t);
// The element type of a v2 datatype kiln takes in requests (not BYTES, BF16); nullopt otherwise.
std::optional<DataType> dtype_of_v2(std::string_view datatype);

// Where a tensor lies in a registered shared memory region (Triton's extension parameters).
struct ShmRef {
  std::string region;
  uint64_t byte_size = 0;
  uint64_t offset = 0;
};

// One input as the front end decoded it: bytes in the request body, decoded values or a shared
// memory mapping, kept alive by `owner`.
struct InputTensor {
  std::string name;
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<const void> owner;
};

// An output the request asks for; `binary` is REST's per-output binary_data parameter.
struct OutputRequest {
  std::string name;
  std::optional<bool> binary;
  std::optional<ShmRef> shm;
};

struct InferRequest {
  std::string model, version, id;
  std::vector<InputTensor> inputs;
  std::vector<OutputRequest> outputs;  // empty: every output of the model
  bool binary_outputs = false;         // REST: parameters.binary_data_output
  // Triton's request parameters "priority" (1 is the highest level; 0 the model's default) and
  // "timeout" (microseconds, 0 none: a request still queued when it has passed is answered 408),
  // and
  // the gRPC client's own deadline, whichever is sooner.
  uint64_t priority = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // True once the client has gone (its connection closed, its call cancelled): the request is
  // then dropped from the queue instead of run. Empty: the front end cannot tell.
  std::function<bool()> cancelled;
};

// The whole numbers of a comma-separated list such as "1,2,4" (empty items skipped; each at
// most 9 digits, so it fits an int); nullopt when an item is not one.
std::optional<std::vector<int>> parse_int_list(const std::string& text);

// Sets `req`'s priority and deadline from the request parameters "priority" and "timeout"
// (whole numbers >= 0; nullopt when absent); 400 naming the parameter otherwise.
Check set_scheduling(InferRequest& req, std::optional<int64_t> priority,
                     std::optional<int64_t> timeout_us);

// The outputs of one request, in the model's output order (views of the batch's outputs).
using Outputs = std::vector<Tensor>;

// "[1, 3, 32, 32]", as the messages print shapes (Python's list form, which the tests match).
std::string shape_text(const std::vector<int64_t>& shape);

// Element count of a shape whose sizes are >= 0; an ApiError when its bytes would pass int64
// (even a shape of zero elements: its other sizes times the element size must fit).
Result<int64_t> element_count(const std::string& what, const std::vector<int64_t>& shape,
                              size_t itemsize);

// The gRPC status code (grpc::StatusCode's number) of an HTTP status (408: DEADLINE_EXCEEDED,
// 499, a client that went away: CANCELLED).
int grpc_code(int http_status);

}  // namespace kiln::serve
