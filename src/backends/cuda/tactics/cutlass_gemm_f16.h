// CUTLASS's Hopper GEMMs in FP16 with a fused epilogue (cutlass_sm90_gemm_f16.cu), for the
// FusedGemm layers of transformers: Y [M, N] = act(A [M, K] W [K, N] + bias [N] + R [M, N]),
// float16 in and out, float accumulation, every matrix row-major; act none, erf GELU, tanh GELU
// (the erf form is what cuBLASLt's epilogues lack: BERT's and ViT's FFN) or Swish
// x * sigmoid(alpha x) (SiLU; CLIP's quick GELU, alpha 1.702). C++17 and free of
// CUTLASS types, so that layers/gemm_cutlass.cpp can use it; built only with CUTLASS.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::cuda {

enum class F16GemmAct { kNone, kGelu, kGeluTanh, kSwish };

class F16Gemm {
 public:
  virtual ~F16Gemm() = default;
  // The extents; the workspace it needs, or an error when the kernel cannot take them.
  virtual Status configure(int m, int n, int k, size_t* workspace) = 0;
  // bias and r may be null. Pointers 16-byte aligned. pdl: launch with programmatic dependent
  // launch (kernels/pdl.cuh); the kernels are built with CUTLASS's grid dependency control, so
  // they wait for the kernel before them before reading or writing global memory.
  virtual Status run(const void* a, const void* w, const void* bias, const void* r, void* y,
                     void* workspace, cudaStream_t stream, bool pdl = false) = 0;
};

// The compiled tile configurations (the tactic's variants), fastest-for-large-M first.
const std::vector<std::string>& f16_gemm_tiles();
// nullptr for a tile that is not compiled. alpha: Swish's.
std::unique_ptr<F16Gemm> make_f16_gemm(F16GemmAct act, const std::string& tile, float alpha = 1.f);

}  // namespace kiln::cuda
