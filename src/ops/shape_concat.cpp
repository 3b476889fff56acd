// Ops that join, split or replicate tensors: Concat, Split, Expand, Tile. All move raw bytes, so
// they work on every dtype.
#include <algorithm>
#include <cstring>

#include "ops/shape_util.h"
#include "ops/shape_values.h"

namespace kiln::shape_detail {
namespace {

// ---------------------------------------------------------------- Concat
// Concat-1 had a default axis of 1; from opset 4 the attribute is required.
Status concat_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 4 && !ctx.node().attrs.has("axis"))
    ctx.node().attrs.set("axis", Attribute::Int(1));
  return Status::Ok();
}

Status concat_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  if (!n.attrs.has("axis")) return KILN_ERROR("{}: Concat needs the axis attribute", n.label());
  DataType dtype = DataType::kUndefined;
  int64_t rank = -1;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const TensorType& t = ctx.input_type(i);
    if (dtype == DataType::kUndefined) dtype = t.dtype;
    if (!t.has_rank()) continue;
    if (rank >= 0 && t.rank() != rank)
      return KILN_ERROR("{}: inputs have different ranks ({} vs {})", n.label(), rank, t.rank());
    rank = t.rank();
  }
  if (rank < 0) {
    ctx.set_output(0, TensorType::unknown_rank(dtype));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), rank, n));
  std::vector<Dim> out(rank);
  Dim sum(0);  // static, a sum of symbols ("past+seq": a KV cache), or unknown
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const TensorType& t = ctx.input_type(i);
    if (!t.has_rank()) {
      sum = Dim();
      continue;
    }
    for (int64_t k = 0; k < rank; ++k) {
      const Dim& d = (*t.dims)[k];
      if (k == axis) {
        sum = add_dims(sum, d);
        continue;
      }
      if (d.is_static() && out[k].is_static() && d.value != out[k].value)
        return KILN_ERROR("{}: input {} has dimension {} = {}, expected {}", n.label(), i, k,
                          d.value, out[k].value);
      out[k] = merge_dim(out[k], d);
    }
  }
  out[axis] = sum;
  // A single input keeps its axis dim (an opaque symbol stays as it is).
  if (ctx.num_inputs() == 1 && ctx.input_type(0).has_rank())
    out[axis] = (*ctx.input_type(0).dims)[axis];
  ctx.set_output(0, TensorType(dtype, std::move(out)));
  return Status::Ok();
}

Status concat_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (ctx.num_inputs() == 0 || !ctx.input(0)) return KILN_ERROR("{}: Concat needs inputs", n.label());
  if (!n.attrs.has("axis")) return KILN_ERROR("{}: Concat needs the axis attribute", n.label());
  const Tensor& first = *ctx.input(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), first.rank(), n));
  std::vector<int64_t> shape = first.shape();
  shape[axis] = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor* t = ctx.input(i);
    if (!t) return KILN_ERROR("{}: input {} is missing", n.label(), i);
    if (t->dtype() != first.dtype() || t->rank() != first.rank())
      return KILN_ERROR("{}: input {} is {}, incompatible with {}", n.label(), i, t->desc(), first.desc());
    for (int64_t k = 0; k < first.rank(); ++k)
      if (k != axis && t->shape()[k] != first.shape()[k])
        return KILN_ERROR("{}: input {} is {}, incompatible with {} (axis {})", n.label(), i,
                          t->desc(), first.desc(), axis);
    shape[axis] += t->shape()[axis];
  }
  Tensor y(first.dtype(), shape);
  const size_t es = dtype_size(first.dtype());
  const int64_t outer = product(std::span<const int64_t>(shape).subspan(0, axis));
  const int64_t inner = product(std::span<const int64_t>(shape).subspan(axis + 1));
  auto* dst = static_cast<uint8_t*>(y.raw());
  const size_t row = static_cast<size_t>(shape[axis] * inner) * es;
  size_t col = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = *ctx.input(i);
    const size_t chunk = static_cast<size_t>(t.shape()[axis] * inner) * es;
    const auto* src = static_cast<const uint8_t*>(t.raw());
    for (int64_t o = 0; o < outer && chunk; ++o) std::memcpy(dst + o * row + col, src + o * chunk, chunk);
    col += chunk;
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Split
Status split_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 13) ctx.attr_to_input("split", 1);
  return Status::Ok();
}

// Sizes of the outputs along the axis of length `dim` (nullopt when dim is unknown and the
// sizes depend on it).
Expected<std::optional<std::vector<int64_t>>> split_sizes(const Node& n, const Tensor* split,
                                                         std::optional<int64_t> dim, size_t outputs) {
  using R = std::optional<std::vector<int64_t>>;
  if (split && split->numel() > 0) {
    KILN_ASSIGN_OR_RETURN(auto s, int_values(*split, n, "split"));
    if (s.size() != outputs)
      return KILN_ERROR("{}: split has {} entries for {} outputs", n.label(), s.size(), outputs);
    int64_t sum = 0;
    for (int64_t v : s) {
      if (v < 0) return KILN_ERROR("{}: negative split size {}", n.label(), v);
      if (__builtin_add_overflow(sum, v, &sum))
        return KILN_ERROR("{}: split sizes sum past int64", n.label());
    }
    if (dim && sum != *dim)
      return KILN_ERROR("{}: split sizes sum to {} but the axis has length {}", n.label(), sum, *dim);
    return R(s);
  }
  if (outputs == 0) return KILN_ERROR("{}: Split has no outputs", n.label());
  if (!dim) return R();
  const int64_t count = static_cast<int64_t>(outputs);
  if (n.attrs.has("num_outputs")) {
    const int64_t k = n.attrs.get_int("num_outputs", 0);
    if (k != count)
      return KILN_ERROR("{}: num_outputs is {} but the node has {} outputs", n.label(), k, count);
    const int64_t chunk = (*dim + k - 1) / k;
    const int64_t last = *dim - chunk * (k - 1);
    if (last < 0)
      return KILN_ERROR("{}: cannot split length {} into {} chunks of {}", n.label(), *dim, k, chunk);
    std::vector<int64_t> s(k, chunk);
    s.back() = last;
    return R(s);
  }
  if (*dim % count != 0)
    return KILN_ERROR("{}: axis length {} cannot be split into {} equal parts", n.label(), *dim, count);
  return R(std::vector<int64_t>(count, *dim / count));
}

Status split_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    for (size_t i = 0; i < ctx.num_outputs(); ++i) ctx.set_output(i, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  if (x.rank() == 0) return KILN_ERROR("{}: cannot split a scalar", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x.rank(), n));
  const Dim& d = (*x.dims)[axis];
  std::optional<std::vector<int64_t>> sizes;
  if (!ctx.has_input(1) || ctx.input_const(1)) {
    KILN_ASSIGN_OR_RETURN(sizes, split_sizes(n, ctx.input_const(1),
                                             d.is_static() ? std::optional<int64_t>(d.value) : std::nullopt,
                                             ctx.num_outputs()));
  }
  for (size_t i = 0; i < ctx.num_outputs(); ++i) {
    std::vector<Dim> dims = *x.dims;
    dims[axis] = sizes ? Dim((*sizes)[i]) : (ctx.num_outputs() == 1 ? d : Dim());
    ctx.set_output(i, TensorType(x.dtype, std::move(dims)));
  }
  return Status::Ok();
}

Status split_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->rank() == 0) return KILN_ERROR("{}: cannot split a scalar", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", 0), x->rank(), n));
  KILN_ASSIGN_OR_RETURN(auto sizes, split_sizes(n, ctx.input(1), x->shape()[axis], ctx.num_outputs()));
  const size_t es = dtype_size(x->dtype());
  std::span<const int64_t> s(x->shape());
  const int64_t outer = product(s.subspan(0, axis));
  const int64_t inner = product(s.subspan(axis + 1));
  const size_t row = static_cast<size_t>(x->shape()[axis] * inner) * es;
  const auto* src = static_cast<const uint8_t*>(x->raw());
  size_t col = 0;
  for (size_t i = 0; i < sizes->size(); ++i) {
    std::vector<int64_t> shape = x->shape();
    shape[axis] = (*sizes)[i];
    Tensor y(x->dtype(), shape);
    const size_t chunk = static_cast<size_t>((*sizes)[i] * inner) * es;
    auto* dst = static_cast<uint8_t*>(y.raw());
    for (int64_t o = 0; o < outer && chunk; ++o) std::memcpy(dst + o * chunk, src + o * row + col, chunk);
    col += chunk;
    ctx.set_output(i, std::move(y));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------- Expand
Status expand_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (const Tensor* s = ctx.input_const(1); s && x.has_rank()) {
    if (s->rank() != 1) return KILN_ERROR("{}: shape must be 1-D, got {}", ctx.node().label(), s->desc());
    KILN_ASSIGN_OR_RETURN(auto shape, int_values(*s, ctx.node(), "shape"));
    for (int64_t v : shape)
      if (v < 0) return KILN_ERROR("{}: negative dimension in shape {}", ctx.node().label(), shape_str(shape));
    KILN_ASSIGN_OR_RETURN(auto dims, broadcast_dims({*x.dims, to_dims(shape)}, ctx.node()));
    ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    return Status::Ok();
  }
  // A shape computed from shapes, known symbolically (ops/shape_values.h).
  if (auto shape = ctx.input_value(1); shape && x.has_rank() && ctx.input_type(1).rank() == 1) {
    std::vector<Dim> req;
    for (const SymInt& e : *shape) req.push_back(e.dim());
    KILN_ASSIGN_OR_RETURN(auto dims, broadcast_dims({*x.dims, req}, ctx.node()));
    ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    return Status::Ok();
  }
  const TensorType& st = ctx.input_type(1);
  if (x.has_rank() && st.rank() == 1 && (*st.dims)[0].is_static()) {
    const int64_t rank = std::max(x.rank(), (*st.dims)[0].value);
    std::vector<Dim> dims(rank);
    for (int64_t k = 0; k < x.rank(); ++k) {
      const Dim& d = (*x.dims)[k];
      if (d.is_static() && d.value != 1) dims[rank - x.rank() + k] = d;
    }
    ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  } else {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
  }
  return Status::Ok();
}

Status expand_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  const Tensor* s = ctx.input(1);
  if (!x || !s) return KILN_ERROR("{}: Expand needs input and shape", ctx.node().label());
  if (s->rank() != 1) return KILN_ERROR("{}: shape must be 1-D, got {}", ctx.node().label(), s->desc());
  KILN_ASSIGN_OR_RETURN(auto shape, int_values(*s, ctx.node(), "shape"));
  for (int64_t v : shape)
    if (v < 0) return KILN_ERROR("{}: negative dimension in shape {}", ctx.node().label(), shape_str(shape));
  KILN_ASSIGN_OR_RETURN(auto out, broadcast_shapes({x->shape(), shape}, ctx.node()));
  Tensor y(x->dtype(), out);
  strided_copy(x->raw(), 0, broadcast_strides(x->shape(), out), y.raw(), out, dtype_size(x->dtype()));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Tile
Status tile_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 6)
    return KILN_ERROR("{}: Tile before opset 6 (tiles + axis inputs) is not supported",
                      ctx.node().label());
  return Status::Ok();
}

Expected<std::vector<int64_t>> tile_repeats(const Tensor& r, int64_t rank, const Node& n) {
  if (r.rank() != 1) return KILN_ERROR("{}: repeats must be 1-D, got {}", n.label(), r.desc());
  KILN_ASSIGN_OR_RETURN(auto reps, int_values(r, n, "repeats"));
  if (static_cast<int64_t>(reps.size()) != rank)
    return KILN_ERROR("{}: repeats has {} entries for rank {}", n.label(), reps.size(), rank);
  for (int64_t v : reps)
    if (v < 0) return KILN_ERROR("{}: negative repeat {}", n.label(), v);
  return reps;
}

Status tile_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  const Tensor* r = ctx.input_const(1);
  std::vector<Dim> dims(x.rank());
  if (r) {
    KILN_ASSIGN_OR_RETURN(auto reps, tile_repeats(*r, x.rank(), ctx.node()));
    for (int64_t k = 0; k < x.rank(); ++k) {
      const Dim& d = (*x.dims)[k];
      if (reps[k] == 1) dims[k] = d;
      else if (reps[k] == 0) dims[k] = Dim(0);
      else if (d.is_static() && __builtin_mul_overflow(d.value, reps[k], &dims[k].value))
        return KILN_ERROR("{}: dim {} ({}) repeated {} times overflows int64", ctx.node().label(),
                          k, d.value, reps[k]);
    }
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status tile_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x || !ctx.input(1)) return KILN_ERROR("{}: Tile needs input and repeats", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(auto reps, tile_repeats(*ctx.input(1), x->rank(), ctx.node()));
  // The output [r0*d0, r1*d1, ...] is the contiguous view [r0, d0, r1, d1, ...] reading the input
  // with stride 0 on the repeat axes.
  const auto in_strides = contiguous_strides(x->shape());
  std::vector<int64_t> view, strides, out;
  for (int64_t k = 0; k < x->rank(); ++k) {
    view.push_back(reps[k]);
    strides.push_back(0);
    view.push_back(x->shape()[k]);
    strides.push_back(in_strides[k]);
    out.push_back(reps[k] * x->shape()[k]);
  }
  Tensor y(x->dtype(), out);
  strided_copy(x->raw(), 0, strides, y.raw(), view, dtype_size(x->dtype()));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Concat", concat_infer, concat_cpu, concat_upgrade},
    {"", "Split", split_infer, split_cpu, split_upgrade},
    {"", "Expand", expand_infer, expand_cpu, nullptr},
    {"", "Tile", tile_infer, tile_cpu, tile_upgrade},
};

}  // namespace

std::span<const OpDef> concat_like_ops() { return kOps; }

}  // namespace kiln::shape_detail
