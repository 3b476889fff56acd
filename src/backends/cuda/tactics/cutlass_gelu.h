// erf GELU as a CUTLASS epilogue activation, in the cheaper form of kernels/gelu_erf.cuh, for the
// Hopper GEMMs that fuse it (cutlass_sm90_gemm_f16.cu, cutlass_sm90_gemm_i8f16.cu). Included by
// CUDA sources that include CUTLASS.
#pragma once

#include "cutlass/array.h"
#include "kernels/gelu_erf.cuh"

namespace kiln::cuda {

template <class T>
struct GeluErfTanh {
  CUTLASS_HOST_DEVICE T operator()(T const& x) const {
    return T(kiln::gpu::gelu_erf_tanh(float(x)));
  }
};
template <int N>
struct GeluErfTanh<cutlass::Array<float, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = kiln::gpu::gelu_erf_tanh(x[i]);
    return y;
  }
};

}  // namespace kiln::cuda
