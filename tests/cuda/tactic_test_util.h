// What the conv tactic tests share (test_conv_tactics.cpp, test_conv_tactics_int8.cpp): whether
// a GPU is here, and the library handles of one test.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

namespace kiln::cuda::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Handles {
  cudnnHandle_t dnn = nullptr;
  cublasLtHandle_t lt = nullptr;
  Handles() {
    cudnnCreate(&dnn);
    cublasLtCreate(&lt);
  }
  ~Handles() {
    if (lt) cublasLtDestroy(lt);
    if (dnn) cudnnDestroy(dnn);
  }
  Handles(const Handles&) = delete;
  Handles& operator=(const Handles&) = delete;
};

}  // namespace kiln::cuda::test
