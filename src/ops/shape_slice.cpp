// Slice: inputs (data, starts, ends, axes?, steps?) since opset 10; attributes before.
#include <algorithm>
#include <limits>

#include "ops/shape_util.h"

namespace kiln::shape_detail {
namespace {

Status slice_upgrade(ImportContext& ctx) {
  if (ctx.opset() < 10) {
    ctx.attr_to_input("starts", 1);
    ctx.attr_to_input("ends", 2);
    ctx.attr_to_input("axes", 3);
  }
  return Status::Ok();
}

struct SliceArgs {
  std::vector<int64_t> axes, starts, ends, steps;  // axes normalised
};

Expected<SliceArgs> slice_args(const Tensor& starts, const Tensor& ends, const Tensor* axes,
                               const Tensor* steps, int64_t rank, const Node& n) {
  SliceArgs a;
  KILN_ASSIGN_OR_RETURN(a.starts, int_values(starts, n, "starts"));
  KILN_ASSIGN_OR_RETURN(a.ends, int_values(ends, n, "ends"));
  const size_t count = a.starts.size();
  if (starts.rank() != 1 || ends.rank() != 1 || a.ends.size() != count)
    return KILN_ERROR("{}: starts {} and ends {} must be 1-D of the same length", n.label(),
                      starts.desc(), ends.desc());
  if (axes) {
    KILN_ASSIGN_OR_RETURN(a.axes, int_values(*axes, n, "axes"));
  } else {
    for (size_t i = 0; i < count; ++i) a.axes.push_back(static_cast<int64_t>(i));
  }
  if (steps) {
    KILN_ASSIGN_OR_RETURN(a.steps, int_values(*steps, n, "steps"));
  } else {
    a.steps.assign(count, 1);
  }
  if (a.axes.size() != count || a.steps.size() != count)
    return KILN_ERROR("{}: starts, ends, axes and steps must have the same length", n.label());
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < count; ++i) {
    KILN_ASSIGN_OR_RETURN(a.axes[i], normalize_axis(a.axes[i], rank, n));
    if (seen[a.axes[i]]) return KILN_ERROR("{}: axis {} repeated in axes", n.label(), a.axes[i]);
    seen[a.axes[i]] = true;
    if (a.steps[i] == 0) return KILN_ERROR("{}: slice step cannot be 0", n.label());
  }
  return a;
}

// Clamped start and element count of one axis of length `dim`, as the spec defines.
std::pair<int64_t, int64_t> clamp_slice(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (start < 0) start += dim;
  if (end < 0) end += dim;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, dim);
    end = std::clamp<int64_t>(end, 0, dim);
    const int64_t len = end > start ? (end - start - 1) / step + 1 : 0;
    return {start, len};
  }
  if (dim == 0) return {0, 0};
  start = std::clamp<int64_t>(start, 0, dim - 1);
  end = std::clamp<int64_t>(end, -1, dim - 1);
  const int64_t neg = step == std::numeric_limits<int64_t>::min() ? std::numeric_limits<int64_t>::max() : -step;
  const int64_t len = start > end ? (start - end - 1) / neg + 1 : 0;
  return {start, len};
}

// True when the slice keeps a whole axis of any length in order or reversed.
bool keeps_whole_axis(int64_t start, int64_t end, int64_t step) {
  constexpr int64_t kBig = std::numeric_limits<int32_t>::max();
  if (step == 1) return start == 0 && end >= kBig;
  if (step == -1) return start >= kBig - 1 && end <= -kBig;
  return false;
}

// Slice with constant starts, axes and steps and ends computed from shapes (x[:, :S] with S a
// symbolic size, ops/shape_values.h): the sliced dims from what is known of the ends. An end S
// taken from 0 with step 1 gives S, as it does for every slice within the axis, the only kind a
// model that runs at every profile shape takes.
std::optional<std::vector<Dim>> symbolic_slice_dims(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  const Tensor* starts = ctx.input_const(1);
  const auto ends = ctx.input_value(2);
  const Tensor* axes_t = ctx.input_const(3);
  const Tensor* steps_t = ctx.input_const(4);
  if (!starts || !ends || (ctx.has_input(3) && !axes_t) || (ctx.has_input(4) && !steps_t))
    return std::nullopt;
  const auto st = starts->to_int64_vector();
  if (st.size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes(st.size()), steps(st.size(), 1);
  for (size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<int64_t>(i);
  if (axes_t) axes = axes_t->to_int64_vector();
  if (steps_t) steps = steps_t->to_int64_vector();
  if (axes.size() != st.size() || steps.size() != st.size()) return std::nullopt;
  std::vector<Dim> dims = *x.dims;
  for (size_t i = 0; i < st.size(); ++i) {
    const int64_t ax = axes[i] < 0 ? axes[i] + x.rank() : axes[i];
    if (ax < 0 || ax >= x.rank()) return std::nullopt;
    Dim& d = dims[ax];
    const SymInt& e = (*ends)[i];
    if (e.value && d.is_static() && steps[i] != 0)
      d = Dim(clamp_slice(st[i], *e.value, steps[i], d.value).second);
    else if (!e.value && !e.symbol.empty() && st[i] == 0 && steps[i] == 1)
      d = e.dim();
    else
      d = Dim();
  }
  return dims;
}

Status slice_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  const Tensor* starts = ctx.input_const(1);
  const Tensor* ends = ctx.input_const(2);
  const Tensor* axes = ctx.input_const(3);
  const Tensor* steps = ctx.input_const(4);
  const bool all_const = starts && ends && (axes || !ctx.has_input(3)) && (steps || !ctx.has_input(4));
  if (!ctx.has_input(1) || !ctx.has_input(2))
    return KILN_ERROR("{}: Slice needs starts and ends inputs", ctx.node().label());
  std::vector<Dim> dims(x.rank());
  if (!all_const) {
    ctx.set_output(0, TensorType(x.dtype, symbolic_slice_dims(ctx).value_or(dims)));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto a, slice_args(*starts, *ends, axes, steps, x.rank(), ctx.node()));
  dims = *x.dims;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    Dim& d = dims[a.axes[i]];
    if (d.is_static()) d = Dim(clamp_slice(a.starts[i], a.ends[i], a.steps[i], d.value).second);
    else if (!keeps_whole_axis(a.starts[i], a.ends[i], a.steps[i])) d = Dim();
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(dims)));
  return Status::Ok();
}

Status slice_cpu(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: Slice needs data, starts and ends", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(auto a, slice_args(*ctx.input(1), *ctx.input(2), ctx.input(3),
                                           ctx.input(4), x->rank(), ctx.node()));
  std::vector<int64_t> shape = x->shape();
  std::vector<int64_t> strides = contiguous_strides(shape);
  int64_t offset = 0;
  for (size_t i = 0; i < a.axes.size(); ++i) {
    const int64_t ax = a.axes[i];
    auto [start, len] = clamp_slice(a.starts[i], a.ends[i], a.steps[i], shape[ax]);
    shape[ax] = len;
    if (len > 0) offset += start * strides[ax];
    strides[ax] = len > 1 ? strides[ax] * a.steps[i] : 0;  // huge steps never overflow
  }
  Tensor y(x->dtype(), shape);
  strided_copy(x->raw(), offset, strides, y.raw(), shape, dtype_size(x->dtype()));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Slice", slice_infer, slice_cpu, slice_upgrade},
};

}  // namespace

std::span<const OpDef> slice_ops() { return kOps; }

}  // namespace kiln::shape_detail
