#include "kiln/types.h"

#include "core/low_bit.h"

#include <cmath>
#include <limits>

namespace kiln {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kFloat32: case DataType::kInt32: case DataType::kUInt32: return 4;
    case DataType::kUInt8: case DataType::kInt8: case DataType::kBool: return 1;
    case DataType::kFloat8E4M3FN: case DataType::kFloat8E4M3FNUZ: case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ: case DataType::kUInt4: case DataType::kInt4: return 1;
    case DataType::kUInt16: case DataType::kInt16: case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kInt64: case DataType::kFloat64: case DataType::kUInt64: return 8;
    default: return 0;
  }
}

std::string_view dtype_name(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kString: return "string";
    case DataType::kBool: return "bool";
    case DataType::kFloat16: return "float16";
    case DataType::kFloat64: return "float64";
    case DataType::kUInt32: return "uint32";
    case DataType::kUInt64: return "uint64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat8E4M3FN: return "float8e4m3fn";
    case DataType::kFloat8E4M3FNUZ: return "float8e4m3fnuz";
    case DataType::kFloat8E5M2: return "float8e5m2";
    case DataType::kFloat8E5M2FNUZ: return "float8e5m2fnuz";
    case DataType::kUInt4: return "uint4";
    case DataType::kInt4: return "int4";
    default: return "undefined";
  }
}

std::optional<DataType> dtype_from_name(std::string_view n) {
  if (!n.empty() && (n[0] == '<' || n[0] == '|' || n[0] == '=')) n.remove_prefix(1);
  struct Alias { std::string_view name; DataType t; };
  static const Alias kAliases[] = {
      {"float32", DataType::kFloat32}, {"f4", DataType::kFloat32}, {"float", DataType::kFloat32},
      {"float16", DataType::kFloat16}, {"f2", DataType::kFloat16}, {"half", DataType::kFloat16},
      {"float64", DataType::kFloat64}, {"f8", DataType::kFloat64}, {"double", DataType::kFloat64},
      {"bfloat16", DataType::kBFloat16}, {"int8", DataType::kInt8}, {"i1", DataType::kInt8},
      {"uint8", DataType::kUInt8}, {"u1", DataType::kUInt8}, {"int16", DataType::kInt16},
      {"i2", DataType::kInt16}, {"uint16", DataType::kUInt16}, {"u2", DataType::kUInt16},
      {"int32", DataType::kInt32}, {"i4", DataType::kInt32}, {"uint32", DataType::kUInt32},
      {"u4", DataType::kUInt32}, {"int64", DataType::kInt64}, {"i8", DataType::kInt64},
      {"uint64", DataType::kUInt64}, {"u8", DataType::kUInt64}, {"bool", DataType::kBool},
      {"b1", DataType::kBool}, {"float8e4m3fn", DataType::kFloat8E4M3FN},
      {"float8e4m3fnuz", DataType::kFloat8E4M3FNUZ}, {"float8e5m2", DataType::kFloat8E5M2},
      {"float8e5m2fnuz", DataType::kFloat8E5M2FNUZ}, {"uint4", DataType::kUInt4},
      {"int4", DataType::kInt4}};
  for (const auto& a : kAliases)
    if (a.name == n) return a.t;
  return std::nullopt;
}

bool dtype_is_float(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kFloat64 ||
         t == DataType::kBFloat16;
}
bool dtype_is_integer(DataType t) {
  switch (t) {
    case DataType::kUInt8: case DataType::kInt8: case DataType::kUInt16: case DataType::kInt16:
    case DataType::kInt32: case DataType::kInt64: case DataType::kUInt32: case DataType::kUInt64:
      return true;
    default: return false;
  }
}
bool dtype_is_signed(DataType t) {
  return dtype_is_float(t) || t == DataType::kInt8 || t == DataType::kInt16 ||
         t == DataType::kInt32 || t == DataType::kInt64;
}
bool dtype_is_supported(DataType t) { return dtype_size(t) != 0; }

bool dtype_code_is_valid(int64_t code) {
  return code == 0 || code == static_cast<int64_t>(DataType::kString) ||
         (code >= 0 && code <= 22 && dtype_size(static_cast<DataType>(code)) != 0);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) { mant <<= 1; --exp; }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u);
  }
  if (absx >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (absx < 0x38800000u) {  // below smallest normal half (2^-14): subnormal or zero
    // value * 2^24 rounded to nearest even gives the subnormal mantissa.
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // exact (power of two)
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t exp = (absx >> 23) - 127 + 15;
  const uint32_t mant = absx & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // carries into exponent correctly
  return sign | static_cast<uint16_t>(h);
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  const uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

// --- float8 and 4-bit integers --------------------------------------------------------------
bool dtype_is_float8(DataType t) {
  return t == DataType::kFloat8E4M3FN || t == DataType::kFloat8E4M3FNUZ ||
         t == DataType::kFloat8E5M2 || t == DataType::kFloat8E5M2FNUZ;
}
bool dtype_is_low_bit(DataType t) {
  return dtype_is_float8(t) || t == DataType::kUInt4 || t == DataType::kInt4;
}

float low_bit_to_float(DataType t, uint8_t b) { return low_bit::to_float(t, b); }

uint8_t float_to_float8(DataType t, float v, bool saturate) {
  return low_bit::from_float(t, v, saturate);
}

}  // namespace kiln
