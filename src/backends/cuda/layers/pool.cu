// Pooling: MaxPool (with the optional Indices output), AveragePool (1-3 spatial axes, pads,
// auto_pad, strides, dilations, ceil_mode, count_include_pad, storage_order), GlobalAveragePool
// and GlobalMaxPool. Linear or NHWC (4-D) storage. The spec is src/ops/pool.cpp: windows visit
// their in-range taps in row-major order; MaxPool keeps the first maximum and the first NaN.
#include <algorithm>
#include <cmath>
#include <limits>

#include "device_util_host.h"
#include "kernels/device_util.cuh"
#include "kernels/int8.cuh"
#include "ops/conv_util.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kMaxSpatial = 3;

// A window pooling problem with concrete shapes (by value into kernels). Spatial axes are
// right-aligned in the kMaxSpatial slots; unused leading slots have size 1 and stride 0, which
// keeps the row-major tap order and the index arithmetic unchanged.
struct PoolParams {
  int64_t N = 0, C = 0;
  int64_t in[kMaxSpatial], out[kMaxSpatial], k[kMaxSpatial], s[kMaxSpatial], dil[kMaxSpatial];
  int64_t pb[kMaxSpatial], pe[kMaxSpatial];
  int64_t xs_n = 0, xs_c = 0, xs[kMaxSpatial];  // element strides of X per logical dim
  int64_t ys_n = 0, ys_c = 0, ys[kMaxSpatial];  // element strides of Y (and Indices)
  int64_t idx_str[kMaxSpatial];                 // Indices: row- or column-major in-plane strides
  int64_t in_plane = 0;                         // prod(in)
  int64_t total = 0;                            // N * C * prod(out)
  bool include_pad = false;
  bool c_last = false;  // threads walk Y in [N, out..., C] order (NHWC: coalesced channels)
};

// Logical strides [N, C, spatial...] of a tensor of logical `shape` stored in `layout`.
std::vector<int64_t> logical_strides(const std::vector<int64_t>& shape, Layout layout) {
  if (layout == Layout::kNHWC && shape.size() == 4) {
    const int64_t C = shape[1], H = shape[2], W = shape[3];
    return {H * W * C, 1, W * C, C};
  }
  return row_major_strides(shape);
}

// Decodes output element `i` (row-major over [N, C, out...], or [N, out..., C] when c_last)
// into coordinates.
__device__ __forceinline__ void decode(const PoolParams& p, int64_t i, int64_t& n, int64_t& c,
                                       int64_t o[kMaxSpatial]) {
  if (p.c_last) {
    c = i % p.C;
    i /= p.C;
    for (int d = kMaxSpatial - 1; d >= 0; --d) {
      o[d] = i % p.out[d];
      i /= p.out[d];
    }
    n = i;
    return;
  }
  for (int d = kMaxSpatial - 1; d >= 0; --d) {
    o[d] = i % p.out[d];
    i /= p.out[d];
  }
  c = i % p.C;
  n = i / p.C;
}

template <typename T>
__device__ __forceinline__ bool is_nan_val(Compute<T> v) {
  if constexpr (is_float_v<T>) return isnan(static_cast<double>(v));
  else return false;
}

// One thread per output element. WithIndices writes the Indices output (int64).
template <typename T, bool WithIndices>
__global__ void maxpool_kernel(const T* __restrict__ x, T* __restrict__ y,
                               int64_t* __restrict__ ind, PoolParams p) {
  using C = Compute<T>;
  KILN_GRID_STRIDE(i, p.total) {
    int64_t n, c, o[kMaxSpatial];
    decode(p, i, n, c, o);
    const T* xp = x + n * p.xs_n + c * p.xs_c;
    int64_t start[kMaxSpatial];
    for (int d = 0; d < kMaxSpatial; ++d) start[d] = o[d] * p.s[d] - p.pb[d];
    bool found = false;
    C best{};
    int64_t best_off = 0, best_idx = -1;
    for (int64_t k0 = 0; k0 < p.k[0]; ++k0) {
      const int64_t i0 = start[0] + k0 * p.dil[0];
      if (i0 < 0 || i0 >= p.in[0]) continue;
      for (int64_t k1 = 0; k1 < p.k[1]; ++k1) {
        const int64_t i1 = start[1] + k1 * p.dil[1];
        if (i1 < 0 || i1 >= p.in[1]) continue;
        for (int64_t k2 = 0; k2 < p.k[2]; ++k2) {
          const int64_t i2 = start[2] + k2 * p.dil[2];
          if (i2 < 0 || i2 >= p.in[2]) continue;
          const int64_t off = i0 * p.xs[0] + i1 * p.xs[1] + i2 * p.xs[2];
          const C v = load(xp, off);
          const bool take = !found || v > best || (is_nan_val<T>(v) && !is_nan_val<T>(best));
          if (!take) continue;
          found = true;
          best = v;
          best_off = off;
          if constexpr (WithIndices)
            best_idx = i0 * p.idx_str[0] + i1 * p.idx_str[1] + i2 * p.idx_str[2];
        }
      }
    }
    const int64_t yo = n * p.ys_n + c * p.ys_c + o[0] * p.ys[0] + o[1] * p.ys[1] + o[2] * p.ys[2];
    if (found) {
      y[yo] = xp[best_off];
    } else if constexpr (is_float_v<T>) {
      store(y, yo, -INFINITY);
    } else {
      y[yo] = std::numeric_limits<T>::lowest();
    }
    if constexpr (WithIndices) ind[yo] = found ? (n * p.C + c) * p.in_plane + best_idx : -1;
  }
}

// The common case, 2-D MaxPool on NHWC tensors without Indices (every CNN's stem): each thread
// makes V adjacent channels of one output pixel with 16-byte loads and 32-bit index math (the
// general kernel's 64-bit divisions made ResNet-50's stem pool 25x slower than memory allows).
// Same selection rule as maxpool_kernel; for values the first maximum and the last are equal.
// K > 0: a KxK window known at compile time (the stem's 3x3), so the loops unroll and the
// taps' loads issue together. Out int8 (pool.max.quantize): Y is written as the int8 codes of
// scale, quantize_code's codes (those of the quantizing kiln.Reformat, so the pair fused is
// exact): a CNN's stem pool feeding an INT8 chain writes a quarter of float16's bytes and needs
// no reformat.
// The threads of an NHWC pool kernel over [N, P, Q, C / V]: thread i makes the V channels from
// cv * V of output pixel (n, op, q), which start at element i * V of Y.
struct NhwcVecIndex {
  int n, op, q, cv;
};
struct NhwcVecGrid {
  int H, W, P, Q, CV, total;
  __device__ NhwcVecGrid(const PoolParams& p, int V)
      : H(static_cast<int>(p.in[1])), W(static_cast<int>(p.in[2])),
        P(static_cast<int>(p.out[1])), Q(static_cast<int>(p.out[2])),
        CV(static_cast<int>(p.C) / V), total(static_cast<int>(p.total) / V) {}
  __device__ NhwcVecIndex at(int i) const {
    const int cv = i % CV;
    int r = i / CV;
    const int q = r % Q;
    r /= Q;
    return {r / P, r % P, q, cv};
  }
};

template <typename T, int V, int K, typename Out = T>
__global__ void maxpool2d_nhwc_vec(const T* __restrict__ x, Out* __restrict__ y, PoolParams p,
                                   float scale = 1.f) {
  using C = Compute<T>;
  const NhwcVecGrid g(p, V);
  const int H = g.H, W = g.W;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < g.total; i += gridDim.x * blockDim.x) {
    const auto [n, op, q, cv] = g.at(i);
    C best[V];
    bool found = false;
    const int kh = K > 0 ? K : static_cast<int>(p.k[1]), kw = K > 0 ? K : static_cast<int>(p.k[2]);
#pragma unroll
    for (int a = 0; a < kh; ++a) {
      const int ih = op * static_cast<int>(p.s[1]) - static_cast<int>(p.pb[1]) + a * static_cast<int>(p.dil[1]);
      if (ih < 0 || ih >= H) continue;
#pragma unroll
      for (int b = 0; b < kw; ++b) {
        const int iw = q * static_cast<int>(p.s[2]) - static_cast<int>(p.pb[2]) + b * static_cast<int>(p.dil[2]);
        if (iw < 0 || iw >= W) continue;
        const uint4 raw = *reinterpret_cast<const uint4*>(
            x + ((static_cast<int64_t>(n) * H + ih) * W + iw) * p.C + cv * V);
        const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int l = 0; l < V; ++l) {
          const C v = load(vals, l);
          if (!found || v > best[l] || (is_nan_val<T>(v) && !is_nan_val<T>(best[l]))) best[l] = v;
        }
        found = true;
      }
    }
    const int64_t yo = static_cast<int64_t>(i) * V;
    if constexpr (std::is_same_v<Out, int8_t> && !std::is_same_v<T, int8_t>) {  // quantizing
      static_assert(V == 4 || V == 8, "4 or 8 codes per thread");
      using Pack = std::conditional_t<V == 8, uint2, uint32_t>;
      Pack packed;
      int8_t* codes = reinterpret_cast<int8_t*>(&packed);
      const float inv = 1.f / scale;
#pragma unroll
      for (int l = 0; l < V; ++l)
        codes[l] = quantize_code_inv(found ? static_cast<float>(best[l]) : -INFINITY, scale, inv);
      *reinterpret_cast<Pack*>(y + yo) = packed;
    } else {
      uint4 packed;
      T* outv = reinterpret_cast<T*>(&packed);
#pragma unroll
      for (int l = 0; l < V; ++l) store(outv, l, found ? best[l] : C(-INFINITY));
      *reinterpret_cast<uint4*>(y + yo) = packed;
    }
  }
}

// Number of kernel taps of an axis whose index lies in [lo, hi).
__device__ __forceinline__ int64_t taps_in(int64_t start, int64_t k, int64_t dil, int64_t lo,
                                           int64_t hi) {
  int64_t count = 0;
  for (int64_t t = 0; t < k; ++t) {
    const int64_t i = start + t * dil;
    count += (i >= lo && i < hi);
  }
  return count;
}

template <typename T>
__global__ void avgpool_kernel(const T* __restrict__ x, T* __restrict__ y, PoolParams p) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  KILN_GRID_STRIDE(i, p.total) {
    int64_t n, c, o[kMaxSpatial];
    decode(p, i, n, c, o);
    const T* xp = x + n * p.xs_n + c * p.xs_c;
    int64_t start[kMaxSpatial];
    int64_t valid = 1, counted = 1;
    for (int d = 0; d < kMaxSpatial; ++d) {
      start[d] = o[d] * p.s[d] - p.pb[d];
      valid *= taps_in(start[d], p.k[d], p.dil[d], 0, p.in[d]);
      counted *= taps_in(start[d], p.k[d], p.dil[d], -p.pb[d], p.in[d] + p.pe[d]);
    }
    Acc sum = 0;
    for (int64_t k0 = 0; k0 < p.k[0]; ++k0) {
      const int64_t i0 = start[0] + k0 * p.dil[0];
      if (i0 < 0 || i0 >= p.in[0]) continue;
      for (int64_t k1 = 0; k1 < p.k[1]; ++k1) {
        const int64_t i1 = start[1] + k1 * p.dil[1];
        if (i1 < 0 || i1 >= p.in[1]) continue;
        for (int64_t k2 = 0; k2 < p.k[2]; ++k2) {
          const int64_t i2 = start[2] + k2 * p.dil[2];
          if (i2 < 0 || i2 >= p.in[2]) continue;
          sum += static_cast<Acc>(load(xp, i0 * p.xs[0] + i1 * p.xs[1] + i2 * p.xs[2]));
        }
      }
    }
    const int64_t div = p.include_pad ? counted : valid;
    // A window entirely in the padding averages nothing: NaN, as the reference's 0/0.
    const Acc r = div > 0 ? sum / static_cast<Acc>(div) : std::numeric_limits<Acc>::quiet_NaN();
    store(y, n * p.ys_n + c * p.ys_c + o[0] * p.ys[0] + o[1] * p.ys[1] + o[2] * p.ys[2], r);
  }
}

// AveragePool over 2-D NHWC: a thread averages V consecutive channels of one output pixel, each
// tap one 16-byte load (the per-element kernel above reads one value a tap: NFNet's and ResNet-D's
// 2x2 stride-2 shortcut pools ran at a fraction of the memory's speed). Taps are summed in the
// order the per-element kernel sums them, so the two give the same values.
template <typename T, int V>
__global__ void avgpool2d_nhwc_vec(const T* __restrict__ x, T* __restrict__ y, PoolParams p) {
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const NhwcVecGrid g(p, V);
  const int H = g.H, W = g.W;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < g.total; i += gridDim.x * blockDim.x) {
    const auto [n, op, q, cv] = g.at(i);
    const int64_t h0 = op * p.s[1] - p.pb[1], w0 = q * p.s[2] - p.pb[2];
    const int64_t valid = taps_in(h0, p.k[1], p.dil[1], 0, H) * taps_in(w0, p.k[2], p.dil[2], 0, W);
    const int64_t counted = taps_in(h0, p.k[1], p.dil[1], -p.pb[1], H + p.pe[1]) *
                            taps_in(w0, p.k[2], p.dil[2], -p.pb[2], W + p.pe[2]);
    Acc sum[V];
#pragma unroll
    for (int l = 0; l < V; ++l) sum[l] = 0;
    for (int64_t a = 0; a < p.k[1]; ++a) {
      const int64_t ih = h0 + a * p.dil[1];
      if (ih < 0 || ih >= H) continue;
      for (int64_t b = 0; b < p.k[2]; ++b) {
        const int64_t iw = w0 + b * p.dil[2];
        if (iw < 0 || iw >= W) continue;
        const uint4 raw =
            *reinterpret_cast<const uint4*>(x + ((int64_t(n) * H + ih) * W + iw) * p.C + cv * V);
        const T* vals = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int l = 0; l < V; ++l) sum[l] += static_cast<Acc>(load(vals, l));
      }
    }
    const int64_t div = p.include_pad ? counted : valid;
    uint4 packed;
    T* outv = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int l = 0; l < V; ++l)  // a window entirely in the padding: NaN, as the reference's 0/0
      store(outv, l,
            div > 0 ? sum[l] / static_cast<Acc>(div) : std::numeric_limits<Acc>::quiet_NaN());
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(i) * V) = packed;
  }
}

bool pool_supports(const LayerDesc& d, std::string* why) {
  const TensorType& x = d.in_type(0);
  if (!x.has_rank() || x.rank() < 3 || x.rank() > 2 + kMaxSpatial)
    return *why = "1 to 3 spatial axes only", false;
  const DataType t = d.in[0].dtype;
  if (d.node->op_type == "AveragePool") {
    if (!dtype_is_float(t)) return *why = "float types only", false;
  } else if (t == DataType::kBool || t == DataType::kString || t == DataType::kUndefined) {
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  }
  return true;
}

// pool.max.quantize (kQuantOut): a 2-D MaxPool on NHWC float16/float32 with Y written as int8
// codes of its value's scale (the vectorised kernel's int8 form), no Indices.
bool pool_quantize_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.in_type(0).rank() != 4) return *why = "2-D pooling only", false;
  if (n.num_outputs() > 1 && n.output(1)) return *why = "the Indices output", false;
  const TensorFormat& x = d.in[0];
  if ((x.dtype != DataType::kFloat16 && x.dtype != DataType::kFloat32) || x.layout != Layout::kNHWC)
    return *why = "X must be float16 or float32 NHWC", false;
  if (d.out[0].dtype != DataType::kInt8 || d.out[0].layout != Layout::kNHWC || !n.output(0)->has_quant_scale())
    return *why = "Y must be int8 NHWC codes of a scale", false;
  const Dim& c = (*d.in_type(0).dims)[1];
  if (!c.is_static() || c.value % (x.dtype == DataType::kFloat16 ? 8 : 4) != 0)
    return *why = "channels must be a known multiple of 16 bytes", false;
  return true;
}

class WindowPoolLayer final : public Layer {
 public:
  explicit WindowPoolLayer(const LayerDesc& d)
      : node_(d.node),
        max_(d.node->op_type == "MaxPool"),
        quantize_(!d.out.empty() && d.out[0].dtype == DataType::kInt8 &&
                  d.node->output(0)->type.dtype != DataType::kInt8),
        scale_(quantize_ ? d.node->output(0)->quant_scales.at(0) : 1.f) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    const DeviceTensor& y = out[0];
    if (x.rank() < 3 || x.rank() > 2 + kMaxSpatial)
      return KILN_ERROR("{}: X {} needs 1 to 3 spatial axes", n.label(), shape_str(x.shape));
    const size_t nsp = static_cast<size_t>(x.rank() - 2);
    if (!n.attrs.has("kernel_shape"))
      return KILN_ERROR("{}: attribute kernel_shape is required", n.label());
    KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_window_attrs(n, nsp, {}));
    const int64_t order = n.attrs.get_int("storage_order", 0);
    if (max_ && order != 0 && order != 1)
      return KILN_ERROR("{}: storage_order must be 0 or 1, got {}", n.label(), order);
    PoolParams p;
    p.N = x.shape[0];
    p.C = x.shape[1];
    p.include_pad = n.attrs.get_int("count_include_pad", 0) != 0;
    p.c_last = y.layout == Layout::kNHWC && y.rank() == 4;
    std::vector<int64_t> want = {p.N, p.C};
    const auto xs = logical_strides(x.shape, x.layout);
    const auto ys = logical_strides(y.shape, y.layout);
    p.xs_n = xs[0];
    p.xs_c = xs[1];
    p.ys_n = ys[0];
    p.ys_c = ys[1];
    const size_t lead = kMaxSpatial - nsp;  // unused leading slots
    p.in_plane = 1;
    for (size_t s = 0; s < kMaxSpatial; ++s) {
      p.in[s] = p.out[s] = p.k[s] = p.s[s] = p.dil[s] = 1;
      p.pb[s] = p.pe[s] = 0;
      p.xs[s] = p.ys[s] = p.idx_str[s] = 0;
      if (s < lead) continue;
      const size_t d = s - lead;
      KILN_ASSIGN_OR_RETURN(AxisGeometry g, resolve_window_axis(a, d, x.shape[2 + d], true, n));
      p.in[s] = x.shape[2 + d];
      p.out[s] = g.out;
      p.k[s] = a.kernel[d];
      p.s[s] = a.strides[d];
      p.dil[s] = a.dilations[d];
      p.pb[s] = g.pad_begin;
      p.pe[s] = g.pad_end;
      p.xs[s] = xs[2 + d];
      p.ys[s] = ys[2 + d];
      p.in_plane *= p.in[s];
      want.push_back(g.out);
    }
    // Indices strides: row-major (storage_order 0) or column-major (1) over the spatial axes.
    int64_t acc = 1;
    if (order == 1) {
      for (size_t s = lead; s < kMaxSpatial; ++s) p.idx_str[s] = acc, acc *= p.in[s];
    } else {
      for (size_t s = kMaxSpatial; s-- > lead;) p.idx_str[s] = acc, acc *= p.in[s];
    }
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} differs from the window geometry's {}", n.label(),
                        shape_str(y.shape), shape_str(want));
    indices_ = max_ && out.size() > 1 && out[1].present();
    if (indices_ && (out[1].shape != y.shape || out[1].layout != y.layout ||
                     out[1].dtype != DataType::kInt64))
      return KILN_ERROR("{}: Indices must be int64 in Y's shape and layout", n.label());
    p.total = y.numel();
    p_ = p;
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (p_.total == 0) return Status::Ok();
    const DeviceTensor& x = in[0];
    const DeviceTensor& y = out[0];
    int64_t* ind = indices_ ? static_cast<int64_t*>(out[1].data) : nullptr;
    const unsigned grid = grid_for(p_.total);
    bool ok;
    if (quantize_) return run_quantize(rc, x, y);
    if (max_) {
      ok = dispatch_dtype(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, bool>) {
          const T* xp = static_cast<const T*>(x.data);
          T* yp = static_cast<T*>(y.data);
          constexpr int V = 16 / sizeof(T);
          const bool vec = is_float_v<T> && p_.c_last && x.layout == Layout::kNHWC && !ind &&
                           p_.C % V == 0 && p_.total < (int64_t(1) << 31) &&
                           reinterpret_cast<uintptr_t>(xp) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(yp) % 16 == 0;
          if (vec && p_.k[1] == 3 && p_.k[2] == 3)
            maxpool2d_nhwc_vec<T, V, 3><<<grid_for(p_.total / V), kBlock, 0, rc.stream>>>(xp, yp, p_);
          else if (vec)
            maxpool2d_nhwc_vec<T, V, 0><<<grid_for(p_.total / V), kBlock, 0, rc.stream>>>(xp, yp, p_);
          else if (ind) maxpool_kernel<T, true><<<grid, kBlock, 0, rc.stream>>>(xp, yp, ind, p_);
          else maxpool_kernel<T, false><<<grid, kBlock, 0, rc.stream>>>(xp, yp, nullptr, p_);
        }
      });
      ok = ok && x.dtype != DataType::kBool;
    } else {
      ok = dispatch_float(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* xp = static_cast<const T*>(x.data);
        T* yp = static_cast<T*>(y.data);
        constexpr int V = 16 / sizeof(T);
        const bool vec = p_.c_last && x.layout == Layout::kNHWC && p_.C % V == 0 &&
                         p_.total < (int64_t(1) << 31) &&
                         reinterpret_cast<uintptr_t>(xp) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(yp) % 16 == 0;
        if (vec)
          avgpool2d_nhwc_vec<T, V><<<grid_for(p_.total / V), kBlock, 0, rc.stream>>>(xp, yp, p_);
        else
          avgpool_kernel<T><<<grid, kBlock, 0, rc.stream>>>(xp, yp, p_);
      });
    }
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(x.dtype));
    KILN_CUDA_LAUNCH_CHECK(max_ ? "maxpool kernel" : "avgpool kernel");
    return Status::Ok();
  }

 private:
  // pool.max.quantize: the vectorised NHWC kernel writing Y's int8 codes.
  Status run_quantize(const RunContext& rc, const DeviceTensor& x, const DeviceTensor& y) {
    auto* yp = static_cast<int8_t*>(y.data);
    const int V = x.dtype == DataType::kFloat16 ? 8 : 4;
    if (!max_ || !p_.c_last || x.layout != Layout::kNHWC || indices_ || p_.C % V != 0 ||
        p_.total >= (int64_t(1) << 31) || reinterpret_cast<uintptr_t>(x.data) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(yp) % V != 0 ||
        (x.dtype != DataType::kFloat16 && x.dtype != DataType::kFloat32))
      return KILN_ERROR("{}: the quantizing max-pool takes 2-D NHWC float16/float32 with 16-byte "
                        "channel rows only", node_->label());
    const unsigned grid = grid_for(p_.total / V);
    const bool k3 = p_.k[1] == 3 && p_.k[2] == 3;
    if (x.dtype == DataType::kFloat16) {
      const auto* xp = static_cast<const __half*>(x.data);
      if (k3) maxpool2d_nhwc_vec<__half, 8, 3, int8_t><<<grid, kBlock, 0, rc.stream>>>(xp, yp, p_, scale_);
      else maxpool2d_nhwc_vec<__half, 8, 0, int8_t><<<grid, kBlock, 0, rc.stream>>>(xp, yp, p_, scale_);
    } else {
      const auto* xp = static_cast<const float*>(x.data);
      if (k3) maxpool2d_nhwc_vec<float, 4, 3, int8_t><<<grid, kBlock, 0, rc.stream>>>(xp, yp, p_, scale_);
      else maxpool2d_nhwc_vec<float, 4, 0, int8_t><<<grid, kBlock, 0, rc.stream>>>(xp, yp, p_, scale_);
    }
    KILN_CUDA_LAUNCH_CHECK("quantizing maxpool kernel");
    return Status::Ok();
  }

  const Node* node_;
  bool max_;
  bool quantize_;  // pool.max.quantize: Y is int8 codes of scale_
  float scale_;
  bool indices_ = false;
  PoolParams p_;
};

// --- GlobalAveragePool / GlobalMaxPool ----------------------------------------------------------

// The reference's max: NaN once seen stays; otherwise the larger.
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) {
  if (isnan(static_cast<double>(a))) return a;
  if (isnan(static_cast<double>(b))) return b;
  return b > a ? b : a;
}

template <bool kMax, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (kMax) return nan_max(a, b);
  else return a + b;
}

template <bool kMax, typename A>
__device__ __forceinline__ A warp_reduce(A v) {
  for (int o = 16; o > 0; o /= 2) v = combine<kMax>(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Linear layout: plane p holds `len` contiguous elements at x + p * len. blockDim.x threads
// (32: a warp per plane; 256: a block per plane) reduce one plane; blockDim.y planes per block.
template <bool kMax, typename T>
__global__ void global_pool_linear(const T* __restrict__ x, T* __restrict__ y, int64_t planes,
                                   int64_t len) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ A partial[32][8];  // [warp within plane][plane within block]
  const int64_t step = int64_t(gridDim.x) * blockDim.y;
  for (int64_t pl = blockIdx.x * int64_t(blockDim.y) + threadIdx.y; pl - threadIdx.y < planes;
       pl += step) {
    const bool live = pl < planes;
    const T* xp = x + (live ? pl : 0) * len;
    A v = kMax ? (len > 0 && live ? static_cast<A>(load(xp, 0)) : A(0)) : A(0);
    if (live)
      for (int64_t i = threadIdx.x; i < len; i += blockDim.x) v = combine<kMax>(v, A(load(xp, i)));
    v = warp_reduce<kMax>(v);
    if (blockDim.x > 32) {  // one plane per block (blockDim.y == 1)
      const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
      if (lane == 0) partial[w][0] = v;
      __syncthreads();
      if (w == 0) {
        v = lane < int(blockDim.x / 32) ? partial[lane][0] : (kMax ? partial[0][0] : A(0));
        v = warp_reduce<kMax>(v);
      }
      __syncthreads();
    }
    if (live && threadIdx.x == 0) store(y, pl, kMax ? v : v / static_cast<A>(len));
  }
}

// NHWC: x is [N, HW, C]; y is [N, C]. Threads of a warp take 32 adjacent channels (coalesced);
// blockDim.y threads split the HW positions; a shared-memory pass combines them.
template <bool kMax, typename T>
__global__ void global_pool_nhwc(const T* __restrict__ x, T* __restrict__ y, int64_t N,
                                 int64_t HW, int64_t C) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  __shared__ A partial[8][33];
  const int64_t chunks = (C + 31) / 32;
  for (int64_t b = blockIdx.x; b < N * chunks; b += gridDim.x) {
    const int64_t n = b / chunks, c = (b % chunks) * 32 + threadIdx.x;
    const bool live = c < C;
    const T* xp = x + n * HW * C + (live ? c : 0);
    A v = kMax ? (HW > 0 && live ? static_cast<A>(load(xp, 0)) : A(0)) : A(0);
    if (live)
      for (int64_t i = threadIdx.y; i < HW; i += blockDim.y) v = combine<kMax>(v, A(load(xp, i * C)));
    partial[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && live) {
      for (int r = 1; r < int(blockDim.y); ++r) v = combine<kMax>(v, partial[r][threadIdx.x]);
      store(y, n * C + c, kMax ? v : v / static_cast<A>(HW));
    }
    __syncthreads();
  }
}

// The same over many blocks when N * C is too small to fill the GPU (EfficientNet's squeeze-
// excitation pools: 32 images x 32 channels over 112x112 took 0.63 ms in one block per image):
// block (b, s) reduces positions [s*HW/S, (s+1)*HW/S) into float partials [N, S, C], and
// global_pool_combine folds the S partials.
template <bool kMax, typename T>
__global__ void global_pool_nhwc_split(const T* __restrict__ x, float* __restrict__ part,
                                       int64_t N, int64_t HW, int64_t C, int S) {
  __shared__ float partial[8][33];
  const int64_t chunks = (C + 31) / 32;
  const int64_t b = blockIdx.x / S;
  const int s = blockIdx.x % S;
  const int64_t n = b / chunks, c = (b % chunks) * 32 + threadIdx.x;
  const bool live = c < C;
  const int64_t lo = HW * s / S, hi = HW * (s + 1) / S;
  const T* xp = x + n * HW * C + (live ? c : 0);
  float v = kMax ? -INFINITY : 0.f;
  if (live)
    for (int64_t i = lo + threadIdx.y; i < hi; i += blockDim.y) v = combine<kMax>(v, float(load(xp, i * C)));
  partial[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y == 0 && live) {
    for (int r = 1; r < int(blockDim.y); ++r) v = combine<kMax>(v, partial[r][threadIdx.x]);
    part[(n * S + s) * C + c] = v;
  }
}

// The split average with 16-byte loads (V channels a load): block (n, s) reduces positions
// [s*HW/S, (s+1)*HW/S) of image n for every channel, thread t taking channel vector t % CV of
// position t / CV, so a warp reads consecutive 16-byte vectors of [HW, C] memory; the rows'
// sums meet in shared memory and the partials [N, S, C] go to global_pool_combine. EfficientNet's
// squeeze-excitation pools (C of 24 to 1152 over up to 150x150) read 2 bytes a thread before.
template <typename T>
__global__ void __launch_bounds__(256)
    global_avg_nhwc_split_vec(const T* __restrict__ x, float* __restrict__ part, int64_t HW,
                              int64_t C, int S) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float sums[256][V + 1];
  const int CV = static_cast<int>(C / V);
  const int rows = static_cast<int>(blockDim.x) / CV;
  const int t = threadIdx.x, cv = t % CV, r = t / CV;
  const int64_t n = blockIdx.x / S;
  const int s = blockIdx.x % S;
  const int64_t lo = HW * s / S, hi = HW * (s + 1) / S;
  float acc[V] = {};
  if (r < rows) {
    const T* xp = x + n * HW * C + cv * V;
    for (int64_t p = lo + r; p < hi; p += rows) {
      const uint4 u = *reinterpret_cast<const uint4*>(xp + p * C);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += static_cast<float>(e[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) sums[t][j] = acc[j];
  __syncthreads();
  if (t < CV) {
    for (int k = 1; k < rows; ++k)
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += sums[k * CV + t][j];
#pragma unroll
    for (int j = 0; j < V; ++j) part[(n * S + s) * C + t * V + j] = acc[j];
  }
}

template <bool kMax, typename T>
__global__ void global_pool_combine(const float* __restrict__ part, T* __restrict__ y, int64_t N,
                                    int64_t HW, int64_t C, int S) {
  KILN_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    float v = kMax ? -INFINITY : 0.f;
    for (int s = 0; s < S; ++s) v = combine<kMax>(v, part[(n * S + s) * C + c]);
    store(y, i, kMax ? v : v / static_cast<float>(HW));
  }
}

// NHWC averages with 16-byte loads (V = 16 / sizeof(T) channels a load): thread (tx, ty) of a
// 32 x 8 block takes channel vector tx of the block's 32 * V channels at positions ty, ty + 8,
// ...; a shared-memory pass adds the 8 partial sums. ResNet-50's pool (batch 256, 2048 channels
// over 7 x 7) read 2-byte elements 64 bytes a warp and took 0.068 ms, 4x its bytes' time.
// kCodes: X holds its value's int8 codes (pool.global_avg.codes), summed exactly in int32 and
// dequantized once: mean = float(sum) * scale / HW.
template <typename T, typename Out, bool kCodes>
__global__ void __launch_bounds__(256)
    global_avg_nhwc_vec(const T* __restrict__ x, Out* __restrict__ y, int64_t N, int64_t HW,
                        int64_t C, float scale) {
  constexpr int V = 16 / sizeof(T);
  using A = std::conditional_t<kCodes, int, float>;
  __shared__ A partial[8][32][V + 1];
  const int64_t vectors = C / V, chunks = (vectors + 31) / 32;
  for (int64_t b = blockIdx.x; b < N * chunks; b += gridDim.x) {
    const int64_t n = b / chunks, v = (b % chunks) * 32 + threadIdx.x;
    const bool live = v < vectors;
    A acc[V] = {};
    if (live) {
      const uint4* xp = reinterpret_cast<const uint4*>(x + n * HW * C + v * V);
      const int64_t row = C / V;  // uint4s per position
      for (int64_t i = threadIdx.y; i < HW; i += 8) {
        const uint4 u = xp[i * row];
        if constexpr (kCodes) {
          const int8_t* c = reinterpret_cast<const int8_t*>(&u);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] += c[j];
        } else {
          const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] += static_cast<float>(e[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) partial[threadIdx.y][threadIdx.x][j] = acc[j];
    __syncthreads();
    if (threadIdx.y == 0 && live) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        A sum = acc[j];
        for (int r = 1; r < 8; ++r) sum += partial[r][threadIdx.x][j];
        const float mean = kCodes ? static_cast<float>(sum) * scale / static_cast<float>(HW)
                                  : static_cast<float>(sum) / static_cast<float>(HW);
        store(y, n * C + v * V + j, mean);
      }
    }
    __syncthreads();
  }
}

// pool.global_avg.codes (kQuantIn0): GlobalAveragePool reading its input as the value's int8
// codes (an INT8 chain's last tensor: no dequantizing reformat ahead of the head), 4-D NHWC,
// channels a multiple of 16, float output.
bool global_avg_codes_supports(const LayerDesc& d, std::string* why) {
  const TensorType& x = d.in_type(0);
  if (x.rank() != 4 || d.in[0].layout != Layout::kNHWC) return *why = "4-D NHWC only", false;
  if (d.in[0].dtype != DataType::kInt8 || !d.node->input(0)->has_quant_scale())
    return *why = "X must be stored as int8 codes of a scale", false;
  const Dim& c = (*x.dims)[1];
  if (!c.is_static() || c.value % 16 != 0)
    return *why = "channels must be a known multiple of 16", false;
  if (d.out[0].dtype != DataType::kFloat32 && d.out[0].dtype != DataType::kFloat16)
    return *why = "Y must be float32 or float16", false;
  return true;
}

bool global_pool_supports(const LayerDesc& d, std::string* why) {
  const TensorType& x = d.in_type(0);
  if (x.has_rank() && x.rank() < 2) return *why = "X must have rank >= 2", false;
  if (!dtype_is_float(d.in[0].dtype)) return *why = "float types only", false;
  return true;
}

class GlobalPoolLayer final : public Layer {
 public:
  explicit GlobalPoolLayer(const LayerDesc& d)
      : node_(d.node), max_(d.node->op_type == "GlobalMaxPool") {
    if (!d.in.empty() && d.in[0].dtype == DataType::kInt8 && d.node->input(0)->has_quant_scale())
      scale_ = d.node->input(0)->quant_scales[0];
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& x = in[0];
    if (x.rank() < 2)
      return KILN_ERROR("{}: X must have rank >= 2, got {}", node_->label(), shape_str(x.shape));
    std::vector<int64_t> want = {x.shape[0], x.shape[1]};
    want.resize(x.shape.size(), 1);
    if (out[0].shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", node_->label(),
                        shape_str(out[0].shape), shape_str(want));
    N_ = x.shape[0];
    C_ = x.shape[1];
    planes_ = N_ * C_;
    len_ = planes_ == 0 ? 0 : x.numel() / planes_;
    if (max_ && len_ == 0 && planes_ > 0)
      return KILN_ERROR("{}: cannot take the max over empty spatial dims of {}", node_->label(),
                        shape_str(x.shape));
    nhwc_ = x.rank() == 4 && x.layout == Layout::kNHWC;
    // Y is [N, C, 1, 1]: its NHWC and linear orders coincide.
    splits_ = 1;
    const int64_t blocks = N_ * ((C_ + 31) / 32);
    if (nhwc_ && C_ > 1 && x.dtype != DataType::kFloat64 && len_ >= 512 &&
        blocks < kSplitTargetBlocks)
      splits_ = static_cast<int>(std::clamp<int64_t>(kSplitTargetBlocks / blocks, 1, len_ / 256));
    // The vector split (global_avg_nhwc_split_vec): a block per image and span of positions,
    // all channels; spans of at least 8 rows of 256 / (C / V) positions. Taken where the plain
    // vector kernel would have too few blocks to fill the GPU (it has one per image and 32
    // channel vectors) and each of its threads many positions to read in a row: EfficientNet-B3's
    // 288-channel 36x36 pools at batch 32 ran 64 blocks of threads reading 162 vectors each,
    // 44 us, 18 us split. Below 512 positions the second kernel costs more than it saves.
    vec_splits_ = 0;
    const size_t es = dtype_size(x.dtype);
    if (nhwc_ && !max_ && (es == 2 || es == 4) && C_ % int64_t(16 / es) == 0 &&
        C_ / int64_t(16 / es) <= 256) {
      const int64_t CV = C_ / int64_t(16 / es), rows = 256 / CV;
      const int64_t vec_blocks = N_ * ((CV + 31) / 32);
      const int64_t s = std::clamp<int64_t>(kSplitTargetBlocks / std::max<int64_t>(N_, 1), 1,
                                            std::max<int64_t>(1, len_ / (8 * rows)));
      if (splits_ > 1 || (vec_blocks < kSplitTargetBlocks && len_ >= 512 && s > 1))
        vec_splits_ = static_cast<int>(s);
    }
    const int64_t parts = std::max<int64_t>(splits_ > 1 ? splits_ : 0, vec_splits_);
    return parts > 1 || vec_splits_ ? static_cast<size_t>(N_ * parts * C_) * sizeof(float)
                                    : size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (planes_ == 0) return Status::Ok();
    if (in[0].dtype == DataType::kInt8) {  // pool.global_avg.codes
      if (!nhwc_ || C_ % 16 != 0 || scale_ <= 0 || !aligned16(in[0].data))
        return KILN_ERROR("{}: int8 codes need 16-byte aligned NHWC rows of 16-channel multiples "
                          "and a scale", node_->label());
      const bool ok = dispatch_float(out[0].dtype, [&](auto tag) {
        using O = decltype(tag);
        global_avg_nhwc_vec<int8_t, O, true><<<vec_grid(16), dim3(32, 8), 0, rc.stream>>>(
            static_cast<const int8_t*>(in[0].data), static_cast<O*>(out[0].data), N_, len_, C_,
            scale_);
      });
      if (!ok) return KILN_ERROR("{}: output type {}", node_->label(), dtype_name(out[0].dtype));
      KILN_CUDA_LAUNCH_CHECK("global average pool kernel (int8 codes)");
      return Status::Ok();
    }
    const size_t esize = dtype_size(in[0].dtype);
    if (vec_splits_ > 0 && aligned16(in[0].data)) {
      const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (sizeof(T) == 2 || sizeof(T) == 4) {
          float* part = static_cast<float*>(rc.workspace);
          global_avg_nhwc_split_vec<T><<<static_cast<unsigned>(N_ * vec_splits_), 256, 0,
                                         rc.stream>>>(static_cast<const T*>(in[0].data), part,
                                                      len_, C_, vec_splits_);
          global_pool_combine<false, T><<<grid_for(planes_), kBlock, 0, rc.stream>>>(
              part, static_cast<T*>(out[0].data), N_, len_, C_, vec_splits_);
        }
      });
      if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
      KILN_CUDA_LAUNCH_CHECK("global average pool kernel (vector split)");
      return Status::Ok();
    }
    if (nhwc_ && !max_ && splits_ == 1 && esize <= 4 && C_ % (16 / esize) == 0 &&
        aligned16(in[0].data)) {
      const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (sizeof(T) <= 4)
          global_avg_nhwc_vec<T, T, false><<<vec_grid(16 / sizeof(T)), dim3(32, 8), 0,
                                             rc.stream>>>(static_cast<const T*>(in[0].data),
                                                          static_cast<T*>(out[0].data), N_, len_,
                                                          C_, 1.f);
      });
      if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
      KILN_CUDA_LAUNCH_CHECK("global average pool kernel (vector loads)");
      return Status::Ok();
    }
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in[0].data);
      T* y = static_cast<T*>(out[0].data);
      if (splits_ > 1) {
        if constexpr (!std::is_same_v<T, double>) {
          const unsigned grid = static_cast<unsigned>(N_ * ((C_ + 31) / 32) * splits_);
          float* part = static_cast<float*>(rc.workspace);
          if (max_) {
            global_pool_nhwc_split<true, T><<<grid, dim3(32, 8), 0, rc.stream>>>(x, part, N_, len_, C_, splits_);
            global_pool_combine<true, T><<<grid_for(planes_), kBlock, 0, rc.stream>>>(part, y, N_, len_, C_, splits_);
          } else {
            global_pool_nhwc_split<false, T><<<grid, dim3(32, 8), 0, rc.stream>>>(x, part, N_, len_, C_, splits_);
            global_pool_combine<false, T><<<grid_for(planes_), kBlock, 0, rc.stream>>>(part, y, N_, len_, C_, splits_);
          }
        }
        return;
      }
      if (nhwc_ && C_ > 1) {
        const int64_t blocks = N_ * ((C_ + 31) / 32);
        const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, 65535 * 8));
        if (max_) global_pool_nhwc<true, T><<<grid, dim3(32, 8), 0, rc.stream>>>(x, y, N_, len_, C_);
        else global_pool_nhwc<false, T><<<grid, dim3(32, 8), 0, rc.stream>>>(x, y, N_, len_, C_);
        return;
      }
      const bool wide = len_ >= 4096;  // a block per plane; else a warp per plane
      const dim3 block = wide ? dim3(256, 1) : dim3(32, 8);
      const int64_t blocks = (planes_ + block.y - 1) / block.y;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, 65535 * 8));
      if (max_) global_pool_linear<true, T><<<grid, block, 0, rc.stream>>>(x, y, planes_, len_);
      else global_pool_linear<false, T><<<grid, block, 0, rc.stream>>>(x, y, planes_, len_);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK(max_ ? "global max pool kernel" : "global average pool kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool max_;
  bool nhwc_ = false;
  int splits_ = 1;  // > 1: HW split over blocks (global_pool_nhwc_split)
  int vec_splits_ = 0;  // > 0: the vector split instead (global_avg_nhwc_split_vec)
  float scale_ = 0;  // pool.global_avg.codes: the scale of X's int8 codes

  // global_avg_nhwc_vec's blocks: one per image and 32 vectors of v channels.
  unsigned vec_grid(int64_t v) const {
    return static_cast<unsigned>(std::min<int64_t>(N_ * ((C_ / v + 31) / 32), 65535 * 8));
  }
  int64_t N_ = 0, C_ = 0, planes_ = 0, len_ = 0;
  static constexpr int64_t kSplitTargetBlocks = 4 * 132;  // a few waves on an H100
};

Expected<std::unique_ptr<Layer>> create_window_pool(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new WindowPoolLayer(d));
}
Expected<std::unique_ptr<Layer>> create_global_pool(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GlobalPoolLayer(d));
}

constexpr uint32_t kPoolCaps = kF32 | kF16 | kF64 | kNHWC;

const TacticDef kPoolTactics[] = {
    {"", "MaxPool", "pool.max", kPoolCaps, 0, pool_supports, create_window_pool},
    {"", "MaxPool", "pool.max.quantize", kF32 | kF16 | kNHWC | kQuantOut, 0, pool_quantize_supports,
     create_window_pool},
    {"", "AveragePool", "pool.avg", kPoolCaps, 0, pool_supports, create_window_pool},
    {"", "GlobalAveragePool", "pool.global_avg", kPoolCaps, 0, global_pool_supports,
     create_global_pool},
    {"", "GlobalAveragePool", "pool.global_avg.codes", kF32 | kF16 | kNHWC | kQuantIn0, 0,
     global_avg_codes_supports, create_global_pool},
    {"", "GlobalMaxPool", "pool.global_max", kPoolCaps, 0, global_pool_supports,
     create_global_pool},
};

}  // namespace

std::span<const TacticDef> pool_tactics() { return kPoolTactics; }

}  // namespace kiln::gpu
