// A rotary embedding on heads ([B, H, S, D], as fuse_rotary makes it from any exporter's
// arithmetic) moves to where the attention kernels can take it:
//
// RotaryPrefixRows: rows of the sequence left unrotated in front (EVA's and other image
// transformers' class and register tokens: `cat([x[:, :, :p], rope(x[:, :, p:])], dim=2)`) are
// rows the caches leave unturned:
//   Concat(x[.., :p, :], RotaryEmbedding(x[.., p:, :], cos, sin), sequence axis)
//     =>  RotaryEmbedding(x, [1 (p rows); cos], [0 (p rows); sin])
// for constant caches without position ids (the rows of a fixed-size image's patches). A row of
// cos 1 and sin 0 returns its input unchanged, so this holds bit for bit.
//
// RotaryBeforeHeads: a rotary on a view of the heads of a 3-D projection x [B, S, N] (any chain
// of layout ops: Transpose(Reshape(q)), timm's packed reshape/permute/unbind, dynamo's slices;
// head_walk.h) rotates those heads of x instead:
//   t4 = heads [h0, h1) of x through layout ops; RotaryEmbedding(t4), and so for every rotary on
//   a view of x
//     =>  x' = RotaryEmbedding(x, num_heads = N / D, kiln_head_begin = h0, kiln_head_end = h1);
//         every reader of x reads x' (the layout chains now carry rotated heads)
// Every rotary on x's views must share caches, position ids and attributes, and together rotate
// one range of whole heads; every other reader of the chains below x must read heads outside that
// range (V, read by the attention), or only their shape. The attention passes then see the plain
// head split of x' (fold_attention_heads), and the rotary joins the attention
// (fuse_attention_rotary) or covers Q and K of a packed projection (fuse_rotary's
// RotaryOverSplit).
#include <algorithm>
#include <cstring>
#include <set>

#include "passes/head_walk.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The [begin, end) rows of x's axis `axis` that v is: a step-1 Slice of x on that axis with
// bounds known at build time, or a part of a Split of x on it. nullopt otherwise.
std::optional<std::pair<int64_t, int64_t>> rows_of(const Value* v, const Value* x, int64_t axis,
                                                   int64_t n) {
  const Node* p = v ? v->producer : nullptr;
  if (!p || p->input(0) != x) return std::nullopt;
  const int64_t rank = x->type.rank();
  if (is_op(p, "Slice")) {
    const auto sl = axis_slice(p, rank);
    if (!sl || sl->axis != axis || sl->step != 1) return std::nullopt;
    auto clamp = [&](int64_t e) { return std::clamp(e < 0 ? e + n : e, int64_t{0}, n); };
    return std::make_pair(clamp(sl->start), clamp(sl->end));
  }
  if (is_op(p, "Split")) {
    int64_t a = p->attrs.get_int("axis", 0);
    if (a < 0) a += rank;
    if (a != axis) return std::nullopt;
    int64_t begin = 0;
    for (const Value* o : p->outputs()) {
      if (!o || !o->type.has_rank() || !(*o->type.dims)[axis].is_static()) return std::nullopt;
      const int64_t w = (*o->type.dims)[axis].value;
      if (o == v) return std::make_pair(begin, begin + w);
      begin += w;
    }
  }
  return std::nullopt;
}

// The rotary's caches as constants [S, D/2] (or [1, S, D/2]) without position ids; else nullptr.
const Tensor* plain_cache(const Node& rot, int slot) {
  if (rot.num_inputs() > 3 && rot.input(3)) return nullptr;
  const Value* c = rot.input(slot);
  if (!c || !c->is_constant()) return nullptr;
  const Tensor& t = *c->constant;
  if (t.rank() == 2 || (t.rank() == 3 && t.dim(0) == 1)) return &t;
  return nullptr;
}

// Concat `cat` of the rotary `old` and slices of x becomes one rotary (inputs `ins`, x first, and
// attributes `a`) over all of x: its result takes the Concat's readers (or name, where it is a
// graph output); the Concat, `old` and the slices (one Split, or Slices) go.
Status replace_concat(PassContext& ctx, Node* cat, Node* old, const std::vector<Value*>& ins,
                      const Attributes& a, const char* suffix) {
  Graph& g = ctx.g;
  const std::string rn = g.unique_name(old->name + suffix);
  Node* rot = g.insert_node_before(cat, "RotaryEmbedding", rn, ins, {rn});
  rot->attrs = a;
  rot->origin = ctx.pass;
  rot->output(0)->type = ins[0]->type;
  merge_onnx_nodes(*rot, *cat);
  merge_onnx_nodes(*rot, *old);
  Value* out = cat->output(0);
  std::vector<Node*> parts = {cat->input(0)->producer, cat->input(1)->producer};
  parts.push_back(old->input(0)->producer);
  const bool graph_output = g.is_graph_output(out);
  if (!graph_output) g.replace_all_uses(out, rot->output(0));
  KILN_RETURN_IF_ERROR(g.remove_node(cat, /*force=*/true));
  KILN_RETURN_IF_ERROR(g.remove_node(old, /*force=*/true));
  for (Node* n : parts) {
    if (!n || n == old || std::find(g.nodes().begin(), g.nodes().end(), n) == g.nodes().end())
      continue;
    bool unused = true;
    for (const Value* o : n->outputs())
      unused &= !o || (o->uses().empty() && !g.is_graph_output(o));
    if (unused) KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
  }
  if (graph_output) g.set_node_output(rot, 0, out);
  g.remove_dead_values();
  return Status::Ok();
}

// RotaryPartialDims: a rotary on the first R features of each head, the rest passed on (GPT-NeoX's
// and Phi's partial rotary: `cat([rope(x[..., :R]), x[..., R:]], -1)`):
//   Concat(RotaryEmbedding(x[..., :R]), x[..., R:], last axis)
//     =>  RotaryEmbedding(x, rotary_embedding_dim = R)
struct RotaryPartialDims {
  struct Match {
    Node* cat;
    Node* rot;
    Value* x;
    int64_t r;
  };

  static std::optional<Match> match(PassContext& ctx, Node& cat) {
    if (!is_op(&cat, "Concat") || cat.num_inputs() != 2 || !cat.output(0)) return std::nullopt;
    Node* rot = producer_if(cat.input(0), "RotaryEmbedding");
    if (!rot || !rot->input(0) || !rot->input(0)->producer || !cat.input(1)) return std::nullopt;
    Value* x = rot->input(0)->producer->input(0);
    if (!x || !x->type.has_rank() || x->type.rank() != 4 || !x->type.dims->back().is_static())
      return std::nullopt;
    int64_t axis = cat.attrs.get_int("axis", 0);
    if (axis < 0) axis += 4;
    const int64_t d = x->type.dims->back().value;
    const auto rotated = rows_of(rot->input(0), x, 3, d);
    const auto passed = rows_of(cat.input(1), x, 3, d);
    if (axis != 3 || !rotated || !passed || rotated->first != 0 ||
        passed->first != rotated->second || passed->second != d || rotated->second == d)
      return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(
          fmt::format("{}: the partial rotary does not cover the heads: {}", cat.label(), why));
      return std::nullopt;
    };
    if (rot->attrs.has("rotary_embedding_dim") || rot->attrs.has("num_heads"))
      return reject("the rotary already turns part of its input");
    for (const Value* v : {cat.input(1), rot->input(0), rot->output(0)})
      if (!single_use(ctx.g, v)) return reject("a part has other readers or is a graph output");
    Attributes a = rot->attrs;
    a.set("rotary_embedding_dim", Attribute::Int(rotated->second));
    if (!ctx.backend_supports("", "RotaryEmbedding", a, x->type.dtype))
      return reject("the backend cannot run a partial rotary");
    return Match{&cat, rot, x, rotated->second};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins(m.rot->inputs().begin(), m.rot->inputs().end());
    ins[0] = m.x;
    Attributes a = m.rot->attrs;
    a.set("rotary_embedding_dim", Attribute::Int(m.r));
    return replace_concat(ctx, m.cat, m.rot, ins, a, "_partial");
  }
};

struct RotaryPrefixRows {
  struct Match {
    Node* cat;
    Node* rot;
    Value* x;
    int64_t p;
  };

  static std::optional<Match> match(PassContext& ctx, Node& cat) {
    if (!is_op(&cat, "Concat") || cat.num_inputs() != 2 || !cat.output(0)) return std::nullopt;
    Node* rot = producer_if(cat.input(1), "RotaryEmbedding");
    if (!rot || !rot->input(0) || !rot->input(0)->producer) return std::nullopt;
    Value* x = rot->input(0)->producer->input(0);
    if (!x || !x->type.has_rank() || (x->type.rank() != 3 && x->type.rank() != 4))
      return std::nullopt;
    const int64_t rank = x->type.rank(), seq = rank == 4 ? 2 : 1;  // ONNX's layouts
    int64_t axis = cat.attrs.get_int("axis", 0);
    if (axis < 0) axis += rank;
    const Dim& sd = (*x->type.dims)[seq];
    if (axis != seq || !sd.is_static()) return std::nullopt;
    const int64_t n = sd.value;
    const auto pre = rows_of(cat.input(0), x, seq, n);
    const auto rest = rows_of(rot->input(0), x, seq, n);
    if (!pre || !rest || pre->first != 0 || rest->first != pre->second || rest->second != n ||
        pre->second == 0)
      return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: the unrotated prefix rows do not join the rotary: {}", cat.label(),
                           why));
      return std::nullopt;
    };
    if (!plain_cache(*rot, 1) || !plain_cache(*rot, 2))
      return reject("the caches are not constants [S, D/2] read without position ids");
    if (rot->attrs.has("kiln_head_begin") || rot->attrs.has("kiln_head_end"))
      return reject("the rotary has a head range");
    for (const Value* v : {cat.input(0), rot->input(0), rot->output(0)})
      if (!single_use(ctx.g, v)) return reject("a part has other readers or is a graph output");
    return Match{&cat, rot, x, pre->second};
  }

  // [fill (p rows); t], as [S, D/2] (t's leading 1 dropped).
  static Tensor with_rows(const Tensor& t, int64_t p, float fill) {
    const int64_t rows = t.dim(t.rank() - 2), w = t.dim(t.rank() - 1);
    Tensor out(t.dtype(), {p + rows, w});
    Tensor f(DataType::kFloat32, {p, w});
    std::fill(f.data<float>(), f.data<float>() + p * w, fill);
    const Tensor fc = f.cast(t.dtype());
    const size_t fb = fc.nbytes();
    std::memcpy(out.raw(), fc.raw(), fb);
    std::memcpy(static_cast<unsigned char*>(out.raw()) + fb, t.raw(), t.nbytes());
    return out;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    std::vector<Value*> ins = {m.x};
    for (int slot : {1, 2}) {
      const Value* c = m.rot->input(slot);
      const std::string name = fmt::format("{}_from_row{}", c->name, m.p);
      Value* v = g.find_value(name);
      if (!v) v = g.add_constant(name, with_rows(*c->constant, m.p, slot == 1 ? 1.f : 0.f));
      ins.push_back(v);
    }
    return replace_concat(ctx, m.cat, m.rot, ins, m.rot->attrs, "_all_rows");
  }
};

struct RotaryBeforeHeads {
  struct Match {
    Value* x;
    std::vector<Node*> rotaries;
    Attributes attrs;  // the rotary over x
  };

  // The heads [begin, end) of x (in elements of its last axis) that t reads, with head size d,
  // or nullopt where t is not a batch-first view of x's heads (without repetition, unless
  // `repeated`: grouped-query K or V read by an attention).
  static std::optional<std::pair<int64_t, int64_t>> heads_of(Value* t, const Value* x,
                                                             const char (&order)[5], int64_t* d,
                                                             bool repeated = false) {
    if (!t->type.has_rank() || t->type.rank() != 4) return std::nullopt;
    for (const Heads& hs : walk_heads(t, order))
      if (hs.x == x && (hs.rep == 1 || repeated) && !hs.seq_first) {
        if (d) *d = hs.d;
        return std::make_pair(hs.offset, hs.offset + hs.h * hs.d);
      }
    return std::nullopt;
  }

  static bool same_rotary(const Node& a, const Node& b) {
    if (std::max(a.num_inputs(), b.num_inputs()) > 4) return false;
    for (size_t k = 1; k < 4; ++k)
      if ((k < a.num_inputs() ? a.input(k) : nullptr) !=
          (k < b.num_inputs() ? b.input(k) : nullptr))
        return false;
    if (a.attrs.all().size() != b.attrs.all().size()) return false;
    for (const auto& [name, v] : a.attrs.all()) {
      const Attribute* o = b.attrs.find(name);
      if (!o || o->str() != v.str()) return false;
    }
    return true;
  }

  static bool rank4_rotary(const Node* n, int slot) {
    return is_op(n, "RotaryEmbedding") && slot == 0 && n->input(0)->type.has_rank() &&
           n->input(0)->type.rank() == 4 && !n->attrs.has("kiln_head_begin") &&
           !n->attrs.has("kiln_head_end") && !n->attrs.has("num_heads");
  }

  static std::optional<Match> match(PassContext& ctx, Node& r) {
    if (!rank4_rotary(&r, 0)) return std::nullopt;
    for (const Heads& hs : walk_heads(r.input(0), "bhsd"))
      if (hs.rep == 1 && !hs.seq_first)
        if (auto m = try_base(ctx, r, hs.x)) return m;
    return std::nullopt;
  }

  static std::optional<Match> try_base(PassContext& ctx, Node& r, Value* x) {
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{}: the rotary does not move in front of the head split of {}: {}",
                           r.label(), x->name, why));
      return std::nullopt;
    };
    const TensorType& xt = x->type;
    if (!xt.has_rank() || xt.rank() != 3 || !xt.dims->back().is_static()) return std::nullopt;
    if (ctx.g.is_graph_output(x)) return reject("it is a graph output");
    // Every value below x through layout ops, and the readers beyond them (the leaves).
    struct Leaf {
      Node* node;
      int slot;
      Value* v;
    };
    std::vector<Value*> tree = {x};
    std::vector<Leaf> leaves;
    for (size_t i = 0; i < tree.size(); ++i) {
      if (i > 0 && ctx.g.is_graph_output(tree[i])) return reject("a view of it is a graph output");
      for (const auto& [u, slot] : tree[i]->uses()) {
        if (!layout_op(u) || slot != 0) {
          leaves.push_back({u, slot, tree[i]});
          continue;
        }
        for (Value* o : u->outputs())
          if (o && std::find(tree.begin(), tree.end(), o) == tree.end()) tree.push_back(o);
      }
      if (tree.size() > 256) return reject("too many views");
    }
    // Rotaries like r on views of x rotate [lo, hi) of its last axis; the other readers read
    // heads outside it, or only the shape.
    std::vector<Node*> rots;
    std::vector<std::pair<int64_t, int64_t>> rotated, other;
    int64_t d = 0;
    for (const Leaf& l : leaves) {
      if (l.v == x) return reject("it has a reader besides its head split");
      if (is_op(l.node, "Shape") || is_op(l.node, "Size")) continue;
      if (rank4_rotary(l.node, l.slot) && same_rotary(*l.node, r)) {
        int64_t du = 0;
        const auto range = heads_of(l.v, x, "bhsd", &du);
        if (!range) return reject("a rotary reads a view that is not whole heads of it");
        if (d && du != d) return reject("the rotaries' head sizes differ");
        d = du;
        if (std::find(rots.begin(), rots.end(), l.node) == rots.end()) {
          rots.push_back(l.node);
          rotated.push_back(*range);
        }
        continue;
      }
      std::optional<std::pair<int64_t, int64_t>> range = heads_of(l.v, x, "bhsd", nullptr, true);
      if (!range) range = heads_of(l.v, x, "bhds", nullptr, true);
      if (!range)
        return reject(fmt::format("{} reads a view that is not whole heads", l.node->label()));
      other.push_back(*range);
    }
    if (std::find(rots.begin(), rots.end(), &r) == rots.end()) return std::nullopt;
    std::sort(rotated.begin(), rotated.end());
    for (size_t i = 1; i < rotated.size(); ++i)
      if (rotated[i].first != rotated[i - 1].second)
        return reject("the rotated heads are not one range");
    const int64_t lo = rotated.front().first, hi = rotated.back().second;
    for (const auto& [a, b] : other)
      if (a < hi && lo < b) return reject("another reader reads rotated heads");
    const int64_t n = xt.dims->back().value;
    if (d <= 0 || n % d || lo % d) return reject("the rotated heads are not whole heads of it");
    for (Node* u : rots)
      if (ctx.g.is_graph_output(u->output(0)) &&
          (u->input(0)->uses().size() != 1 || !u->input(0)->producer))
        return reject("a rotary's result is a graph output and its input is read elsewhere");
    // The caches and position ids must not be computed from the views the rotary will now
    // feed (a cycle; the pipeline re-sorts the nodes after the pass, so their order is free).
    std::vector<const Value*> up(r.inputs().begin() + 1, r.inputs().end());
    std::set<const Value*> seen;
    while (!up.empty()) {
      const Value* v = up.back();
      up.pop_back();
      if (!v || !seen.insert(v).second) continue;
      if (v != x && std::find(tree.begin(), tree.end(), v) != tree.end())
        return reject("its caches are computed from the heads it rotates");
      if (seen.size() > 4096) return reject("its caches' computation is too large to check");
      if (v->producer)
        for (const Value* in : v->producer->inputs()) up.push_back(in);
    }
    Attributes a = r.attrs;
    a.set("num_heads", Attribute::Int(n / d));
    if (lo != 0 || hi != n) {
      a.set("kiln_head_begin", Attribute::Int(lo / d));
      a.set("kiln_head_end", Attribute::Int(hi / d));
    }
    std::vector<Value*> ins(r.inputs().begin(), r.inputs().end());
    ins[0] = x;
    auto scratch = scratch_layer("", "RotaryEmbedding", ins, a, x);
    if (!ctx.backend_supports("", "RotaryEmbedding", a, xt.dtype, scratch->nodes().back()))
      return reject("the backend cannot run the rotary over the projection");
    return Match{x, rots, a};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node* r0 = m.rotaries[0];
    std::vector<Value*> ins(r0->inputs().begin(), r0->inputs().end());
    ins[0] = m.x;
    // Before x's first reader, so every chain can read it.
    Node* first = nullptr;
    for (Node* n : g.nodes())
      for (const auto& [u, slot] : m.x->uses())
        if (u == n && !first) first = n;
    Node* rot = g.insert_node_before(first, "RotaryEmbedding", g.unique_name(r0->name + "_heads"),
                                     ins, {g.unique_name(m.x->name + "_rotary")});
    rot->attrs = m.attrs;
    rot->origin = ctx.pass;
    rot->output(0)->type = m.x->type;
    const auto readers = m.x->uses();  // a copy: set_input changes them
    for (const auto& [u, slot] : readers)
      if (u != rot) g.set_input(u, slot, rot->output(0));
    for (Node* r : m.rotaries) {
      merge_onnx_nodes(*rot, *r);
      Value* in = r->input(0);
      Value* out = r->output(0);
      if (g.is_graph_output(out)) {
        // The rotated heads keep their name (a decoder's present K): the chain's last op makes it.
        Node* p = in->producer;
        size_t idx = 0;
        while (p->output(idx) != in) ++idx;
        KILN_RETURN_IF_ERROR(g.remove_node(r, /*force=*/true));
        g.replace_all_uses(in, out);
        g.set_node_output(p, idx, out);
      } else {
        g.replace_all_uses(out, in);
        KILN_RETURN_IF_ERROR(g.remove_node(r, /*force=*/true));
      }
    }
    g.remove_dead_values();
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> rotary_before_heads(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool dims, apply_pattern<RotaryPartialDims>(ctx));
  KILN_ASSIGN_OR_RETURN(bool rows, apply_pattern<RotaryPrefixRows>(ctx));
  KILN_ASSIGN_OR_RETURN(bool moved, apply_pattern<RotaryBeforeHeads>(ctx));
  return dims || rows || moved;
}

}  // namespace kiln::passes
