// Pad (canonical form: opset 21 — inputs data, pads, constant_value?, axes?; modes constant,
// reflect, edge, wrap), DepthToSpace and SpaceToDepth. These are data movement ops: kernels copy
// whole elements, so every dtype works. The table is listed by resize_ops() (src/ops/resize.cpp).
#include <algorithm>
#include <cstring>

#include "core/dispatch.h"
#include "ops/op.h"
#include "ops/shape_util.h"

namespace kiln {

namespace shape_detail {
Expected<std::vector<int64_t>> full_pads(const Node& n, int64_t rank, const std::vector<int64_t>& pads,
                                         const Tensor* axes_t) {
  std::vector<int64_t> axes;
  if (axes_t) {
    for (int64_t a : axes_t->to_int64_vector()) {
      KILN_ASSIGN_OR_RETURN(int64_t na, normalize_axis(a, rank, n));
      axes.push_back(na);
    }
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (pads.size() != 2 * axes.size())
    return KILN_ERROR("{}: pads has {} values, expected {} (2 x {} axes)", n.label(), pads.size(),
                      2 * axes.size(), axes.size());
  std::vector<int64_t> out(2 * rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    out[axes[i]] = pads[i];
    out[rank + axes[i]] = pads[axes.size() + i];
  }
  return out;
}
}  // namespace shape_detail

namespace {
using shape_detail::full_pads;

// --- Pad ----------------------------------------------------------------------------------------
// Before opset 11 pads (opset 1: "paddings") and value were attributes.
Status upgrade_pad(ImportContext& ctx) {
  Node& n = ctx.node();
  if (ctx.opset() >= 11) return Status::Ok();
  if (const Attribute* a = n.attrs.find("paddings"); a && !n.attrs.has("pads")) {
    n.attrs.set("pads", *a);
    n.attrs.erase("paddings");
  }
  if (!n.attrs.has("pads")) return KILN_ERROR("{}: missing attribute 'pads'", n.label());
  ctx.attr_to_input("pads", 1);
  const Value* x = n.input(0);
  const DataType t =
      x && x->type.dtype != DataType::kUndefined ? x->type.dtype : DataType::kFloat32;
  ctx.float_attr_to_input("value", 2, t, 0.f, false);
  return Status::Ok();
}

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

Expected<PadMode> pad_mode(const Node& n) {
  const std::string m = n.attrs.get_string("mode", "constant");
  if (m == "constant") return PadMode::kConstant;
  if (m == "reflect") return PadMode::kReflect;
  if (m == "edge") return PadMode::kEdge;
  if (m == "wrap") return PadMode::kWrap;
  return KILN_ERROR("{}: unknown pad mode '{}'", n.label(), m);
}

Status infer_pad(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(pad_mode(n).status());
  if (!ctx.has_input(1)) return KILN_ERROR("{}: input 'pads' is required", n.label());
  if (!x.has_rank()) return infer_same_as_input(ctx);
  const Tensor* pads = ctx.input_const(1);
  const bool axes_known = !ctx.has_input(3) || ctx.input_const(3);
  if (!pads || !axes_known) {
    ctx.set_output(0, TensorType(x.dtype, std::vector<Dim>(x.rank())));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto p, full_pads(n, x.rank(), pads->to_int64_vector(),
                                          ctx.has_input(3) ? ctx.input_const(3) : nullptr));
  std::vector<Dim> d = *x.dims;
  for (int64_t v : p)
    if (v > (int64_t{1} << 40) || v < -(int64_t{1} << 40))
      return KILN_ERROR("{}: pad value {} is out of range", n.label(), v);
  for (int64_t i = 0; i < x.rank(); ++i) {
    const int64_t extra = p[i] + p[x.rank() + i];
    if (d[i].is_static()) {
      if (d[i].value + extra < 0)
        return KILN_ERROR("{}: pads {} and {} make dimension {} (size {}) negative", n.label(),
                          p[i], p[x.rank() + i], i, d[i].value);
      d[i] = Dim(d[i].value + extra);
    } else if (extra != 0) {
      d[i] = Dim();
    }
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(d)));
  return Status::Ok();
}

// Maps output coordinate `o` on an axis of input size `n` (begin pad `pb`) to an input
// coordinate, or -1 for the constant value.
int64_t pad_source(PadMode mode, int64_t o, int64_t pb, int64_t n) {
  int64_t j = o - pb;
  if (j >= 0 && j < n) return j;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return j < 0 ? 0 : n - 1;
    case PadMode::kWrap:
      return ((j % n) + n) % n;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      j = ((j % period) + period) % period;
      return j < n ? j : period - j;
    }
  }
  return -1;
}

Status cpu_pad(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* pads_t = ctx.input(1);
  if (!x || !pads_t) return KILN_ERROR("{}: inputs data and pads are required", n.label());
  if (!dtype_is_integer(pads_t->dtype()))
    return KILN_ERROR("{}: pads must be int64, got {}", n.label(), dtype_name(pads_t->dtype()));
  KILN_ASSIGN_OR_RETURN(PadMode mode, pad_mode(n));
  const int64_t rank = x->rank();
  KILN_ASSIGN_OR_RETURN(auto p, full_pads(n, rank, pads_t->to_int64_vector(), ctx.input(3)));
  std::vector<int64_t> out_shape(rank);
  double numel = 1;
  for (int64_t i = 0; i < rank; ++i) {
    const double len = double(x->dim(i)) + double(p[i]) + double(p[rank + i]);
    numel *= std::max(len, 0.0);
    if (numel > double(int64_t{1} << 32))
      return KILN_ERROR("{}: pads {} make the output too large", n.label(), shape_str(p));
    out_shape[i] = x->dim(i) + p[i] + p[rank + i];
    if (out_shape[i] < 0)
      return KILN_ERROR("{}: pads {} and {} make dimension {} of {} negative", n.label(), p[i],
                        p[rank + i], i, x->desc());
    if (mode != PadMode::kConstant && x->dim(i) == 0 && out_shape[i] > 0)
      return KILN_ERROR("{}: cannot pad an empty dimension {} in mode '{}'", n.label(), i,
                        n.attrs.get_string("mode", "constant"));
  }
  Tensor y(x->dtype(), out_shape);
  const size_t es = dtype_size(x->dtype());
  // The constant, converted to the data type once (absent or empty input: zero).
  Tensor value(x->dtype(), {});
  if (const Tensor* v = ctx.input(2); v && v->numel() > 0) {
    if (v->numel() != 1)
      return KILN_ERROR("{}: constant_value must be a scalar, got {}", n.label(), v->desc());
    value = v->dtype() == x->dtype() ? v->reshaped({}).value() : v->cast(x->dtype());
  }
  if (y.numel() == 0) {
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }
  const auto in_str = contiguous_strides(x->shape());
  const auto* src = static_cast<const char*>(x->raw());
  auto* dst = static_cast<char*>(y.raw());
  const auto* val = static_cast<const char*>(value.raw());
  std::vector<int64_t> idx(rank, 0);
  for (int64_t e = 0; e < y.numel(); ++e) {
    int64_t off = 0;
    bool constant = false;
    for (int64_t k = 0; k < rank && !constant; ++k) {
      const int64_t j = pad_source(mode, idx[k], p[k], x->dim(k));
      if (j < 0) constant = true;
      off += j * in_str[k];
    }
    std::memcpy(dst + e * es, constant ? val : src + off * es, es);
    for (int64_t k = rank - 1; k >= 0; --k) {
      if (++idx[k] < out_shape[k]) break;
      idx[k] = 0;
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- DepthToSpace / SpaceToDepth -----------------------------------------------------------------
Expected<int64_t> blocksize(const Node& n) {
  const int64_t b = n.attrs.get_int("blocksize", 0);
  if (b <= 0 || b > (int64_t{1} << 20))
    return KILN_ERROR("{}: blocksize must be in [1, 2^20], got {}", n.label(), b);
  return b;
}

Dim scale_dim(const Dim& d, int64_t mul, int64_t div) {
  int64_t scaled = 0;
  if (!d.is_static() || __builtin_mul_overflow(d.value, mul, &scaled)) return Dim();
  return Dim(scaled / div);
}

template <bool kToSpace>
Status infer_space(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(n));
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) return infer_same_as_input(ctx);
  if (x.rank() != 4)
    return KILN_ERROR("{}: input must have rank 4 (N,C,H,W), got {}", n.label(), x.rank());
  // SpaceToDepth has a mode since opset 28; before that it is always DCR (the default).
  const std::string mode = n.attrs.get_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD")
    return KILN_ERROR("{}: mode must be DCR or CRD, got '{}'", n.label(), mode);
  std::vector<Dim> d = *x.dims;
  if (kToSpace && d[1].is_static() && d[1].value % (b * b) != 0)
    return KILN_ERROR("{}: channels {} not divisible by blocksize^2 = {}", n.label(), d[1].value,
                      b * b);
  for (int k = 2; k < 4 && !kToSpace; ++k)
    if (d[k].is_static() && d[k].value % b != 0)
      return KILN_ERROR("{}: dimension {} ({}) not divisible by blocksize {}", n.label(), k,
                        d[k].value, b);
  d[1] = kToSpace ? scale_dim(d[1], 1, b * b) : scale_dim(d[1], b * b, 1);
  d[2] = kToSpace ? scale_dim(d[2], b, 1) : scale_dim(d[2], 1, b);
  d[3] = kToSpace ? scale_dim(d[3], b, 1) : scale_dim(d[3], 1, b);
  ctx.set_output(0, TensorType(x.dtype, std::move(d)));
  return Status::Ok();
}

// Both ops move element (n, c', h, w) of the deep tensor [N, C*b*b, H, W] to element
// (n, c, h*b+i, w*b+j) of the wide tensor [N, C, H*b, W*b]; c' depends on the mode.
template <bool kToSpace>
Status cpu_space(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(int64_t b, blocksize(n));
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->rank() != 4)
    return KILN_ERROR("{}: input must have rank 4 (N,C,H,W), got {}", n.label(), x->desc());
  const std::string mode = n.attrs.get_string("mode", "DCR");
  if (mode != "DCR" && mode != "CRD")
    return KILN_ERROR("{}: mode must be DCR or CRD, got '{}'", n.label(), mode);
  const bool crd = mode == "CRD";
  int64_t N = x->dim(0), C, H, W;  // C, H, W of the wide tensor
  if (kToSpace) {
    if (x->dim(1) % (b * b) != 0)
      return KILN_ERROR("{}: channels of {} not divisible by blocksize^2 = {}", n.label(),
                        x->desc(), b * b);
    C = x->dim(1) / (b * b), H = x->dim(2) * b, W = x->dim(3) * b;
  } else {
    if (x->dim(2) % b != 0 || x->dim(3) % b != 0)
      return KILN_ERROR("{}: spatial dims of {} not divisible by blocksize {}", n.label(),
                        x->desc(), b);
    C = x->dim(1), H = x->dim(2), W = x->dim(3);
  }
  const int64_t h0 = H / b, w0 = W / b, Cd = C * b * b;
  Tensor y(x->dtype(),
           kToSpace ? std::vector<int64_t>{N, C, H, W} : std::vector<int64_t>{N, Cd, h0, w0});
  const size_t es = dtype_size(x->dtype());
  const auto* src = static_cast<const char*>(x->raw());
  auto* dst = y.numel() ? static_cast<char*>(y.raw()) : nullptr;
  for (int64_t bn = 0; bn < N; ++bn)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t w = 0; w < W; ++w) {
          const int64_t i = h % b, j = w % b;
          const int64_t cd = crd ? (c * b + i) * b + j : (i * b + j) * C + c;
          const int64_t deep = ((bn * Cd + cd) * h0 + h / b) * w0 + w / b;
          const int64_t wide = ((bn * C + c) * H + h) * W + w;
          if (kToSpace)
            std::memcpy(dst + wide * es, src + deep * es, es);
          else
            std::memcpy(dst + deep * es, src + wide * es, es);
        }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

constexpr OpDef kPadOps[] = {
    {"", "Pad", infer_pad, cpu_pad, upgrade_pad},
    {"", "DepthToSpace", infer_space<true>, cpu_space<true>, nullptr},
    {"", "SpaceToDepth", infer_space<false>, cpu_space<false>, nullptr},
};

}  // namespace

// Listed in resize_ops() together with Resize and Upsample.
std::span<const OpDef> pad_family_ops() { return kPadOps; }

}  // namespace kiln
