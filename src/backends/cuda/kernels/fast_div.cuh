// Division of 32-bit dividends below 2^31 by a divisor fixed at configure or launch time, as a
// multiply-high, an add and a shift (Granlund and Montgomery's method) instead of a long software
// division. Shared by the index arithmetic of the movement layers and the strided pointwise INT8
// kernel; host and device give the same quotients (tests/cuda/test_cuda_host.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::gpu {

struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  FastDiv() = default;
  explicit FastDiv(int64_t divisor) : d(static_cast<uint32_t>(divisor < 1 ? 1 : divisor)) {
    while ((uint64_t{1} << s) < d) ++s;
    m = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1);
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    return (__umulhi(n, m) + n) >> s;
#else
    return static_cast<uint32_t>(((static_cast<uint64_t>(n) * m >> 32) + n) >> s);
#endif
  }
};

}  // namespace kiln::gpu
