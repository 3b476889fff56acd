// The strided copies of the movement layers (layers/movement.cu), for layers that move their
// operands into another layout themselves (layers/attention_mha.cu).
#pragma once

#include <span>
#include <vector>

#include "kernels/device_util.cuh"
#include "layer.h"

namespace kiln::gpu::movement_detail {

// One strided copy: dst[dst_off + sum c_k * dst_str_k] = src[src_off + sum c_k * src_str_k]
// over the iteration space `dims`, prepared for the fastest kernel that fits.
struct CopyPlan {
  enum class Kind { kEmpty, kRows, kTiled, kStrided } kind = Kind::kEmpty;
  size_t esize = 0;
  int64_t n = 0, src_off = 0, dst_off = 0;
  int64_t rows = 0, width = 0;  // kRows: contiguous rows (elements); row offsets src_ix/dst_ix
  int64_t A = 0, B = 0, sa = 0, sb = 0, batches = 0;  // kTiled
  StridedIndex src_ix, dst_ix, batch_ix;
  bool dst_dense = false;
};

// Plans dst[dst_off + sum c_k * dst_str[k]] = src[src_off + sum c_k * src_str[k]] over `dims`
// (element strides; elements of `esize` bytes).
Expected<CopyPlan> plan_copy(std::vector<int64_t> dims, std::vector<int64_t> src_str,
                             std::vector<int64_t> dst_str, int64_t src_off, int64_t dst_off,
                             size_t esize);
// Runs a plan on `stream`.
Status run_copy(const CopyPlan& p, const void* src, void* dst, cudaStream_t stream);

// Runs plans whose destinations do not overlap, the small row copies among them batched into
// one launch (movement_batch.cu).
struct CopyJob {
  const CopyPlan* plan;
  const void* src;
  void* dst;
};
Status run_copies(std::span<const CopyJob> jobs, cudaStream_t stream);

}  // namespace kiln::gpu::movement_detail
