// The CPU reference of an INT8 layer (kiln.FusedConv / kiln.FusedConvPool / kiln.FusedConvPair /
// kiln.FusedGemm with int8 = 1): the arithmetic a GPU INT8 kernel performs, step by step
// (docs/quantization.md):
//
//   xq  = sat(rne(x / sx))                 int8, sx = X's per-tensor scale
//   wq  = sat(rne(w / sw[c]))              int8, per output channel c
//   acc = sum xq * wq                      int32 (exact: computed as integers in float64)
//   y   = float(acc) * (sx * sw[c])        float32, one rounding for the product sx * sw[c]
//   y   = alpha * y + beta * C | y + b[c]  Gemm's C / the conv or MatMul bias, in float32
//   y  += dq(q(z, sz)) | z                 residual, quantized on read when Z has a scale
//   y   = y1 + y2                          FusedConvPair instead of the residual: both
//                                          convolutions computed as above (each with its own
//                                          X, W, scales and bias), added in float32; the sum is
//                                          never quantized
//   y   = act(y)                           float32
//   y   = MaxPool(y)                       FusedConvPool (its "pool_" attributes)
//   out = sat(rne(y / sy)) * sy            only when Y has a scale (stored int8), else y
#include <cmath>

#include "ops/fused_util.h"
#include "quant/int8.h"

namespace kiln {
namespace {

Tensor as_f32(const Tensor& t) {
  return t.dtype() == DataType::kFloat32 ? t : t.cast(DataType::kFloat32);
}

// The int8 values of x as float64 (so the reference conv/gemm kernels accumulate them exactly).
Tensor quantized_as_f64(const Tensor& x, float scale) {
  const Tensor f = as_f32(x);
  Tensor out(DataType::kFloat64, f.shape());
  for (int64_t i = 0; i < f.numel(); ++i)
    out.data<double>()[i] = quant::quantize_value(f.data<float>()[i], scale);
  return out;
}

// x quantized and dequantized with one scale (what a tensor stored in int8 holds), as float32.
Tensor fake_quant(const Tensor& x, float scale) {
  Tensor f = as_f32(x).clone();
  for (int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] =
        static_cast<float>(quant::quantize_value(f.data<float>()[i], scale)) * scale;
  return f;
}

// Runs the layer's convolution (with `conv_attrs`) or matrix product on int8 values: the exact
// int32 accumulator.
Expected<Tensor> accumulate(const Node& n, const Attributes* conv_attrs, const Tensor& xq,
                            const Tensor& wq) {
  if (conv_attrs) return fused::run_op(n, "Conv", *conv_attrs, {&xq, &wq});
  const std::string base = n.attrs.get_string("base", "");
  if (base == "MatMul") return fused::run_op(n, "MatMul", {}, {&xq, &wq});
  Attributes a;
  a.set("transB", Attribute::Int(n.attrs.get_int("transB", 0)));
  return fused::run_op(n, "Gemm", a, {&xq, &wq});
}

// One INT8 product of a layer, before its epilogue's other terms.
struct Int8Product {
  const Attributes* conv_attrs;  // a convolution's attributes; nullptr: the layer's gemm/matmul
  const Tensor* x;
  const Value* xv;  // x's value, carrying its per-tensor scale
  const Tensor* w;
  const Value* wv;          // w's value, carrying its per-channel scales
  const Tensor* conv_bias;  // a convolution's bias (per output channel) or nullptr
};

// float(acc) * (sx * sw[c]) per output channel c (conv: axis 1, gemm: the last axis), then
// + b[c] for a convolution's bias: the part of the epilogue every INT8 product shares.
Expected<Tensor> dequantized_product(const Node& n, const Int8Product& p) {
  if (!p.x || !p.w) return KILN_ERROR("{}: missing input", n.label());
  if (p.wv->quant_scales.empty())
    return KILN_ERROR("{}: weight '{}' has no INT8 scales", n.label(), p.wv->name);
  const float sx = p.xv->quant_scales[0];
  const auto& sw = p.wv->quant_scales;
  const Tensor wq8 = quant::quantize_weights(*p.w, sw, quant::weight_channel_axis(n));
  KILN_ASSIGN_OR_RETURN(Tensor acc, accumulate(n, p.conv_attrs, quantized_as_f64(*p.x, sx),
                                               wq8.cast(DataType::kFloat64)));
  const int64_t caxis = p.conv_attrs ? 1 : acc.rank() - 1;
  int64_t inner = 1;
  for (int64_t d = caxis + 1; d < acc.rank(); ++d) inner *= acc.dim(d);
  const int64_t channels = acc.dim(caxis);
  const Tensor b = p.conv_bias ? as_f32(*p.conv_bias) : Tensor();
  if (p.conv_bias && b.numel() != channels)
    return KILN_ERROR("{}: bias has {} values for {} channels", n.label(), b.numel(), channels);
  Tensor y(DataType::kFloat32, acc.shape());
  for (int64_t i = 0; i < acc.numel(); ++i) {
    const int64_t c = (i / inner) % channels;
    const float scale = sx * sw[sw.size() == 1 ? 0 : static_cast<size_t>(c)];
    y.data<float>()[i] = static_cast<float>(static_cast<int32_t>(acc.data<double>()[i])) * scale;
    if (p.conv_bias) y.data<float>()[i] += b.data<float>()[c];
  }
  return y;
}

// FusedConv / FusedGemm up to the activation: the product, then Gemm's alpha and C or MatMul's
// bias, then the residual.
Expected<Tensor> single_layer(const KernelContext& ctx) {
  const Node& n = ctx.node();
  const bool conv = n.op_type == "FusedConv" || n.op_type == "FusedConvPool";
  const bool matmul = !conv && n.attrs.get_string("base", "") == "MatMul";
  const Tensor* bias = conv || matmul ? ctx.input(2) : nullptr;
  KILN_ASSIGN_OR_RETURN(Tensor y,
                        dequantized_product(n, {conv ? &n.attrs : nullptr, ctx.input(0), n.input(0),
                                                ctx.input(1), n.input(1), conv ? bias : nullptr}));
  if (!conv) {
    const float alpha = n.attrs.get_float("alpha", 1.f), beta = n.attrs.get_float("beta", 1.f);
    if (alpha != 1.f)
      for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] *= alpha;
    Tensor c = ctx.input(2) ? as_f32(*ctx.input(2)) : Tensor();
    if (ctx.input(2) && beta != 1.f && !bias) {
      c = c.clone();
      for (int64_t i = 0; i < c.numel(); ++i) c.data<float>()[i] *= beta;
    }
    if (ctx.input(2)) {
      KILN_ASSIGN_OR_RETURN(y, fused::add_same_shape(n, y, c, bias ? "bias" : "C"));
    }
  }
  if (ctx.input(3)) {  // FusedConv's or FusedGemm's residual
    const Value* zv = n.input(3);
    const Tensor z = zv->has_quant_scale() ? fake_quant(*ctx.input(3), zv->quant_scales[0])
                                           : as_f32(*ctx.input(3));
    KILN_ASSIGN_OR_RETURN(y, fused::add_same_shape(n, y, z, "residual input"));
  }
  return y;
}

// FusedConvPair up to the activation: y1 + y2, each convolution dequantized with its own scales
// and bias, added in float32 (the sum is never quantized).
Expected<Tensor> conv_pair(const KernelContext& ctx) {
  const Node& n = ctx.node();
  const Attributes second = fused::strip_prefix(n.attrs, "conv2_");
  KILN_ASSIGN_OR_RETURN(Tensor y, dequantized_product(n, {&n.attrs, ctx.input(0), n.input(0),
                                                          ctx.input(1), n.input(1), ctx.input(2)}));
  KILN_ASSIGN_OR_RETURN(Tensor y2,
                        dequantized_product(n, {&second, ctx.input(3), n.input(3), ctx.input(4),
                                                n.input(4), ctx.input(5)}));
  KILN_RETURN_IF_ERROR(fused::check_pair_shapes(n, y, y2));
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] += y2.data<float>()[i];
  return y;
}

}  // namespace

Status cpu_int8_layer(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (std::string why = quant::int8_blocker(n); !why.empty())
    return KILN_ERROR("{}: marked INT8 but cannot run in INT8: {}", n.label(), why);
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  KILN_ASSIGN_OR_RETURN(Tensor y,
                        n.op_type == "FusedConvPair" ? conv_pair(ctx) : single_layer(ctx));
  KILN_ASSIGN_OR_RETURN(y, fused::apply_activation(n, std::move(y)));
  if (n.op_type == "FusedConvPool") {
    KILN_ASSIGN_OR_RETURN(
        y, fused::run_op(n, "MaxPool", fused::strip_prefix(n.attrs, "pool_"), {&y}));
  }
  if (const Value* yv = n.output(0); yv && yv->has_quant_scale())
    y = fake_quant(y, yv->quant_scales[0]);
  ctx.set_output(0, x->dtype() == DataType::kFloat32 ? std::move(y) : y.cast(x->dtype()));
  return Status::Ok();
}

}  // namespace kiln
