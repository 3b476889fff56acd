// Index-driven data movement: Gather, GatherElements, GatherND, ScatterND, ScatterElements, Pad
// and Resize (nearest, linear, cubic; every coordinate transformation; antialias). Joined into
// movement_tactics() by movement.cu. The spec is the CPU reference (src/ops/index_gather.cpp,
// scatter.cpp, pad.cpp, resize.cpp).
//
// Out-of-range indices: the CPU reference returns an error, which a GPU kernel cannot do without
// a host round trip. Here a gathered element whose index is out of range is written as zero
// (all-zero bits), and a scattered update with an out-of-range index is dropped; neither reads
// or writes outside the tensors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/device_util.cuh"
#include "kernels/fast_div.cuh"
#include "kernels/pdl.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

namespace movement_detail {  // defined in movement.cu
std::span<const TacticDef> index_tactics();
bool movable_type(DataType t);
std::vector<int64_t> storage_strides(const DeviceTensor& t);
Expected<std::vector<int64_t>> host_ints(const DeviceTensor& t, const Node& n, const char* what);
uint64_t value_bits(const Tensor& v, DataType t);
size_t copy_unit(std::initializer_list<int64_t> v);
}  // namespace movement_detail

namespace {

using namespace movement_detail;

int64_t addr_mod16(const void* p) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % 16);
}

// Calls f(I{}) with I the index type (int32 or int64).
template <typename F>
bool dispatch_index(DataType t, F&& f) {
  if (t == DataType::kInt32) return f(int32_t{}), true;
  if (t == DataType::kInt64) return f(int64_t{}), true;
  return false;
}

// Iteration order of a tensor's storage: its logical dims by descending storage stride.
std::vector<size_t> storage_order(const DeviceTensor& t) {
  const auto s = storage_strides(t);
  std::vector<size_t> order(s.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s[a] > s[b]; });
  return order;
}

// --- Gather --------------------------------------------------------------------------------------
// y[o, j, r] = x[o, ind[j], r] in units U (whole rows of `inner` elements move together).
// Idx: the index type of the iteration space (uint32_t where it fits: 32-bit division is cheap).
template <typename U, typename I, typename Idx>
__global__ void gather_kernel(const U* __restrict__ x, U* __restrict__ y,
                              const I* __restrict__ ind, int64_t n, Idx nidx, Idx inner,
                              int64_t dim) {
  pdl_wait();  // kernels/pdl.cuh
  pdl_launch_dependents();
  KILN_GRID_STRIDE(i, n) {
    const Idx t = static_cast<Idx>(i) / inner, r = static_cast<Idx>(i) - t * inner;
    const Idx o = t / nidx, j = t - o * nidx;
    int64_t v = ind[j];
    if (v < 0) v += dim;
    y[i] = v >= 0 && v < dim ? x[(o * dim + v) * inner + r] : U{};
  }
}

class GatherLayer final : public Layer {
 public:
  explicit GatherLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& x = in[0];
    if (x.rank() == 0) return KILN_ERROR("{}: Gather data must have rank >= 1", node_->label());
    KILN_ASSIGN_OR_RETURN(int64_t axis,
                          normalize_axis(node_->attrs.get_int("axis", 0), x.rank(), *node_));
    outer_ = inner_ = 1;
    for (int64_t k = 0; k < axis; ++k) outer_ *= x.shape[k];
    for (int64_t k = axis + 1; k < x.rank(); ++k) inner_ *= x.shape[k];
    dim_ = x.shape[axis];
    nidx_ = in[1].numel();
    std::vector<int64_t> want(x.shape.begin(), x.shape.begin() + axis);
    want.insert(want.end(), in[1].shape.begin(), in[1].shape.end());
    want.insert(want.end(), x.shape.begin() + axis + 1, x.shape.end());
    if (out[0].shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", node_->label(),
                        shape_str(out[0].shape), shape_str(want));
    return size_t{0};
  }
  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t es = static_cast<int64_t>(dtype_size(in[0].dtype));
    if (out[0].numel() == 0) return Status::Ok();
    const size_t u = copy_unit({inner_ * es, addr_mod16(in[0].data), addr_mod16(out[0].data)});
    const int64_t inner = inner_ * es / static_cast<int64_t>(u);
    const int64_t n = outer_ * nidx_ * inner;
    bool ok = false;
    dispatch_unit(u, [&](auto utag) {
      using U = decltype(utag);
      ok = dispatch_index(in[1].dtype, [&](auto itag) {
        using I = decltype(itag);
        const U* x = static_cast<const U*>(in[0].data);
        U* y = static_cast<U*>(out[0].data);
        const I* ind = static_cast<const I*>(in[1].data);
        const dim3 grid(grid_for(n)), block(kBlock);  // errors stay for the check below
        if (n <= INT32_MAX)
          (void)launch_kernel(rc, gather_kernel<U, I, uint32_t>, grid, block, 0, x, y, ind, n,
                              static_cast<uint32_t>(nidx_), static_cast<uint32_t>(inner), dim_);
        else
          (void)launch_kernel(rc, gather_kernel<U, I, int64_t>, grid, block, 0, x, y, ind, n,
                              nidx_, inner, dim_);
      });
    });
    if (!ok) return KILN_ERROR("{}: indices must be int32 or int64", node_->label());
    KILN_CUDA_LAUNCH_CHECK("gather kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  int64_t outer_ = 1, inner_ = 1, dim_ = 0, nidx_ = 0;
};

// --- GatherElements, ScatterElements -------------------------------------------------------------
// Element e of the index tensor (coordinates c over `dims`) addresses data element
// sum_k (k == axis ? index : c_k) * strides_k.
struct ElementIndex {
  int rank = 0, axis = 0;
  int64_t dims[kMaxDims] = {}, data_dims[kMaxDims] = {}, strides[kMaxDims] = {};
  // The data offset of index element e holding index value v; -1 when out of range.
  __device__ int64_t offset(int64_t e, int64_t v) const {
    int64_t off = 0;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = e % dims[d];
      e /= dims[d];
      if (d == axis) {
        c = v < 0 ? v + data_dims[d] : v;
      }
      if (c < 0 || c >= data_dims[d]) return -1;
      off += c * strides[d];
    }
    return off;
  }
};

Expected<ElementIndex> element_index(const Node& n, const DeviceTensor& data,
                                     const DeviceTensor& ind) {
  if (data.rank() != ind.rank() || data.rank() == 0)
    return KILN_ERROR("{}: data {} and indices {} must have the same rank >= 1", n.label(),
                      shape_str(data.shape), shape_str(ind.shape));
  if (data.rank() > kMaxDims) return KILN_ERROR("{}: rank above {}", n.label(), kMaxDims);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), data.rank(), n));
  ElementIndex ix;
  ix.rank = static_cast<int>(data.rank());
  ix.axis = static_cast<int>(axis);
  const auto s = row_major_strides(data.shape);
  for (int d = 0; d < ix.rank; ++d) {
    ix.dims[d] = ind.shape[d];
    ix.data_dims[d] = data.shape[d];
    ix.strides[d] = s[d];
  }
  return ix;
}

template <typename T, typename I>
__global__ void gather_elements_kernel(const T* __restrict__ x, T* __restrict__ y,
                                       const I* __restrict__ ind, int64_t n,
                                       const __grid_constant__ ElementIndex ix) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t off = ix.offset(i, ind[i]);
    y[i] = off >= 0 ? x[off] : T(0);
  }
}

// --- GatherND ------------------------------------------------------------------------------------
// Index tuple t (m values) picks the slice at data offset (t / tuples) * batch_elems +
// sum_k index_k * strides_k; slices of `slice` units are copied whole.
struct TupleIndex {
  int m = 0;
  int64_t dims[kMaxDims] = {}, strides[kMaxDims] = {};  // strides in units
  // The offset of tuple `ind`; -1 when an index is out of range.
  template <typename I>
  __device__ int64_t offset(const I* ind) const {
    int64_t off = 0;
    for (int k = 0; k < m; ++k) {
      int64_t v = ind[k];
      if (v < 0) v += dims[k];
      if (v < 0 || v >= dims[k]) return -1;
      off += v * strides[k];
    }
    return off;
  }
};

template <typename U, typename I>
__global__ void gather_nd_kernel(const U* __restrict__ x, U* __restrict__ y,
                                 const I* __restrict__ ind, int64_t n, int64_t slice,
                                 int64_t tuples, int64_t batch_elems,
                                 const __grid_constant__ TupleIndex ix) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t t = i / slice, e = i % slice;
    const int64_t off = ix.offset(ind + t * ix.m);
    y[i] = off >= 0 ? x[(t / tuples) * batch_elems + off + e] : U{};
  }
}

class GatherNDLayer final : public Layer {
 public:
  explicit GatherNDLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    const DeviceTensor& ind = in[1];
    const int64_t b = n.attrs.get_int("batch_dims", 0);
    const int64_t r = x.rank(), q = ind.rank();
    if (r < 1 || q < 1 || b < 0 || b >= std::min(r, q))
      return KILN_ERROR("{}: bad ranks {} / {} for batch_dims {}", n.label(), r, q, b);
    const int64_t m = ind.shape.back();
    if (m < 1 || m > r - b || m > kMaxDims)
      return KILN_ERROR("{}: indices last dimension {} must be in [1, {}]", n.label(), m, r - b);
    for (int64_t k = 0; k < b; ++k)
      if (x.shape[k] != ind.shape[k])
        return KILN_ERROR("{}: batch dimension {} differs", n.label(), k);
    batches_ = tuples_ = slice_ = 1;
    for (int64_t k = 0; k < b; ++k) batches_ *= x.shape[k];
    for (int64_t k = b; k < q - 1; ++k) tuples_ *= ind.shape[k];
    for (int64_t k = b + m; k < r; ++k) slice_ *= x.shape[k];
    batch_elems_ = slice_;
    for (int64_t k = b; k < b + m; ++k) batch_elems_ *= x.shape[k];
    ix_.m = static_cast<int>(m);
    int64_t stride = slice_;
    for (int64_t k = m - 1; k >= 0; --k) {
      ix_.dims[k] = x.shape[b + k];
      ix_.strides[k] = stride;
      stride *= x.shape[b + k];
    }
    std::vector<int64_t> want(ind.shape.begin(), ind.shape.end() - 1);
    want.insert(want.end(), x.shape.begin() + b + m, x.shape.end());
    if (out[0].shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(out[0].shape),
                        shape_str(want));
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    const int64_t es = static_cast<int64_t>(dtype_size(in[0].dtype));
    const size_t u = copy_unit({slice_ * es, addr_mod16(in[0].data), addr_mod16(out[0].data)});
    const int64_t per = slice_ * es / static_cast<int64_t>(u);  // units per slice
    TupleIndex ix = ix_;
    for (int d = 0; d < ix.m; ++d) ix.strides[d] = ix.strides[d] / slice_ * per;
    const int64_t batch = batch_elems_ / slice_ * per;
    const int64_t n = batches_ * tuples_ * per;
    bool ok = false;
    dispatch_unit(u, [&](auto utag) {
      using U = decltype(utag);
      ok = dispatch_index(in[1].dtype, [&](auto itag) {
        using I = decltype(itag);
        gather_nd_kernel<U, I><<<grid_for(n), kBlock, 0, rc.stream>>>(
            static_cast<const U*>(in[0].data), static_cast<U*>(out[0].data),
            static_cast<const I*>(in[1].data), n, per, tuples_, batch, ix);
      });
    });
    if (!ok) return KILN_ERROR("{}: indices must be int32 or int64", node_->label());
    KILN_CUDA_LAUNCH_CHECK("gather_nd kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  int64_t batches_ = 1, tuples_ = 1, slice_ = 1, batch_elems_ = 1;
  TupleIndex ix_;
};

// --- ScatterND, ScatterElements ------------------------------------------------------------------
// The output starts as a copy of data; updates are then applied in parallel. Reductions combine
// with a compare-and-swap loop on the aligned 4- or 8-byte word holding the element, so they work
// for every element size; additions of floats then happen in an unspecified order (rounding may
// differ from the CPU's sequential order in the last bits). With reduction "none" and duplicate
// indices, which update lands is unspecified (ONNX leaves it undefined too).
enum Reduction : int { kNoReduction, kAdd, kMul, kMax, kMin };

template <typename C>
__device__ __forceinline__ C reduce_op(C a, C b, int r) {
  switch (r) {
    case kAdd: return a + b;
    case kMul: return a * b;
    case kMax: return a < b ? b : a;  // std::max(a, b), as the reference
    case kMin: return b < a ? b : a;  // std::min(a, b)
    default: return b;
  }
}

// The reference's combine(): integers in 64 bits (wrapping), floats in double.
template <typename T>
__device__ __forceinline__ T combine(T a, T b, int r) {
  if constexpr (std::is_same_v<T, bool>) {
    return reduce_op<int64_t>(a, b, r) != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (r == kAdd || r == kMul)  // unsigned arithmetic wraps without undefined behaviour
      return static_cast<T>(reduce_op<uint64_t>(static_cast<uint64_t>(static_cast<int64_t>(a)),
                                                static_cast<uint64_t>(static_cast<int64_t>(b)), r));
    return static_cast<T>(reduce_op<int64_t>(a, b, r));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __double2half(reduce_op<double>(__half2float(a), __half2float(b), r));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __double2bfloat16(reduce_op<double>(__bfloat162float(a), __bfloat162float(b), r));
  } else {
    return static_cast<T>(reduce_op<double>(a, b, r));
  }
}

template <typename T>
__device__ void atomic_combine(T* p, T u, int r) {
  if constexpr (sizeof(T) == 8) {
    auto* w = reinterpret_cast<unsigned long long*>(p);
    unsigned long long old = *w, assumed;
    do {
      assumed = old;
      T cur;
      memcpy(&cur, &assumed, 8);
      const T nv = combine(cur, u, r);
      unsigned long long bits;
      memcpy(&bits, &nv, 8);
      old = atomicCAS(w, assumed, bits);
    } while (old != assumed);
  } else {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto* w = reinterpret_cast<unsigned int*>(a & ~uintptr_t{3});
    const unsigned shift = static_cast<unsigned>(a & 3) * 8;
    const unsigned mask = sizeof(T) == 4 ? 0xffffffffu : (1u << (8 * sizeof(T))) - 1;
    unsigned old = *w, assumed;
    do {
      assumed = old;
      const unsigned cur_bits = (assumed >> shift) & mask;
      T cur;
      memcpy(&cur, &cur_bits, sizeof(T));
      const T nv = combine(cur, u, r);
      unsigned bits = 0;
      memcpy(&bits, &nv, sizeof(T));
      old = atomicCAS(w, assumed, (assumed & ~(mask << shift)) | (bits << shift));
    } while (old != assumed);
  }
}

template <typename T>
__device__ __forceinline__ void scatter_one(T* p, T u, int r) {
  if (r == kNoReduction) *p = u;
  else atomic_combine(p, u, r);
}

template <typename T, typename I>
__global__ void scatter_nd_kernel(T* __restrict__ y, const I* __restrict__ ind,
                                  const T* __restrict__ upd, int64_t n, int64_t slice,
                                  const __grid_constant__ TupleIndex ix, int r) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t off = ix.offset(ind + i / slice * ix.m);
    if (off >= 0) scatter_one(y + off + i % slice, upd[i], r);
  }
}

template <typename T, typename I>
__global__ void scatter_elements_kernel(T* __restrict__ y, const I* __restrict__ ind,
                                        const T* __restrict__ upd, int64_t n,
                                        const __grid_constant__ ElementIndex ix, int r) {
  KILN_GRID_STRIDE(i, n) {
    const int64_t off = ix.offset(i, ind[i]);
    if (off >= 0) scatter_one(y + off, upd[i], r);
  }
}

Expected<int> parse_reduction(const Node& n) {
  const std::string r = n.attrs.get_string("reduction", "none");
  if (r == "none") return int{kNoReduction};
  if (r == "add") return int{kAdd};
  if (r == "mul") return int{kMul};
  if (r == "max") return int{kMax};
  if (r == "min") return int{kMin};
  return KILN_ERROR("{}: unknown reduction '{}'", n.label(), r);
}

// GatherElements, ScatterND and ScatterElements: the element-wise index layers.
class ElementLayer final : public Layer {
 public:
  enum Kind { kGatherElements, kScatterND, kScatterElements };
  ElementLayer(const Node* n, Kind k) : node_(n), kind_(k) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& data = in[0];
    const DeviceTensor& ind = in[1];
    if (kind_ == kGatherElements) {
      KILN_ASSIGN_OR_RETURN(eix_, element_index(n, data, ind));
      for (int d = 0; d < eix_.rank; ++d)
        if (d != eix_.axis && ind.shape[d] > data.shape[d])
          return KILN_ERROR("{}: indices {} exceed data {} on axis {}", n.label(),
                            shape_str(ind.shape), shape_str(data.shape), d);
      if (out[0].shape != ind.shape)
        return KILN_ERROR("{}: output shape should be the indices' shape", n.label());
      return size_t{0};
    }
    KILN_ASSIGN_OR_RETURN(red_, parse_reduction(n));
    const DeviceTensor& upd = in[2];
    if (out[0].shape != data.shape || upd.dtype != data.dtype)
      return KILN_ERROR("{}: output and updates must match data {}", n.label(),
                        shape_str(data.shape));
    if (kind_ == kScatterElements) {
      if (upd.shape != ind.shape)
        return KILN_ERROR("{}: indices {} and updates {} must have one shape", n.label(),
                          shape_str(ind.shape), shape_str(upd.shape));
      KILN_ASSIGN_OR_RETURN(eix_, element_index(n, data, ind));
      return size_t{0};
    }
    if (ind.rank() < 1) return KILN_ERROR("{}: indices must have rank >= 1", n.label());
    const int64_t k = ind.shape.back();
    if (k > data.rank() || k > kMaxDims)
      return KILN_ERROR("{}: index depth {} exceeds data rank {}", n.label(), k, data.rank());
    slice_ = 1;
    for (int64_t d = k; d < data.rank(); ++d) slice_ *= data.shape[d];
    int64_t tuples = 1;
    for (int64_t d = 0; d + 1 < ind.rank(); ++d) tuples *= ind.shape[d];
    if (upd.numel() != tuples * slice_)
      return KILN_ERROR("{}: updates {} do not match indices {} and data {}", n.label(),
                        shape_str(upd.shape), shape_str(ind.shape), shape_str(data.shape));
    const auto s = row_major_strides(data.shape);
    tix_.m = static_cast<int>(k);
    for (int64_t d = 0; d < k; ++d) {
      tix_.dims[d] = data.shape[d];
      tix_.strides[d] = s[d];
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const DeviceTensor& y = out[0];
    if (kind_ != kGatherElements && y.data != in[0].data && y.nbytes() > 0)
      KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, in[0].data, y.nbytes(), cudaMemcpyDeviceToDevice,
                                      rc.stream));
    const int64_t n = kind_ == kGatherElements ? y.numel() : in[2].numel();
    if (n == 0 || y.numel() == 0) return Status::Ok();
    bool ok = false;
    const unsigned g = grid_for(n);
    dispatch_bytes(dtype_size(y.dtype), [&](auto btag) {
      ok = dispatch_index(in[1].dtype, [&](auto itag) {
        using I = decltype(itag);
        const I* ind = static_cast<const I*>(in[1].data);
        if (kind_ == kGatherElements) {
          using T = decltype(btag);
          gather_elements_kernel<T, I><<<g, kBlock, 0, rc.stream>>>(
              static_cast<const T*>(in[0].data), static_cast<T*>(y.data), ind, n, eix_);
          return;
        }
        // Reductions need the element's real type.
        dispatch_dtype(y.dtype, [&](auto ttag) {
          using T = decltype(ttag);
          T* yp = static_cast<T*>(y.data);
          const T* up = static_cast<const T*>(in[2].data);
          if (kind_ == kScatterND)
            scatter_nd_kernel<T, I>
                <<<g, kBlock, 0, rc.stream>>>(yp, ind, up, n, slice_, tix_, red_);
          else
            scatter_elements_kernel<T, I><<<g, kBlock, 0, rc.stream>>>(yp, ind, up, n, eix_, red_);
        });
      });
    });
    if (!ok) return KILN_ERROR("{}: indices must be int32 or int64", node_->label());
    KILN_CUDA_LAUNCH_CHECK("index kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  Kind kind_;
  int red_ = kNoReduction;
  int64_t slice_ = 1;
  ElementIndex eix_;
  TupleIndex tix_;
};

template <ElementLayer::Kind K>
Expected<std::unique_ptr<Layer>> create_element(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ElementLayer(d.node, K));
}
Expected<std::unique_ptr<Layer>> create_gather(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GatherLayer(d.node));
}
Expected<std::unique_ptr<Layer>> create_gather_nd(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GatherNDLayer(d.node));
}

bool supports_index(const LayerDesc& d, std::string* why) {
  if (!movable_type(d.in[0].dtype))
    return *why = "unsupported type " + std::string(dtype_name(d.in[0].dtype)), false;
  const DataType it = d.in[1].dtype;
  if (it != DataType::kInt32 && it != DataType::kInt64)
    return *why = "indices must be int32 or int64", false;
  return true;
}
bool supports_scatter(const LayerDesc& d, std::string* why) {
  if (!supports_index(d, why)) return false;
  const bool known = dispatch_dtype(d.in[0].dtype, [](auto) {});
  if (!known) return *why = "unsupported type " + std::string(dtype_name(d.in[0].dtype)), false;
  return true;
}

// n / dims[d]: FastDiv for 32-bit iteration spaces, a plain division for 64-bit ones.
template <typename Idx>
__device__ __forceinline__ Idx divide(Idx n, const FastDiv& f, int64_t dim) {
  if constexpr (std::is_same_v<Idx, uint32_t>) return f.div(n);
  else return n / dim;
}

// --- Pad -----------------------------------------------------------------------------------------
enum PadMode : int { kConstant, kReflect, kEdge, kWrap };

// Output dims in y's storage order with, per dim, the begin pad, input length and x stride.
struct PadParams {
  int rank = 0, mode = kConstant;
  int64_t out[kMaxDims] = {}, pb[kMaxDims] = {}, in[kMaxDims] = {}, xs[kMaxDims] = {};
  FastDiv fout[kMaxDims];
};

// Input coordinate of output coordinate `o` on an axis of input length `n`; -1: the constant.
__device__ __forceinline__ int64_t pad_source(int mode, int64_t o, int64_t pb, int64_t n) {
  int64_t j = o - pb;
  if (j >= 0 && j < n) return j;
  switch (mode) {
    case kEdge: return j < 0 ? 0 : n - 1;
    case kWrap: return ((j % n) + n) % n;
    case kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      j = ((j % period) + period) % period;
      return j < n ? j : period - j;
    }
    default: return -1;
  }
}

template <typename T, typename Idx>
__global__ void pad_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                           const __grid_constant__ PadParams p, T value) {
  KILN_GRID_STRIDE(i, n) {
    Idx rest = static_cast<Idx>(i);
    int64_t off = 0;
    bool constant = false;
    for (int d = p.rank - 1; d >= 0; --d) {
      const Idx q = divide(rest, p.fout[d], p.out[d]);
      const int64_t o = rest - q * static_cast<Idx>(p.out[d]);
      rest = q;
      const int64_t j = pad_source(p.mode, o, p.pb[d], p.in[d]);
      if (j < 0) constant = true;
      else off += j * p.xs[d];
    }
    y[i] = constant ? value : x[off];
  }
}

class PadLayer final : public Layer {
 public:
  explicit PadLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    const DeviceTensor& y = out[0];
    const std::string m = n.attrs.get_string("mode", "constant");
    const int mode = m == "constant" ? kConstant : m == "reflect" ? kReflect
                     : m == "edge"   ? kEdge      : m == "wrap"    ? kWrap : -1;
    if (mode < 0) return KILN_ERROR("{}: unknown pad mode '{}'", n.label(), m);
    const int64_t rank = x.rank();
    if (rank > kMaxDims) return KILN_ERROR("{}: rank above {}", n.label(), kMaxDims);
    KILN_ASSIGN_OR_RETURN(auto pads, host_ints(in[1], n, "pads"));
    std::vector<int64_t> axes;
    if (in.size() > 3 && in[3].host) {
      KILN_ASSIGN_OR_RETURN(axes, host_ints(in[3], n, "axes"));
      for (int64_t& a : axes) {
        KILN_ASSIGN_OR_RETURN(a, normalize_axis(a, rank, n));
      }
    } else {
      axes.resize(rank);
      std::iota(axes.begin(), axes.end(), int64_t{0});
    }
    if (pads.size() != 2 * axes.size())
      return KILN_ERROR("{}: pads has {} values, expected {}", n.label(), pads.size(),
                        2 * axes.size());
    std::vector<int64_t> begin(rank, 0), want = x.shape;
    for (size_t i = 0; i < axes.size(); ++i) {
      begin[axes[i]] = pads[i];
      want[axes[i]] += pads[i] + pads[axes.size() + i];
    }
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    for (int64_t k = 0; k < rank; ++k)
      if (mode != kConstant && x.shape[k] == 0 && y.shape[k] > 0)
        return KILN_ERROR("{}: cannot pad an empty dimension {} in mode '{}'", n.label(), k, m);
    value_ = 0;
    if (in.size() > 2 && in[2].host && in[2].host->numel() > 0) {
      if (in[2].host->numel() != 1)
        return KILN_ERROR("{}: constant_value must be a scalar", n.label());
      value_ = value_bits(*in[2].host, x.dtype);
    }
    const auto xs = storage_strides(x);
    p_ = PadParams{};
    p_.rank = static_cast<int>(rank);
    p_.mode = mode;
    int d = 0;
    for (size_t k : storage_order(y)) {
      p_.out[d] = y.shape[k];
      p_.fout[d] = FastDiv(y.shape[k]);
      p_.pb[d] = begin[k];
      p_.in[d] = x.shape[k];
      p_.xs[d] = xs[k];
      ++d;
    }
    return size_t{0};
  }
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    dispatch_bytes(dtype_size(in[0].dtype), [&](auto tag) {
      using T = decltype(tag);
      T v;
      std::memcpy(&v, &value_, sizeof v);
      const T* x = static_cast<const T*>(in[0].data);
      T* y = static_cast<T*>(out[0].data);
      if (n <= INT32_MAX)
        pad_kernel<T, uint32_t><<<grid_for(n), kBlock, 0, rc.stream>>>(x, y, n, p_, v);
      else
        pad_kernel<T, int64_t><<<grid_for(n), kBlock, 0, rc.stream>>>(x, y, n, p_, v);
    });
    KILN_CUDA_LAUNCH_CHECK("pad kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  PadParams p_;
  uint64_t value_ = 0;
};

// --- Resize --------------------------------------------------------------------------------------
// Resize is separable: a first kernel fills, in the workspace, one table per resized axis with
// the taps (and normalised weights) of every output coordinate, using the reference's
// double-precision formulas without fused multiply-adds (so nearest picks the same element).
// The main kernel then gathers (nearest, any dtype, exact) or sums the product of the per-axis
// taps in double (linear, cubic; integers round half to even and saturate).
enum ResizeMode : int { kNearest, kLinear, kCubic };
enum Coord : int {
  kHalfPixel, kHalfPixelSymmetric, kPytorchHalfPixel, kAlignCorners, kAsymmetric,
  kTfCropAndResize, kTfHalfPixelForNN
};
enum NearestMode : int { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

// Axes in y's storage order.
struct ResizeParams {
  int rank = 0, mode = kNearest, coord = kHalfPixel, nearest = kRoundPreferFloor;
  bool legacy = false, exclude_outside = false, antialias = false;
  double cubic_a = -0.75;
  int64_t out[kMaxDims] = {}, in[kMaxDims] = {}, xs[kMaxDims] = {};
  bool resized[kMaxDims] = {};
  double scale[kMaxDims] = {}, roi0[kMaxDims] = {}, roi1[kMaxDims] = {};
  // Per-axis tables in the workspace: the entries of axis d start at table[d] (-1: the axis is
  // copied as is); each entry has `taps` weights (linear/cubic).
  int64_t table[kMaxDims] = {}, entries = 0, taps = 1;
  int act[kMaxDims] = {}, nact = 0;  // the axes with tables, in order
  FastDiv fout[kMaxDims];
};

// One output coordinate of a resized axis: its first input tap and the number of taps (-1: the
// extrapolation value). Taps outside the input read the edge element.
struct AxisTap {
  int64_t first, count;
};

__device__ __forceinline__ double source_coord(const ResizeParams& p, int d, int64_t o) {
  const double x = static_cast<double>(o), len = static_cast<double>(p.in[d]), s = p.scale[d];
  const double width = __dmul_rn(s, len);  // fractional output length
  switch (p.coord) {
    case kAsymmetric: return __ddiv_rn(x, s);
    case kAlignCorners: return width == 1 ? 0.0 : __ddiv_rn(__dmul_rn(x, len - 1), width - 1);
    case kPytorchHalfPixel: return p.out[d] > 1 ? __ddiv_rn(x + 0.5, s) - 0.5 : 0.0;
    case kTfHalfPixelForNN: return __ddiv_rn(x + 0.5, s);
    case kHalfPixelSymmetric: {
      const double adjustment = __ddiv_rn(static_cast<double>(p.out[d]), width);
      const double offset = __dmul_rn(len / 2, 1 - adjustment);
      return __dadd_rn(offset, __ddiv_rn(x + 0.5, s)) - 0.5;
    }
    case kTfCropAndResize: {
      const double r0 = p.roi0[d], r1 = p.roi1[d];
      if (width == 1) return __dmul_rn(__dmul_rn(0.5, r0 + r1), len - 1);
      return __dadd_rn(__dmul_rn(r0, len - 1),
                       __ddiv_rn(__dmul_rn(__dmul_rn(x, r1 - r0), len - 1), width - 1));
    }
    default: return __ddiv_rn(x + 0.5, s) - 0.5;
  }
}

// The bounded source coordinate `x` of output `o` on axis d, the filter stretch `s` and radius;
// false where tf_crop_and_resize extrapolates.
__device__ __forceinline__ bool sample(const ResizeParams& p, int d, int64_t o, double& x,
                                       double& s, double& radius) {
  s = p.antialias && p.scale[d] < 1 ? p.scale[d] : 1.0;
  radius = (p.mode == kCubic ? 2.0 : 1.0) / s;
  x = source_coord(p, d, o);
  if (p.coord == kTfCropAndResize && !(x >= 0 && x <= static_cast<double>(p.in[d] - 1)))
    return false;
  x = isnan(x) ? 0.0 : fmin(fmax(x, -radius - 2), static_cast<double>(p.in[d]) + radius + 2);
  return true;
}

__device__ __forceinline__ int64_t nearest_index(const ResizeParams& p, double x, double scale) {
  if (p.legacy) return static_cast<int64_t>(scale < 1 ? ceil(x) : floor(x));
  const double f = floor(x);
  if (x == f) return static_cast<int64_t>(f);
  const double ratio = x - f;
  const bool up = p.nearest == kRoundPreferFloor  ? ratio > 0.5
                  : p.nearest == kRoundPreferCeil ? ratio >= 0.5
                                                  : p.nearest == kCeil;
  return static_cast<int64_t>(f) + (up ? 1 : 0);
}

__device__ __forceinline__ double cubic_kernel(double d, double a) {
  d = fabs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0;
}

// Unnormalised weight of input index i for source coordinate x (0 outside the input when
// exclude_outside).
__device__ __forceinline__ double tap_weight(const ResizeParams& p, int d, int64_t i, double x,
                                             double s) {
  if (p.exclude_outside && (i < 0 || i >= p.in[d])) return 0;
  const double t = s * (static_cast<double>(i) - x);
  return p.mode == kCubic ? cubic_kernel(t, p.cubic_a) : fmax(0.0, 1 - fabs(t));
}

// Integers round half to even and saturate, as the reference's round_to().
template <typename T>
__device__ __forceinline__ void store_rounded(T* y, int64_t i, double v) {
  if constexpr (is_float_v<T>) {
    store(y, i, v);
  } else {
    const double lo = static_cast<double>(std::numeric_limits<T>::min());
    const double hi = static_cast<double>(std::numeric_limits<T>::max());
    v = rint(v);
    y[i] = v <= lo ? std::numeric_limits<T>::min()
           : v >= hi ? std::numeric_limits<T>::max() : static_cast<T>(v);
  }
}

// Fills the per-axis tables: one thread per (resized axis, output coordinate). The taps and
// weights are the reference's AxisPlan (src/ops/resize.cpp), computed once per coordinate
// instead of once per output element.
__global__ void resize_table_kernel(const __grid_constant__ ResizeParams p, AxisTap* tab,
                                    double* weights) {
  KILN_GRID_STRIDE(e, p.entries) {
    int d = 0;
    for (int k = 0; k < p.rank; ++k)
      if (p.table[k] >= 0 && e >= p.table[k] && e < p.table[k] + p.out[k]) d = k;
    const int64_t o = e - p.table[d];
    double xd, s, radius;
    AxisTap t{0, -1};
    if (sample(p, d, o, xd, s, radius)) {
      if (p.mode == kNearest) {
        const int64_t j = nearest_index(p, xd, p.scale[d]);
        t = {j < 0 ? 0 : j >= p.in[d] ? p.in[d] - 1 : j, 1};
      } else {
        int64_t l = static_cast<int64_t>(floor(xd - radius));
        int64_t h = static_cast<int64_t>(ceil(xd + radius));
        double total = 0;
        for (int64_t i = l; i <= h; ++i) total += tap_weight(p, d, i, xd, s);
        // Zero-weight taps at the window's ends add nothing: trim them.
        while (l < h && tap_weight(p, d, l, xd, s) == 0) ++l;
        while (h > l && tap_weight(p, d, h, xd, s) == 0) --h;
        h = min(h, l + p.taps - 1);
        const double sum = total != 0 ? total : 1.0;
        for (int64_t i = l; i <= h; ++i)
          weights[e * p.taps + (i - l)] = tap_weight(p, d, i, xd, s) / sum;
        t = {l, h - l + 1};
      }
    }
    tab[e] = t;
  }
}

template <typename T, typename Idx>
__global__ void resize_nearest_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                      const __grid_constant__ ResizeParams p,
                                      const AxisTap* __restrict__ tab, T extrapolation) {
  KILN_GRID_STRIDE(i, n) {
    Idx rest = static_cast<Idx>(i);
    int64_t off = 0;
    bool extrapolate = false;
    for (int d = p.rank - 1; d >= 0; --d) {
      const Idx q = divide(rest, p.fout[d], p.out[d]);
      const int64_t o = rest - q * static_cast<Idx>(p.out[d]);
      rest = q;
      if (p.table[d] < 0) {
        off += o * p.xs[d];
        continue;
      }
      const AxisTap t = tab[p.table[d] + o];
      if (t.count < 0) extrapolate = true;
      else off += t.first * p.xs[d];
    }
    y[i] = extrapolate ? extrapolation : x[off];
  }
}

template <typename T, typename Idx>
__global__ void resize_filter_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                     const __grid_constant__ ResizeParams p,
                                     const AxisTap* __restrict__ tab,
                                     const double* __restrict__ weights, double extrapolation) {
  KILN_GRID_STRIDE(i, n) {
    Idx rest = static_cast<Idx>(i);
    int64_t base = 0, entry[kMaxDims], k[kMaxDims];
    AxisTap tap[kMaxDims];
    int axis[kMaxDims], na = 0;
    bool extrapolate = false;
    for (int d = p.rank - 1; d >= 0; --d) {
      const Idx q = divide(rest, p.fout[d], p.out[d]);
      const int64_t o = rest - q * static_cast<Idx>(p.out[d]);
      rest = q;
      if (p.table[d] < 0) {
        base += o * p.xs[d];
        continue;
      }
      const int64_t e = p.table[d] + o;
      const AxisTap t = tab[e];
      if (t.count < 0) extrapolate = true;
      axis[na] = d, entry[na] = e * p.taps, tap[na] = t, k[na] = 0;
      ++na;
    }
    if (extrapolate) {
      store_rounded(y, i, extrapolation);
      continue;
    }
    // Sum over the product of every axis' taps.
    double acc = 0;
    for (;;) {
      double w = 1;
      int64_t off = base;
      for (int a = 0; a < na; ++a) {
        const int d = axis[a];
        const int64_t t = tap[a].first + k[a];
        w *= weights[entry[a] + k[a]];
        off += (t < 0 ? 0 : t >= p.in[d] ? p.in[d] - 1 : t) * p.xs[d];
      }
      if (w != 0) acc += w * static_cast<double>(load(x, off));
      int a = na - 1;
      while (a >= 0 && ++k[a] == tap[a].count) k[a--] = 0;
      if (a < 0) break;
    }
    store_rounded(y, i, acc);
  }
}

// The weighted sum over the taps of active axes A..NA-1, unrolled at compile time so that the
// per-axis state stays in registers.
template <int A, int NA, typename T>
__device__ __forceinline__ void sum_taps(const T* __restrict__ x, int64_t off, double w,
                                         const AxisTap (&tap)[NA], const int64_t (&wat)[NA],
                                         const int64_t (&in)[NA], const int64_t (&xs)[NA],
                                         const double* __restrict__ weights, double& acc) {
  if constexpr (A == NA) {
    if (w != 0) acc += w * static_cast<double>(load(x, off));
  } else {
    for (int64_t k = 0; k < tap[A].count; ++k) {
      const int64_t t = tap[A].first + k;
      const int64_t c = t < 0 ? 0 : t >= in[A] ? in[A] - 1 : t;
      sum_taps<A + 1, NA>(x, off + c * xs[A], w * weights[wat[A] + k], tap, wat, in, xs, weights,
                          acc);
    }
  }
}

// resize_filter_kernel for NA resized axes and a 32-bit iteration space (the common case).
template <typename T, int NA>
__global__ void resize_filter_fixed_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                           const __grid_constant__ ResizeParams p,
                                           const AxisTap* __restrict__ tab,
                                           const double* __restrict__ weights,
                                           double extrapolation) {
  KILN_GRID_STRIDE(i, n) {
    uint32_t rest = static_cast<uint32_t>(i);
    int64_t o[kMaxDims], base = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      o[d] = 0;
      if (d >= p.rank) continue;
      const uint32_t q = p.fout[d].div(rest);
      o[d] = rest - q * static_cast<uint32_t>(p.out[d]);
      rest = q;
      if (p.table[d] < 0) base += o[d] * p.xs[d];
    }
    AxisTap tap[NA];
    int64_t wat[NA], in[NA], xs[NA];
    bool extrapolate = false;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int d = p.act[a];
      int64_t od = 0;
#pragma unroll
      for (int k = 0; k < kMaxDims; ++k)
        if (k == d) od = o[k];
      const int64_t e = p.table[d] + od;
      tap[a] = tab[e];
      wat[a] = e * p.taps;
      in[a] = p.in[d];
      xs[a] = p.xs[d];
      extrapolate |= tap[a].count < 0;
    }
    if (extrapolate) {
      store_rounded(y, i, extrapolation);
      continue;
    }
    double acc = 0;
    sum_taps<0, NA>(x, base, 1.0, tap, wat, in, xs, weights, acc);
    store_rounded(y, i, acc);
  }
}

// The reference's attribute names mapped to the kernel's enums; -1 when unknown.
int lookup(const std::string& s, std::initializer_list<const char*> names) {
  int i = 0;
  for (const char* nm : names) {
    if (s == nm) return i;
    ++i;
  }
  return -1;
}

class ResizeLayer final : public Layer {
 public:
  explicit ResizeLayer(const Node* n) : node_(n) {}
  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const Attributes& a = n.attrs;
    const DeviceTensor& x = in[0];
    const DeviceTensor& y = out[0];
    const int64_t rank = x.rank();
    if (rank > kMaxDims || y.rank() != rank)
      return KILN_ERROR("{}: rank {} is not supported", n.label(), rank);
    ResizeParams p;
    p.mode = lookup(a.get_string("mode", "nearest"), {"nearest", "linear", "cubic"});
    p.coord = lookup(a.get_string("coordinate_transformation_mode", "half_pixel"),
                     {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                      "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn"});
    p.nearest = lookup(a.get_string("nearest_mode", "round_prefer_floor"),
                       {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"});
    const int policy = lookup(a.get_string("keep_aspect_ratio_policy", "stretch"),
                              {"stretch", "not_larger", "not_smaller"});
    if (p.mode < 0 || p.coord < 0 || p.nearest < 0 || policy < 0)
      return KILN_ERROR("{}: unknown mode, coordinate_transformation_mode, nearest_mode or "
                        "keep_aspect_ratio_policy", n.label());
    if (p.mode != kNearest && x.dtype == DataType::kBool)
      return KILN_ERROR("{}: linear/cubic resize of bool tensors is not defined", n.label());
    p.antialias = a.get_int("antialias", 0) != 0;
    p.exclude_outside = a.get_int("exclude_outside", 0) != 0;
    p.legacy = a.get_int("kiln_nearest_legacy", 0) != 0;
    p.cubic_a = a.get_float("cubic_coeff_a", -0.75f);
    extrapolation_ = a.get_float("extrapolation_value", 0.f);
    std::vector<int64_t> axes;
    if (a.has("axes")) {
      for (int64_t ax : a.get_ints("axes")) {
        KILN_ASSIGN_OR_RETURN(int64_t na, normalize_axis(ax, rank, n));
        if (std::find(axes.begin(), axes.end(), na) != axes.end())
          return KILN_ERROR("{}: axis {} is repeated in axes", n.label(), ax);
        axes.push_back(na);
      }
    } else {
      axes.resize(rank);
      std::iota(axes.begin(), axes.end(), int64_t{0});
    }
    // Output lengths and scales, as the reference's geometry().
    auto given = [&](size_t i) -> const Tensor* {
      return in.size() > i && in[i].host && in[i].host->numel() > 0 ? in[i].host : nullptr;
    };
    const Tensor* scales = given(2);
    const Tensor* sizes = given(3);
    if (!scales == !sizes)
      return KILN_ERROR("{}: exactly one of 'scales' and 'sizes' must be given", n.label());
    const Tensor* t = scales ? scales : sizes;
    if (t->numel() != static_cast<int64_t>(axes.size()))
      return KILN_ERROR("{}: {} values for {} axes", n.label(), t->numel(), axes.size());
    std::vector<int64_t> want = x.shape;
    std::vector<double> scale(rank, 1.0);
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t ax = axes[i];
      if (scales) {
        scale[ax] = static_cast<float>(scales->at_double(static_cast<int64_t>(i)));
        want[ax] = static_cast<int64_t>(std::floor(scale[ax] * static_cast<double>(x.shape[ax])));
      } else {
        want[ax] = sizes->at_int(static_cast<int64_t>(i));
        scale[ax] = static_cast<double>(want[ax]) / static_cast<double>(x.shape[ax]);
      }
    }
    if (sizes && policy != 0) {
      double s = policy == 1 ? std::numeric_limits<double>::infinity() : 0.0;
      for (int64_t ax : axes) s = policy == 1 ? std::min(s, scale[ax]) : std::max(s, scale[ax]);
      for (int64_t ax : axes) {
        scale[ax] = s;
        want[ax] = static_cast<int64_t>(std::floor(s * static_cast<double>(x.shape[ax]) + 0.5));
      }
    }
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    std::vector<double> roi0(rank, 0.0), roi1(rank, 1.0);
    if (p.coord == kTfCropAndResize) {
      const Tensor* roi = given(1);
      if (!roi || roi->numel() != 2 * static_cast<int64_t>(axes.size()))
        return KILN_ERROR("{}: tf_crop_and_resize needs roi with {} values", n.label(),
                          2 * axes.size());
      for (size_t i = 0; i < axes.size(); ++i) {
        roi0[axes[i]] = roi->at_double(static_cast<int64_t>(i));
        roi1[axes[i]] = roi->at_double(static_cast<int64_t>(axes.size() + i));
      }
    }
    std::vector<bool> resized(rank, false);
    for (int64_t ax : axes) {
      resized[ax] = true;
      if (x.shape[ax] == 0 && y.shape[ax] > 0)
        return KILN_ERROR("{}: cannot resize empty dimension {}", n.label(), ax);
    }
    const auto xs = storage_strides(x);
    p.rank = static_cast<int>(rank);
    int d = 0;
    for (size_t k : storage_order(y)) {
      p.out[d] = y.shape[k];
      p.fout[d] = FastDiv(y.shape[k]);
      p.in[d] = x.shape[k];
      p.xs[d] = xs[k];
      p.resized[d] = resized[k];
      p.scale[d] = scale[k];
      p.roi0[d] = roi0[k];
      p.roi1[d] = roi1[k];
      ++d;
    }
    // Tables for the resized axes. An axis at scale 1 whose transform maps every coordinate
    // onto itself is a plain copy (every transform but tf_half_pixel_for_nn and
    // tf_crop_and_resize does: the source coordinate is the integer o, one tap of weight 1).
    const bool shifts = p.coord == kTfHalfPixelForNN || p.coord == kTfCropAndResize;
    int64_t entries = 0;
    double radius = 0;
    for (int k = 0; k < p.rank; ++k) {
      p.table[k] = -1;
      if (!p.resized[k] || (p.scale[k] == 1.0 && p.out[k] == p.in[k] && !shifts)) continue;
      p.table[k] = entries;
      p.act[p.nact++] = k;
      entries += p.out[k];
      const double s = p.antialias && p.scale[k] < 1 ? p.scale[k] : 1.0;
      radius = std::max(radius, (p.mode == kCubic ? 2.0 : 1.0) / s);
    }
    p.entries = entries;
    // A window [floor(x - r), ceil(x + r)] holds at most 2r + 3 taps.
    p.taps = p.mode == kNearest ? 0 : static_cast<int64_t>(std::ceil(2 * radius)) + 3;
    p_ = p;
    extrapolation_bits_ = value_bits(Tensor::scalar<double>(extrapolation_), x.dtype);
    weights_at_ = (entries * static_cast<int64_t>(sizeof(AxisTap)) + 255) / 256 * 256;
    return static_cast<size_t>(weights_at_ + entries * p.taps * 8);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    auto* tab = static_cast<AxisTap*>(rc.workspace);
    auto* weights = reinterpret_cast<double*>(static_cast<char*>(rc.workspace) + weights_at_);
    if (p_.entries > 0) {
      resize_table_kernel<<<grid_for(p_.entries), kBlock, 0, rc.stream>>>(p_, tab, weights);
      KILN_CUDA_LAUNCH_CHECK("resize table kernel");
    }
    const unsigned g = grid_for(n);
    const bool small = n <= INT32_MAX;
    if (p_.mode == kNearest) {
      dispatch_bytes(dtype_size(in[0].dtype), [&](auto tag) {
        using T = decltype(tag);
        T e;
        std::memcpy(&e, &extrapolation_bits_, sizeof e);
        const T* x = static_cast<const T*>(in[0].data);
        T* y = static_cast<T*>(out[0].data);
        if (small)
          resize_nearest_kernel<T, uint32_t><<<g, kBlock, 0, rc.stream>>>(x, y, n, p_, tab, e);
        else
          resize_nearest_kernel<T, int64_t><<<g, kBlock, 0, rc.stream>>>(x, y, n, p_, tab, e);
      });
    } else {
      dispatch_dtype(in[0].dtype, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, bool>) {
          const T* x = static_cast<const T*>(in[0].data);
          T* y = static_cast<T*>(out[0].data);
          const double e = extrapolation_;
          // Float types with 1-3 resized axes: the unrolled kernel.
          bool done = false;
          if constexpr (is_float_v<T>) {
            auto fixed = [&](auto na) {
              resize_filter_fixed_kernel<T, decltype(na)::value>
                  <<<g, kBlock, 0, rc.stream>>>(x, y, n, p_, tab, weights, e);
              done = true;
            };
            if (small && p_.nact == 1) fixed(std::integral_constant<int, 1>{});
            else if (small && p_.nact == 2) fixed(std::integral_constant<int, 2>{});
            else if (small && p_.nact == 3) fixed(std::integral_constant<int, 3>{});
          }
          if (done) return;
          if (small)
            resize_filter_kernel<T, uint32_t>
                <<<g, kBlock, 0, rc.stream>>>(x, y, n, p_, tab, weights, e);
          else
            resize_filter_kernel<T, int64_t>
                <<<g, kBlock, 0, rc.stream>>>(x, y, n, p_, tab, weights, e);
        }
      });
    }
    KILN_CUDA_LAUNCH_CHECK("resize kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  ResizeParams p_;
  int64_t weights_at_ = 0;  // workspace: AxisTap tables, then the weights
  double extrapolation_ = 0;
  uint64_t extrapolation_bits_ = 0;
};

Expected<std::unique_ptr<Layer>> create_pad(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new PadLayer(d.node));
}
Expected<std::unique_ptr<Layer>> create_resize(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new ResizeLayer(d.node));
}

bool supports_pad(const LayerDesc& d, std::string* why) {
  if (!movable_type(d.in[0].dtype))
    return *why = "unsupported type " + std::string(dtype_name(d.in[0].dtype)), false;
  return true;
}
bool supports_resize(const LayerDesc& d, std::string* why) {
  if (!supports_pad(d, why)) return false;
  const std::string mode = d.node->attrs.get_string("mode", "nearest");
  if (mode != "nearest" && d.in[0].dtype == DataType::kBool)
    return *why = "linear/cubic resize of bool is not defined", false;
  if (!dispatch_dtype(d.in[0].dtype, [](auto) {}))
    return *why = "unsupported type " + std::string(dtype_name(d.in[0].dtype)), false;
  return true;
}

}  // namespace

namespace movement_detail {

std::span<const TacticDef> index_tactics() {
  static const std::vector<TacticDef> table = [] {
    constexpr uint32_t kMove = kF32 | kF16 | kF64;
    std::vector<TacticDef> t = {
        {"", "Gather", "movement.gather", kMove, 0, supports_index, create_gather},
        {"", "GatherElements", "movement.gather_elements", kMove, 0, supports_index,
         create_element<ElementLayer::kGatherElements>},
        {"", "GatherND", "movement.gather_nd", kMove, 0, supports_index, create_gather_nd},
        {"", "ScatterND", "movement.scatter_nd", kMove, 0, supports_scatter,
         create_element<ElementLayer::kScatterND>},
        {"", "ScatterElements", "movement.scatter_elements", kMove, 0, supports_scatter,
         create_element<ElementLayer::kScatterElements>},
        {"", "Pad", "movement.pad", kMove | kNHWC, 0b1110, supports_pad, create_pad},
        {"", "Resize", "movement.resize", kMove | kNHWC, 0b1110, supports_resize, create_resize},
    };
    return t;
  }();
  return table;
}

}  // namespace movement_detail
}  // namespace kiln::gpu
