// The runtime's own small kernels (random fills for tuning).
#include "device_util_host.h"
#include "kernels/device_util.cuh"

namespace kiln::gpu {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, uint64_t seed) {
  KILN_GRID_STRIDE(i, n) {
    const uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    const float u = float(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    if constexpr (std::is_same_v<T, bool>) out[i] = (bits & 1) != 0;
    else if constexpr (is_float_v<T>) store(out, i, 2.0f * u - 1.0f);
    else out[i] = static_cast<T>(static_cast<int>(u * 9.0f) - 4);
  }
}

}  // namespace

Status fill_random(void* data, DataType dtype, int64_t count, uint64_t seed, cudaStream_t s) {
  if (count <= 0) return Status::Ok();
  const bool ok = dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    fill_kernel<T><<<grid_for(count), kBlock, 0, s>>>(static_cast<T*>(data), count, seed);
  });
  if (!ok) return KILN_ERROR("cannot fill {} tensors", dtype_name(dtype));
  KILN_CUDA_LAUNCH_CHECK("fill kernel");
  return Status::Ok();
}

}  // namespace kiln::gpu
