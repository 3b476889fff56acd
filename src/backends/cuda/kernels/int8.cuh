// INT8 codes on the device, exactly as the CPU reference computes them (quant::quantize_value,
// docs/quantization.md): q = sat(rne(v / scale)) with an IEEE float32 division (explicitly
// rounded, so neither fast-math nor FMA contraction can change a code), NaN -> 0; a code's value
// is q * scale. Shared by the reformat layer and the INT8 kernels.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace kiln::gpu {

#ifdef __CUDACC__
__device__ __forceinline__ int8_t quantize_code(float v, float scale) {
  const float q = __fdiv_rn(v, scale);
  if (isnan(q)) return 0;
  const float r = rintf(q);  // round half to even
  return static_cast<int8_t>(fminf(fmaxf(r, -128.f), 127.f));
}

#endif

// quantize_code's code with a multiply by inv = 1 / scale (float32, correctly rounded) in place of
// the division, for the INT8 epilogues where the division costs more than the rest of the element.
// t = rn(v * inv) is within 1.5 * 2^-23 * |t| of the exact v / scale, and so is the correctly rounded
// quotient: their integer roundings can differ only when a half-integer lies within that distance of
// t, so within 2^-20 * |t| (a wide margin) the quotient is computed by division, as quantize_code
// does. t - rint(t) is exact for |t| < 2^23; larger |t| always divides (and saturates either way).
// NaN gives 0, as quantize_code. Host and device give the same codes (tests/cuda/test_cuda_host.cpp
// checks it against quantize_code's arithmetic).
__host__ __device__ __forceinline__ int8_t quantize_code_inv(float v, float scale, float inv) {
#ifdef __CUDA_ARCH__
  float t = __fmul_rn(v, inv);
  if (0.5f - fabsf(__fsub_rn(t, rintf(t))) <= 0x1p-20f * fabsf(t)) t = __fdiv_rn(v, scale);
#else
  volatile float prod = v * inv;  // no contraction with the subtraction below
  float t = prod;
  volatile float frac = t - rintf(t);
  if (0.5f - fabsf(frac) <= 0x1p-20f * fabsf(t)) t = v / scale;
#endif
  if (t != t) return 0;  // NaN
  return static_cast<int8_t>(fminf(fmaxf(rintf(t), -128.f), 127.f));
}

#ifdef __CUDACC__
__device__ __forceinline__ float dequantize_code(int8_t q, float scale) {
  return __fmul_rn(static_cast<float>(q), scale);
}
#endif

}  // namespace kiln::gpu
