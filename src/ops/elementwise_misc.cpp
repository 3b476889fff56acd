// Elementwise family, part 3: Cast, CastLike, Clip and Where.
//
// Cast float -> integer is defined for every input (ONNX leaves out-of-range undefined): see
// cast_value in elementwise_util.h (NaN -> 0, truncate, wrap like numpy, saturate beyond 64
// bits). Integer narrowing wraps; anything -> bool is "!= 0" (NaN -> true). float8 (e4m3fn,
// e4m3fnuz, e5m2, e5m2fnuz) and int4/uint4 are supported (cast_low_bit); string, complex,
// float4, float8e8m0 and 2-bit targets are refused: kiln does not store those types.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/elementwise_parts.h"
#include "ops/elementwise_util.h"
#include "ops/numeric_util.h"

namespace kiln::ew {
namespace {

std::string onnx_type_name(int64_t v) {
  switch (v) {
    case 8:
      return "string";
    case 14:
      return "complex64";
    case 15:
      return "complex128";
    default:
      break;
  }
  if (std::string_view name = onnx_low_bit_type_name(v); !name.empty()) return std::string(name);
  if (v > 0 && v < 32 && dtype_is_supported(static_cast<DataType>(v)))
    return std::string(dtype_name(static_cast<DataType>(v)));
  return fmt::format("type {}", v);
}

Expected<DataType> supported_type(const Node& n, int64_t v, const char* what) {
  if (v <= 0 || v >= 32 || !dtype_is_supported(static_cast<DataType>(v)))
    return KILN_ERROR("{}: {} {} is not supported by kiln", n.label(), what, onnx_type_name(v));
  return static_cast<DataType>(v);
}

Expected<DataType> cast_target(const Node& n) {
  const Attribute* to = n.attrs.find("to");
  if (!to || to->kind != Attribute::Kind::kInt)
    return KILN_ERROR("{}: missing integer attribute 'to'", n.label());
  return supported_type(n, to->i, "cast to");
}

Status check_source(const Node& n, DataType t) {
  if (t == DataType::kUndefined) return Status::Ok();
  return supported_type(n, static_cast<int64_t>(t), "cast from").status();
}

// float8 and int4/uint4 (opset 19/21): values go through float, exact for every value those
// types hold. A float8 target rounds to nearest even and, with `saturate` (default 1), clamps
// out-of-range values and infinities to the largest finite value; 4-bit targets wrap like the
// other integer casts (what numpy/ml_dtypes and ONNX's reference do).
Tensor cast_low_bit(const Tensor& x, DataType to, bool saturate) {
  if (!dtype_is_float8(to)) return x.cast(to);
  Tensor out(to, x.shape());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t i = 0; i < x.numel(); ++i)
    dst[i] = float_to_float8(to, static_cast<float>(x.at_double(i)), saturate);
  return out;
}

Tensor cast_tensor(const Tensor& x, DataType to, bool saturate = true) {
  if (dtype_is_low_bit(x.dtype()) || dtype_is_low_bit(to)) return cast_low_bit(x, to, saturate);
  Tensor out(to, x.shape());
  const int64_t count = x.numel();
  visit_dtype(x.dtype(), [&](auto ft) {
    using From = decltype(ft);
    const From* src = x.data<From>();
    visit_dtype(to, [&](auto tt) {
      using To = decltype(tt);
      To* dst = out.data<To>();
      for (int64_t i = 0; i < count; ++i) dst[i] = cast_value<To>(src[i]);
      return 0;
    });
    return 0;
  });
  return out;
}

Status cast_infer(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DataType to, cast_target(ctx.node()));
  KILN_RETURN_IF_ERROR(check_source(ctx.node(), ctx.input_type(0).dtype));
  TensorType t = ctx.input_type(0);
  t.dtype = to;
  ctx.set_output(0, t);
  return Status::Ok();
}

Status cast_cpu(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(DataType to, cast_target(ctx.node()));
  KILN_ASSIGN_OR_RETURN(const Tensor* x, require_input(ctx, 0));
  KILN_RETURN_IF_ERROR(check_source(ctx.node(), x->dtype()));
  ctx.set_output(0, cast_tensor(*x, to, ctx.attrs().get_int("saturate", 1) != 0));
  return Status::Ok();
}

// Cast-1 names the target type with a string ("FLOAT", "INT64", ...).
Status cast_upgrade(ImportContext& ctx) {
  Node& n = ctx.node();
  const Attribute* to = n.attrs.find("to");
  if (!to || to->kind != Attribute::Kind::kString) return Status::Ok();
  static const std::pair<const char*, int64_t> kNames[] = {
      {"FLOAT", 1},   {"UINT8", 2},      {"INT8", 3},        {"UINT16", 4},
      {"INT16", 5},   {"INT32", 6},      {"INT64", 7},       {"STRING", 8},
      {"BOOL", 9},    {"FLOAT16", 10},   {"DOUBLE", 11},     {"UINT32", 12},
      {"UINT64", 13}, {"COMPLEX64", 14}, {"COMPLEX128", 15}, {"BFLOAT16", 16}};
  for (const auto& [name, v] : kNames) {
    if (to->s == name) {
      n.attrs.set("to", Attribute::Int(v));
      return Status::Ok();
    }
  }
  return KILN_ERROR("{}: unknown cast target type '{}'", n.label(), to->s);
}

Status castlike_infer(InferContext& ctx) {
  const DataType to = ctx.input_type(1).dtype;
  KILN_RETURN_IF_ERROR(check_source(ctx.node(), ctx.input_type(0).dtype));
  if (to != DataType::kUndefined)
    KILN_RETURN_IF_ERROR(supported_type(ctx.node(), static_cast<int64_t>(to), "cast to").status());
  TensorType t = ctx.input_type(0);
  t.dtype = to;
  ctx.set_output(0, t);
  return Status::Ok();
}

Status castlike_cpu(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* x, require_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* like, require_input(ctx, 1));
  KILN_RETURN_IF_ERROR(check_source(ctx.node(), x->dtype()));
  ctx.set_output(0, cast_tensor(*x, like->dtype(), ctx.attrs().get_int("saturate", 1) != 0));
  return Status::Ok();
}

// --- Clip(x, min?, max?): absent bounds do not clip; min > max gives max everywhere ----------
Status check_clip_bound_type(const Node& n, const TensorType& t, const char* what) {
  KILN_RETURN_IF_ERROR(check_dtype(n, what, t.dtype, kNumericMask));
  if (t.is_static()) {
    int64_t count = 1;
    for (const Dim& d : *t.dims) count *= d.value;
    if (count != 1) return KILN_ERROR("{}: {} must be a scalar, got {}", n.label(), what, t.str());
  }
  return Status::Ok();
}

Status clip_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0", ctx.input_type(0).dtype, kNumericMask));
  if (ctx.has_input(1)) KILN_RETURN_IF_ERROR(check_clip_bound_type(n, ctx.input_type(1), "min"));
  if (ctx.has_input(2)) KILN_RETURN_IF_ERROR(check_clip_bound_type(n, ctx.input_type(2), "max"));
  return infer_same_as_input(ctx, 0);
}

Status clip_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(const Tensor* x, require_input(ctx, 0));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0", x->dtype(), kNumericMask));
  const Tensor* lo_t = ctx.input(1);
  const Tensor* hi_t = ctx.input(2);
  if (lo_t && lo_t->empty_storage()) lo_t = nullptr;
  if (hi_t && hi_t->empty_storage()) hi_t = nullptr;
  for (const Tensor* b : {lo_t, hi_t}) {
    if (!b) continue;
    KILN_RETURN_IF_ERROR(check_dtype(n, "a bound", b->dtype(), kNumericMask));
    if (b->numel() != 1)
      return KILN_ERROR("{}: min/max must be scalars, got {}", n.label(), b->desc());
  }
  Tensor out(x->dtype(), x->shape());
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (type_in_mask<T>(kNumericMask)) {
      using C = compute_t<T>;
      constexpr C kLowest = std::numeric_limits<C>::has_infinity
                                ? -std::numeric_limits<C>::infinity()
                                : std::numeric_limits<C>::lowest();
      constexpr C kHighest = std::numeric_limits<C>::has_infinity
                                 ? std::numeric_limits<C>::infinity()
                                 : std::numeric_limits<C>::max();
      const C lo = lo_t ? to_c(scalar_as<T>(*lo_t)) : kLowest;
      const C hi = hi_t ? to_c(scalar_as<T>(*hi_t)) : kHighest;
      const T* src = x->data<T>();
      T* dst = out.data<T>();
      for (int64_t i = 0; i < x->numel(); ++i) {
        C v = to_c(src[i]);  // NaN passes through both comparisons unchanged
        if (v < lo) v = lo;
        if (v > hi) v = hi;
        dst[i] = from_c<T>(v);
      }
    }
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// Clip before opset 11 takes min/max as float attributes.
Status clip_upgrade(ImportContext& ctx) {
  Node& n = ctx.node();
  n.attrs.erase("consumed_inputs");
  if (ctx.opset() >= 11) return Status::Ok();
  const Value* x = n.input(0);
  DataType t = x && dtype_is_float(x->type.dtype) ? x->type.dtype : DataType::kFloat32;
  ctx.float_attr_to_input("min", 1, t, 0.f, false);
  ctx.float_attr_to_input("max", 2, t, 0.f, false);
  return Status::Ok();
}

// --- Where(condition, X, Y) with broadcasting over all three ---------------------------------
Status where_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_dtype(n, "condition", ctx.input_type(0).dtype, kBoolMask));
  const TensorType& x = ctx.input_type(1);
  const TensorType& y = ctx.input_type(2);
  KILN_RETURN_IF_ERROR(check_dtype(n, "X", x.dtype, kAllMask));
  KILN_RETURN_IF_ERROR(check_same_dtype(n, x.dtype, y.dtype));
  const DataType t = x.dtype != DataType::kUndefined ? x.dtype : y.dtype;
  const TensorType& c = ctx.input_type(0);
  if (!c.has_rank() || !x.has_rank() || !y.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(t));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> dims, broadcast_dims({*c.dims, *x.dims, *y.dims}, n));
  ctx.set_output(0, TensorType(t, std::move(dims)));
  return Status::Ok();
}

Status where_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(const Tensor* c, require_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* x, require_input(ctx, 1));
  KILN_ASSIGN_OR_RETURN(const Tensor* y, require_input(ctx, 2));
  if (c->dtype() != DataType::kBool)
    return KILN_ERROR("{}: condition must be bool, got {}", n.label(), dtype_name(c->dtype()));
  if (x->dtype() != y->dtype())
    return KILN_ERROR("{}: X and Y have different types {} and {}", n.label(),
                      dtype_name(x->dtype()), dtype_name(y->dtype()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                        broadcast_shapes({c->shape(), x->shape(), y->shape()}, n));
  Tensor out(x->dtype(), shape);
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    const bool* pc = c->data<bool>();
    const T* px = x->data<T>();
    const T* py = y->data<T>();
    T* po = out.data<T>();
    for_each_broadcast(
        shape, {c->shape(), x->shape(), y->shape()},
        [&](int64_t o, const int64_t* off) { po[o] = pc[off[0]] ? px[off[1]] : py[off[2]]; });
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

const OpDef kMiscOps[] = {
    {"", "Cast", cast_infer, cast_cpu, cast_upgrade},
    {"", "CastLike", castlike_infer, castlike_cpu, nullptr},
    {"", "Clip", clip_infer, clip_cpu, clip_upgrade},
    {"", "Where", where_infer, where_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> misc_table() { return kMiscOps; }

}  // namespace kiln::ew
