// Rotary position embedding as Hugging Face's Llama-family models write it (rotate_half), on the
// heads of a projection:
//   x = Transpose(Reshape(q [B, S, H*D], [B, S, H, D]), [0, 2, 1, 3])
//   y = x * Unsqueeze(cos, 1) + Concat(-x[..., D/2:], x[..., :D/2]) * Unsqueeze(sin, 1)
//   =>  y = Transpose(Reshape(RotaryEmbedding(q, cos[..., :D/2], sin[..., :D/2], num_heads=H),
//                              [B, S, H, D]), [0, 2, 1, 3])
// RotaryEmbedding (opset 23) rotates pairs (x[k], x[k + D/2]) by the angles its caches give; the
// rotation moves in front of the head split, so fold_attention_heads still sees the plain split
// of a [B, S, H*D] tensor. cos and sin are [B or 1, S, D] or [S, D] whose two halves are provably
// equal: each is made from Concat(f, f) on the last axis by elementwise ops of one input (Cos,
// Sin, Cast, a product by a scalar: HF's attention scaling), so their first halves are the
// caches. Either
// operand order of each Mul and the Add; the slices may write their end as D or past it. The
// cache slices are shared by every layer that reads the same cos and sin.
//
// RotaryOverSplit: rotaries on parts of a Split of x's last axis (pack_gemm's packed Q | K | V
// projection) become one rotary over x that rotates those parts' heads and passes the others:
//   (q, k, v) = Split(x); RotaryEmbedding(q), RotaryEmbedding(k)
//     =>  (q', k', v) = Split(RotaryEmbedding(x, kiln_head_begin = 0, kiln_head_end = H + Hkv))
// The rotaries must share their caches, position ids and attributes and one head size D, and
// rotate consecutive parts that start at a multiple of D; x's width is a multiple of D. pack_qkv
// then reads the Split's three parts as one packed attention input: Llama's attention is one
// GEMM, one rotary and the attention.
//
// RotaryIntoAttention (its own pass, fuse_attention_rotary, after pack_qkv): the rotary joins the
// attention that alone reads it:
//   MHA[packed](RotaryEmbedding(x, cos, sin, pos?, kiln_head_begin = 0, kiln_head_end = H + Hkv))
//     =>  MHA[packed](x, _, _, mask, cos, sin, pos?)           (rotary_interleaved = interleaved)
//   MHA(RotaryEmbedding(q, num_heads = H), RotaryEmbedding(k, num_heads = Hkv), v)
//     =>  MHA(q, k, v, mask, cos, sin, pos?)
// The rotary must cover exactly Q's and K's heads, whole heads (rotary_embedding_dim absent or
// D), with one set of caches, position ids and interleaving; not seq_first. Asked with the
// would-be layer: on the cuda backend only mha.flash applies the rotary (FP16, its head sizes),
// so elsewhere the rotary stays a layer of its own.
#include <algorithm>
#include <cstring>
#include <set>

#include "ops/fused.h"
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// [begin, end) of x's last axis (of length d) that Slice node s takes with step 1, or nullopt.
std::optional<std::pair<int64_t, int64_t>> last_axis_range(const Node* s, const Value* x,
                                                           int64_t d) {
  if (!s || s->input(0) != x) return std::nullopt;
  const int64_t r = x->type.rank();
  const auto sl = axis_slice(s, r);
  if (!sl || sl->axis != r - 1 || sl->step != 1) return std::nullopt;
  auto clamp = [&](int64_t v) { return std::clamp(v < 0 ? v + d : v, int64_t{0}, d); };
  return std::make_pair(clamp(sl->start), clamp(sl->end));
}

// [begin, end) of x's last axis (of length d) that v is: a step-1 Slice of x, or a part of a
// last-axis Split of x; else nullopt.
std::optional<std::pair<int64_t, int64_t>> last_axis_half(const Value* v, const Value* x,
                                                          int64_t d) {
  if (!v || !v->producer) return std::nullopt;
  if (is_op(v->producer, "Slice")) return last_axis_range(v->producer, x, d);
  const auto part = column_part(v);
  if (!part || part->x != x || !is_op(part->node, "Split") || !x->type.has_rank() ||
      !same_dim(x->type.dims->back(), Dim(d)))
    return std::nullopt;
  return std::make_pair(part->start, part->start + part->width);
}

// Whether v's last axis is two equal halves: Concat(f, f) on it, through ops that map each
// element alone (Cos, Sin, Cast, Neg, products and sums with a scalar).
bool halves_equal(const Value* v, int depth = 0) {
  const Node* p = v ? v->producer : nullptr;
  if (!p || depth > 8) return false;
  if (is_op(p, "Concat")) {
    const int64_t axis = p->attrs.get_int("axis", 0);
    return p->num_inputs() == 2 && p->input(0) == p->input(1) && p->input(0) &&
           (axis == -1 || axis == v->type.rank() - 1);
  }
  if (is_op(p, "Cos") || is_op(p, "Sin") || is_op(p, "Cast") || is_op(p, "Neg"))
    return halves_equal(p->input(0), depth + 1);
  if ((is_op(p, "Mul") || is_op(p, "Div") || is_op(p, "Add") || is_op(p, "Sub")) &&
      p->num_inputs() == 2) {
    if (scalar_const(p->input(1))) return halves_equal(p->input(0), depth + 1);
    if (scalar_const(p->input(0))) return halves_equal(p->input(1), depth + 1);
  }
  return false;
}

// c when v = Unsqueeze(c, axes) is [B or 1, 1, S, D] with the head axis (1) among the inserted ones
// and S, D not: c is [B, S, D] (axes [1]) or [S, D] (axes [0, 1]; transformers 5 builds its caches
// without the batch axis), both forms RotaryEmbedding takes without position_ids. Else nullptr.
Value* unsqueezed_cache(const Value* v) {
  const Node* u = v ? v->producer : nullptr;
  if (!is_op(u, "Unsqueeze") || !u->input(0) || v->type.rank() != 4) return nullptr;
  std::vector<int64_t> axes = u->attrs.get_ints("axes");
  if (axes.empty()) {
    const Value* a = u->num_inputs() > 1 ? u->input(1) : nullptr;
    if (!a || !a->is_constant()) return nullptr;
    axes = a->constant->to_int64_vector();
  }
  std::set<int64_t> in;
  for (int64_t a : axes) in.insert(a < 0 ? a + 4 : a);
  const int64_t rank = u->input(0)->type.rank();
  const bool ok = (in == std::set<int64_t>{1} && rank == 3) ||
                  (in == std::set<int64_t>{0, 1} && rank == 2);
  return ok ? u->input(0) : nullptr;
}

// A constant [B or 1, 1, S, D] (the caches folded at static shapes) whose rows are two equal
// halves, bit for bit.
bool constant_halves_cache(const Value* v, int64_t d) {
  if (!v || !v->is_constant() || v->type.rank() != 4) return false;
  const Tensor& t = *v->constant;
  if (t.rank() != 4 || t.dim(1) != 1 || t.dim(3) != d || d % 2) return false;
  const size_t es = dtype_size(t.dtype()), half = static_cast<size_t>(d / 2) * es;
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (int64_t row = 0; row < t.numel() / d; ++row)
    if (std::memcmp(p + row * 2 * half, p + row * 2 * half + half, half) != 0) return false;
  return true;
}

struct FuseRotary {
  struct Match {
    Node* add;
    Node* transpose;  // x's
    Node* reshape;
    std::vector<Node*> dead;  // the products, the Concat, the Neg and the slices
    Value* cos;
    Value* sin;
    int64_t heads, head;
  };

  static std::optional<Match> match(PassContext& ctx, Node& add) {
    if (!is_op(&add, "Add") || add.num_inputs() != 2 || !add.output(0)) return std::nullopt;
    // One product is x * cos, the other rotate_half(x) * sin.
    for (int order = 0; order < 2; ++order) {
      Node* pc = add.input(order) ? add.input(order)->producer : nullptr;
      Node* ps = add.input(1 - order) ? add.input(1 - order)->producer : nullptr;
      if (!is_op(pc, "Mul") || !is_op(ps, "Mul")) continue;
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
          if (auto m = try_match(ctx, add, pc, i, ps, j)) return m;
    }
    return std::nullopt;
  }

  // pc = x (input i) * cos, ps = rot (input j) * sin.
  static std::optional<Match> try_match(PassContext& ctx, Node& add, Node* pc, int i, Node* ps,
                                        int j) {
    Value* x = pc->input(i);
    Node* cat = ps->input(j) ? ps->input(j)->producer : nullptr;
    Node* t = x ? x->producer : nullptr;
    if (!is_op(cat, "Concat") || cat->num_inputs() != 2 || !is_op(t, "Transpose"))
      return std::nullopt;
    if (t->attrs.get_ints("perm") != std::vector<int64_t>{0, 2, 1, 3}) return std::nullopt;
    Node* r = t->input(0) ? t->input(0)->producer : nullptr;
    const auto split = splits_last_axis(r);
    if (!split || r->input(0)->type.rank() != 3 || split->second % 2 != 0) return std::nullopt;
    const int64_t d = split->second, h = d / 2;
    const int64_t cat_axis = cat->attrs.get_int("axis", 0);
    if (cat_axis != -1 && cat_axis != 3) return std::nullopt;
    Node* neg = cat->input(0) ? cat->input(0)->producer : nullptr;
    if (!is_op(neg, "Neg")) return std::nullopt;
    // The halves: two Slices of x, or the two parts of a Split of x (slices_to_split's form).
    const auto hi = last_axis_half(neg->input(0), x, d);
    const auto lo = last_axis_half(cat->input(1), x, d);
    if (!hi || !lo || *hi != std::make_pair(h, d) || *lo != std::make_pair(int64_t{0}, h))
      return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{}: rotate_half form: {}", add.label(), why));
      return std::nullopt;
    };
    Value* cos = pc->input(1 - i);
    Value* sin = ps->input(1 - j);
    if (constant_halves_cache(cos, d) && constant_halves_cache(sin, d)) {
      // folded caches: their halves were compared above
    } else {
      cos = unsqueezed_cache(cos);
      sin = unsqueezed_cache(sin);
      if (!cos || !sin)
        return reject(
            "cos or sin is neither a [B, S, D] or [S, D] cache unsqueezed to [B or 1, 1, S, D] "
            "nor such a constant of two equal halves");
      if (!halves_equal(cos) || !halves_equal(sin))
        return reject("cos or sin is not provably two equal halves (Concat(f, f))");
    }
    const TensorType& xt = x->type;
    if (!is_float_type(xt.dtype) || cos->type.dtype != xt.dtype || sin->type.dtype != xt.dtype)
      return reject("x, cos and sin are not of one float type");
    for (const Value* v : {pc->output(0), ps->output(0), cat->output(0), neg->output(0),
                           neg->input(0), cat->input(1)})
      if (!single_use(ctx.g, v))
        return reject("an intermediate has another reader or is a graph output");
    Node* p_hi = neg->input(0)->producer;
    Node* p_lo = cat->input(1)->producer;
    if (p_hi == p_lo && p_hi->num_outputs() != 2)
      return reject("the halves' Split has other parts");
    Attributes a;
    a.set("num_heads", Attribute::Int(split->first));
    if (!ctx.backend_supports("", "RotaryEmbedding", a, xt.dtype))
      return reject("the backend has no RotaryEmbedding at this type");
    std::vector<Node*> dead = {&add, pc, ps, cat, neg, p_hi};
    if (p_lo != p_hi) dead.push_back(p_lo);
    return Match{&add, t, r, std::move(dead), cos, sin, split->first, d};
  }

  // cache[..., :half], shared: an earlier layer's slice of the same cache is reused. A constant
  // [B or 1, 1, S, D] cache becomes the constant [B or 1, S, D/2].
  static Value* first_half(PassContext& ctx, Value* cache, int64_t half, Node* before) {
    if (cache->is_constant() && cache->type.rank() == 4) {
      const std::string name = cache->name + "_rotary_half";
      if (Value* v = ctx.g.find_value(name)) return v;
      const Tensor& t = *cache->constant;
      Tensor h(t.dtype(), {t.dim(0), t.dim(2), half});
      const size_t bytes = static_cast<size_t>(half) * dtype_size(t.dtype());
      const auto* src = static_cast<const unsigned char*>(t.raw());
      auto* dst = static_cast<unsigned char*>(h.raw());
      for (int64_t row = 0; row < t.dim(0) * t.dim(2); ++row)
        std::memcpy(dst + row * bytes, src + row * 2 * bytes, bytes);
      return ctx.g.add_constant(name, std::move(h));
    }
    for (const auto& [u, slot] : cache->uses()) {
      const auto range = last_axis_range(u, cache, 2 * half);
      if (range && *range == std::make_pair(int64_t{0}, half) && u->origin == ctx.pass &&
          u->num_inputs() == 4)
        return u->output(0);
    }
    Graph& g = ctx.g;
    auto ints = [&](const std::string& n, int64_t v) {
      return g.add_constant(g.unique_name(cache->name + n), Tensor::from<int64_t>({1}, {v}));
    };
    const std::string name = g.unique_name(cache->name + "_half");
    // Right after the cache's producer, so that every layer's rewrite can read it.
    Node* pos = before;
    if (cache->producer) {
      const auto& nodes = g.nodes();
      auto it = std::find(nodes.begin(), nodes.end(), cache->producer);
      if (it != nodes.end() && std::next(it) != nodes.end()) pos = *std::next(it);
    }
    Node* s = g.insert_node_before(
        pos, "Slice", name, {cache, ints("_h0", 0), ints("_h1", half), ints("_hax", -1)}, {name});
    s->origin = ctx.pass;
    s->onnx_nodes = cache->producer ? cache->producer->onnx_nodes : before->onnx_nodes;
    return s->output(0);
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* cos = first_half(ctx, m.cos, m.head / 2, m.transpose);
    Value* sin = first_half(ctx, m.sin, m.head / 2, m.transpose);
    const std::string base = m.add->name;
    const std::string rn = g.unique_name(base + "_rotary");
    Node* rot =
        g.insert_node_before(m.add, "RotaryEmbedding", rn, {m.reshape->input(0), cos, sin}, {rn});
    rot->attrs.set("num_heads", Attribute::Int(m.heads));
    const std::string hn = g.unique_name(base + "_heads");
    Node* heads =
        g.insert_node_before(m.add, "Reshape", hn, {rot->output(0), m.reshape->input(1)}, {hn});
    heads->attrs = m.reshape->attrs;
    const std::string tn = g.unique_name(base + "_t");
    Node* t = g.insert_node_before(m.add, "Transpose", tn, {heads->output(0)}, {tn});
    t->attrs = m.transpose->attrs;
    for (Node* n : {rot, heads, t}) {
      n->origin = ctx.pass;
      n->onnx_nodes = m.add->onnx_nodes;
    }
    // The rotated heads keep their value (and their name, where they are a graph output: a
    // decoder's present K returned for the cache): the new Transpose makes it.
    Value* out = m.add->output(0);
    const bool graph_output = g.is_graph_output(out);
    if (!graph_output) g.replace_all_uses(out, t->output(0));
    for (Node* n : m.dead)  // consumers before producers
      KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
    if (graph_output) g.set_node_output(t, 0, out);
    for (Node* n : {m.transpose, m.reshape})  // the old head split, unless read elsewhere
      if (n->output(0)->uses().empty() && !g.is_graph_output(n->output(0)))
        KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
    g.remove_dead_values();
    return Status::Ok();
  }
};

struct RotaryOverSplit {
  struct Match {
    Node* split;
    std::vector<std::pair<size_t, Node*>> rotaries;  // (part, rotary), parts increasing
    Attributes attrs;                                 // the rotary over x
  };

  static std::optional<Match> match(PassContext& ctx, Node& s) {
    if (!is_op(&s, "Split") || !s.input(0) || !s.input(0)->type.has_rank() ||
        s.input(0)->type.rank() != 3)
      return std::nullopt;
    Value* x = s.input(0);
    const int64_t axis = s.attrs.get_int("axis", 0);
    if (axis != -1 && axis != 2) return std::nullopt;
    std::vector<int64_t> starts;
    int64_t total = 0;
    std::vector<std::pair<size_t, Node*>> rots;
    for (size_t i = 0; i < s.num_outputs(); ++i) {
      const Value* o = s.output(i);
      if (!o || !o->type.has_rank() || !o->type.dims->back().is_static()) return std::nullopt;
      starts.push_back(total);
      total += o->type.dims->back().value;
      for (const auto& [r, slot] : o->uses())
        if (is_op(r, "RotaryEmbedding") && slot == 0) rots.emplace_back(i, r);
    }
    if (rots.empty()) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{}: the rotaries on its parts do not become one: {}", s.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, x)) return reject("its input has other readers");
    const Node* r0 = rots[0].second;
    const int64_t h0 = r0->attrs.get_int("num_heads", 0);
    const Dim& w0 = s.output(rots[0].first)->type.dims->back();
    if (h0 <= 0 || w0.value % h0 != 0) return reject("a rotary's heads do not divide its part");
    const int64_t D = w0.value / h0;
    Attributes common = r0->attrs;
    common.erase("num_heads");
    for (size_t j = 0; j < rots.size(); ++j) {
      const auto& [part, r] = rots[j];
      const Value* o = s.output(part);
      if (!single_use(ctx.g, o)) return reject("a rotated part has other readers");
      if (ctx.g.is_graph_output(r->output(0))) return reject("a rotary's result is a graph output");
      if (j > 0 && part != rots[j - 1].first + 1) return reject("the rotated parts are not adjacent");
      for (size_t k = 1; k < std::max<size_t>(r->num_inputs(), r0->num_inputs()); ++k)
        if (r->input(k) != r0->input(k)) return reject("the rotaries read different caches");
      Attributes a = r->attrs;
      a.erase("num_heads");
      if (a.all().size() != common.all().size()) return reject("the rotaries' attributes differ");
      for (const auto& [name, v] : a.all()) {
        const Attribute* c = common.find(name);
        if (!c || c->str() != v.str()) return reject("the rotaries' attributes differ");
      }
      if (a.has("kiln_head_begin") || a.has("kiln_head_end"))
        return reject("a rotary already has a head range");
      const int64_t h = r->attrs.get_int("num_heads", 0);
      if (h <= 0 || o->type.dims->back().value != h * D)
        return reject("the rotaries' head sizes differ");
    }
    const int64_t begin = starts[rots.front().first];
    const int64_t end = starts[rots.back().first] + s.output(rots.back().first)->type.dims->back().value;
    if (begin % D != 0 || total % D != 0 || !same_dim(x->type.dims->back(), Dim(total)))
      return reject("the parts are not whole heads of x");
    Attributes a = r0->attrs;
    a.set("num_heads", Attribute::Int(total / D));
    a.set("kiln_head_begin", Attribute::Int(begin / D));
    a.set("kiln_head_end", Attribute::Int(end / D));
    std::vector<Value*> ins(r0->inputs().begin(), r0->inputs().end());
    ins[0] = x;
    auto scratch = scratch_layer("", "RotaryEmbedding", ins, a, x);
    if (!ctx.backend_supports("", "RotaryEmbedding", a, x->type.dtype, scratch->nodes().back()))
      return reject("the backend cannot run the rotary over a head range");
    return Match{&s, rots, a};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node* r0 = m.rotaries[0].second;
    std::vector<Value*> ins(r0->inputs().begin(), r0->inputs().end());
    Value* x = m.split->input(0);
    ins[0] = x;
    Node* rot = g.insert_node_before(m.split, "RotaryEmbedding", g.unique_name(r0->name + "_heads"),
                                     ins, {g.unique_name(x->name + "_rotary")});
    rot->attrs = m.attrs;
    rot->origin = ctx.pass;
    rot->output(0)->type = x->type;
    g.set_input(m.split, 0, rot->output(0));
    for (const auto& [part, r] : m.rotaries) {
      merge_onnx_nodes(*rot, *r);
      g.replace_all_uses(r->output(0), m.split->output(part));
    }
    for (const auto& [part, r] : m.rotaries) KILN_RETURN_IF_ERROR(g.remove_node(r));
    return Status::Ok();
  }
};

struct RotaryIntoAttention {
  struct Match {
    Node* mha;
    std::vector<Node*> rotaries;  // Q's (or the packed input's), then K's
    Attributes attrs;             // the attention's, with rotary_interleaved
  };

  static std::optional<Match> match(PassContext& ctx, Node& mha) {
    if (!is_kiln_op(&mha, "MultiHeadAttention") || mha_has_rotary(mha) ||
        mha.attrs.get_int("seq_first", 0) != 0 || mha.attrs.has("col_slices"))
      return std::nullopt;
    const bool packed = mha.attrs.get_int("packed", 0) != 0;
    std::vector<Node*> rots;
    for (int slot = 0; slot < (packed ? 1 : 2); ++slot) {
      Node* r = producer_if(mha.input(slot), "RotaryEmbedding");
      if (!r) return std::nullopt;
      rots.push_back(r);
    }
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{}: the rotary does not join the attention: {}", mha.label(), why));
      return std::nullopt;
    };
    if (!packed && rots[0] == rots[1]) return reject("Q and K are one rotary's result");
    const int64_t h = mha.attrs.get_int("num_heads", 0), hkv = mha.attrs.get_int("kv_heads", h);
    if (h <= 0 || hkv <= 0) return std::nullopt;
    const Node* r0 = rots[0];
    for (size_t j = 0; j < rots.size(); ++j) {
      const Node* r = rots[j];
      const Value* x = r->input(0);
      if (!single_use(ctx.g, r->output(0)))
        return reject("the rotary's result has other readers or is a graph output");
      if (!x || !x->type.has_rank() || x->type.rank() != 3 || !x->type.dims->back().is_static())
        return reject("the rotary's input is not 3-D with a static last dim");
      for (size_t k = 1; k < std::max<size_t>(r->num_inputs(), r0->num_inputs()); ++k)
        if ((k < r->num_inputs() ? r->input(k) : nullptr) !=
            (k < r0->num_inputs() ? r0->input(k) : nullptr))
          return reject("Q's and K's rotaries read different caches");
      if (r->attrs.get_int("interleaved", 0) != r0->attrs.get_int("interleaved", 0))
        return reject("Q's and K's rotaries differ in interleaving");
      for (const auto& [name, v] : r->attrs.all())
        if (name != "num_heads" && name != "interleaved" && name != "kiln_head_begin" &&
            name != "kiln_head_end" && name != "rotary_embedding_dim")
          return reject(fmt::format("the rotary has attribute {}", name));
      // The heads it rotates: exactly Q's and K's.
      const int64_t heads = r->attrs.get_int("num_heads", 0);
      const int64_t want = packed ? h + 2 * hkv : j == 0 ? h : hkv;
      const int64_t end = packed ? h + hkv : want;
      if (heads != want) return reject("the rotary's heads are not the attention's");
      const int64_t d = x->type.dims->back().value / heads;
      if (r->attrs.get_int("kiln_head_begin", 0) != 0 ||
          r->attrs.get_int("kiln_head_end", heads) != end)
        return reject("the rotary's head range is not exactly Q's and K's heads");
      const int64_t rd = r->attrs.get_int("rotary_embedding_dim", 0);
      if (rd != 0 && rd != d) return reject("the rotary turns part of each head only");
    }
    if (!r0->input(1) || !r0->input(2)) return std::nullopt;
    Attributes a = mha.attrs;
    if (r0->attrs.get_int("interleaved", 0) != 0) a.set("rotary_interleaved", Attribute::Int(1));
    std::vector<Value*> ins = inputs(mha, rots);
    auto layer = scratch_layer("kiln", "MultiHeadAttention", ins, a, mha.output(0));
    if (!ctx.backend_supports("kiln", "MultiHeadAttention", a, ins[0]->type.dtype,
                              layer->nodes()[0]))
      return reject("the backend cannot apply the rotary in the attention");
    return Match{&mha, rots, a};
  }

  // The attention's inputs with the rotary: the rotaries' inputs for Q (and K), its own V and
  // mask, the caches and position ids.
  static std::vector<Value*> inputs(const Node& mha, const std::vector<Node*>& rots) {
    std::vector<Value*> ins(mha.inputs().begin(), mha.inputs().end());
    ins.resize(4, nullptr);
    for (size_t j = 0; j < rots.size(); ++j) ins[j] = rots[j]->input(0);
    const Node* r0 = rots[0];
    ins.push_back(r0->input(1));
    ins.push_back(r0->input(2));
    if (r0->num_inputs() > 3 && r0->input(3)) ins.push_back(r0->input(3));
    return ins;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const std::vector<Value*> ins = inputs(*m.mha, m.rotaries);
    for (size_t i = 0; i < ins.size(); ++i) g.set_input(m.mha, i, ins[i]);
    m.mha->attrs = m.attrs;
    m.mha->origin = ctx.pass;
    for (Node* r : m.rotaries) {
      merge_onnx_nodes(*m.mha, *r);
      KILN_RETURN_IF_ERROR(g.remove_node(r));
    }
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fuse_attention_rotary(PassContext& ctx) {
  return apply_pattern<RotaryIntoAttention>(ctx);
}

Expected<bool> fuse_rotary(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool fused, apply_pattern<FuseRotary>(ctx));
  KILN_ASSIGN_OR_RETURN(bool merged, apply_pattern<RotaryOverSplit>(ctx));
  return fused || merged;
}

}  // namespace kiln::passes
