// Ops that rank values along an axis: TopK, ArgMax, ArgMin, Unique. NaN counts as larger than every
// number in TopK (largest first puts it first) and, as in numpy, ArgMax/ArgMin pick the first NaN.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/shape_util.h"

namespace kiln::shape_detail {
namespace {

// Comparable key of an element: float for the 16-bit floats, the value itself otherwise.
template <typename T>
auto key(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(v);
  else return v;
}
template <typename K>
bool is_nan(K v) {
  if constexpr (std::is_floating_point_v<K>) return std::isnan(v);
  else return false;
}

// Splits a shape around `axis` into (outer, dim, inner).
struct Lanes {
  int64_t outer, dim, inner;
};
Lanes lanes(const std::vector<int64_t>& s, int64_t axis) {
  std::span<const int64_t> sp(s);
  return {product(sp.subspan(0, axis)), s[axis], product(sp.subspan(axis + 1))};
}

// ---------------------------------------------------------------- TopK
Status topk_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 10) ctx.attr_to_input("k", 1);
  return Status::Ok();
}

Expected<int64_t> topk_k(const Tensor& k, const Node& n) {
  KILN_ASSIGN_OR_RETURN(auto v, int_values(k, n, "K"));
  if (v.size() != 1) return KILN_ERROR("{}: K must hold a single value, got {}", n.label(), k.desc());
  if (v[0] < 0) return KILN_ERROR("{}: K = {} is negative", n.label(), v[0]);
  return v[0];
}

Status topk_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    ctx.set_output(1, TensorType::unknown_rank(DataType::kInt64));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.attrs().get_int("axis", -1), x.rank(), ctx.node()));
  std::vector<Dim> dims = *x.dims;
  dims[axis] = Dim();
  if (const Tensor* k = ctx.input_const(1)) {
    KILN_ASSIGN_OR_RETURN(int64_t kv, topk_k(*k, ctx.node()));
    const Dim& d = (*x.dims)[axis];
    if (d.is_static() && kv > d.value)
      return KILN_ERROR("{}: K = {} exceeds the axis length {}", ctx.node().label(), kv, d.value);
    dims[axis] = Dim(kv);
  }
  ctx.set_output(0, TensorType(x.dtype, dims));
  ctx.set_output(1, TensorType(DataType::kInt64, dims));
  return Status::Ok();
}

Status topk_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x || !ctx.input(1)) return KILN_ERROR("{}: TopK needs X and K", n.label());
  if (x->rank() == 0) return KILN_ERROR("{}: TopK input must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x->rank(), n));
  KILN_ASSIGN_OR_RETURN(int64_t k, topk_k(*ctx.input(1), n));
  const Lanes l = lanes(x->shape(), axis);
  if (k > l.dim) return KILN_ERROR("{}: K = {} exceeds the axis length {}", n.label(), k, l.dim);
  const bool largest = n.attrs.get_int("largest", 1) != 0;
  std::vector<int64_t> shape = x->shape();
  shape[axis] = k;
  Tensor values(x->dtype(), shape);
  Tensor indices(DataType::kInt64, shape);
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = x->data<T>();
    T* vout = values.data<T>();
    int64_t* iout = indices.data<int64_t>();
    std::vector<int64_t> order(l.dim);
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t i = 0; i < l.inner; ++i) {
        const T* lane = src + o * l.dim * l.inner + i;
        auto at = [&](int64_t j) { return key(lane[j * l.inner]); };
        // Strict weak order: the wanted end first, NaN as the largest value, ties by index.
        auto before = [&](int64_t a, int64_t b) {
          const auto va = at(a), vb = at(b);
          const bool na = is_nan(va), nb = is_nan(vb);
          if (na || nb) {
            if (na && nb) return a < b;
            return largest ? na : nb;
          }
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        };
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t dst = (o * k + j) * l.inner + i;
          vout[dst] = lane[order[j] * l.inner];
          iout[dst] = order[j];
        }
      }
    }
    return 0;
  });
  ctx.set_output(0, std::move(values));
  ctx.set_output(1, std::move(indices));
  return Status::Ok();
}

// ---------------------------------------------------------------- ArgMax, ArgMin
Status arg_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(DataType::kInt64));
    return Status::Ok();
  }
  if (x.rank() == 0) return KILN_ERROR("{}: input must have rank >= 1", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.attrs().get_int("axis", 0), x.rank(), ctx.node()));
  std::vector<Dim> dims = *x.dims;
  if (ctx.attrs().get_int("keepdims", 1) != 0) dims[axis] = Dim(1);
  else dims.erase(dims.begin() + axis);
  ctx.set_output(0, TensorType(DataType::kInt64, std::move(dims)));
  return Status::Ok();
}

template <bool kMax>
Status arg_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->rank() == 0) return KILN_ERROR("{}: input must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x->rank(), n));
  const Lanes l = lanes(x->shape(), axis);
  if (l.dim == 0) return KILN_ERROR("{}: cannot reduce over an empty axis {}", n.label(), axis);
  const bool last = n.attrs.get_int("select_last_index", 0) != 0;
  std::vector<int64_t> shape = x->shape();
  if (n.attrs.get_int("keepdims", 1) != 0) shape[axis] = 1;
  else shape.erase(shape.begin() + axis);
  Tensor y(DataType::kInt64, shape);
  int64_t* out = y.data<int64_t>();
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* src = x->data<T>();
    for (int64_t o = 0; o < l.outer; ++o) {
      for (int64_t i = 0; i < l.inner; ++i) {
        const T* lane = src + o * l.dim * l.inner + i;
        int64_t best = 0;
        auto bv = key(lane[0]);
        for (int64_t j = 1; j < l.dim; ++j) {
          const auto v = key(lane[j * l.inner]);
          bool take;
          if (is_nan(bv)) take = false;  // the first NaN wins
          else if (is_nan(v)) take = true;
          else if (v == bv) take = last;
          else take = kMax ? v > bv : v < bv;
          if (take) {
            best = j;
            bv = v;
          }
        }
        out[o * l.inner + i] = best;
      }
    }
    return 0;
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Unique
// The distinct elements (no axis: of the flattened input) or distinct slices along axis (compared
// lexicographically in row-major order, as numpy.unique), ascending when sorted, else in order
// of first occurrence; indices: each one's first occurrence; inverse_indices: each input
// element's (slice's) position in Y; counts. NaN sorts last and equals NaN (numpy's equal_nan).
// The lengths depend on the data; the cuda backend runs it on the host.
// Every storage type visit_dtype reads (not the float8 and 4-bit ones).
bool unique_type(DataType t) {
  return dtype_is_supported(t) && !dtype_is_low_bit(t) && t != DataType::kString &&
         t != DataType::kUndefined;
}

Expected<std::optional<int64_t>> unique_axis(const Node& n, int64_t rank) {
  if (!n.attrs.has("axis")) return std::optional<int64_t>();
  KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(n.attrs.get_int("axis", 0), rank, n));
  return std::optional<int64_t>(a);
}

Status unique_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (x.dtype != DataType::kUndefined && !unique_type(x.dtype))
    return KILN_ERROR("{}: unsupported type {}", n.label(), dtype_name(x.dtype));
  const TensorType i64 = TensorType(DataType::kInt64, {Dim()});
  if (!n.attrs.has("axis")) {
    ctx.set_output(0, TensorType(x.dtype, {Dim()}));
    Dim total;
    if (x.is_static()) {
      int64_t t = 1;
      for (const Dim& d : *x.dims) t *= d.value;
      total = Dim(t);
    }
    ctx.set_output(2, TensorType(DataType::kInt64, {total}));
  } else if (x.has_rank()) {
    KILN_ASSIGN_OR_RETURN(auto axis, unique_axis(n, x.rank()));
    std::vector<Dim> dims = *x.dims;
    const Dim len = dims[static_cast<size_t>(*axis)];
    dims[static_cast<size_t>(*axis)] = Dim();
    ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    ctx.set_output(2, TensorType(DataType::kInt64, {len}));
  } else {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    ctx.set_output(2, i64);
  }
  ctx.set_output(1, i64);
  ctx.set_output(3, i64);
  return Status::Ok();
}

// Three-way comparison of two slices: NaN above every number and equal to NaN.
template <typename T>
int compare_slices(const T* x, int64_t a, int64_t b, int64_t outer, int64_t dim, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const auto u = key(x[(o * dim + a) * inner + i]), v = key(x[(o * dim + b) * inner + i]);
      const bool un = is_nan(u), vn = is_nan(v);
      if (un || vn) {
        if (un != vn) return un ? 1 : -1;
        continue;
      }
      if (u < v) return -1;
      if (v < u) return 1;
    }
  return 0;
}

Status unique_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (!unique_type(x->dtype()))
    return KILN_ERROR("{}: unsupported type {}", n.label(), dtype_name(x->dtype()));
  KILN_ASSIGN_OR_RETURN(auto axis, unique_axis(n, x->rank()));
  if (axis && x->rank() == 0) return KILN_ERROR("{}: axis given for a scalar input", n.label());
  const std::vector<int64_t> s = axis ? x->shape() : std::vector<int64_t>{x->numel()};
  const size_t ax = axis ? static_cast<size_t>(*axis) : 0;
  std::span<const int64_t> sp(s);
  const int64_t outer = product(sp.subspan(0, ax)), dim = s[ax],
                inner = product(sp.subspan(ax + 1));
  const bool sorted = n.attrs.get_int("sorted", 1) != 0;
  // Slices in ascending order (stable: equal ones keep their input order), then grouped.
  std::vector<int64_t> order(static_cast<size_t>(dim));
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> group_of(static_cast<size_t>(dim));  // slice -> group (sorted order)
  std::vector<int64_t> first, counts;                       // per group
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x->data<T>();
    auto cmp = [&](int64_t a, int64_t b) { return compare_slices(p, a, b, outer, dim, inner); };
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
    for (size_t k = 0; k < order.size(); ++k) {
      if (k == 0 || cmp(order[k - 1], order[k]) != 0) {
        first.push_back(order[k]);
        counts.push_back(0);
      }
      group_of[static_cast<size_t>(order[k])] = static_cast<int64_t>(first.size()) - 1;
      ++counts.back();
    }
  });
  const int64_t u = static_cast<int64_t>(first.size());
  std::vector<int64_t> rank_of(static_cast<size_t>(u));  // group -> position in Y
  std::vector<int64_t> by_pos(static_cast<size_t>(u));   // position in Y -> group
  std::iota(by_pos.begin(), by_pos.end(), 0);
  if (!sorted)
    std::sort(by_pos.begin(), by_pos.end(),
              [&](int64_t a, int64_t b) { return first[a] < first[b]; });
  for (int64_t k = 0; k < u; ++k) rank_of[static_cast<size_t>(by_pos[k])] = k;
  std::vector<int64_t> yshape = s;
  yshape[ax] = u;
  Tensor y(x->dtype(), yshape);
  const size_t chunk = static_cast<size_t>(inner) * dtype_size(x->dtype());
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  Tensor ind(DataType::kInt64, {u}), inv(DataType::kInt64, {dim}), cnt(DataType::kInt64, {u});
  for (int64_t k = 0; k < u; ++k) {
    const int64_t g = by_pos[static_cast<size_t>(k)];
    ind.data<int64_t>()[k] = first[static_cast<size_t>(g)];
    cnt.data<int64_t>()[k] = counts[static_cast<size_t>(g)];
    if (chunk > 0)
      for (int64_t o = 0; o < outer; ++o)
        std::memcpy(dst + (o * u + k) * chunk,
                    src + (o * dim + first[static_cast<size_t>(g)]) * chunk, chunk);
  }
  for (int64_t j = 0; j < dim; ++j)
    inv.data<int64_t>()[j] = rank_of[static_cast<size_t>(group_of[static_cast<size_t>(j)])];
  ctx.set_output(0, std::move(y));
  ctx.set_output(1, std::move(ind));
  ctx.set_output(2, std::move(inv));
  ctx.set_output(3, std::move(cnt));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "TopK", topk_infer, topk_cpu, topk_upgrade},
    {"", "ArgMax", arg_infer, arg_cpu<true>, nullptr},
    {"", "ArgMin", arg_infer, arg_cpu<false>, nullptr},
    {"", "Unique", unique_infer, unique_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> sort_ops() { return kOps; }

}  // namespace kiln::shape_detail
