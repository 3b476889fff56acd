// INT8 codes on the device, exactly as the CPU reference computes them (quant::quantize_value,
// docs/quantization.md): q = sat(rne(v / scale)) with an IEEE float32 division (explicitly
// rounded, so neither fast-math nor FMA contraction can change a code), NaN -> 0; a code's value
// is q * scale. Shared by the reformat layer and the INT8 kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::gpu {

__device__ __forceinline__ int8_t quantize_code(float v, float scale) {
  const float q = __fdiv_rn(v, scale);
  if (isnan(q)) return 0;
  const float r = rintf(q);  // round half to even
  return static_cast<int8_t>(fminf(fmaxf(r, -128.f), 127.f));
}

__device__ __forceinline__ float dequantize_code(int8_t q, float scale) {
  return __fmul_rn(static_cast<float>(q), scale);
}

}  // namespace kiln::gpu
