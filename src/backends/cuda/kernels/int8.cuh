// INT8 codes on the device, exactly as the CPU reference computes them (quant::quantize_value,
// docs/quantization.md): q = sat(rne(v / scale)) with an IEEE float32 division (explicitly
// rounded, so neither fast-math nor FMA contraction can change a code), NaN -> 0; a code's value
// is q * scale. Shared by the reformat layer and the INT8 kernels.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kiln::gpu {

#ifdef __CUDACC__
__device__ __forceinline__ int8_t quantize_code(float v, float scale) {
  const float q = __fdiv_rn(v, scale);
  if (isnan(q)) return 0;
  const float r = rintf(q);  // round half to even
  return static_cast<int8_t>(fminf(fmaxf(r, -128.f), 127.f));
}

#endif

// Exact float32 of an integer with |i| <= 2^22 without a conversion instruction (conversions run
// at a quarter of the float rate on the H100, and an INT8 epilogue would spend more time in them
// than in its memory traffic): i added to the bits of 1.5 * 2^23 is the float 1.5 * 2^23 + i
// (the mantissa's unit is 1 there), and subtracting 1.5 * 2^23 is exact. Used where the bound
// holds by construction: an accumulator over at most 256 products of int8 codes (256 * 128 * 128 =
// 2^22), or a code.
constexpr float kMagicRound = 12582912.f;  // 1.5 * 2^23
__host__ __device__ __forceinline__ float small_int_to_float(int32_t i) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(__int_as_float(i + 0x4B400000), kMagicRound);
#else
  const uint32_t bits = static_cast<uint32_t>(i + 0x4B400000);
  float f;
  std::memcpy(&f, &bits, sizeof f);
  volatile float r = f - kMagicRound;
  return r;
#endif
}

// quantize_code's code with a multiply by inv = 1 / scale (float32, correctly rounded) in place of
// the division, for the INT8 epilogues where the division costs more than the rest of the element.
// t = rn(v * inv) is within 1.5 * 2^-23 * |t| of the exact v / scale, and so is the correctly rounded
// quotient: their integer roundings can differ only when a half-integer lies within that distance of
// t, so within 2^-20 * |t| (a wide margin) the quotient is computed by division, as quantize_code
// does. Saturation comes first (clamping to [-128, 127] and rounding gives sat(rne(t)), the bounds
// being integers), and beyond the bounds both roundings saturate alike, so the margin is checked on
// the clamped value. Rounding is by adding 1.5 * 2^23 (round half to even in float32 addition), and
// the code is the low byte of that sum's bits: only full-rate float and integer instructions, no
// conversion unit. NaN gives 0, as quantize_code. Host and device give the same codes
// (tests/cuda/test_cuda_host.cpp checks them against the CPU reference's quantize_value).
__host__ __device__ __forceinline__ int8_t quantize_code_inv(float v, float scale, float inv) {
#ifdef __CUDA_ARCH__
  float t = __fmul_rn(v, inv);
  float tc = fminf(fmaxf(t, -128.f), 127.f);
  float f = __fadd_rn(tc, kMagicRound);
  if (0.5f - fabsf(__fsub_rn(tc, __fsub_rn(f, kMagicRound))) <= 0x1p-20f * fabsf(tc)) {
    t = __fdiv_rn(v, scale);
    tc = fminf(fmaxf(t, -128.f), 127.f);
    f = __fadd_rn(tc, kMagicRound);
  }
  return t != t ? int8_t{0} : static_cast<int8_t>(__float_as_int(f) & 0xff);
#else
  volatile float prod = v * inv;  // no contraction with the arithmetic below
  float t = prod;
  float tc = std::fmin(std::fmax(t, -128.f), 127.f);
  volatile float f = tc + kMagicRound;
  volatile float r = f - kMagicRound;
  volatile float frac = tc - r;
  if (0.5f - std::fabs(frac) <= 0x1p-20f * std::fabs(tc)) {
    t = v / scale;
    tc = std::fmin(std::fmax(t, -128.f), 127.f);
    f = tc + kMagicRound;
  }
  if (t != t) return 0;  // NaN
  const float fv = f;
  uint32_t bits;
  std::memcpy(&bits, &fv, sizeof bits);
  return static_cast<int8_t>(bits & 0xff);
#endif
}

// Two codes at once, packed low byte first (bits 16..31 unspecified), for the epilogues that are
// bound by their instruction count: quantize_code_inv's arithmetic with a fixed margin and one
// branch per pair. Beside a half-integer the multiply and the quotient can round apart only within
// 1.5 * 2^-23 * |t| <= 1.5 * 2^-16 of it (|t| <= 128 once clamped), so a fraction within 2^-13 of
// one half takes the division for both values; the clamp propagates NaN (min/max.NaN) so that NaN
// takes it too, and gives 0 there. NonNegative: the values are ReLU's inputs, v > 0 ? v : 0 being
// what is quantized; clamping to [0, 127] folds the ReLU in (non-positive values give code 0).
// Host and device give the same codes (tests/cuda/test_cuda_host.cpp).
constexpr float kNearHalf = 0.5f - 0x1p-13f;
// The rare path, out of line so that an unrolled epilogue does not carry a division per value.
#ifdef __CUDA_ARCH__
__noinline__
#else
inline
#endif
__host__ __device__ uint32_t quantize_pair_slow(float v0, float v1, float scale, float inv) {
  return static_cast<uint8_t>(quantize_code_inv(v0, scale, inv)) |
         static_cast<uint32_t>(static_cast<uint8_t>(quantize_code_inv(v1, scale, inv))) << 8;
}
template <bool NonNegative>
__host__ __device__ __forceinline__ uint32_t quantize_pair_inv(float v0, float v1, float scale,
                                                               float inv) {
  constexpr float lo = NonNegative ? 0.f : -128.f;
#ifdef __CUDA_ARCH__
  auto clamp = [](float t) {
    float c;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(c) : "f"(t), "f"(lo));
    asm("min.NaN.f32 %0, %0, %1;" : "+f"(c) : "f"(127.f));
    return c;
  };
  const float c0 = clamp(__fmul_rn(v0, inv)), c1 = clamp(__fmul_rn(v1, inv));
  const float f0 = __fadd_rn(c0, kMagicRound), f1 = __fadd_rn(c1, kMagicRound);
  const float e0 = __fsub_rn(c0, __fsub_rn(f0, kMagicRound));
  const float e1 = __fsub_rn(c1, __fsub_rn(f1, kMagicRound));
  if (!(fabsf(e0) < kNearHalf) || !(fabsf(e1) < kNearHalf)) {
#else
  auto clamp = [](float t) { return t != t ? t : std::fmin(std::fmax(t, lo), 127.f); };
  volatile float t0 = v0 * inv, t1 = v1 * inv;  // no contraction with the arithmetic below
  const float c0 = clamp(t0), c1 = clamp(t1);
  volatile float f0 = c0 + kMagicRound, f1 = c1 + kMagicRound;
  volatile float r0 = f0 - kMagicRound, r1 = f1 - kMagicRound;
  volatile float e0 = c0 - r0, e1 = c1 - r1;
  if (!(std::fabs(e0) < kNearHalf) || !(std::fabs(e1) < kNearHalf)) {
#endif
    return quantize_pair_slow(NonNegative ? (v0 > 0.f ? v0 : 0.f) : v0,
                              NonNegative ? (v1 > 0.f ? v1 : 0.f) : v1, scale, inv);
  }
#ifdef __CUDA_ARCH__
  return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x0040);
#else
  const float g0 = f0, g1 = f1;
  uint32_t b0, b1;
  std::memcpy(&b0, &g0, sizeof b0);
  std::memcpy(&b1, &g1, sizeof b1);
  return (b0 & 0xff) | (b1 & 0xff) << 8;
#endif
}

#ifdef __CUDACC__
__device__ __forceinline__ float dequantize_code(int8_t q, float scale) {
  return __fmul_rn(static_cast<float>(q), scale);
}
#endif

}  // namespace kiln::gpu
