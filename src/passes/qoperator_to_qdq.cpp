// ONNX Runtime's quantized operator format (QOperator) in its QDQ form, which every backend runs
// (the float Conv/MatMul between DequantizeLinear and QuantizeLinear) and quant::map_qdq maps
// onto INT8 layers where it is symmetric int8 (engine.cpp runs this pass before map_qdq):
//
//   QLinearConv(x, xs, xzp, w, ws, wzp, ys, yzp, B)  =>
//     QuantizeLinear(Conv(DQ(x, xs, xzp), DQ(w, ws, wzp, axis 0), DQ(B, xs * ws, axis 0)), ys, yzp)
//   QLinearMatMul(a, as, azp, b, bs, bzp, ys, yzp)   =>
//     QuantizeLinear(MatMul(DQ(a, as, azp, axis rank-2), DQ(b, bs, bzp, axis rank-1)), ys, yzp)
//   Cast<float>(MatMulInteger(A, B, azp, bzp))       =>  MatMul(Cast(A) - azp, Cast(B) - bzp)
//   Cast<float>(ConvInteger(x, w, xzp, wzp))         =>  Conv(Cast(x) - xzp, Cast(w) - wzp)
//
// (constant weights and zero points fold). How close the forms are: the integer ops' products
// |a - azp| * |b - bzp| are below 2^16 and exact in float32, and so are their float32 sums while
// they stay below 2^24; past that the float sum is within float32 rounding (2^-24 relative) of
// the exact int32 one. QLinear*'s requantize rint(acc * (as * bs / ys)) and the QDQ form's
// rint((acc * as * bs) / ys) differ only by float rounding of the scale products, so an output
// may differ by one step where the exact value lies within that rounding of a half
// (QoperatorToQdq.* in tests/passes/test_qoperator_to_qdq.cpp bound it). Which forms stay ops:
// scales that are not float32 (opset 21's float16 scales: the op computes their product in
// float16), per-row scales of an N-D a ([..., M, 1]), zero points of MatMulInteger/ConvInteger
// that are computed and not per tensor, and an int32 output read other than by one Cast to
// float32 (the cuda backend runs those ops on their CPU kernel).
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

// One element (rank 0 or 1, static dims of 1).
bool per_tensor(const Value* v) {
  if (!v || !v->type.has_rank() || v->type.rank() > 1) return false;
  for (const Dim& d : *v->type.dims)
    if (!d.is_static() || d.value != 1) return false;
  return true;
}

// The DequantizeLinear axis for a scale of operand `x`: -1 per tensor, `vector_axis` for a 1-D
// scale of x's size there; nullopt when neither.
std::optional<int64_t> dq_axis(const Value* scale, const Value* x, int64_t vector_axis) {
  if (per_tensor(scale)) return -1;
  if (!scale || !scale->type.has_rank() || scale->type.rank() != 1 || !x->type.has_rank() ||
      vector_axis < 0 || vector_axis >= x->type.rank())
    return std::nullopt;
  const Dim& s = (*scale->type.dims)[0];
  const Dim& d = (*x->type.dims)[static_cast<size_t>(vector_axis)];
  if (!s.is_static() || !d.is_static() || s.value != d.value) return std::nullopt;
  return vector_axis;
}

Value* dequantize(Replacement& r, Value* x, Value* scale, Value* zp, int64_t axis,
                  const char* what) {
  std::vector<Value*> ins = {x, scale};
  if (zp) ins.push_back(zp);
  Node* dq = r.add("DequantizeLinear", ins, what);
  if (axis >= 0) dq->attrs.set("axis", Attribute::Int(axis));
  return dq->output(0);
}

struct QLinearToQdq {
  struct Match {
    Node* n = nullptr;
    bool conv = false;
    int64_t a_axis = -1, b_axis = -1;  // DQ axes of the two operands (-1: per tensor)
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    const bool conv = is_op(&n, "QLinearConv");
    if (!conv && !is_op(&n, "QLinearMatMul")) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", n.label(), why));
      return std::nullopt;
    };
    for (size_t i = 0; i < 8; ++i)
      if (!n.input(i)) return reject("an input is absent (the op says which)");
    for (size_t i : {1, 4, 6})
      if (n.input(i)->type.dtype != DataType::kFloat32)
        return reject("its scales are not float32 (the op computes their product in its type)");
    const Value *a = n.input(0), *b = n.input(3);
    if (!a->type.has_rank() || !b->type.has_rank() || !per_tensor(n.input(6)) ||
        !per_tensor(n.input(7)))
      return reject("operand ranks unknown, or the output's scale is not per tensor");
    Match m{&n, conv};
    const auto aa = conv ? (per_tensor(n.input(1)) ? std::optional<int64_t>(-1) : std::nullopt)
                         : dq_axis(n.input(1), a, a->type.rank() - 2);
    const auto ba = dq_axis(n.input(4), b, conv ? 0 : b->type.rank() - 1);
    if (!aa || !ba || per_tensor(n.input(1)) != per_tensor(n.input(2)) ||
        per_tensor(n.input(4)) != per_tensor(n.input(5)))
      return reject(
          "a scale or zero point is neither per tensor nor one 1-D vector along an axis "
          "DequantizeLinear takes");
    const Value* bias = conv ? n.input(8) : nullptr;
    if (bias && !(bias->type.has_rank() && bias->type.rank() == 1 && b->type.rank() >= 1 &&
                  (*bias->type.dims)[0].is_static() && (*b->type.dims)[0].is_static() &&
                  (*bias->type.dims)[0].value == (*b->type.dims)[0].value))
      return reject("B is not 1-D with one element per output channel (the op says why)");
    if (conv && n.input(8) && !per_tensor(n.input(4)) && !n.input(4)->is_constant() &&
        !n.input(1)->is_constant())
      return reject("the bias's per-channel scale x_scale * w_scale is not a constant");
    m.a_axis = *aa;
    m.b_axis = *ba;
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    Value* a = dequantize(r, n.input(0), n.input(1), n.input(2), m.a_axis, m.conv ? "x" : "a");
    Value* b = dequantize(r, n.input(3), n.input(4), n.input(5), m.b_axis, m.conv ? "w" : "b");
    std::vector<Value*> ins = {a, b};
    if (m.conv && n.input(8)) {
      // The bias's scale is x_scale * w_scale (zero point 0), per channel when w's scale is.
      Value *xs = n.input(1), *ws = n.input(4), *bs = nullptr;
      if (xs->is_constant() && ws->is_constant()) {
        Tensor s(DataType::kFloat32, ws->constant->shape());
        const float x = xs->constant->data<float>()[0];
        for (int64_t i = 0; i < s.numel(); ++i)
          s.data<float>()[i] = x * ws->constant->data<float>()[i];
        bs = r.constant("bias_scale", std::move(s));
      } else {
        bs = r.add_value("Mul", {xs, ws}, "bias_scale");
      }
      ins.push_back(dequantize(r, n.input(8), bs, nullptr, m.b_axis >= 0 ? 0 : -1, "bias"));
    }
    Node* op = r.add(m.conv ? "Conv" : "MatMul", ins, m.conv ? "conv" : "matmul");
    if (m.conv) op->attrs = n.attrs;
    return r.finish(
        r.add("QuantizeLinear", {op->output(0), n.input(6), n.input(7)}, "quantize", 0));
  }
};

// A zero point as a float operand of Sub: a constant (reshaped to `shape` when given), or a
// computed per-tensor one cast to float; nullptr for none, nullopt when neither form fits.
std::optional<Value*> float_zero_point(Replacement& r, Value* zp, std::vector<int64_t> shape,
                                       bool dry_run, const char* what) {
  if (!zp) return nullptr;
  if (zp->is_constant()) {
    if (dry_run) return nullptr;
    Tensor f = zp->constant->cast(DataType::kFloat32);
    if (!shape.empty()) {
      Expected<Tensor> s = f.reshaped(shape);
      if (!s.ok()) return std::nullopt;
      f = std::move(*s);
    }
    return r.constant(what, std::move(f));
  }
  if (!per_tensor(zp)) return std::nullopt;
  if (dry_run) return nullptr;
  Node* c = r.add("Cast", {zp}, what);
  c->attrs.set("to", Attribute::Int(static_cast<int64_t>(DataType::kFloat32)));
  return c->output(0);
}

struct IntegerToFloat {
  struct Match {
    Node* n = nullptr;
    bool conv = false;
    std::vector<int64_t> a_zp_shape, b_zp_shape;  // reshapes of constant zero points ({}: none)
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    const bool conv = is_op(&n, "ConvInteger");
    if (!conv && !is_op(&n, "MatMulInteger")) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", n.label(), why));
      return std::nullopt;
    };
    const Node* cast = sole_consumer(ctx.g, n.output(0));
    if (!cast || !is_op(cast, "Cast") ||
        cast->attrs.get_int("to", 0) != static_cast<int64_t>(DataType::kFloat32))
      return reject("its int32 output is read other than by one Cast to float32");
    const Value *a = n.input(0), *b = n.input(1), *azp = n.input(2), *bzp = n.input(3);
    if (!a || !b || !a->type.has_rank() || !b->type.has_rank())
      return reject("operand ranks unknown");
    Match m{&n, conv, {}, {}};
    // A 1-D per-row zero point of A [M] reads [M, 1]; a per-channel one of W [M] reads
    // [M, 1, ...]: constants are reshaped so that they broadcast.
    // (Only when the vector has the length of those rows or channels; else the op says why.)
    if (azp && azp->is_constant() && !conv && azp->type.rank() == 1 && !per_tensor(azp)) {
      if (a->type.rank() < 2 || !dq_axis(azp, a, a->type.rank() - 2))
        return reject("its per-row zero point does not fit A's rows");
      m.a_zp_shape = {(*azp->type.dims)[0].value, 1};
    }
    if (conv && azp && !per_tensor(azp)) return reject("x's zero point is not per tensor");
    if (!conv && bzp && bzp->type.rank() == 1 && !per_tensor(bzp) &&
        (b->type.rank() < 2 || !dq_axis(bzp, b, b->type.rank() - 1)))
      return reject("its per-column zero point does not fit B's columns");
    if (bzp && bzp->is_constant() && conv && bzp->type.rank() == 1 && !per_tensor(bzp)) {
      if (!dq_axis(bzp, b, 0)) return reject("its per-channel zero point does not fit W");
      m.b_zp_shape.assign(static_cast<size_t>(b->type.rank()), 1);
      m.b_zp_shape[0] = (*bzp->type.dims)[0].value;
    }
    Replacement none(ctx, n);
    if (!float_zero_point(none, n.input(2), m.a_zp_shape, true, "") ||
        !float_zero_point(none, n.input(3), m.b_zp_shape, true, ""))
      return reject("a zero point is computed and not per tensor");
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    auto operand = [&](size_t i, const std::vector<int64_t>& zshape, const char* what,
                       const char* zwhat) -> Expected<Value*> {
      Node* c = r.add("Cast", {n.input(i)}, what);
      c->attrs.set("to", Attribute::Int(static_cast<int64_t>(DataType::kFloat32)));
      std::optional<Value*> zp = float_zero_point(r, n.input(i + 2), zshape, false, zwhat);
      if (!zp) return KILN_ERROR("{}: zero point {} does not fit", n.label(), zwhat);
      if (!*zp) return c->output(0);
      return r.add_value("Sub", {c->output(0), *zp}, fmt::format("{}_centered", what));
    };
    KILN_ASSIGN_OR_RETURN(Value * a, operand(0, m.a_zp_shape, m.conv ? "x" : "a",
                                             m.conv ? "x_zero_point" : "a_zero_point"));
    KILN_ASSIGN_OR_RETURN(Value * b, operand(1, m.b_zp_shape, m.conv ? "w" : "b",
                                             m.conv ? "w_zero_point" : "b_zero_point"));
    Node* op = r.add(m.conv ? "Conv" : "MatMul", {a, b}, m.conv ? "conv" : "matmul", 0);
    if (m.conv) op->attrs = n.attrs;
    // The op's output value is now float32; the Cast reading it is a no-op (remove_noops).
    return r.finish(op);
  }
};

}  // namespace

Expected<bool> qoperator_to_qdq(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const bool q, apply_pattern<QLinearToQdq>(ctx));
  KILN_ASSIGN_OR_RETURN(const bool i, apply_pattern<IntegerToFloat>(ctx));
  return q || i;
}

}  // namespace kiln::passes
