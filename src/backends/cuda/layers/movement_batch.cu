// A layer's many small copies in one launch: a Concat's or Split's parts are each a block of
// contiguous rows (layers/movement.cu plans them), and a detector's per-class results are dozens
// of parts of a few hundred bytes (SSDlite concatenates 90), where a launch apiece costs more
// host time than the copies take on the GPU. Small row copies go to one kernel, up to kSegMax a
// launch, a block row per part; the rest run as planned, in their order. The parts of a launch
// run at once, so the jobs given must write disjoint memory (a Concat's or Split's parts do).
#include <algorithm>

#include "movement_copy.h"

namespace kiln::gpu::movement_detail {
namespace {

constexpr int kSegMax = 32;
constexpr int64_t kSegBytesMax = 256 << 10;  // larger parts run as planned (memcpy, rows_kernel)

// `rows` rows of `width` bytes, row r at src + r * spitch and dst + r * dpitch.
struct Seg {
  const char* src;
  char* dst;
  int64_t rows, width, spitch, dpitch;
};
struct SegTable {
  Seg s[kSegMax];
};

template <typename U>
__device__ __forceinline__ void copy_seg(const Seg& g) {
  constexpr int64_t u = sizeof(U);
  const int64_t w = g.width / u, n = g.rows * w, sp = g.spitch / u, dp = g.dpitch / u;
  const U* x = reinterpret_cast<const U*>(g.src);
  U* y = reinterpret_cast<U*>(g.dst);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / w, c = i - r * w;
    y[r * dp + c] = x[r * sp + c];
  }
}

// Grid (blocks, parts): blockIdx.y picks the part, its widest unit dividing every address and
// length (uniform in the block).
__global__ void segments_kernel(const __grid_constant__ SegTable t) {
  const Seg& g = t.s[blockIdx.y];
  const uint64_t a = reinterpret_cast<uintptr_t>(g.src) | reinterpret_cast<uintptr_t>(g.dst) |
                     static_cast<uint64_t>(g.width | g.spitch | g.dpitch);
  if (a % 16 == 0) copy_seg<int4>(g);
  else if (a % 8 == 0) copy_seg<uint2>(g);
  else if (a % 4 == 0) copy_seg<uint32_t>(g);
  else if (a % 2 == 0) copy_seg<uint16_t>(g);
  else copy_seg<uint8_t>(g);
}

// A plan of contiguous rows, each row's start one stride apart, small enough to share a launch.
bool batchable(const CopyPlan& p) {
  return p.kind == CopyPlan::Kind::kRows && p.src_ix.rank <= 1 && p.dst_ix.rank <= 1 &&
         p.n * static_cast<int64_t>(p.esize) <= kSegBytesMax;
}

Seg segment(const CopyJob& j) {
  const CopyPlan& p = *j.plan;
  const int64_t es = static_cast<int64_t>(p.esize);
  Seg g;
  g.src = static_cast<const char*>(j.src) + p.src_off * es;
  g.dst = static_cast<char*>(j.dst) + p.dst_off * es;
  g.rows = p.rows;
  g.width = p.width * es;
  g.spitch = p.src_ix.rank ? p.src_ix.strides[0] * es : g.width;
  g.dpitch = p.dst_ix.rank ? p.dst_ix.strides[0] * es : g.width;
  return g;
}

}  // namespace

Status run_copies(std::span<const CopyJob> jobs, cudaStream_t stream) {
  SegTable table;
  const CopyJob* held[kSegMax];
  int count = 0;
  int64_t most = 0;  // the largest part's bytes: the grid's width
  auto flush = [&]() -> Status {
    if (count == 1) KILN_RETURN_IF_ERROR(run_copy(*held[0]->plan, held[0]->src, held[0]->dst, stream));
    if (count > 1) {
      const int64_t blocks = std::clamp<int64_t>((most + 16 * kBlock - 1) / (16 * kBlock), 1, 64);
      segments_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(count)), kBlock, 0,
                        stream>>>(table);
      KILN_CUDA_LAUNCH_CHECK("batched copy kernel");
    }
    count = 0;
    most = 0;
    return Status::Ok();
  };
  for (const CopyJob& j : jobs) {
    if (j.plan->kind == CopyPlan::Kind::kEmpty) continue;
    if (!batchable(*j.plan)) {
      KILN_RETURN_IF_ERROR(flush());
      KILN_RETURN_IF_ERROR(run_copy(*j.plan, j.src, j.dst, stream));
      continue;
    }
    held[count] = &j;
    table.s[count++] = segment(j);
    most = std::max(most, j.plan->n * static_cast<int64_t>(j.plan->esize));
    if (count == kSegMax) KILN_RETURN_IF_ERROR(flush());
  }
  return flush();
}

}  // namespace kiln::gpu::movement_detail
