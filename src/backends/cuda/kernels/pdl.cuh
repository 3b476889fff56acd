// Programmatic dependent launch (PDL, Hopper and later) for kiln's own kernels.
//
// A kernel launched by launch_kernel() with RunContext::pdl set may be scheduled while the
// kernel before it in the stream is still running, so its launch and its prologue (shared
// memory carve-out, index arithmetic, a persistent GEMM's barriers and descriptors) overlap the
// tail of its predecessor instead of following it. The rule that keeps this correct: such a
// kernel calls pdl_wait() in every block, before any early return and before it touches global
// memory, inputs and outputs alike (the memory planner reuses the arena, so even an output may
// still be read by an earlier layer). pdl_wait() returns once every earlier kernel of the stream
// has completed and its writes are visible, and as each kernel waits before it can complete, a
// later kernel's wait covers the whole chain. pdl_launch_dependents() tells the hardware that the
// next kernel's blocks may be scheduled once every block of this one has called it or exited;
// it never lets the next kernel past its own pdl_wait() early. Without the launch attribute, or
// below sm_90, both are no-ops and the launch is an ordinary one.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "layer.h"

namespace kiln::gpu {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// A launch on rc.stream with the programmatic-serialization attribute (held in *attr) where
// rc.pdl is set.
inline cudaLaunchConfig_t launch_config(const RunContext& rc, dim3 grid, dim3 block, size_t smem,
                                        cudaLaunchAttribute* attr) {
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = rc.stream;
  cfg.attrs = rc.pdl ? attr : nullptr;
  cfg.numAttrs = rc.pdl ? 1 : 0;
  return cfg;
}

// kernel<<<grid, block, smem, rc.stream>>>(args...), with the programmatic-serialization
// attribute where rc.pdl is set. Only for kernels that keep the rule above.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(const RunContext& rc, void (*kernel)(Params...), dim3 grid, dim3 block,
                          size_t smem, Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config(rc, grid, block, smem, &attr);
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The same for a kernel loaded at run time (a cudaKernel_t, rtc.h), its parameters as pointers.
inline cudaError_t launch_kernel(const RunContext& rc, cudaKernel_t kernel, dim3 grid, dim3 block,
                                 size_t smem, void** args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = launch_config(rc, grid, block, smem, &attr);
  return cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), args);
}

}  // namespace kiln::gpu
