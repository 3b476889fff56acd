// An attention mask that only broadcasts a smaller tensor reaches the attention at that size:
//   kiln.MultiHeadAttention(q, k, v, Where(B(c), x, y))  =>  (q, k, v, Where(c, x, y))
//   kiln.MultiHeadAttention(q, k, v, B(m))               =>  (q, k, v, m)
// where B is a chain of Expand(t, shape) and And(t, all-true), which copy t's values into a
// larger shape and change none (all-true: a constant, or provably so, as Range(0, S) >= 0 is for
// a dynamic S), x and y are one value each, and c (or m) broadcasts to the scores
// [B, H, Sq, Sk] itself. Hugging Face's BERT as the TorchScript exporter writes it
// turns the key-padding mask [B, S] into [B, 1, 1, S], then And(all-true [1, 1, S, 1]) and
// Expand to [B, 1, S, S], then Where(., 0, -inf): two kernel layers that write a mask S times
// larger than its content, which the attention then reads for every query row. Narrowed, the
// attention gets the [B, 1, 1, S] mask, the same for every query row (the kernels keep one such
// row per key tile in shared memory), and the And and Expand are left without consumers.
#include <algorithm>
#include <cmath>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr int kMaxDepth = 8;

// Ops that move or copy their input 0's elements without changing them.
bool relabels(const Node* n) {
  for (const char* op : {"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand"})
    if (is_op(n, op)) return true;
  return false;
}

// A lower bound on every element of `v`, where one is provable: a constant's minimum, the start
// of a Range with a constant start and a positive constant step, through relabelling ops.
std::optional<double> lower_bound(const Value* v, int depth = 0) {
  if (!v || depth > kMaxDepth) return std::nullopt;
  if (v->is_constant()) {
    const Tensor& t = *v->constant;
    if (t.numel() == 0) return std::nullopt;
    double lo = t.at_double(0);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = t.at_double(i);
      if (std::isnan(x)) return std::nullopt;  // compares false with everything
      lo = std::min(lo, x);
    }
    return lo;
  }
  const Node* p = v->producer;
  if (relabels(p)) return lower_bound(p->input(0), depth + 1);
  if (is_op(p, "Range") && p->num_inputs() == 3) {
    const auto start = scalar_const(p->input(0)), delta = scalar_const(p->input(2));
    if (start && delta && *delta > 0) return start;
  }
  return std::nullopt;
}

// True when every element of `v` is provably nonzero (true): an all-true constant, a comparison
// of a value with a provable lower bound against a constant below it (exports compare a Range
// from 0 with 0, which a dynamic sequence length keeps from folding), an And of two such, and
// relabellings of them.
bool all_true(const Value* v, int depth = 0) {
  if (!v || depth > kMaxDepth) return false;
  if (v->is_constant()) {
    const Tensor& t = *v->constant;
    if (t.numel() == 0) return false;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (t.at_double(i) == 0) return false;
    return true;
  }
  const Node* p = v->producer;
  if (relabels(p)) return all_true(p->input(0), depth + 1);
  if (is_op(p, "And") && p->num_inputs() == 2)
    return all_true(p->input(0), depth + 1) && all_true(p->input(1), depth + 1);
  if ((is_op(p, "GreaterOrEqual") || is_op(p, "Greater")) && p->num_inputs() == 2) {
    const auto lo = lower_bound(p->input(0)), c = scalar_const(p->input(1));
    if (!lo || !c) return false;
    return is_op(p, "Greater") ? *lo > *c : *lo >= *c;
  }
  return false;
}

// `v` with the broadcast-only producers (Expand; And with a provably all-true operand) stripped:
// the smallest tensor whose broadcast v is. `v` itself when it has none.
Value* strip_broadcasts(Value* v) {
  for (;;) {
    if (Node* e = producer_if(v, "Expand"); e && e->input(0)) {
      v = e->input(0);
      continue;
    }
    if (Node* a = producer_if(v, "And"); a && a->num_inputs() == 2) {
      if (all_true(a->input(1))) {
        v = a->input(0);
        continue;
      }
      if (all_true(a->input(0))) {
        v = a->input(1);
        continue;
      }
    }
    return v;
  }
}

struct NarrowMask {
  struct Match {
    Node* mha;
    Node* where;  // the mask's Where, or null (the mask itself is narrowed)
    Value* narrow;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_kiln_op(&n, "MultiHeadAttention") || n.num_inputs() < 4 || !n.input(3))
      return std::nullopt;
    Value* m = n.input(3);
    Node* w = producer_if(m, "Where");
    if (w && w->num_inputs() == 3 && scalar_const(w->input(1)) && scalar_const(w->input(2))) {
      Value* c = strip_broadcasts(w->input(0));
      if (c == w->input(0)) return std::nullopt;
      // Where(c, x, y)'s shape: c's with x's and y's (one value each) broadcast in.
      TensorType t = c->type;
      for (const Value* s : {w->input(1), w->input(2)})
        if (!t.has_rank() || !s->type.has_rank() || s->type.rank() > t.rank()) return std::nullopt;
      if (!mask_fits_scores(n, t)) {
        ctx.note(fmt::format("{}: its mask's condition {} does not broadcast to the scores",
                             n.label(), c->name));
        return std::nullopt;
      }
      return Match{&n, w, c};
    }
    Value* s = strip_broadcasts(m);
    if (s == m) return std::nullopt;
    if (!mask_fits_scores(n, s->type)) {
      ctx.note(fmt::format("{}: its mask's source {} does not broadcast to the scores", n.label(),
                           s->name));
      return std::nullopt;
    }
    return Match{&n, nullptr, s};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* mask = m.narrow;
    if (m.where) {
      const std::string base = m.where->name + "_narrow";
      Node* w = g.insert_node_before(m.mha, "Where", g.unique_name(base),
                                     {m.narrow, m.where->input(1), m.where->input(2)},
                                     {g.unique_name(base + "_out")});
      w->origin = ctx.pass;
      w->onnx_nodes = m.where->onnx_nodes;
      mask = w->output(0);
    }
    g.set_input(m.mha, 3, mask);
    m.mha->origin = ctx.pass;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> narrow_attention_mask(PassContext& ctx) {
  return apply_pattern<NarrowMask>(ctx);
}

}  // namespace kiln::passes
