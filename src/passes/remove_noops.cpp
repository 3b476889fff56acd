// Removal of nodes that compute nothing at inference time:
//   Identity(x)  =>  x              Dropout(x) (inference, mask unused)  =>  x
//   Reshape/Flatten/Squeeze/Unsqueeze(x) giving x's own shape  =>  x
//   Transpose(x, perm = identity)  =>  x          Cast(x, to = x's type)  =>  x
//   Concat(x) of one input  =>  x   (torchvision's DenseNet starts each block with one)
//   Expand(x) to x's own shape  =>  x   (PyTorch's matmul decomposition expands both operands)
//   Concat(x, e...) where every e is empty along the axis  =>  x   (Phi-3's partial rotary,
//   cat([rotated, x[..., rotary_dim:]]), exported at rotary_dim = D: the pass-through part is
//   empty, and the rotary's own pattern then ends at `rotated`)
//   Pad(x) by constant zeros  =>  x   Slice(x) of step 1 giving x's own shape  =>  x
//   (Swin pads to a multiple of its window and slices the padding off again; the amounts come
//   from shape arithmetic and fold to zero wherever the image already is such a multiple)
//   Mul(x, 1), Mul(1, x), Div(x, 1), Add(x, 0), Add(0, x), Sub(x, 0)  =>  x
//   (constants of ones or zeros that do not widen x or change its type: diffusers divides every
//   attention's and ResNet block's output by rescale_output_factor / output_scale_factor, 1 in
//   Stable Diffusion; removed, the residual Adds behind them meet the GEMMs and norms)
#include <algorithm>
#include <numeric>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool is_reshape_like(const Node& n) {
  return n.domain.empty() && (n.op_type == "Reshape" || n.op_type == "Flatten" ||
                              n.op_type == "Squeeze" || n.op_type == "Unsqueeze");
}

bool all_equal(const Value* v, double c) {
  if (!v || !v->is_constant()) return false;
  const Tensor& t = *v->constant;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.at_double(i) != c) return false;
  return true;
}

// For an arithmetic identity (x * 1, x / 1, x + 0, x - 0, either operand order where it
// commutes): the input that is x, or -1. x must be a float tensor of the result's shape and type
// (x + 0 may turn -0 into +0, which no layer after it tells apart).
int identity_operand(const Node& n) {
  if (!n.domain.empty() || n.num_inputs() != 2 || !n.input(0) || !n.input(1) || !n.output(0))
    return -1;
  const bool mul = n.op_type == "Mul", add = n.op_type == "Add";
  const bool div = n.op_type == "Div", sub = n.op_type == "Sub";
  if (!mul && !add && !div && !sub) return -1;
  const double unit = mul || div ? 1.0 : 0.0;
  for (int k = 0; k < 2; ++k) {
    if (k == 1 && (div || sub)) break;  // 1 / x and 0 - x are not x
    const Value *x = n.input(k), *c = n.input(1 - k);
    if (all_equal(c, unit) && is_float_type(x->type.dtype) &&
        x->type.dtype == n.output(0)->type.dtype && same_dims(x->type, n.output(0)->type))
      return k;
  }
  return -1;
}

// For a Concat whose inputs but one are provably empty along its axis (a static 0 there): that
// one's index; else -1.
int sole_nonempty_operand(const Node& n) {
  if (n.op_type != "Concat" || !n.domain.empty() || n.num_inputs() < 2 || !n.output(0)) return -1;
  const int64_t r = n.output(0)->type.rank();
  int64_t axis = n.attrs.get_int("axis", 0);
  if (r < 1) return -1;
  if (axis < 0) axis += r;
  int kept = -1;
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (!v || !v->type.has_rank() || v->type.rank() != r) return -1;
    const Dim& d = (*v->type.dims)[axis];
    if (d.is_static() && d.value == 0) continue;
    if (kept >= 0) return -1;
    kept = static_cast<int>(i);
  }
  return kept;
}

// The input a no-op passes on.
int noop_operand(const Node& n) {
  if (int k = identity_operand(n); k >= 0) return k;
  return std::max(sole_nonempty_operand(n), 0);
}

// Why `n` is a no-op, or "" when it is not one.
std::string noop_reason(PassContext& ctx, const Node& n) {
  if (!n.domain.empty() || n.num_inputs() == 0 || !n.input(0) || !n.output(0)) return "";
  if (identity_operand(n) >= 0) return "arithmetic identity";
  const Value* x = n.input(0);
  const Value* y = n.output(0);
  if (n.op_type == "Identity") return "Identity";
  if (n.op_type == "Dropout") {
    const Value* training = n.input(2);
    if (training && !(training->is_constant() && training->constant->numel() == 1 &&
                      training->constant->at_double(0) == 0.0)) {
      ctx.note(fmt::format("{}: training_mode is not a constant false", n.label()));
      return "";
    }
    if (n.output(1) && (!n.output(1)->uses().empty() || ctx.g.is_graph_output(n.output(1)))) {
      ctx.note(fmt::format("{}: its mask output is used", n.label()));
      return "";
    }
    return "Dropout at inference";
  }
  if (is_reshape_like(n)) {
    if (same_dims(x->type, y->type) && x->type.dtype == y->type.dtype)
      return "reshape to the same shape";
    return "";
  }
  if (n.op_type == "Transpose") {
    std::vector<int64_t> perm = n.attrs.get_ints("perm");
    if (perm.empty()) return x->type.rank() >= 0 && x->type.rank() <= 1 ? "1-D transpose" : "";
    for (size_t i = 0; i < perm.size(); ++i)
      if (perm[i] != static_cast<int64_t>(i)) return "";
    return "identity permutation";
  }
  if (n.op_type == "Concat" && n.num_inputs() == 1) return "concatenation of one input";
  if (n.op_type == "Expand" && same_dims(x->type, y->type) && x->type.dtype == y->type.dtype)
    return "expansion to its own shape";
  if (const int k = sole_nonempty_operand(n); k >= 0) {
    const Value* kept = n.input(k);
    if (same_dims(kept->type, y->type) && kept->type.dtype == y->type.dtype)
      return "concatenation with empty tensors";
  }
  if (n.op_type == "Pad") {
    const Value* pads = n.input(1);
    if (!pads || !pads->is_constant()) return "";
    for (int64_t i = 0; i < pads->constant->numel(); ++i)
      if (pads->constant->at_double(i) != 0.0) return "";
    return "padding by zero everywhere";
  }
  if (n.op_type == "Slice") {
    if (!same_dims(x->type, y->type) || x->type.dtype != y->type.dtype) return "";
    const Value* steps = n.input(4);
    if (steps) {
      if (!steps->is_constant()) return "";
      for (int64_t i = 0; i < steps->constant->numel(); ++i)
        if (steps->constant->at_double(i) != 1.0) return "";  // -1 reverses: same shape, not x
    }
    return "slice of step 1 giving its input's shape";
  }
  if (n.op_type == "Cast") {
    const auto to = n.attrs.get_int("to", -1);
    if (x->type.dtype != DataType::kUndefined && static_cast<int64_t>(x->type.dtype) == to)
      return "cast to the same type";
  }
  return "";
}

struct RemoveNoop {
  struct Match {
    Node* node;
  };
  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (noop_reason(ctx, n).empty()) return std::nullopt;
    Value* y = n.output(0);
    Value* x = n.input(noop_operand(n));
    if (ctx.g.is_graph_output(y) &&
        (!x->producer || ctx.g.is_graph_output(x) || ctx.g.is_graph_input(x))) {
      ctx.note(
          fmt::format("{}: a no-op between a graph input/output and a graph output", n.label()));
      return std::nullopt;
    }
    return Match{&n};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    Value* x = m.node->input(noop_operand(*m.node));
    KILN_ASSIGN_OR_RETURN(bool done, bypass_node(ctx.g, m.node, m.node->output(0), x));
    if (!done) return KILN_ERROR("{}: could not bypass", m.node->label());
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> remove_noops(PassContext& ctx) { return apply_pattern<RemoveNoop>(ctx); }

}  // namespace kiln::passes
