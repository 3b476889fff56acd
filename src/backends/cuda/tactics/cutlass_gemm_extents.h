// What the Hopper GEMMs with fused epilogues share (cutlass_sm90_gemm_f16.cu,
// cutlass_sm90_gemm_i8f16.cu): the persistent schedules (ping-pong: two consumer warp groups on
// alternate tiles; cooperative: both on one) with their epilogues, and the extents of one problem
// of a GemmUniversalAdapter `Gemm` as its Arguments take them: m x n x k, the packed strides of A
// (m, k), B (n, k; its layout tag says which is contiguous), C and D (m, n), and the device's
// multiprocessors. Included by CUDA sources that include CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include "check.h"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/kernel_hardware_info.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace kiln::cuda {

using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingPongEpi = cutlass::epilogue::TmaWarpSpecialized;

template <class Gemm>
struct CutlassGemmExtents {
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;

  Status set(int m_, int n_, int k_) {
    m = m_, n = n_, k = k_;
    a = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, k, 1));
    b = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(n, k, 1));
    c = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(m, n, 1));
    d = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m, n, 1));
    int device = 0;
    KILN_CUDA(cudaGetDevice(&device));
    hw.device_id = device;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    return {};
  }

  int m = 0, n = 0, k = 0;
  StrideA a{};
  StrideB b{};
  StrideC c{};
  StrideD d{};
  cutlass::KernelHardwareInfo hw{};
};

}  // namespace kiln::cuda
