// GELU recognised from its decomposed forms (as PyTorch exporters write them):
//   erf:  x * 0.5 * (1 + Erf(x / sqrt(2)))                          =>  Gelu(x)
//   tanh: x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))   =>  Gelu(x, approximate=tanh)
// in the operand orders exporters produce (x / sqrt2 or x * (1/sqrt2); 0.5 applied to x, to
// (1 + ...) or to the product; x^3 as Pow(x, 3) or x * x * x). Every intermediate must stay
// inside the pattern.
#include <cmath>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr double kSqrt2 = 1.4142135623730951;
constexpr double kSqrt2OverPi = 0.7978845608028654;

// x^3 as Pow(x, 3), Mul(Mul(x, x), x) or Mul(x, Mul(x, x)); collects its nodes.
Value* cube_base(Value* v, std::vector<Node*>& nodes) {
  Node* n = v ? v->producer : nullptr;
  if (Value* x = operand_besides_const(n, "Pow", 3.0, false)) {
    nodes.push_back(n);
    return x;
  }
  if (!is_op(n, "Mul") || n->num_inputs() != 2) return nullptr;
  for (int side = 0; side < 2; ++side) {
    Node* sq = producer_if(n->input(static_cast<size_t>(side)), "Mul");
    Value* x = n->input(static_cast<size_t>(1 - side));
    if (sq && sq->input(0) == x && sq->input(1) == x) {
      nodes.push_back(n);
      nodes.push_back(sq);
      return x;
    }
  }
  return nullptr;
}

// The GELU's x, given the input of its Erf (erf form) or Tanh (tanh form).
Value* inner_x(Node& f, std::vector<Node*>& nodes) {
  Value* u = f.input(0);
  Node* p = u ? u->producer : nullptr;
  if (f.op_type == "Erf") {
    Value* x = operand_besides_const(p, "Div", kSqrt2, false);
    if (!x) x = operand_besides_const(p, "Mul", 1.0 / kSqrt2);
    if (x) nodes.push_back(p);
    return x;
  }
  Value* s = operand_besides_const(p, "Mul", kSqrt2OverPi);  // sqrt(2/pi) * (x + 0.044715 x^3)
  Node* add = s ? producer_if(s, "Add") : nullptr;
  if (!add || add->num_inputs() != 2) return nullptr;
  for (int side = 0; side < 2; ++side) {
    Value* x = add->input(static_cast<size_t>(side));
    Node* mul = add->input(static_cast<size_t>(1 - side))
                    ? add->input(static_cast<size_t>(1 - side))->producer
                    : nullptr;
    Value* cube = operand_besides_const(mul, "Mul", 0.044715);
    std::vector<Node*> cube_nodes;
    if (cube && cube_base(cube, cube_nodes) == x) {
      nodes.insert(nodes.end(), {p, add, mul});
      nodes.insert(nodes.end(), cube_nodes.begin(), cube_nodes.end());
      return x;
    }
  }
  return nullptr;
}

struct FuseGelu {
  struct Match {
    std::vector<Node*> nodes;
    Value* x;
    Value* out;
    bool tanh;
  };

  // From a = 1 + f(...): the remaining "x * 0.5 * a" in its three orders.
  static Value* outer(const Graph& g, Value* a, Value* x, std::vector<Node*>& nodes) {
    Node* c = sole_consumer(g, a);
    if (!is_op(c, "Mul")) return nullptr;
    Value* o = other_input(c, a);
    if (o == x) {  // (x * a) * 0.5
      Node* h = sole_consumer(g, c->output(0));
      if (!operand_besides_const(h, "Mul", 0.5)) return nullptr;
      nodes.insert(nodes.end(), {c, h});
      return h->output(0);
    }
    if (Node* h = o ? producer_if(o, "Mul") : nullptr;
        h && operand_besides_const(h, "Mul", 0.5) == x) {
      nodes.insert(nodes.end(), {c, h});  // (x * 0.5) * a
      return c->output(0);
    }
    if (is_scalar_const(o, 0.5)) {  // x * (a * 0.5)
      Node* m = sole_consumer(g, c->output(0));
      if (!is_op(m, "Mul") || other_input(m, c->output(0)) != x) return nullptr;
      nodes.insert(nodes.end(), {c, m});
      return m->output(0);
    }
    return nullptr;
  }

  static std::optional<Match> match(PassContext& ctx, Node& f) {
    if (!is_op(&f, "Erf") && !is_op(&f, "Tanh")) return std::nullopt;
    std::vector<Node*> nodes = {&f};
    Value* x = inner_x(f, nodes);
    if (!x) return std::nullopt;
    Node* add1 = sole_consumer(ctx.g, f.output(0));
    if (!operand_besides_const(add1, "Add", 1.0)) return std::nullopt;
    nodes.push_back(add1);
    Value* out = outer(ctx.g, add1->output(0), x, nodes);
    if (!out) return std::nullopt;
    if (!group_is_closed(ctx.g, nodes, out)) {
      ctx.note(fmt::format("GELU pattern at {}: an intermediate has another consumer", f.label()));
      return std::nullopt;
    }
    if (!is_float_type(x->type.dtype)) return std::nullopt;
    Attributes a;
    const bool tanh = f.op_type == "Tanh";
    if (tanh) a.set("approximate", Attribute::String("tanh"));
    if (!ctx.backend_supports("", "Gelu", a, x->type.dtype)) return std::nullopt;
    return Match{nodes, x, out, tanh};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Attributes a;
    if (m.tanh) a.set("approximate", Attribute::String("tanh"));
    return replace_with_layer(ctx, m.nodes, "", "Gelu", {m.x}, std::move(a), m.out).status();
  }
};

}  // namespace

Expected<bool> fuse_gelu(PassContext& ctx) { return apply_pattern<FuseGelu>(ctx); }

}  // namespace kiln::passes
