// Layers whose output sizes depend on the data, and control flow: the executor's dynamic region
// runs them (dynamic.h). NonMaxSuppression is layers/nms.cu. NonZero writes its coordinates row-major at the count the data gives
// and the count to RunContext::out_dims; If, Loop and Scan launch nothing themselves (the
// executor runs their subgraphs' plans), so their tactics only carry the formats of their slots.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/device_util.cuh"
#include "tactics.h"

namespace kiln::gpu {
namespace {

// --- NonZero(X) -> int64 [rank, K], coordinates in row-major element order ------------------
// Three kernels, no host round trip: per-block counts over chunks of kChunk elements, one block
// that turns them into each chunk's first output column (and the count K, written to out_dims),
// then per chunk a pass in order that places each non-zero element at its column, a warp ballot
// and a block prefix per tile of kThreads elements.
constexpr int kThreads = 256;
constexpr int kTiles = 16;
constexpr int64_t kChunk = int64_t{kThreads} * kTiles;

struct Coords {
  int rank = 0;  // 0: a scalar, one row of zeros
  int64_t size[kMaxDynRank] = {};
};

template <typename T>
__device__ __forceinline__ bool nonzero(const T* x, int64_t i) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x[i]) != 0.f;  // NaN counts
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x[i]) != 0.f;
  else return x[i] != T(0);
}

template <typename T>
__global__ void nz_count(const T* __restrict__ x, int64_t n, int64_t* __restrict__ counts) {
  const int64_t base = blockIdx.x * kChunk;
  int c = 0;
  for (int t = 0; t < kTiles; ++t) {
    const int64_t i = base + t * kThreads + threadIdx.x;
    c += i < n && nonzero(x, i);
  }
  for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xffffffffu, c, o);
  __shared__ int warp_sum[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = c;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += warp_sum[w];
    counts[blockIdx.x] = s;
  }
}

// One block: counts[b] becomes chunk b's first column; the total goes to *total and out_dims.
__global__ void nz_scan(int64_t* __restrict__ counts, int64_t chunks, int64_t* __restrict__ total,
                        int64_t* out_dims, int64_t rows) {
  __shared__ int64_t s[kThreads];
  __shared__ int64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < chunks; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const int64_t v = i < chunks ? counts[i] : 0;
    s[threadIdx.x] = v;
    __syncthreads();
    for (int o = 1; o < kThreads; o <<= 1) {  // inclusive scan
      const int64_t add = threadIdx.x >= o ? s[threadIdx.x - o] : 0;
      __syncthreads();
      s[threadIdx.x] += add;
      __syncthreads();
    }
    if (i < chunks) counts[i] = carry + s[threadIdx.x] - v;
    __syncthreads();
    if (threadIdx.x == kThreads - 1) carry += s[threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *total = carry;
    out_dims[0] = rows;
    out_dims[1] = carry;
  }
}

template <typename T>
__global__ void nz_write(const T* __restrict__ x, int64_t n, const int64_t* __restrict__ first,
                         const int64_t* __restrict__ total, Coords c, int64_t* __restrict__ y) {
  const int64_t k = *total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ int warp_off[kThreads / 32 + 1];
  int64_t pos = first[blockIdx.x];
  const int64_t base = blockIdx.x * kChunk;
  for (int t = 0; t < kTiles; ++t) {
    const int64_t i = base + t * kThreads + threadIdx.x;
    const bool f = i < n && nonzero(x, i);
    const unsigned mask = __ballot_sync(0xffffffffu, f);
    if (lane == 0) warp_off[warp] = __popc(mask);
    __syncthreads();
    if (threadIdx.x == 0) {
      int s = 0;
      for (int w = 0; w < kThreads / 32; ++w) {
        const int v = warp_off[w];
        warp_off[w] = s;
        s += v;
      }
      warp_off[kThreads / 32] = s;
    }
    __syncthreads();
    if (f) {
      const int64_t col = pos + warp_off[warp] + __popc(mask & ((1u << lane) - 1u));
      if (c.rank == 0) {
        y[col] = 0;
      } else {
        int64_t rest = i;
        for (int d = c.rank - 1; d >= 0; --d) {
          y[d * k + col] = rest % c.size[d];
          rest /= c.size[d];
        }
      }
    }
    pos += warp_off[kThreads / 32];
    __syncthreads();
  }
}

class NonZeroLayer final : public Layer {
 public:
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    if (in[0].rank() > kMaxDynRank)
      return KILN_ERROR("NonZero of a rank-{} tensor (at most {})", in[0].rank(), kMaxDynRank);
    chunks_ = std::max<int64_t>((in[0].numel() + kChunk - 1) / kChunk, 1);
    return static_cast<size_t>((chunks_ + 1) * sizeof(int64_t));
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (!rc.out_dims) return KILN_ERROR("NonZero runs only where its count is read back");
    const DeviceTensor& x = in[0];
    Coords c;
    c.rank = static_cast<int>(x.rank());
    for (int d = 0; d < c.rank; ++d) c.size[d] = x.shape[d];
    auto* counts = static_cast<int64_t*>(rc.workspace);
    int64_t* total = counts + chunks_;
    auto* y = static_cast<int64_t*>(out[0].data);
    const int64_t n = x.numel();
    const int64_t rows = std::max(c.rank, 1);
    switch (x.dtype) {
      case DataType::kFloat32: return launch<float>(rc, x, n, counts, total, rows, c, y);
      case DataType::kFloat16: return launch<__half>(rc, x, n, counts, total, rows, c, y);
      case DataType::kBFloat16: return launch<__nv_bfloat16>(rc, x, n, counts, total, rows, c, y);
      case DataType::kFloat64: return launch<double>(rc, x, n, counts, total, rows, c, y);
      default: break;
    }
    // Integers and bools: non-zero bits, whatever their sign.
    switch (dtype_size(x.dtype)) {
      case 1: return launch<uint8_t>(rc, x, n, counts, total, rows, c, y);
      case 2: return launch<uint16_t>(rc, x, n, counts, total, rows, c, y);
      case 4: return launch<uint32_t>(rc, x, n, counts, total, rows, c, y);
      case 8: return launch<uint64_t>(rc, x, n, counts, total, rows, c, y);
      default: return KILN_ERROR("NonZero of {} is not supported", dtype_name(x.dtype));
    }
  }

 private:
  template <typename T>
  Status launch(const RunContext& rc, const DeviceTensor& x, int64_t n, int64_t* counts,
                int64_t* total, int64_t rows, const Coords& c, int64_t* y) const {
    const T* xp = static_cast<const T*>(x.data);
    const auto grid = static_cast<unsigned>(chunks_);
    nz_count<T><<<grid, kThreads, 0, rc.stream>>>(xp, n, counts);
    nz_scan<<<1, kThreads, 0, rc.stream>>>(counts, chunks_, total, rc.out_dims, rows);
    nz_write<T><<<grid, kThreads, 0, rc.stream>>>(xp, n, counts, total, c, y);
    KILN_CUDA_LAUNCH_CHECK("NonZero");
    return Status::Ok();
  }
  int64_t chunks_ = 1;
};

bool nonzero_supports(const LayerDesc& d, std::string* why) {
  if (d.in_type(0).rank() > kMaxDynRank) return *why = "rank above 8", false;
  if (d.in_type(0).has_rank() && d.in[0].layout != Layout::kLinear)
    return *why = "row-major input only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_nonzero(const LayerDesc&) {
  return std::unique_ptr<Layer>(new NonZeroLayer());
}

// If, Loop and Scan: the executor's dynamic region runs their subgraphs' plans.
class ControlFlowLayer final : public Layer {
 public:
  Status run(const RunContext&, std::span<const DeviceTensor>, std::span<const DeviceTensor>) override {
    return KILN_ERROR("control flow runs only in the executor's dynamic region");
  }
};

Expected<std::unique_ptr<Layer>> create_control(const LayerDesc&) {
  return std::unique_ptr<Layer>(new ControlFlowLayer());
}

constexpr uint32_t kAnyFloat = kF32 | kF16 | kF64;

const TacticDef kTactics[] = {
    {"", "NonZero", "data.nonzero", kAnyFloat | kDataDependent, 0, nonzero_supports,
     create_nonzero},
    {"", "If", "control.if", kAnyFloat, 0, nullptr, create_control},
    {"", "Loop", "control.loop", kAnyFloat, 0, nullptr, create_control},
    {"", "Scan", "control.scan", kAnyFloat, 0, nullptr, create_control},
};

}  // namespace

std::span<const TacticDef> nms_tactics();  // layers/nms.cu

std::span<const TacticDef> data_dependent_tactics() {
  static const std::vector<TacticDef> all = [] {
    std::vector<TacticDef> v(std::begin(kTactics), std::end(kTactics));
    for (const TacticDef& t : nms_tactics()) v.push_back(t);
    return v;
  }();
  return all;
}

}  // namespace kiln::gpu
