// Gather, GatherElements, GatherND: dtype-agnostic byte copies driven by int32/int64 indices.
// Negative indices count from the end; an index out of range is an error naming the node. And
// OneHot (passes/one_hot_to_equal.cpp gives the GPU its form) and Compress (numpy.compress;
// passes/compress_to_gather.cpp gives the GPU its form).
#include <algorithm>
#include <cstring>

#include "ops/shape_util.h"

namespace kiln::shape_detail {
namespace {

Expected<std::vector<int64_t>> index_values(const Tensor& t, const Node& n) {
  if (t.dtype() != DataType::kInt32 && t.dtype() != DataType::kInt64)
    return KILN_ERROR("{}: indices must be int32 or int64, got {}", n.label(), t.desc());
  return t.to_int64_vector();
}

Expected<int64_t> fix_index(int64_t i, int64_t dim, const Node& n) {
  if (i < -dim || i >= dim)
    return KILN_ERROR("{}: index {} is out of range for a dimension of size {}", n.label(), i, dim);
  return i < 0 ? i + dim : i;
}

// ---------------------------------------------------------------- Gather
Status gather_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  const TensorType& ind = ctx.input_type(1);
  if (!x.has_rank() || !ind.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  if (x.rank() == 0) return KILN_ERROR("{}: Gather data must have rank >= 1", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(ctx.attrs().get_int("axis", 0), x.rank(), ctx.node()));
  std::vector<Dim> dims(x.dims->begin(), x.dims->begin() + axis);
  dims.insert(dims.end(), ind.dims->begin(), ind.dims->end());
  dims.insert(dims.end(), x.dims->begin() + axis + 1, x.dims->end());
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status gather_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* ind = ctx.input(1);
  if (!x || !ind) return KILN_ERROR("{}: Gather needs data and indices", n.label());
  if (x->rank() == 0) return KILN_ERROR("{}: Gather data must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x->rank(), n));
  KILN_ASSIGN_OR_RETURN(auto idx, index_values(*ind, n));
  std::span<const int64_t> s(x->shape());
  std::vector<int64_t> shape(s.begin(), s.begin() + axis);
  shape.insert(shape.end(), ind->shape().begin(), ind->shape().end());
  shape.insert(shape.end(), s.begin() + axis + 1, s.end());
  const int64_t dim = s[axis];
  for (int64_t& i : idx) {
    KILN_ASSIGN_OR_RETURN(i, fix_index(i, dim, n));
  }
  Tensor y(x->dtype(), shape);
  const int64_t outer = product(s.subspan(0, axis));
  const size_t chunk = static_cast<size_t>(product(s.subspan(axis + 1))) * dtype_size(x->dtype());
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  if (chunk > 0) {
    for (int64_t o = 0; o < outer; ++o)
      for (size_t j = 0; j < idx.size(); ++j, dst += chunk)
        std::memcpy(dst, src + (o * dim + idx[j]) * chunk, chunk);
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- GatherElements
Status gather_elements_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  const TensorType& ind = ctx.input_type(1);
  if (x.has_rank() && ind.has_rank() && x.rank() != ind.rank())
    return KILN_ERROR("{}: data rank {} and indices rank {} differ", ctx.node().label(), x.rank(), ind.rank());
  if (x.has_rank()) {
    KILN_RETURN_IF_ERROR(normalize_axis(ctx.attrs().get_int("axis", 0), x.rank(), ctx.node()).status());
  }
  ctx.set_output(0, ind.has_rank() ? TensorType(x.dtype, *ind.dims) : TensorType::unknown_rank(x.dtype));
  return Status::Ok();
}

Status gather_elements_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* ind = ctx.input(1);
  if (!x || !ind) return KILN_ERROR("{}: GatherElements needs data and indices", n.label());
  if (x->rank() != ind->rank() || x->rank() == 0)
    return KILN_ERROR("{}: data {} and indices {} must have the same rank >= 1", n.label(),
                      x->desc(), ind->desc());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x->rank(), n));
  for (int64_t k = 0; k < x->rank(); ++k)
    if (k != axis && ind->shape()[k] > x->shape()[k])
      return KILN_ERROR("{}: indices {} exceed data {} on axis {}", n.label(), ind->desc(), x->desc(), k);
  KILN_ASSIGN_OR_RETURN(auto idx, index_values(*ind, n));
  Tensor y(x->dtype(), ind->shape());
  const size_t es = dtype_size(x->dtype());
  const auto xs = contiguous_strides(x->shape());
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  const int64_t rank = x->rank();
  std::vector<int64_t> pos(rank, 0);
  for (size_t e = 0; e < idx.size(); ++e) {
    KILN_ASSIGN_OR_RETURN(int64_t i, fix_index(idx[e], x->shape()[axis], n));
    int64_t off = 0;
    for (int64_t k = 0; k < rank; ++k) off += (k == axis ? i : pos[k]) * xs[k];
    std::memcpy(dst + e * es, src + off * es, es);
    for (int64_t k = rank - 1; k >= 0; --k) {
      if (++pos[k] < ind->shape()[k]) break;
      pos[k] = 0;
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- GatherND
Status gather_nd_check(int64_t r, int64_t q, int64_t b, int64_t m, const Node& n) {
  if (r < 1 || q < 1) return KILN_ERROR("{}: data and indices must have rank >= 1", n.label());
  if (b < 0 || b >= std::min(r, q))
    return KILN_ERROR("{}: batch_dims {} must be less than both ranks ({}, {})", n.label(), b, r, q);
  if (m >= 0 && (m < 1 || m > r - b))
    return KILN_ERROR("{}: indices last dimension {} must be in [1, {}]", n.label(), m, r - b);
  return Status::Ok();
}

Status gather_nd_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  const TensorType& ind = ctx.input_type(1);
  const int64_t b = ctx.attrs().get_int("batch_dims", 0);
  if (!x.has_rank() || !ind.has_rank() || ind.rank() < 1 || !ind.dims->back().is_static()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  const int64_t m = ind.dims->back().value;
  KILN_RETURN_IF_ERROR(gather_nd_check(x.rank(), ind.rank(), b, m, ctx.node()));
  std::vector<Dim> dims(ind.dims->begin(), ind.dims->end() - 1);
  for (int64_t k = 0; k < b; ++k) dims[k] = merge_dim(dims[k], (*x.dims)[k]);
  dims.insert(dims.end(), x.dims->begin() + b + m, x.dims->end());
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status gather_nd_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* ind = ctx.input(1);
  if (!x || !ind) return KILN_ERROR("{}: GatherND needs data and indices", n.label());
  const int64_t b = n.attrs.get_int("batch_dims", 0);
  const int64_t r = x->rank(), q = ind->rank();
  KILN_RETURN_IF_ERROR(gather_nd_check(r, q, b, q >= 1 ? ind->shape().back() : -1, n));
  const int64_t m = ind->shape().back();
  for (int64_t k = 0; k < b; ++k)
    if (x->shape()[k] != ind->shape()[k])
      return KILN_ERROR("{}: batch dimension {} differs: data {} vs indices {}", n.label(), k,
                        x->desc(), ind->desc());
  KILN_ASSIGN_OR_RETURN(auto idx, index_values(*ind, n));
  std::span<const int64_t> xs(x->shape()), is(ind->shape());
  std::vector<int64_t> shape(is.begin(), is.end() - 1);
  shape.insert(shape.end(), xs.begin() + b + m, xs.end());
  Tensor y(x->dtype(), shape);
  const int64_t batches = product(xs.subspan(0, b));
  const int64_t tuples = product(is.subspan(b, q - 1 - b));  // index tuples per batch
  const size_t es = dtype_size(x->dtype());
  const int64_t slice = product(xs.subspan(b + m));          // elements per gathered slice
  const int64_t batch_elems = product(xs.subspan(b));
  const auto strides = contiguous_strides(std::vector<int64_t>(xs.begin() + b, xs.end()));
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t bi = 0; bi < batches; ++bi) {
    for (int64_t t = 0; t < tuples; ++t) {
      const int64_t* tuple = idx.data() + (bi * tuples + t) * m;
      int64_t off = bi * batch_elems;
      for (int64_t k = 0; k < m; ++k) {
        KILN_ASSIGN_OR_RETURN(int64_t i, fix_index(tuple[k], xs[b + k], n));
        off += i * strides[k];
      }
      const size_t bytes = static_cast<size_t>(slice) * es;
      if (bytes) std::memcpy(dst, src + off * static_cast<int64_t>(es), bytes);
      dst += bytes;
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- OneHot
// y has indices' dims with `depth` inserted at `axis`: on where the index (plus depth when it is
// negative) equals the position along that axis, off elsewhere (an index out of range: all off).
// A float index matches only a whole number; depth is truncated to an integer (the spec's cast).
Expected<int64_t> one_hot_depth(const Node& n, const Tensor& d) {
  if (d.numel() != 1) return KILN_ERROR("{}: depth must be one value, got {}", n.label(), d.desc());
  const double v = d.at_double(0);
  if (!(v >= 1) || v > (1 << 24))
    return KILN_ERROR("{}: depth must be in [1, 2^24], got {}", n.label(), v);
  return static_cast<int64_t>(v);
}

Expected<int64_t> one_hot_axis(const Node& n, int64_t rank) {
  const int64_t axis = n.attrs.get_int("axis", -1);
  if (axis < -rank - 1 || axis > rank)
    return KILN_ERROR("{}: axis {} is outside [{}, {}] for indices of rank {}", n.label(), axis,
                      -rank - 1, rank, rank);
  return axis < 0 ? axis + rank + 1 : axis;
}

Status one_hot_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType &ind = ctx.input_type(0), &vals = ctx.input_type(2);
  if (vals.has_rank() && vals.rank() != 1)
    return KILN_ERROR("{}: values must be [off_value, on_value], got {}", n.label(), vals.str());
  if (!ind.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(vals.dtype));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, one_hot_axis(n, ind.rank()));
  Dim depth;
  if (const Tensor* d = ctx.input_const(1)) {
    KILN_ASSIGN_OR_RETURN(int64_t v, one_hot_depth(n, *d));
    depth = Dim(v);
  }
  std::vector<Dim> out = *ind.dims;
  out.insert(out.begin() + axis, depth);
  ctx.set_output(0, TensorType(vals.dtype, std::move(out)));
  return Status::Ok();
}

Status one_hot_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *ind = ctx.input(0), *d = ctx.input(1), *vals = ctx.input(2);
  if (!ind || !d || !vals)
    return KILN_ERROR("{}: OneHot needs indices, depth and values", n.label());
  if (vals->numel() != 2 || vals->rank() != 1)
    return KILN_ERROR("{}: values must be [off_value, on_value], got {}", n.label(), vals->desc());
  KILN_ASSIGN_OR_RETURN(int64_t depth, one_hot_depth(n, *d));
  KILN_ASSIGN_OR_RETURN(int64_t axis, one_hot_axis(n, ind->rank()));
  std::vector<int64_t> shape = ind->shape();
  shape.insert(shape.begin() + axis, depth);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < ind->rank(); ++i) (i < axis ? outer : inner) *= ind->dim(i);
  if (outer * depth * inner > (int64_t{1} << 31))
    return KILN_ERROR("{}: an output of {} values is over 2^31", n.label(), outer * depth * inner);
  Tensor y(vals->dtype(), shape);
  const size_t es = dtype_size(vals->dtype());
  const auto* off = static_cast<const uint8_t*>(vals->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < depth; ++k)
      for (int64_t i = 0; i < inner; ++i) {
        double v = ind->at_double(o * inner + i);
        if (v < 0) v += static_cast<double>(depth);
        const bool on = v == static_cast<double>(k);
        std::memcpy(dst + ((o * depth + k) * inner + i) * static_cast<int64_t>(es),
                    off + (on ? es : 0), es);
      }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Compress
// numpy.compress: the slices along axis (of the flattened input when there is no axis) whose
// condition is true. A condition shorter than the axis leaves the rest out; one longer may only
// be false past the axis (numpy's rule). The output length depends on the data.
Status compress_check_condition(const Node& n, const TensorType& c) {
  if (c.dtype != DataType::kUndefined && c.dtype != DataType::kBool)
    return KILN_ERROR("{}: condition must be bool, got {}", n.label(), dtype_name(c.dtype));
  if (c.has_rank() && c.rank() != 1)
    return KILN_ERROR("{}: condition must be 1-D, got {}", n.label(), c.str());
  return Status::Ok();
}

// The output type with the selected length `len` (unknown: Dim()).
Expected<TensorType> compress_type(const Node& n, const TensorType& x, Dim len) {
  if (!n.attrs.has("axis")) return TensorType(x.dtype, {len});
  if (!x.has_rank()) return TensorType::unknown_rank(x.dtype);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x.rank(), n));
  std::vector<Dim> dims = *x.dims;
  dims[static_cast<size_t>(axis)] = len;
  return TensorType(x.dtype, std::move(dims));
}

Status compress_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(compress_check_condition(n, ctx.input_type(1)));
  KILN_ASSIGN_OR_RETURN(TensorType t, compress_type(n, ctx.input_type(0), Dim()));
  ctx.set_output(0, std::move(t));
  return Status::Ok();
}

// At most every slice is selected: the axis length (or the element count), and the condition's.
Status compress_bound(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  const auto xs = x.static_shape();
  if (!xs) return KILN_ERROR("{}: the input's shape is not known", n.label());
  int64_t len = product(*xs);
  if (n.attrs.has("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x.rank(), n));
    len = (*xs)[static_cast<size_t>(axis)];
  }
  if (const auto cs = ctx.input_type(1).static_shape(); cs && cs->size() == 1)
    len = std::min(len, (*cs)[0]);
  KILN_ASSIGN_OR_RETURN(TensorType t, compress_type(n, x, Dim(len)));
  ctx.set_output(0, std::move(t));
  return Status::Ok();
}

Status compress_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* c = ctx.input(1);
  if (!x || !c) return KILN_ERROR("{}: Compress needs input and condition", n.label());
  KILN_RETURN_IF_ERROR(compress_check_condition(n, TensorType::of(*c)));
  const bool has_axis = n.attrs.has("axis");
  std::vector<int64_t> s = has_axis ? x->shape() : std::vector<int64_t>{x->numel()};
  int64_t axis = 0;
  if (has_axis) {
    if (x->rank() == 0) return KILN_ERROR("{}: axis given for a scalar input", n.label());
    KILN_ASSIGN_OR_RETURN(axis, normalize_axis(n.attrs.get_int("axis", 0), x->rank(), n));
  }
  const int64_t dim = s[static_cast<size_t>(axis)];
  const bool* cond = c->data<bool>();
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < c->numel(); ++i) {
    if (!cond[i]) continue;
    if (i >= dim)
      return KILN_ERROR("{}: condition is true at {}, past the axis of size {}", n.label(), i, dim);
    keep.push_back(i);
  }
  std::span<const int64_t> sp(s);
  std::vector<int64_t> shape = s;
  shape[static_cast<size_t>(axis)] = static_cast<int64_t>(keep.size());
  Tensor y(x->dtype(), shape);
  const int64_t outer = product(sp.subspan(0, static_cast<size_t>(axis)));
  const size_t chunk = static_cast<size_t>(product(sp.subspan(static_cast<size_t>(axis) + 1))) *
                       dtype_size(x->dtype());
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  if (chunk > 0)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t k : keep) {
        std::memcpy(dst, src + (o * dim + k) * chunk, chunk);
        dst += chunk;
      }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "OneHot", one_hot_infer, one_hot_cpu, nullptr},
    {"", "Gather", gather_infer, gather_cpu, nullptr},
    {"", "GatherElements", gather_elements_infer, gather_elements_cpu, nullptr},
    {"", "GatherND", gather_nd_infer, gather_nd_cpu, nullptr},
    {"", "Compress", compress_infer, compress_cpu, nullptr, 0, compress_bound},
};

}  // namespace

std::span<const OpDef> gather_ops() { return kOps; }

}  // namespace kiln::shape_detail
