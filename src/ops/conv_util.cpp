#include "ops/conv_util.h"

#include <algorithm>

namespace kiln {
namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

Status read_list(const Node& n, const char* name, size_t len, int64_t def, int64_t min,
                 std::vector<int64_t>& out) {
  if (!n.attrs.has(name)) {
    out.assign(len, def);
    return Status::Ok();
  }
  out = n.attrs.get_ints(name);
  if (out.size() != len)
    return KILN_ERROR("{}: attribute {} has {} values, expected {}", n.label(), name, out.size(),
                      len);
  for (int64_t v : out)
    if (v < min)
      return KILN_ERROR("{}: attribute {} has value {} (must be >= {})", n.label(), name, v, min);
  return Status::Ok();
}

}  // namespace

int64_t shape_product(const std::vector<int64_t>& s) {
  int64_t p = 1;
  for (int64_t d : s) p *= d;
  return p;
}

Status check_workspace(const Node& n, int64_t elements) {
  if (elements < 0 || elements > (int64_t{1} << 30))
    return KILN_ERROR("{}: the reference kernel would need a {}-element scratch buffer", n.label(),
                      elements);
  return Status::Ok();
}

Expected<WindowAttrs> read_window_attrs(const Node& n, size_t nsp, std::vector<int64_t> kernel) {
  WindowAttrs a;
  if (n.attrs.has("kernel_shape")) {
    KILN_RETURN_IF_ERROR(read_list(n, "kernel_shape", nsp, 1, 1, a.kernel));
    if (!kernel.empty() && kernel != a.kernel) {
      for (size_t i = 0; i < nsp; ++i)
        if (kernel[i] >= 0 && kernel[i] != a.kernel[i])
          return KILN_ERROR("{}: kernel_shape {} does not match the weight shape {}", n.label(),
                            shape_str(a.kernel), shape_str(kernel));
    }
  } else if (kernel.size() == nsp) {
    a.kernel = std::move(kernel);
  } else {
    a.kernel.assign(nsp, -1);
  }
  KILN_RETURN_IF_ERROR(read_list(n, "strides", nsp, 1, 1, a.strides));
  KILN_RETURN_IF_ERROR(read_list(n, "dilations", nsp, 1, 1, a.dilations));
  KILN_RETURN_IF_ERROR(read_list(n, "pads", 2 * nsp, 0, 0, a.pads));
  const std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
  if (ap == "NOTSET" || ap.empty()) a.auto_pad = AutoPad::kNotSet;
  else if (ap == "SAME_UPPER") a.auto_pad = AutoPad::kSameUpper;
  else if (ap == "SAME_LOWER") a.auto_pad = AutoPad::kSameLower;
  else if (ap == "VALID") a.auto_pad = AutoPad::kValid;
  else return KILN_ERROR("{}: unknown auto_pad '{}'", n.label(), ap);
  a.ceil_mode = n.attrs.get_int("ceil_mode", 0) != 0;
  return a;
}

Expected<AxisGeometry> resolve_window_axis(const WindowAttrs& a, size_t axis, int64_t in,
                                           bool pooling, const Node& n) {
  const size_t nsp = a.kernel.size();
  const int64_t s = a.strides[axis];
  const int64_t dk = (a.kernel[axis] - 1) * a.dilations[axis] + 1;
  AxisGeometry g;
  switch (a.auto_pad) {
    case AutoPad::kSameUpper:
    case AutoPad::kSameLower: {
      g.out = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (g.out - 1) * s + dk - in);
      const int64_t small = total / 2;
      g.pad_begin = a.auto_pad == AutoPad::kSameUpper ? small : total - small;
      g.pad_end = total - g.pad_begin;
      return g;
    }
    case AutoPad::kValid:
      g.pad_begin = g.pad_end = 0;
      break;
    case AutoPad::kNotSet:
      g.pad_begin = a.pads[axis];
      g.pad_end = a.pads[axis + nsp];
      break;
  }
  const int64_t span = in + g.pad_begin + g.pad_end - dk;
  if (span < 0)
    return KILN_ERROR("{}: the kernel (extent {}) is larger than the padded input ({}) on spatial "
                      "axis {}",
                      n.label(), dk, in + g.pad_begin + g.pad_end, axis);
  if (pooling && a.ceil_mode && a.auto_pad == AutoPad::kNotSet) {
    g.out = (span + s - 1) / s + 1;
    // The last window must start inside the input or the left padding.
    if ((g.out - 1) * s >= in + g.pad_begin) --g.out;
  } else {
    g.out = span / s + 1;
  }
  return g;
}

Expected<AxisGeometry> resolve_transpose_axis(const WindowAttrs& a, size_t axis, int64_t in,
                                              int64_t output_padding, int64_t output_size,
                                              const Node& n) {
  const size_t nsp = a.kernel.size();
  const int64_t s = a.strides[axis];
  const int64_t dk = (a.kernel[axis] - 1) * a.dilations[axis] + 1;
  const int64_t full = s * (in - 1) + output_padding + dk;
  AxisGeometry g;
  if (output_size <= 0 && (a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower))
    output_size = in * s;
  if (output_size > 0) {
    const int64_t total = full - output_size;
    if (a.auto_pad == AutoPad::kSameUpper) {
      g.pad_begin = floor_div(total, 2);
      g.pad_end = total - g.pad_begin;
    } else {
      g.pad_end = floor_div(total, 2);
      g.pad_begin = total - g.pad_end;
    }
    g.out = output_size;
    return g;
  }
  if (a.auto_pad == AutoPad::kNotSet) {
    g.pad_begin = a.pads[axis];
    g.pad_end = a.pads[axis + nsp];
  }
  g.out = full - g.pad_begin - g.pad_end;
  if (g.out < 0)
    return KILN_ERROR("{}: pads {} leave a negative output size on spatial axis {}", n.label(),
                      shape_str(a.pads), axis);
  return g;
}

// --- Conv family (Conv / ConvTranspose) ----------------------------------------------------

Expected<ConvParams> read_conv_params_prologue(const Node& n, const std::vector<int64_t>& x,
                                               const std::vector<int64_t>& w) {
  if (x.size() < 3)
    return KILN_ERROR("{}: X must have rank >= 3 (N, C, spatial...), got {}", n.label(),
                      shape_str(x));
  if (w.size() != x.size())
    return KILN_ERROR("{}: W {} must have the rank of X {}", n.label(), shape_str(w), shape_str(x));
  ConvParams p;
  p.N = x[0];
  p.C = x[1];
  p.group = n.attrs.get_int("group", 1);
  return p;
}

Expected<WindowAttrs> read_conv_window(const Node& n, const std::vector<int64_t>& x,
                                       const std::vector<int64_t>& w, ConvParams& p) {
  const size_t nsp = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(WindowAttrs a,
                        read_window_attrs(n, nsp, std::vector<int64_t>(w.begin() + 2, w.end())));
  p.in.assign(x.begin() + 2, x.end());
  p.kernel = a.kernel;
  p.strides = a.strides;
  p.dilations = a.dilations;
  return a;
}

Expected<ConvInferDims> read_conv_infer_dims(InferContext& ctx, size_t xi, size_t wi) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(xi);
  const TensorType& w = ctx.input_type(wi);
  ConvInferDims d;
  if (!x.has_rank() && !w.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return d;
  }
  const int64_t rank = x.has_rank() ? x.rank() : w.rank();
  if (rank < 3)
    return KILN_ERROR("{}: X must have rank >= 3 (N, C, spatial...), got rank {}", n.label(), rank);
  if (w.has_rank() && w.rank() != rank)
    return KILN_ERROR("{}: W has rank {}, X has rank {}", n.label(), w.rank(), rank);
  d.ranked = true;
  d.nsp = static_cast<size_t>(rank - 2);
  d.x = x.has_rank() ? *x.dims : std::vector<Dim>(rank, Dim());
  d.w = w.has_rank() ? *w.dims : std::vector<Dim>(rank, Dim());
  d.group = n.attrs.get_int("group", 1);
  if (d.group < 1) return KILN_ERROR("{}: group must be >= 1, got {}", n.label(), d.group);
  return d;
}

Expected<WindowAttrs> read_conv_infer_window(const Node& n, const ConvInferDims& d) {
  std::vector<int64_t> kernel;
  for (size_t i = 0; i < d.nsp; ++i) kernel.push_back(d.w[i + 2].value);
  return read_window_attrs(n, d.nsp, kernel);
}

void set_conv_output_type(InferContext& ctx, std::vector<Dim> out) {
  const DataType xt = ctx.input_type(0).dtype;
  ctx.set_output(
      0, TensorType(xt != DataType::kUndefined ? xt : ctx.input_type(1).dtype, std::move(out)));
}

Status run_conv_forward(KernelContext& ctx, const ConvParams& p, ConvForwardFns fwd) {
  const Tensor *x = ctx.input(0), *w = ctx.input(1), *b = ctx.input(2);
  std::vector<int64_t> shape = {p.N, p.M};
  shape.insert(shape.end(), p.out.begin(), p.out.end());
  const DataType dt = x->dtype();
  if (dt == DataType::kFloat64) {
    Tensor y(dt, shape);
    fwd.f64(p, x->data<double>(), w->data<double>(), b ? b->data<double>() : nullptr,
            y.data<double>());
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }
  const bool f32 = dt == DataType::kFloat32;
  const Tensor xf = f32 ? *x : x->cast(DataType::kFloat32);
  const Tensor wf = f32 ? *w : w->cast(DataType::kFloat32);
  const Tensor bf = !b ? Tensor() : f32 ? *b : b->cast(DataType::kFloat32);
  Tensor y(DataType::kFloat32, shape);
  fwd.f32(p, xf.data<float>(), wf.data<float>(), b ? bf.data<float>() : nullptr, y.data<float>());
  ctx.set_output(0, f32 ? std::move(y) : y.cast(dt));
  return Status::Ok();
}

}  // namespace kiln
