// A packed projection's parts taken after its head split, as timm's attention writes
// `qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)`:
//   t = Transpose(Reshape(x [.., G*K], [.., G, d1, .., dm]), perm)
//   y_i = select part i of t's axis a (where perm moved G)          for each part used
//   =>  y_i = Transpose(Reshape(Split(x, G equal parts, last axis)[i], [0, .., 0, d1, .., dm]),
//   perm')
// with perm' = perm without the G axis. "Select part i" is any of the forms exporters write for
// unbind / indexing: Gather(t, i, axis a) with a scalar index, Squeeze(Slice(t, i:i+1 on a), a),
// Squeeze(Split(t, axis a)[i], a). Each part then has the plain head split of its own
// [.., H*D] slice, which fold_attention_heads folds into kiln.MultiHeadAttention, and the Split
// of x is the one pack_qkv reads through strides. Needs x's leading dims provably kept by the
// reshape (for every shape of the profile) and static G, d1..dm; every use of t a selection and
// no intermediate a graph output.
#include <algorithm>
#include <set>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct Part {
  int64_t index;
  std::vector<Node*> nodes;  // the selection's nodes, the last one making the part's value
};

// Part i of `t`'s axis `a` (dropped) when `user` starts one of the selection forms, else nullopt.
std::optional<Part> selection(const Graph& g, const Value* t, Node* user, int64_t a, int64_t rank) {
  auto norm = [&](int64_t ax, int64_t r) { return ax < 0 ? ax + r : ax; };
  auto squeezes_a = [&](Node* sq, const Value* v) {
    if (!is_op(sq, "Squeeze") || sq->input(0) != v || !single_use(g, v)) return false;
    const Value* axes = sq->num_inputs() > 1 ? sq->input(1) : nullptr;
    if (!axes || !axes->is_constant()) return false;
    const auto ax = axes->constant->to_int64_vector();
    return ax.size() == 1 && norm(ax[0], rank) == a;
  };
  if (is_op(user, "Gather") && user->input(0) == t &&
      norm(user->attrs.get_int("axis", 0), rank) == a) {
    const Value* idx = user->input(1);
    if (idx && idx->is_constant() && idx->constant->rank() == 0)
      return Part{idx->constant->to_int64_vector()[0], {user}};
    return std::nullopt;
  }
  if (is_op(user, "Slice") && user->input(0) == t) {
    const auto sl = axis_slice(user, rank);
    if (!sl || sl->axis != a || sl->step != 1 || sl->end != sl->start + 1 || sl->start < 0)
      return std::nullopt;
    Node* sq = sole_consumer(g, user->output(0));
    if (!squeezes_a(sq, user->output(0))) return std::nullopt;
    return Part{sl->start, {user, sq}};
  }
  return std::nullopt;
}

struct UnpackProjectionParts {
  struct Match {
    Node* reshape;
    Node* transpose;
    Node* split = nullptr;  // a Split of t along a (its outputs squeezed), when that is the form
    std::vector<Part> parts;
    int64_t groups;
    std::vector<int64_t> rest, perm;  // the reshape's dims after G; perm without G
  };

  static std::optional<Match> match(PassContext& ctx, Node& tr) {
    if (!is_op(&tr, "Transpose")) return std::nullopt;
    Node* r = producer_if(tr.input(0), "Reshape");
    if (!r || !r->input(0)) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", r->label(), tr.label(), why));
      return std::nullopt;
    };
    const TensorType &x = r->input(0)->type, &y = r->output(0)->type;
    if (!x.has_rank() || !y.has_rank() || x.rank() < 1 || y.rank() < x.rank() + 1)
      return std::nullopt;
    const int64_t k = x.rank() - 1;
    for (int64_t i = 0; i < k; ++i)
      if (!same_dim((*x.dims)[i], (*y.dims)[i])) return std::nullopt;
    int64_t prod = 1;
    for (int64_t i = k; i < y.rank(); ++i) {
      if (!(*y.dims)[i].is_static()) return std::nullopt;
      prod *= (*y.dims)[i].value;
    }
    const Dim& whole = (*x.dims)[k];
    const int64_t groups = (*y.dims)[k].value;
    if (!whole.is_static() || whole.value != prod || groups < 2) return std::nullopt;
    if (!single_use(ctx.g, r->output(0))) return reject("the reshape has other consumers");
    const std::vector<int64_t> perm = transpose_perm(tr);
    const auto at = std::find(perm.begin(), perm.end(), k);
    if (static_cast<int64_t>(perm.size()) != y.rank() || at == perm.end()) return std::nullopt;
    const int64_t a = at - perm.begin();
    const Value* t = tr.output(0);
    if (ctx.g.is_graph_output(t)) return std::nullopt;
    Match m{r, &tr, nullptr, {}, groups, {}, {}};
    for (int64_t i = k + 1; i < y.rank(); ++i) m.rest.push_back((*y.dims)[i].value);
    for (int64_t p : perm)
      if (p != k) m.perm.push_back(p > k ? p - 1 : p);
    const auto uses = t->uses();
    const int64_t split_axis = uses.size() == 1 && is_op(uses[0].first, "Split")
                                   ? uses[0].first->attrs.get_int("axis", 0)
                                   : -1;
    if (uses.size() == 1 && is_op(uses[0].first, "Split") &&
        (split_axis < 0 ? split_axis + y.rank() : split_axis) == a) {
      Node* sp = uses[0].first;
      if (static_cast<int64_t>(sp->num_outputs()) != groups)
        return reject("the split is not into parts of one");
      if (sp->num_inputs() > 1 && sp->input(1)) {
        if (!sp->input(1)->is_constant()) return std::nullopt;
        for (int64_t s : sp->input(1)->constant->to_int64_vector())
          if (s != 1) return reject("the split is not into parts of one");
      }
      m.split = sp;
      for (size_t o = 0; o < sp->num_outputs(); ++o) {
        Value* v = sp->output(o);
        if (!v || v->uses().empty()) continue;
        Node* sq = sole_consumer(ctx.g, v);
        if (!is_op(sq, "Squeeze") || sq->num_inputs() < 2 || !sq->input(1) ||
            !sq->input(1)->is_constant() || sq->input(1)->constant->to_int64_vector().size() != 1)
          return reject("a part is not squeezed");
        int64_t ax = sq->input(1)->constant->to_int64_vector()[0];
        if ((ax < 0 ? ax + y.rank() : ax) != a) return reject("a part is squeezed on another axis");
        m.parts.push_back({static_cast<int64_t>(o), {sq}});
      }
    } else {
      for (auto [user, slot] : uses) {
        auto p = selection(ctx.g, t, user, a, y.rank());
        if (!p || p->index >= groups)
          return reject("a use of the head split does not select one part");
        m.parts.push_back(*p);
      }
    }
    if (m.parts.empty()) return std::nullopt;
    std::set<int64_t> seen;
    for (const Part& p : m.parts) {
      if (!seen.insert(p.index).second) return reject("a part is selected twice");
      if (ctx.g.is_graph_output(p.nodes.back()->output(0)))
        return reject("a part is a graph output");
    }
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* x = m.reshape->input(0);
    const int64_t k = x->type.rank() - 1;
    const int64_t part = (*x->type.dims)[k].value / m.groups;
    const std::string base = m.transpose->name;
    Value* sizes =
        g.add_constant(g.unique_name(base + "_parts"),
                       Tensor::from<int64_t>({m.groups}, std::vector<int64_t>(m.groups, part)));
    std::vector<std::string> names;
    for (int64_t i = 0; i < m.groups; ++i)
      names.push_back(g.unique_name(base + "_part" + std::to_string(i)));
    Node* split = g.insert_node_before(m.transpose, "Split", g.unique_name(base + "_split"),
                                       {x, sizes}, names);
    split->attrs.set("axis", Attribute::Int(k));
    split->origin = ctx.pass;
    split->onnx_nodes = m.transpose->onnx_nodes;
    merge_onnx_nodes(*split, *m.reshape);
    std::vector<int64_t> shape(static_cast<size_t>(k), 0);  // 0: x's own leading dims
    shape.insert(shape.end(), m.rest.begin(), m.rest.end());
    Value* shape_v =
        g.add_constant(g.unique_name(base + "_head_shape"),
                       Tensor::from<int64_t>({static_cast<int64_t>(shape.size())}, shape));
    std::vector<Node*> dead = {m.reshape, m.transpose};
    if (m.split) dead.push_back(m.split);
    for (const Part& p : m.parts) {
      const std::string rn = g.unique_name(base + "_heads" + std::to_string(p.index));
      Node* r =
          g.insert_node_before(m.transpose, "Reshape", rn, {split->output(p.index), shape_v}, {rn});
      const std::string tn = g.unique_name(base + "_t" + std::to_string(p.index));
      Node* t = g.insert_node_before(m.transpose, "Transpose", tn, {r->output(0)}, {tn});
      t->attrs.set("perm", Attribute::Ints(m.perm));
      for (Node* n : {r, t}) {
        n->origin = ctx.pass;
        n->onnx_nodes = split->onnx_nodes;
        for (Node* s : p.nodes) merge_onnx_nodes(*n, *s);
      }
      g.replace_all_uses(p.nodes.back()->output(0), t->output(0));
      dead.insert(dead.end(), p.nodes.begin(), p.nodes.end());
    }
    for (auto it = dead.rbegin(); it != dead.rend(); ++it)  // consumers before producers
      KILN_RETURN_IF_ERROR(g.remove_node(*it, /*force=*/true));
    g.remove_dead_values();
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> unpack_projection_parts(PassContext& ctx) {
  return apply_pattern<UnpackProjectionParts>(ctx);
}

}  // namespace kiln::passes
