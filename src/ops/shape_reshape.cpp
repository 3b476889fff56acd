// Ops that change only the shape (or pass data through): Reshape, Shape, Size, Flatten, Squeeze,
// Unsqueeze, Transpose, Identity, Dropout (inference only).
#include <algorithm>
#include <numeric>

#include "core/dispatch.h"
#include "ops/shape_util.h"
#include "ops/shape_values.h"

namespace kiln::shape_detail {
namespace {

// ---------------------------------------------------------------- Reshape
// Resolves a requested shape against the input dims. Unknown dims in `in` are allowed, and so
// are symbolic requests (a shape tensor computed from Shape(x), ops/shape_values.h): the result
// has the symbol, or Dim() where a size cannot be known.
Expected<std::vector<Dim>> reshape_dims(const std::vector<Dim>& in, const std::vector<SymInt>& req,
                                        bool allowzero, const Node& n) {
  std::vector<Dim> out(req.size());
  std::vector<bool> used(in.size(), false), copied(req.size(), false);
  int64_t infer_at = -1;
  bool has_zero = false;
  auto req_str = [&] {
    std::vector<std::string> parts;
    for (const SymInt& r : req) parts.push_back(r.value ? std::to_string(*r.value) : r.dim().str());
    return fmt::format("[{}]", fmt::join(parts, ","));
  };
  for (size_t i = 0; i < req.size(); ++i) {
    if (!req[i].value) {  // a symbolic size (or an unknown one)
      out[i] = req[i].dim();
      continue;
    }
    const int64_t r = *req[i].value;
    if (r == -1) {
      if (infer_at >= 0)
        return KILN_ERROR("{}: shape {} has more than one -1", n.label(), req_str());
      infer_at = static_cast<int64_t>(i);
    } else if (r == 0 && !allowzero) {
      if (i >= in.size())
        return KILN_ERROR("{}: shape {} copies dimension {} (0) but the input has rank {}",
                          n.label(), req_str(), i, in.size());
      out[i] = in[i];
      used[i] = copied[i] = true;
    } else if (r < 0) {
      return KILN_ERROR("{}: invalid dimension {} in shape {}", n.label(), r, req_str());
    } else {
      has_zero |= r == 0;
      out[i] = Dim(r);
    }
  }
  if (has_zero && infer_at >= 0)
    return KILN_ERROR("{}: shape {} has both 0 (allowzero) and -1", n.label(), req_str());
  // Dims copied by 0 cancel between input and output; what remains must be static to check.
  std::vector<Dim> rest_in;
  for (size_t i = 0; i < in.size(); ++i)
    if (!used[i]) rest_in.push_back(in[i]);
  std::vector<Dim> rest_out;
  for (size_t i = 0; i < out.size(); ++i)
    if (static_cast<int64_t>(i) != infer_at && !copied[i]) rest_out.push_back(out[i]);
  const auto pin = static_product(rest_in);
  const auto pout = static_product(rest_out);
  if (infer_at >= 0) {
    if (pin && pout) {
      if (*pout == 0 || *pin % *pout != 0)
        return KILN_ERROR("{}: cannot reshape {} elements into shape {}", n.label(), *pin,
                          req_str());
      out[infer_at] = Dim(*pin / *pout);
    } else {
      out[infer_at] =
          div_dims(dim_product(rest_in), dim_product(rest_out));  // e.g. [N,1] -> [-1]: [N]
    }
  } else if (pin && pout && *pin != *pout) {
    return KILN_ERROR("{}: cannot reshape {} elements into shape {}", n.label(), *pin, req_str());
  }
  return out;
}

Status reshape_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 5) {
    ctx.attr_to_input("shape", 1);
    ctx.node().attrs.erase("consumed_inputs");
  }
  return Status::Ok();
}

Status reshape_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  const bool allowzero = ctx.attrs().get_int("allowzero", 0) != 0;
  if (const Tensor* s = ctx.input_const(1)) {
    KILN_RETURN_IF_ERROR(int_values(*s, ctx.node(), "shape").status());
    if (s->rank() != 1) return KILN_ERROR("{}: shape must be 1-D, got {}", ctx.node().label(), s->desc());
  }
  // A constant shape, or one computed from shapes whose elements are known symbolically.
  const TensorType& st = ctx.input_type(1);
  if (auto req = ctx.input_value(1); req && (ctx.input_const(1) || st.rank() == 1)) {
    if (x.has_rank()) {
      KILN_ASSIGN_OR_RETURN(auto dims, reshape_dims(*x.dims, *req, allowzero, ctx.node()));
      ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    } else {
      std::vector<Dim> dims;
      for (const SymInt& r : *req)
        dims.push_back(!r.value || *r.value > 0 || (*r.value == 0 && allowzero) ? r.dim() : Dim());
      ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    }
    return Status::Ok();
  }
  if (st.rank() == 1 && (*st.dims)[0].is_static()) {
    KILN_ASSIGN_OR_RETURN(auto dims,
                          unknown_dims((*st.dims)[0].value, ctx.node(), "the shape's length"));
    ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  } else {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
  }
  return Status::Ok();
}

Status reshape_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  const Tensor* s = ctx.input(1);
  if (!x || !s) return KILN_ERROR("{}: Reshape needs data and shape inputs", ctx.node().label());
  if (s->rank() != 1) return KILN_ERROR("{}: shape must be 1-D, got {}", ctx.node().label(), s->desc());
  KILN_ASSIGN_OR_RETURN(auto values, int_values(*s, ctx.node(), "shape"));
  std::vector<SymInt> req;
  for (int64_t v : values) req.push_back(SymInt::known(v));
  KILN_ASSIGN_OR_RETURN(auto dims, reshape_dims(to_dims(x->shape()), req,
                                                ctx.attrs().get_int("allowzero", 0) != 0,
                                                ctx.node()));
  std::vector<int64_t> shape;
  for (const Dim& d : dims) shape.push_back(d.value);
  KILN_ASSIGN_OR_RETURN(Tensor y, x->reshaped(shape));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Shape, Size
std::pair<int64_t, int64_t> shape_range(const Attributes& a, int64_t rank) {
  auto clamp = [&](int64_t v) {
    if (v < 0) v += rank;
    return std::clamp<int64_t>(v, 0, rank);
  };
  const int64_t start = clamp(a.get_int("start", 0));
  const int64_t end = a.has("end") ? clamp(a.get_int("end", rank)) : rank;
  return {start, std::max(start, end)};
}

Status shape_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType(DataType::kInt64, {Dim()}));
    return Status::Ok();
  }
  auto [start, end] = shape_range(ctx.attrs(), x.rank());
  ctx.set_output(0, TensorType(DataType::kInt64, {Dim(end - start)}));
  return Status::Ok();
}

Status shape_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  auto [start, end] = shape_range(ctx.attrs(), x->rank());
  std::vector<int64_t> v(x->shape().begin() + start, x->shape().begin() + end);
  ctx.set_output(0, Tensor::from<int64_t>({end - start}, v));
  return Status::Ok();
}

Status size_infer(InferContext& ctx) {
  ctx.set_output(0, TensorType(DataType::kInt64, {}));
  return Status::Ok();
}

Status size_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  ctx.set_output(0, Tensor::scalar<int64_t>(x->numel()));
  return Status::Ok();
}

// ---------------------------------------------------------------- Flatten
Expected<int64_t> flatten_axis(const Node& n, int64_t rank) {
  int64_t axis = n.attrs.get_int("axis", 1);
  if (axis < -rank || axis > rank)
    return KILN_ERROR("{}: axis {} is out of range for rank {}", n.label(), axis, rank);
  return axis < 0 ? axis + rank : axis;
}

Status flatten_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType(x.dtype, {Dim(), Dim()}));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, flatten_axis(ctx.node(), x.rank()));
  std::span<const Dim> d(*x.dims);
  ctx.set_output(0, TensorType(x.dtype, {dim_product(d.subspan(0, axis)), dim_product(d.subspan(axis))}));
  return Status::Ok();
}

Status flatten_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, flatten_axis(ctx.node(), x->rank()));
  std::span<const int64_t> s(x->shape());
  KILN_ASSIGN_OR_RETURN(Tensor y, x->reshaped({product(s.subspan(0, axis)), product(s.subspan(axis))}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Squeeze, Unsqueeze
Status axes_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 13) ctx.attr_to_input("axes", 1);
  return Status::Ok();
}

// Normalised, sorted, duplicate-free axes for `rank`.
Expected<std::vector<int64_t>> norm_axes(std::vector<int64_t> axes, int64_t rank, const Node& n) {
  for (int64_t& a : axes) {
    KILN_ASSIGN_OR_RETURN(a, normalize_axis(a, rank, n));
  }
  std::sort(axes.begin(), axes.end());
  if (std::adjacent_find(axes.begin(), axes.end()) != axes.end())
    return KILN_ERROR("{}: repeated axis in axes", n.label());
  return axes;
}

// Squeezed dims; `axes` nullopt means all (static) 1-dims. Unknown dims listed in axes are
// taken to be 1; with no axes, an unknown dim makes the result unknown (nullopt).
Expected<std::optional<std::vector<Dim>>> squeeze_dims(const std::vector<Dim>& in,
                                                       const std::optional<std::vector<int64_t>>& axes,
                                                       const Node& n) {
  std::vector<Dim> out;
  if (!axes) {
    for (const Dim& d : in) {
      if (!d.is_static()) return std::optional<std::vector<Dim>>();
      if (d.value != 1) out.push_back(d);
    }
    return std::optional<std::vector<Dim>>(out);
  }
  KILN_ASSIGN_OR_RETURN(auto ax, norm_axes(*axes, static_cast<int64_t>(in.size()), n));
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::binary_search(ax.begin(), ax.end(), static_cast<int64_t>(i))) {
      if (in[i].is_static() && in[i].value != 1)
        return KILN_ERROR("{}: cannot squeeze axis {} of size {}", n.label(), i, in[i].value);
      continue;
    }
    out.push_back(in[i]);
  }
  return std::optional<std::vector<Dim>>(out);
}

Status squeeze_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  std::optional<std::vector<int64_t>> axes;
  if (ctx.has_input(1)) {
    const Tensor* a = ctx.input_const(1);
    if (!a || !x.has_rank()) {
      const TensorType& at = ctx.input_type(1);
      if (x.has_rank() && at.rank() == 1 && (*at.dims)[0].is_static()) {
        KILN_ASSIGN_OR_RETURN(auto dims, unknown_dims(x.rank() - (*at.dims)[0].value, ctx.node(),
                                                      "squeezing as many axes as axes holds"));
        ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
      } else {
        ctx.set_output(0, TensorType::unknown_rank(x.dtype));
      }
      return Status::Ok();
    }
    KILN_ASSIGN_OR_RETURN(axes, int_values(*a, ctx.node(), "axes"));
  }
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto dims, squeeze_dims(*x.dims, axes, ctx.node()));
  ctx.set_output(0, dims ? TensorType(x.dtype, *dims) : TensorType::unknown_rank(x.dtype));
  return Status::Ok();
}

Status squeeze_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  std::optional<std::vector<int64_t>> axes;
  if (ctx.input(1)) {
    KILN_ASSIGN_OR_RETURN(axes, int_values(*ctx.input(1), ctx.node(), "axes"));
  }
  KILN_ASSIGN_OR_RETURN(auto dims, squeeze_dims(to_dims(x->shape()), axes, ctx.node()));
  if (!dims) return KILN_ERROR("{}: cannot squeeze {}", ctx.node().label(), x->desc());
  std::vector<int64_t> shape;
  for (const Dim& d : *dims) shape.push_back(d.value);
  KILN_ASSIGN_OR_RETURN(Tensor y, x->reshaped(shape));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Expected<std::vector<Dim>> unsqueeze_dims(const std::vector<Dim>& in, const std::vector<int64_t>& axes,
                                          const Node& n) {
  const int64_t rank = static_cast<int64_t>(in.size() + axes.size());
  KILN_ASSIGN_OR_RETURN(auto ax, norm_axes(axes, rank, n));
  std::vector<Dim> out;
  size_t k = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (std::binary_search(ax.begin(), ax.end(), i)) out.push_back(Dim(1));
    else out.push_back(in[k++]);
  }
  return out;
}

Status unsqueeze_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!ctx.has_input(1))
    return KILN_ERROR("{}: Unsqueeze needs the axes input", ctx.node().label());
  const Tensor* a = ctx.input_const(1);
  if (!a || !x.has_rank()) {
    const TensorType& at = ctx.input_type(1);
    if (x.has_rank() && at.rank() == 1 && (*at.dims)[0].is_static()) {
      KILN_ASSIGN_OR_RETURN(auto dims, unknown_dims(x.rank() + (*at.dims)[0].value, ctx.node(),
                                                    "inserting as many axes as axes holds"));
      ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
    } else {
      ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    }
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto axes, int_values(*a, ctx.node(), "axes"));
  KILN_ASSIGN_OR_RETURN(auto dims, unsqueeze_dims(*x.dims, axes, ctx.node()));
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status unsqueeze_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x || !ctx.input(1)) return KILN_ERROR("{}: Unsqueeze needs data and axes", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(auto axes, int_values(*ctx.input(1), ctx.node(), "axes"));
  KILN_ASSIGN_OR_RETURN(auto dims, unsqueeze_dims(to_dims(x->shape()), axes, ctx.node()));
  std::vector<int64_t> shape;
  for (const Dim& d : dims) shape.push_back(d.value);
  KILN_ASSIGN_OR_RETURN(Tensor y, x->reshaped(shape));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Transpose
Expected<std::vector<int64_t>> transpose_perm(const Node& n, int64_t rank) {
  std::vector<int64_t> perm = n.attrs.get_ints("perm");
  if (!n.attrs.has("perm")) {
    perm.resize(rank);
    std::iota(perm.rbegin(), perm.rend(), 0);
    return perm;
  }
  if (static_cast<int64_t>(perm.size()) != rank)
    return KILN_ERROR("{}: perm has {} entries for rank {}", n.label(), perm.size(), rank);
  std::vector<bool> seen(rank, false);
  for (int64_t& p : perm) {
    KILN_ASSIGN_OR_RETURN(p, normalize_axis(p, rank, n));
    if (seen[p]) return KILN_ERROR("{}: perm is not a permutation", n.label());
    seen[p] = true;
  }
  return perm;
}

Status transpose_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    const auto perm = ctx.attrs().get_ints("perm");
    ctx.set_output(0, ctx.attrs().has("perm") ? TensorType(x.dtype, std::vector<Dim>(perm.size()))
                                              : TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto perm, transpose_perm(ctx.node(), x.rank()));
  std::vector<Dim> dims;
  for (int64_t p : perm) dims.push_back((*x.dims)[p]);
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status transpose_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(auto perm, transpose_perm(ctx.node(), x->rank()));
  const auto in_strides = contiguous_strides(x->shape());
  std::vector<int64_t> shape, strides;
  for (int64_t p : perm) {
    shape.push_back(x->shape()[p]);
    strides.push_back(in_strides[p]);
  }
  Tensor y(x->dtype(), shape);
  strided_copy(x->raw(), 0, strides, y.raw(), shape, dtype_size(x->dtype()));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Identity, Dropout
Status identity_cpu(KernelContext& ctx) {
  if (!ctx.input(0)) return KILN_ERROR("{}: missing input", ctx.node().label());
  ctx.set_output(0, *ctx.input(0));
  return Status::Ok();
}

// Canonical Dropout: inputs (data, ratio?, training_mode?), outputs (output, mask?). Before
// opset 12 ratio was an attribute; before opset 7 `is_test` (default 0 = training) selected
// the mode; before opset 10 the mask had the data's type (kept via kiln_mask_same_type).
Status dropout_upgrade(ImportContext& ctx) {
  Node& n = ctx.node();
  if (ctx.opset() < 12) {
    ctx.float_attr_to_input("ratio", 1, DataType::kFloat32, 0.5f, false);
  }
  if (ctx.opset() < 7) {
    const bool training = n.attrs.get_int("is_test", 0) == 0;
    n.attrs.erase("is_test");
    n.attrs.erase("consumed_inputs");
    if (training) ctx.graph().set_input(&n, 2, ctx.add_constant("training_mode", Tensor::scalar<bool>(true)));
  }
  if (ctx.opset() < 10) n.attrs.set("kiln_mask_same_type", Attribute::Int(1));
  return Status::Ok();
}

Status dropout_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  ctx.set_output(0, x);
  TensorType mask = x;
  if (ctx.attrs().get_int("kiln_mask_same_type", 0) == 0) mask.dtype = DataType::kBool;
  ctx.set_output(1, mask);
  return Status::Ok();
}

Status dropout_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  const Tensor* training = ctx.input(2);
  if (training && training->numel() != 1)
    return KILN_ERROR("{}: training_mode must be a scalar", ctx.node().label());
  if (training && training->at_double(0) != 0.0) {
    double ratio = 0.5;
    if (const Tensor* r = ctx.input(1)) {
      if (r->numel() != 1) return KILN_ERROR("{}: ratio must be a scalar", ctx.node().label());
      ratio = r->at_double(0);
    }
    if (ratio != 0.0)
      return KILN_ERROR("{}: Dropout in training mode (ratio {}) is random and not supported; "
                        "export the model for inference (training_mode = false)",
                        ctx.node().label(), ratio);
  }
  ctx.set_output(0, *x);
  if (ctx.num_outputs() > 1) {
    const bool same = ctx.attrs().get_int("kiln_mask_same_type", 0) != 0;
    Tensor mask(same ? x->dtype() : DataType::kBool, x->shape());
    visit_dtype(mask.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T one = convert<T>(1.0);
      for (int64_t i = 0; i < mask.numel(); ++i) mask.data<T>()[i] = one;
      return 0;
    });
    ctx.set_output(1, std::move(mask));
  }
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Reshape", reshape_infer, reshape_cpu, reshape_upgrade},
    {"", "Shape", shape_infer, shape_cpu, nullptr},
    {"", "Size", size_infer, size_cpu, nullptr},
    {"", "Flatten", flatten_infer, flatten_cpu, nullptr},
    {"", "Squeeze", squeeze_infer, squeeze_cpu, axes_upgrade},
    {"", "Unsqueeze", unsqueeze_infer, unsqueeze_cpu, axes_upgrade},
    {"", "Transpose", transpose_infer, transpose_cpu, nullptr},
    {"", "Identity", [](InferContext& c) { return infer_same_as_input(c); }, identity_cpu, nullptr},
    {"", "Dropout", dropout_infer, dropout_cpu, dropout_upgrade},
};

}  // namespace

std::span<const OpDef> reshape_like_ops() { return kOps; }

}  // namespace kiln::shape_detail
