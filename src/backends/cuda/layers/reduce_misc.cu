// The rest of the reduction family: TopK (src/ops/index_sort.cpp), CumSum and CumProd
// (index_scan.cpp; CumProd gated until run on a GPU), QuantizeLinear, DequantizeLinear and
// DynamicQuantizeLinear (quant.cpp; int8/uint8/int16/uint16 targets; float8 and int4
// targets/inputs run in quant_low_bit.cu).
//
// TopK sorts each lane under the reference's strict order (wanted end first, NaN largest, ties by
// index), so the first k are exactly the reference's. Lanes of up to 1024 elements sort with a
// bitonic network in shared memory, a block per lane; up to 4096 (a detector's per-class scores)
// with CUB's stable block radix sort, a block per lane, over keys whose unsigned order is that
// order (eight digit passes where a network of 4096 takes 78 stages); longer ones (a detector's
// candidates before NMS) with CUB's device-wide radix sort over the same keys: a few launches
// whatever the length.
#include <algorithm>
#include <cmath>
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>
#include <limits>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "quant_common.cuh"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> reduce_misc_tactics();

namespace {

// --- TopK ------------------------------------------------------------------------------------

constexpr int64_t kSharedSortMax = 4096;
constexpr int64_t kBitonicMax = 1024;  // longer lanes, up to kSharedSortMax: the block radix sort
constexpr int kBlockSortThreads = 512, kBlockSortItems = 8;
static_assert(kBlockSortThreads * kBlockSortItems == kSharedSortMax);

struct TopKGeom {
  int64_t outer = 0, dim = 0, inner = 0, k = 0, P = 0;  // P: dim rounded up to a power of 2
  bool largest = true;
};

// Does (ka, ia) come before (kb, ib)? Padding (index >= dim) goes last.
template <typename K>
__device__ __forceinline__ bool before(K ka, int ia, K kb, int ib, int dim, bool largest) {
  const bool pa = ia >= dim, pb = ib >= dim;
  if (pa || pb) return pa && pb ? ia < ib : pb;
  bool na = false, nb = false;
  if constexpr (std::is_floating_point_v<K>) na = isnan(ka), nb = isnan(kb);
  if (na || nb) return na && nb ? ia < ib : (largest ? na : nb);
  if (ka != kb) return largest ? ka > kb : ka < kb;
  return ia < ib;
}

template <typename K>
__device__ __forceinline__ void compare_swap(K* key, int* idx, int64_t t, int64_t size,
                                             int64_t stride, int dim, bool largest) {
  const int64_t i = 2 * t - (t & (stride - 1)), j = i + stride;
  const bool up = (i & size) == 0;
  const bool swap = up ? before(key[j], idx[j], key[i], idx[i], dim, largest)
                       : before(key[i], idx[i], key[j], idx[j], dim, largest);
  if (swap) {
    const K kt = key[i];
    key[i] = key[j], key[j] = kt;
    const int it = idx[i];
    idx[i] = idx[j], idx[j] = it;
  }
}

template <typename T>
__device__ __forceinline__ void write_topk(const T* x, T* vals, int64_t* inds, const TopKGeom& g,
                                           int64_t lane, const int* idx, int64_t stride) {
  const int64_t o = lane / g.inner, i = lane % g.inner;
  const T* src = x + o * g.dim * g.inner + i;
  for (int64_t j = threadIdx.x; j < g.k; j += blockDim.x) {
    const int64_t e = idx[j * stride];
    vals[(o * g.k + j) * g.inner + i] = src[e * g.inner];
    inds[(o * g.k + j) * g.inner + i] = e;
  }
}

// Shared memory of the per-block sort: P int indices, then P keys (16-byte aligned).
__host__ __device__ inline int64_t shared_key_offset(int64_t P) { return (4 * P + 15) / 16 * 16; }

template <typename T>
__global__ void topk_shared(const T* __restrict__ x, T* vals, int64_t* inds, TopKGeom g) {
  using K = Compute<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  int* idx = reinterpret_cast<int*>(smem);
  K* key = reinterpret_cast<K*>(smem + shared_key_offset(g.P));
  const int dim = static_cast<int>(g.dim);
  for (int64_t lane = blockIdx.x; lane < g.outer * g.inner; lane += gridDim.x) {
    const T* src = x + (lane / g.inner) * g.dim * g.inner + lane % g.inner;
    for (int64_t e = threadIdx.x; e < g.P; e += blockDim.x) {
      key[e] = e < g.dim ? load(src, e * g.inner) : K{};
      idx[e] = static_cast<int>(e);
    }
    __syncthreads();
    for (int64_t size = 2; size <= g.P; size <<= 1)
      for (int64_t stride = size / 2; stride > 0; stride >>= 1) {
        for (int64_t t = threadIdx.x; t < g.P / 2; t += blockDim.x)
          compare_swap(key, idx, t, size, stride, dim, g.largest);
        __syncthreads();
      }
    write_topk(x, vals, inds, g, lane, idx, 1);
    __syncthreads();
  }
}

// The radix path. A value's key: unsigned, ascending in the reference's order (NaN largest, -0
// and +0 equal, signed integers with the sign bit flipped), inverted where the largest come
// first; the stable sort keeps ties by index. 64-bit types take 64-bit keys, the rest 32.
template <typename K>
using TopKKey = std::conditional_t<sizeof(K) == 8, uint64_t, uint32_t>;

template <typename U, typename K>
__device__ __forceinline__ U topk_key(K v, bool largest) {
  constexpr U top = U(1) << (8 * sizeof(U) - 1);
  U b;
  if constexpr (std::is_floating_point_v<K>) {
    b = ~U(0);
    if (!isnan(v)) {
      if (v == K(0)) v = K(0);
      if constexpr (sizeof(K) == 8)
        b = static_cast<U>(__double_as_longlong(v));
      else
        b = __float_as_uint(v);
      b = (b & top) ? ~b : (b | top);
    }
  } else if constexpr (std::is_same_v<K, bool>) {
    b = v ? 1 : 0;
  } else if constexpr (std::is_signed_v<K>) {
    b = static_cast<U>(static_cast<std::make_signed_t<U>>(v)) ^ top;
  } else {
    b = static_cast<U>(v);
  }
  return largest ? ~b : b;
}

// Keys and indices of every lane, lane-major ([lane][dim]), and the lanes' offsets.
template <typename T, typename U>
__global__ void topk_radix_fill(const T* __restrict__ x, U* key, int* idx, int* offsets,
                                TopKGeom g) {
  const int64_t lanes = g.outer * g.inner;
  KILN_GRID_STRIDE(e, lanes * g.dim) {
    const int64_t lane = e / g.dim, j = e % g.dim;
    const T* src = x + (lane / g.inner) * g.dim * g.inner + lane % g.inner;
    key[e] = topk_key<U>(load(src, j * g.inner), g.largest);
    idx[e] = static_cast<int>(j);
  }
  KILN_GRID_STRIDE(l, lanes + 1) offsets[l] = static_cast<int>(l * g.dim);
}

template <typename T>
__global__ void topk_gather(const T* __restrict__ x, const int* idx, T* vals, int64_t* inds,
                            TopKGeom g) {
  for (int64_t lane = blockIdx.x; lane < g.outer * g.inner; lane += gridDim.x)
    write_topk(x, vals, inds, g, lane, idx + lane * g.dim, 1);
}

// A block per lane: the lane's keys (topk_radix_fill's) sorted by CUB's block radix sort, whose
// digit passes are stable, so ties keep index order; padding takes the largest key and sorts
// after every element (it comes after them). The first k indices go to idx_sorted.
template <typename U>
__global__ void __launch_bounds__(kBlockSortThreads)
    topk_block_sort(const U* __restrict__ keys, int* __restrict__ idx_sorted, TopKGeom g) {
  using Sort = cub::BlockRadixSort<U, kBlockSortThreads, kBlockSortItems, int>;
  __shared__ typename Sort::TempStorage tmp;
  const int64_t dim = g.dim;
  for (int64_t lane = blockIdx.x; lane < g.outer * g.inner; lane += gridDim.x) {
    U k[kBlockSortItems];
    int v[kBlockSortItems];
#pragma unroll
    for (int i = 0; i < kBlockSortItems; ++i) {
      const int e = threadIdx.x * kBlockSortItems + i;
      k[i] = e < dim ? keys[lane * dim + e] : ~U(0);
      v[i] = e;
    }
    Sort(tmp).Sort(k, v);
#pragma unroll
    for (int i = 0; i < kBlockSortItems; ++i) {
      const int e = threadIdx.x * kBlockSortItems + i;
      if (e < g.k) idx_sorted[lane * dim + e] = v[i];
    }
    __syncthreads();  // tmp is the next lane's
  }
}

// The radix paths' workspace: keys and indices twice (in, sorted), the offsets, CUB's scratch
// (the block sort uses the keys, the indices and the sorted indices).
struct TopKRadix {
  size_t keys = 0, keys_sorted = 0, idx = 0, idx_sorted = 0, offsets = 0, temp = 0;
  size_t temp_bytes = 0;
};

// CUB's call for U keys: one lane sorts device-wide, several as segments. With `ws` null it only
// sizes the scratch (no launch).
template <typename U>
cudaError_t topk_sort(uint8_t* ws, const TopKRadix& r, size_t& temp_bytes, int64_t lanes,
                      int64_t items, cudaStream_t s) {
  const U* keys = ws ? reinterpret_cast<const U*>(ws + r.keys) : nullptr;
  U* sorted = ws ? reinterpret_cast<U*>(ws + r.keys_sorted) : nullptr;
  const int* idx = ws ? reinterpret_cast<const int*>(ws + r.idx) : nullptr;
  int* idx_sorted = ws ? reinterpret_cast<int*>(ws + r.idx_sorted) : nullptr;
  void* temp = ws ? ws + r.temp : nullptr;
  if (lanes == 1)
    return cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted, idx, idx_sorted,
                                           static_cast<int>(items), 0, int(8 * sizeof(U)), s);
  const int* offsets = ws ? reinterpret_cast<const int*>(ws + r.offsets) : nullptr;
  return cub::DeviceSegmentedRadixSort::SortPairs(
      temp, temp_bytes, keys, sorted, idx, idx_sorted, static_cast<int>(items),
      static_cast<int>(lanes), offsets, offsets ? offsets + 1 : nullptr, 0, int(8 * sizeof(U)), s);
}

class TopKLayer final : public Layer {
 public:
  explicit TopKLayer(const LayerDesc& d) : node_(d.node) {}

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    if (x.rank() == 0) return KILN_ERROR("{}: TopK input must have rank >= 1", n.label());
    if (in.size() < 2 || !in[1].host)
      return KILN_ERROR("{}: K must be known on the host", n.label());
    const Tensor& kt = *in[1].host;
    if (!dtype_is_integer(kt.dtype()) || kt.numel() != 1)
      return KILN_ERROR("{}: K must hold a single integer, got {}", n.label(), kt.desc());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x.rank(), n));
    TopKGeom g;
    g.outer = g.inner = 1;
    for (int64_t d = 0; d < x.rank(); ++d)
      if (d != axis) (d < axis ? g.outer : g.inner) *= x.shape[d];
    g.dim = x.shape[axis];
    g.k = kt.at_int(0);
    g.largest = n.attrs.get_int("largest", 1) != 0;
    if (g.k < 0 || g.k > g.dim)
      return KILN_ERROR("{}: K = {} must be in [0, {}]", n.label(), g.k, g.dim);
    if (g.dim >= (int64_t(1) << 30))
      return KILN_ERROR("{}: axis of {} elements is too long", n.label(), g.dim);
    std::vector<int64_t> want = x.shape;
    want[axis] = g.k;
    if (out[0].shape != want || out.size() < 2 || out[1].shape != want)
      return KILN_ERROR("{}: outputs should have shape {}", n.label(), shape_str(want));
    g.P = 1;
    while (g.P < g.dim) g.P <<= 1;
    g_ = g;
    if (g.P <= kBitonicMax) return size_t{0};
    const int64_t items = g.outer * g.inner * g.dim;
    if (items >= (int64_t(1) << 31) - 1)
      return KILN_ERROR("{}: sorting {} elements at once is more than TopK takes on the GPU",
                        n.label(), items);
    const bool wide = dtype_size(x.dtype) == 8;  // 64-bit keys (TopKKey)
    const size_t key_bytes = wide ? 8 : 4;
    TopKRadix r;
    const cudaError_t e =
        g.P <= kSharedSortMax ? cudaSuccess  // the block sort: no scratch of CUB's
        : wide ? topk_sort<uint64_t>(nullptr, r, r.temp_bytes, g.outer * g.inner, items, nullptr)
               : topk_sort<uint32_t>(nullptr, r, r.temp_bytes, g.outer * g.inner, items, nullptr);
    if (e != cudaSuccess)
      return KILN_ERROR("{}: sizing the sort failed: {}", n.label(), cudaGetErrorString(e));
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off = (off + bytes + 255) / 256 * 256;  // CUB wants its parts aligned
      return at;
    };
    r.keys = take(items * key_bytes);
    r.keys_sorted = take(items * key_bytes);
    r.idx = take(items * 4);
    r.idx_sorted = take(items * 4);
    r.offsets = take((g.outer * g.inner + 1) * 4);
    r.temp = take(r.temp_bytes);
    if (off > rc.workspace_limit)
      return KILN_ERROR("{}: sorting {} lanes of {} needs {} bytes of workspace (limit {})",
                        n.label(), g.outer * g.inner, g.dim, off, rc.workspace_limit);
    radix_ = r;
    return off;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const TopKGeom& g = g_;
    const int64_t lanes = g.outer * g.inner;
    if (lanes == 0 || g.k == 0) return Status::Ok();
    bool sorted = true;
    const bool ok = dispatch_dtype(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      using K = Compute<T>;
      const T* x = static_cast<const T*>(in[0].data);
      T* vals = static_cast<T*>(out[0].data);
      int64_t* inds = static_cast<int64_t*>(out[1].data);
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(lanes, 65535 * 8));
      if (g.P <= kBitonicMax) {
        const int threads = static_cast<int>(std::clamp<int64_t>(g.P / 2, 32, 1024));
        const size_t smem = static_cast<size_t>(shared_key_offset(g.P) + g.P * int64_t(sizeof(K)));
        topk_shared<T><<<grid, threads, smem, rc.stream>>>(x, vals, inds, g);
        return;
      }
      auto* ws = static_cast<uint8_t*>(rc.workspace);
      const TopKRadix& r = radix_;
      auto* idx = reinterpret_cast<int*>(ws + r.idx);
      auto* offsets = reinterpret_cast<int*>(ws + r.offsets);
      const int64_t items = lanes * g.dim;
      size_t temp_bytes = r.temp_bytes;
      using U = TopKKey<K>;
      topk_radix_fill<T, U><<<grid_for(items), kBlock, 0, rc.stream>>>(
          x, reinterpret_cast<U*>(ws + r.keys), idx, offsets, g);
      if (g.P <= kSharedSortMax) {
        topk_block_sort<U><<<grid, kBlockSortThreads, 0, rc.stream>>>(
            reinterpret_cast<const U*>(ws + r.keys), reinterpret_cast<int*>(ws + r.idx_sorted), g);
      } else {
        sorted = topk_sort<U>(ws, r, temp_bytes, lanes, items, rc.stream) == cudaSuccess;
      }
      topk_gather<T><<<grid, 256, 0, rc.stream>>>(
          x, reinterpret_cast<const int*>(ws + r.idx_sorted), vals, inds, g);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    if (!sorted) return KILN_ERROR("{}: the sort failed", node_->label());
    KILN_CUDA_LAUNCH_CHECK("topk kernels");
    return Status::Ok();
  }

 private:
  const Node* node_;
  TopKGeom g_;
  TopKRadix radix_;
};

// --- CumSum / CumProd (kProd; gated: not yet run on a GPU) ------------------------------------

// Float for the 16-bit floats, the type itself for float/double, uint64 for integers (wraps).
template <typename T>
using ScanAcc = std::conditional_t<std::is_floating_point_v<T>, T,
                                   std::conditional_t<std::is_integral_v<T>, uint64_t, float>>;

template <typename T>
__device__ __forceinline__ T from_acc(ScanAcc<T> a) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(a);
  else {
    T r;
    store(&r, 0, a);
    return r;
  }
}

// a + b, or a * b for CumProd; the identity is 0 or 1.
template <bool kProd, typename A>
__device__ __forceinline__ A scan_op(A a, A b) {
  if constexpr (kProd) return a * b;
  else return a + b;
}

// Contiguous lanes (the last axis): a block per lane, chunks of blockDim elements scanned with
// warp shuffles and carried across.
template <typename T, bool kProd>
__global__ void cumsum_rows(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t n,
                            bool exclusive, bool reverse) {
  using A = ScanAcc<T>;
  const A id = kProd ? A(1) : A(0);
  __shared__ A warp_total[32];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * n;
    T* yr = y + row * n;
    A carry = id;
    for (int64_t start = 0; start < n; start += blockDim.x) {
      const int64_t step = start + threadIdx.x;
      const int64_t j = reverse ? n - 1 - step : step;
      const A v = step < n ? static_cast<A>(load(xr, j)) : id;
      A inc = v;
      for (int d = 1; d < 32; d <<= 1) {
        const A t = __shfl_up_sync(0xffffffffu, inc, d);
        if (lane >= d) inc = scan_op<kProd>(inc, t);
      }
      A exc = __shfl_up_sync(0xffffffffu, inc, 1);
      if (lane == 0) exc = id;
      if (lane == 31) warp_total[w] = inc;
      __syncthreads();
      A before = carry, total = carry;
      for (int k = 0; k < nw; ++k) {
        if (k < w) before = scan_op<kProd>(before, warp_total[k]);
        total = scan_op<kProd>(total, warp_total[k]);
      }
      if (step < n) yr[j] = from_acc<T>(scan_op<kProd>(before, exclusive ? exc : inc));
      carry = total;
      __syncthreads();
    }
  }
}

// Strided lanes: a thread per lane, in order.
template <typename T, bool kProd>
__global__ void cumsum_cols(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n,
                            int64_t inner, bool exclusive, bool reverse) {
  using A = ScanAcc<T>;
  KILN_GRID_STRIDE(c, outer * inner) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    A acc = kProd ? A(1) : A(0);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t e = base + (reverse ? n - 1 - s : s) * inner;
      const A v = static_cast<A>(load(x, e));
      if (exclusive) y[e] = from_acc<T>(acc), acc = scan_op<kProd>(acc, v);
      else acc = scan_op<kProd>(acc, v), y[e] = from_acc<T>(acc);
    }
  }
}

class CumSumLayer final : public Layer {
 public:
  explicit CumSumLayer(const LayerDesc& d)
      : node_(d.node),
        exclusive_(d.node->attrs.get_int("exclusive", 0) != 0),
        reverse_(d.node->attrs.get_int("reverse", 0) != 0),
        prod_(d.node->op_type == "CumProd") {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    if (x.rank() == 0)
      return KILN_ERROR("{}: {} input must have rank >= 1", n.label(), n.op_type);
    if (in.size() < 2 || !in[1].host)
      return KILN_ERROR("{}: axis must be known on the host", n.label());
    const Tensor& a = *in[1].host;
    if ((a.dtype() != DataType::kInt32 && a.dtype() != DataType::kInt64) || a.numel() != 1 ||
        a.rank() > 1)
      return KILN_ERROR("{}: axis must be an int32/int64 scalar, got {}", n.label(), a.desc());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(a.at_int(0), x.rank(), n));
    outer_ = inner_ = 1;
    for (int64_t d = 0; d < x.rank(); ++d)
      if (d != axis) (d < axis ? outer_ : inner_) *= x.shape[d];
    n_ = x.shape[axis];
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (outer_ * n_ * inner_ == 0) return Status::Ok();
    const bool ok = dispatch_dtype(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T* x = static_cast<const T*>(in[0].data);
        T* y = static_cast<T*>(out[0].data);
        if (inner_ == 1) {
          const int threads = static_cast<int>(std::min<int64_t>(256, (n_ + 31) / 32 * 32));
          const unsigned grid = static_cast<unsigned>(std::min<int64_t>(outer_, 65535 * 8));
          if (prod_)
            cumsum_rows<T, true>
                <<<grid, threads, 0, rc.stream>>>(x, y, outer_, n_, exclusive_, reverse_);
          else
            cumsum_rows<T, false>
                <<<grid, threads, 0, rc.stream>>>(x, y, outer_, n_, exclusive_, reverse_);
        } else if (prod_) {
          cumsum_cols<T, true><<<grid_for(outer_ * inner_), kBlock, 0, rc.stream>>>(
              x, y, outer_, n_, inner_, exclusive_, reverse_);
        } else {
          cumsum_cols<T, false><<<grid_for(outer_ * inner_), kBlock, 0, rc.stream>>>(
              x, y, outer_, n_, inner_, exclusive_, reverse_);
        }
      }
    });
    if (!ok || in[0].dtype == DataType::kBool)
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("cumsum kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool exclusive_, reverse_, prod_;
  int64_t outer_ = 0, n_ = 0, inner_ = 0;
};

bool cumsum_supports(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (t == DataType::kBool || !(dtype_is_float(t) || dtype_is_integer(t)))
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  return true;
}

bool topk_supports(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (!(dtype_is_float(t) || dtype_is_integer(t) || t == DataType::kBool))
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_topk(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new TopKLayer(d));
}
Expected<std::unique_ptr<Layer>> create_cumsum(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new CumSumLayer(d));
}

// --- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear --------------------------------

// round half to even, add the zero point, saturate (NaN quantizes to the zero point).
template <typename Q>
__device__ __forceinline__ Q saturate_round(double q, int64_t zp) {
  if (isnan(q)) q = 0;
  const double r = rint(q) + static_cast<double>(zp);
  constexpr double lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  return static_cast<Q>(r < lo ? lo : (r > hi ? hi : r));
}

// Float inputs divide in float and round the quotient to `prec` (the scale's logical type, or
// the precision attribute): 1 float16, 2 bfloat16. float64 and int32 inputs divide in double.
template <typename X, typename Q>
__global__ void quantize_kernel(const X* __restrict__ x, Q* __restrict__ y, int64_t n,
                                ParamPtr scale, ZeroPoint zp, QuantGeom g, int prec) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t p = g.param(i);
    double q;
    if constexpr (std::is_same_v<X, double> || std::is_same_v<X, int32_t>) {
      q = static_cast<double>(x[i]) / scale.get<double>(p);
    } else {
      float f = static_cast<float>(load(x, i)) / scale.get<float>(p);
      if (prec == 1) f = __half2float(__float2half_rn(f));
      if (prec == 2) f = __bfloat162float(__float2bfloat16_rn(f));
      q = f;
    }
    y[i] = saturate_round<Q>(q, zp.get(p));
  }
}

// (x - zp) exactly in int64, times the scale in float (double for a float64 output).
template <typename X, typename A>
__global__ void dequantize_kernel(const X* __restrict__ x, void* y, DataType yt, int64_t n,
                                  ParamPtr scale, ZeroPoint zp, QuantGeom g) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t p = g.param(i);
    const A v = static_cast<A>(static_cast<int64_t>(x[i]) - zp.get(p)) * scale.get<A>(p);
    switch (yt) {
      case DataType::kFloat16: store(static_cast<__half*>(y), i, v); break;
      case DataType::kBFloat16: store(static_cast<__nv_bfloat16*>(y), i, v); break;
      case DataType::kFloat64: static_cast<double*>(y)[i] = v; break;
      default: static_cast<float*>(y)[i] = static_cast<float>(v); break;
    }
  }
}

bool quant_int_target(DataType t) {
  return t == DataType::kInt8 || t == DataType::kUInt8 || t == DataType::kInt16 ||
         t == DataType::kUInt16;
}

bool quantize_supports(const LayerDesc& d, std::string* why) {
  const DataType x = d.in[0].dtype, y = d.out[0].dtype;
  if (!dtype_is_float(x) && x != DataType::kInt32)
    return *why = "x must be float or int32", false;
  if (!quant_int_target(y))
    return *why = "only int8/uint8/int16/uint16 targets run on the GPU (not " +
                  std::string(dtype_name(y)) + ")", false;
  if (d.in.size() < 2 || !dtype_is_float(d.in[1].dtype))
    return *why = "y_scale must be float", false;
  // A float16 build would round a float32 scale to float16 and shift the quantized values:
  // such nodes run at float32 precision instead.
  if (d.precision == Precision::kFP16 && d.in_type(1).dtype == DataType::kFloat32)
    return *why = "a float32 y_scale is kept at float32 precision", false;
  return true;
}

bool dequantize_supports(const LayerDesc& d, std::string* why) {
  const DataType x = d.in[0].dtype;
  if (!dtype_is_integer(x))
    return *why = "only integer inputs run on the GPU (not " + std::string(dtype_name(x)) + ")",
           false;
  if (d.in.size() < 2 || !dtype_is_float(d.in[1].dtype))
    return *why = "x_scale must be float", false;
  if (!dtype_is_float(d.out[0].dtype)) return *why = "output must be float", false;
  return true;
}

class QuantLayer final : public Layer {
 public:
  explicit QuantLayer(const LayerDesc& d)
      : node_(d.node), quantize_(d.node->op_type == "QuantizeLinear") {
    // The quotient's rounding follows the scale's logical type unless `precision` says.
    const int64_t p = d.node->attrs.get_int("precision", 0);
    const DataType t = p != 0 ? static_cast<DataType>(p) : d.in_type(1).dtype;
    prec_ = t == DataType::kFloat16 ? 1 : t == DataType::kBFloat16 ? 2 : 0;
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    const bool has_zp = in.size() > 2 && in[2].present();
    KILN_ASSIGN_OR_RETURN(g_, quant_geom(in[0].shape, in[1], has_zp ? &in[2] : nullptr, *node_));
    if (!quantize_ && has_zp && in[2].dtype != in[0].dtype)
      return KILN_ERROR("{}: zero point type {} differs from x type {}", node_->label(),
                        dtype_name(in[2].dtype), dtype_name(in[0].dtype));
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].numel();
    if (n == 0) return Status::Ok();
    const ParamPtr scale{in[1].data, in[1].dtype};
    ZeroPoint zp;
    if (in.size() > 2 && in[2].present()) zp = {in[2].data, in[2].dtype};
    bool ok = false;
    if (quantize_) {
      ok = dispatch_dtype(in[0].dtype, [&](auto xt) {
        using X = decltype(xt);
        if constexpr (is_float_v<X> || std::is_same_v<X, int32_t>) {
          ok = dispatch_dtype(out[0].dtype, [&](auto qt) {
            using Q = decltype(qt);
            if constexpr (std::is_integral_v<Q> && sizeof(Q) <= 2 && !std::is_same_v<Q, bool>)
              quantize_kernel<X, Q><<<grid_for(n), kBlock, 0, rc.stream>>>(
                  static_cast<const X*>(in[0].data), static_cast<Q*>(out[0].data), n, scale, zp,
                  g_, prec_);
          });
        }
      });
      ok = ok && quant_int_target(out[0].dtype);
    } else {
      ok = dispatch_dtype(in[0].dtype, [&](auto xt) {
        using X = decltype(xt);
        if constexpr (std::is_integral_v<X> && !std::is_same_v<X, bool>) {
          const X* x = static_cast<const X*>(in[0].data);
          if (out[0].dtype == DataType::kFloat64)
            dequantize_kernel<X, double><<<grid_for(n), kBlock, 0, rc.stream>>>(
                x, out[0].data, out[0].dtype, n, scale, zp, g_);
          else
            dequantize_kernel<X, float><<<grid_for(n), kBlock, 0, rc.stream>>>(
                x, out[0].data, out[0].dtype, n, scale, zp, g_);
        }
      });
      ok = ok && dtype_is_integer(in[0].dtype);
    }
    if (!ok)
      return KILN_ERROR("{}: unsupported types {} -> {}", node_->label(), dtype_name(in[0].dtype),
                        dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK(quantize_ ? "quantize kernel" : "dequantize kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool quantize_;
  int prec_ = 0;
  QuantGeom g_;
};

// DynamicQuantizeLinear: partial [min, max] ranges per block (starting from 0, NaN ignored),
// then every block of the second kernel combines them identically and quantizes.
constexpr int kRangeBlocks = 1024;

__device__ void block_range(float& lo, float& hi, float* sm) {
  for (int m = 16; m > 0; m >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, m));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, m));
  }
  const int w = threadIdx.x / 32, nw = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) sm[2 * w] = lo, sm[2 * w + 1] = hi;
  __syncthreads();
  lo = sm[0], hi = sm[1];
  for (int k = 1; k < nw; ++k) lo = fminf(lo, sm[2 * k]), hi = fmaxf(hi, sm[2 * k + 1]);
  __syncthreads();
}

template <typename T>
__global__ void dql_range(const T* __restrict__ x, int64_t n, float* part) {
  __shared__ float sm[64];
  float lo = 0.f, hi = 0.f;
  KILN_GRID_STRIDE(i, n) {
    const float v = static_cast<float>(load(x, i));
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  block_range(lo, hi, sm);
  if (threadIdx.x == 0) part[2 * blockIdx.x] = lo, part[2 * blockIdx.x + 1] = hi;
}

template <typename T>
__global__ void dql_apply(const T* __restrict__ x, int64_t n, const float* part, int parts,
                          uint8_t* y, void* scale_out, DataType scale_t, uint8_t* zp_out) {
  __shared__ float sm[64];
  float lo = 0.f, hi = 0.f;
  for (int k = threadIdx.x; k < parts; k += blockDim.x)
    lo = fminf(lo, part[2 * k]), hi = fmaxf(hi, part[2 * k + 1]);
  block_range(lo, hi, sm);
  const float scale = (hi == lo ? 1.f : hi - lo) / 255.f;
  const float zpf = fminf(255.f, fmaxf(0.f, 0.f - lo / scale));
  const uint8_t zp = static_cast<uint8_t>(rintf(zpf));
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (scale_t == DataType::kFloat16) store(static_cast<__half*>(scale_out), 0, scale);
    else static_cast<float*>(scale_out)[0] = scale;
    *zp_out = zp;
  }
  KILN_GRID_STRIDE(i, n) {
    const float q = static_cast<float>(load(x, i)) / scale;
    y[i] = saturate_round<uint8_t>(static_cast<double>(q), zp);
  }
}

bool dql_supports(const LayerDesc& d, std::string* why) {
  if (!dtype_is_float(d.in[0].dtype)) return *why = "x must be a float tensor", false;
  // y_scale must leave in float32, consistent with the values quantized with it.
  if (d.precision == Precision::kFP16)
    return *why = "runs at float32 precision (y_scale is float32)", false;
  const DataType st = d.out.size() > 1 ? d.out[1].dtype : DataType::kFloat32;
  if (st != DataType::kFloat32 && st != DataType::kFloat16)
    return *why = "y_scale must be float32", false;
  return true;
}

class DynQuantLayer final : public Layer {
 public:
  explicit DynQuantLayer(const LayerDesc& d) : node_(d.node) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    if (out.size() < 3 || !out[1].present() || !out[2].present())
      return KILN_ERROR("{}: y, y_scale and y_zero_point must all be produced", node_->label());
    return size_t{2 * kRangeBlocks * sizeof(float)};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].numel();
    const unsigned parts = std::min<unsigned>(grid_for(n), kRangeBlocks);
    float* part = static_cast<float*>(rc.workspace);
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in[0].data);
      dql_range<T><<<parts, kBlock, 0, rc.stream>>>(x, n, part);
      dql_apply<T><<<grid_for(n), kBlock, 0, rc.stream>>>(
          x, n, part, static_cast<int>(parts), static_cast<uint8_t*>(out[0].data), out[1].data,
          out[1].dtype, static_cast<uint8_t*>(out[2].data));
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("dynamic quantize kernels");
    return Status::Ok();
  }

 private:
  const Node* node_;
};

Expected<std::unique_ptr<Layer>> create_quant(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new QuantLayer(d));
}
Expected<std::unique_ptr<Layer>> create_dyn_quant(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new DynQuantLayer(d));
}

}  // namespace

std::span<const TacticDef> reduce_misc_tactics() {
  static const std::vector<TacticDef> all = [] {
    std::vector<TacticDef> v = {
        {"", "TopK", "reduce.topk", kF32 | kF16 | kF64, 1u << 1, topk_supports, create_topk},
        {"", "CumSum", "reduce.cumsum", kF32 | kF16 | kF64, 1u << 1, cumsum_supports,
         create_cumsum},
        {"", "CumProd", "reduce.cumprod", kF32 | kF16 | kF64, 1u << 1, cumsum_supports,
         create_cumsum},
        {"", "QuantizeLinear", "quant.quantize", kF32 | kF16 | kF64, 0, quantize_supports,
         create_quant},
        {"", "DequantizeLinear", "quant.dequantize", kF32 | kF16 | kF64, 0, dequantize_supports,
         create_quant},
        {"", "QuantizeLinear", "quant.quantize.low_bit", kF32 | kF16 | kF64, 0,
         quant_low_bit_supports, create_quant_low_bit},
        {"", "DequantizeLinear", "quant.dequantize.low_bit", kF32 | kF16 | kF64, 0,
         quant_low_bit_supports, create_quant_low_bit},
        {"", "DynamicQuantizeLinear", "quant.dynamic", kF32 | kF16 | kF64, 0, dql_supports,
         create_dyn_quant},
    };
    return v;
  }();
  return all;
}

}  // namespace kiln::gpu
