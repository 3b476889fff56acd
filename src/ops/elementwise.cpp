// Elementwise family, part 1: unary math, logic and BitwiseNot, and the family table, which
// joins the parts defined in elementwise_binary.cpp (arithmetic, comparison, logic, variadic,
// Pow, BitShift, BitwiseAnd/Or/Xor) and elementwise_misc.cpp (Cast, CastLike, Clip, Where).
#include <cmath>
#include <vector>

#include "ops/elementwise_parts.h"
#include "ops/elementwise_util.h"

namespace kiln {
namespace ew {
namespace {

template <typename C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

// One struct per op; see unary_cpu for the interface.
#define KILN_FLOAT_UNARY(Name, expr)              \
  struct Name {                                   \
    static constexpr uint32_t kMask = kFloatMask; \
    static constexpr bool kBoolOut = false;       \
    explicit Name(const Node&) {}                 \
    template <typename C>                         \
    C operator()(C x) const {                     \
      return expr;                                \
    }                                             \
  };

KILN_FLOAT_UNARY(ExpOp, std::exp(x))
KILN_FLOAT_UNARY(LogOp, std::log(x))
KILN_FLOAT_UNARY(SqrtOp, std::sqrt(x))
KILN_FLOAT_UNARY(ReciprocalOp, C(1) / x)
KILN_FLOAT_UNARY(FloorOp, std::floor(x))
KILN_FLOAT_UNARY(CeilOp, std::ceil(x))
KILN_FLOAT_UNARY(RoundOp, std::nearbyint(x))  // default rounding mode: half to even
KILN_FLOAT_UNARY(SinOp, std::sin(x))
KILN_FLOAT_UNARY(CosOp, std::cos(x))
KILN_FLOAT_UNARY(TanOp, std::tan(x))
KILN_FLOAT_UNARY(AsinOp, std::asin(x))
KILN_FLOAT_UNARY(AcosOp, std::acos(x))
KILN_FLOAT_UNARY(AtanOp, std::atan(x))
KILN_FLOAT_UNARY(SinhOp, std::sinh(x))
KILN_FLOAT_UNARY(CoshOp, std::cosh(x))
KILN_FLOAT_UNARY(AsinhOp, std::asinh(x))
KILN_FLOAT_UNARY(AcoshOp, std::acosh(x))
KILN_FLOAT_UNARY(AtanhOp, std::atanh(x))
#undef KILN_FLOAT_UNARY

struct AbsOp {
  static constexpr uint32_t kMask = kNumericMask;
  static constexpr bool kBoolOut = false;
  explicit AbsOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (is_float_c<C>)
      return std::fabs(x);
    else if constexpr (std::is_signed_v<C>)
      return x < 0 ? wrap_sub<C>(0, x) : x;  // |MIN| wraps
    else
      return x;
  }
};

struct NegOp {
  static constexpr uint32_t kMask = kFloatMask | kSignedIntMask;
  static constexpr bool kBoolOut = false;
  explicit NegOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (is_float_c<C>)
      return -x;
    else
      return wrap_sub<C>(0, x);
  }
};

struct SignOp {
  static constexpr uint32_t kMask = kNumericMask;
  static constexpr bool kBoolOut = false;
  explicit SignOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (is_float_c<C>) {
      if (std::isnan(x)) return x;
    }
    return x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0));
  }
};

struct ErfOp {
  static constexpr uint32_t kMask = kNumericMask;
  static constexpr bool kBoolOut = false;
  explicit ErfOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    if constexpr (is_float_c<C>)
      return std::erf(x);
    else
      return cast_value<C>(std::erf(static_cast<double>(x)));
  }
};

struct NotOp {
  static constexpr uint32_t kMask = kBoolMask;
  static constexpr bool kBoolOut = false;
  explicit NotOp(const Node&) {}
  bool operator()(bool x) const { return !x; }
};

struct BitwiseNotOp {  // opset 18: integers only
  static constexpr uint32_t kMask = kIntMask;
  static constexpr bool kBoolOut = false;
  explicit BitwiseNotOp(const Node&) {}
  template <typename C>
  C operator()(C x) const {
    return static_cast<C>(~x);
  }
};

struct IsNaNOp {
  static constexpr uint32_t kMask = kFloatMask;
  static constexpr bool kBoolOut = true;
  explicit IsNaNOp(const Node&) {}
  template <typename C>
  bool operator()(C x) const {
    return std::isnan(x);
  }
};

struct IsInfOp {
  static constexpr uint32_t kMask = kFloatMask;
  static constexpr bool kBoolOut = true;
  bool neg, pos;
  explicit IsInfOp(const Node& n)
      : neg(n.attrs.get_int("detect_negative", 1) != 0),
        pos(n.attrs.get_int("detect_positive", 1) != 0) {}
  template <typename C>
  bool operator()(C x) const {
    return std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg));
  }
};

template <typename Op>
constexpr OpDef unary(std::string_view name, ImportFn upgrade = nullptr) {
  return OpDef{"", name, unary_infer<Op>, unary_cpu<Op>, upgrade};
}

const OpDef kUnaryOps[] = {
    unary<AbsOp>("Abs", upgrade_drop_consumed_inputs),
    unary<NegOp>("Neg", upgrade_drop_consumed_inputs),
    unary<ExpOp>("Exp", upgrade_drop_consumed_inputs),
    unary<LogOp>("Log", upgrade_drop_consumed_inputs),
    unary<SqrtOp>("Sqrt", upgrade_drop_consumed_inputs),
    unary<ReciprocalOp>("Reciprocal", upgrade_drop_consumed_inputs),
    unary<FloorOp>("Floor", upgrade_drop_consumed_inputs),
    unary<CeilOp>("Ceil", upgrade_drop_consumed_inputs),
    unary<RoundOp>("Round"),
    unary<SignOp>("Sign"),
    unary<SinOp>("Sin"),
    unary<CosOp>("Cos"),
    unary<TanOp>("Tan"),
    unary<AsinOp>("Asin"),
    unary<AcosOp>("Acos"),
    unary<AtanOp>("Atan"),
    unary<SinhOp>("Sinh"),
    unary<CoshOp>("Cosh"),
    unary<AsinhOp>("Asinh"),
    unary<AcoshOp>("Acosh"),
    unary<AtanhOp>("Atanh"),
    unary<ErfOp>("Erf"),
    unary<NotOp>("Not"),
    unary<BitwiseNotOp>("BitwiseNot"),
    unary<IsNaNOp>("IsNaN"),
    unary<IsInfOp>("IsInf"),
};

}  // namespace

std::span<const OpDef> unary_table() { return kUnaryOps; }

}  // namespace ew

std::span<const OpDef> elementwise_ops() {
  static const std::vector<OpDef> table = [] {
    std::vector<OpDef> t;
    for (auto part : {ew::unary_table(), ew::binary_table(), ew::misc_table()})
      t.insert(t.end(), part.begin(), part.end());
    return t;
  }();
  return table;
}

}  // namespace kiln
