// erf GELU, x * Phi(x), for epilogues that run while the tensor cores wait (CUTLASS's FFN1 in
// cutlass_sm90_gemm_f16.cu): x * Phi(x) = x/2 * (1 + tanh(u(x))), where u(x) = atanh(erf(x / sqrt 2))
// is fitted by an odd quintic on |x| <= 6 (x is clamped there; past it Phi is 0 or 1 in float).
// On the GPU one tanh.approx on the SFU and seven FMA-pipe operations, where erff takes about two
// dozen and x * sigmoid(2 u) (ex2 and rcp) two SFU operations. The fit's |error| <= 3e-5 against
// x * Phi(x) (tests/cuda/test_cuda_host.cpp checks it with the host's tanh); tanh.approx's own
// error (about 2^-11 of tanh) adds at most 2.5e-4 * max(|x|, 1), about a rounding step of the
// FP16 output. BERT's FFN1 at 4096 rows on the H100 (kiln_gemm_f16_bench, CUTLASS pp128x128):
// 43.4 us with this form against 38.3 us with no activation; in an earlier run, 39.6 us with no
// activation, 47.4 us with x * sigmoid(2 u) and 54.6 us with erff.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace kiln::gpu {

__host__ __device__ __forceinline__ float gelu_erf_tanh(float x) {
  const float c = fminf(fmaxf(x, -6.f), 6.f), c2 = c * c;
  const float u = c * fmaf(fmaf(-3.588681969e-04f, c2, 3.705103891e-02f), c2, 7.974578150e-01f);
#ifdef __CUDA_ARCH__
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
#else
  const float t = std::tanh(u);
#endif
  // Below -6 tanh(u) is -1 and the result 0, as x Phi(x) is once rounded to FP16 (-1.2e-8 at -6).
  const float h = 0.5f * fmaxf(x, -6.f);
  return fmaf(h, t, h);
}

}  // namespace kiln::gpu
