// MaxPool (with Indices), AveragePool, GlobalAveragePool, GlobalMaxPool: N-d, pads/auto_pad,
// strides, dilations, ceil_mode, count_include_pad, storage_order; LpPool and GlobalLpPool
// (passes/lp_pool_to_average.cpp gives the GPU their form); MaxUnpool (MaxPool's partial
// inverse; passes/max_unpool_to_scatter.cpp gives the GPU its form).
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "ops/conv_util.h"
#include "ops/op.h"

namespace kiln {
namespace {

// The resolved window geometry of a pooling node for a concrete input shape.
struct PoolGeometry {
  int64_t planes = 0;  // N * C
  std::vector<int64_t> in, out;
  // taps[d][o]: the in-range input indices of output index o along axis d.
  std::vector<std::vector<std::vector<int64_t>>> taps;
  // counted[d][o]: how many taps fall inside the input or its padding (count_include_pad).
  std::vector<std::vector<int64_t>> counted;
};

Expected<PoolGeometry> pool_geometry(const Node& n, const std::vector<int64_t>& x) {
  if (x.size() < 3)
    return KILN_ERROR("{}: X must have rank >= 3 (N, C, spatial...), got {}", n.label(),
                      shape_str(x));
  if (!n.attrs.has("kernel_shape"))
    return KILN_ERROR("{}: attribute kernel_shape is required", n.label());
  const size_t nsp = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_window_attrs(n, nsp, {}));
  PoolGeometry g;
  g.planes = x[0] * x[1];
  g.in.assign(x.begin() + 2, x.end());
  g.taps.resize(nsp);
  g.counted.resize(nsp);
  for (size_t d = 0; d < nsp; ++d) {
    KILN_ASSIGN_OR_RETURN(AxisGeometry ag, resolve_window_axis(a, d, g.in[d], true, n));
    g.out.push_back(ag.out);
    for (int64_t o = 0; o < ag.out; ++o) {
      std::vector<int64_t> t;
      int64_t counted = 0;
      for (int64_t k = 0; k < a.kernel[d]; ++k) {
        const int64_t i = o * a.strides[d] - ag.pad_begin + k * a.dilations[d];
        if (i >= 0 && i < g.in[d]) t.push_back(i);
        if (i >= -ag.pad_begin && i < g.in[d] + ag.pad_end) ++counted;
      }
      g.taps[d].push_back(std::move(t));
      g.counted[d].push_back(counted);
    }
  }
  return g;
}

// Calls f(o, valid, counted, visit_all) for every output position o of one plane: `valid` is
// the number of in-range taps, `counted` the number inside input or padding, and
// visit_all(visit) calls visit(in-plane row-major offset, per-axis input indices) for each
// in-range tap in row-major order.
template <typename F>
void for_each_window(const PoolGeometry& g, F&& f) {
  const size_t nsp = g.in.size();
  std::vector<int64_t> istr(nsp, 1), oidx(nsp, 0), tidx(nsp, 0), pos(nsp, 0);
  for (int64_t d = static_cast<int64_t>(nsp) - 2; d >= 0; --d) istr[d] = istr[d + 1] * g.in[d + 1];
  const int64_t P = shape_product(g.out);
  std::vector<const std::vector<int64_t>*> lists(nsp);
  for (int64_t o = 0; o < P; ++o) {
    int64_t combos = 1, counted = 1;
    for (size_t d = 0; d < nsp; ++d) {
      lists[d] = &g.taps[d][oidx[d]];
      combos *= static_cast<int64_t>(lists[d]->size());
      counted *= g.counted[d][oidx[d]];
    }
    auto visit_all = [&](auto&& visit) {
      std::fill(tidx.begin(), tidx.end(), 0);
      for (int64_t t = 0; t < combos; ++t) {
        int64_t off = 0;
        for (size_t d = 0; d < nsp; ++d) {
          pos[d] = (*lists[d])[tidx[d]];
          off += pos[d] * istr[d];
        }
        visit(off, pos);
        for (int64_t d = static_cast<int64_t>(nsp) - 1; d >= 0; --d) {
          if (++tidx[d] < static_cast<int64_t>(lists[d]->size())) break;
          tidx[d] = 0;
        }
      }
    };
    f(o, combos, counted, visit_all);
    for (int64_t d = static_cast<int64_t>(nsp) - 1; d >= 0; --d) {
      if (++oidx[d] < g.out[d]) break;
      oidx[d] = 0;
    }
  }
}

std::vector<Dim> pool_output_dims(const Node& n, const TensorType& x, const WindowAttrs& a,
                                  Status& st) {
  std::vector<Dim> out = {(*x.dims)[0], (*x.dims)[1]};
  for (size_t d = 0; d + 2 < x.dims->size(); ++d) {
    const Dim& in = (*x.dims)[d + 2];
    if (!in.is_static()) {
      out.push_back(Dim());
      continue;
    }
    auto g = resolve_window_axis(a, d, in.value, true, n);
    if (!g.ok()) {
      st = g.status();
      return {};
    }
    out.push_back(g->out);
  }
  return out;
}

Status infer_pool(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (!n.attrs.has("kernel_shape"))
    return KILN_ERROR("{}: attribute kernel_shape is required", n.label());
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    ctx.set_output(1, TensorType::unknown_rank(DataType::kInt64));
    return Status::Ok();
  }
  if (x.rank() < 3)
    return KILN_ERROR("{}: X must have rank >= 3 (N, C, spatial...), got rank {}", n.label(),
                      x.rank());
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_window_attrs(n, x.rank() - 2, {}));
  Status st;
  std::vector<Dim> out = pool_output_dims(n, x, a, st);
  KILN_RETURN_IF_ERROR(st);
  ctx.set_output(0, TensorType(x.dtype, out));
  ctx.set_output(1, TensorType(DataType::kInt64, out));
  return Status::Ok();
}

// --- MaxPool -------------------------------------------------------------------------------------

template <typename T>
auto cmp_value(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<float>(v);
  else return v;
}

template <typename T>
void maxpool_typed(const PoolGeometry& g, bool col_major, const T* x, T* y, int64_t* ind) {
  const size_t nsp = g.in.size();
  const int64_t inP = shape_product(g.in), P = shape_product(g.out);
  std::vector<int64_t> cstr(nsp, 1);  // column-major strides for storage_order = 1
  for (size_t d = 1; d < nsp; ++d) cstr[d] = cstr[d - 1] * g.in[d - 1];
  using C = decltype(cmp_value(T{}));
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const T* xp = x + pl * inP;
    for_each_window(g, [&](int64_t o, int64_t, int64_t, auto&& visit_all) {
      bool found = false;
      C best{};
      int64_t best_off = 0, best_idx = -1;
      visit_all([&](int64_t off, const std::vector<int64_t>& pos) {
        const C v = cmp_value(xp[off]);
        bool take = !found || v > best;
        if constexpr (std::is_floating_point_v<C>)
          take = take || (std::isnan(v) && !std::isnan(best));
        if (!take) return;
        found = true;
        best = v;
        best_off = off;
        if (col_major) {
          best_idx = 0;
          for (size_t d = 0; d < nsp; ++d) best_idx += pos[d] * cstr[d];
        } else {
          best_idx = off;
        }
      });
      if (found) {
        y[pl * P + o] = xp[best_off];
      } else if constexpr (std::is_floating_point_v<C>) {
        y[pl * P + o] = convert<T>(-std::numeric_limits<C>::infinity());
      } else {
        y[pl * P + o] = std::numeric_limits<T>::lowest();
      }
      if (ind) ind[pl * P + o] = found ? pl * inP + best_idx : -1;
    });
  }
}

Status maxpool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: input X is required", n.label());
  const DataType dt = x->dtype();
  if (dt == DataType::kBool || !dtype_is_supported(dt))
    return KILN_ERROR("{}: unsupported type {}", n.label(), dtype_name(dt));
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, pool_geometry(n, x->shape()));
  const int64_t order = n.attrs.get_int("storage_order", 0);
  if (order != 0 && order != 1)
    return KILN_ERROR("{}: storage_order must be 0 or 1, got {}", n.label(), order);
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  Tensor y(dt, shape);
  const bool want_ind = ctx.num_outputs() > 1;
  Tensor ind = want_ind ? Tensor(DataType::kInt64, shape) : Tensor();
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, bool>)
      maxpool_typed<T>(g, order == 1, x->data<T>(), y.data<T>(),
                       want_ind ? ind.data<int64_t>() : nullptr);
  });
  ctx.set_output(0, std::move(y));
  if (want_ind) ctx.set_output(1, std::move(ind));
  return Status::Ok();
}

// --- AveragePool ---------------------------------------------------------------------------------

template <typename T>
void avgpool_typed(const PoolGeometry& g, bool include_pad, const T* x, T* y) {
  const int64_t inP = shape_product(g.in), P = shape_product(g.out);
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const T* xp = x + pl * inP;
    for_each_window(g, [&](int64_t o, int64_t valid, int64_t counted, auto&& visit_all) {
      T sum = 0;
      visit_all([&](int64_t off, const std::vector<int64_t>&) { sum += xp[off]; });
      const int64_t div = include_pad ? counted : valid;
      // A window entirely in the padding averages nothing: 0/0 gives NaN, like numpy.
      y[pl * P + o] = div > 0 ? sum / static_cast<T>(div) : std::numeric_limits<T>::quiet_NaN();
    });
  }
}

Status check_float_input(const Node& n, const Tensor* x) {
  if (!x) return KILN_ERROR("{}: input X is required", n.label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: unsupported type {} (float types only)", n.label(),
                      dtype_name(x->dtype()));
  return Status::Ok();
}

Status avgpool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  KILN_RETURN_IF_ERROR(check_float_input(n, x));
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, pool_geometry(n, x->shape()));
  const bool include_pad = n.attrs.get_int("count_include_pad", 0) != 0;
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  const DataType dt = x->dtype();
  if (dt == DataType::kFloat64) {
    Tensor y(dt, shape);
    avgpool_typed<double>(g, include_pad, x->data<double>(), y.data<double>());
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }
  const Tensor xf = dt == DataType::kFloat32 ? *x : x->cast(DataType::kFloat32);
  Tensor y(DataType::kFloat32, shape);
  avgpool_typed<float>(g, include_pad, xf.data<float>(), y.data<float>());
  ctx.set_output(0, dt == DataType::kFloat32 ? std::move(y) : y.cast(dt));
  return Status::Ok();
}

// --- GlobalAveragePool / GlobalMaxPool -----------------------------------------------------------

Status infer_global_pool(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  if (x.rank() < 2)
    return KILN_ERROR("{}: X must have rank >= 2 (N, C, spatial...), got rank {}",
                      ctx.node().label(), x.rank());
  std::vector<Dim> out = {(*x.dims)[0], (*x.dims)[1]};
  out.resize(x.dims->size(), Dim(1));
  ctx.set_output(0, TensorType(x.dtype, out));
  return Status::Ok();
}

template <bool kMax>
Status global_pool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  KILN_RETURN_IF_ERROR(check_float_input(n, x));
  if (x->rank() < 2)
    return KILN_ERROR("{}: X must have rank >= 2 (N, C, spatial...), got {}", n.label(),
                      shape_str(x->shape()));
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  shape.resize(x->shape().size(), 1);
  const int64_t planes = x->dim(0) * x->dim(1);
  const int64_t inP = planes == 0 ? 0 : x->numel() / planes;
  if (kMax && inP == 0 && planes > 0)
    return KILN_ERROR("{}: cannot take the max over empty spatial dims of {}", n.label(),
                      shape_str(x->shape()));
  const DataType dt = x->dtype();
  const DataType acc_dt = dt == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
  const Tensor xf = x->dtype() == acc_dt ? *x : x->cast(acc_dt);
  Tensor y(acc_dt, shape);
  visit_dtype(acc_dt, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {
      const T* xp = xf.data<T>();
      T* yp = y.data<T>();
      for (int64_t pl = 0; pl < planes; ++pl) {
        const T* p = xp + pl * inP;
        T r = kMax ? p[0] : T(0);
        for (int64_t i = 0; i < inP; ++i) {
          if constexpr (kMax) r = (p[i] > r || std::isnan(p[i])) && !std::isnan(r) ? p[i] : r;
          else r += p[i];
        }
        yp[pl] = kMax ? r : r / static_cast<T>(inP);
      }
    }
  });
  ctx.set_output(0, acc_dt == dt ? std::move(y) : y.cast(dt));
  return Status::Ok();
}

// --- LpPool / GlobalLpPool ----------------------------------------------------------------------
// y = (sum of |x|^p over the window's in-range taps)^(1/p): padding adds nothing. p is an int
// since opset 2 (a float before); p < 1 is refused.
Expected<double> lp_order(const Node& n) {
  const Attribute* a = n.attrs.find("p");
  const double p = !a ? 2.0 : a->kind == Attribute::Kind::kFloat ? a->f : static_cast<double>(a->i);
  if (!(p >= 1.0) || p > 1e6) return KILN_ERROR("{}: p must be >= 1, got {}", n.label(), p);
  return p;
}

double lp_term(double v, double p) {
  const double a = std::fabs(v);
  return p == 1.0 ? a : p == 2.0 ? a * a : std::pow(a, p);
}
double lp_root(double s, double p) {
  return p == 1.0 ? s : p == 2.0 ? std::sqrt(s) : std::pow(s, 1.0 / p);
}

Status infer_lp_pool(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(lp_order(n).status());
  const DataType t = ctx.input_type(0).dtype;
  if (t != DataType::kUndefined && !dtype_is_float(t))
    return KILN_ERROR("{}: unsupported type {} (float types only)", n.label(), dtype_name(t));
  return n.op_type == "GlobalLpPool" ? infer_global_pool(ctx) : infer_pool(ctx);
}

Status lp_pool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  KILN_RETURN_IF_ERROR(check_float_input(n, x));
  KILN_ASSIGN_OR_RETURN(const double p, lp_order(n));
  KILN_ASSIGN_OR_RETURN(PoolGeometry g, pool_geometry(n, x->shape()));
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, shape);
  const int64_t inP = shape_product(g.in), P = shape_product(g.out);
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const double* xp = xd.data<double>() + pl * inP;
    double* yp = y.data<double>() + pl * P;
    for_each_window(g, [&](int64_t o, int64_t, int64_t, auto&& visit_all) {
      double sum = 0;
      visit_all([&](int64_t off, const std::vector<int64_t>&) { sum += lp_term(xp[off], p); });
      yp[o] = lp_root(sum, p);
    });
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

Status global_lp_pool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  KILN_RETURN_IF_ERROR(check_float_input(n, x));
  KILN_ASSIGN_OR_RETURN(const double p, lp_order(n));
  if (x->rank() < 2)
    return KILN_ERROR("{}: X must have rank >= 2 (N, C, spatial...), got {}", n.label(),
                      shape_str(x->shape()));
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  shape.resize(x->shape().size(), 1);
  const int64_t planes = x->dim(0) * x->dim(1), inP = planes == 0 ? 0 : x->numel() / planes;
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, shape);
  for (int64_t pl = 0; pl < planes; ++pl) {
    double sum = 0;
    for (int64_t i = 0; i < inP; ++i) sum += lp_term(xd.data<double>()[pl * inP + i], p);
    y.data<double>()[pl] = lp_root(sum, p);
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// --- MaxUnpool -----------------------------------------------------------------------------------
// Z = zeros(inferred); Z.flat[I.flat[i]] = X.flat[i] (a later index wins a duplicate), where
// inferred is N, C and (in - 1) * stride + kernel - pad_begin - pad_end per spatial axis: the
// indices are MaxPool's flat offsets into that shape. With output_shape (each size at least the
// inferred one), Z sits at the start of a zero tensor of that shape, as ONNX's reference has it.
constexpr int64_t kMaxUnpoolElements = int64_t{1} << 31;

Expected<WindowAttrs> unpool_attrs(const Node& n, int64_t rank) {
  if (rank < 3)
    return KILN_ERROR("{}: X must have rank >= 3 (N, C, spatial...), got rank {}", n.label(), rank);
  if (!n.attrs.has("kernel_shape"))
    return KILN_ERROR("{}: attribute kernel_shape is required", n.label());
  return read_window_attrs(n, static_cast<size_t>(rank - 2), {});
}

// The inferred size of spatial axis d for input size `in`.
Expected<int64_t> unpool_axis(const Node& n, const WindowAttrs& a, size_t d, int64_t in) {
  const size_t nsp = a.kernel.size();
  const int64_t out = (in - 1) * a.strides[d] + a.kernel[d] - a.pads[d] - a.pads[nsp + d];
  if (out < 0)
    return KILN_ERROR("{}: spatial axis {} of size {} unpools to a negative size {}", n.label(), d,
                      in, out);
  return out;
}

Status check_unpool_shape(const Node& n, const std::vector<int64_t>& s, int64_t rank) {
  if (static_cast<int64_t>(s.size()) != rank)
    return KILN_ERROR("{}: output_shape {} must have X's rank {}", n.label(), shape_str(s), rank);
  int64_t total = 1;
  for (int64_t d : s) {
    if (d < 0)
      return KILN_ERROR("{}: output shape {} has a negative size", n.label(), shape_str(s));
    if (d > 0 && total > kMaxUnpoolElements / d)
      return KILN_ERROR("{}: output shape {} has more than 2^31 elements", n.label(), shape_str(s));
    total *= d;
  }
  return Status::Ok();
}

Status infer_max_unpool(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (x.dtype != DataType::kUndefined && !dtype_is_float(x.dtype))
    return KILN_ERROR("{}: X must be a float tensor, got {}", n.label(), dtype_name(x.dtype));
  const DataType it = ctx.input_type(1).dtype;
  if (it != DataType::kUndefined && it != DataType::kInt64)
    return KILN_ERROR("{}: I must be int64, got {}", n.label(), dtype_name(it));
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  const int64_t rank = x.rank();
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, unpool_attrs(n, rank));
  if (ctx.has_input(2)) {
    if (const Tensor* s = ctx.input_const(2)) {
      const std::vector<int64_t> shape = s->to_int64_vector();
      KILN_RETURN_IF_ERROR(check_unpool_shape(n, shape, rank));
      ctx.set_output(0, TensorType(x.dtype, std::vector<Dim>(shape.begin(), shape.end())));
    } else if (auto v = ctx.input_value(2); v && static_cast<int64_t>(v->size()) == rank) {
      std::vector<Dim> dims;
      for (const SymInt& e : *v) dims.push_back(e.dim());
      ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    } else {
      ctx.set_output(0, TensorType(x.dtype, std::vector<Dim>(static_cast<size_t>(rank))));
    }
    return Status::Ok();
  }
  std::vector<Dim> out = {(*x.dims)[0], (*x.dims)[1]};
  for (size_t d = 0; d + 2 < x.dims->size(); ++d) {
    const Dim& in = (*x.dims)[d + 2];
    if (!in.is_static()) {
      out.push_back(Dim());
      continue;
    }
    KILN_ASSIGN_OR_RETURN(int64_t o, unpool_axis(n, a, d, in.value));
    out.push_back(o);
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(out)));
  return Status::Ok();
}

Status max_unpool_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* ind = ctx.input(1);
  KILN_RETURN_IF_ERROR(check_float_input(n, x));
  if (!ind || ind->dtype() != DataType::kInt64)
    return KILN_ERROR("{}: input I (int64 indices) is required", n.label());
  if (ind->shape() != x->shape())
    return KILN_ERROR("{}: I {} must have X's shape {}", n.label(), shape_str(ind->shape()),
                      shape_str(x->shape()));
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, unpool_attrs(n, x->rank()));
  std::vector<int64_t> inferred = {x->dim(0), x->dim(1)};
  for (size_t d = 0; d + 2 < x->shape().size(); ++d) {
    KILN_ASSIGN_OR_RETURN(int64_t o, unpool_axis(n, a, d, x->dim(static_cast<int64_t>(d) + 2)));
    inferred.push_back(o);
  }
  KILN_RETURN_IF_ERROR(check_unpool_shape(n, inferred, x->rank()));
  std::vector<int64_t> shape = inferred;
  if (const Tensor* s = ctx.input(2)) {
    if (!dtype_is_integer(s->dtype()) || s->rank() != 1)
      return KILN_ERROR("{}: output_shape must be a 1-D integer tensor, got {}", n.label(),
                        s->desc());
    shape = s->to_int64_vector();
    KILN_RETURN_IF_ERROR(check_unpool_shape(n, shape, x->rank()));
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] < inferred[d])
        return KILN_ERROR("{}: output_shape {} is smaller than the unpooled shape {}", n.label(),
                          shape_str(shape), shape_str(inferred));
  }
  const size_t es = dtype_size(x->dtype());
  const int64_t total = shape_product(inferred);
  std::vector<uint8_t> z(static_cast<size_t>(total) * es, 0);
  const auto* src = static_cast<const uint8_t*>(x->raw());
  const int64_t* ip = ind->data<int64_t>();
  for (int64_t i = 0; i < x->numel(); ++i) {
    if (ip[i] < 0 || ip[i] >= total)
      return KILN_ERROR("{}: index {} at position {} is outside the unpooled {} ({} elements)",
                        n.label(), ip[i], i, shape_str(inferred), total);
    std::memcpy(z.data() + ip[i] * es, src + i * es, es);
  }
  Tensor y(x->dtype(), shape);
  auto* dst = static_cast<uint8_t*>(y.raw());
  std::memset(dst, 0, y.nbytes());
  // Rows of the last axis of Z into the start of Y's rows.
  const size_t r = shape.size();
  const int64_t row = inferred[r - 1], rows = row == 0 ? 0 : total / row;
  std::vector<int64_t> idx(r - 1, 0), ystr(r, 1);
  for (size_t d = r - 1; d-- > 0;) ystr[d] = ystr[d + 1] * shape[d + 1];
  for (int64_t k = 0; k < rows; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d + 1 < r; ++d) off += idx[d] * ystr[d];
    std::memcpy(dst + off * es, z.data() + k * row * es, static_cast<size_t>(row) * es);
    for (size_t d = r - 1; d-- > 0;) {
      if (++idx[d] < inferred[d]) break;
      idx[d] = 0;
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kPoolOps[] = {
    {"", "MaxPool", infer_pool, maxpool_cpu, nullptr},
    {"", "AveragePool", infer_pool, avgpool_cpu, nullptr},
    {"", "GlobalAveragePool", infer_global_pool, global_pool_cpu<false>, nullptr},
    {"", "GlobalMaxPool", infer_global_pool, global_pool_cpu<true>, nullptr},
    {"", "MaxUnpool", infer_max_unpool, max_unpool_cpu, nullptr},
    {"", "LpPool", infer_lp_pool, lp_pool_cpu, nullptr},
    {"", "GlobalLpPool", infer_lp_pool, global_lp_pool_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> pool_ops() { return kPoolOps; }

}  // namespace kiln
