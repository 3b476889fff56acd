// Ops that rank values along an axis: TopK, ArgMax, ArgMin. NaN counts as larger than every
// number in TopK (largest first puts it first) and, as in numpy, ArgMax/ArgMin pick the first NaN.
#include <algorithm>
#include <cmath>
#include <numeric>
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

const OpDef kOps[] = {
    {"", "TopK", topk_infer, topk_cpu, topk_upgrade},
    {"", "ArgMax", arg_infer, arg_cpu<true>, nullptr},
    {"", "ArgMin", arg_infer, arg_cpu<false>, nullptr},
};

}  // namespace

std::span<const OpDef> sort_ops() { return kOps; }

}  // namespace kiln::shape_detail
