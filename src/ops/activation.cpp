// Activation family: pointwise nonlinearities (Relu, LeakyRelu, Sigmoid, Tanh, Elu, Selu, Celu,
// HardSigmoid, HardSwish, Swish, Softplus, Softsign, Gelu, ThresholdedRelu, Shrink, Mish) and PRelu
// (slope broadcast unidirectionally to X). Built on the unary templates of elementwise_util.h;
// 16-bit floats compute in float. Defaults follow the ONNX spec.
#include <cmath>
#include <string>

#include "ops/elementwise_util.h"

namespace kiln {
namespace {

using ew::kFloatMask;

template <typename C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

struct FloatAct {
  static constexpr uint32_t kMask = kFloatMask;
  static constexpr bool kBoolOut = false;
};

struct ReluOp {
  static constexpr uint32_t kMask = kFloatMask | ew::kSignedIntMask;
  static constexpr bool kBoolOut = false;
  explicit ReluOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }  // NaN stays NaN
};

struct LeakyReluOp : FloatAct {
  float alpha;
  explicit LeakyReluOp(const Node& n) : alpha(n.attrs.get_float("alpha", 0.01f)) {}
  template <typename C>
  C operator()(C x) const {
    return x < C(0) ? static_cast<C>(alpha) * x : x;
  }
};

struct SigmoidOp : FloatAct {
  explicit SigmoidOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    if (x >= C(0)) return C(1) / (C(1) + std::exp(-x));
    const C e = std::exp(x);  // no overflow for very negative x
    return e / (C(1) + e);
  }
};

struct TanhOp : FloatAct {
  explicit TanhOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    return std::tanh(x);
  }
};

struct EluOp : FloatAct {
  float alpha;
  explicit EluOp(const Node& n) : alpha(n.attrs.get_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return x < C(0) ? static_cast<C>(alpha) * std::expm1(x) : x;
  }
};

struct SeluOp : FloatAct {
  float alpha, gamma;
  explicit SeluOp(const Node& n)
      : alpha(n.attrs.get_float("alpha", 1.67326319217681884765625f)),
        gamma(n.attrs.get_float("gamma", 1.05070102214813232421875f)) {}
  template <typename C>
  C operator()(C x) const {
    const C a = static_cast<C>(alpha), g = static_cast<C>(gamma);
    return x > C(0) ? g * x : g * (a * std::exp(x) - a);
  }
};

struct CeluOp : FloatAct {
  float alpha;
  explicit CeluOp(const Node& n) : alpha(n.attrs.get_float("alpha", 1.0f)) {}
  static Status check(const Node& n) {
    if (n.attrs.get_float("alpha", 1.0f) == 0.f)
      return KILN_ERROR("{}: alpha must not be 0", n.label());
    return Status::Ok();
  }
  template <typename C>
  C operator()(C x) const {
    const C a = static_cast<C>(alpha);
    const C neg = a * std::expm1(x / a);
    return (x > C(0) ? x : C(0)) + (neg < C(0) ? neg : C(0));
  }
};

struct HardSigmoidOp : FloatAct {
  float alpha, beta;
  explicit HardSigmoidOp(const Node& n)
      : alpha(n.attrs.get_float("alpha", 0.2f)), beta(n.attrs.get_float("beta", 0.5f)) {}
  template <typename C>
  C operator()(C x) const {
    const C y = static_cast<C>(alpha) * x + static_cast<C>(beta);
    return y < C(0) ? C(0) : (y > C(1) ? C(1) : y);
  }
};

struct HardSwishOp : FloatAct {
  explicit HardSwishOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    const C y = x / C(6) + C(0.5);
    return x * (y < C(0) ? C(0) : (y > C(1) ? C(1) : y));
  }
};

// Swish (opset 24): x * sigmoid(alpha * x); SiLU is alpha = 1. Exporters write it as
// Mul(x, Sigmoid(x)), which fuse_swish recognises.
struct SwishOp : FloatAct {
  float alpha;
  explicit SwishOp(const Node& n) : alpha(n.attrs.get_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return x / (C(1) + std::exp(-static_cast<C>(alpha) * x));
  }
};

struct SoftplusOp : FloatAct {
  explicit SoftplusOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    // log(1 + e^x) without overflow for large x.
    return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
  }
};

struct SoftsignOp : FloatAct {
  explicit SoftsignOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    return x / (C(1) + std::fabs(x));
  }
};

struct GeluOp : FloatAct {
  bool tanh_approx;
  explicit GeluOp(const Node& n)
      : tanh_approx(n.attrs.get_string("approximate", "none") == "tanh") {}
  static Status check(const Node& n) {
    const std::string a = n.attrs.get_string("approximate", "none");
    if (a != "none" && a != "tanh")
      return KILN_ERROR("{}: attribute approximate must be \"none\" or \"tanh\", got \"{}\"",
                        n.label(), a);
    return Status::Ok();
  }
  template <typename C>
  C operator()(C x) const {
    if (tanh_approx) {
      const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
      return C(0.5) * x * (C(1) + std::tanh(k * (x + static_cast<C>(0.044715) * x * x * x)));
    }
    return C(0.5) * x * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
  }
};

struct ThresholdedReluOp : FloatAct {
  float alpha;
  explicit ThresholdedReluOp(const Node& n) : alpha(n.attrs.get_float("alpha", 1.0f)) {}
  template <typename C>
  C operator()(C x) const {
    return x > static_cast<C>(alpha) ? x : C(0);
  }
};

struct ShrinkOp {
  static constexpr uint32_t kMask = ew::kNumericMask;
  static constexpr bool kBoolOut = false;
  double lambd, bias;
  explicit ShrinkOp(const Node& n)
      : lambd(n.attrs.get_float("lambd", 0.5f)), bias(n.attrs.get_float("bias", 0.0f)) {}
  template <typename C>
  C operator()(C x) const {
    const double v = static_cast<double>(x);
    double r = 0;
    if (v < -lambd)
      r = v + bias;
    else if (v > lambd)
      r = v - bias;
    if constexpr (is_float_c<C>)
      return static_cast<C>(r);
    else
      return ew::cast_value<C>(r);
  }
};

struct MishOp : FloatAct {
  explicit MishOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    const C sp = x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    return x * std::tanh(sp);
  }
};

// --- PRelu: slope broadcasts unidirectionally to X's shape ------------------------------------
constexpr uint32_t kPReluMask = kFloatMask | ew::bit(DataType::kInt32) | ew::bit(DataType::kInt64) |
                                ew::bit(DataType::kUInt32) | ew::bit(DataType::kUInt64);

// PRelu before opset 7 applies a 1-D slope of size C per channel (axis 1), where numpy
// broadcasting would align it with the last axis. The upgrade reshapes a constant slope to
// [C,1,...,1]; otherwise it sets this attribute and the slope is reshaped at run time.
constexpr const char* kChannelSlopeAttr = "kiln_prelu_channel_slope";

std::vector<int64_t> channel_slope_shape(int64_t c, int64_t rank_x) {
  std::vector<int64_t> shape(static_cast<size_t>(rank_x - 1), 1);
  shape[0] = c;
  return shape;
}

Status prelu_upgrade(ImportContext& ctx) {
  Node& n = ctx.node();
  n.attrs.erase("consumed_inputs");
  if (ctx.opset() >= 7) return Status::Ok();
  const Value* x = n.input(0);
  const Value* s = n.input(1);
  if (x && s && s->is_constant() && x->type.has_rank()) {
    const Tensor& st = *s->constant;
    if (st.rank() == 1 && st.numel() > 1 && x->type.rank() > 2) {
      KILN_ASSIGN_OR_RETURN(Tensor r, st.reshaped(channel_slope_shape(st.numel(), x->type.rank())));
      ctx.graph().set_input(&n, 1, ctx.add_constant("slope", std::move(r)));
    }
    return Status::Ok();
  }
  n.attrs.set(kChannelSlopeAttr, Attribute::Int(1));
  return Status::Ok();
}

Status prelu_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  TensorType s = ctx.input_type(1);
  if (n.attrs.get_int(kChannelSlopeAttr, 0) != 0 && x.has_rank() && s.has_rank() && s.rank() == 1 &&
      x.rank() > 2)
    s.dims->resize(static_cast<size_t>(x.rank() - 1), Dim(1));
  KILN_RETURN_IF_ERROR(ew::check_dtype(n, "X", x.dtype, kPReluMask));
  KILN_RETURN_IF_ERROR(ew::check_dtype(n, "slope", s.dtype, kPReluMask));
  KILN_RETURN_IF_ERROR(ew::check_same_dtype(n, x.dtype, s.dtype));
  if (x.has_rank() && s.has_rank()) {
    if (s.rank() > x.rank())
      return KILN_ERROR("{}: slope {} has a higher rank than X {}", n.label(), s.str(), x.str());
    const size_t off = x.dims->size() - s.dims->size();
    for (size_t k = 0; k < s.dims->size(); ++k) {
      const Dim& sd = (*s.dims)[k];
      const Dim& xd = (*x.dims)[off + k];
      if (sd.is_static() && xd.is_static() && sd.value != 1 && sd.value != xd.value)
        return KILN_ERROR("{}: slope {} does not broadcast to X {}", n.label(), s.str(), x.str());
    }
  }
  return infer_same_as_input(ctx, 0);
}

Status prelu_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(const Tensor* x, ew::require_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* s0, ew::require_input(ctx, 1));
  KILN_RETURN_IF_ERROR(ew::check_dtype(n, "X", x->dtype(), kPReluMask));
  Tensor slope = *s0;
  const Tensor* s = &slope;
  if (n.attrs.get_int(kChannelSlopeAttr, 0) != 0 && slope.rank() == 1 && slope.numel() > 1 &&
      x->rank() > 2) {
    KILN_ASSIGN_OR_RETURN(slope, slope.reshaped(channel_slope_shape(slope.numel(), x->rank())));
  }
  if (x->dtype() != s->dtype())
    return KILN_ERROR("{}: X and slope have different types {} and {}", n.label(),
                      dtype_name(x->dtype()), dtype_name(s->dtype()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, broadcast_shapes({x->shape(), s->shape()}, n));
  if (shape != x->shape())
    return KILN_ERROR("{}: slope {} does not broadcast to X {}", n.label(), s->desc(), x->desc());
  Tensor out(x->dtype(), shape);
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (ew::type_in_mask<T>(kPReluMask)) {
      using C = ew::compute_t<T>;
      const T* px = x->data<T>();
      const T* ps = s->data<T>();
      T* po = out.data<T>();
      ew::for_each_broadcast(shape, {x->shape(), s->shape()}, [&](int64_t o, const int64_t* off) {
        const C v = ew::to_c(px[off[0]]);
        C r = v;
        if constexpr (std::is_signed_v<C>) {
          if (v < C(0)) {
            if constexpr (is_float_c<C>)
              r = ew::to_c(ps[off[1]]) * v;
            else
              r = ew::wrap_mul(ew::to_c(ps[off[1]]), v);
          }
        }
        po[o] = ew::from_c<T>(r);
      });
    }
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

template <typename Op>
constexpr OpDef act(std::string_view name, ImportFn upgrade = nullptr) {
  return OpDef{"", name, ew::unary_infer<Op>, ew::unary_cpu<Op>, upgrade};
}

const OpDef kActivationOps[] = {
    act<ReluOp>("Relu", ew::upgrade_drop_consumed_inputs),
    act<LeakyReluOp>("LeakyRelu", ew::upgrade_drop_consumed_inputs),
    act<SigmoidOp>("Sigmoid", ew::upgrade_drop_consumed_inputs),
    act<TanhOp>("Tanh", ew::upgrade_drop_consumed_inputs),
    act<EluOp>("Elu", ew::upgrade_drop_consumed_inputs),
    act<SeluOp>("Selu", ew::upgrade_drop_consumed_inputs),
    act<CeluOp>("Celu"),
    act<HardSigmoidOp>("HardSigmoid", ew::upgrade_drop_consumed_inputs),
    act<HardSwishOp>("HardSwish"),
    act<SwishOp>("Swish"),
    act<SoftplusOp>("Softplus"),
    act<SoftsignOp>("Softsign"),
    act<GeluOp>("Gelu"),
    act<ThresholdedReluOp>("ThresholdedRelu"),
    act<ShrinkOp>("Shrink"),
    act<MishOp>("Mish"),
    OpDef{"", "PRelu", prelu_infer, prelu_cpu, prelu_upgrade},
};

}  // namespace

std::span<const OpDef> activation_ops() { return kActivationOps; }

}  // namespace kiln
