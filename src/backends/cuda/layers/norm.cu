// Row normalizations of the reduction family: Softmax, LogSoftmax, Hardmax (src/ops/softmax.cpp),
// LayerNormalization, InstanceNormalization, BatchNormalization (norm.cpp), RMSNormalization,
// GroupNormalization, LpNormalization and MeanVarianceNormalization (norm_extra.cpp).
// Statistics accumulate in float (double for float64). Rows of up to 256 elements run a warp
// per row with the row held in registers (one read, one write); longer rows a block per row
// that re-reads them (they stay in L1/L2), several loads per thread in flight.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> norm_tactics();

namespace {

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;

ParamPtr param(const DeviceTensor& t) { return {t.data, t.dtype}; }

template <typename A>
__device__ void store_as(void* p, DataType t, int64_t i, A v) {
  switch (t) {
    case DataType::kFloat16: store(static_cast<__half*>(p), i, v); break;
    case DataType::kBFloat16: store(static_cast<__nv_bfloat16*>(p), i, v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = static_cast<double>(v); break;
    default: static_cast<float*>(p)[i] = static_cast<float>(v); break;
  }
}

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {  // NaN-ignoring: NaN reaches the sums instead
  for (int m = 16; m > 0; m >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}
// Sum or max over the block (blockDim.x threads, a multiple of 32); all threads get it.
template <bool kMax, typename A>
__device__ A block_reduce(A v, A* sm) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int w = threadIdx.x / 32, nw = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) sm[w] = v;
  __syncthreads();
  v = sm[0];
  for (int k = 1; k < nw; ++k) v = kMax ? fmax(v, sm[k]) : v + sm[k];
  __syncthreads();
  return v;
}

// Rows up to kWarpRow elements run a warp per row with the row in registers (4 or 8 per lane);
// longer unrolled bodies cost more in instruction fetch than they save, so longer rows take a
// block per row, its size growing with the row.
constexpr int64_t kWarpRow = 256;
int block_for(int64_t n, int64_t rows) {
  if (rows < 256 && n >= 4096) return 1024;
  return n <= 512 ? 128 : n <= 2048 ? 256 : 512;
}

// --- Softmax / LogSoftmax / Hardmax ----------------------------------------------------------

enum class SKind { kSoftmax, kLogSoftmax, kHardmax };

// Hardmax's choice: a number beats NaN, the larger value wins, ties keep the lower index.
template <typename A>
__device__ __forceinline__ void hard_pick(A& v, int64_t& i, A v2, int64_t i2) {
  const bool n1 = isnan(v), n2 = isnan(v2);
  const bool take = n1 != n2 ? n1 : n1 ? i2 < i : (v2 > v || (v2 == v && i2 < i));
  if (take) v = v2, i = i2;
}

template <SKind K, int ITEMS, typename T>
__global__ void softmax_warp(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int n) {
  using A = Acc<T>;
  const int lane = threadIdx.x;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; row < rows;
       row += int64_t(gridDim.x) * blockDim.y) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    A v[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const int k = lane + 32 * j;
      v[j] = k < n ? static_cast<A>(load(xr, k)) : -std::numeric_limits<A>::infinity();
    }
    if constexpr (K == SKind::kHardmax) {
      A bv = std::numeric_limits<A>::quiet_NaN();
      int64_t bi = std::numeric_limits<int64_t>::max();
#pragma unroll
      for (int j = 0; j < ITEMS; ++j)
        if (lane + 32 * j < n) hard_pick(bv, bi, v[j], int64_t(lane + 32 * j));
      for (int m = 16; m > 0; m >>= 1) {
        const A v2 = __shfl_xor_sync(0xffffffffu, bv, m);
        const int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, m);
        hard_pick(bv, bi, v2, i2);
      }
      const int64_t arg = isnan(static_cast<A>(load(xr, 0))) ? 0 : bi;  // a NaN first stays
#pragma unroll
      for (int j = 0; j < ITEMS; ++j)
        if (lane + 32 * j < n) store(yr, lane + 32 * j, A(lane + 32 * j == arg ? 1 : 0));
    } else {
      A mx = v[0];
#pragma unroll
      for (int j = 1; j < ITEMS; ++j) mx = fmax(mx, v[j]);
      mx = warp_max(mx);
      A sum = 0;
#pragma unroll
      for (int j = 0; j < ITEMS; ++j)
        if (lane + 32 * j < n) {
          if constexpr (K == SKind::kSoftmax) v[j] = exp(v[j] - mx), sum += v[j];
          else sum += exp(v[j] - mx);
        }
      sum = warp_sum(sum);
      const A lse = K == SKind::kLogSoftmax ? log(sum) : A(0);
#pragma unroll
      for (int j = 0; j < ITEMS; ++j)
        if (lane + 32 * j < n)
          store(yr, lane + 32 * j, K == SKind::kSoftmax ? v[j] / sum : v[j] - mx - lse);
    }
  }
}

// A block per long row.
template <SKind K, typename T>
__global__ void __launch_bounds__(1024) softmax_block(const T* __restrict__ x, T* __restrict__ y,
                                                      int64_t rows, int64_t n) {
  using A = Acc<T>;
  __shared__ A sm[32];
  __shared__ int64_t smi[32];
  const int tid = threadIdx.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    if constexpr (K == SKind::kHardmax) {
      A bv = std::numeric_limits<A>::quiet_NaN();
      int64_t bi = std::numeric_limits<int64_t>::max();
      for (int64_t k = tid; k < n; k += blockDim.x) hard_pick(bv, bi, A(load(xr, k)), k);
      for (int m = 16; m > 0; m >>= 1) {
        const A v2 = __shfl_xor_sync(0xffffffffu, bv, m);
        const int64_t i2 = __shfl_xor_sync(0xffffffffu, bi, m);
        hard_pick(bv, bi, v2, i2);
      }
      if (tid % 32 == 0) sm[tid / 32] = bv, smi[tid / 32] = bi;
      __syncthreads();
      bv = sm[0], bi = smi[0];
      for (int w = 1; w < int(blockDim.x / 32); ++w) hard_pick(bv, bi, sm[w], smi[w]);
      __syncthreads();
      const int64_t arg = isnan(static_cast<A>(load(xr, 0))) ? 0 : bi;
      for (int64_t k = tid; k < n; k += blockDim.x) store(yr, k, A(k == arg ? 1 : 0));
    } else {
      // Four elements per thread in flight in each pass (the row stays in L1/L2).
      const int64_t B = blockDim.x;
      constexpr A kNegInf = -std::numeric_limits<A>::infinity();
      auto at = [&](int64_t k) { return k < n ? static_cast<A>(load(xr, k)) : kNegInf; };
      A mx = kNegInf;
      for (int64_t k = tid; k < n; k += 4 * B)
        mx = fmax(fmax(mx, fmax(at(k), at(k + B))), fmax(at(k + 2 * B), at(k + 3 * B)));
      mx = block_reduce<true>(mx, sm);
      A sum = 0;
      for (int64_t k = tid; k < n; k += 4 * B) {
        const A a0 = at(k), a1 = at(k + B), a2 = at(k + 2 * B), a3 = at(k + 3 * B);
        sum += (k < n ? exp(a0 - mx) : A(0)) + (k + B < n ? exp(a1 - mx) : A(0)) +
               (k + 2 * B < n ? exp(a2 - mx) : A(0)) + (k + 3 * B < n ? exp(a3 - mx) : A(0));
      }
      sum = block_reduce<false>(sum, sm);
      const A lse = log(sum);
      for (int64_t k = tid; k < n; k += 4 * B) {
        A d[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) d[u] = at(k + u * B) - mx;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (k + u * B < n)
            store(yr, k + u * B, K == SKind::kSoftmax ? exp(d[u]) / sum : d[u] - lse);
      }
    }
  }
}

// Normalising over a non-last axis: a thread per (outer, inner) column, in the reference's
// exact order (max: the first element unless a later one is greater).
template <SKind K, typename T>
__global__ void softmax_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                             int64_t n, int64_t inner) {
  using A = Acc<T>;
  KILN_GRID_STRIDE(c, outer * inner) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    int64_t arg = 0;
    A mx = load(x, base);
    for (int64_t k = 1; k < n; ++k) {
      const A v = load(x, base + k * inner);
      if (v > mx) mx = v, arg = k;
    }
    if constexpr (K == SKind::kHardmax) {
      for (int64_t k = 0; k < n; ++k) store(y, base + k * inner, A(k == arg ? 1 : 0));
    } else {
      A sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += exp(A(load(x, base + k * inner)) - mx);
      const A lse = log(sum);
      for (int64_t k = 0; k < n; ++k) {
        const A d = A(load(x, base + k * inner)) - mx;
        store(y, base + k * inner, K == SKind::kSoftmax ? exp(d) / sum : d - lse);
      }
    }
  }
}

// Softmax of a float16/bfloat16 model, rounded after each step as the CPU reference (and the
// ONNX reference, computing in the type) does: a thread per (outer, inner) column in the
// reference's order; bfloat16 sums element by element in bfloat16, float16 in double.
template <typename T>
__device__ __forceinline__ double round16(double v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(__float2half_rn(float(v)));
  else return __bfloat162float(__float2bfloat16_rn(float(v)));
}
template <typename T>
__global__ void softmax16_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                               int64_t n, int64_t inner) {
  KILN_GRID_STRIDE(c, outer * inner) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    double mx = load(x, base);
    for (int64_t k = 1; k < n; ++k) mx = fmax(mx, double(load(x, base + k * inner)));
    if (isnan(double(load(x, base)))) mx = load(x, base);
    double sum = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double e = round16<T>(exp(round16<T>(double(load(x, base + k * inner)) - mx)));
      store(y, base + k * inner, e);  // exact: e is rounded to T
      sum = std::is_same_v<T, __nv_bfloat16> ? round16<T>(sum + e) : sum + e;
    }
    sum = round16<T>(sum);
    for (int64_t k = 0; k < n; ++k)
      store(y, base + k * inner, round16<T>(double(load(y, base + k * inner)) / sum));
  }
}

template <SKind K, typename T>
void launch_softmax(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, cudaStream_t s) {
  if (inner != 1) {
    softmax_cols<K, T><<<grid_for(outer * inner), kBlock, 0, s>>>(x, y, outer, n, inner);
  } else if (n <= kWarpRow) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((outer + 7) / 8, 65535 * 8));
    const dim3 block(32, 8);
    const int ni = static_cast<int>(n);
    if (n <= 128) softmax_warp<K, 4, T><<<grid, block, 0, s>>>(x, y, outer, ni);
    else softmax_warp<K, 8, T><<<grid, block, 0, s>>>(x, y, outer, ni);
  } else {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(outer, 65535 * 8));
    softmax_block<K, T><<<grid, block_for(n, outer), 0, s>>>(x, y, outer, n);
  }
}

bool float_input(const LayerDesc& d, std::string* why) {
  if (!dtype_is_float(d.in[0].dtype))
    return *why = "float types only, got " + std::string(dtype_name(d.in[0].dtype)), false;
  return true;
}

class SoftmaxLayer final : public Layer {
 public:
  explicit SoftmaxLayer(const LayerDesc& d)
      : node_(d.node),
        kind_(d.node->op_type == "Softmax"      ? SKind::kSoftmax
              : d.node->op_type == "LogSoftmax" ? SKind::kLogSoftmax
                                                : SKind::kHardmax),
        // A 16-bit model's Softmax rounds as the reference does (not one stored in 16 bits
        // only for speed: --fp16 of a float32 model keeps the fast kernels).
        round16_(kind_ == SKind::kSoftmax && d.in_type(0).dtype == d.in[0].dtype &&
                 (d.in[0].dtype == DataType::kFloat16 || d.in[0].dtype == DataType::kBFloat16)) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const Node& n = *node_;
    const auto& s = in[0].shape;
    const int64_t rank = in[0].rank();
    if (rank == 0) return KILN_ERROR("{}: input must have rank >= 1, got a scalar", n.label());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), rank, n));
    outer_ = n_ = inner_ = 1;
    for (int64_t i = 0; i < axis; ++i) outer_ *= s[i];
    if (n.attrs.get_int("kiln_legacy_2d", 0) != 0) {
      for (int64_t i = axis; i < rank; ++i) n_ *= s[i];
    } else {
      n_ = s[axis];
      for (int64_t i = axis + 1; i < rank; ++i) inner_ *= s[i];
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (outer_ * n_ * inner_ == 0) return Status::Ok();
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in[0].data);
      T* y = static_cast<T*>(out[0].data);
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
        if (round16_) {
          softmax16_cols<T><<<grid_for(outer_ * inner_), kBlock, 0, rc.stream>>>(x, y, outer_,
                                                                                 n_, inner_);
          return;
        }
      }
      if (kind_ == SKind::kSoftmax)
        launch_softmax<SKind::kSoftmax>(x, y, outer_, n_, inner_, rc.stream);
      else if (kind_ == SKind::kLogSoftmax)
        launch_softmax<SKind::kLogSoftmax>(x, y, outer_, n_, inner_, rc.stream);
      else
        launch_softmax<SKind::kHardmax>(x, y, outer_, n_, inner_, rc.stream);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("softmax kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  SKind kind_;
  bool round16_ = false;
  int64_t outer_ = 0, n_ = 0, inner_ = 0;
};

// --- row normalizations ----------------------------------------------------------------------

// kMeanVar: (x - mean) / sqrt(var + eps); kRms: x / sqrt(mean(x^2) + eps); kL1/kL2: x / ||x||.
enum class Stat { kMeanVar, kRms, kL1, kL2 };

// How an element (row o, position r in the row) finds its scale or bias element.
// kGroupChanMinor: kGroupChan with the row's channel innermost (NHWC storage of
// GroupNormalization with one group: a row walks h, w, channel).
enum class PMode : int { kNone, kByR, kChannel, kGroupChan, kGroupChanMinor, kGroupRow, kFull };
struct ParamMap {
  PMode mode = PMode::kNone;
  bool ident = false;  // kByR / kFull: the index is r itself
  StridedIndex ix;     // kByR: over the row's dims; kFull: over all of x's dims
  ParamPtr p;
  int64_t C = 1, G = 1, inner = 1;
  __device__ int64_t index(int64_t o, int64_t r, int64_t R) const {
    switch (mode) {
      case PMode::kByR: return ident ? r : ix.offset(r);
      case PMode::kChannel: return o % C;
      case PMode::kGroupChan: return (o % G) * (C / G) + r / inner;
      case PMode::kGroupChanMinor: return (o % G) * (C / G) + r % (C / G);
      case PMode::kGroupRow: return o % G;
      case PMode::kFull: return ix.offset(o * R + r);
      default: return 0;
    }
  }
  // Contiguous-row fast paths: kByR with identity, or an index fixed per row, or per channel
  // of a group (GroupNormalization).
  bool simple(bool group_ok) const {
    return mode != PMode::kFull && (mode != PMode::kByR || ident) &&
           (group_ok || (mode != PMode::kGroupChan && mode != PMode::kGroupChanMinor));
  }
};

// A parameter of the fast paths, resolved for one row: element p[r / div] (div 0: p[0]), or
// p[r % mod] where mod is set.
template <typename T>
struct RowParam {
  const T* p = nullptr;  // nullptr: absent
  uint32_t div = 1, mod = 0;
  __device__ RowParam(const ParamMap& m, int64_t o) {
    int64_t b = 0;
    switch (m.mode) {
      case PMode::kNone: return;
      case PMode::kChannel: b = o % m.C, div = 0; break;
      case PMode::kGroupRow: b = o % m.G, div = 0; break;
      case PMode::kGroupChan:
        b = (o % m.G) * (m.C / m.G), div = static_cast<uint32_t>(m.inner);
        break;
      case PMode::kGroupChanMinor:
        b = (o % m.G) * (m.C / m.G), mod = static_cast<uint32_t>(m.C / m.G);
        break;
      default: break;
    }
    p = static_cast<const T*>(m.p.p) + b;
  }
  template <typename A>
  __device__ __forceinline__ A at(uint32_t r, A none) const {
    if (!p) return none;
    if (mod) return static_cast<A>(load(p, r % mod));
    return static_cast<A>(load(p, div == 0 ? 0u : div == 1 ? r : r / div));
  }
};

struct NormGeom {
  int64_t rows = 0, R = 0;
  bool contig = true;      // row o is x[o*R, o*R + R); else kept/red strided indices
  StridedIndex kept, red;
  double eps = 0;
  ParamMap scale, bias;
  void* mean_out = nullptr;  // LayerNormalization's optional Mean / InvStdDev (index o)
  void* inv_out = nullptr;
  DataType mean_t = DataType::kUndefined, inv_t = DataType::kUndefined;
  int pieces = 1;  // > 1: each row split over this many blocks (norm_split_*)
  __device__ int64_t base(int64_t o) const { return contig ? o * R : kept.offset(o); }
  __device__ int64_t elem(int64_t r) const { return contig ? r : red.offset(r); }
};

template <Stat S, typename A>
__device__ __forceinline__ A moment(A v) {
  if constexpr (S == Stat::kMeanVar) return v;
  else if constexpr (S == Stat::kL1) return v < A(0) ? -v : v;
  else return v * v;
}

// From the first sum (and for kMeanVar the centred second sum) to inv (1/stddev) or the norm;
// `mean` is already set for kMeanVar and 0 otherwise.
template <Stat S, typename A>
__device__ __forceinline__ A finalize(A s1, A s2, const NormGeom& g) {
  const A cnt = static_cast<A>(g.R > 0 ? g.R : 1);
  if constexpr (S == Stat::kMeanVar) return A(1) / sqrt(s2 / cnt + static_cast<A>(g.eps));
  else if constexpr (S == Stat::kRms) return A(1) / sqrt(s1 / cnt + static_cast<A>(g.eps));
  else if constexpr (S == Stat::kL1) return s1;
  else return sqrt(s1);
}

template <Stat S, typename A>
__device__ __forceinline__ A normalize(A v, A mean, A inv, A scale, A bias) {
  if constexpr (S == Stat::kL1 || S == Stat::kL2) return inv == A(0) ? A(0) : v / inv;  // 0 norm: 0
  else return (v - mean) * inv * scale + bias;
}

// Element r of row o with value v normalised, its scale and bias from the row's resolved
// parameters (kFast: RowParam) or through the generic index of any float type.
template <Stat S, bool kFast, typename T, typename A>
__device__ __forceinline__ A normalize_at(const NormGeom& g, const RowParam<T>& sc, const RowParam<T>& bi,
                                          int64_t o, int64_t r, A v, A mean, A inv) {
  A s = 1, b = 0;
  if constexpr (kFast) {
    s = sc.at(static_cast<uint32_t>(r), A(1));
    b = bi.at(static_cast<uint32_t>(r), A(0));
  } else {
    if (g.scale.mode != PMode::kNone) s = g.scale.p.get<A>(g.scale.index(o, r, g.R));
    if (g.bias.mode != PMode::kNone) b = g.bias.p.get<A>(g.bias.index(o, r, g.R));
  }
  return normalize<S>(v, mean, inv, s, b);
}

template <typename A>
__device__ void write_stats(const NormGeom& g, int64_t o, A mean, A inv) {
  if (g.mean_out) store_as(g.mean_out, g.mean_t, o, mean);
  if (g.inv_out) store_as(g.inv_out, g.inv_t, o, inv);
}

// Contiguous rows up to kWarpRow long, parameters stored as T with kByR/per-row indexing: a warp
// per row, the row in registers. 32-bit in-row indices keep the unrolled code small.
template <Stat S, int ITEMS, typename T>
__global__ void norm_warp(const T* __restrict__ x, T* __restrict__ y, NormGeom g) {
  using A = Acc<T>;
  const uint32_t lane = threadIdx.x, R = static_cast<uint32_t>(g.R);
  for (int64_t o = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; o < g.rows;
       o += int64_t(gridDim.x) * blockDim.y) {
    const T* xr = x + o * g.R;
    T* yr = y + o * g.R;
    A v[ITEMS];
    A s1 = 0, s2 = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const uint32_t r = lane + 32 * j;
      v[j] = r < R ? static_cast<A>(load(xr, r)) : A(0);
      s1 += moment<S>(v[j]);
    }
    s1 = warp_sum(s1);
    A mean = 0;
    if constexpr (S == Stat::kMeanVar) {
      mean = s1 / static_cast<A>(R > 0 ? R : 1);
#pragma unroll
      for (int j = 0; j < ITEMS; ++j)
        if (lane + 32 * j < R) s2 += (v[j] - mean) * (v[j] - mean);
      s2 = warp_sum(s2);
    }
    const A inv = finalize<S>(s1, s2, g);
    const RowParam<T> sc(g.scale, o), bi(g.bias, o);
    // All parameter loads before any store, so that they are in flight together.
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
      const uint32_t r = lane + 32 * j;
      if (r < R) v[j] = normalize<S>(v[j], mean, inv, sc.at(r, A(1)), bi.at(r, A(0)));
    }
#pragma unroll
    for (int j = 0; j < ITEMS; ++j)
      if (lane + 32 * j < R) store(yr, lane + 32 * j, v[j]);
    if (lane == 0) write_stats(g, o, mean, inv);
  }
}

// Long rows (and every layout the warp kernel does not take): a block per row, kUnroll
// elements per thread in flight in every pass. kFast: contiguous rows shorter than 2^32 with
// fast-path parameters (RowParam); otherwise strided rows and parameters of any float type.
constexpr int kUnroll = 4;

template <Stat S, bool kFast, typename T>
__global__ void __launch_bounds__(1024) norm_block(const T* __restrict__ x, T* __restrict__ y,
                                                   NormGeom g) {
  using A = Acc<T>;
  __shared__ A sm[32];
  const int tid = threadIdx.x;
  const int64_t step = int64_t(kUnroll) * blockDim.x;
  for (int64_t o = blockIdx.x; o < g.rows; o += gridDim.x) {
    const int64_t base = g.base(o);
    auto off = [&](int64_t r) { return kFast ? r : g.elem(r); };
    auto at = [&](int64_t r) { return r < g.R ? static_cast<A>(load(x, base + off(r))) : A(0); };
    A s1 = 0, s2 = 0;
    for (int64_t r0 = tid; r0 < g.R; r0 += step) {
      A v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = at(r0 + u * int64_t(blockDim.x));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) s1 += moment<S>(v[u]);  // padding adds 0
    }
    s1 = block_reduce<false>(s1, sm);
    A mean = 0;
    if constexpr (S == Stat::kMeanVar) {
      mean = s1 / static_cast<A>(g.R > 0 ? g.R : 1);
      for (int64_t r0 = tid; r0 < g.R; r0 += step) {
        A v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = at(r0 + u * int64_t(blockDim.x));
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (r0 + u * int64_t(blockDim.x) < g.R) s2 += (v[u] - mean) * (v[u] - mean);
      }
      s2 = block_reduce<false>(s2, sm);
    }
    const A inv = finalize<S>(s1, s2, g);
    const RowParam<T> sc = kFast ? RowParam<T>(g.scale, o) : RowParam<T>(ParamMap{}, o);
    const RowParam<T> bi = kFast ? RowParam<T>(g.bias, o) : RowParam<T>(ParamMap{}, o);
    for (int64_t r0 = tid; r0 < g.R; r0 += step) {
      A v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * int64_t(blockDim.x);
        if (r >= g.R) continue;
        v[u] = normalize_at<S, kFast>(g, sc, bi, o, r, at(r), mean, inv);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * int64_t(blockDim.x);
        if (r < g.R) store(y, base + off(r), v[u]);
      }
    }
    if (tid == 0) write_stats(g, o, mean, inv);
  }
}

// Few long rows (GroupNormalization with few groups, InstanceNormalization of large images, at
// small batches): a block per row would leave most of the GPU idle (PoolFormer's 32 images of
// 64x56x56 made 32 blocks), so each row is split over `pieces` blocks. norm_split_stats writes
// each piece's sum and, for mean/variance, its centred sum of squares (two passes over the
// piece, the second from cache); norm_split_apply combines its row's pieces (Chan et al.'s
// pairwise update, exact to rounding) and normalises its own piece. Contiguous rows with the
// fast path's parameters (RowParam) only: launch_norm. kVec: rows whose
// length is a multiple of the 16-byte vector, read and written 16 bytes a thread at a time
// (2-byte loads leave too few bytes in flight to reach memory speed).
constexpr int64_t kMinSplitPiece = 4096, kPieceAlign = 8;
constexpr int kSplitThreads = 256;

// The pieces of a norm over `rows` rows of R: enough blocks to fill the GPU, none shorter
// than kMinSplitPiece; 1 where a block per row already does.
int split_pieces(int64_t rows, int64_t R) {
  if (rows >= 256 || R < 2 * kMinSplitPiece) return 1;
  return static_cast<int>(std::min<int64_t>({(1024 + rows - 1) / rows, R / kMinSplitPiece, 64}));
}

// Piece p of a row of R: [begin, end), a whole number of kPieceAlign elements (so of vectors)
// except at the row's end; the last pieces may be empty.
struct Piece {
  int64_t begin, end;
  __host__ __device__ Piece(int64_t R, int pieces, int p) {
    const int64_t len = ((R + pieces - 1) / pieces + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
    begin = len * p < R ? len * p : R;
    end = begin + len < R ? begin + len : R;
  }
};

// Calls f(r, value) for each element of [begin, end) of the row at x + base, kUnroll loads in
// flight a thread (kVec: 16-byte vectors, begin and end multiples of the vector).
template <bool kVec, typename T, typename A, typename F>
__device__ __forceinline__ void for_piece(const T* __restrict__ x, int64_t base, const NormGeom& g,
                                          int64_t begin, int64_t end, F&& f) {
  if constexpr (kVec) {
    constexpr int V = Vec16<T>::kN;
    const auto* xv = reinterpret_cast<const Vec16<T>*>(x + base);
#pragma unroll 4
    for (int64_t u = begin / V + threadIdx.x; u < end / V; u += blockDim.x) {
      const Vec16<T> q = xv[u];
#pragma unroll
      for (int j = 0; j < V; ++j) f(u * V + j, static_cast<A>(load(q.v, j)));
    }
  } else {
    const int64_t step = int64_t(kUnroll) * blockDim.x;
    for (int64_t r0 = begin + threadIdx.x; r0 < end; r0 += step) {
      A v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t r = r0 + u * int64_t(blockDim.x);
        v[u] = r < end ? static_cast<A>(load(x, base + g.elem(r))) : A(0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (r0 + u * int64_t(blockDim.x) < end) f(r0 + u * int64_t(blockDim.x), v[u]);
    }
  }
}

template <Stat S, bool kVec, typename T>
__global__ void __launch_bounds__(kSplitThreads) norm_split_stats(const T* __restrict__ x, NormGeom g,
                                                                  Acc<T>* __restrict__ ws) {
  using A = Acc<T>;
  __shared__ A sm[32];
  const int64_t o = blockIdx.y, base = g.base(o);
  const Piece pc(g.R, g.pieces, blockIdx.x);
  A s1 = 0, s2 = 0;
  for_piece<kVec, T, A>(x, base, g, pc.begin, pc.end, [&](int64_t, A v) { s1 += moment<S>(v); });
  s1 = block_reduce<false>(s1, sm);
  if constexpr (S == Stat::kMeanVar) {
    const A mean = s1 / static_cast<A>(pc.end > pc.begin ? pc.end - pc.begin : 1);
    for_piece<kVec, T, A>(x, base, g, pc.begin, pc.end,
                          [&](int64_t, A v) { s2 += (v - mean) * (v - mean); });
    s2 = block_reduce<false>(s2, sm);
  }
  if (threadIdx.x == 0) {
    ws[2 * (o * g.pieces + blockIdx.x)] = s1;
    ws[2 * (o * g.pieces + blockIdx.x) + 1] = s2;
  }
}

template <Stat S, bool kVec, typename T>
__global__ void __launch_bounds__(kSplitThreads) norm_split_apply(const T* __restrict__ x, T* __restrict__ y,
                                                                  NormGeom g, const Acc<T>* __restrict__ ws) {
  using A = Acc<T>;
  const int64_t o = blockIdx.y, base = g.base(o);
  // The row's statistics from its pieces (every thread alike; at most 64 pieces).
  A s1 = 0, mean = 0, m2 = 0, n = 0;
  for (int q = 0; q < g.pieces; ++q) {
    const Piece pq(g.R, g.pieces, q);
    if (pq.end <= pq.begin) continue;
    const A ps1 = ws[2 * (o * g.pieces + q)];
    s1 += ps1;
    if constexpr (S == Stat::kMeanVar) {
      const A c = static_cast<A>(pq.end - pq.begin), d = ps1 / c - mean, tot = n + c;
      mean += d * (c / tot);
      m2 += ws[2 * (o * g.pieces + q) + 1] + d * d * (n * c / tot);
      n = tot;
    }
  }
  if constexpr (S != Stat::kMeanVar) mean = 0;
  const A inv = finalize<S>(s1, m2, g);
  const Piece pc(g.R, g.pieces, blockIdx.x);
  const RowParam<T> sc(g.scale, o), bi(g.bias, o);
  auto value = [&](int64_t r, A v) { return normalize_at<S, true>(g, sc, bi, o, r, v, mean, inv); };
  if constexpr (kVec) {
    constexpr int V = Vec16<T>::kN;
    const auto* xv = reinterpret_cast<const Vec16<T>*>(x + base);
    auto* yv = reinterpret_cast<Vec16<T>*>(y + base);
#pragma unroll 2
    for (int64_t u = pc.begin / V + threadIdx.x; u < pc.end / V; u += blockDim.x) {
      const Vec16<T> q = xv[u];
      Vec16<T> w;
#pragma unroll
      for (int j = 0; j < V; ++j) store(w.v, j, value(u * V + j, static_cast<A>(load(q.v, j))));
      yv[u] = w;
    }
  } else {
    for_piece<false, T, A>(x, base, g, pc.begin, pc.end,
                           [&](int64_t r, A v) { store(y, base + g.elem(r), value(r, v)); });
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) write_stats(g, o, mean, inv);
}

// Bytes of the split path's workspace: a sum and a centred sum of squares a piece.
size_t split_ws_bytes(const NormGeom& g) {
  return g.pieces > 1 ? size_t(g.rows) * size_t(g.pieces) * 2 * sizeof(double) : 0;
}

template <Stat S, typename T>
void launch_norm(const T* x, T* y, DataType dtype, const NormGeom& g, void* ws, cudaStream_t s) {
  const bool typed = (g.scale.mode == PMode::kNone || g.scale.p.t == dtype) &&
                     (g.bias.mode == PMode::kNone || g.bias.p.t == dtype);
  const bool fast = typed && g.contig && g.R < (int64_t(1) << 32) && g.scale.simple(true) &&
                    g.bias.simple(true);
  // The split path takes contiguous rows with the fast path's parameters (what test-backend-ops
  // has run on a GPU); strided rows and parameters of another type keep a block per row.
  if (g.pieces > 1 && fast) {
    const dim3 grid(static_cast<unsigned>(g.pieces), static_cast<unsigned>(g.rows));
    auto* acc = static_cast<Acc<T>*>(ws);
    const bool vec = g.R % Vec16<T>::kN == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(y) % 16 == 0;
    if (vec) {
      norm_split_stats<S, true, T><<<grid, kSplitThreads, 0, s>>>(x, g, acc);
      norm_split_apply<S, true, T><<<grid, kSplitThreads, 0, s>>>(x, y, g, acc);
    } else {
      norm_split_stats<S, false, T><<<grid, kSplitThreads, 0, s>>>(x, g, acc);
      norm_split_apply<S, false, T><<<grid, kSplitThreads, 0, s>>>(x, y, g, acc);
    }
    return;
  }
  const bool warp = fast && g.scale.simple(false) && g.bias.simple(false) && g.R <= kWarpRow;
  if (!warp) {
    // Few rows: bigger blocks, so that more of the GPU works on each row.
    const int threads = block_for(g.R, g.rows);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(g.rows, 65535 * 8));
    if (fast) norm_block<S, true, T><<<grid, threads, 0, s>>>(x, y, g);
    else norm_block<S, false, T><<<grid, threads, 0, s>>>(x, y, g);
    return;
  }
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((g.rows + 7) / 8, 65535 * 8));
  const dim3 block(32, 8);
  if (g.R <= 128) norm_warp<S, 4, T><<<grid, block, 0, s>>>(x, y, g);
  else norm_warp<S, 8, T><<<grid, block, 0, s>>>(x, y, g);
}

StridedIndex to_index(std::vector<int64_t> dims, std::vector<int64_t> strides) {
  std::vector<std::vector<int64_t>> st{std::move(strides)};
  coalesce_dims(dims, st);
  StridedIndex ix;
  ix.rank = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size() && d < size_t(kMaxDims); ++d)
    ix.dims[d] = dims[d], ix.strides[d] = st[0][d];
  return ix;
}

// A parameter broadcast (numpy, right-aligned) onto `target`: strides over target's dims.
Expected<std::vector<int64_t>> bcast_strides(const std::vector<int64_t>& p,
                                             const std::vector<int64_t>& target,
                                             const char* what, const Node& n) {
  bool ok = p.size() <= target.size();
  for (size_t k = 0; ok && k < p.size(); ++k) {
    const int64_t d = p[k], t = target[target.size() - p.size() + k];
    ok = d == t || d == 1;
  }
  if (!ok || target.size() > size_t(kMaxDims))
    return KILN_ERROR("{}: {} of shape {} cannot be broadcast to {}", n.label(), what,
                      shape_str(p), shape_str(target));
  const StridedIndex b = broadcast_index(p, target);
  return std::vector<int64_t>(b.strides, b.strides + b.rank);
}

// Scale/bias indexed by the position in the row (LayerNormalization's broadcast onto the
// normalised shape).
Expected<ParamMap> by_row_position(const DeviceTensor& p, const std::vector<int64_t>& norm_shape,
                                   const char* what, const Node& n) {
  KILN_ASSIGN_OR_RETURN(auto st, bcast_strides(p.shape, norm_shape, what, n));
  ParamMap m;
  m.mode = PMode::kByR;
  m.p = param(p);
  m.ix = to_index(norm_shape, st);
  m.ident = m.ix.rank == 1 && m.ix.strides[0] == 1;
  return m;
}

Stat stat_of(const Node& n) {
  if (n.op_type == "RMSNormalization") return Stat::kRms;
  if (n.op_type == "LpNormalization") return n.attrs.get_int("p", 2) == 1 ? Stat::kL1 : Stat::kL2;
  return Stat::kMeanVar;
}

// Rows for normalising over the axes in `mask` (MVN, LpNormalization): contiguous when the
// reduced axes are the trailing ones.
void rows_over_mask(NormGeom& g, const std::vector<int64_t>& s, const std::vector<bool>& mask) {
  const auto xs = row_major_strides(s);
  std::vector<int64_t> kd, ks, rd, rs;
  g.rows = g.R = 1;
  bool trailing = true, seen = false;
  for (size_t d = 0; d < s.size(); ++d) {
    if (mask[d]) {
      rd.push_back(s[d]), rs.push_back(xs[d]), g.R *= s[d], seen = true;
    } else {
      kd.push_back(s[d]), ks.push_back(xs[d]), g.rows *= s[d];
      if (seen && s[d] != 1) trailing = false;
    }
  }
  g.contig = trailing;
  g.kept = to_index(kd, ks);
  g.red = to_index(rd, rs);
}

class NormLayer final : public Layer {
 public:
  explicit NormLayer(const LayerDesc& d) : node_(d.node), stat_(stat_of(*d.node)) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    const auto& s = x.shape;
    const int64_t rank = x.rank();
    NormGeom g;
    g.eps = n.attrs.get_float("epsilon", 1e-5f);
    auto has = [&](size_t i) { return i < in.size() && in[i].present(); };
    const std::string& op = n.op_type;
    if (op == "LayerNormalization" || op == "RMSNormalization") {
      if (rank == 0) return KILN_ERROR("{}: X must have rank >= 1", n.label());
      KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), rank, n));
      const std::vector<int64_t> norm_shape(s.begin() + axis, s.end());
      g.rows = g.R = 1;
      for (int64_t i = 0; i < rank; ++i) (i < axis ? g.rows : g.R) *= s[i];
      if (!has(1)) return KILN_ERROR("{}: scale is required", n.label());
      if (op == "LayerNormalization") {
        KILN_ASSIGN_OR_RETURN(g.scale, by_row_position(in[1], norm_shape, "Scale", n));
        if (has(2)) {
          KILN_ASSIGN_OR_RETURN(g.bias, by_row_position(in[2], norm_shape, "B", n));
        }
        if (out.size() > 1 && out[1].present()) g.mean_t = out[1].dtype;
        if (out.size() > 2 && out[2].present()) g.inv_t = out[2].dtype;
      } else {
        // RMSNormalization broadcasts scale onto all of X.
        KILN_ASSIGN_OR_RETURN(auto st, bcast_strides(in[1].shape, s, "scale", n));
        const bool per_row_only =
            std::all_of(st.begin(), st.begin() + axis, [](int64_t v) { return v == 0; });
        if (per_row_only) {
          KILN_ASSIGN_OR_RETURN(g.scale, by_row_position(in[1], norm_shape, "scale", n));
        } else {
          g.scale.mode = PMode::kFull;
          g.scale.p = param(in[1]);
          g.scale.ix = to_index(s, st);
        }
      }
    } else if (op == "InstanceNormalization" || op == "GroupNormalization") {
      if (rank < 2) return KILN_ERROR("{}: X must have rank >= 2", n.label());
      if (!has(1) || !has(2)) return KILN_ERROR("{}: scale and bias are required", n.label());
      const int64_t N = s[0], C = s[1];
      int64_t inner = 1;
      for (int64_t i = 2; i < rank; ++i) inner *= s[i];
      int64_t G = C, want = C;
      PMode mode = PMode::kChannel;
      if (op == "GroupNormalization") {
        G = n.attrs.get_int("num_groups", 0);
        if (G <= 0 || C % G != 0)
          return KILN_ERROR("{}: num_groups {} must divide the {} channels", n.label(), G, C);
        const bool per_group = n.attrs.get_int("kiln_per_group", 0) != 0;
        mode = per_group ? PMode::kGroupRow : PMode::kGroupChan;
        want = per_group ? G : C;
      }
      for (size_t i = 1; i < 3; ++i)
        if (in[i].numel() != want || (op == "InstanceNormalization" && in[i].rank() != 1))
          return KILN_ERROR("{}: input {} has shape {}, expected {} values", n.label(), i,
                            shape_str(in[i].shape), want);
      g.rows = N * G;
      g.R = C / G * inner;
      // NHWC storage (one group only, norm_supports): the row is the image, channel innermost.
      if (x.layout == Layout::kNHWC) {
        if (G != 1 || rank != 4)
          return KILN_ERROR("{}: NHWC storage takes one group of a 4-D tensor", n.label());
        if (mode == PMode::kGroupChan) mode = PMode::kGroupChanMinor;
      }
      for (ParamMap* m : {&g.scale, &g.bias}) m->mode = mode, m->C = C, m->G = G, m->inner = inner;
      g.scale.p = param(in[1]);
      g.bias.p = param(in[2]);
    } else {  // LpNormalization, MeanVarianceNormalization
      std::vector<bool> mask(static_cast<size_t>(rank), false);
      if (op == "LpNormalization") {
        const int64_t p = n.attrs.get_int("p", 2);
        if (p != 1 && p != 2) return KILN_ERROR("{}: p must be 1 or 2, got {}", n.label(), p);
        KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), rank, n));
        mask[axis] = true;
      } else {
        g.eps = 1e-9;
        for (int64_t a : n.attrs.get_ints("axes", {0, 2, 3})) {
          KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(a, rank, n));
          mask[ax] = true;
        }
      }
      rows_over_mask(g, s, mask);
      if (g.kept.rank > kMaxDims || g.red.rank > kMaxDims)
        return KILN_ERROR("{}: too many non-contiguous axes in {}", n.label(), shape_str(s));
    }
    g.pieces = g.contig ? split_pieces(g.rows, g.R) : 1;
    g_ = g;
    return split_ws_bytes(g);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (g_.rows == 0) return Status::Ok();
    NormGeom g = g_;
    // Device pointers are only valid now: refresh them.
    if (g.scale.mode != PMode::kNone) g.scale.p.p = in[1].data;
    if (g.bias.mode != PMode::kNone) g.bias.p.p = in[2].data;
    if (g.mean_t != DataType::kUndefined) g.mean_out = out[1].data;
    if (g.inv_t != DataType::kUndefined) g.inv_out = out[2].data;
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in[0].data);
      T* y = static_cast<T*>(out[0].data);
      switch (stat_) {
        case Stat::kMeanVar: launch_norm<Stat::kMeanVar>(x, y, in[0].dtype, g, rc.workspace, rc.stream); break;
        case Stat::kRms: launch_norm<Stat::kRms>(x, y, in[0].dtype, g, rc.workspace, rc.stream); break;
        case Stat::kL1: launch_norm<Stat::kL1>(x, y, in[0].dtype, g, rc.workspace, rc.stream); break;
        case Stat::kL2: launch_norm<Stat::kL2>(x, y, in[0].dtype, g, rc.workspace, rc.stream); break;
      }
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("normalization kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  Stat stat_;
  NormGeom g_;
};

// --- BatchNormalization (inference) ----------------------------------------------------------

// Per-channel (or per-activation) factors: ws = [inv * scale | mean | bias].
template <typename A>
__global__ void bn_fold(ParamPtr scale, ParamPtr bias, ParamPtr mean, ParamPtr var, A eps,
                        A* ws, int64_t P) {
  KILN_GRID_STRIDE(k, P) {
    ws[k] = scale.get<A>(k) / sqrt(var.get<A>(k) + eps);
    ws[P + k] = mean.get<A>(k);
    ws[2 * P + k] = bias.get<A>(k);
  }
}

// Elements in storage order; I is uint32_t when the tensor allows (cheaper index math).
template <typename T, typename A, typename I>
__global__ void bn_apply(const T* __restrict__ x, T* __restrict__ y, const A* __restrict__ ws,
                         I n, I P, I C, I inner, bool nhwc, bool per_act) {
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < n; i += I(gridDim.x) * blockDim.x) {
    I k;
    if (nhwc) {
      const I c = i % C;
      k = per_act ? c * inner + (i / C) % inner : c;
    } else {
      k = per_act ? i % P : (i / inner) % C;
    }
    store(y, i, (static_cast<A>(load(x, i)) - ws[P + k]) * ws[k] + ws[2 * P + k]);
  }
}

bool bn_supports(const LayerDesc& d, std::string* why) {
  if (d.node->attrs.get_int("training_mode", 0) != 0)
    return *why = "training mode is not supported (inference only)", false;
  if (!float_input(d, why)) return false;
  for (size_t i = 1; i < 5; ++i)
    if (i >= d.in.size() || !dtype_is_float(d.in[i].dtype))
      return *why = "scale, B, mean and var must be float tensors", false;
  return true;
}

class BatchNormLayer final : public Layer {
 public:
  explicit BatchNormLayer(const LayerDesc& d)
      : node_(d.node), per_act_(d.node->attrs.get_int("kiln_per_activation", 0) != 0) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    if (x.rank() < 2) return KILN_ERROR("{}: X must have rank >= 2 (N, C, ...)", n.label());
    C_ = x.shape[1];
    inner_ = 1;
    for (int64_t i = 2; i < x.rank(); ++i) inner_ *= x.shape[i];
    P_ = per_act_ ? C_ * inner_ : C_;
    for (size_t i = 1; i < 5; ++i)
      if (in[i].numel() != P_ || (!per_act_ && in[i].rank() != 1))
        return KILN_ERROR("{}: input {} has shape {}, expected {} values", n.label(), i,
                          shape_str(in[i].shape), P_);
    n_ = x.numel();
    nhwc_ = x.layout == Layout::kNHWC && x.rank() == 4;
    const size_t acc = x.dtype == DataType::kFloat64 ? 8 : 4;
    return static_cast<size_t>(3 * P_) * acc;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    // Unconsumed running-statistics outputs of old opsets echo mean and var.
    for (size_t o = 1; o < out.size(); ++o) {
      const DeviceTensor& src = in[o % 2 ? 3 : 4];
      const size_t bytes = std::min(out[o].nbytes(), src.nbytes());
      if (out[o].present() && bytes > 0)
        KILN_CUDA_CHECK(cudaMemcpyAsync(out[o].data, src.data, bytes, cudaMemcpyDeviceToDevice,
                                        rc.stream));
    }
    if (n_ == 0) return Status::Ok();
    const float eps = node_->attrs.get_float("epsilon", 1e-5f);
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      using A = Acc<T>;
      A* ws = static_cast<A*>(rc.workspace);
      bn_fold<A><<<grid_for(P_), kBlock, 0, rc.stream>>>(param(in[1]), param(in[2]), param(in[3]),
                                                         param(in[4]), A(eps), ws, P_);
      const T* x = static_cast<const T*>(in[0].data);
      T* y = static_cast<T*>(out[0].data);
      if (n_ < (int64_t(1) << 32))
        bn_apply<T, A, uint32_t><<<grid_for(n_), kBlock, 0, rc.stream>>>(
            x, y, ws, uint32_t(n_), uint32_t(P_), uint32_t(C_), uint32_t(inner_), nhwc_, per_act_);
      else
        bn_apply<T, A, int64_t><<<grid_for(n_), kBlock, 0, rc.stream>>>(x, y, ws, n_, P_, C_,
                                                                        inner_, nhwc_, per_act_);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("batchnorm kernels");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool per_act_;
  bool nhwc_ = false;
  int64_t n_ = 0, C_ = 0, inner_ = 0, P_ = 0;
};

bool norm_supports(const LayerDesc& d, std::string* why) {
  if (!float_input(d, why)) return false;
  for (size_t i = 1; i < d.in.size(); ++i)
    if (d.in[i].dtype != DataType::kUndefined && !dtype_is_float(d.in[i].dtype))
      return *why = "parameters must be float tensors", false;
  if (d.node->op_type == "LpNormalization") {
    const int64_t p = d.node->attrs.get_int("p", 2);
    if (p != 1 && p != 2) return *why = "p must be 1 or 2", false;
  }
  // NHWC (GroupNormalization's and InstanceNormalization's candidates): where a row is the whole
  // image, contiguous in NHWC too (one group: PoolFormer's and ConvFormer's GroupNorm(1, C));
  // rows of several channels would be strided there.
  if (!d.in.empty() && d.in[0].layout == Layout::kNHWC &&
      (d.node->op_type != "GroupNormalization" || d.node->attrs.get_int("num_groups", 0) != 1))
    return *why = "NHWC rows are contiguous only for GroupNormalization with one group", false;
  return true;
}

template <typename L>
Expected<std::unique_ptr<Layer>> create(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new L(d));
}

constexpr uint32_t kFloatCaps = kF32 | kF16 | kF64;

const TacticDef kNormTactics[] = {
    {"", "Softmax", "norm.softmax", kFloatCaps, 0, float_input, create<SoftmaxLayer>},
    {"", "LogSoftmax", "norm.log_softmax", kFloatCaps, 0, float_input, create<SoftmaxLayer>},
    {"", "Hardmax", "norm.hardmax", kFloatCaps, 0, float_input, create<SoftmaxLayer>},
    {"", "LayerNormalization", "norm.layer", kFloatCaps, 0, norm_supports, create<NormLayer>},
    {"", "RMSNormalization", "norm.rms", kFloatCaps, 0, norm_supports, create<NormLayer>},
    {"", "InstanceNormalization", "norm.instance", kFloatCaps, 0, norm_supports,
     create<NormLayer>},
    {"", "GroupNormalization", "norm.group", kFloatCaps | kNHWC, 0, norm_supports,
     create<NormLayer>},
    {"", "LpNormalization", "norm.lp", kFloatCaps, 0, norm_supports, create<NormLayer>},
    {"", "MeanVarianceNormalization", "norm.mvn", kFloatCaps, 0, norm_supports,
     create<NormLayer>},
    {"", "BatchNormalization", "norm.batch", kFloatCaps | kNHWC, 0, bn_supports,
     create<BatchNormLayer>},
};

}  // namespace

std::span<const TacticDef> norm_tactics() { return kNormTactics; }

}  // namespace kiln::gpu
