// Shared machinery of the elementwise and activation families: dtype sets, the compute type of
// each element type, broadcast iteration, and templated infer/kernel bodies for unary and
// binary ops. An op is a small struct (see elementwise.cpp) plugged into these templates.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln::ew {

// --- dtype sets (bit i set = DataType with value i allowed) ------------------------------------
constexpr uint32_t bit(DataType t) { return 1u << static_cast<int>(t); }
constexpr uint32_t kFloatMask = bit(DataType::kFloat32) | bit(DataType::kFloat64) |
                                bit(DataType::kFloat16) | bit(DataType::kBFloat16);
constexpr uint32_t kSignedIntMask =
    bit(DataType::kInt8) | bit(DataType::kInt16) | bit(DataType::kInt32) | bit(DataType::kInt64);
constexpr uint32_t kUnsignedIntMask = bit(DataType::kUInt8) | bit(DataType::kUInt16) |
                                      bit(DataType::kUInt32) | bit(DataType::kUInt64);
constexpr uint32_t kIntMask = kSignedIntMask | kUnsignedIntMask;
constexpr uint32_t kNumericMask = kFloatMask | kIntMask;
constexpr uint32_t kBoolMask = bit(DataType::kBool);
constexpr uint32_t kAllMask = kNumericMask | kBoolMask;

constexpr bool in_mask(uint32_t mask, DataType t) {
  const int v = static_cast<int>(t);
  return v >= 0 && v < 32 && ((mask >> v) & 1u) != 0;
}
template <typename T>
constexpr bool type_in_mask(uint32_t mask) {
  return in_mask(mask, DTypeOf<T>::value);
}

// Error unless `t` is in `mask`; an undefined dtype (not yet inferred) passes.
Status check_dtype(const Node& n, const char* what, DataType t, uint32_t mask);
// Error unless both dtypes agree (undefined ones pass).
Status check_same_dtype(const Node& n, DataType a, DataType b);
// Error unless the kernel got input i.
Expected<const Tensor*> require_input(const KernelContext& ctx, size_t i);

// --- compute types: 16-bit floats compute in float, everything else in itself ---------------
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<Half> {
  using type = float;
};
template <>
struct ComputeOf<BFloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeOf<T>::type;

template <typename T>
inline compute_t<T> to_c(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<float>(v);
  else
    return v;
}
template <typename T, typename C>
inline T from_c(C v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// Wrapping integer arithmetic (signed overflow is UB in C++; ONNX integer ops wrap).
template <typename T>
inline T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
template <typename T>
inline T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
template <typename T>
inline T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

// Float -> integer with a defined result for every input: NaN -> 0; values beyond the 64-bit
// range (and +-inf) saturate to the target's limits; anything else truncates toward zero to a
// 64-bit integer and then wraps to the target width, which is what numpy (the ONNX reference)
// and ONNX Runtime give on x86 for in-range values (e.g. -1.5 -> uint8 255, 300.0 -> uint8 44).
// Other conversions follow `convert` (integer narrowing wraps, anything -> bool is != 0).
template <typename To, typename From>
inline To cast_value(From v) {
  constexpr bool from_float = std::is_floating_point_v<From> || std::is_same_v<From, Half> ||
                              std::is_same_v<From, BFloat16>;
  if constexpr (from_float && std::is_integral_v<To> && !std::is_same_v<To, bool>) {
    const double d = to_double(v);
    if (std::isnan(d)) return 0;
    const double t = std::trunc(d);
    constexpr double k2p63 = 9223372036854775808.0, k2p64 = 18446744073709551616.0;
    if constexpr (std::is_same_v<To, uint64_t>) {
      if (t >= k2p64) return std::numeric_limits<To>::max();
      if (t >= 0) return static_cast<uint64_t>(t);
    }
    if (t >= k2p63) return std::numeric_limits<To>::max();
    if (t < -k2p63) return std::numeric_limits<To>::lowest();
    return static_cast<To>(static_cast<int64_t>(t));  // modular narrowing (C++20)
  } else {
    return convert<To>(v);
  }
}

// --- broadcasting ------------------------------------------------------------------------------
inline int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Calls f(out_index, offsets) for every element of `out` in row-major order, where offsets[i]
// is the element offset in input i (shape ins[i], numpy-broadcast to out).
template <typename F>
void for_each_broadcast(const std::vector<int64_t>& out,
                        const std::vector<std::vector<int64_t>>& ins, F&& f) {
  const int64_t total = numel_of(out);
  if (total == 0) return;
  const size_t n = ins.size();
  const int64_t r = static_cast<int64_t>(out.size());
  std::vector<std::vector<int64_t>> st(n);
  for (size_t i = 0; i < n; ++i) st[i] = broadcast_strides(ins[i], out);
  std::vector<int64_t> idx(out.size(), 0), off(n, 0);
  for (int64_t o = 0; o < total; ++o) {
    f(o, off.data());
    for (int64_t d = r - 1; d >= 0; --d) {
      if (++idx[d] < out[d]) {
        for (size_t i = 0; i < n; ++i) off[i] += st[i][d];
        break;
      }
      for (size_t i = 0; i < n; ++i) off[i] -= st[i][d] * (out[d] - 1);
      idx[d] = 0;
    }
  }
}

// Legacy (opset < 7) broadcasting with an explicit axis is canonicalised into the attribute
// kiln_broadcast_axis: B's shape aligns with A's starting at that axis, i.e. B gets trailing
// 1s appended before numpy broadcasting.
extern const char* const kLegacyAxisAttr;
Expected<std::vector<int64_t>> legacy_aligned_shape(const Node& n, int64_t rank_a,
                                                    std::vector<int64_t> b);
// Upgrade for ops that had consumed_inputs (opset < 6): drops it.
Status upgrade_drop_consumed_inputs(ImportContext& ctx);
// Upgrade for binary ops with broadcast/axis attributes (opset < 7) and consumed_inputs.
Status upgrade_legacy_broadcast(ImportContext& ctx);

// --- unary ops ---------------------------------------------------------------------------------
// An Op has: static constexpr uint32_t kMask; static constexpr bool kBoolOut; a constructor
// from const Node& (reads attributes); template <class C> auto operator()(C x) const;
// optionally static Status check(const Node&) validating attributes.
template <typename Op>
Status check_op_attrs(const Node& n) {
  if constexpr (requires { Op::check(n); })
    return Op::check(n);
  else
    return Status::Ok();
}

template <typename Op>
Status unary_infer(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_op_attrs<Op>(ctx.node()));
  TensorType t = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_dtype(ctx.node(), "input 0", t.dtype, Op::kMask));
  if (Op::kBoolOut) t.dtype = DataType::kBool;
  ctx.set_output(0, t);
  return Status::Ok();
}

template <typename Op>
Status unary_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_op_attrs<Op>(n));
  KILN_ASSIGN_OR_RETURN(const Tensor* x, require_input(ctx, 0));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0", x->dtype(), Op::kMask));
  const Op op(n);
  Tensor out(Op::kBoolOut ? DataType::kBool : x->dtype(), x->shape());
  const int64_t count = x->numel();
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (type_in_mask<T>(Op::kMask)) {
      using Out = std::conditional_t<Op::kBoolOut, bool, T>;
      const T* src = x->data<T>();
      Out* dst = out.data<Out>();
      for (int64_t i = 0; i < count; ++i) dst[i] = from_c<Out>(op(to_c(src[i])));
    }
    return 0;
  });
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// --- binary ops (multidirectional broadcasting) ------------------------------------------------
// An Op has kMask, kBoolOut, kIntDivisor (integer zero divisors are an error), a constructor
// from const Node&, and template <class C> auto operator()(C a, C b) const.
Status binary_infer_dims(InferContext& ctx, DataType out_dtype);

template <typename Op>
Status binary_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_op_attrs<Op>(n));
  const DataType a = ctx.input_type(0).dtype, b = ctx.input_type(1).dtype;
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0", a, Op::kMask));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 1", b, Op::kMask));
  KILN_RETURN_IF_ERROR(check_same_dtype(n, a, b));
  const DataType t = a != DataType::kUndefined ? a : b;
  return binary_infer_dims(ctx, Op::kBoolOut ? DataType::kBool : t);
}

// Output shape of a binary op over concrete inputs (legacy axis applied to B).
Expected<std::vector<int64_t>> binary_out_shape(const Node& n, const Tensor& a, Tensor& b_view);

template <typename T>
bool has_zero(const Tensor& t) {
  const T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (p[i] == T(0)) return true;
  return false;
}

template <typename Op>
Status binary_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_op_attrs<Op>(n));
  KILN_ASSIGN_OR_RETURN(const Tensor* a, require_input(ctx, 0));
  KILN_ASSIGN_OR_RETURN(const Tensor* b0, require_input(ctx, 1));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 0", a->dtype(), Op::kMask));
  KILN_RETURN_IF_ERROR(check_dtype(n, "input 1", b0->dtype(), Op::kMask));
  if (a->dtype() != b0->dtype())
    return KILN_ERROR("{}: inputs have different types {} and {}", n.label(),
                      dtype_name(a->dtype()), dtype_name(b0->dtype()));
  Tensor b = *b0;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape, binary_out_shape(n, *a, b));
  const Op op(n);
  Tensor out(Op::kBoolOut ? DataType::kBool : a->dtype(), shape);
  Status st;
  visit_dtype(a->dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (type_in_mask<T>(Op::kMask)) {
      if constexpr (Op::kIntDivisor && std::is_integral_v<T>) {
        if (has_zero<T>(b)) {
          st = KILN_ERROR("{}: integer division by zero", n.label());
          return 0;
        }
      }
      using Out = std::conditional_t<Op::kBoolOut, bool, T>;
      const T* pa = a->data<T>();
      const T* pb = std::as_const(b).data<T>();
      Out* po = out.data<Out>();
      for_each_broadcast(shape, {a->shape(), b.shape()}, [&](int64_t o, const int64_t* off) {
        po[o] = from_c<Out>(op(to_c(pa[off[0]]), to_c(pb[off[1]])));
      });
    }
    return 0;
  });
  KILN_RETURN_IF_ERROR(st);
  ctx.set_output(0, std::move(out));
  return Status::Ok();
}

// Reads a scalar (or 1-element) tensor as element type T, converting if its dtype differs.
template <typename T>
T scalar_as(const Tensor& t) {
  return visit_dtype(t.dtype(), [&](auto tag) -> T {
    using S = decltype(tag);
    return cast_value<T>(t.data<S>()[0]);
  });
}

}  // namespace kiln::ew
