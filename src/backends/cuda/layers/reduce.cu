// The reduction family: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare} and
// ArgMax/ArgMin (this file), softmax and normalizations (norm.cu), TopK, CumSum and the
// quantization ops (reduce_misc.cu). The spec is src/ops/reduce.cpp and index_sort.cpp.
//
// A reduction is viewed as M output rows of R reduced elements: the kept axes and the reduced
// axes each become a (coalesced) strided index into the input, so any axis set, NHWC storage and
// keepdims need no copies. One kernel serves three thread mappings (ReduceGeom::mode): a warp
// per row (short contiguous rows, e.g. the last axis), a block per row (long rows, few rows)
// and a thread per row with 8 helpers (reduced axes strided, kept axes contiguous: NHWC spatial
// means, reductions over a leading axis).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> norm_tactics();         // norm.cu
std::span<const TacticDef> reduce_misc_tactics();  // reduce_misc.cu

namespace {

enum class Kind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

template <typename V>
__device__ __forceinline__ bool nan_of(V v) {
  if constexpr (std::is_floating_point_v<V>) return isnan(v);
  else return false;
}

// The reference's max/min: a NaN, once seen, stays.
template <bool kMax, typename V>
__device__ __forceinline__ V nan_minmax(V a, V b) {
  if (nan_of(a)) return a;
  if (nan_of(b)) return b;
  return (kMax ? b > a : b < a) ? b : a;
}

// Integer result of a double: truncate toward zero, saturate, NaN -> 0 (as reduce.cpp).
template <typename T>
__device__ T from_double(double v) {
  if (isnan(v)) return T(0);
  const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  const double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v <= lo) return std::numeric_limits<T>::lowest();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <typename T>
using FloatAcc = std::conditional_t<std::is_same_v<T, double>, double, float>;

// One Reduce* op on element type T: its accumulator, identity, per-element map, combine and
// final write. Floats accumulate in float (double for float64); integer Sum/Mean/Prod/L1/
// SumSquare wrap in uint64 like the reference, L2/LogSum/LogSumExp go through double.
template <Kind K, typename T>
struct RedOp {
  static constexpr bool kFloat = is_float_v<T>;
  static constexpr bool kMinMax = K == Kind::kMax || K == Kind::kMin;
  static constexpr bool kViaDouble =
      !kFloat && (K == Kind::kL2 || K == Kind::kLogSum || K == Kind::kLogSumExp);
  using IntAcc = std::conditional_t<kViaDouble, double, uint64_t>;
  using A = std::conditional_t<kFloat, FloatAcc<T>, std::conditional_t<kMinMax, T, IntAcc>>;
  using Out = T;

  __device__ static A init() {
    if constexpr (K == Kind::kProd) return A(1);
    if constexpr (K == Kind::kMax || K == Kind::kLogSumExp) {
      if constexpr (kFloat || kViaDouble) return -std::numeric_limits<A>::infinity();
      else return std::numeric_limits<T>::lowest();
    }
    if constexpr (K == Kind::kMin) {
      if constexpr (kFloat) return std::numeric_limits<A>::infinity();
      else return std::numeric_limits<T>::max();
    }
    return A(0);
  }
  __device__ static A map(Compute<T> v, int64_t) {
    if constexpr (kFloat || kViaDouble) {
      const A a = static_cast<A>(v);
      if constexpr (K == Kind::kL1) return a < A(0) ? -a : a;
      if constexpr (K == Kind::kL2 || K == Kind::kSumSquare) return a * a;
      return a;
    } else if constexpr (kMinMax) {
      return v;
    } else {
      uint64_t u = static_cast<uint64_t>(v);  // sign-extends signed values
      if constexpr (K == Kind::kL1 && std::is_signed_v<T>)
        if (v < 0) u = uint64_t{0} - u;
      if constexpr (K == Kind::kSumSquare) u *= u;
      return u;
    }
  }
  __device__ static A combine(A a, A b) {
    if constexpr (K == Kind::kProd) return a * b;
    else if constexpr (K == Kind::kMax || K == Kind::kLogSumExp) return nan_minmax<true>(a, b);
    else if constexpr (K == Kind::kMin) return nan_minmax<false>(a, b);
    else return a + b;
  }
  // `a` is the reduction (for LogSumExp the max), `s` the LogSumExp sum of exp(x - max).
  __device__ static void finish(void* out, int64_t off, A a, A s, int64_t count) {
    T* y = static_cast<T*>(out);
    if constexpr (kFloat || kViaDouble) {
      A r = a;
      if constexpr (K == Kind::kMean) r = a / static_cast<A>(count);
      if constexpr (K == Kind::kL2) r = sqrt(a);
      if constexpr (K == Kind::kLogSum) r = log(a);
      if constexpr (K == Kind::kLogSumExp) r = isfinite(a) ? a + log(s) : a;
      if constexpr (kFloat) store(y, off, r);
      else y[off] = from_double<T>(r);
    } else if constexpr (K == Kind::kMean) {
      if (count == 0) y[off] = T(0);
      else if constexpr (std::is_signed_v<T>)
        y[off] = static_cast<T>(static_cast<int64_t>(a) / count);
      else y[off] = static_cast<T>(a / static_cast<uint64_t>(count));
    } else {
      y[off] = static_cast<T>(a);
    }
  }
};

// ArgMax/ArgMin: (value, index) pairs. The first NaN wins (numpy); equal values keep the lower
// index, or the higher with select_last_index. An index of -1 marks "nothing seen".
template <typename V>
struct ArgAcc {
  V v;
  int64_t i;
};

template <bool kMax, bool kLast, typename T>
struct ArgOp {
  using V = Compute<T>;
  using A = ArgAcc<V>;
  __device__ static A init() { return {V{}, -1}; }
  __device__ static A map(V v, int64_t r) { return {v, r}; }
  __device__ static A combine(A a, A b) {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool na = nan_of(a.v), nb = nan_of(b.v);
    if (na || nb) {
      if (na && nb) return a.i < b.i ? a : b;
      return na ? a : b;
    }
    if (a.v == b.v) return (kLast ? a.i > b.i : a.i < b.i) ? a : b;
    return (kMax ? a.v > b.v : a.v < b.v) ? a : b;
  }
  __device__ static void finish(void* out, int64_t off, A a, A, int64_t) {
    static_cast<int64_t*>(out)[off] = a.i < 0 ? 0 : a.i;
  }
};

template <typename A>
struct SumOp {
  __device__ static A combine(A a, A b) { return a + b; }
};

template <typename V>
__device__ __forceinline__ V shfl_xor(V v, int m) {
  if constexpr (std::is_same_v<V, bool> || (std::is_integral_v<V> && sizeof(V) < 4))
    return static_cast<V>(__shfl_xor_sync(0xffffffffu, static_cast<int>(v), m));
  else if constexpr (std::is_arithmetic_v<V>)
    return __shfl_xor_sync(0xffffffffu, v, m);
  else
    return {shfl_xor(v.v, m), shfl_xor(v.i, m)};
}

// Where each output row and each reduced element lives. mode 0: a warp per row (8 rows per
// 32x8 block); mode 1: a thread per row, threadIdx.y splits the row (32 rows per block);
// mode 2: the whole 256-thread block per row.
struct ReduceGeom {
  int64_t M = 0, R = 0;
  StridedIndex kept, red, out;
  int64_t red_stride = 0;  // red is one dimension of this stride (red_1d)
  bool red_1d = false, out_contig = false;
  int mode = 0;
  int64_t chunks = 1;  // pieces per row
  int vec = 1;         // mode 1: rows a thread, read as one 16-byte vector (reduce_rows_vec)
};

// Splitting few long rows: at most this many pieces in all, each at least kMinPiece long.
constexpr int64_t kMaxPieces = 1024, kMinPiece = 4096;
// Mode 1 (a thread per row, reduced axes strided) splits its rows when they make fewer than
// kMinBlocks blocks of 32 threads, into pieces of at least kMinPiece1: ConvNeXt-V2's GRN, an L2
// norm over H and W of a channels-last [32, 56, 56, 384] tensor, is 12288 rows of 3136, which
// read as 16-byte vectors are 48 blocks for 132 multiprocessors without the split.
constexpr int64_t kMinBlocks = 512, kMinPiece1 = 256;

// Combines v over the threads that share a row; every one of them gets the result. All
// threads of the block call it (it may synchronize).
template <typename Op, typename A>
__device__ A group_reduce(A v, int mode, A* sm) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  if (mode != 1)
    for (int m = 16; m > 0; m >>= 1) v = Op::combine(v, shfl_xor(v, m));
  if (mode == 0) return v;
  if (mode == 1) {
    sm[ty * 32 + tx] = v;
    __syncthreads();
    if (ty == 0) {
      for (int k = 1; k < 8; ++k) v = Op::combine(v, sm[k * 32 + tx]);
      sm[tx] = v;
    }
    __syncthreads();
    v = sm[tx];
    __syncthreads();
    return v;
  }
  if (tx == 0) sm[ty] = v;
  __syncthreads();
  v = sm[0];
  for (int k = 1; k < 8; ++k) v = Op::combine(v, sm[k]);
  __syncthreads();
  return v;
}

// Rows are split into `chunks` pieces when there are few long rows: each block then writes its
// piece's accumulator to `partial` (row-major over rows, then pieces) and reduce_finish combines
// them. Virtual row v is row v / chunks, piece v % chunks in mode 2; in mode 1 it is row v % M,
// piece v / M, so the 32 threads of a warp still read 32 adjacent rows.
template <typename Op, typename T, bool kLogSumExp>
__global__ void __launch_bounds__(256) reduce_kernel(const T* __restrict__ x, void* y, ReduceGeom g,
                                                     typename Op::A* partial) {
  using A = typename Op::A;
  __shared__ alignas(16) unsigned char raw[256 * sizeof(A)];
  A* sm = reinterpret_cast<A*>(raw);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int per_tile = g.mode == 0 ? 8 : g.mode == 1 ? 32 : 1;
  const int rt = g.mode == 0 ? tx : g.mode == 1 ? ty : ty * 32 + tx;
  const int nrt = g.mode == 0 ? 32 : g.mode == 1 ? 8 : 256;
  const int64_t tiles = (g.M * g.chunks + per_tile - 1) / per_tile;
  const int64_t len = (g.R + g.chunks - 1) / g.chunks;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t vrow = tile * per_tile + (g.mode == 0 ? ty : g.mode == 1 ? tx : 0);
    const bool live = vrow < g.M * g.chunks;
    const int64_t o = g.mode == 1 ? vrow % g.M : vrow / g.chunks;
    const int64_t piece = g.mode == 1 ? vrow / g.M : vrow % g.chunks;
    const T* xr = x + (live ? g.kept.offset(o) : 0);
    const int64_t begin = piece * len, end = live ? std::min(g.R, begin + len) : 0;
    auto at = [&](int64_t r) { return load(xr, g.red_1d ? r * g.red_stride : g.red.offset(r)); };
    A a = Op::init();
    int64_t r = begin + rt;
    for (; r + 3 * nrt < end; r += 4 * nrt) {  // four loads in flight
      const A a0 = Op::map(at(r), r), a1 = Op::map(at(r + nrt), r + nrt);
      const A a2 = Op::map(at(r + 2 * nrt), r + 2 * nrt);
      const A a3 = Op::map(at(r + 3 * nrt), r + 3 * nrt);
      a = Op::combine(a, Op::combine(Op::combine(a0, a1), Op::combine(a2, a3)));
    }
    for (; r < end; r += nrt) a = Op::combine(a, Op::map(at(r), r));
    a = group_reduce<Op>(a, g.mode, sm);
    A s{};
    if constexpr (kLogSumExp) {  // second pass: sum of exp(x - max) (finite max only; no split)
      s = A(0);
      if (isfinite(a))
        for (int64_t q = begin + rt; q < end; q += nrt) s += exp(static_cast<A>(at(q)) - a);
      s = group_reduce<SumOp<A>>(s, g.mode, sm);
    }
    if (!live || rt != 0) continue;
    if (g.chunks > 1) partial[o * g.chunks + piece] = a;
    else Op::finish(y, g.out_contig ? o : g.out.offset(o), a, s, g.R);
  }
}

// Mode 1 with `vec` adjacent rows a thread, read together as one 16-byte vector (the kept
// innermost axis contiguous, every other stride a whole number of vectors): ConvNeXt-V2's GRN
// reads its [32, 56, 56, 384] float16 tensor 16 bytes a load instead of 2. Floats only; the
// layout of threads, pieces and partial results is mode 1's.
template <typename Op, typename T>
__global__ void __launch_bounds__(256) reduce_rows_vec(const T* __restrict__ x, void* y, ReduceGeom g,
                                                       typename Op::A* partial) {
  using A = typename Op::A;
  using Vec = Vec16<T>;
  constexpr int V = Vec::kN;
  __shared__ A sm[8 * 32 * V];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t Mv = g.M / V;
  const int64_t tiles = (Mv * g.chunks + 31) / 32;
  const int64_t len = (g.R + g.chunks - 1) / g.chunks;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t vrow = tile * 32 + tx;
    const bool live = vrow < Mv * g.chunks;
    const int64_t o0 = (vrow % Mv) * V, piece = vrow / Mv;
    const T* xr = x + (live ? g.kept.offset(o0) : 0);
    const int64_t begin = piece * len, end = live ? std::min(g.R, begin + len) : 0;
    A a[V];
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = Op::init();
#pragma unroll 4
    for (int64_t r = begin + ty; r < end; r += 8) {
      const Vec q = *reinterpret_cast<const Vec*>(xr + (g.red_1d ? r * g.red_stride : g.red.offset(r)));
#pragma unroll
      for (int j = 0; j < V; ++j) a[j] = Op::combine(a[j], Op::map(load(q.v, j), r));
    }
#pragma unroll
    for (int j = 0; j < V; ++j) sm[(ty * 32 + tx) * V + j] = a[j];
    __syncthreads();
    if (ty == 0 && live) {
      for (int k = 1; k < 8; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) a[j] = Op::combine(a[j], sm[(k * 32 + tx) * V + j]);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t o = o0 + j;
        if (g.chunks > 1) partial[o * g.chunks + piece] = a[j];
        else Op::finish(y, g.out_contig ? o : g.out.offset(o), a[j], A{}, g.R);
      }
    }
    __syncthreads();
  }
}

template <typename Op>
__global__ void reduce_finish(const typename Op::A* __restrict__ partial, void* y, ReduceGeom g) {
  KILN_GRID_STRIDE(o, g.M) {
    typename Op::A a = partial[o * g.chunks];
    for (int64_t c = 1; c < g.chunks; ++c) a = Op::combine(a, partial[o * g.chunks + c]);
    Op::finish(y, g.out_contig ? o : g.out.offset(o), a, a, g.R);
  }
}

// Logical strides (per ONNX axis) of a tensor in its storage layout.
std::vector<int64_t> logical_strides(const DeviceTensor& t) {
  if (t.layout == Layout::kNHWC && t.rank() == 4) {
    const int64_t C = t.shape[1], H = t.shape[2], W = t.shape[3];
    return {H * W * C, 1, W * C, C};
  }
  return row_major_strides(t.shape);
}

StridedIndex to_index(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  StridedIndex ix;
  ix.rank = static_cast<int>(dims.size());
  for (size_t d = 0; d < dims.size(); ++d) ix.dims[d] = dims[d], ix.strides[d] = strides[d];
  return ix;
}

// The geometry of reducing x over `mask` into y (keepdims: y keeps reduced axes as 1).
Expected<ReduceGeom> make_geom(const DeviceTensor& x, const DeviceTensor& y,
                               const std::vector<bool>& mask, bool keepdims, const Node& n) {
  std::vector<int64_t> want;
  for (size_t d = 0; d < mask.size(); ++d)
    if (!mask[d] || keepdims) want.push_back(mask[d] ? 1 : x.shape[d]);
  if (y.shape != want)
    return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                      shape_str(want));
  const auto xs = logical_strides(x), ys = logical_strides(y);
  std::vector<int64_t> kd, red_dims;
  std::vector<std::vector<int64_t>> ks(2), rs(1);
  ReduceGeom g;
  g.M = g.R = 1;
  size_t yaxis = 0;
  for (size_t d = 0; d < mask.size(); ++d) {
    if (mask[d]) {
      red_dims.push_back(x.shape[d]);
      rs[0].push_back(xs[d]);
      g.R *= x.shape[d];
      if (keepdims) ++yaxis;
    } else {
      kd.push_back(x.shape[d]);
      ks[0].push_back(xs[d]);
      ks[1].push_back(ys[yaxis++]);
      g.M *= x.shape[d];
    }
  }
  // Axes in order of falling input stride: the reduced walk then ends on the unit stride where
  // one is reduced (NHWC storage of a logical [B, H, W, C] tensor reduced over H and W makes the
  // channels-first axis the innermost), and adjacent rows are nearest in memory. Reduction
  // order does not change the result beyond rounding; ArgMax/ArgMin reduce one axis.
  auto by_stride = [](std::vector<int64_t>& dims, std::vector<std::vector<int64_t>>& st) {
    std::vector<size_t> order(dims.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return st[0][a] > st[0][b]; });
    auto permute = [&](std::vector<int64_t>& v) {
      std::vector<int64_t> w;
      for (size_t i : order) w.push_back(v[i]);
      v = std::move(w);
    };
    permute(dims);
    for (auto& v : st) permute(v);
  };
  by_stride(kd, ks);
  by_stride(red_dims, rs);
  coalesce_dims(kd, ks);
  coalesce_dims(red_dims, rs);
  if (kd.size() > size_t(kMaxDims) || red_dims.size() > size_t(kMaxDims))
    return KILN_ERROR("{}: too many non-contiguous axes in {}", n.label(), shape_str(x.shape));
  g.kept = to_index(kd, ks[0]);
  g.out = to_index(kd, ks[1]);
  g.red = to_index(red_dims, rs[0]);
  g.red_1d = red_dims.size() <= 1;
  g.red_stride = red_dims.empty() ? 0 : rs[0][0];
  g.out_contig = kd.empty() || (kd.size() == 1 && ks[1][0] == 1);
  const bool unit = !red_dims.empty() && rs[0].back() == 1 && g.R > 1;
  if (unit) g.mode = (g.R > 2048 || g.M < 64) ? 2 : 0;
  else g.mode = g.M >= 256 ? 1 : 2;
  if (g.mode == 2 && g.M > 0 && g.M < kMaxPieces / 4 && g.R >= 2 * kMinPiece)
    g.chunks = std::max<int64_t>(1, std::min(g.R / kMinPiece, kMaxPieces / g.M));
  // Mode 1 reads `vec` adjacent rows a thread as one 16-byte vector where every vector is whole
  // and aligned: floats, the kept innermost axis contiguous and a whole number of vectors long,
  // every other stride (kept or reduced) a whole number of vectors.
  if (g.mode == 1 && dtype_is_float(x.dtype) && dtype_size(x.dtype) <= 8 && !kd.empty()) {
    const int64_t v = 16 / static_cast<int64_t>(dtype_size(x.dtype));
    bool ok = ks[0].back() == 1 && kd.back() % v == 0;
    for (size_t i = 0; i + 1 < kd.size(); ++i) ok = ok && ks[0][i] % v == 0;
    for (int64_t st : rs[0]) ok = ok && st % v == 0;
    if (ok) g.vec = static_cast<int>(v);
  }
  const int64_t thread_rows = g.M / g.vec;
  if (g.mode == 1 && thread_rows > 0 && thread_rows < 32 * kMinBlocks && g.R >= 2 * kMinPiece1)
    g.chunks = std::max<int64_t>(
        1, std::min(g.R / kMinPiece1, (32 * kMinBlocks + thread_rows - 1) / thread_rows));
  return g;
}

// Workspace of the split path (partial accumulators, at most 16 bytes each).
size_t split_bytes(const ReduceGeom& g) { return g.chunks > 1 ? size_t(g.M * g.chunks) * 16 : 0; }

template <typename Op, typename T, bool kLse = false>
void launch(const DeviceTensor& x, void* y, ReduceGeom g, void* ws, cudaStream_t s) {
  using A = typename Op::A;
  if (kLse) g.chunks = 1;
  const int per_tile = g.mode == 0 ? 8 : g.mode == 1 ? 32 : 1;
  const int64_t tiles = (g.M * g.chunks + per_tile - 1) / per_tile;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 65535 * 8));
  A* partial = static_cast<A*>(ws);
  if constexpr (is_float_v<T> && std::is_arithmetic_v<A> && !kLse) {
    if (g.vec > 1 && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) {
      const int64_t vtiles = (g.M / g.vec * g.chunks + 31) / 32;
      reduce_rows_vec<Op, T><<<static_cast<unsigned>(std::min<int64_t>(vtiles, 65535 * 8)), dim3(32, 8), 0,
                               s>>>(static_cast<const T*>(x.data), y, g, partial);
      if (g.chunks > 1) reduce_finish<Op><<<grid_for(g.M), kBlock, 0, s>>>(partial, y, g);
      return;
    }
  }
  reduce_kernel<Op, T, kLse>
      <<<grid, dim3(32, 8), 0, s>>>(static_cast<const T*>(x.data), y, g, partial);
  if (g.chunks > 1) reduce_finish<Op><<<grid_for(g.M), kBlock, 0, s>>>(partial, y, g);
}

template <Kind K>
bool launch_reduce(const DeviceTensor& x, void* y, const ReduceGeom& g, void* ws, cudaStream_t s) {
  return dispatch_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool> || K == Kind::kMax || K == Kind::kMin)
      launch<RedOp<K, T>, T, K == Kind::kLogSumExp>(x, y, g, ws, s);
  });
}

// --- Reduce* -------------------------------------------------------------------------------

Kind kind_of(std::string_view op) {
  if (op == "ReduceMean") return Kind::kMean;
  if (op == "ReduceMax") return Kind::kMax;
  if (op == "ReduceMin") return Kind::kMin;
  if (op == "ReduceProd") return Kind::kProd;
  if (op == "ReduceL1") return Kind::kL1;
  if (op == "ReduceL2") return Kind::kL2;
  if (op == "ReduceLogSum") return Kind::kLogSum;
  if (op == "ReduceLogSumExp") return Kind::kLogSumExp;
  if (op == "ReduceSumSquare") return Kind::kSumSquare;
  return Kind::kSum;
}

bool plain_type(DataType t) {
  return t != DataType::kUndefined && t != DataType::kString && !dtype_is_low_bit(t);
}

bool reduce_supports(const LayerDesc& d, std::string* why) {
  if (d.node->attrs.has("axes"))
    return *why = "axes given as an attribute (the node was not upgraded to opset 18)", false;
  const DataType t = d.in[0].dtype;
  if (!plain_type(t)) return *why = "unsupported type " + std::string(dtype_name(t)), false;
  const Kind k = kind_of(d.node->op_type);
  if (t == DataType::kBool && k != Kind::kMax && k != Kind::kMin)
    return *why = "bool input is only reduced by ReduceMax/ReduceMin", false;
  return true;
}

class ReduceLayer final : public Layer {
 public:
  explicit ReduceLayer(const LayerDesc& d) : node_(d.node), kind_(kind_of(d.node->op_type)) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    std::vector<int64_t> axes;
    if (in.size() > 1 && n.input(1)) {
      if (!in[1].host) return KILN_ERROR("{}: axes must be known on the host", n.label());
      if (!dtype_is_integer(in[1].host->dtype()) || in[1].host->rank() > 1)
        return KILN_ERROR("{}: axes must be a 1-D integer tensor, got {}", n.label(),
                          in[1].host->desc());
      axes = in[1].host->to_int64_vector();
    }
    const bool keepdims = n.attrs.get_int("keepdims", 1) != 0;
    const bool noop = n.attrs.get_int("noop_with_empty_axes", 0) != 0;
    const int64_t rank = x.rank();
    std::vector<bool> mask(static_cast<size_t>(rank), axes.empty() && !noop);
    for (int64_t a : axes) {
      if (a < -rank || a >= rank)
        return KILN_ERROR("{}: axis {} is out of range for rank {}", n.label(), a, rank);
      const size_t k = static_cast<size_t>(a < 0 ? a + rank : a);
      if (mask[k]) return KILN_ERROR("{}: axis {} is listed more than once", n.label(), a);
      mask[k] = true;
    }
    KILN_ASSIGN_OR_RETURN(g_, make_geom(x, out[0], mask, keepdims, n));
    return split_bytes(g_);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (g_.M == 0) return Status::Ok();
    const DeviceTensor& x = in[0];
    void* y = out[0].data;
    void* ws = rc.workspace;
    bool ok = false;
    switch (kind_) {
      case Kind::kSum: ok = launch_reduce<Kind::kSum>(x, y, g_, ws, rc.stream); break;
      case Kind::kMean: ok = launch_reduce<Kind::kMean>(x, y, g_, ws, rc.stream); break;
      case Kind::kMax: ok = launch_reduce<Kind::kMax>(x, y, g_, ws, rc.stream); break;
      case Kind::kMin: ok = launch_reduce<Kind::kMin>(x, y, g_, ws, rc.stream); break;
      case Kind::kProd: ok = launch_reduce<Kind::kProd>(x, y, g_, ws, rc.stream); break;
      case Kind::kL1: ok = launch_reduce<Kind::kL1>(x, y, g_, ws, rc.stream); break;
      case Kind::kL2: ok = launch_reduce<Kind::kL2>(x, y, g_, ws, rc.stream); break;
      case Kind::kLogSum: ok = launch_reduce<Kind::kLogSum>(x, y, g_, ws, rc.stream); break;
      case Kind::kLogSumExp: ok = launch_reduce<Kind::kLogSumExp>(x, y, g_, ws, rc.stream); break;
      case Kind::kSumSquare: ok = launch_reduce<Kind::kSumSquare>(x, y, g_, ws, rc.stream); break;
    }
    if (!ok || (x.dtype == DataType::kBool && kind_ != Kind::kMax && kind_ != Kind::kMin))
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(x.dtype));
    KILN_CUDA_LAUNCH_CHECK("reduce kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  Kind kind_;
  ReduceGeom g_;
};

// --- ArgMax / ArgMin -------------------------------------------------------------------------

bool arg_supports(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (!plain_type(t)) return *why = "unsupported type " + std::string(dtype_name(t)), false;
  return true;
}

class ArgLayer final : public Layer {
 public:
  explicit ArgLayer(const LayerDesc& d)
      : node_(d.node),
        max_(d.node->op_type == "ArgMax"),
        last_(d.node->attrs.get_int("select_last_index", 0) != 0) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    if (x.rank() == 0) return KILN_ERROR("{}: input must have rank >= 1", n.label());
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x.rank(), n));
    if (x.shape[axis] == 0)
      return KILN_ERROR("{}: cannot reduce over an empty axis {}", n.label(), axis);
    std::vector<bool> mask(static_cast<size_t>(x.rank()), false);
    mask[axis] = true;
    KILN_ASSIGN_OR_RETURN(g_, make_geom(x, out[0], mask, n.attrs.get_int("keepdims", 1) != 0, n));
    return split_bytes(g_);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (g_.M == 0) return Status::Ok();
    const DeviceTensor& x = in[0];
    void* y = out[0].data;
    const bool ok = dispatch_dtype(x.dtype, [&](auto tag) {
      using T = decltype(tag);
      if (max_ && last_) launch<ArgOp<true, true, T>, T>(x, y, g_, rc.workspace, rc.stream);
      else if (max_) launch<ArgOp<true, false, T>, T>(x, y, g_, rc.workspace, rc.stream);
      else if (last_) launch<ArgOp<false, true, T>, T>(x, y, g_, rc.workspace, rc.stream);
      else launch<ArgOp<false, false, T>, T>(x, y, g_, rc.workspace, rc.stream);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(x.dtype));
    KILN_CUDA_LAUNCH_CHECK("arg reduce kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool max_, last_;
  ReduceGeom g_;
};

Expected<std::unique_ptr<Layer>> create_reduce(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ReduceLayer(d));
}
Expected<std::unique_ptr<Layer>> create_arg(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ArgLayer(d));
}

constexpr uint32_t kReduceCaps = kF32 | kF16 | kF64 | kNHWC;
constexpr uint32_t kAxesHost = 1u << 1;

const TacticDef kReduceTactics[] = {
    {"", "ReduceSum", "reduce.sum", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceMean", "reduce.mean", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceMax", "reduce.max", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceMin", "reduce.min", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceProd", "reduce.prod", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceL1", "reduce.l1", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceL2", "reduce.l2", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceLogSum", "reduce.log_sum", kReduceCaps, kAxesHost, reduce_supports, create_reduce},
    {"", "ReduceLogSumExp", "reduce.log_sum_exp", kReduceCaps, kAxesHost, reduce_supports,
     create_reduce},
    {"", "ReduceSumSquare", "reduce.sum_square", kReduceCaps, kAxesHost, reduce_supports,
     create_reduce},
    {"", "ArgMax", "reduce.argmax", kF32 | kF16 | kF64, 0, arg_supports, create_arg},
    {"", "ArgMin", "reduce.argmin", kF32 | kF16 | kF64, 0, arg_supports, create_arg},
};

}  // namespace

std::span<const TacticDef> reduce_tactics() {
  static const std::vector<TacticDef> all = [] {
    std::vector<TacticDef> v(std::begin(kReduceTactics), std::end(kReduceTactics));
    for (const TacticDef& t : norm_tactics()) v.push_back(t);
    for (const TacticDef& t : reduce_misc_tactics()) v.push_back(t);
    return v;
  }();
  return all;
}

}  // namespace kiln::gpu
