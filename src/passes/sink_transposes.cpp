// Transposes moved past the layers that do not care where their rows are, so that a pair meets
// and cancel_transposes composes it away:
//   G(Transpose(x, p))  =>  Transpose(G(x), p)
//     G: MatMul by a constant 2-D weight or a FusedGemm[MatMul] without residual (a product on
//     the last axis), p keeping the last axis in place; where G widens the rows only when its
//     reader takes the transpose (a sequence-first attention, another transpose);
//   MHA[seq_first](Transpose(q, [1,0,2]), ..)  =>  Transpose(MHA(q, ..), [1,0,2])
//     every Q, K, V input (or the packed one) so transposed: the layer reads the batch-first
//     tensors instead.
// nn.MultiheadAttention (batch_first=True) swaps [B, S, E] to [S, B, E] in front of its input
// projection and back after its output projection; with both rules the two swaps meet and go.
#include <algorithm>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The last axis of a rank-r tensor stays last.
bool keeps_last_axis(const Node& t) {
  const std::vector<int64_t> p = transpose_perm(t);
  return !p.empty() && p.back() == static_cast<int64_t>(p.size()) - 1;
}

bool row_product(const Node* g) {
  if (is_op(g, "MatMul"))
    return g->input(1) && g->input(1)->is_constant() && g->input(1)->constant->rank() == 2;
  return is_kiln_op(g, "FusedGemm") && g->attrs.get_string("base", "") == "MatMul" &&
         !g->input(3) && g->input(1) && g->input(1)->is_constant() &&
         g->input(1)->constant->rank() == 2 && g->attrs.get_int("int8", 0) == 0;
}

// Inserts Transpose(v, attrs of t) after v's producer and makes every other reader of v read it.
Status transpose_after(PassContext& ctx, Value* v, const Node& t) {
  Graph& g = ctx.g;
  if (g.is_graph_output(v)) return KILN_ERROR("{}: {} is a graph output", ctx.pass, v->name);
  const auto& nodes = g.nodes();
  auto it = std::find(nodes.begin(), nodes.end(), v->producer);
  if (it == nodes.end() || std::next(it) == nodes.end())
    return KILN_ERROR("{}: {} has no reader after its producer", ctx.pass, v->name);
  const std::string n = g.unique_name(v->name + "_t");
  Node* nt = g.insert_node_before(*std::next(it), "Transpose", n, {v}, {n});
  nt->attrs = t.attrs;
  nt->origin = ctx.pass;
  nt->onnx_nodes = t.onnx_nodes;
  const auto uses = v->uses();  // a copy: set_input edits the list
  for (const auto& [user, slot] : uses)
    if (user != nt) g.set_input(user, slot, nt->output(0));
  // v now holds the untransposed tensor: its dims are the old ones moved back (inference keeps
  // what a value's type already knows, so it must not keep the old order).
  nt->output(0)->type = v->type;
  const std::vector<int64_t> p = transpose_perm(t);
  if (v->type.has_rank() && static_cast<int64_t>(p.size()) == v->type.rank()) {
    std::vector<Dim> d(p.size());
    for (size_t i = 0; i < p.size(); ++i) d[static_cast<size_t>(p[i])] = (*v->type.dims)[i];
    v->type.dims = std::move(d);
  } else {
    v->type = TensorType::unknown_rank(v->type.dtype);
  }
  return Status::Ok();
}

struct SinkThroughProduct {
  struct Match {
    Node* t;
    Node* g;
  };
  static std::optional<Match> match(PassContext& ctx, Node& g) {
    if (!row_product(&g)) return std::nullopt;
    Node* t = producer_if(g.input(0), "Transpose");
    if (!t || !single_use(ctx.g, g.input(0)) || !keeps_last_axis(*t) ||
        ctx.g.is_graph_output(g.output(0)))
      return std::nullopt;
    // Only where the move costs nothing or leads somewhere: the product does not widen the rows,
    // or its reader takes the transpose (a sequence-first attention, another transpose).
    const int64_t k = g.input(1)->constant->dim(0), n = g.input(1)->constant->dim(1);
    Node* next = sole_consumer(ctx.g, g.output(0));
    const bool absorbed = is_op(next, "Transpose") ||
                          (is_kiln_op(next, "MultiHeadAttention") &&
                           next->attrs.get_int("seq_first", 0) != 0);
    if (n > k && !absorbed) {
      ctx.note(fmt::format("{}: the product widens the transposed rows and nothing takes the "
                           "transpose after it", g.label()));
      return std::nullopt;
    }
    return Match{t, &g};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    g.set_input(m.g, 0, m.t->input(0));
    KILN_RETURN_IF_ERROR(transpose_after(ctx, m.g->output(0), *m.t));
    m.g->origin = ctx.pass;
    KILN_RETURN_IF_ERROR(g.remove_node(m.t));
    return Status::Ok();
  }
};

struct AttentionBatchFirst {
  struct Match {
    Node* mha;
    std::vector<Node*> ts;  // the transposes of Q, K, V (one when packed)
  };
  static std::optional<Match> match(PassContext& ctx, Node& mha) {
    if (!is_kiln_op(&mha, "MultiHeadAttention") || mha.attrs.get_int("seq_first", 0) == 0 ||
        mha.attrs.has("col_slices") || ctx.g.is_graph_output(mha.output(0)))
      return std::nullopt;
    const int parts = mha.attrs.get_int("packed", 0) ? 1 : 3;
    std::vector<Node*> ts;
    for (int i = 0; i < parts; ++i) {
      Node* t = producer_if(mha.input(i), "Transpose");
      if (!t || !single_use(ctx.g, mha.input(i)) ||
          transpose_perm(*t) != std::vector<int64_t>{1, 0, 2})
        return std::nullopt;
      ts.push_back(t);
    }
    return Match{&mha, ts};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    for (size_t i = 0; i < m.ts.size(); ++i) g.set_input(m.mha, i, m.ts[i]->input(0));
    m.mha->attrs.erase("seq_first");
    m.mha->origin = ctx.pass;
    KILN_RETURN_IF_ERROR(transpose_after(ctx, m.mha->output(0), *m.ts[0]));
    for (Node* t : m.ts) KILN_RETURN_IF_ERROR(g.remove_node(t));
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> sink_transposes(PassContext& ctx) {
  bool any = false;
  for (bool changed = true; changed;) {
    KILN_ASSIGN_OR_RETURN(const bool a, apply_pattern<SinkThroughProduct>(ctx));
    KILN_ASSIGN_OR_RETURN(const bool b, apply_pattern<AttentionBatchFirst>(ctx));
    changed = a || b;
    any = any || changed;
  }
  return any;
}

}  // namespace kiln::passes
