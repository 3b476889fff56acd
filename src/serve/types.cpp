#include "serve/types.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

namespace kiln::serve {
namespace {

struct V2Name {
  DataType dtype;
  std::string_view name;
};
constexpr V2Name kV2Names[] = {
    {DataType::kBool, "BOOL"},     {DataType::kUInt8, "UINT8"},   {DataType::kUInt16, "UINT16"},
    {DataType::kUInt32, "UINT32"}, {DataType::kUInt64, "UINT64"}, {DataType::kInt8, "INT8"},
    {DataType::kInt16, "INT16"},   {DataType::kInt32, "INT32"},   {DataType::kInt64, "INT64"},
    {DataType::kFloat16, "FP16"},  {DataType::kFloat32, "FP32"},  {DataType::kFloat64, "FP64"},
    {DataType::kBFloat16, "BF16"},
};

}  // namespace

std::string_view v2_datatype(DataType t) {
  for (const V2Name& n : kV2Names)
    if (n.dtype == t) return n.name;
  return "";
}

std::optional<DataType> dtype_of_v2(std::string_view datatype) {
  // BF16 has a v2 name but no host type a client could send that kiln checks against; BYTES
  // (strings) no kiln engine takes.
  for (const V2Name& n : kV2Names)
    if (n.name == datatype && n.dtype != DataType::kBFloat16) return n.dtype;
  return std::nullopt;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

Result<int64_t> element_count(const std::string& what, const std::vector<int64_t>& shape,
                              size_t itemsize) {
  // The nonzero sizes times the element size must stay within int64, as NumPy requires of an
  // array (the Python server refused such a shape before; the messages stay the same).
  constexpr auto kMax = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  unsigned __int128 count = 1, nonzero = itemsize;
  for (int64_t d : shape) {
    count *= static_cast<unsigned __int128>(d);
    nonzero *= static_cast<unsigned __int128>(d > 0 ? d : 1);
    if (nonzero > kMax || count > kMax)
      return api_error(400, "{}: shape {} is too large", what, shape_text(shape));
  }
  return static_cast<int64_t>(count);
}

std::optional<std::vector<int>> parse_int_list(const std::string& text) {
  std::vector<int> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || item.size() > 9) return std::nullopt;
    out.push_back(static_cast<int>(v));
  }
  return out;
}

std::string ApiError::one_line(std::string m) {
  if (std::none_of(m.begin(), m.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
    return m;
  std::string out;
  for (const unsigned char c : m) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

Check set_scheduling(InferRequest& req, std::optional<int64_t> priority,
                     std::optional<int64_t> timeout_us) {
  if (priority) {
    if (*priority < 0)
      return api_error(400, "parameter 'priority' must be a whole number >= 0, not {}", *priority);
    req.priority = static_cast<uint64_t>(*priority);
  }
  if (timeout_us) {
    if (*timeout_us < 0)
      return api_error(400, "parameter 'timeout' must be microseconds >= 0, not {}", *timeout_us);
    // 0 is no timeout (Triton's default); past a year is none either (and keeps the sum within
    // the clock's range).
    if (*timeout_us > 0 && *timeout_us < int64_t{365} * 24 * 3600 * 1000000)
      req.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(*timeout_us);
  }
  return std::nullopt;
}

int grpc_code(int http_status) {
  switch (http_status) {
    case 400:
      return 3;  // INVALID_ARGUMENT
    case 404:
      return 5;  // NOT_FOUND
    case 408:
      return 4;  // DEADLINE_EXCEEDED
    case 409:
      return 6;  // ALREADY_EXISTS
    case 413:
      return 8;  // RESOURCE_EXHAUSTED (a message over the limit)
    case 429:
      return 8;  // RESOURCE_EXHAUSTED (the queue is full)
    case 499:
      return 1;  // CANCELLED (nginx's "client closed request")
    case 501:
      return 12;  // UNIMPLEMENTED
    case 503:
      return 14;  // UNAVAILABLE
    default:
      return http_status < 500 ? 3 : 13;  // INVALID_ARGUMENT / INTERNAL
  }
}

}  // namespace kiln::serve
