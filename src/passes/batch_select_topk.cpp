// Per-class score filtering written as a loop over the classes, unrolled by the exporter, becomes
// one masked top-k over all the classes at once. torchvision's SSD postprocessing (and any
// `for c in classes: keep = s[:, c] > t; s = s[keep]; s, i = s.topk(min(len(s), k))` with the
// results concatenated) exports one chain of about 16 layers per class, each with a NonZero whose
// length the host must read: 90 chains, 1,440 layers, in SSDlite. Per class c (a chain):
//   s = Gather(S, c, axis a)                 a row or column of the scores, [N]
//   I = NonZero(s > t)                       as GatherND's [n, 1] or Gather's [n] indices
//   (V, P) = TopK(s[I], min(n, kmax))        K through Shape/Gather/Concat/ReduceMin or Min
//   outputs: V; G[I][P] for tensors G shared by every chain (the boxes); a ConstantOfShape of
//   V's shape (the label), each concatenated over the chains along axis 0.
// Batched (k chains, their classes C, thresholds T and labels L as constants):
//   Sc = Gather(S, C, axis a) as [k, N];  M = Sc > T;  W = Where(M, Sc, -inf)
//   (V, P) = TopK(W, min(kmax, N), axis 1);  keep = GatherElements(M, P, axis 1)
//   Z = NonZero(keep);  scores = GatherND(V, Z^T);  rows = GatherND(P, Z^T)
//   G's concat = Gather(G, rows);  labels = Gather(L, Z[0])
// The same values in the same order: a chain's selected scores are greater than t, so they rank
// before the masked ones and in the same order as within the selection (TopK breaks ties by the
// lower index, which selection keeps); keep marks exactly the first min(n, kmax) of a row; Z
// walks the rows in chain order and each row in rank order, as the Concats did. One NonZero
// instead of k, and about 15 layers instead of 16 k.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The value through the ops that only reshape a one-element tensor (the exporter's K and n).
const Value* through_scalar_reshapes(const Value* v) {
  while (v && v->producer &&
         (is_op(v->producer, "Reshape") || is_op(v->producer, "Unsqueeze") ||
          is_op(v->producer, "Squeeze") || is_op(v->producer, "Cast")) &&
         v->producer->num_inputs() >= 1)
    v = v->producer->input(0);
  return v;
}

std::optional<int64_t> const_int(const Value* v) {
  const auto s = scalar_const(v);
  if (!s || *s != std::floor(*s)) return std::nullopt;
  return static_cast<int64_t>(*s);
}

struct Chain {
  Node* topk = nullptr;
  Node* nonzero = nullptr;
  Value* source = nullptr;  // S
  int64_t axis = 0;         // the class axis of S
  int64_t index = 0;        // c
  std::string compare;      // Greater or GreaterOrEqual
  double threshold = 0;
  int64_t kmax = 0;
  std::map<Value*, Value*> shared;  // G -> this chain's G[I][P]
  Value* label = nullptr;           // the ConstantOfShape of V's shape, or null
  Tensor label_value;
};

// When `sel` selects the rows of a tensor by the positions a NonZero of a 1-D mask found: its
// base tensor and the NonZero. GatherND(base, Transpose(NonZero(m))) ([n, 1] indices) or
// Gather(base, J, axis 0) with J the NonZero's [1, n] flattened to [n].
std::optional<std::pair<Value*, Node*>> selection(const Value* sel) {
  Node* p = sel ? sel->producer : nullptr;
  if (!p || p->num_inputs() != 2) return std::nullopt;
  const Value* idx = p->input(1);
  Node* nz = nullptr;
  if (is_op(p, "GatherND") && p->attrs.get_int("batch_dims", 0) == 0) {
    Node* t = producer_if(idx, "Transpose");
    if (t && transpose_perm(*t) == std::vector<int64_t>{1, 0}) nz = producer_if(t->input(0), "NonZero");
  } else if (is_op(p, "Gather") && p->attrs.get_int("axis", 0) == 0) {
    Node* f = idx->producer;
    if (f && (is_op(f, "Reshape") || is_op(f, "Squeeze") || is_op(f, "Flatten")) &&
        idx->type.rank() == 1)
      nz = producer_if(f->input(0), "NonZero");
  }
  if (!nz || nz->input(0)->type.rank() != 1) return std::nullopt;
  return std::make_pair(p->input(0), nz);
}

// True when `v` is the length n of the selection made by `nz`: dim 0 of a tensor that this
// NonZero's selection made (or of its indices), or dim 1 of the NonZero's output, read through
// Shape and Gather (or Shape with start/end).
bool is_selection_length(const Value* v, const Node* nz) {
  v = through_scalar_reshapes(v);
  Node* p = v ? v->producer : nullptr;
  if (!p) return false;
  const Value* of = nullptr;
  int64_t dim = -1;
  if (is_op(p, "Gather") && p->attrs.get_int("axis", 0) == 0) {
    Node* sh = producer_if(p->input(0), "Shape");
    const auto d = const_int(p->input(1));
    if (!sh || !d || sh->attrs.get_int("start", 0) != 0) return false;
    of = sh->input(0);
    dim = *d;
  } else if (is_op(p, "Shape")) {
    of = p->input(0);
    dim = p->attrs.get_int("start", 0);
    const int64_t end = p->attrs.get_int("end", std::numeric_limits<int64_t>::max());
    if (end != dim + 1 && !(dim == 0 && of->type.rank() == 1)) return false;
  } else {
    return false;
  }
  if (of == nz->output(0)) return dim == 1;
  if (dim != 0) return false;
  if (of->producer && of->producer->num_inputs() == 2) {
    const auto s = selection(of);  // a tensor the selection made
    if (s && s->second == nz) return true;
  }
  // The selection's own indices ([n, 1] or [n]).
  for (const auto& [user, slot] : of->uses())
    if (slot == 1 && user->output(0)) {
      const auto s = selection(user->output(0));
      if (s && s->second == nz) return true;
    }
  return false;
}

// K = min(n, kmax): ReduceMin over a Concat of the two, or Min of them.
std::optional<int64_t> min_with_length(const Value* k, const Node* nz) {
  k = through_scalar_reshapes(k);
  Node* p = k ? k->producer : nullptr;
  std::vector<const Value*> terms;
  if (is_op(p, "Min") && p->num_inputs() == 2) {
    terms = {p->input(0), p->input(1)};
  } else if (is_op(p, "ReduceMin") && p->num_inputs() == 1) {
    Node* c = producer_if(p->input(0), "Concat");
    if (!c || c->num_inputs() != 2) return std::nullopt;
    terms = {c->input(0), c->input(1)};
  } else {
    return std::nullopt;
  }
  for (int i = 0; i < 2; ++i) {
    const auto kmax = const_int(terms[i]);
    if (kmax && *kmax >= 0 && is_selection_length(terms[1 - i], nz)) return kmax;
  }
  return std::nullopt;
}

struct BatchSelectTopK {
  struct Match {
    Node* scores_concat;
    std::vector<Chain> chains;
    std::vector<std::pair<Value*, Node*>> shared_concats;  // G -> its Concat
    Node* label_concat = nullptr;
  };

  // The chain whose TopK makes `v` (its values), or why not.
  static std::optional<Chain> chain_of(Value* v, std::string& why) {
    Node* topk = producer_if(v, "TopK");
    if (!topk || v != topk->output(0)) return why = "an input is not a TopK's values", std::nullopt;
    Chain ch;
    ch.topk = topk;
    const Value* x = topk->input(0);
    if (topk->attrs.get_int("largest", 1) != 1 || topk->attrs.get_int("sorted", 1) != 1 ||
        x->type.rank() != 1)
      return why = "a TopK is not the sorted largest of a 1-D tensor", std::nullopt;
    const auto sel = selection(x);
    if (!sel) return why = "a TopK's input is not a selection by a NonZero", std::nullopt;
    ch.nonzero = sel->second;
    Node* cmp = ch.nonzero->input(0)->producer;
    if (!cmp || !(is_op(cmp, "Greater") || is_op(cmp, "GreaterOrEqual")) ||
        cmp->input(0) != sel->first)
      return why = "a mask is not the selected tensor compared with a threshold", std::nullopt;
    const auto t = scalar_const(cmp->input(1));
    if (!t || !std::isfinite(*t)) return why = "a threshold is not a finite constant", std::nullopt;
    ch.compare = cmp->op_type;
    ch.threshold = *t;
    Node* col = producer_if(sel->first, "Gather");
    const auto c = col ? const_int(col->input(1)) : std::nullopt;
    if (!c || col->input(1)->type.rank() != 0 || col->input(0)->type.rank() != 2)
      return why = "a chain's scores are not one row or column of a 2-D tensor", std::nullopt;
    ch.source = col->input(0);
    ch.axis = col->attrs.get_int("axis", 0);
    if (ch.axis < 0) ch.axis += 2;
    ch.index = *c;
    const auto kmax = min_with_length(topk->input(1), ch.nonzero);
    if (!kmax) return why = "a TopK's K is not min(the selection's length, a constant)", std::nullopt;
    ch.kmax = *kmax;
    // What the chain gives out: the gathers of shared tensors by the TopK's indices, a label.
    for (const auto& [user, slot] : topk->output(1)->uses()) {
      const auto s = slot == 1 && is_op(user, "Gather") && user->attrs.get_int("axis", 0) == 0
                         ? selection(user->input(0))
                         : std::nullopt;
      if (!s || s->second != ch.nonzero || !ch.shared.emplace(s->first, user->output(0)).second)
        return why = "a TopK's indices are read other than to gather a tensor selected by the same NonZero",
               std::nullopt;
    }
    for (const auto& [user, slot] : v->uses()) {
      if (is_op(user, "Concat")) continue;
      Node* cos = is_op(user, "Shape") && user->attrs.all().empty() && user->output(0)->uses().size() == 1
                      ? user->output(0)->uses()[0].first
                      : nullptr;
      const Tensor* value = cos && is_op(cos, "ConstantOfShape") ? cos->attrs.get_tensor("value") : nullptr;
      if (!value || value->numel() != 1 || ch.label)
        return why = "a TopK's values are read other than by a Concat and one label", std::nullopt;
      ch.label = cos->output(0);
      ch.label_value = *value;
    }
    return ch;
  }

  // The Concat (axis 0) that joins exactly `parts`, in order, and is their only reader.
  static Node* concat_of(const Graph& g, const std::vector<Value*>& parts) {
    Node* c = sole_consumer(g, parts[0]);
    if (!is_op(c, "Concat") || c->num_inputs() != parts.size()) return nullptr;
    const int64_t rank = parts[0]->type.rank();
    const int64_t axis = c->attrs.get_int("axis", 0);
    if (rank < 1 || (axis != 0 && axis != -rank)) return nullptr;
    for (size_t i = 0; i < parts.size(); ++i)
      if (c->input(i) != parts[i] || !single_use(g, parts[i])) return nullptr;
    return c;
  }

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Concat") || n.num_inputs() < 2 || !producer_if(n.input(0), "TopK"))
      return std::nullopt;
    const auto why = [&](const std::string& r) {
      ctx.note(fmt::format("{}: a concatenation of top-k chains, but {}", n.label(), r));
      return std::nullopt;
    };
    Match m{&n, {}, {}, nullptr};
    std::string reason;
    for (Value* v : n.inputs()) {
      auto ch = chain_of(v, reason);
      if (!ch) return why(reason);
      m.chains.push_back(std::move(*ch));
    }
    const Chain& c0 = m.chains[0];
    const DataType dt = c0.source->type.dtype;
    if (!is_float_type(dt)) return why("the scores are not floating point");
    for (const Chain& c : m.chains) {
      if (c.source != c0.source || c.axis != c0.axis || c.compare != c0.compare ||
          c.kmax != c0.kmax || c.shared.size() != c0.shared.size() || !c.label != !c0.label ||
          (c.label && c.label_value.dtype() != c0.label_value.dtype()))
        return why("the chains differ in their scores, comparison, K, gathers or labels");
      for (const auto& [g, out] : c0.shared)
        if (!c.shared.count(g)) return why("the chains gather different tensors");
    }
    for (const auto& [g, out0] : c0.shared) {
      std::vector<Value*> parts;
      for (const Chain& c : m.chains) parts.push_back(c.shared.at(g));
      Node* cc = concat_of(ctx.g, parts);
      if (!cc) return why("a gathered tensor's chains are not concatenated in the same order");
      m.shared_concats.emplace_back(g, cc);
    }
    if (c0.label) {
      std::vector<Value*> parts;
      for (const Chain& c : m.chains) parts.push_back(c.label);
      m.label_concat = concat_of(ctx.g, parts);
      if (!m.label_concat) return why("the labels are not concatenated in the chains' order");
    }
    // Each chain's values: read by this Concat once (and by their label's Shape).
    for (const Chain& c : m.chains) {
      int concats = 0;
      for (const auto& [user, slot] : c.topk->output(0)->uses()) concats += is_op(user, "Concat");
      if (concats != 1 || ctx.g.is_graph_output(c.topk->output(0)))
        return why("a chain's values are read by another Concat or are a graph output");
    }
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const Chain& c0 = m.chains[0];
    const int64_t k = static_cast<int64_t>(m.chains.size());
    const DataType dt = c0.source->type.dtype;
    const std::string base = m.scores_concat->name;
    auto add = [&](const char* op, std::vector<Value*> ins, const char* what, size_t nout = 1) {
      std::vector<std::string> outs;
      for (size_t i = 0; i < nout; ++i) outs.push_back(g.unique_name(base + "/" + what));
      Node* n = g.add_node(op, g.unique_name(base + "/" + what), ins, outs);
      n->origin = ctx.pass;
      return n;
    };
    auto constant = [&](const char* what, Tensor t) {
      return g.add_constant(g.unique_name(base + "/" + what), std::move(t));
    };
    std::vector<int64_t> classes;
    std::vector<double> thresholds;  // cast to the scores' type below, as each chain's was
    for (const Chain& c : m.chains) {
      classes.push_back(c.index);
      thresholds.push_back(c.threshold);
    }
    // [k, N]: the chains' rows of the scores.
    Value* rows = add("Gather", {c0.source, constant("classes", Tensor::from<int64_t>({k}, classes))},
                      "class_scores")->output(0);
    rows->producer->attrs.set("axis", Attribute::Int(c0.axis));
    if (c0.axis == 1) {
      Node* t = add("Transpose", {rows}, "by_class");
      t->attrs.set("perm", Attribute::Ints({1, 0}));
      rows = t->output(0);
    }
    Value* thr = constant("thresholds", Tensor::from<double>({k, 1}, thresholds).cast(dt));
    Value* mask = add(c0.compare.c_str(), {rows, thr}, "selected")->output(0);
    Value* lowest = constant("masked", Tensor::scalar<float>(-std::numeric_limits<float>::infinity()).cast(dt));
    Value* masked = add("Where", {mask, rows, lowest}, "masked_scores")->output(0);
    // K = min(kmax, N), N the scores' length (folded when static).
    Node* len = add("Shape", {masked}, "length");
    len->attrs.set("start", Attribute::Int(1));
    len->attrs.set("end", Attribute::Int(2));
    Value* kk = add("Min", {len->output(0), constant("kmax", Tensor::from<int64_t>({1}, {c0.kmax}))},
                    "k")->output(0);
    Node* topk = add("TopK", {masked, kk}, "topk", 2);
    topk->attrs.set("axis", Attribute::Int(1));
    for (const Chain& c : m.chains) merge_onnx_nodes(*topk, *c.topk);
    Node* keep = add("GatherElements", {mask, topk->output(1)}, "kept");
    keep->attrs.set("axis", Attribute::Int(1));
    Value* nz = add("NonZero", {keep->output(0)}, "kept_at")->output(0);
    Node* at = add("Transpose", {nz}, "kept_pairs");
    at->attrs.set("perm", Attribute::Ints({1, 0}));
    // The Concats' outputs, now made by the batched nodes (names and graph outputs kept).
    auto produce = [&](Node* concat, const char* op, std::vector<Value*> ins, const char* what) {
      Value* out = concat->output(0);
      KILN_RETURN_IF_ERROR(g.remove_node(concat, /*force=*/true));
      Node* n = g.add_node(op, g.unique_name(base + "/" + what), ins, {});
      n->origin = ctx.pass;
      g.set_node_output(n, 0, out);
      return Status::Ok();
    };
    KILN_RETURN_IF_ERROR(produce(m.scores_concat, "GatherND", {topk->output(0), at->output(0)}, "scores"));
    Value* anchors = add("GatherND", {topk->output(1), at->output(0)}, "anchors")->output(0);
    for (const auto& [gv, cc] : m.shared_concats)
      KILN_RETURN_IF_ERROR(produce(cc, "Gather", {gv, anchors}, "gathered"));
    if (m.label_concat) {
      Tensor labels(c0.label_value.dtype(), {k});
      const size_t size = dtype_size(labels.dtype());
      for (int64_t i = 0; i < k; ++i)
        std::memcpy(static_cast<char*>(labels.raw()) + i * size, m.chains[i].label_value.raw(), size);
      Node* row = add("Gather", {nz, constant("row", Tensor::scalar<int64_t>(0))}, "chain");
      KILN_RETURN_IF_ERROR(
          produce(m.label_concat, "Gather", {constant("labels", std::move(labels)), row->output(0)}, "labels"));
    }
    return g.topo_sort();
  }
};

}  // namespace

Expected<bool> batch_select_topk(PassContext& ctx) { return apply_pattern<BatchSelectTopK>(ctx); }

}  // namespace kiln::passes
