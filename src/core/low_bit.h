// float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) and int4/uint4 element conversions, written once
// for the CPU reference (core/types.cpp) and the CUDA kernels (backends/cuda/layers/*.cu):
// every function is __host__ __device__ under nvcc, so both sides give the same bits.
// Storage: one element per byte (float8 as its bit pattern, int4 sign-extended in an int8,
// uint4 in a uint8), as kiln's Tensor keeps them.
#pragma once

#include <cstdint>
#include <cstring>

#include "kiln/types.h"

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln::low_bit {

struct Float8Format {
  int mant_bits, bias;
  bool fnuz;     // no infinity, no negative zero, NaN = 0x80
  bool has_inf;  // e5m2: IEEE-like infinities and NaNs in the top exponent
};

KILN_HD inline Float8Format float8_format(DataType t) {
  switch (t) {
    case DataType::kFloat8E4M3FN: return {3, 7, false, false};
    case DataType::kFloat8E4M3FNUZ: return {3, 8, true, false};
    case DataType::kFloat8E5M2: return {2, 15, false, true};
    default: return {2, 16, true, false};  // e5m2fnuz
  }
}

KILN_HD inline bool is_float8(DataType t) {
  return t == DataType::kFloat8E4M3FN || t == DataType::kFloat8E4M3FNUZ ||
         t == DataType::kFloat8E5M2 || t == DataType::kFloat8E5M2FNUZ;
}
KILN_HD inline bool is_low_bit(DataType t) {
  return is_float8(t) || t == DataType::kUInt4 || t == DataType::kInt4;
}

KILN_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KILN_HD inline float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

KILN_HD inline bool float8_is_nan_code(const Float8Format& f, uint8_t c) {
  if (f.fnuz) return c == 0x80;
  if (f.has_inf) return (c & 0x7f) > 0x7c;
  return (c & 0x7f) == 0x7f;
}

// 2^e as a float, exactly, for the exponents float8 needs (-26 .. 16).
KILN_HD inline float pow2(int e) {
  return e >= -126 ? bits_float(static_cast<uint32_t>(e + 127) << 23)
                   : bits_float(1u << (e + 149));  // subnormal
}

// The magnitude of code c (sign bit ignored); only for non-NaN, non-inf codes. Exact.
KILN_HD inline float float8_magnitude(const Float8Format& f, uint8_t c) {
  const int e = (c & 0x7f) >> f.mant_bits;
  const int m = c & ((1 << f.mant_bits) - 1);
  const float frac = static_cast<float>(m) / static_cast<float>(1 << f.mant_bits);
  return e == 0 ? frac * pow2(1 - f.bias) : (1.f + frac) * pow2(e - f.bias);
}

// The largest finite code of a format (positive).
KILN_HD inline uint8_t float8_max_code(const Float8Format& f) {
  if (f.fnuz) return 0x7f;
  return f.has_inf ? 0x7b : 0x7e;
}

// The value of one stored low-bit element (NaN/inf per the format).
KILN_HD inline float to_float(DataType t, uint8_t b) {
  if (t == DataType::kInt4) return static_cast<float>(static_cast<int8_t>(b));
  if (t == DataType::kUInt4) return static_cast<float>(b);
  const Float8Format f = float8_format(t);
  if (float8_is_nan_code(f, b)) return bits_float(0x7fc00000u);
  const float sign = (b & 0x80) ? -1.f : 1.f;
  if (f.has_inf && (b & 0x7f) == 0x7c) return sign * bits_float(0x7f800000u);
  return sign * float8_magnitude(f, b);
}

// float -> float8 bit pattern, round to nearest, ties to the even code (a binary search over
// the monotonic positive codes); the code past the largest finite one counts as "overflow" at
// the value the format would give it. With `saturate`, overflow and infinities become the
// largest finite value of that sign; without, infinity (e5m2) or NaN (the others).
KILN_HD inline uint8_t from_float(DataType t, float v, bool saturate) {
  const Float8Format f = float8_format(t);
  const uint8_t nan = f.fnuz ? 0x80 : 0x7f;
  const uint32_t bits = float_bits(v);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return f.has_inf ? 0x7e : nan;
  const uint8_t sign = (bits >> 31) ? 0x80 : 0x00;
  const uint8_t max_code = float8_max_code(f);
  const float a = bits_float(abs_bits);
  auto overflow = [&]() -> uint8_t {
    if (saturate) return sign | max_code;
    if (f.has_inf) return sign | 0x7c;
    return f.fnuz ? nan : static_cast<uint8_t>(sign | nan);
  };
  if (abs_bits == 0x7f800000u) return overflow();
  int lo = 0, hi = max_code;  // lo: the largest code with magnitude <= a
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (float8_magnitude(f, static_cast<uint8_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  uint8_t code = static_cast<uint8_t>(lo);
  const float lo_v = float8_magnitude(f, code);
  if (a > lo_v) {
    const float hi_v = lo < max_code
                           ? float8_magnitude(f, static_cast<uint8_t>(lo + 1))
                           : lo_v + (lo_v - float8_magnitude(f, static_cast<uint8_t>(lo - 1)));
    const float mid = lo_v + (hi_v - lo_v) / 2;
    if (a > mid || (a == mid && (lo & 1))) {
      if (lo == max_code) return overflow();
      code = static_cast<uint8_t>(lo + 1);
    }
  }
  if (code == 0 && f.fnuz) return 0;  // no negative zero
  return sign | code;
}

// An int64 value wrapped to 4 bits, stored one per byte (int4 sign-extended).
KILN_HD inline uint8_t wrap4(DataType t, int64_t v) {
  const auto w = static_cast<uint8_t>(v & 0xf);
  return t == DataType::kInt4 && (w & 0x8) ? static_cast<uint8_t>(w | 0xf0) : w;
}

}  // namespace kiln::low_bit
