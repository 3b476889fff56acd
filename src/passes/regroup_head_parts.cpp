// A projection whose heads interleave their parts (GPT-NeoX's and Bloom's query_key_value:
// `qkv.view(B, S, H, 3*D)`, then the last axis cut into Q, K and V) is reordered part-major at
// build time, so that Q, K and V are whole, consecutive column ranges, as in every other packed
// projection:
//   y = P(a) [.., N]  (N = H*P*D, columns in (h, p, d) order);  Reshape(y, [.., H, P*D]), the last
//   axis (after Transposes that keep it last) cut into P parts of D
//     =>  y' = P'(a) with columns in (p, h, d) order (the weights' and bias's columns permuted);
//         y  = Reshape(Transpose(Reshape(y', [.., P, H, D]), swap P and H), [.., N])
// P is a product by constant weights: MatMul by a 2-D [K, N] constant, alone or with a constant
// bias of N values added, or kiln.FusedGemm (base MatMul, constant weight and bias, no residual,
// not INT8). The layout ops that restore y are a view the head walk follows (head_walk.h), so
// fold_attention_heads reads Q, K and V as one packed tensor and a rotary on Q and K moves in
// front of the split (rotary_before_heads). Only where the parts reach different inputs of an
// attention (Q, K, V) through layout ops and a rotary: elsewhere (rotate_half's two halves of a
// head, rejoined before the attention) the reorder would only add a copy.
#include <algorithm>
#include <cstring>

#include "ops/shape_values.h"
#include "passes/head_walk.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The constant weight (and bias, or nullptr) of product p, or nullopt.
struct Product {
  Node* mm;   // the MatMul or FusedGemm
  Node* add;  // the bias Add (MatMul + Add), else nullptr
  Value* w;
  Value* b;       // the bias constant, else nullptr
  int bias_slot;  // the bias's input slot of `add` (or 2 of a FusedGemm)
};

std::optional<Product> product_of(const Graph& g, Value* y) {
  Node* p = y ? y->producer : nullptr;
  if (!p) return std::nullopt;
  auto const_weight = [](const Value* w) {
    return w && w->is_constant() && w->constant->rank() == 2;
  };
  auto const_bias = [](const Value* b, const Value* w) {
    return b && b->is_constant() && b->constant->rank() == 1 &&
           b->constant->dim(0) == w->constant->dim(1) &&
           b->constant->dtype() == w->constant->dtype();
  };
  if (is_kiln_op(p, "FusedGemm")) {
    if (p->attrs.get_string("base", "") != "MatMul" || p->input(3) ||
        p->attrs.get_int("int8", 0) != 0 || !const_weight(p->input(1)) ||
        (p->input(2) && !const_bias(p->input(2), p->input(1))))
      return std::nullopt;
    return Product{p, nullptr, p->input(1), p->input(2), 2};
  }
  if (is_op(p, "MatMul"))
    return const_weight(p->input(1))
               ? std::optional<Product>(Product{p, nullptr, p->input(1), nullptr, 0})
               : std::nullopt;
  if (!is_op(p, "Add") || p->num_inputs() != 2) return std::nullopt;
  for (int s = 0; s < 2; ++s) {
    Node* mm = producer_if(p->input(s), "MatMul");
    if (!mm || !const_weight(mm->input(1)) || !const_bias(p->input(1 - s), mm->input(1)) ||
        !single_use(g, mm->output(0)))
      continue;
    return Product{mm, p, mm->input(1), p->input(1 - s), 1 - s};
  }
  return std::nullopt;
}

// The inputs of attentions (bit i: input i, Q, K or V) that v reaches through layout ops,
// rotaries, the rotation's arithmetic and Concats (a partial rotary's halves), within a few steps.
unsigned attention_slots(const Value* v, int depth = 0) {
  if (depth > 12) return 0;
  unsigned slots = 0;
  for (const auto& [u, slot] : v->uses()) {
    if (is_kiln_op(u, "Attention") || is_kiln_op(u, "MultiHeadAttention")) {
      if (slot < 3) slots |= 1u << slot;
      continue;
    }
    if (!layout_op(u) && !is_op(u, "RotaryEmbedding") && !is_op(u, "Mul") && !is_op(u, "Add") &&
        !is_op(u, "Neg"))
      continue;
    for (const Value* o : u->outputs())
      if (o) slots |= attention_slots(o, depth + 1);
  }
  return slots;
}

// Whether the parts reach different inputs of an attention each (Q, K and V), not one input
// together (rotate_half's two halves of a head, rejoined before the attention).
bool parts_of_an_attention(const std::vector<const Value*>& parts) {
  unsigned seen = 0;
  for (const Value* p : parts) {
    const unsigned s = attention_slots(p);
    if (!s || (s & seen)) return false;
    seen |= s;
  }
  return true;
}

// The number of parts P the last axis of r (of width w) is cut into, each read toward an
// attention: a Split into P equal parts, or P step-1 Slices of equal width covering it, after
// Transposes that keep the last axis last. 0 where it is not so cut.
int64_t parts_of(const Value* r, int64_t w) {
  const int64_t rank = r->type.rank();
  for (const auto& [u, slot] : r->uses()) {
    if (is_op(u, "Transpose")) {
      const auto perm = u->attrs.get_ints("perm");
      if (perm.size() == static_cast<size_t>(rank) && perm.back() == rank - 1) {
        if (const int64_t p = parts_of(u->output(0), w)) return p;
      }
      continue;
    }
    if (is_op(u, "Split")) {
      int64_t a = u->attrs.get_int("axis", 0);
      if (a < 0) a += rank;
      const int64_t p = static_cast<int64_t>(u->num_outputs());
      if (a != rank - 1 || p < 2 || w % p) continue;
      std::vector<const Value*> parts;
      for (const Value* o : u->outputs())
        if (o && o->type.has_rank() && o->type.dims->back() == Dim(w / p)) parts.push_back(o);
      if (static_cast<int64_t>(parts.size()) == p && parts_of_an_attention(parts)) return p;
    }
    if (is_op(u, "Slice")) {
      const auto sl = axis_slice(u, rank);
      if (!sl || sl->axis != rank - 1 || sl->step != 1 || sl->start != 0) continue;
      const int64_t d = std::min(sl->end, w);
      if (d <= 0 || d >= w || w % d) continue;
      // The other parts: Slices [k*d, (k+1)*d) of r.
      std::vector<const Value*> parts;
      for (const auto& [s, t] : r->uses()) {
        const auto o = is_op(s, "Slice") ? axis_slice(s, rank) : std::nullopt;
        if (o && o->axis == rank - 1 && o->step == 1 && o->start % d == 0 &&
            std::min(o->end, w) == o->start + d)
          parts.push_back(s->output(0));
      }
      if (static_cast<int64_t>(parts.size()) == w / d && parts_of_an_attention(parts)) return w / d;
    }
  }
  return 0;
}

struct RegroupHeadParts {
  struct Match {
    Node* reshape;
    Product prod;
    int64_t h, p, d;
  };

  static std::optional<Match> match(PassContext& ctx, Node& r) {
    if (!is_op(&r, "Reshape") || !r.input(0) || !r.output(0)) return std::nullopt;
    Value* y = r.input(0);
    const TensorType &yt = y->type, &rt = r.output(0)->type;
    if (!yt.has_rank() || !rt.has_rank() || rt.rank() != yt.rank() + 1 || yt.rank() < 2 ||
        !yt.dims->back().is_static())
      return std::nullopt;
    const std::vector<Dim>&yd = *yt.dims, &rd = *rt.dims;
    for (int64_t a = 0; a + 1 < yt.rank(); ++a)
      if (!same_dim(yd[a], rd[a])) return std::nullopt;
    const Dim &hd = rd[rt.rank() - 2], &wd = rd[rt.rank() - 1];
    if (!hd.is_static() || !wd.is_static() || hd.value < 2 ||
        hd.value * wd.value != yd.back().value)
      return std::nullopt;
    const int64_t p = parts_of(r.output(0), wd.value);
    if (p < 2) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(
          fmt::format("{}: the heads' interleaved parts are not regrouped: {}", r.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, y)) return reject("the projection has other readers");
    const auto prod = product_of(ctx.g, y);
    if (!prod) return reject("the projection is not a product by constant weights");
    return Match{&r, *prod, hd.value, p, wd.value / p};
  }

  // t's columns (its last axis of h*p*d) from (h, p, d) order to (p, h, d).
  static Tensor regrouped(const Tensor& t, int64_t h, int64_t p, int64_t d) {
    Tensor out(t.dtype(), t.shape());
    const int64_t n = h * p * d, rows = t.numel() / n;
    const size_t es = dtype_size(t.dtype());
    const auto* src = static_cast<const unsigned char*>(t.raw());
    auto* dst = static_cast<unsigned char*>(out.raw());
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t pi = 0; pi < p; ++pi)
          std::memcpy(dst + (row * n + (pi * h + hi) * d) * es,
                      src + (row * n + (hi * p + pi) * d) * es, d * es);
    return out;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const Product& pr = m.prod;
    Value* w = g.add_constant(g.unique_name(pr.w->name + "_part_major"),
                              regrouped(*pr.w->constant, m.h, m.p, m.d));
    g.set_input(pr.mm, 1, w);
    if (pr.b) {
      Value* b = g.add_constant(g.unique_name(pr.b->name + "_part_major"),
                                regrouped(*pr.b->constant, m.h, m.p, m.d));
      g.set_input(pr.add ? pr.add : pr.mm, pr.add ? pr.bias_slot : 2, b);
    }
    // y (now part-major) back to the (h, p, d) order its Reshape reads, as a view.
    Value* y = m.reshape->input(0);
    const int64_t rank = y->type.rank();
    auto ints = [&](const std::string& n, std::vector<int64_t> v) {
      const int64_t len = static_cast<int64_t>(v.size());
      return g.add_constant(g.unique_name(y->name + n), Tensor::from<int64_t>({len}, v));
    };
    std::vector<int64_t> split(static_cast<size_t>(rank - 1), 0);  // 0: the dim as it is
    split.insert(split.end(), {m.p, m.h, m.d});
    std::vector<int64_t> perm;
    for (int64_t a = 0; a < rank - 1; ++a) perm.push_back(a);
    perm.insert(perm.end(), {rank, rank - 1, rank + 1});
    std::vector<int64_t> merge(static_cast<size_t>(rank - 1), 0);
    merge.push_back(m.h * m.p * m.d);
    const std::string base = g.unique_name(y->name + "_parts");
    Node* r1 =
        g.insert_node_before(m.reshape, "Reshape", base, {y, ints("_pshape", split)}, {base});
    Node* t =
        g.insert_node_before(m.reshape, "Transpose", base + "_t", {r1->output(0)}, {base + "_t"});
    t->attrs.set("perm", Attribute::Ints(perm));
    Node* r2 = g.insert_node_before(m.reshape, "Reshape", base + "_hpd",
                                    {t->output(0), ints("_mshape", merge)}, {base + "_hpd"});
    for (Node* n : {r1, t, r2}) {
      n->origin = ctx.pass;
      n->onnx_nodes = m.reshape->onnx_nodes;
    }
    g.set_input(m.reshape, 0, r2->output(0));
    g.remove_dead_values();
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> regroup_head_parts(PassContext& ctx) { return apply_pattern<RegroupHeadParts>(ctx); }

}  // namespace kiln::passes
