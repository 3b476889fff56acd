// What the gemm family's layers share (layers/gemm.cu, layers/gemm_attention.cu): the cuBLAS
// status check, the plan of a batched row-major matrix product with broadcast batch dims, and
// its launch through cuBLAS.
#pragma once

#include <cublas_v2.h>

#include <vector>

#include "layer.h"

namespace kiln::gpu {

// A Status from a cuBLAS call; names the call.
Status cublas_check(cublasStatus_t s, const char* what);

// Y[b] = alpha * op(A[b]) (M x K) * op(B[b]) (K x N), all row-major, over a batch whose dims
// are coalesced into a host loop over `outer` offsets and one strided batch of `count`
// products (cublasGemmStridedBatchedEx; stride 0 broadcasts an operand).
struct BatchedGemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t count = 1, sa = 0, sb = 0, sy = 0;  // the strided batch (element strides)
  std::vector<int64_t> oa = {0}, ob = {0}, oy = {0};  // one entry per outer iteration
};

// The plan for A of batch dims `a_batch` and B of `b_batch` broadcast to `batch` (each operand's
// matrices contiguous, M*K and K*N elements; Y's [batch..., M, N] contiguous). A product whose
// B is shared by every batch entry becomes one GEMM of M*batch rows.
BatchedGemm plan_batched_gemm(const std::vector<int64_t>& a_batch,
                              const std::vector<int64_t>& b_batch,
                              const std::vector<int64_t>& batch, int64_t M, int64_t N, int64_t K,
                              bool ta = false, bool tb = false);

// Checks the sizes cuBLAS's 32-bit interface takes.
Status check_gemm_dims(const BatchedGemm& g, const Node& n);

// dst[r, c] = src[r, c] for `rows` rows of `cols` elements, src rows `src_ld` elements apart and
// dst rows packed (`cols` apart), converting float16 to float32 or copying same-type elements:
// a GEMM that wrote aligned padded rows hands its result to an unaligned output (gemm.cu).
Status copy_padded_rows(const void* src, DataType st, int64_t src_ld, void* dst, DataType dt,
                        int64_t rows, int64_t cols, cudaStream_t stream);

// The columns a row-grouped product leaves to gemm_edge_columns: row r (group r % groups) has
// its columns [first, end) from the product, the others from here.
struct EdgeColumns {
  int groups = 0;
  int64_t first[16] = {}, end[16] = {};
};

// The row groups of a product whose Y rows (N elements of y_size bytes) are not 16-byte
// aligned (gemm_lt.cpp): `groups` G is the least power of two with G N y_size a multiple of 16,
// so rows j, j + G, ... start at the same offset modulo 16 bytes; row j's product writes columns
// [first[j], end[j]): from the row's first 16-byte boundary, a multiple of 8 columns.
EdgeColumns plan_row_groups(int64_t N, int64_t y_size);

// y[r, c] = A[r, :] . Wt[c, :] in float for the columns of each row outside its group's
// [first, end): A [M, K] and Wt [N', K] float16 (K even), y [M, N] float32 or float16 (gemm.cu).
Status gemm_edge_columns(const void* a, const void* wt, int64_t K, void* y, DataType yt,
                         int64_t M, int64_t N, const EdgeColumns& e, cudaStream_t stream);

// Runs the plan with cuBLAS on rc.stream: A and B of storage type `ab`, Y of `yt` (ab, or
// float32 for 16-bit ab). Math: float64 in double; float32 strict (kFP32) or TF32 (kTF32);
// 16-bit inputs accumulate in float. Y's old contents are ignored (beta = 0). K == 0 writes
// zeros.
Status run_batched_gemm(const RunContext& rc, const BatchedGemm& g, DataType ab, DataType yt,
                        Precision p, double alpha, const void* A, const void* B, void* Y);

}  // namespace kiln::gpu
