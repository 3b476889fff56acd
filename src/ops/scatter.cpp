// ScatterND and ScatterElements (opset 18 form: reduction none/add/mul/max/min) and NonZero.
//
// NonZero's output shape depends on the data: inference gives [rank, ?], and the engine learns
// the count only when the kernel has run. That costs what any data-dependent shape costs: no
// static memory plan for the output and what follows it, a host round trip on a GPU, and no
// constant folding past it unless the input is a constant.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Expected<Reduction> reduction(const Node& n) {
  const std::string r = n.attrs.get_string("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  return KILN_ERROR("{}: unknown reduction '{}'", n.label(), r);
}

template <typename C>
C apply(C a, C b, Reduction r) {
  switch (r) {
    case Reduction::kAdd: return a + b;
    case Reduction::kMul: return a * b;
    case Reduction::kMax: return std::max(a, b);
    case Reduction::kMin: return std::min(a, b);
    default: return b;
  }
}

// Combines `u` into `dst` (integers in int64, floats in double, so no precision is lost).
template <typename T>
void combine(T& dst, T u, Reduction r) {
  if (r == Reduction::kNone) {
    dst = u;
  } else if constexpr (std::is_same_v<T, bool>) {
    dst = apply<int64_t>(dst, u, r) != 0;
  } else if constexpr (std::is_integral_v<T>) {
    dst = static_cast<T>(apply<int64_t>(dst, u, r));
  } else {
    dst = convert<T>(apply<double>(to_double(dst), to_double(u), r));
  }
}

Status check_data_type(const Node& n, DataType t) {
  if (t == DataType::kUndefined || (dtype_is_supported(t) && !dtype_is_low_bit(t)))
    return Status::Ok();
  return KILN_ERROR("{}: data type {} is not supported", n.label(), dtype_name(t));
}

Status infer_scatter(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_data_type(ctx.node(), ctx.input_type(0).dtype));
  KILN_RETURN_IF_ERROR(reduction(ctx.node()).status());
  const DataType it = ctx.input_type(1).dtype;
  if (it != DataType::kUndefined && it != DataType::kInt64 && it != DataType::kInt32)
    return KILN_ERROR("{}: indices must be int32 or int64, got {}", ctx.node().label(),
                      dtype_name(it));
  return infer_same_as_input(ctx);
}

// --- ScatterND(data, indices [..., k], updates [..., data.shape[k:]]) -------------------------
Status cpu_scatter_nd(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* data = ctx.input(0);
  const Tensor* idx = ctx.input(1);
  const Tensor* upd = ctx.input(2);
  if (!data || !idx || !upd) return KILN_ERROR("{}: data, indices and updates are required", n.label());
  KILN_ASSIGN_OR_RETURN(Reduction r, reduction(n));
  if (idx->rank() < 1) return KILN_ERROR("{}: indices must have rank >= 1", n.label());
  const int64_t k = idx->dim(idx->rank() - 1);
  if (k > data->rank())
    return KILN_ERROR("{}: index depth {} exceeds data rank {}", n.label(), k, data->rank());
  int64_t slice = 1;
  for (int64_t d = k; d < data->rank(); ++d) slice *= data->dim(d);
  int64_t nidx = 1;  // index tuples: every dimension of indices but the last
  for (int64_t d = 0; d + 1 < idx->rank(); ++d) nidx *= idx->dim(d);
  if (upd->numel() != nidx * slice || upd->dtype() != data->dtype())
    return KILN_ERROR("{}: updates {} do not match {} indices of slices of {} elements ({})",
                      n.label(), upd->desc(), nidx, slice, data->desc());
  const std::vector<int64_t> str = contiguous_strides(data->shape());
  const std::vector<int64_t> iv = idx->to_int64_vector();
  Tensor out = data->clone();
  return visit_dtype(data->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* u = upd->data<T>();
    for (int64_t j = 0; j < nidx; ++j) {
      int64_t off = 0;
      for (int64_t d = 0; d < k; ++d) {
        int64_t v = iv[j * k + d];
        if (v < 0) v += data->dim(d);
        if (v < 0 || v >= data->dim(d))
          return KILN_ERROR("{}: index {} is out of range for dimension {} of {}", n.label(),
                            iv[j * k + d], d, data->desc());
        off += v * str[d];
      }
      for (int64_t e = 0; e < slice; ++e) combine(o[off + e], u[j * slice + e], r);
    }
    ctx.set_output(0, std::move(out));
    return Status::Ok();
  });
}

// --- ScatterElements(data, indices, updates): data[..idx..] along `axis` ----------------------
Status cpu_scatter_elements(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* data = ctx.input(0);
  const Tensor* idx = ctx.input(1);
  const Tensor* upd = ctx.input(2);
  if (!data || !idx || !upd) return KILN_ERROR("{}: data, indices and updates are required", n.label());
  KILN_ASSIGN_OR_RETURN(Reduction r, reduction(n));
  if (idx->shape() != upd->shape() || idx->rank() != data->rank() || upd->dtype() != data->dtype())
    return KILN_ERROR("{}: indices {} and updates {} must have one shape and data {}'s rank",
                      n.label(), idx->desc(), upd->desc(), data->desc());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), data->rank(), n));
  const std::vector<int64_t> str = contiguous_strides(data->shape());
  const std::vector<int64_t> iv = idx->to_int64_vector();
  Tensor out = data->clone();
  return visit_dtype(data->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* u = upd->data<T>();
    std::vector<int64_t> pos(idx->shape().size(), 0);
    for (int64_t j = 0; j < idx->numel(); ++j) {
      int64_t v = iv[j];
      if (v < 0) v += data->dim(axis);
      if (v < 0 || v >= data->dim(axis))
        return KILN_ERROR("{}: index {} is out of range for axis {} of {}", n.label(), iv[j],
                          axis, data->desc());
      int64_t off = 0;
      for (size_t d = 0; d < pos.size(); ++d)
        off += (static_cast<int64_t>(d) == axis ? v : pos[d]) * str[d];
      combine(o[off], u[j], r);
      for (int64_t d = static_cast<int64_t>(pos.size()) - 1; d >= 0; --d) {
        if (++pos[d] < idx->dim(d)) break;
        pos[d] = 0;
      }
    }
    ctx.set_output(0, std::move(out));
    return Status::Ok();
  });
}

// --- NonZero(X) -> int64 [rank, count], coordinates in row-major order ------------------------
Status infer_nonzero(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_data_type(ctx.node(), x.dtype));
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType(DataType::kInt64, {Dim(), Dim()}));
    return Status::Ok();
  }
  // The count is known only at run time.
  ctx.set_output(0, TensorType(DataType::kInt64, {Dim(x.rank()), Dim()}));
  return Status::Ok();
}

// At most every element is non-zero.
Status bound_nonzero(InferContext& ctx) {
  const auto x = ctx.input_type(0).static_shape();
  if (!x) return KILN_ERROR("{}: the input's shape is not known", ctx.node().label());
  int64_t numel = 1;
  for (int64_t d : *x) numel *= d;
  ctx.set_output(0, TensorType(DataType::kInt64, {Dim(std::max<int64_t>(x->size(), 1)), Dim(numel)}));
  return Status::Ok();
}

Status cpu_nonzero(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  KILN_RETURN_IF_ERROR(check_data_type(n, x->dtype()));
  std::vector<int64_t> hits;
  for (int64_t i = 0; i < x->numel(); ++i)
    if (x->at_double(i) != 0.0) hits.push_back(i);  // NaN != 0: counts as non-zero
  const int64_t rank = x->rank(), count = static_cast<int64_t>(hits.size());
  Tensor y(DataType::kInt64, {std::max<int64_t>(rank, 1), count});
  const std::vector<int64_t> str = contiguous_strides(x->shape());
  for (int64_t j = 0; j < count; ++j) {
    int64_t rest = hits[j];
    for (int64_t d = 0; d < rank; ++d) {
      y.data<int64_t>()[d * count + j] = rest / str[d];
      rest %= str[d];
    }
    if (rank == 0) y.data<int64_t>()[j] = 0;  // a scalar is treated as shape [1]
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "ScatterND", infer_scatter, cpu_scatter_nd, nullptr},
    {"", "ScatterElements", infer_scatter, cpu_scatter_elements, nullptr},
    {"", "NonZero", infer_nonzero, cpu_nonzero, nullptr, 0, bound_nonzero},
};

}  // namespace

std::span<const OpDef> scatter_ops() { return kOps; }

}  // namespace kiln
