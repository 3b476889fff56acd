// Element types (numbered as ONNX's TensorProto.DataType) and half-precision conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class DataType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUInt8 = 2,
  kInt8 = 3,
  kUInt16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,  // recognised so that it can be refused by name; never stored
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUInt32 = 12,
  kUInt64 = 13,
  kBFloat16 = 16,
};

// Bytes per element; 0 for kUndefined / kString.
size_t dtype_size(DataType t);
// Lower-case short name used in messages and text dumps: "float32", "int64", ...
std::string_view dtype_name(DataType t);
// Parses dtype_name() output and numpy-style names ("float32", "f4", "<f4", ...).
std::optional<DataType> dtype_from_name(std::string_view name);
bool dtype_is_float(DataType t);    // float16/bfloat16/float32/float64
bool dtype_is_integer(DataType t);  // signed or unsigned integers (not bool)
bool dtype_is_signed(DataType t);
// True for the storage types kiln can hold in a Tensor.
bool dtype_is_supported(DataType t);
// True when `code` is one of the DataType enumerators (undefined and string included).
bool dtype_code_is_valid(int64_t code);

// IEEE binary16 and bfloat16 <-> float, round to nearest even.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
inline float bfloat16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bfloat16(float f);

// Strong 16-bit float types so templates can dispatch on them.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(float_to_half(f)) {}
  operator float() const { return half_to_float(bits); }  // NOLINT(implicit)
};
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bfloat16(f)) {}
  operator float() const { return bfloat16_to_float(bits); }  // NOLINT(implicit)
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DataType value = DataType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DataType value = DataType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DataType value = DataType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DataType value = DataType::kBFloat16; };
template <> struct DTypeOf<int8_t> { static constexpr DataType value = DataType::kInt8; };
template <> struct DTypeOf<uint8_t> { static constexpr DataType value = DataType::kUInt8; };
template <> struct DTypeOf<int16_t> { static constexpr DataType value = DataType::kInt16; };
template <> struct DTypeOf<uint16_t> { static constexpr DataType value = DataType::kUInt16; };
template <> struct DTypeOf<int32_t> { static constexpr DataType value = DataType::kInt32; };
template <> struct DTypeOf<uint32_t> { static constexpr DataType value = DataType::kUInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DataType value = DataType::kInt64; };
template <> struct DTypeOf<uint64_t> { static constexpr DataType value = DataType::kUInt64; };
template <> struct DTypeOf<bool> { static constexpr DataType value = DataType::kBool; };

}  // namespace kiln
