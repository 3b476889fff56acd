// Data movement layers: the Reshape family (aliases of their input), Transpose, Slice, Concat,
// Split, Expand, Tile, DepthToSpace, SpaceToDepth, Trilu, ConstantOfShape and Range. Every op
// here moves whole elements, so kernels dispatch on the element size only (any 1, 2, 4 or 8 byte
// type). Most ops reduce to strided copies (CopyPlan): an iteration space with source and
// destination strides, coalesced on the host and run as a vectorised row copy, a tiled transpose
// or a generic strided gather. Gather*, Scatter*, Pad and Resize live in movement_index.cu.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "layers/movement_copy.h"
#include "tactics.h"

namespace kiln::gpu {

// Shared with movement_index.cu (declared there too).
namespace movement_detail {
std::span<const TacticDef> index_tactics();    // movement_index.cu
std::span<const TacticDef> reverse_tactics();  // movement_reverse.cu

// Types whose elements the movement kernels can copy (1, 2, 4 or 8 bytes).
bool movable_type(DataType t) {
  if (t == DataType::kUndefined || t == DataType::kString || dtype_is_low_bit(t)) return false;
  const size_t s = dtype_size(t);
  return s == 1 || s == 2 || s == 4 || s == 8;
}

// Element strides of each logical (ONNX-order) dimension of `t` in its storage.
std::vector<int64_t> storage_strides(const DeviceTensor& t) {
  if (t.layout == Layout::kNHWC && t.rank() == 4) {
    const int64_t C = t.shape[1], H = t.shape[2], W = t.shape[3];
    return {H * W * C, 1, W * C, C};
  }
  return row_major_strides(t.shape);
}

// The integer values of a host input (shape, axes, pads, ...).
Expected<std::vector<int64_t>> host_ints(const DeviceTensor& t, const Node& n, const char* what) {
  if (!t.host) return KILN_ERROR("{}: input '{}' is not known on the host", n.label(), what);
  if (!dtype_is_integer(t.host->dtype()))
    return KILN_ERROR("{}: '{}' must be an integer tensor, got {}", n.label(), what,
                      t.host->desc());
  return t.host->to_int64_vector();
}

// The bits of the one-element tensor `v` converted to `t` (fill values, pad constants).
uint64_t value_bits(const Tensor& v, DataType t) {
  const Tensor c = v.dtype() == t ? v : v.cast(t);
  uint64_t bits = 0;
  std::memcpy(&bits, c.raw(), std::min<size_t>(dtype_size(t), sizeof bits));
  return bits;
}

template <typename T>
__global__ void fill_kernel(T* y, int64_t n, T v) {
  KILN_GRID_STRIDE(i, n) { y[i] = v; }
}

// Fills n elements of `esize` bytes with the low bytes of `bits`.
Status fill(void* y, int64_t n, size_t esize, uint64_t bits, cudaStream_t s) {
  if (n == 0) return Status::Ok();
  const bool ok = dispatch_bytes(esize, [&](auto tag) {
    using T = decltype(tag);
    T v;
    std::memcpy(&v, &bits, sizeof v);
    fill_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<T*>(y), n, v);
  });
  if (!ok) return KILN_ERROR("fill: unsupported element size {}", esize);
  KILN_CUDA_LAUNCH_CHECK("fill kernel");
  return Status::Ok();
}

// The widest copy unit (16, 8, 4, 2 or 1 bytes) dividing every value in `v` (sizes, pitches and
// addresses in bytes).
size_t copy_unit(std::initializer_list<int64_t> v) {
  for (size_t u : {16, 8, 4, 2}) {
    bool ok = true;
    for (int64_t x : v) ok &= x % static_cast<int64_t>(u) == 0;
    if (ok) return u;
  }
  return 1;
}

}  // namespace movement_detail

namespace {

using namespace movement_detail;

// --- strided copies ------------------------------------------------------------------------------

// StridedIndex::offset in index type Idx: 32-bit division where the iteration space allows it
// (64-bit division is several times slower and would make these copies compute bound).
template <typename Idx>
__device__ __forceinline__ int64_t offset_of(const StridedIndex& ix, Idx i) {
  int64_t off = 0;
  for (int d = ix.rank - 1; d >= 0; --d) {
    const Idx dim = static_cast<Idx>(ix.dims[d]);
    const Idx q = i / dim;
    off += static_cast<int64_t>(i - q * dim) * ix.strides[d];
    i = q;
  }
  return off;
}

// `rows` rows of `width` contiguous units; row r starts at xr.offset(r) / yr.offset(r) (units).
template <typename U, typename Idx>
__global__ void rows_kernel(const U* __restrict__ x, U* __restrict__ y, int64_t n, Idx width,
                            const __grid_constant__ StridedIndex xr,
                            const __grid_constant__ StridedIndex yr) {
  KILN_GRID_STRIDE(k, n) {
    const Idx i = static_cast<Idx>(k);
    const Idx r = i / width, c = i - r * width;
    y[offset_of(yr, r) + c] = x[offset_of(xr, r) + c];
  }
}

template <typename T, bool kDenseDst, typename Idx>
__global__ void strided_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                               const __grid_constant__ StridedIndex xi,
                               const __grid_constant__ StridedIndex yi) {
  KILN_GRID_STRIDE(k, n) {
    const Idx i = static_cast<Idx>(k);
    y[kDenseDst ? k : offset_of(yi, i)] = x[offset_of(xi, i)];
  }
}

// y[b, a, c] (dense, [batches, A, B]) = x[batch(b) + a * sa + c * sb] with sa == 1 in practice:
// a 32x32 tile is read along a (coalesced in x) and written along c (coalesced in y).
constexpr int kTile = 32;
template <typename T>
__global__ void transpose_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t A, int64_t B,
                                 int64_t sa, int64_t sb, const __grid_constant__ StridedIndex batch,
                                 int64_t batches) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t ta = (A + kTile - 1) / kTile, tb = (B + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < batches * ta * tb; t += gridDim.x) {
    const int64_t bt = t / (ta * tb), rem = t % (ta * tb);
    const int64_t a0 = rem / tb * kTile, b0 = rem % tb * kTile;
    const T* xs = x + batch.offset(bt);
    T* ys = y + bt * A * B;
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t a = a0 + threadIdx.x, b = b0 + j;
      if (a < A && b < B) tile[j][threadIdx.x] = xs[a * sa + b * sb];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      const int64_t a = a0 + j, b = b0 + threadIdx.x;
      if (a < A && b < B) ys[a * B + b] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

}  // namespace

namespace movement_detail {

Expected<CopyPlan> plan_copy(std::vector<int64_t> dims, std::vector<int64_t> src_str,
                             std::vector<int64_t> dst_str, int64_t src_off, int64_t dst_off,
                             size_t esize) {
  CopyPlan p;
  p.esize = esize;
  p.src_off = src_off;
  p.dst_off = dst_off;
  p.n = 1;
  for (int64_t d : dims) p.n *= d;
  if (p.n == 0) return p;
  if (dims.empty()) dims = {1}, src_str = {1}, dst_str = {1};
  // Walk the destination in storage order (descending strides), so that it is written densely.
  std::vector<size_t> order(dims.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return dst_str[a] > dst_str[b]; });
  std::vector<int64_t> d;
  std::vector<std::vector<int64_t>> st(2);
  for (size_t k : order) {
    d.push_back(dims[k]);
    st[0].push_back(src_str[k]);
    st[1].push_back(dst_str[k]);
  }
  coalesce_dims(d, st);
  const auto& s = st[0];
  const auto& t = st[1];
  const size_t r = d.size();
  if (r > static_cast<size_t>(kMaxDims) + 1)
    return KILN_ERROR("strided copy over {} dimensions (at most {} after merging)", r, kMaxDims);
  if (s[r - 1] == 1 && t[r - 1] == 1) {  // contiguous rows in both operands
    p.kind = CopyPlan::Kind::kRows;
    p.width = d[r - 1];
    p.rows = p.n / p.width;
    p.src_ix.rank = p.dst_ix.rank = static_cast<int>(r - 1);
    for (size_t k = 0; k + 1 < r; ++k) {
      p.src_ix.dims[k] = p.dst_ix.dims[k] = d[k];
      p.src_ix.strides[k] = s[k];
      p.dst_ix.strides[k] = t[k];
    }
    return p;
  }
  p.dst_dense = row_major_strides(d) == t;
  if (r > static_cast<size_t>(kMaxDims))
    return KILN_ERROR("strided copy over {} dimensions (at most {} after merging)", r, kMaxDims);
  if (p.dst_dense && r >= 2 && s[r - 2] == 1 && s[r - 1] != 1) {
    p.kind = CopyPlan::Kind::kTiled;
    p.A = d[r - 2], p.B = d[r - 1], p.sa = s[r - 2], p.sb = s[r - 1];
    p.batch_ix.rank = static_cast<int>(r - 2);
    p.batches = 1;
    for (size_t k = 0; k + 2 < r; ++k) {
      p.batch_ix.dims[k] = d[k];
      p.batch_ix.strides[k] = s[k];
      p.batches *= d[k];
    }
    return p;
  }
  p.kind = CopyPlan::Kind::kStrided;
  p.src_ix.rank = p.dst_ix.rank = static_cast<int>(r);
  for (size_t k = 0; k < r; ++k) {
    p.src_ix.dims[k] = p.dst_ix.dims[k] = d[k];
    p.src_ix.strides[k] = s[k];
    p.dst_ix.strides[k] = t[k];
  }
  return p;
}

int64_t addr_mod16(const void* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16);
}

Status run_copy(const CopyPlan& p, const void* src, void* dst, cudaStream_t stream) {
  if (p.kind == CopyPlan::Kind::kEmpty) return Status::Ok();
  const int64_t es = static_cast<int64_t>(p.esize);
  const char* x = static_cast<const char*>(src) + p.src_off * es;
  char* y = static_cast<char*>(dst) + p.dst_off * es;
  if (p.kind == CopyPlan::Kind::kRows) {
    if (p.rows == 1) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(y, x, p.n * es, cudaMemcpyDeviceToDevice, stream));
      return Status::Ok();
    }
    // Widest unit dividing the row width, every row stride and both addresses.
    size_t u = copy_unit({p.width * es, addr_mod16(x), addr_mod16(y)});
    for (int k = 0; k < p.src_ix.rank; ++k)
      u = std::min(
          {u, copy_unit({p.src_ix.strides[k] * es}), copy_unit({p.dst_ix.strides[k] * es})});
    const int64_t ui = static_cast<int64_t>(u);
    StridedIndex xr = p.src_ix, yr = p.dst_ix;
    for (int k = 0; k < xr.rank; ++k) {
      xr.strides[k] = xr.strides[k] * es / ui;
      yr.strides[k] = yr.strides[k] * es / ui;
    }
    dispatch_unit(u, [&](auto tag) {
      using U = decltype(tag);
      const int64_t w = p.width * es / ui;
      const int64_t n = p.rows * w;
      const U* xu = reinterpret_cast<const U*>(x);
      U* yu = reinterpret_cast<U*>(y);
      if (n <= INT32_MAX)
        rows_kernel<U, uint32_t><<<grid_for(n), kBlock, 0, stream>>>(xu, yu, n, w, xr, yr);
      else
        rows_kernel<U, int64_t><<<grid_for(n), kBlock, 0, stream>>>(xu, yu, n, w, xr, yr);
    });
    KILN_CUDA_LAUNCH_CHECK("row copy kernel");
    return Status::Ok();
  }
  const bool ok = dispatch_bytes(p.esize, [&](auto tag) {
    using T = decltype(tag);
    const T* xt = reinterpret_cast<const T*>(x);
    T* yt = reinterpret_cast<T*>(y);
    if (p.kind == CopyPlan::Kind::kTiled) {
      const int64_t tiles = p.batches * ((p.A + kTile - 1) / kTile) * ((p.B + kTile - 1) / kTile);
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(tiles, 65535 * 8));
      transpose_kernel<T><<<grid, dim3(kTile, 8), 0, stream>>>(xt, yt, p.A, p.B, p.sa, p.sb,
                                                                 p.batch_ix, p.batches);
    } else {
      const unsigned g = grid_for(p.n);
      auto launch = [&](auto dense, auto idx) {
        strided_kernel<T, decltype(dense)::value, decltype(idx)><<<g, kBlock, 0, stream>>>(
            xt, yt, p.n, p.src_ix, p.dst_ix);
      };
      const bool small = p.n <= INT32_MAX;
      if (p.dst_dense && small) launch(std::true_type{}, uint32_t{});
      else if (p.dst_dense) launch(std::true_type{}, int64_t{});
      else if (small) launch(std::false_type{}, uint32_t{});
      else launch(std::false_type{}, int64_t{});
    }
  });
  if (!ok) return KILN_ERROR("strided copy: unsupported element size {}", p.esize);
  KILN_CUDA_LAUNCH_CHECK("strided copy kernel");
  return Status::Ok();
}

}  // namespace movement_detail

namespace {

// A copy from input `in` to output `out` of the node.
struct CopyStep {
  CopyPlan plan;
  size_t in = 0, out = 0;
};
using Steps = std::vector<CopyStep>;
using Planner = Expected<Steps> (*)(const Node&, std::span<const DeviceTensor>,
                                    std::span<const DeviceTensor>);

// A copy of the whole of `x` into `y` reading x's element at each of y's coordinates through
// `src_str` (per logical dim of y) from `src_off`.
Expected<CopyStep> gather_step(const DeviceTensor& x, const DeviceTensor& y,
                               std::vector<int64_t> src_str, int64_t src_off, size_t in = 0,
                               size_t out = 0) {
  KILN_ASSIGN_OR_RETURN(CopyPlan p, plan_copy(y.shape, std::move(src_str), storage_strides(y),
                                              src_off, 0, dtype_size(y.dtype)));
  return CopyStep{p, in, out};
}

// Layers that are a list of strided copies, planned at configure time.
class CopyLayer final : public Layer {
 public:
  CopyLayer(const Node* n, Planner p) : node_(n), planner_(p) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    for (const DeviceTensor& t : out)
      if (t.present() && t.dtype != in[0].dtype)
        return KILN_ERROR("{}: output type {} differs from the input's {}", node_->label(),
                          dtype_name(t.dtype), dtype_name(in[0].dtype));
    KILN_ASSIGN_OR_RETURN(steps_, planner_(*node_, in, out));
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (steps_.size() == 1)
      return run_copy(steps_[0].plan, in[steps_[0].in].data, out[steps_[0].out].data, rc.stream);
    jobs_.clear();
    for (const CopyStep& s : steps_) jobs_.push_back({&s.plan, in[s.in].data, out[s.out].data});
    return run_copies(jobs_, rc.stream);  // a Concat's or Split's parts: disjoint
  }

 private:
  const Node* node_;
  Planner planner_;
  Steps steps_;
  std::vector<CopyJob> jobs_;
};

template <Planner P>
Expected<std::unique_ptr<Layer>> create_copy(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new CopyLayer(d.node, P));
}

Status check_shape(const Node& n, const DeviceTensor& y, const std::vector<int64_t>& want) {
  if (y.shape != want)
    return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                      shape_str(want));
  return Status::Ok();
}

// --- Transpose -----------------------------------------------------------------------------------
Expected<Steps> plan_transpose(const Node& n, std::span<const DeviceTensor> in,
                               std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  const int64_t rank = x.rank();
  std::vector<int64_t> perm = n.attrs.get_ints("perm");
  if (!n.attrs.has("perm")) {
    perm.resize(rank);
    std::iota(perm.rbegin(), perm.rend(), int64_t{0});
  }
  if (static_cast<int64_t>(perm.size()) != rank)
    return KILN_ERROR("{}: perm has {} entries for rank {}", n.label(), perm.size(), rank);
  const auto xs = storage_strides(x);
  std::vector<int64_t> shape, src;
  for (int64_t& p : perm) {
    KILN_ASSIGN_OR_RETURN(p, normalize_axis(p, rank, n));
    shape.push_back(x.shape[p]);
    src.push_back(xs[p]);
  }
  KILN_RETURN_IF_ERROR(check_shape(n, out[0], shape));
  KILN_ASSIGN_OR_RETURN(CopyStep s, gather_step(x, out[0], src, 0));
  return Steps{s};
}

// --- Slice ---------------------------------------------------------------------------------------
// Clamped start and length of one axis, as the CPU reference (src/ops/shape_slice.cpp).
std::pair<int64_t, int64_t> clamp_slice(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    return {start, end > start ? (end - start - 1) / step + 1 : 0};
  }
  if (dim == 0) return {0, 0};
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  const int64_t neg = step == INT64_MIN ? INT64_MAX : -step;
  return {start, start > end ? (start - end - 1) / neg + 1 : 0};
}

Expected<Steps> plan_slice(const Node& n, std::span<const DeviceTensor> in,
                           std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  const int64_t rank = x.rank();
  KILN_ASSIGN_OR_RETURN(auto starts, host_ints(in[1], n, "starts"));
  KILN_ASSIGN_OR_RETURN(auto ends, host_ints(in[2], n, "ends"));
  const size_t count = starts.size();
  std::vector<int64_t> axes(count), steps(count, 1);
  std::iota(axes.begin(), axes.end(), int64_t{0});
  if (in.size() > 3 && in[3].host) {
    KILN_ASSIGN_OR_RETURN(axes, host_ints(in[3], n, "axes"));
  }
  if (in.size() > 4 && in[4].host) {
    KILN_ASSIGN_OR_RETURN(steps, host_ints(in[4], n, "steps"));
  }
  if (ends.size() != count || axes.size() != count || steps.size() != count)
    return KILN_ERROR("{}: starts, ends, axes and steps must have the same length", n.label());
  std::vector<int64_t> shape = x.shape;
  std::vector<int64_t> src = storage_strides(x);
  int64_t offset = 0;
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < count; ++i) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(axes[i], rank, n));
    if (seen[ax]) return KILN_ERROR("{}: axis {} repeated in axes", n.label(), ax);
    seen[ax] = true;
    if (steps[i] == 0) return KILN_ERROR("{}: slice step cannot be 0", n.label());
    auto [start, len] = clamp_slice(starts[i], ends[i], steps[i], shape[ax]);
    shape[ax] = len;
    if (len > 0) offset += start * src[ax];
    src[ax] = len > 1 ? src[ax] * steps[i] : 0;
  }
  KILN_RETURN_IF_ERROR(check_shape(n, out[0], shape));
  KILN_ASSIGN_OR_RETURN(CopyStep s, gather_step(x, out[0], src, offset));
  return Steps{s};
}

// --- Concat, Split -------------------------------------------------------------------------------
Expected<Steps> plan_concat(const Node& n, std::span<const DeviceTensor> in,
                            std::span<const DeviceTensor> out) {
  const DeviceTensor& y = out[0];
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), y.rank(), n));
  const auto ys = storage_strides(y);
  Steps steps;
  int64_t at = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const DeviceTensor& x = in[i];
    if (x.rank() != y.rank() || x.dtype != y.dtype)
      return KILN_ERROR("{}: input {} ({}) does not match the output", n.label(), i,
                        shape_str(x.shape));
    KILN_ASSIGN_OR_RETURN(CopyPlan p, plan_copy(x.shape, storage_strides(x), ys, 0,
                                                at * ys[axis], dtype_size(y.dtype)));
    steps.push_back({p, i, 0});
    at += x.shape[axis];
  }
  if (at != y.shape[axis])
    return KILN_ERROR("{}: inputs add up to {} along axis {}, output has {}", n.label(), at, axis,
                      y.shape[axis]);
  return steps;
}

Expected<Steps> plan_split(const Node& n, std::span<const DeviceTensor> in,
                           std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  if (x.rank() == 0) return KILN_ERROR("{}: cannot split a scalar", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x.rank(), n));
  const auto xs = storage_strides(x);
  Steps steps;
  int64_t at = 0;
  for (size_t o = 0; o < out.size(); ++o) {
    const DeviceTensor& y = out[o];
    if (!y.present()) return KILN_ERROR("{}: output {} is missing", n.label(), o);
    KILN_ASSIGN_OR_RETURN(CopyStep s, gather_step(x, y, xs, at * xs[axis], 0, o));
    steps.push_back(s);
    at += y.shape[axis];
  }
  if (at != x.shape[axis])
    return KILN_ERROR("{}: outputs add up to {} along axis {}, input has {}", n.label(), at, axis,
                      x.shape[axis]);
  return steps;
}

// --- Expand, Tile --------------------------------------------------------------------------------
Expected<Steps> plan_expand(const Node& n, std::span<const DeviceTensor> in,
                            std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  const DeviceTensor& y = out[0];
  if (y.rank() < x.rank())
    return KILN_ERROR("{}: output {} has a lower rank than input {}", n.label(),
                      shape_str(y.shape), shape_str(x.shape));
  const auto xs = storage_strides(x);
  const size_t lead = y.shape.size() - x.shape.size();
  std::vector<int64_t> src(y.shape.size(), 0);
  for (size_t k = 0; k < x.shape.size(); ++k) {
    const int64_t xd = x.shape[k], yd = y.shape[lead + k];
    if (xd != yd && xd != 1)
      return KILN_ERROR("{}: cannot expand {} to {}", n.label(), shape_str(x.shape),
                        shape_str(y.shape));
    src[lead + k] = xd == 1 ? 0 : xs[k];
  }
  KILN_ASSIGN_OR_RETURN(CopyStep s, gather_step(x, y, src, 0));
  return Steps{s};
}

// The output [r0*d0, r1*d1, ...] is the view [r0, d0, r1, d1, ...] reading the input with
// stride 0 on the repeat axes.
Expected<Steps> plan_tile(const Node& n, std::span<const DeviceTensor> in,
                          std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  const DeviceTensor& y = out[0];
  KILN_ASSIGN_OR_RETURN(auto reps, host_ints(in[1], n, "repeats"));
  if (static_cast<int64_t>(reps.size()) != x.rank() || y.rank() != x.rank())
    return KILN_ERROR("{}: repeats has {} entries for rank {}", n.label(), reps.size(), x.rank());
  const auto xs = storage_strides(x);
  const auto ys = storage_strides(y);
  std::vector<int64_t> dims, src, dst;
  for (int64_t k = 0; k < x.rank(); ++k) {
    if (reps[k] < 0 || y.shape[k] != reps[k] * x.shape[k])
      return KILN_ERROR("{}: repeats {} do not turn {} into {}", n.label(), shape_str(reps),
                        shape_str(x.shape), shape_str(y.shape));
    dims.insert(dims.end(), {reps[k], x.shape[k]});
    src.insert(src.end(), {0, xs[k]});
    dst.insert(dst.end(), {x.shape[k] * ys[k], ys[k]});
  }
  KILN_ASSIGN_OR_RETURN(CopyPlan p, plan_copy(dims, src, dst, 0, 0, dtype_size(y.dtype)));
  return Steps{{p, 0, 0}};
}

// --- DepthToSpace, SpaceToDepth ------------------------------------------------------------------
// Both move element (n, c', h, w) of the deep tensor [N, C*b*b, H, W] to (n, c, h*b+i, w*b+j) of
// the wide tensor [N, C, H*b, W*b]: the iteration space is [N, C, H, b(i), W, b(j)]; c' is
// (i*b + j)*C + c (DCR) or (c*b + i)*b + j (CRD).
template <bool kToSpace>
Expected<Steps> plan_space(const Node& n, std::span<const DeviceTensor> in,
                           std::span<const DeviceTensor> out) {
  const DeviceTensor& x = in[0];
  const DeviceTensor& y = out[0];
  const int64_t b = n.attrs.get_int("blocksize", 0);
  const bool crd = n.attrs.get_string("mode", "DCR") == "CRD";
  if (x.rank() != 4 || y.rank() != 4 || b <= 0)
    return KILN_ERROR("{}: needs 4-D tensors and a positive blocksize", n.label());
  const DeviceTensor& deep = kToSpace ? x : y;
  const DeviceTensor& wide = kToSpace ? y : x;
  const int64_t N = wide.shape[0], C = wide.shape[1], H = deep.shape[2], W = deep.shape[3];
  if (deep.shape != std::vector<int64_t>{N, C * b * b, H, W} ||
      wide.shape != std::vector<int64_t>{N, C, H * b, W * b})
    return KILN_ERROR("{}: shapes {} and {} do not match blocksize {}", n.label(),
                      shape_str(x.shape), shape_str(y.shape), b);
  const auto ws = storage_strides(wide);
  const auto ds = storage_strides(deep);
  const std::vector<int64_t> dims = {N, C, H, b, W, b};
  const std::vector<int64_t> wstr = {ws[0], ws[1], ws[2] * b, ws[2], ws[3] * b, ws[3]};
  const std::vector<int64_t> dstr =
      crd ? std::vector<int64_t>{ds[0], b * b * ds[1], ds[2], b * ds[1], ds[3], ds[1]}
          : std::vector<int64_t>{ds[0], ds[1], ds[2], b * C * ds[1], ds[3], C * ds[1]};
  KILN_ASSIGN_OR_RETURN(CopyPlan p, kToSpace
                                        ? plan_copy(dims, dstr, wstr, 0, 0, dtype_size(y.dtype))
                                        : plan_copy(dims, wstr, dstr, 0, 0, dtype_size(y.dtype)));
  return Steps{{p, 0, 0}};
}

// --- Reshape family: output 0 aliases input 0 ----------------------------------------------------
// The executor normally skips these layers (alias_input = 0); when it cannot alias (graph
// output, different storage) run() copies. Dropout with its mask output is a separate layer,
// since a skipped layer would not write the mask.
class AliasLayer final : public Layer {
 public:
  explicit AliasLayer(const Node* n, bool mask) : node_(n), mask_(mask) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    if (out[0].nbytes() != in[0].nbytes())
      return KILN_ERROR("{}: output {} and input {} differ in size", node_->label(),
                        shape_str(out[0].shape), shape_str(in[0].shape));
    if (mask_ && out.size() > 1 && out[1].present()) {
      const Tensor one = Tensor::scalar<double>(1.0);
      mask_bits_ = value_bits(one, out[1].dtype);
    }
    // Dropout whose training_mode is an input: its value is known now (read on the host).
    if (mask_ && in.size() > 2 && in[2].host && in[2].host->numel() == 1 &&
        in[2].host->at_double(0) != 0.0) {
      const double ratio = in.size() > 1 && in[1].host && in[1].host->numel() == 1
                               ? in[1].host->at_double(0)
                               : (in.size() > 1 && in[1].present() ? -1.0 : 0.5);
      if (ratio != 0.0)
        return KILN_ERROR("{}: Dropout in training mode with a ratio other than 0 is random; "
                          "only inference (or ratio 0) runs", node_->label());
    }
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].data != in[0].data && out[0].nbytes() > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(out[0].data, in[0].data, out[0].nbytes(),
                                      cudaMemcpyDeviceToDevice, rc.stream));
    if (mask_ && out.size() > 1 && out[1].present())
      return fill(out[1].data, out[1].numel(), dtype_size(out[1].dtype), mask_bits_, rc.stream);
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool mask_;
  uint64_t mask_bits_ = 0;
};

template <bool kMask>
Expected<std::unique_ptr<Layer>> create_alias(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new AliasLayer(d.node, kMask));
}

bool has_mask(const LayerDesc& d) { return d.node->num_outputs() > 1 && d.node->output(1); }

// Dropout runs as identity only in inference mode (training_mode absent or false, or ratio 0).
// A training_mode given as an input is checked when its value is known (configure), by the
// layer that always runs (movement.dropout_mask; movement.dropout is skipped as an alias).
bool dropout_inference(const LayerDesc& d, std::string* why, bool checks_at_configure) {
  const Tensor* training = d.node->num_inputs() > 2 && d.node->input(2) ? d.in_const(2) : nullptr;
  if (d.node->num_inputs() > 2 && d.node->input(2) && !training)
    return checks_at_configure || (*why = "training_mode is not a constant", false);
  if (training && training->numel() == 1 && training->at_double(0) != 0.0) {
    const Tensor* ratio = d.node->num_inputs() > 1 && d.node->input(1) ? d.in_const(1) : nullptr;
    if (!ratio || ratio->numel() != 1 || ratio->at_double(0) != 0.0)
      return *why = "Dropout in training mode is random", false;
  }
  return true;
}

bool supports_data(const LayerDesc& d, std::string* why) {
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in[i].dtype != DataType::kUndefined && !movable_type(d.in[i].dtype))
      return *why = "unsupported type " + std::string(dtype_name(d.in[i].dtype)), false;
  return true;
}
// A Transpose between channels-first and channels-last, (0,2,3,1) of a tensor stored NHWC or
// (0,3,1,2) into one, leaves every element where it was: the row-major [N,H,W,C] tensor and
// the NHWC-stored [N,C,H,W] one are the same bytes. Lowering gives this tactic's candidate
// those formats (kLayoutSwap), so ConvNeXt's and Swin's permutes around a LayerNorm or a
// Linear relabel memory between an NHWC convolution and the row-major layers after it.
bool supports_layout_swap(const LayerDesc& d, std::string* why) {
  if (!supports_data(d, why)) return false;
  const std::vector<int64_t> perm = d.node->attrs.get_ints("perm");
  if (d.in.empty() || d.out.empty() || d.in_type(0).rank() != 4)
    return *why = "not a 4-D tensor", false;
  const bool to_last = perm == std::vector<int64_t>{0, 2, 3, 1};
  const bool to_first = perm == std::vector<int64_t>{0, 3, 1, 2};
  if (!to_last && !to_first) return *why = "not a swap of channels first and last", false;
  const Layout nhwc_side = to_last ? d.in[0].layout : d.out[0].layout;
  const Layout linear_side = to_last ? d.out[0].layout : d.in[0].layout;
  if (d.in[0].dtype != d.out[0].dtype || nhwc_side != Layout::kNHWC ||
      linear_side != Layout::kLinear)
    return *why = "the channels-first side is not stored NHWC", false;
  return true;
}
// A Cast whose input and output are stored alike (an FP16 layer's Cast between float32 and
// float16: both held as float16) changes nothing in memory.
bool supports_same_storage(const LayerDesc& d, std::string* why) {
  if (d.in.empty() || d.out.empty() || !(d.in[0] == d.out[0]))
    return *why = "input and output are stored differently", false;
  return supports_data(d, why);
}
bool supports_dropout(const LayerDesc& d, std::string* why) {
  if (has_mask(d)) return *why = "the mask output needs movement.dropout_mask", false;
  return supports_data(d, why) && dropout_inference(d, why, false);
}
bool supports_dropout_mask(const LayerDesc& d, std::string* why) {
  const bool input_mode = d.node->num_inputs() > 2 && d.node->input(2) && !d.in_const(2);
  if (!has_mask(d) && !input_mode) return *why = "no mask output", false;
  return supports_data(d, why) && dropout_inference(d, why, true);
}
bool supports_space(const LayerDesc& d, std::string* why) {
  if (d.in_type(0).has_rank() && d.in_type(0).rank() != 4) return *why = "4-D input only", false;
  const std::string mode = d.node->attrs.get_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD") return *why = "mode must be DCR or CRD", false;
  return supports_data(d, why);
}

// --- Trilu ---------------------------------------------------------------------------------------
template <typename T>
__global__ void trilu_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, int64_t rows,
                             int64_t cols, int64_t k, bool upper) {
  KILN_GRID_STRIDE(e, n) {
    const int64_t j = e % cols, i = (e / cols) % rows;
    const bool keep = upper ? j - i >= k : j - i <= k;
    y[e] = keep ? x[e] : T(0);  // all-zero bits: 0 / false in every type
  }
}

class TriluLayer final : public Layer {
 public:
  explicit TriluLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& x = in[0];
    if (x.rank() < 2) return KILN_ERROR("{}: Trilu input must have rank >= 2", node_->label());
    k_ = 0;
    if (in.size() > 1 && in[1].host) {
      KILN_ASSIGN_OR_RETURN(auto v, host_ints(in[1], *node_, "k"));
      if (v.size() != 1) return KILN_ERROR("{}: k must be a scalar", node_->label());
      k_ = v[0];
    }
    rows_ = x.shape[x.rank() - 2];
    cols_ = x.shape[x.rank() - 1];
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = in[0].numel();
    if (n == 0) return Status::Ok();
    const bool upper = node_->attrs.get_int("upper", 1) != 0;
    // Clamp k so that j - i (within +-2^62) compares the same and nothing overflows.
    const int64_t k = std::clamp<int64_t>(k_, -(int64_t{1} << 62), int64_t{1} << 62);
    dispatch_bytes(dtype_size(in[0].dtype), [&](auto tag) {
      using T = decltype(tag);
      trilu_kernel<T><<<grid_for(n), kBlock, 0, rc.stream>>>(static_cast<const T*>(in[0].data),
                                                             static_cast<T*>(out[0].data), n, rows_,
                                                             cols_, k, upper);
    });
    KILN_CUDA_LAUNCH_CHECK("trilu kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  int64_t k_ = 0, rows_ = 0, cols_ = 0;
};

Expected<std::unique_ptr<Layer>> create_trilu(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new TriluLayer(d.node));
}

// --- ConstantOfShape, Range ----------------------------------------------------------------------
// Their inputs are host values; the output is filled on the device.
class ConstantOfShapeLayer final : public Layer {
 public:
  explicit ConstantOfShapeLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor>,
                             std::span<const DeviceTensor> out) override {
    const Attribute* v = node_->attrs.find("value");
    Tensor value = Tensor::from<float>({1}, {0.f});
    if (v) {
      if (v->kind != Attribute::Kind::kTensor || !v->t || v->t->numel() != 1)
        return KILN_ERROR("{}: 'value' must be a one-element tensor", node_->label());
      value = *v->t;
    }
    bits_ = value_bits(value, out[0].dtype);
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor>,
             std::span<const DeviceTensor> out) override {
    return fill(out[0].data, out[0].numel(), dtype_size(out[0].dtype), bits_, rc.stream);
  }

 private:
  const Node* node_;
  uint64_t bits_ = 0;
};

// y[i] = start + i * delta computed in C (no fused multiply-add, like the CPU reference); the
// 16-bit float types without stash round to `R` after every operation.
template <typename T, typename C, typename R>
__global__ void range_kernel(T* y, int64_t n, C start, C delta) {
  KILN_GRID_STRIDE(i, n) {
    C v;
    if constexpr (std::is_same_v<C, double>) {
      v = __dadd_rn(start, __dmul_rn(static_cast<double>(i), delta));
    } else if constexpr (std::is_same_v<C, float>) {
      const float r = static_cast<float>(static_cast<R>(__fmul_rn(static_cast<float>(i), delta)));
      v = static_cast<float>(static_cast<R>(__fadd_rn(start, r)));
    } else {
      v = static_cast<C>(start + static_cast<C>(i) * delta);
    }
    store(y, i, v);
  }
}

class RangeLayer final : public Layer {
 public:
  explicit RangeLayer(const LayerDesc& d) : node_(d.node), type_(d.in_type(0).dtype) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor>) override {
    for (int i = 0; i < 3; ++i)
      if (!in[i].host || in[i].host->numel() != 1)
        return KILN_ERROR("{}: Range inputs must be scalars known on the host", node_->label());
    start_ = in[0].host->at_double(0);
    delta_ = in[2].host->at_double(0);
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor>,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    const bool stash = node_->attrs.get_int("stash_type", 1) == 1;
    const unsigned g = grid_for(n);
    bool ok = dispatch_dtype(out[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      T* y = static_cast<T*>(out[0].data);
      if constexpr (std::is_same_v<T, double>) {
        range_kernel<T, double, double><<<g, kBlock, 0, rc.stream>>>(y, n, start_, delta_);
      } else if constexpr (is_float_v<T>) {
        const float s = static_cast<float>(start_), d = static_cast<float>(delta_);
        if (!stash && type_ == DataType::kFloat16)
          range_kernel<T, float, __half><<<g, kBlock, 0, rc.stream>>>(y, n, s, d);
        else if (!stash && type_ == DataType::kBFloat16)
          range_kernel<T, float, __nv_bfloat16><<<g, kBlock, 0, rc.stream>>>(y, n, s, d);
        else
          range_kernel<T, float, float><<<g, kBlock, 0, rc.stream>>>(y, n, s, d);
      } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
        range_kernel<T, int64_t, int64_t><<<g, kBlock, 0, rc.stream>>>(
            y, n, static_cast<int64_t>(start_), static_cast<int64_t>(delta_));
      }
    });
    ok = ok && out[0].dtype != DataType::kBool;
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("range kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  DataType type_;
  double start_ = 0, delta_ = 0;
};

Expected<std::unique_ptr<Layer>> create_constant_of_shape(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ConstantOfShapeLayer(d.node));
}
Expected<std::unique_ptr<Layer>> create_range(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new RangeLayer(d));
}
bool supports_range(const LayerDesc& d, std::string* why) {
  const DataType t = d.out[0].dtype;
  if (t == DataType::kInt8 || t == DataType::kUInt8 || t == DataType::kBool ||
      !movable_type(t))
    return *why = "unsupported type " + std::string(dtype_name(t)), false;
  return true;
}

constexpr uint32_t kMove = kF32 | kF16 | kF64;
constexpr uint32_t kMoveNHWC = kMove | kNHWC;

const TacticDef kTactics[] = {
    {"", "Reshape", "movement.reshape", kMove, 0b10, supports_data, create_alias<false>, nullptr,
     0},
    {"", "Flatten", "movement.flatten", kMove, 0, supports_data, create_alias<false>, nullptr, 0},
    {"", "Squeeze", "movement.squeeze", kMove, 0b10, supports_data, create_alias<false>, nullptr,
     0},
    {"", "Unsqueeze", "movement.unsqueeze", kMove, 0b10, supports_data, create_alias<false>,
     nullptr, 0},
    {"", "Identity", "movement.identity", kMove, 0, supports_data, create_alias<false>, nullptr, 0},
    {"", "Cast", "movement.cast_same_storage", kMove, 0, supports_same_storage, create_alias<false>,
     nullptr, 0},
    {"", "Dropout", "movement.dropout", kMove, 0b110, supports_dropout, create_alias<false>,
     nullptr, 0},
    {"", "Dropout", "movement.dropout_mask", kMove, 0b110, supports_dropout_mask,
     create_alias<true>},
    // The relabelling form first: an untuned build takes the first candidate.
    {"", "Transpose", "movement.transpose_relabel", kMove | kLayoutSwap, 0, supports_layout_swap,
     create_alias<false>, nullptr, 0},
    {"", "Transpose", "movement.transpose", kMove, 0, supports_data, create_copy<plan_transpose>},
    {"", "Slice", "movement.slice", kMoveNHWC, 0b11110, supports_data, create_copy<plan_slice>},
    {"", "Concat", "movement.concat", kMoveNHWC, 0, supports_data, create_copy<plan_concat>},
    {"", "Split", "movement.split", kMoveNHWC, 0b10, supports_data, create_copy<plan_split>},
    {"", "Expand", "movement.expand", kMove, 0b10, supports_data, create_copy<plan_expand>},
    {"", "Tile", "movement.tile", kMove, 0b10, supports_data, create_copy<plan_tile>},
    {"", "DepthToSpace", "movement.depth_to_space", kMoveNHWC, 0, supports_space,
     create_copy<plan_space<true>>},
    {"", "SpaceToDepth", "movement.space_to_depth", kMoveNHWC, 0, supports_space,
     create_copy<plan_space<false>>},
    {"", "Trilu", "movement.trilu", kMove, 0b10, supports_data, create_trilu},
    {"", "ConstantOfShape", "movement.constant_of_shape", kMove, 0b1, nullptr,
     create_constant_of_shape},
    {"", "Range", "movement.range", kMove, 0b111, supports_range, create_range},
};

}  // namespace

std::span<const TacticDef> movement_tactics() {
  static const std::vector<TacticDef> table = [] {
    std::vector<TacticDef> t(std::begin(kTactics), std::end(kTactics));
    for (const TacticDef& d : movement_detail::index_tactics()) t.push_back(d);
    for (const TacticDef& d : movement_detail::reverse_tactics()) t.push_back(d);
    return t;
  }();
  return table;
}

}  // namespace kiln::gpu
