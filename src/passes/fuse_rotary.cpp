// Rotary position embedding as the exporters write it, on heads x [B, H, S, D]:
//   y = x * cos + rot(x) * sin   =>   y = RotaryEmbedding(x, cos', sin', interleaved?)
// rot(x) is Hugging Face's rotate_half, Concat(-x[..., D/2:], x[..., :D/2]) (pairs (x[k],
// x[k + D/2])), or rotate_every_two, stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2) (GPT-J,
// EVA and other image transformers: pairs (x[2k], x[2k + 1]), `interleaved`). cos and sin are
// either constants broadcast along x's last two axes ([S, D] with leading 1s, or [B, 1, S, D];
// the caches folded at static shapes, or an image transformer's fixed patch grid) whose halves
// or pairs are equal bit for bit, or, for rotate_half, [B or 1, S, D] or [S, D] caches
// unsqueezed to [B or 1, 1, S, D] whose two halves are provably equal: each made from
// Concat(f, f) on the last axis by elementwise ops of one input (Cos, Sin, Cast, a product by a
// scalar: HF's attention scaling). cos' and sin' are their first halves (or even elements),
// shared by every layer that reads the same caches. Either operand order of each Mul and the
// Add; the slices may write their end as D or past it. The rotary is ONNX's 4-D form;
// rotary_before_heads (rotary_heads.cpp) moves it in front of the head split.
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

// The pair layout of a rotation: rotate_half pairs (x[k], x[k + D/2]), rotate_every_two pairs
// (x[2k], x[2k + 1]).
enum class Pairs { kHalves, kInterleaved };

// x's last-axis elements (of length d) that Slice s takes as (start, step): 0 or 1, step 2, to
// the end (rotate_every_two's x[..., ::2] and x[..., 1::2]).
std::optional<int64_t> every_other(const Node* s, const Value* x, int64_t d) {
  if (!is_op(s, "Slice") || s->input(0) != x) return std::nullopt;
  const int64_t r = x->type.rank();
  const auto sl = axis_slice(s, r);
  if (!sl || sl->axis != r - 1 || sl->step != 2 || (sl->start != 0 && sl->start != 1))
    return std::nullopt;
  const int64_t end = sl->end < 0 ? sl->end + d : std::min(sl->end, d);
  if (end < d - 1 + sl->start) return std::nullopt;  // short of the last pair
  return sl->start;
}

// The rotation of x, rot(x), as the exporters write it, with its nodes (consumers first):
//   rotate_half:       Concat(-x[..., D/2:], x[..., :D/2])                         (last axis)
//   rotate_every_two:  Reshape(Concat(Unsqueeze(-x[..., 1::2], -1), Unsqueeze(x[..., ::2], -1),
//                                     last axis), x's shape)       (torch.stack(...).flatten(-2))
std::optional<Pairs> rotation_of(Value* rot, Value* x, int64_t d, std::vector<Node*>& nodes) {
  Node* n = rot ? rot->producer : nullptr;
  const int64_t r = x->type.rank();
  auto last_axis = [&](const Node* c, int64_t rank) {
    const int64_t a = c->attrs.get_int("axis", 0);
    return a == -1 || a == rank - 1;
  };
  if (is_op(n, "Concat") && n->num_inputs() == 2 && last_axis(n, r)) {
    Node* neg = producer_if(n->input(0), "Neg");
    if (!neg) return std::nullopt;
    const auto hi = last_axis_half(neg->input(0), x, d);
    const auto lo = last_axis_half(n->input(1), x, d);
    if (!hi || !lo || *hi != std::make_pair(d / 2, d) || *lo != std::make_pair(int64_t{0}, d / 2))
      return std::nullopt;
    Node* p_hi = neg->input(0)->producer;
    Node* p_lo = n->input(1)->producer;
    if (p_hi == p_lo && p_hi->num_outputs() != 2) return std::nullopt;  // a Split of more parts
    nodes = {n, neg, p_hi};
    if (p_lo != p_hi) nodes.push_back(p_lo);
    return Pairs::kHalves;
  }
  if ((is_op(n, "Reshape") || is_op(n, "Flatten")) && rot->type.has_rank() &&
      same_dims(rot->type, x->type)) {
    Node* cat = producer_if(n->input(0), "Concat");
    if (!cat || cat->num_inputs() != 2 || !cat->output(0)->type.has_rank() ||
        cat->output(0)->type.rank() != r + 1 || !last_axis(cat, r + 1))
      return std::nullopt;
    Node* u0 = producer_if(cat->input(0), "Unsqueeze");
    Node* u1 = producer_if(cat->input(1), "Unsqueeze");
    if (!u0 || !u1 || !u0->input(0) || !u1->input(0)) return std::nullopt;
    for (Node* u : {u0, u1})
      if (!u->output(0)->type.has_rank() || u->output(0)->type.rank() != r + 1 ||
          (*u->output(0)->type.dims)[r] != Dim(1))
        return std::nullopt;
    Node* neg = producer_if(u0->input(0), "Neg");
    if (!neg) return std::nullopt;
    Node* s_odd = neg->input(0) ? neg->input(0)->producer : nullptr;
    Node* s_even = u1->input(0)->producer;
    if (every_other(s_odd, x, d) != 1 || every_other(s_even, x, d) != 0) return std::nullopt;
    nodes = {n, cat, u0, u1, neg, s_odd, s_even};
    return Pairs::kInterleaved;
  }
  return std::nullopt;
}

// A constant cache broadcast onto x [.., S, D] along its last two axes: [S, D] with leading 1s,
// or [B, 1, S, D] for a rank-4 x of static batch B; its rows' two halves (rotate_half) or its
// pairs (rotate_every_two) equal bit for bit. Returns the row count of its batch (1 or B).
std::optional<int64_t> constant_cache_rows(const Value* v, const Value* x, int64_t d, Pairs pairs) {
  if (!v || !v->is_constant() || !x->type.has_rank()) return std::nullopt;
  const Tensor& t = *v->constant;
  const std::vector<Dim>& xd = *x->type.dims;
  const int64_t rx = x->type.rank();
  if (t.rank() < 2 || t.rank() > rx || t.dim(t.rank() - 1) != d || d % 2 ||
      !same_dim(xd[rx - 2], Dim(t.dim(t.rank() - 2))))
    return std::nullopt;
  int64_t batch = 1;
  for (int64_t a = 0; a + 2 < t.rank(); ++a) {
    if (t.dim(a) == 1) continue;
    // [B, 1, S, D]: one cache per batch row of a rank-4 x.
    if (a != 0 || t.rank() != 4 || rx != 4 || !same_dim(xd[0], Dim(t.dim(0)))) return std::nullopt;
    batch = t.dim(0);
  }
  const size_t es = dtype_size(t.dtype());
  const auto* p = static_cast<const unsigned char*>(t.raw());
  for (int64_t row = 0; row < t.numel() / d; ++row) {
    const unsigned char* r = p + row * d * es;
    if (pairs == Pairs::kHalves) {
      if (std::memcmp(r, r + d / 2 * es, d / 2 * es) != 0) return std::nullopt;
    } else {
      for (int64_t k = 0; k < d; k += 2)
        if (std::memcmp(r + k * es, r + (k + 1) * es, es) != 0) return std::nullopt;
    }
  }
  return batch;
}

struct FuseRotary {
  struct Match {
    Node* add;
    Value* x;
    std::vector<Node*> dead;  // the products, the rotation's nodes
    Value* cos;
    Value* sin;
    Pairs pairs;
    int64_t head;
    std::optional<int64_t> batch;  // constant caches: their batch rows (1: none)
  };

  static std::optional<Match> match(PassContext& ctx, Node& add) {
    if (!is_op(&add, "Add") || add.num_inputs() != 2 || !add.output(0)) return std::nullopt;
    // One product is x * cos, the other rot(x) * sin.
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
    if (!x || !x->type.has_rank() || x->type.rank() != 4 || !x->type.dims->back().is_static())
      return std::nullopt;
    const int64_t d = x->type.dims->back().value;
    if (d % 2) return std::nullopt;
    std::vector<Node*> rot_nodes;
    const auto pairs = rotation_of(ps->input(j), x, d, rot_nodes);
    if (!pairs) return std::nullopt;
    const char* form = *pairs == Pairs::kHalves ? "rotate_half" : "rotate_every_two";
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{}: {} form: {}", add.label(), form, why));
      return std::nullopt;
    };
    Value* cos = pc->input(1 - i);
    Value* sin = ps->input(1 - j);
    std::optional<int64_t> batch = constant_cache_rows(cos, x, d, *pairs);
    if (batch && constant_cache_rows(sin, x, d, *pairs) == batch) {
      // constant caches: their halves or pairs were compared above
    } else if (*pairs == Pairs::kHalves) {
      batch.reset();
      cos = unsqueezed_cache(cos);
      sin = unsqueezed_cache(sin);
      if (!cos || !sin)
        return reject(
            "cos or sin is neither a [B, S, D] or [S, D] cache unsqueezed to [B or 1, 1, S, D] "
            "nor a constant [S, D] of two equal halves");
      if (!halves_equal(cos) || !halves_equal(sin))
        return reject("cos or sin is not provably two equal halves (Concat(f, f))");
      // Their rows are x's axis 2 (ONNX's [B, H, S, D]), not its heads.
      const TensorType& ct = cos->type;
      if (!ct.has_rank() || !same_dim((*ct.dims)[ct.rank() - 2], (*x->type.dims)[2]))
        return reject("the caches' rows are not x's axis 2 (the sequence of [B, H, S, D])");
    } else {
      return reject("cos or sin is not a constant [S, D] whose pairs are equal");
    }
    const TensorType& xt = x->type;
    if (!is_float_type(xt.dtype) || cos->type.dtype != xt.dtype || sin->type.dtype != xt.dtype)
      return reject("x, cos and sin are not of one float type");
    std::vector<Node*> dead = {&add, pc, ps};
    dead.insert(dead.end(), rot_nodes.begin(), rot_nodes.end());
    for (size_t k = 1; k < dead.size(); ++k)
      for (const Value* o : dead[k]->outputs())
        if (o && !single_use(ctx.g, o))
          return reject("an intermediate has another reader or is a graph output");
    Attributes a;
    if (*pairs == Pairs::kInterleaved) a.set("interleaved", Attribute::Int(1));
    if (!ctx.backend_supports("", "RotaryEmbedding", a, xt.dtype))
      return reject("the backend has no RotaryEmbedding at this type");
    return Match{&add, x, std::move(dead), cos, sin, *pairs, d, batch};
  }

  // The cache's first half (rotate_half) or its even elements (rotate_every_two), shared: an
  // earlier layer's is reused. A constant becomes the constant [S, D/2] or [B, S, D/2].
  static Value* cache_half(PassContext& ctx, const Match& m, Value* cache, Node* before) {
    const int64_t half = m.head / 2;
    if (m.batch) {
      const bool even = m.pairs == Pairs::kInterleaved;
      const std::string name = cache->name + (even ? "_rotary_even" : "_rotary_half");
      if (Value* v = ctx.g.find_value(name)) return v;
      const Tensor& t = *cache->constant;
      const int64_t rows = t.numel() / m.head, s = rows / *m.batch;
      Tensor h =
          *m.batch > 1 ? Tensor(t.dtype(), {*m.batch, s, half}) : Tensor(t.dtype(), {s, half});
      const size_t es = dtype_size(t.dtype());
      const auto* src = static_cast<const unsigned char*>(t.raw());
      auto* dst = static_cast<unsigned char*>(h.raw());
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t k = 0; k < half; ++k)
          std::memcpy(dst + (row * half + k) * es, src + (row * m.head + (even ? 2 * k : k)) * es,
                      es);
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

  // The rotation becomes RotaryEmbedding on the rank-4 x (ONNX's [B, H, S, D] form), which
  // rotary_before_heads then moves in front of the head split where there is one.
  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* cos = cache_half(ctx, m, m.cos, m.add);
    Value* sin = cache_half(ctx, m, m.sin, m.add);
    const std::string rn = g.unique_name(m.add->name + "_rotary");
    Node* rot = g.insert_node_before(m.add, "RotaryEmbedding", rn, {m.x, cos, sin}, {rn});
    if (m.pairs == Pairs::kInterleaved) rot->attrs.set("interleaved", Attribute::Int(1));
    rot->origin = ctx.pass;
    rot->onnx_nodes = m.add->onnx_nodes;
    rot->output(0)->type = m.x->type;
    // The rotated heads keep their value (and their name, where they are a graph output: a
    // decoder's present K returned for the cache).
    Value* out = m.add->output(0);
    const bool graph_output = g.is_graph_output(out);
    if (!graph_output) g.replace_all_uses(out, rot->output(0));
    for (Node* n : m.dead)  // consumers before producers
      KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
    if (graph_output) g.set_node_output(rot, 0, out);
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
        mha.attrs.get_int("seq_first", 0) != 0 || mha.attrs.has("col_slices") ||
        mha.attrs.get_int("kv_head_major", 0) != 0)  // a cache's keys are rotated already
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
