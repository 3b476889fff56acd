// NonMaxSuppression on the GPU, a data-dependent layer (layer.h: kDataDependent): the selected
// (batch, class, box) rows go to Y at the count the data gives, the count to
// RunContext::out_dims. Per (batch, class) segment, as src/ops/detection.cpp computes it:
//   1. keys: a box's score as an order-preserving unsigned key (0 for a NaN score or one not
//      above score_threshold: never a candidate), and each segment's candidate count;
//   2. CUB's stable segmented radix sort, descending: candidates by score, equal scores by index;
//   3. the suppression mask, torchvision's CUDA form: bit j of row i says that candidate j (later
//      in the order) overlaps candidate i by IoU > threshold, 64 candidates a word, computed in
//      tiles of 64 x 64 in parallel;
//   4. the greedy pass, a block per segment: 64 candidates at a time in one lane (the chunk's
//      own bits applied as boxes are kept), then every thread ORs the kept rows into the removed
//      bits, until max_output_boxes_per_class are kept. detection.nms.staged first loads the
//      chunk's 64 own words into shared memory, all at once: the lane's walk then waits on no
//      global load (detection.nms waits on one per kept box, 1.4 ms for 2,316 candidates);
//   5. one block lays the segments' kept boxes out in order and writes the count.
// The IoU test is the reference's own code (`sampling::suppresses`, ops/sampling_math.h), in float
// (double for float64 boxes).
#include <cub/device/device_segmented_radix_sort.cuh>
#include <cuda_fp16.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device_util.cuh"
#include "ops/sampling_math.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(p[i]);
  else return static_cast<float>(p[i]);
}
__device__ __forceinline__ double load(const double* p, int64_t i) { return p[i]; }

// Order-preserving key of a float (larger float, larger key); NaN never reaches here.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T>
__global__ void nms_keys(const T* __restrict__ scores, int64_t segments, int64_t n,
                         bool has_threshold, float threshold, uint32_t* __restrict__ keys,
                         int* __restrict__ idx, int* __restrict__ valid) {
  KILN_GRID_STRIDE(i, segments * n) {
    const float s = load(scores, i);
    const bool ok = s == s && (!has_threshold || s > threshold);
    // 0 marks a non-candidate: no float's key is 0 (that would be a NaN's bits).
    keys[i] = ok ? order_key(s) : 0u;
    idx[i] = static_cast<int>(i % n);
    if (ok) atomicAdd(valid + i / n, 1);
  }
}

// The sort's segment offsets, s * n, made on the device at every run: the workspace is every
// layer's scratch, so nothing written to it outlives the run that wrote it.
__global__ void nms_offsets(int* __restrict__ offsets, int64_t segments, int64_t n) {
  KILN_GRID_STRIDE(s, segments + 1) offsets[s] = static_cast<int>(s * n);
}

// Grid (column tiles, row tiles, segments); a block of 64 threads: row i of the tile against the
// tile's 64 columns, one word of the mask.
template <typename T, typename Cp>
__global__ void nms_mask(const T* __restrict__ boxes, const int* __restrict__ order,
                         const int* __restrict__ valid, int64_t n, int64_t classes, bool center,
                         Cp threshold, int64_t words, uint64_t* __restrict__ mask) {
  const int64_t seg = blockIdx.z, b = seg / classes;
  const int64_t v = valid[seg];
  const int64_t row0 = int64_t(blockIdx.y) * 64, col0 = int64_t(blockIdx.x) * 64;
  if (row0 >= v || col0 >= v || col0 + 63 < row0) return;  // outside, or wholly before the rows
  __shared__ Cp cols[64 * 4];
  const int t = threadIdx.x;
  const int* ord = order + seg * n;
  if (col0 + t < v) {
    const int64_t j = ord[col0 + t];
    for (int d = 0; d < 4; ++d) cols[t * 4 + d] = load(boxes, (b * n + j) * 4 + d);
  }
  __syncthreads();
  const int64_t i = row0 + t;
  if (i >= v) return;
  Cp row[4];
  const int64_t bi = ord[i];
  for (int d = 0; d < 4; ++d) row[d] = load(boxes, (b * n + bi) * 4 + d);
  uint64_t bits = 0;
  const int64_t cols_here = min(int64_t(64), v - col0);
  for (int c = 0; c < cols_here; ++c)
    if (col0 + c > i && sampling::suppresses<Cp>(&cols[c * 4], row, center, threshold)) bits |= 1ull << c;
  mask[(seg * n + i) * words + blockIdx.x] = bits;
}

// A block per segment: the greedy pass; kept candidates' box indices to kept_idx, their count to
// kept_count. kStaged: the chunk's own mask words are read into shared memory first.
template <bool kStaged>
__global__ void nms_greedy(const int* __restrict__ order, const int* __restrict__ valid,
                           const uint64_t* __restrict__ mask, int64_t n, int64_t words,
                           int64_t max_out, int* __restrict__ kept_idx,
                           int* __restrict__ kept_count) {
  extern __shared__ uint64_t removed[];
  __shared__ uint64_t own[64];  // kStaged: row i's word of its own chunk, at i % 64
  __shared__ int chunk_kept[64];
  __shared__ int n_chunk, total;
  const int64_t seg = blockIdx.x, v = valid[seg];
  const int* ord = order + seg * n;
  const uint64_t* m = mask + seg * n * words;
  for (int64_t w = threadIdx.x; w < words; w += blockDim.x) removed[w] = 0;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  for (int64_t w = 0; w * 64 < v; ++w) {
    if (total >= max_out) break;
    const int64_t end = min(v, (w + 1) * 64);
    if constexpr (kStaged) {
      if (threadIdx.x < end - w * 64) own[threadIdx.x] = m[(w * 64 + threadIdx.x) * words + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      uint64_t r = removed[w];
      int k = 0;
      for (int64_t i = w * 64; i < end && total + k < max_out; ++i) {
        if (r >> (i - w * 64) & 1ull) continue;
        chunk_kept[k++] = static_cast<int>(i);
        r |= kStaged ? own[i - w * 64] : m[i * words + w];  // this chunk's later candidates
      }
      n_chunk = k;
    }
    __syncthreads();
    const int k = n_chunk;
    // Eight kept rows' words loaded before any is used: the loads overlap instead of each
    // waiting for the last (a chunk's 64 rows took 64 round trips to memory a thread).
    for (int64_t x = w + 1 + threadIdx.x; x < words; x += blockDim.x) {
      uint64_t r[8] = {removed[x], 0, 0, 0, 0, 0, 0, 0};
      int q = 0;
      for (; q + 8 <= k; q += 8) {
        uint64_t v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) v[u] = m[int64_t(chunk_kept[q + u]) * words + x];
#pragma unroll
        for (int u = 0; u < 8; ++u) r[u] |= v[u];
      }
      for (; q < k; ++q) r[0] |= m[int64_t(chunk_kept[q]) * words + x];
      removed[x] = r[0] | r[1] | r[2] | r[3] | r[4] | r[5] | r[6] | r[7];
    }
    if (threadIdx.x < k) kept_idx[seg * n + total + threadIdx.x] = ord[chunk_kept[threadIdx.x]];
    __syncthreads();
    if (threadIdx.x == 0) total += k;
    __syncthreads();
  }
  if (threadIdx.x == 0) kept_count[seg] = total;
}

// One block: segment s's kept boxes at rows [sum of counts before s, +count), (b, c, box).
__global__ void nms_write(const int* __restrict__ kept_idx, const int* __restrict__ kept_count,
                          int64_t segments, int64_t n, int64_t classes, int64_t* __restrict__ y,
                          int64_t* out_dims) {
  __shared__ int64_t base;
  if (threadIdx.x == 0) base = 0;
  __syncthreads();
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t cnt = kept_count[s];
    for (int64_t k = threadIdx.x; k < cnt; k += blockDim.x) {
      int64_t* r = y + (base + k) * 3;
      r[0] = s / classes;
      r[1] = s % classes;
      r[2] = kept_idx[s * n + k];
    }
    __syncthreads();
    if (threadIdx.x == 0) base += cnt;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out_dims[0] = base;
    out_dims[1] = 3;
  }
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

class NmsLayer final : public Layer {
 public:
  NmsLayer(const LayerDesc& d, bool staged)
      : center_(d.node->attrs.get_int("center_point_box", 0) == 1), staged_(staged) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const DeviceTensor& boxes = in[0];
    const DeviceTensor& scores = in[1];
    if (boxes.rank() != 3 || boxes.shape[2] != 4 || scores.rank() != 3 ||
        scores.shape[0] != boxes.shape[0] || scores.shape[2] != boxes.shape[1])
      return KILN_ERROR("boxes {} and scores {} are not [B, N, 4] and [B, C, N]",
                        shape_str(boxes.shape), shape_str(scores.shape));
    b_ = boxes.shape[0], n_ = boxes.shape[1], c_ = scores.shape[1];
    if (n_ > (int64_t{1} << 30) / std::max<int64_t>(b_ * c_, 1))
      return KILN_ERROR("{} boxes in {} segments is more than NonMaxSuppression takes", n_, b_ * c_);
    segments_ = b_ * c_;
    words_ = (n_ + 63) / 64;
    // The greedy pass keeps a segment's removed bits in shared memory.
    if (words_ * 8 > 160 * 1024)
      return KILN_ERROR("NonMaxSuppression of {} boxes a segment (at most {} on the GPU)", n_,
                        160 * 1024 * 8);
    const size_t items = static_cast<size_t>(segments_ * n_);
    sort_bytes_ = 0;
    cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, sort_bytes_, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), static_cast<int>(items),
        static_cast<int>(segments_), static_cast<const int*>(nullptr),
        static_cast<const int*>(nullptr) + 1);
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off = align256(off + bytes);
      return at;
    };
    keys_ = take(items * 4);
    keys_sorted_ = take(items * 4);
    idx_ = take(items * 4);
    order_ = take(items * 4);
    valid_ = take(segments_ * 4);
    offsets_ = take((segments_ + 1) * 4);
    mask_ = take(items * words_ * 8);
    kept_ = take(items * 4);
    count_ = take(segments_ * 4);
    sort_ = take(sort_bytes_);
    return off;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (!rc.out_dims) return KILN_ERROR("NonMaxSuppression runs only where its count is read back");
    auto* ws = static_cast<uint8_t*>(rc.workspace);
    int64_t max_out = 0;
    if (in.size() > 2 && in[2].host && in[2].host->numel() > 0)
      max_out = std::max<int64_t>(in[2].host->at_int(0), 0);
    double iou = 0;
    if (in.size() > 3 && in[3].host && in[3].host->numel() > 0) iou = in[3].host->at_double(0);
    if (!(iou >= 0 && iou <= 1))
      return KILN_ERROR("iou_threshold must be in [0, 1], got {}", iou);
    const bool has_st = in.size() > 4 && in[4].host && in[4].host->numel() > 0;
    const float st = has_st ? static_cast<float>(in[4].host->at_double(0)) : 0.f;
    auto* y = static_cast<int64_t*>(out[0].data);
    int* valid = reinterpret_cast<int*>(ws + valid_);
    int* count = reinterpret_cast<int*>(ws + count_);
    if (max_out == 0 || segments_ * n_ == 0) {
      KILN_CUDA_CHECK(cudaMemsetAsync(count, 0, segments_ * 4, rc.stream));
      nms_write<<<1, kThreads, 0, rc.stream>>>(reinterpret_cast<int*>(ws + kept_), count,
                                                segments_, n_, c_, y, rc.out_dims);
      KILN_CUDA_LAUNCH_CHECK("NonMaxSuppression");
      return Status::Ok();
    }
    KILN_CUDA_CHECK(cudaMemsetAsync(valid, 0, segments_ * 4, rc.stream));
    switch (in[0].dtype) {
      case DataType::kFloat32:
        return launch<float, float>(rc, in, ws, max_out, static_cast<float>(iou), has_st, st, y);
      case DataType::kFloat16:
        return launch<__half, float>(rc, in, ws, max_out, static_cast<float>(iou), has_st, st, y);
      case DataType::kFloat64:
        return launch<double, double>(rc, in, ws, max_out, iou, has_st, st, y);
      default:
        return KILN_ERROR("boxes of {} are not supported", dtype_name(in[0].dtype));
    }
  }

 private:
  template <typename T, typename Cp>
  Status launch(const RunContext& rc, std::span<const DeviceTensor> in, uint8_t* ws,
                int64_t max_out, Cp iou, bool has_st, float st, int64_t* y) {
    if (in[1].dtype != in[0].dtype) return KILN_ERROR("boxes and scores must be stored alike");
    const int64_t items = segments_ * n_;
    auto* keys = reinterpret_cast<uint32_t*>(ws + keys_);
    auto* keys_sorted = reinterpret_cast<uint32_t*>(ws + keys_sorted_);
    auto* idx = reinterpret_cast<int*>(ws + idx_);
    auto* order = reinterpret_cast<int*>(ws + order_);
    auto* valid = reinterpret_cast<int*>(ws + valid_);
    auto* offsets = reinterpret_cast<int*>(ws + offsets_);
    auto* mask = reinterpret_cast<uint64_t*>(ws + mask_);
    auto* kept = reinterpret_cast<int*>(ws + kept_);
    auto* count = reinterpret_cast<int*>(ws + count_);
    nms_offsets<<<grid_for(segments_ + 1), kThreads, 0, rc.stream>>>(offsets, segments_, n_);
    nms_keys<T><<<grid_for(items), kThreads, 0, rc.stream>>>(
        static_cast<const T*>(in[1].data), segments_, n_, has_st, st, keys, idx, valid);
    size_t sort_bytes = sort_bytes_;
    if (cub::DeviceSegmentedRadixSort::SortPairsDescending(
            ws + sort_, sort_bytes, keys, keys_sorted, idx, order, static_cast<int>(items),
            static_cast<int>(segments_), offsets, offsets + 1, 0, 32, rc.stream) != cudaSuccess)
      return KILN_ERROR("NonMaxSuppression: the sort failed");
    const dim3 tiles(static_cast<unsigned>(words_), static_cast<unsigned>(words_),
                     static_cast<unsigned>(segments_));
    nms_mask<T, Cp><<<tiles, 64, 0, rc.stream>>>(static_cast<const T*>(in[0].data), order, valid,
                                                 n_, c_, center_, iou, words_, mask);
    auto* greedy = staged_ ? nms_greedy<true> : nms_greedy<false>;
    if (words_ * 8 > 48 * 1024)
      KILN_CUDA_CHECK(cudaFuncSetAttribute(greedy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(words_ * 8)));
    greedy<<<static_cast<unsigned>(segments_), kThreads, words_ * 8, rc.stream>>>(
        order, valid, mask, n_, words_, max_out, kept, count);
    nms_write<<<1, kThreads, 0, rc.stream>>>(kept, count, segments_, n_, c_, y, rc.out_dims);
    KILN_CUDA_LAUNCH_CHECK("NonMaxSuppression");
    return Status::Ok();
  }

  bool center_, staged_;
  int64_t b_ = 0, n_ = 0, c_ = 0, segments_ = 0, words_ = 0;
  size_t sort_bytes_ = 0;
  size_t keys_ = 0, keys_sorted_ = 0, idx_ = 0, order_ = 0, valid_ = 0, offsets_ = 0, mask_ = 0,
         kept_ = 0, count_ = 0, sort_ = 0;
};

bool nms_supports(const LayerDesc& d, std::string* why) {
  if (!d.in[0].present() || !d.in[1].present()) return *why = "boxes and scores needed", false;
  if (d.in[0].layout != Layout::kLinear || d.in[1].layout != Layout::kLinear)
    return *why = "row-major boxes and scores only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_nms(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new NmsLayer(d, false));
}

Expected<std::unique_ptr<Layer>> create_nms_staged(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new NmsLayer(d, true));
}

// max_output_boxes_per_class, iou_threshold and score_threshold are read on the host.
constexpr uint32_t kHostThresholds = (1u << 2) | (1u << 3) | (1u << 4);

// A data-dependent layer is not timed: it takes the first tactic that supports it.
const TacticDef kTactics[] = {
    {"", "NonMaxSuppression", "detection.nms.staged", kF32 | kF16 | kF64 | kDataDependent,
     kHostThresholds, nms_supports, create_nms_staged},
    {"", "NonMaxSuppression", "detection.nms", kF32 | kF16 | kF64 | kDataDependent,
     kHostThresholds, nms_supports, create_nms},
};

}  // namespace

std::span<const TacticDef> nms_tactics() { return kTactics; }

}  // namespace kiln::gpu
