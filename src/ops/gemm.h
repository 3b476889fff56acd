// Reference matrix multiplication shared by Gemm, MatMul, Conv (im2col) and kiln's fused layers.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

// C = alpha * op(A) * op(B) + beta * C, row-major and contiguous. op(A) is M x K (A is K x M when
// transA), op(B) is K x N (B is N x K when transB), C is M x N. beta == 0 ignores C's contents
// (NaNs in C do not propagate). Accumulates in T (float for float32, double for float64).
template <typename T>
void gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
          const T* B, T beta, T* C);

inline void gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, const float* B, float beta, float* C) {
  gemm<float>(transA, transB, M, N, K, alpha, A, B, beta, C);
}

// MatMul's output dims for inputs of dims `a` and `b` (rank >= 1; numpy.matmul: a 1-D side is
// promoted and its axis removed, batch dims broadcast); errors name `n`.
Expected<std::vector<Dim>> matmul_out_dims(const Node& n, std::vector<Dim> a, std::vector<Dim> b);

}  // namespace kiln
