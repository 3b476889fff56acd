// Scaled dot-product attention recognised as one layer:
//   MatMul(Q [*a | /a], Kt [*b | /b]) [/c | *c] [+ mask] -> Softmax(axis=-1)
//     [-> Where(IsNaN(p), 0, p)] -> MatMul(., V)
//     =>  kiln.Attention(Q, Kt, V, mask?, scale = a * b / c [, nan_to_zero])
// (a and b: the sqrt-scale form of PyTorch's scaled_dot_product_attention export, a Div being a
// factor 1/a; c: the classic "/ sqrt(d)"). Every intermediate must stay inside the pattern.
// Scores masked by Where(c, scores, f) with f = -inf or finfo.min (eager attention's
// masked_fill, before or under the mask Add) become scores + Where(c, 0, f), one more additive
// term of the mask.
// Two additive terms, (scores + m1) + m2 (Swin's relative position bias, then its shifted-window
// mask tiled by fold_periodic_add), make one mask Add(m1, m2): neither term may widen the
// scores. The first sum may already be kiln.FusedGemm[base=MatMul](Q', Kt', m1) (fuse_matmul_add
// takes MatMul + Add(constant) in a round where the second term was not yet folded).
#include <algorithm>
#include <tuple>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// v = Mul(u, scalar const) or Div(u, scalar const) -> (u, the factor, node); else (v, 1,
// nullptr). A Div by c is a Mul by 1 / c.
std::tuple<Value*, double, Node*> strip_scalar_mul(Value* v) {
  Node* n = v ? v->producer : nullptr;
  if (is_op(n, "Mul") && n->num_inputs() == 2) {
    for (int s = 0; s < 2; ++s)
      if (auto c = scalar_const(n->input(static_cast<size_t>(s))))
        return {n->input(static_cast<size_t>(1 - s)), *c, n};
  }
  if (is_op(n, "Div") && n->num_inputs() == 2)
    if (auto c = scalar_const(n->input(1)); c && *c != 0.0) return {n->input(0), 1.0 / *c, n};
  return {v, 1.0, nullptr};
}

// The additive term `t` does not widen the scores `s`: its rank is not larger and each of its
// dims (aligned right) is 1, the scores' dim (broadcasts_into), or not known here (a Tile with
// a repeat count computed from shapes has an unknown dim: the backend checks at build time).
bool fits(const TensorType& t, const TensorType& s) {
  if (!t.dims || !s.dims || t.dims->size() > s.dims->size()) return false;
  const size_t off = s.dims->size() - t.dims->size();
  for (size_t i = 0; i < t.dims->size(); ++i) {
    const Dim &a = (*t.dims)[i], &b = (*s.dims)[off + i];
    const bool unknown = !a.is_static() && a.symbol.empty();
    if (!unknown && !(a.is_static() && a.value == 1) && !same_dim(a, b)) return false;
  }
  return true;
}

struct FuseAttention {
  struct Match {
    std::vector<Node*> nodes;
    Value *q, *kt, *v, *mask;
    double scale;
    Value* mask2 = nullptr;     // a second additive term: the layer's mask is Add(mask, mask2)
    Node* outer_add = nullptr;  // (scores + mask) + mask2
    bool nan_to_zero = false;
    Node* fill = nullptr;  // Where(c, scores, f) or Where(c, f, scores): the term Where(c, 0, f)
    int fill_side = 0;     // the input of `fill` that is the scores
  };

  // Where(c, s, f) (or Where(c, f, s)) with a scalar constant f of -inf or at most -1e30 (the
  // fill of eager attention's masked_fill / torch.where with finfo.min): s + Where(c, 0, f) gives
  // the same probabilities, a masked score being f or -inf either way (|s| is far below f's
  // spacing, 2e31 at -3.4e38). Returns the node and sets *side to the scores' input.
  static Node* filled_scores(Value* s, int* side) {
    Node* w = producer_if(s, "Where");
    if (!w || w->num_inputs() != 3 || w->input(0)->type.dtype != DataType::kBool) return nullptr;
    for (int k : {1, 2})
      if (auto f = scalar_const(w->input(static_cast<size_t>(3 - k))); f && *f <= -1e30) {
        *side = k;
        return w;
      }
    return nullptr;
  }

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
    int side = 0;
    Node* w = m.fill ? nullptr : filled_scores(s, &side);
    if (w) s = w->input(static_cast<size_t>(side));
    Node* n = s ? s->producer : nullptr;
    if (auto [u, c, op] = strip_scalar_mul(s); op) {
      m.scale *= c;
      m.nodes.push_back(op);
      n = u ? u->producer : nullptr;
    }
    if (!is_op(n, "MatMul")) return false;
    if (w) {  // the condition must not widen the scores
      if (!fits(w->input(0)->type, n->output(0)->type)) return false;
      m.fill = w;
      m.fill_side = side;
      m.nodes.push_back(w);
    }
    take_product(n, m);
    return true;
  }

  // The product node n of q' [*a] and kt' [*b] (a MatMul, or a FusedGemm on one): q, kt and the
  // scale a * b into m.
  static void take_product(Node* n, Match& m) {
    m.nodes.push_back(n);
    auto [q, a, qm] = strip_scalar_mul(n->input(0));
    auto [k, b, km] = strip_scalar_mul(n->input(1));
    if (qm) m.nodes.push_back(qm);
    if (km) m.nodes.push_back(km);
    m.q = q;
    m.kt = k;
    m.scale *= a * b;
  }

  // Scores with their first additive term already fused into the product:
  // kiln.FusedGemm[base=MatMul](q' [*a], kt' [*b], c) without activation, residual or INT8 (what
  // fuse_matmul_add makes of MatMul + Add(constant) when attention did not match in that round,
  // e.g. before fold_periodic_add could fold the term after it). Returns c.
  static Value* match_biased_scores(Value* s, Match& m) {
    Node* n = s ? s->producer : nullptr;
    if (!is_kiln_op(n, "FusedGemm") || n->attrs.get_string("base", "") != "MatMul" ||
        n->num_inputs() < 3 || !n->input(2) || n->input(3) ||
        !n->attrs.get_string("activation", "").empty() || n->attrs.get_int("int8", 0) != 0)
      return nullptr;
    take_product(n, m);
    return n->input(2);
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
    // (scores + m1) + m2: the mask becomes Add(m1, m2) (made in rewrite()).
    if (Node* add = producer_if(s, "Add"); !found && add && add->num_inputs() == 2) {
      for (int side = 0; side < 2 && !found; ++side) {
        Value* sum = add->input(static_cast<size_t>(side));
        if (!single_use(ctx.g, sum)) continue;
        Node* inner = producer_if(sum, "Add");
        const bool fused = !inner;  // the product's bias is the first term
        if (inner && inner->num_inputs() != 2) continue;
        for (int iside = 0; iside < (fused ? 1 : 2) && !found; ++iside) {
          Match t = m;
          t.nodes.push_back(add);
          Value* m1 = nullptr;
          const TensorType* st = nullptr;
          if (fused) {
            m1 = match_biased_scores(sum, t);
            if (!m1) continue;
            st = &sum->type;
          } else {
            t.nodes.push_back(inner);
            if (!match_scores(inner->input(static_cast<size_t>(iside)), t)) continue;
            m1 = inner->input(static_cast<size_t>(1 - iside));
            st = &inner->input(static_cast<size_t>(iside))->type;
          }
          Value* m2 = add->input(static_cast<size_t>(1 - side));
          if (!m1 || !m2 || !fits(m1->type, *st) || !fits(m2->type, *st) ||
              m1->type.dtype != m2->type.dtype) {
            ctx.note(
                fmt::format("attention at {}: the two additive terms may widen the scores "
                            "or differ in type",
                            mm.label()));
            continue;
          }
          t.mask = m1;
          t.mask2 = m2;
          t.outer_add = add;
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
    Value* mask = m.mask;
    if (m.mask2) {
      // The joint mask, placed where the outer Add was (both terms exist there).
      const std::string name = ctx.g.unique_name(m.outer_add->name + "_mask");
      Node* sum = ctx.g.insert_node_before(m.outer_add, "Add", name, {m.mask, m.mask2}, {name});
      sum->origin = ctx.pass;
      mask = sum->output(0);
    }
    // Name it after the first MatMul (the scores), the node that opens the pattern.
    std::vector<Node*> nodes = m.nodes;
    std::sort(nodes.begin(), nodes.end(), [](Node* x, Node* y) { return x->index < y->index; });
    if (m.fill) {  // the filled scores' term Where(c, 0, f), added to the mask
      Graph& g = ctx.g;
      const DataType t = m.nodes[0]->output(0)->type.dtype;
      const double f = *scalar_const(m.fill->input(static_cast<size_t>(3 - m.fill_side)));
      Value* zero =
          g.add_constant(g.unique_name(m.fill->name + "_zero"), Tensor::scalar(0.0).cast(t));
      Value* fv = g.add_constant(g.unique_name(m.fill->name + "_fill"), Tensor::scalar(f).cast(t));
      const std::string name = g.unique_name(m.fill->name + "_term");
      Node* term = g.insert_node_before(
          nodes.back(), "Where", name,
          {m.fill->input(0), m.fill_side == 1 ? zero : fv, m.fill_side == 1 ? fv : zero}, {name});
      term->origin = ctx.pass;
      if (mask) {
        const std::string sn = g.unique_name(m.fill->name + "_mask");
        Node* sum = g.insert_node_before(nodes.back(), "Add", sn, {mask, term->output(0)}, {sn});
        sum->origin = ctx.pass;
        mask = sum->output(0);
      } else {
        mask = term->output(0);
      }
    }
    if (mask) ins.push_back(mask);
    return replace_with_layer(ctx, nodes, "kiln", "Attention", ins, std::move(a),
                              m.nodes[0]->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_attention(PassContext& ctx) { return apply_pattern<FuseAttention>(ctx); }

}  // namespace kiln::passes
