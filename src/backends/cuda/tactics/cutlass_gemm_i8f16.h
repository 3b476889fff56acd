// CUTLASS's Hopper INT8 GEMMs with a float16 result (cutlass_sm90_gemm_i8f16.cu), for the INT8
// FusedGemm layers of transformers (layers/gemm_int8_cutlass.cpp): Y [M, N] =
// act(alpha[n] * (A [M, K] . W [N, K]^T) + bias[n] + R [M, N]), A and W int8 (both K-major, as
// int8 wgmma reads them), int32 accumulation, alpha and bias float32 per column (alpha = the
// input's scale times the weight column's), R and Y float16, row-major. Y is not requantized:
// the layer's output goes to float consumers (attention, LayerNorm) as float16. act: none, erf
// GELU or tanh GELU. C++17 and free of CUTLASS types; built only with CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "cutlass_gemm_f16.h"
#include "kiln/status.h"

namespace kiln::cuda {

class I8F16Gemm {
 public:
  virtual ~I8F16Gemm() = default;
  // The extents; the workspace it needs, or an error when the kernel cannot take them.
  virtual Status configure(int m, int n, int k, size_t* workspace) = 0;
  // alpha: N floats on the device; bias (N floats) and r may be null. Pointers 16-byte aligned.
  // pdl: launched with programmatic dependent launch (the kernels wait for the one before them
  // before their first global load, as cutlass_sm90_gemm_f16.cu's do).
  virtual Status run(const void* a, const void* w, const float* alpha, const float* bias,
                     const void* r, void* y, void* workspace, cudaStream_t stream,
                     bool pdl = false) = 0;
};

// The compiled tile configurations (the tactic's variants), fastest-for-large-M first.
const std::vector<std::string>& i8f16_gemm_tiles();
// nullptr for a tile or activation (Swish) that is not compiled.
std::unique_ptr<I8F16Gemm> make_i8f16_gemm(F16GemmAct act, const std::string& tile);

}  // namespace kiln::cuda
