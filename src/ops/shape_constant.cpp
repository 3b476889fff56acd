// Ops that create tensors: Constant, ConstantOfShape, Range, EyeLike.
#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/shape_util.h"
#include "ops/shape_values.h"

namespace kiln::shape_detail {
namespace {

constexpr int64_t kMaxGenerated = int64_t{1} << 31;  // refuse absurd Range/ConstantOfShape sizes

// ---------------------------------------------------------------- Constant
Expected<Tensor> constant_value(const Node& n) {
  const Attributes& a = n.attrs;
  if (a.has("sparse_value"))
    return KILN_ERROR("{}: Constant with sparse_value is not supported", n.label());
  if (a.has("value_string") || a.has("value_strings"))
    return KILN_ERROR("{}: string constants are not supported", n.label());
  if (const Attribute* v = a.find("value")) {
    if (v->kind != Attribute::Kind::kTensor || !v->t)
      return KILN_ERROR("{}: Constant 'value' must be a tensor", n.label());
    if (!dtype_is_supported(v->t->dtype()))
      return KILN_ERROR("{}: Constant of type {} is not supported", n.label(), dtype_name(v->t->dtype()));
    return *v->t;
  }
  if (const Attribute* v = a.find("value_float")) return Tensor::scalar<float>(v->f);
  if (const Attribute* v = a.find("value_floats"))
    return Tensor::from<float>({static_cast<int64_t>(v->floats.size())}, v->floats);
  if (const Attribute* v = a.find("value_int")) return Tensor::scalar<int64_t>(v->i);
  if (const Attribute* v = a.find("value_ints"))
    return Tensor::from<int64_t>({static_cast<int64_t>(v->ints.size())}, v->ints);
  return KILN_ERROR("{}: Constant has no value attribute", n.label());
}

Status constant_infer(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor t, constant_value(ctx.node()));
  ctx.set_output(0, TensorType::of(t));
  return Status::Ok();
}

Status constant_cpu(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor t, constant_value(ctx.node()));
  ctx.set_output(0, std::move(t));
  return Status::Ok();
}

// ---------------------------------------------------------------- ConstantOfShape
Expected<Tensor> fill_value(const Node& n) {
  const Attribute* v = n.attrs.find("value");
  if (!v) return Tensor::from<float>({1}, {0.f});
  if (v->kind != Attribute::Kind::kTensor || !v->t || v->t->numel() != 1)
    return KILN_ERROR("{}: 'value' must be a one-element tensor", n.label());
  if (!dtype_is_supported(v->t->dtype()))
    return KILN_ERROR("{}: value of type {} is not supported", n.label(), dtype_name(v->t->dtype()));
  return *v->t;
}

Expected<std::vector<int64_t>> target_shape(const Tensor& s, const Node& n) {
  if (s.rank() != 1) return KILN_ERROR("{}: shape input must be 1-D, got {}", n.label(), s.desc());
  KILN_ASSIGN_OR_RETURN(auto shape, int_values(s, n, "shape"));
  int64_t total = 1;
  for (int64_t d : shape) {
    if (d < 0) return KILN_ERROR("{}: negative dimension in shape {}", n.label(), shape_str(shape));
    if (d > 0 && total > kMaxGenerated / d)
      return KILN_ERROR("{}: shape {} is too large", n.label(), shape_str(shape));
    total *= d;
  }
  return shape;
}

Status constant_of_shape_infer(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(Tensor v, fill_value(ctx.node()));
  if (const Tensor* s = ctx.input_const(0)) {
    KILN_ASSIGN_OR_RETURN(auto shape, target_shape(*s, ctx.node()));
    ctx.set_output(0, TensorType(v.dtype(), to_dims(shape)));
    return Status::Ok();
  }
  const TensorType& st = ctx.input_type(0);
  if (auto shape = ctx.input_value(0); shape && st.rank() == 1) {
    std::vector<Dim> dims;
    for (const SymInt& e : *shape) dims.push_back(e.dim());
    ctx.set_output(0, TensorType(v.dtype(), std::move(dims)));
  } else if (st.rank() == 1 && (*st.dims)[0].is_static()) {
    KILN_ASSIGN_OR_RETURN(auto dims,
                          unknown_dims((*st.dims)[0].value, ctx.node(), "the shape's length"));
    ctx.set_output(0, TensorType(v.dtype(), std::move(dims)));
  } else {
    ctx.set_output(0, TensorType::unknown_rank(v.dtype()));
  }
  return Status::Ok();
}

Status constant_of_shape_cpu(KernelContext& ctx) {
  if (!ctx.input(0)) return KILN_ERROR("{}: missing shape input", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(Tensor v, fill_value(ctx.node()));
  KILN_ASSIGN_OR_RETURN(auto shape, target_shape(*ctx.input(0), ctx.node()));
  Tensor y(v.dtype(), shape);
  const size_t es = dtype_size(v.dtype());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t i = 0; i < y.numel(); ++i) std::memcpy(dst + i * es, v.raw(), es);
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- Range
// float16 and bfloat16 since opset 27.
bool range_type_ok(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kInt16 ||
         t == DataType::kInt32 || t == DataType::kInt64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

// Computes in C and rounds each step to the output type T (C = T except for the 16-bit floats,
// which compute in float and round after every operation unless stashed).
template <typename T, typename C>
Expected<int64_t> range_count(C start, C limit, C delta, const Node& n,
                              const std::function<C(C)>& round) {
  if (delta == C(0)) return KILN_ERROR("{}: Range delta is 0", n.label());
  double count;
  if constexpr (std::is_floating_point_v<C>) {
    count = std::ceil(static_cast<double>(round(round(limit - start) / delta)));
    if (std::isnan(count)) return KILN_ERROR("{}: Range has a NaN bound or delta", n.label());
  } else {
    const int64_t diff = static_cast<int64_t>(limit) - static_cast<int64_t>(start);
    const int64_t dl = static_cast<int64_t>(delta);
    int64_t q = diff / dl;
    if (diff % dl != 0 && ((diff > 0) == (dl > 0))) ++q;
    count = static_cast<double>(q);
  }
  if (count <= 0) return int64_t{0};
  if (count > static_cast<double>(kMaxGenerated))
    return KILN_ERROR("{}: Range would produce {} elements", n.label(), count);
  return static_cast<int64_t>(count);
}

// For float16/bfloat16, stash_type 1 (the default, opset 27) computes in float32 and rounds
// once; any other stash type computes in the input type, rounding after every operation.
template <typename T>
Expected<Tensor> range_typed(const Tensor& s, const Tensor& l, const Tensor& d, const Node& n) {
  constexpr bool kHalf = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
  using C = std::conditional_t<kHalf, float, T>;
  const bool stash = n.attrs.get_int("stash_type", 1) == 1;
  const std::function<C(C)> round = [&](C v) {
    if constexpr (kHalf) return stash ? v : static_cast<float>(T(v));
    return v;
  };
  const C start = static_cast<C>(s.data<T>()[0]), limit = static_cast<C>(l.data<T>()[0]);
  const C delta = static_cast<C>(d.data<T>()[0]);
  KILN_ASSIGN_OR_RETURN(int64_t count, (range_count<T, C>(start, limit, delta, n, round)));
  Tensor y(s.dtype(), {count});
  for (int64_t i = 0; i < count; ++i)
    y.data<T>()[i] = T(round(start + round(static_cast<C>(i) * delta)));
  return y;
}

Expected<Tensor> range_eval(const Tensor& s, const Tensor& l, const Tensor& d, const Node& n) {
  const DataType t = s.dtype();
  if (!range_type_ok(t) || l.dtype() != t || d.dtype() != t)
    return KILN_ERROR("{}: Range inputs must share one of float32, float64, float16, bfloat16, "
                      "int16, int32, int64; got {}, {}, {}", n.label(), s.desc(), l.desc(), d.desc());
  if (s.numel() != 1 || l.numel() != 1 || d.numel() != 1)
    return KILN_ERROR("{}: Range inputs must be scalars", n.label());
  return visit_dtype(t, [&](auto tag) -> Expected<Tensor> {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                  std::is_same_v<T, int16_t> || std::is_same_v<T, int32_t> ||
                  std::is_same_v<T, int64_t> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      return range_typed<T>(s, l, d, n);
    } else {
      return KILN_ERROR("{}: unsupported Range type", n.label());
    }
  });
}

Status range_infer(InferContext& ctx) {
  const Tensor* s = ctx.input_const(0);
  const Tensor* l = ctx.input_const(1);
  const Tensor* d = ctx.input_const(2);
  if (s && l && d) {
    KILN_ASSIGN_OR_RETURN(Tensor y, range_eval(*s, *l, *d, ctx.node()));
    ctx.set_output(0, TensorType::of(y));
    return Status::Ok();
  }
  for (size_t i = 0; i < 3; ++i) {
    const TensorType& it = ctx.input_type(i);
    if (it.dtype != DataType::kUndefined && !range_type_ok(it.dtype))
      return KILN_ERROR("{}: Range does not support {}", ctx.node().label(), dtype_name(it.dtype));
  }
  // Range(start, limit, 1) of symbolic sizes has limit - start elements where that is a size
  // (Range(0, n, 1): n; a KV cache's positions Range(past, past + seq, 1): seq).
  Dim len;
  const auto start = ctx.input_value(0), limit = ctx.input_value(1), delta = ctx.input_value(2);
  if (start && limit && delta && start->size() == 1 && limit->size() == 1 && delta->size() == 1 &&
      (*delta)[0].value == 1) {
    const Dim d = (*start)[0].value == 0 ? (*limit)[0].dim() : sub_dims((*limit)[0].dim(), (*start)[0].dim());
    if (nonnegative_dim(d)) len = d;
  }
  ctx.set_output(0, TensorType(ctx.input_type(0).dtype, {len}));
  return Status::Ok();
}

Status range_cpu(KernelContext& ctx) {
  if (!ctx.input(0) || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: Range needs start, limit and delta", ctx.node().label());
  KILN_ASSIGN_OR_RETURN(Tensor y, range_eval(*ctx.input(0), *ctx.input(1), *ctx.input(2), ctx.node()));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- EyeLike
// A 2-D tensor of the input's shape with ones on diagonal k (k > 0 above the main one) and
// zeros elsewhere, of type dtype or the input's. Only the input's shape is read: with a static
// shape, fold_constants makes it a constant.
constexpr uint32_t kEyeTypes =
    (1u << static_cast<int>(DataType::kFloat32)) | (1u << static_cast<int>(DataType::kFloat64)) |
    (1u << static_cast<int>(DataType::kFloat16)) | (1u << static_cast<int>(DataType::kBFloat16)) |
    (1u << static_cast<int>(DataType::kInt8)) | (1u << static_cast<int>(DataType::kInt16)) |
    (1u << static_cast<int>(DataType::kInt32)) | (1u << static_cast<int>(DataType::kInt64)) |
    (1u << static_cast<int>(DataType::kUInt8)) | (1u << static_cast<int>(DataType::kUInt16)) |
    (1u << static_cast<int>(DataType::kUInt32)) | (1u << static_cast<int>(DataType::kUInt64)) |
    (1u << static_cast<int>(DataType::kBool));
bool eye_type(DataType t) {
  const int v = static_cast<int>(t);
  return v >= 0 && v < 32 && ((kEyeTypes >> v) & 1u) != 0;
}

// The output type; the input's when undefined (not yet inferred) and there is no dtype.
Expected<DataType> eye_like_type(const Node& n, DataType in) {
  if (in != DataType::kUndefined && !eye_type(in))
    return KILN_ERROR("{}: input type {} is not allowed", n.label(), dtype_name(in));
  const Attribute* d = n.attrs.find("dtype");
  if (!d) return in;
  if (d->kind != Attribute::Kind::kInt || !dtype_code_is_valid(d->i) ||
      !eye_type(static_cast<DataType>(d->i)))
    return KILN_ERROR("{}: dtype {} is not a numeric or bool type", n.label(), d->i);
  return static_cast<DataType>(d->i);
}

Status eye_like_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  KILN_ASSIGN_OR_RETURN(DataType t, eye_like_type(ctx.node(), x.dtype));
  if (x.has_rank() && x.rank() != 2)
    return KILN_ERROR("{}: input must be 2-D, got {}", ctx.node().label(), x.str());
  TensorType out = x;
  out.dtype = t;
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

Status eye_like_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  KILN_ASSIGN_OR_RETURN(DataType t, eye_like_type(n, x->dtype()));
  if (x->rank() != 2)
    return KILN_ERROR("{}: input must be 2-D, got {}", n.label(), shape_str(x->shape()));
  const int64_t rows = x->dim(0), cols = x->dim(1), k = n.attrs.get_int("k", 0);
  Tensor y = Tensor(DataType::kFloat64, x->shape());
  double* p = y.data<double>();
  std::fill(p, p + y.numel(), 0.0);
  if (k > -rows && k < cols)  // else no diagonal element falls inside (and -k cannot overflow)
    for (int64_t i = std::max<int64_t>(0, -k); i < rows && i + k < cols; ++i)
      p[i * cols + i + k] = 1.0;
  ctx.set_output(0, y.cast(t));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Constant", constant_infer, constant_cpu, nullptr},
    {"", "ConstantOfShape", constant_of_shape_infer, constant_of_shape_cpu, nullptr},
    {"", "Range", range_infer, range_cpu, nullptr},
    {"", "EyeLike", eye_like_infer, eye_like_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> constant_ops() { return kOps; }

}  // namespace kiln::shape_detail
