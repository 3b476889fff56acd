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
  // Low-bit types, stored one element per byte: float8 as its bit pattern, int4/uint4 as the
  // value in an int8/uint8 (ONNX packs two 4-bit values per byte; the importer unpacks them).
  // Only Cast, CastLike, QuantizeLinear, DequantizeLinear and pure data movement take them
  // (see dtype_is_low_bit and infer_shapes).
  kFloat8E4M3FN = 17,
  kFloat8E4M3FNUZ = 18,
  kFloat8E5M2 = 19,
  kFloat8E5M2FNUZ = 20,
  kUInt4 = 21,
  kInt4 = 22,
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
// float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) and int4/uint4: held one element per byte, read
// through low_bit_to_float, never through visit_dtype.
bool dtype_is_low_bit(DataType t);
bool dtype_is_float8(DataType t);
// The value of one stored low-bit element (NaN/inf per the format).
float low_bit_to_float(DataType t, uint8_t stored);
// float -> float8 bit pattern, round to nearest even. With `saturate`, out-of-range values and
// infinities become the largest finite value of that sign (ONNX Cast's default); without,
// they become infinity (e5m2) or NaN (the others), as ONNX specifies.
uint8_t float_to_float8(DataType t, float v, bool saturate);
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
