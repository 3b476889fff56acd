// Elementwise family, part 2: binary arithmetic (Add Sub Mul Div Mod), comparisons, logic,
// BitShift, BitwiseAnd/Or/Xor, Pow (mixed base/exponent types) and the variadic Max Min Sum Mean.
//
// Integer semantics: Add/Sub/Mul wrap around; Div truncates toward zero (MIN / -1 wraps to MIN);
// Mod with fmod=0 takes the sign of the divisor (Python), fmod=1 that of the dividend (C fmod);
// an integer zero divisor in Div or Mod is an error. Max/Min propagate NaN. Mod with fmod=0 on
// floats (the spec asks for fmod=1 there) follows numpy.mod instead of being refused.
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/elementwise_parts.h"
#include "ops/elementwise_util.h"

namespace kiln::ew {
namespace {

template <typename C>
constexpr bool is_float_c = std::is_floating_point_v<C>;

struct ArithBase {
  static constexpr uint32_t kMask = kNumericMask;
  static constexpr bool kBoolOut = false;
  static constexpr bool kIntDivisor = false;
  explicit ArithBase(const Node&) {}
};

struct AddOp : ArithBase {
  using ArithBase::ArithBase;
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (is_float_c<C>)
      return a + b;
    else
      return wrap_add(a, b);
  }
};
struct SubOp : ArithBase {
  using ArithBase::ArithBase;
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (is_float_c<C>)
      return a - b;
    else
      return wrap_sub(a, b);
  }
};
struct MulOp : ArithBase {
  using ArithBase::ArithBase;
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (is_float_c<C>)
      return a * b;
    else
      return wrap_mul(a, b);
  }
};
struct DivOp : ArithBase {
  static constexpr bool kIntDivisor = true;
  using ArithBase::ArithBase;
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (std::is_signed_v<C> && !is_float_c<C>) {
      if (b == C(-1)) return wrap_sub<C>(0, a);
    }
    return static_cast<C>(a / b);
  }
};
struct ModOp : ArithBase {
  static constexpr bool kIntDivisor = true;
  bool c_fmod;
  explicit ModOp(const Node& n) : ArithBase(n), c_fmod(n.attrs.get_int("fmod", 0) != 0) {}
  template <typename C>
  C operator()(C a, C b) const {
    C r;
    if constexpr (is_float_c<C>) {
      r = std::fmod(a, b);
    } else if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return 0;
      r = static_cast<C>(a % b);
    } else {
      return static_cast<C>(a % b);
    }
    if (!c_fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
    return r;
  }
};

struct CompareBase {
  static constexpr uint32_t kMask = kNumericMask;
  static constexpr bool kBoolOut = true;
  static constexpr bool kIntDivisor = false;
  explicit CompareBase(const Node&) {}
};
struct EqualOp : CompareBase {
  static constexpr uint32_t kMask = kAllMask;
  using CompareBase::CompareBase;
  template <typename C>
  bool operator()(C a, C b) const {
    return a == b;
  }
};
struct GreaterOp : CompareBase {
  using CompareBase::CompareBase;
  template <typename C>
  bool operator()(C a, C b) const {
    return a > b;
  }
};
struct GreaterOrEqualOp : CompareBase {
  using CompareBase::CompareBase;
  template <typename C>
  bool operator()(C a, C b) const {
    return a >= b;
  }
};
struct LessOp : CompareBase {
  using CompareBase::CompareBase;
  template <typename C>
  bool operator()(C a, C b) const {
    return a < b;
  }
};
struct LessOrEqualOp : CompareBase {
  using CompareBase::CompareBase;
  template <typename C>
  bool operator()(C a, C b) const {
    return a <= b;
  }
};

struct LogicBase {
  static constexpr uint32_t kMask = kBoolMask;
  static constexpr bool kBoolOut = false;
  static constexpr bool kIntDivisor = false;
  explicit LogicBase(const Node&) {}
};
struct AndOp : LogicBase {
  using LogicBase::LogicBase;
  bool operator()(bool a, bool b) const { return a && b; }
};
struct OrOp : LogicBase {
  using LogicBase::LogicBase;
  bool operator()(bool a, bool b) const { return a || b; }
};
struct XorOp : LogicBase {
  using LogicBase::LogicBase;
  bool operator()(bool a, bool b) const { return a != b; }
};

// BitwiseAnd/Or/Xor (opset 18): integers only, on the two's-complement bits.
struct BitwiseBase {
  static constexpr uint32_t kMask = kIntMask;
  static constexpr bool kBoolOut = false;
  static constexpr bool kIntDivisor = false;
  explicit BitwiseBase(const Node&) {}
};
struct BitwiseAndOp : BitwiseBase {
  using BitwiseBase::BitwiseBase;
  template <typename C>
  C operator()(C a, C b) const {
    return static_cast<C>(a & b);
  }
};
struct BitwiseOrOp : BitwiseBase {
  using BitwiseBase::BitwiseBase;
  template <typename C>
  C operator()(C a, C b) const {
    return static_cast<C>(a | b);
  }
};
struct BitwiseXorOp : BitwiseBase {
  using BitwiseBase::BitwiseBase;
  template <typename C>
  C operator()(C a, C b) const {
    return static_cast<C>(a ^ b);
  }
};

// BitShift-28 adds the signed integers: a left shift wraps like an unsigned one, a right shift
// is arithmetic; a shift that is negative or at least the bit width gives 0 (right shift of a
// negative value: -1).
struct BitShiftOp {
  static constexpr uint32_t kMask = kIntMask;
  static constexpr bool kBoolOut = false;
  static constexpr bool kIntDivisor = false;
  bool left;
  explicit BitShiftOp(const Node& n) : left(n.attrs.get_string("direction", "") == "LEFT") {}
  static Status check(const Node& n) {
    const std::string d = n.attrs.get_string("direction", "");
    if (d != "LEFT" && d != "RIGHT")
      return KILN_ERROR("{}: attribute direction must be \"LEFT\" or \"RIGHT\", got \"{}\"",
                        n.label(), d);
    return Status::Ok();
  }
  template <typename C>
  C operator()(C a, C b) const {
    // Checked first: shifting by the bit width or more is undefined in C++.
    if (static_cast<uint64_t>(b) >= sizeof(C) * 8) {  // a negative b is huge here too
      if constexpr (std::is_signed_v<C>)
        if (!left && a < 0) return C(-1);
      return C(0);
    }
    if (left)
      return static_cast<C>(static_cast<uint64_t>(static_cast<std::make_unsigned_t<C>>(a)) << b);
    return static_cast<C>(a >> b);  // arithmetic for signed values (C++20)
  }
};

// --- Pow: base and exponent may have different types; the output has the base's type --------
template <typename T, typename E>
T int_pow(T a, E e) {
  if constexpr (std::is_signed_v<E>) {
    if (e < 0) {  // truncation of 1 / a^|e|
      if (a == T(1)) return 1;
      if constexpr (std::is_signed_v<T>) {
        if (a == T(-1)) return (e % 2 == 0) ? T(1) : T(-1);
      }
      return 0;
    }
  }
  T result = 1, base = a;
  for (uint64_t u = static_cast<uint64_t>(e); u != 0; u >>= 1) {
    if (u & 1u) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
  }
  return result;
}

template <typename T, typename E>
T pow_value(T a, E e) {
  if constexpr (std::is_integral_v<T> && std::is_integral_v<E>)
    return int_pow(a, e);
  else if constexpr (std::is_integral_v<T>)
    return cast_value<T>(std::pow(to_double(a), to_double(e)));
  else
    return from_c<T>(std::pow(to_double(a), to_double(e)));
}

constexpr uint32_t kPowBaseMask = kNumericMask;
constexpr uint32_t kPowExpMask = kNumericMask;

Status pow_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const DataType a = ctx.input_type(0).dtype, b = ctx.input_type(1).dtype;
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0 (base)", a, kPowBaseMask));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 1 (exponent)", b, kPowExpMask));
  return binary_infer_dims(ctx, a);
}

Status pow_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(const Tensor* a, require_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* b0, require_input(ctx, 1));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0 (base)", a->dtype(), kPowBaseMask));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 1 (exponent)", b0->dtype(), kPowExpMask));
  Tensor b = *b0;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, binary_out_shape(n, *a, b));
  Tensor out(a->dtype(), shape);
  visit_dtype(a->dtype(), [&](auto ta) {
    using T = decltype(ta);
    if constexpr (type_in_mask<T>(kPowBaseMask)) {
      visit_dtype(b.dtype(), [&](auto tb) {
        using E = decltype(tb);
        if constexpr (type_in_mask<E>(kPowExpMask)) {
          const T* pa = a->data<T>();
          const E* pb = std::as_const(b).data<E>();
          T* po = out.data<T>();
          for_each_broadcast(shape, {a->shape(), b.shape()}, [&](int64_t o, const int64_t* off) {
            po[o] = pow_value(pa[off[0]], pb[off[1]]);
          });
        }
        return 0;
      });
    }
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// --- variadic Max Min Sum Mean (1..N inputs, multidirectional broadcasting) -----------------
struct MaxOp {
  static constexpr uint32_t kMask = kNumericMask;
  template <typename C>
  static C combine(C a, C b) {
    if constexpr (is_float_c<C>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
    }
    return a < b ? b : a;
  }
  template <typename C>
  static C finish(C a, size_t) {
    return a;
  }
};
struct MinOp {
  static constexpr uint32_t kMask = kNumericMask;
  template <typename C>
  static C combine(C a, C b) {
    if constexpr (is_float_c<C>) {
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
    }
    return b < a ? b : a;
  }
  template <typename C>
  static C finish(C a, size_t) {
    return a;
  }
};
struct SumOp {
  static constexpr uint32_t kMask = kFloatMask;
  template <typename C>
  static C combine(C a, C b) {
    return a + b;
  }
  template <typename C>
  static C finish(C a, size_t) {
    return a;
  }
};
struct MeanOp {
  static constexpr uint32_t kMask = kFloatMask;
  template <typename C>
  static C combine(C a, C b) {
    return a + b;
  }
  template <typename C>
  static C finish(C a, size_t n) {
    return a / static_cast<C>(n);
  }
};

template <typename Op>
Status variadic_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  if (ctx.num_inputs() == 0) return KILN_ERROR("{}: needs at least one input", n.label());
  DataType t = DataType::kUndefined;
  std::vector<std::vector<Dim>> dims;
  bool ranked = true;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return KILN_ERROR("{}: input {} is missing", n.label(), i);
    const TensorType& it = ctx.input_type(i);
    KILN_RETURN_IF_ERROR(check_dtype(n, "an input", it.dtype, Op::kMask));
    KILN_RETURN_IF_ERROR(check_same_dtype(n, t, it.dtype));
    if (t == DataType::kUndefined) t = it.dtype;
    if (it.has_rank())
      dims.push_back(*it.dims);
    else
      ranked = false;
  }
  if (!ranked) {
    ctx.set_output(0, TensorType::unknown_rank(t));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, broadcast_dims(dims, n));
  ctx.set_output(0, TensorType(t, std::move(out)));
  return Status::Ok();
}

template <typename Op>
Status variadic_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (ctx.num_inputs() == 0) return KILN_ERROR("{}: needs at least one input", n.label());
  std::vector<const Tensor*> ins;
  std::vector<std::vector<int64_t>> shapes;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(const Tensor* t, require_input(ctx, i));
    KILN_RETURN_IF_ERROR(check_dtype(n, "an input", t->dtype(), Op::kMask));
    if (!ins.empty() && t->dtype() != ins[0]->dtype())
      return KILN_ERROR("{}: inputs have different types {} and {}", n.label(),
                        dtype_name(ins[0]->dtype()), dtype_name(t->dtype()));
    ins.push_back(t);
    shapes.push_back(t->shape());
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, broadcast_shapes(shapes, n));
  Tensor out(ins[0]->dtype(), shape);
  visit_dtype(ins[0]->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (type_in_mask<T>(Op::kMask)) {
      using C = compute_t<T>;
      std::vector<C> acc(static_cast<size_t>(numel_of(shape)));
      for (size_t i = 0; i < ins.size(); ++i) {
        const T* p = ins[i]->data<T>();
        for_each_broadcast(shape, {shapes[i]}, [&](int64_t o, const int64_t* off) {
          acc[o] = i == 0 ? to_c(p[off[0]]) : Op::combine(acc[o], to_c(p[off[0]]));
        });
      }
      T* po = out.data<T>();
      for (size_t o = 0; o < acc.size(); ++o) po[o] = from_c<T>(Op::finish(acc[o], ins.size()));
    }
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

template <typename Op>
constexpr OpDef binary(std::string_view name, ImportFn upgrade = upgrade_legacy_broadcast) {
  return OpDef{"", name, binary_infer<Op>, binary_cpu<Op>, upgrade};
}
template <typename Op>
constexpr OpDef variadic(std::string_view name) {
  return OpDef{"", name, variadic_infer<Op>, variadic_cpu<Op>, upgrade_drop_consumed_inputs};
}

const OpDef kBinaryOps[] = {
    binary<AddOp>("Add"),
    binary<SubOp>("Sub"),
    binary<MulOp>("Mul"),
    binary<DivOp>("Div"),
    binary<ModOp>("Mod", nullptr),
    binary<EqualOp>("Equal"),
    binary<GreaterOp>("Greater"),
    binary<GreaterOrEqualOp>("GreaterOrEqual", nullptr),
    binary<LessOp>("Less"),
    binary<LessOrEqualOp>("LessOrEqual", nullptr),
    binary<AndOp>("And"),
    binary<OrOp>("Or"),
    binary<XorOp>("Xor"),
    binary<BitShiftOp>("BitShift", nullptr),
    binary<BitwiseAndOp>("BitwiseAnd", nullptr),
    binary<BitwiseOrOp>("BitwiseOr", nullptr),
    binary<BitwiseXorOp>("BitwiseXor", nullptr),
    OpDef{"", "Pow", pow_infer, pow_cpu, upgrade_legacy_broadcast},
    variadic<MaxOp>("Max"),
    variadic<MinOp>("Min"),
    variadic<SumOp>("Sum"),
    variadic<MeanOp>("Mean"),
};

}  // namespace

std::span<const OpDef> binary_table() { return kBinaryOps; }

}  // namespace kiln::ew
