// Type dispatch helpers shared by tensor code and CPU kernels.
#pragma once

#include <limits>
#include <type_traits>

#include "kiln/types.h"

namespace kiln {

// Calls f(T{}) with T the C++ type of `t` (Half/BFloat16 for the 16-bit floats).
template <typename F>
auto visit_dtype(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32: return f(float{});
    case DataType::kFloat64: return f(double{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kBFloat16: return f(BFloat16{});
    case DataType::kInt8: return f(int8_t{});
    case DataType::kUInt8: return f(uint8_t{});
    case DataType::kInt16: return f(int16_t{});
    case DataType::kUInt16: return f(uint16_t{});
    case DataType::kInt32: return f(int32_t{});
    case DataType::kUInt32: return f(uint32_t{});
    case DataType::kInt64: return f(int64_t{});
    case DataType::kUInt64: return f(uint64_t{});
    case DataType::kBool: return f(bool{});
    default: return f(float{});
  }
}

template <typename T>
inline double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(to_double(v)));
  } else if constexpr (std::is_same_v<To, bool>) {
    return to_double(v) != 0.0;
  } else if constexpr (std::is_integral_v<To> && !std::is_integral_v<From>) {
    // float -> integer without undefined behaviour: NaN gives 0, out of range saturates.
    const double d = to_double(v);
    if (d != d) return To{0};
    if (d <= static_cast<double>(std::numeric_limits<To>::lowest())) return std::numeric_limits<To>::lowest();
    if (d >= static_cast<double>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace kiln
