// QuantizeLinear / DequantizeLinear in their opset-21 form, and DynamicQuantizeLinear.
//
//   QuantizeLinear:   y = saturate(round_half_even(x / y_scale) + y_zero_point)
//   DequantizeLinear: y = (x - x_zero_point) * x_scale
//
// Granularity follows the scale's shape: one element = per-tensor (a 1-element 1-D scale is
// treated as per-tensor too, as ONNX's reference and ONNX Runtime do); 1-D with the length of
// x's `axis` dimension = per-axis; same rank as x with dimension `axis` = ceil(D/block_size)
// = blocked (opset 21). The zero point, when given, has the scale's shape. Older opsets (10:
// per-tensor only; 13: per-axis; 19: float16/bfloat16 scales, saturate) are subsets of this
// form, so no upgrade is needed. Targets are int4/uint4/int8/uint8/int16/uint16 and float8
// (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz); float4, float8e8m0 and 2-bit targets are refused by name.
// Integer targets always saturate (the `saturate` attribute only concerns float8). NaN quantizes to the zero point; infinities saturate.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/numeric_util.h"
#include "ops/op.h"

namespace kiln {
namespace {

bool is_quant_target(DataType t) {
  return t == DataType::kInt8 || t == DataType::kUInt8 || t == DataType::kInt16 ||
         t == DataType::kUInt16 || t == DataType::kInt4 || t == DataType::kUInt4 ||
         dtype_is_float8(t);
}

// The output type of QuantizeLinear: the zero point's type, else output_dtype, else uint8.
Expected<DataType> quantize_output_type(const Node& n, DataType zp_type, bool has_zp) {
  const int64_t od = n.attrs.get_int("output_dtype", 0);
  if (od != 0 && !dtype_code_is_valid(od)) {
    const std::string_view name = onnx_low_bit_type_name(od);
    return KILN_ERROR("{}: quantization to {} is not supported by kiln (only int4, uint4, int8, "
                      "uint8, int16, uint16 and float8)", n.label(),
                      name.empty() ? fmt::format("type {}", od) : std::string(name));
  }
  DataType out = DataType::kUInt8;
  if (od != 0) out = static_cast<DataType>(od);
  if (has_zp) {
    if (od != 0 && zp_type != DataType::kUndefined && static_cast<DataType>(od) != zp_type)
      return KILN_ERROR("{}: output_dtype {} does not match the zero point's type {}", n.label(),
                        dtype_name(static_cast<DataType>(od)), dtype_name(zp_type));
    if (zp_type != DataType::kUndefined) out = zp_type;
  }
  if (!is_quant_target(out))
    return KILN_ERROR("{}: cannot quantize to {} (type {}; expected int4, uint4, int8, uint8, "
                      "int16, uint16 or float8)",
                      n.label(), dtype_name(out), static_cast<int>(out));
  return out;
}

// Maps each element of x to its scale / zero-point element.
struct QuantLayout {
  std::vector<int64_t> stride;   // stride into the (contiguous) scale per x dimension
  std::vector<int64_t> divisor;  // x coordinate divided by this first (block size on `axis`)
  bool per_tensor = true;
};

Expected<QuantLayout> make_layout(const std::vector<int64_t>& xs, const Tensor& scale,
                                  const Tensor* zp, const Node& n) {
  // A 1-element zero point with a scalar scale (or the reverse) is per-tensor too.
  if (zp && zp->shape() != scale.shape() && !(zp->numel() == 1 && scale.numel() == 1))
    return KILN_ERROR("{}: zero point shape {} differs from scale shape {}", n.label(),
                      shape_str(zp->shape()), shape_str(scale.shape()));
  QuantLayout l;
  const size_t rank = xs.size();
  l.stride.assign(rank, 0);
  l.divisor.assign(rank, 1);
  if (scale.numel() == 1 && scale.rank() <= 1) return l;
  const int64_t block = n.attrs.get_int("block_size", 0);
  if (block < 0) return KILN_ERROR("{}: block_size must be >= 0, got {}", n.label(), block);
  KILN_ASSIGN_OR_RETURN(const int64_t axis,
                        normalize_axis(n.attrs.get_int("axis", 1), static_cast<int64_t>(rank), n));
  l.per_tensor = false;
  if (block == 0) {
    if (scale.rank() != 1 || scale.dim(0) != xs[axis])
      return KILN_ERROR(
          "{}: per-axis scale must be 1-D of length {} (dimension {} of input {}), "
          "got {}",
          n.label(), xs[axis], axis, shape_str(xs), shape_str(scale.shape()));
    l.stride[axis] = 1;
    return l;
  }
  bool ok = scale.rank() == static_cast<int64_t>(rank);
  for (size_t d = 0; ok && d < rank; ++d) {
    const int64_t want = static_cast<int64_t>(d) == axis ? (xs[d] + block - 1) / block : xs[d];
    ok = scale.dim(static_cast<int64_t>(d)) == want;
  }
  if (!ok)
    return KILN_ERROR(
        "{}: blocked scale shape {} does not fit input {} with axis {} and "
        "block_size {}",
        n.label(), shape_str(scale.shape()), shape_str(xs), axis, block);
  l.stride = contiguous_strides(scale.shape());
  l.divisor[axis] = block;
  return l;
}

// Calls f(i, p) for every element i of x (row-major) with p its scale/zero-point index.
template <typename F>
void for_each_param(const std::vector<int64_t>& xs, const QuantLayout& l, F&& f) {
  int64_t total = 1;
  for (int64_t d : xs) total *= d;
  std::vector<int64_t> idx(xs.size(), 0);
  const int64_t rank = static_cast<int64_t>(xs.size());
  for (int64_t i = 0; i < total; ++i) {
    int64_t p = 0;
    if (!l.per_tensor)
      for (int64_t d = 0; d < rank; ++d) p += idx[d] / l.divisor[d] * l.stride[d];
    f(i, p);
    for (int64_t d = rank - 1; d >= 0; --d) {
      if (++idx[d] < xs[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.at_double(i);
  return v;
}

Status check_scale(const Tensor* scale, const Node& n, const char* what) {
  if (!scale) return KILN_ERROR("{}: missing input '{}'", n.label(), what);
  if (!dtype_is_float(scale->dtype()))
    return KILN_ERROR("{}: {} must be a float tensor, got {}", n.label(), what, scale->desc());
  return Status::Ok();
}

// ---------------------------------------------------------------------------- QuantizeLinear
Status infer_quantize(InferContext& ctx) {
  const bool has_zp = ctx.has_input(2);
  KILN_ASSIGN_OR_RETURN(DataType out,
                        quantize_output_type(ctx.node(), ctx.input_type(2).dtype, has_zp));
  TensorType t = ctx.input_type(0);
  t.dtype = out;
  ctx.set_output(0, t);
  return Status::Ok();
}

// QuantizeLinear-23's `precision`: the type the division x / y_scale is rounded to; by default
// the scale's type.
Expected<DataType> division_precision(const Node& n, DataType scale_type) {
  const int64_t p = n.attrs.get_int("precision", 0);
  if (p == 0) return scale_type;
  const auto t = static_cast<DataType>(p);
  if (!dtype_code_is_valid(p) || !dtype_is_float(t))
    return KILN_ERROR("{}: precision must be a float type, got {}", n.label(), p);
  return t;
}

double round_to(DataType t, float v) {
  if (t == DataType::kFloat16) return static_cast<float>(Half(v));
  if (t == DataType::kBFloat16) return static_cast<float>(BFloat16(v));
  return v;
}

template <typename Q>
Q saturate_round(double q, int64_t zp) {
  if (std::isnan(q)) q = 0;
  const double r = std::nearbyint(q) + static_cast<double>(zp);  // default mode: half to even
  constexpr double lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  return static_cast<Q>(r < lo ? lo : (r > hi ? hi : r));
}

// One quantized low-bit element from q = x / scale: float8 adds the zero point and rounds to
// the format (saturating unless `saturate` is 0); int4/uint4 round half to even, add the zero
// point and saturate to [-8, 7] / [0, 15] (stored one per byte, int4 sign-extended).
uint8_t quantize_low_bit(DataType out, double q, double zp, bool saturate) {
  if (dtype_is_float8(out)) return float_to_float8(out, static_cast<float>(q + zp), saturate);
  if (std::isnan(q)) q = 0;
  const double lo = out == DataType::kInt4 ? -8 : 0, hi = out == DataType::kInt4 ? 7 : 15;
  const double r = std::clamp(std::nearbyint(q) + zp, lo, hi);
  return static_cast<uint8_t>(static_cast<int8_t>(r));
}

Status quantize_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* scale = ctx.input(1);
  const Tensor* zp = ctx.input(2);
  if (!x) return KILN_ERROR("{}: missing input 'x'", n.label());
  if (!dtype_is_float(x->dtype()) && x->dtype() != DataType::kInt32)
    return KILN_ERROR("{}: x must be float or int32, got {}", n.label(), x->desc());
  KILN_RETURN_IF_ERROR(check_scale(scale, n, "y_scale"));
  KILN_ASSIGN_OR_RETURN(DataType out,
                        quantize_output_type(n, zp ? zp->dtype() : DataType::kUndefined, zp));
  KILN_ASSIGN_OR_RETURN(QuantLayout layout, make_layout(x->shape(), *scale, zp, n));
  const std::vector<double> s = as_doubles(*scale);
  const std::vector<int64_t> z = zp ? zp->to_int64_vector() : std::vector<int64_t>(s.size(), 0);
  KILN_ASSIGN_OR_RETURN(DataType prec, division_precision(n, scale->dtype()));
  Tensor y(out, x->shape());
  if (dtype_is_low_bit(out)) {
    const std::vector<double> zd = zp ? as_doubles(*zp) : std::vector<double>(s.size(), 0.0);
    const bool saturate = n.attrs.get_int("saturate", 1) != 0;
    auto* yp = static_cast<uint8_t*>(y.raw());
    for_each_param(x->shape(), layout, [&](int64_t i, int64_t p) {
      const double q = round_to(prec, static_cast<float>(x->at_double(i)) /
                                          static_cast<float>(s[p]));
      yp[i] = quantize_low_bit(out, q, zd[p], saturate);
    });
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }
  visit_dtype(x->dtype(), [&](auto xtag) {
    using X = decltype(xtag);
    // Float inputs divide in float, as ONNX Runtime does, rounded to `precision` (opset 23;
    // by default the scale's type); float64 and int32 inputs in double.
    constexpr bool kDouble = std::is_same_v<X, double> || std::is_same_v<X, int32_t>;
    const X* xp = x->data<X>();
    visit_dtype(out, [&](auto qtag) {
      using Q = decltype(qtag);
      if constexpr (std::is_integral_v<Q> && !std::is_same_v<Q, bool>) {
        Q* yp = y.data<Q>();
        for_each_param(x->shape(), layout, [&](int64_t i, int64_t p) {
          const double q = kDouble ? to_double(xp[i]) / s[p]
                                   : round_to(prec, static_cast<float>(to_double(xp[i])) /
                                                        static_cast<float>(s[p]));
          yp[i] = saturate_round<Q>(q, z[p]);
        });
      }
    });
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// -------------------------------------------------------------------------- DequantizeLinear
// The output type: `output_dtype` (opset 23), else the scale's type.
Expected<DataType> dequantize_output_type(const Node& n, DataType scale_type) {
  const int64_t od = n.attrs.get_int("output_dtype", 0);
  if (od == 0) return scale_type == DataType::kUndefined ? DataType::kFloat32 : scale_type;
  const auto t = static_cast<DataType>(od);
  if (!dtype_code_is_valid(od) || !dtype_is_float(t))
    return KILN_ERROR("{}: output_dtype must be float32, float16 or bfloat16, got {}", n.label(),
                      od);
  return t;
}

Status infer_dequantize(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (x.dtype != DataType::kUndefined && !dtype_is_integer(x.dtype) && !dtype_is_low_bit(x.dtype))
    return KILN_ERROR("{}: x must be an integer tensor, got {}", ctx.node().label(), x.str());
  KILN_ASSIGN_OR_RETURN(DataType out, dequantize_output_type(ctx.node(), ctx.input_type(1).dtype));
  if (!dtype_is_float(out))
    return KILN_ERROR("{}: x_scale must be a float tensor, got {}", ctx.node().label(),
                      dtype_name(out));
  TensorType t = x;
  t.dtype = out;
  ctx.set_output(0, t);
  return Status::Ok();
}

Status dequantize_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* scale = ctx.input(1);
  const Tensor* zp = ctx.input(2);
  if (!x) return KILN_ERROR("{}: missing input 'x'", n.label());
  if (!dtype_is_integer(x->dtype()) && !dtype_is_low_bit(x->dtype()))
    return KILN_ERROR("{}: x must be an integer or float8 tensor, got {}", n.label(), x->desc());
  KILN_RETURN_IF_ERROR(check_scale(scale, n, "x_scale"));
  if (zp && zp->dtype() != x->dtype())
    return KILN_ERROR("{}: zero point type {} differs from x type {}", n.label(),
                      dtype_name(zp->dtype()), dtype_name(x->dtype()));
  KILN_ASSIGN_OR_RETURN(QuantLayout layout, make_layout(x->shape(), *scale, zp, n));
  const std::vector<double> s = as_doubles(*scale);
  const std::vector<int64_t> z = zp ? zp->to_int64_vector() : std::vector<int64_t>(s.size(), 0);
  KILN_ASSIGN_OR_RETURN(DataType out, dequantize_output_type(n, scale->dtype()));
  Tensor y(out, x->shape());
  if (dtype_is_low_bit(x->dtype())) {
    // (x - zp) * scale in float32, as the ONNX reference computes it for these types.
    const std::vector<double> zd = zp ? as_doubles(*zp) : std::vector<double>(s.size(), 0.0);
    Tensor f(DataType::kFloat32, x->shape());
    for_each_param(x->shape(), layout, [&](int64_t i, int64_t p) {
      f.data<float>()[i] = (static_cast<float>(x->at_double(i)) - static_cast<float>(zd[p])) *
                           static_cast<float>(s[p]);
    });
    ctx.set_output(0, f.cast(out));
    return Status::Ok();
  }
  visit_dtype(x->dtype(), [&](auto xtag) {
    using X = decltype(xtag);
    const X* xp = x->data<X>();
    visit_dtype(out, [&](auto ytag) {
      using Y = decltype(ytag);
      if constexpr (std::is_floating_point_v<Y> || std::is_same_v<Y, Half> ||
                    std::is_same_v<Y, BFloat16>) {
        Y* yp = y.data<Y>();
        for_each_param(x->shape(), layout, [&](int64_t i, int64_t p) {
          // (x - zp) is exact in int64; float32 arithmetic like the ONNX reference, double for
          // float64 scales.
          const int64_t d = static_cast<int64_t>(xp[i]) - z[p];
          if constexpr (std::is_same_v<Y, double>)
            yp[i] = static_cast<double>(d) * s[p];
          else
            yp[i] = convert<Y>(static_cast<float>(d) * static_cast<float>(s[p]));
        });
      }
    });
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------------- DynamicQuantizeLinear
// uint8 only (the spec's only type): the range [min(0, min x), max(0, max x)] maps onto
// [0, 255]; a zero range uses scale 1/255 (as ONNX's reference and ONNX Runtime do). All
// arithmetic in float32; NaN inputs are ignored when computing the range.
Status infer_dynamic_quantize(InferContext& ctx) {
  TensorType y = ctx.input_type(0);
  y.dtype = DataType::kUInt8;
  ctx.set_output(0, y);
  ctx.set_output(1, TensorType(DataType::kFloat32, {}));
  ctx.set_output(2, TensorType(DataType::kUInt8, {}));
  return Status::Ok();
}

Status dynamic_quantize_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input 'x'", n.label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: x must be a float tensor, got {}", n.label(), x->desc());
  float lo = 0.f, hi = 0.f;
  for (int64_t i = 0; i < x->numel(); ++i) {
    const float v = static_cast<float>(x->at_double(i));
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const float scale = (hi == lo ? 1.f : hi - lo) / 255.f;
  float zpf = 0.f - lo / scale;
  zpf = std::min(255.f, std::max(0.f, zpf));
  const auto zp = static_cast<uint8_t>(std::nearbyint(zpf));
  Tensor y(DataType::kUInt8, x->shape());
  uint8_t* yp = y.data<uint8_t>();
  for (int64_t i = 0; i < x->numel(); ++i) {
    const float q = static_cast<float>(x->at_double(i)) / scale;
    yp[i] = saturate_round<uint8_t>(static_cast<double>(q), zp);
  }
  ctx.set_output(0, std::move(y));
  ctx.set_output(1, Tensor::scalar<float>(scale));
  ctx.set_output(2, Tensor::scalar<uint8_t>(zp));
  return Status::Ok();
}

constexpr OpDef kQuantOps[] = {
    {"", "DynamicQuantizeLinear", infer_dynamic_quantize, dynamic_quantize_cpu, nullptr},
    {"", "QuantizeLinear", infer_quantize, quantize_cpu, nullptr},
    {"", "DequantizeLinear", infer_dequantize, dequantize_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> quant_ops() { return kQuantOps; }

}  // namespace kiln
