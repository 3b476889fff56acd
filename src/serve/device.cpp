#include "serve/device.h"

#include <cstdlib>
#include <algorithm>
#include <new>

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln::serve {

int visible_gpus() {
#ifdef KILN_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

bool use_device(int device) {
#ifdef KILN_WITH_CUDA
  if (device < 0) return true;
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
#else
  return device < 0;
#endif
}

std::string set_gpu_wait(bool spin) {
#ifdef KILN_WITH_CUDA
  // A thread waiting for an inference sleeps until the GPU is done (trtexec's default); CUDA's
  // own default spins while a process has fewer contexts than cores, a core per waiting thread.
  const int n = visible_gpus();
  for (int d = 0; d < n; ++d) {
    const unsigned flags = spin ? cudaDeviceScheduleSpin : cudaDeviceScheduleBlockingSync;
#if CUDART_VERSION >= 12000
    // cudaSetDevice makes the primary context in CUDA 12; cudaInitDevice sets its flags first.
    const cudaError_t e = cudaInitDevice(d, flags, 0);
#else
    const cudaError_t e =
        cudaSetDevice(d) == cudaSuccess ? cudaSetDeviceFlags(flags) : cudaErrorInvalidDevice;
#endif
    if (e != cudaSuccess) {
      cudaGetLastError();
      return "cannot set how threads wait for CUDA device " + std::to_string(d);
    }
  }
  if (n > 0) cudaSetDevice(0);
#else
  (void)spin;
#endif
  return "";
}

std::shared_ptr<void> host_buffer(size_t bytes, bool pinned) {
  bytes = std::max<size_t>(bytes, 64);
#ifdef KILN_WITH_CUDA
  void* p = nullptr;
  if (pinned && cudaHostAlloc(&p, bytes, cudaHostAllocPortable) == cudaSuccess)
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  cudaGetLastError();  // no GPU, or no page-locked memory left: ordinary memory serves
#else
  (void)pinned;
#endif
  void* q = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!q) throw std::bad_alloc();
  return std::shared_ptr<void>(q, [](void* r) { std::free(r); });
}

}  // namespace kiln::serve
