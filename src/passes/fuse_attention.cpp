// Scaled dot-product attention recognised as one layer:
//   MatMul(Q [*a], Kt [*b]) [/c | *c] [+ mask] -> Softmax(axis=-1) [-> Where(IsNaN(p), 0, p)]
//     -> MatMul(., V)
//     =>  kiln.Attention(Q, Kt, V, mask?, scale = a * b / c [, nan_to_zero])
// (a and b: the sqrt-scale form of PyTorch's scaled_dot_product_attention export; c: the
// classic "/ sqrt(d)"). Every intermediate must stay inside the pattern.
#include <algorithm>
#include <tuple>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

// v = Mul(u, scalar const) -> (u, scalar, node); else (v, 1, nullptr).
std::tuple<Value*, double, Node*> strip_scalar_mul(Value* v) {
  Node* n = v ? v->producer : nullptr;
  if (is_op(n, "Mul") && n->num_inputs() == 2) {
    for (int s = 0; s < 2; ++s)
      if (auto c = scalar_const(n->input(static_cast<size_t>(s))))
        return {n->input(static_cast<size_t>(1 - s)), *c, n};
  }
  return {v, 1.0, nullptr};
}

struct FuseAttention {
  struct Match {
    std::vector<Node*> nodes;
    Value *q, *kt, *v, *mask;
    double scale;
    bool nan_to_zero = false;
  };

  // Where(IsNaN(p), 0, p): SDPA's guard for rows that the mask removed entirely.
  static Node* nan_guard(Value* w, Node** isnan) {
    Node* where = producer_if(w, "Where");
    if (!where || where->num_inputs() != 3 || !is_scalar_const(where->input(1), 0.0))
      return nullptr;
    Node* in = producer_if(where->input(0), "IsNaN");
    if (!in || in->input(0) != where->input(2)) return nullptr;
    *isnan = in;
    return where;
  }

  // Scores feeding the Softmax: [mask add] <- [scale] <- MatMul(q', k').
  static bool match_scores(Value* s, Match& m) {
    Node* n = s ? s->producer : nullptr;
    if (is_op(n, "Div") && n->num_inputs() == 2) {
      if (auto c = scalar_const(n->input(1)); c && *c != 0.0) {
        m.scale /= *c;
        m.nodes.push_back(n);
        n = n->input(0) ? n->input(0)->producer : nullptr;
      }
    } else if (auto [u, c, mul] = strip_scalar_mul(s); mul) {
      m.scale *= c;
      m.nodes.push_back(mul);
      n = u ? u->producer : nullptr;
    }
    if (!is_op(n, "MatMul")) return false;
    m.nodes.push_back(n);
    auto [q, a, qm] = strip_scalar_mul(n->input(0));
    auto [k, b, km] = strip_scalar_mul(n->input(1));
    if (qm) m.nodes.push_back(qm);
    if (km) m.nodes.push_back(km);
    m.q = q;
    m.kt = k;
    m.scale *= a * b;
    return true;
  }

  static std::optional<Match> match(PassContext& ctx, Node& mm) {
    if (!is_op(&mm, "MatMul")) return std::nullopt;
    Node* isnan = nullptr;
    Node* guard = nan_guard(mm.input(0), &isnan);
    Node* sm = producer_if(guard ? guard->input(2) : mm.input(0), "Softmax");
    if (!sm) return std::nullopt;
    const int64_t rank = sm->output(0)->type.rank();
    int64_t axis = sm->attrs.get_int("axis", -1);
    if (rank < 0 || (axis < 0 ? axis + rank : axis) != rank - 1) {
      ctx.note(fmt::format("{}: Softmax is not over the last axis", sm->label()));
      return std::nullopt;
    }
    Match m{{&mm, sm}, nullptr, nullptr, mm.input(1), nullptr, 1.0};
    if (guard) {
      m.nodes.insert(m.nodes.end(), {guard, isnan});
      m.nan_to_zero = true;
    }
    Value* s = sm->input(0);
    bool found = false;
    if (Node* add = producer_if(s, "Add"); add && add->num_inputs() == 2) {
      for (int side = 0; side < 2 && !found; ++side) {
        Match t = m;
        t.nodes.push_back(add);
        if (match_scores(add->input(static_cast<size_t>(side)), t)) {
          t.mask = add->input(static_cast<size_t>(1 - side));
          m = t;
          found = true;
        }
      }
    }
    if (!found && !match_scores(s, m)) return std::nullopt;
    if (!group_is_closed(ctx.g, m.nodes, mm.output(0))) {
      ctx.note(fmt::format("attention at {}: an intermediate has another consumer", mm.label()));
      return std::nullopt;
    }
    if (!m.q || !m.kt || !m.v || !is_float_type(mm.output(0)->type.dtype)) return std::nullopt;
    Attributes a;
    a.set("scale", Attribute::Float(static_cast<float>(m.scale)));
    if (m.nan_to_zero) a.set("nan_to_zero", Attribute::Int(1));
    if (!ctx.backend_supports("kiln", "Attention", a, mm.output(0)->type.dtype))
      return std::nullopt;
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Attributes a;
    a.set("scale", Attribute::Float(static_cast<float>(m.scale)));
    if (m.nan_to_zero) a.set("nan_to_zero", Attribute::Int(1));
    std::vector<Value*> ins = {m.q, m.kt, m.v};
    if (m.mask) ins.push_back(m.mask);
    // Name it after the first MatMul (the scores), the node that opens the pattern.
    std::vector<Node*> nodes = m.nodes;
    std::sort(nodes.begin(), nodes.end(), [](Node* x, Node* y) { return x->index < y->index; });
    return replace_with_layer(ctx, nodes, "kiln", "Attention", ins, std::move(a),
                              m.nodes[0]->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_attention(PassContext& ctx) { return apply_pattern<FuseAttention>(ctx); }

}  // namespace kiln::passes
