// Attention over heads split from [B, S, H*D] tensors, merged back afterwards, becomes one layer
// that reads Q, K, V and writes Y in the projections' own layout (no transposes in memory):
//   q4 = Transpose(Reshape(q, [B, S, H, D]), [0,2,1,3])     (v4 alike)
//   kt4 = Transpose(Reshape(k, [B, S, H, D]), [0,2,3,1])
//   y = Reshape(Transpose(kiln.Attention(q4, kt4, v4, mask?), [0,2,1,3]), s)
//     =>  y = Reshape(kiln.MultiHeadAttention(q, k, v, mask?), s)
//         [num_heads = H, scale, nan_to_zero; the layer's output is [B, S, H*Dv]]
// K and V may have fewer heads, each repeated (grouped-query attention: HF's repeat_kv, an
// Unsqueeze, Expand and Reshape of the [B, Hkv, S, D] heads; K then transposed (0,1,3,2)): the
// layer reads them in place with kv_heads = Hkv.
// The Reshapes of Q, K and V must provably split only the last axis for every shape of the
// profile (splits_last_axis compares dims symbolically). The output's Reshape stays (it costs
// nothing: the [B, S, H*Dv] output has the transposed result's element order, whatever shape
// s gives it, [B, S, H*Dv] or GPT-2's [B*S, H*Dv]); remove_noops drops it when it is the
// identity.
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct Heads {
  Value* x = nullptr;  // [B, S, H*D]
  int64_t h = 0, d = 0;
  int64_t rep = 1;  // each head repeated rep times (grouped-query attention's K and V)
  std::vector<Node*> nodes;
};

// v4 = Transpose(Reshape(x, [.., H, D]), perm), each used once.
std::optional<Heads> split_heads(const Graph& g, Value* v4, const std::vector<int64_t>& perm) {
  Node* t = producer_if(v4, "Transpose");
  if (!t || !single_use(g, v4) || transpose_perm(*t) != perm) return std::nullopt;
  Node* r = t->input(0) ? t->input(0)->producer : nullptr;
  const auto hd = splits_last_axis(r);
  if (!hd || !single_use(g, t->input(0)) || r->input(0)->type.rank() != 3) return std::nullopt;
  return Heads{r->input(0), hd->first, hd->second, 1, {r, t}};
}

// Grouped-query attention's repeat of K's or V's heads as Hugging Face writes it (repeat_kv):
//   v4 = Reshape(Expand(Unsqueeze(y4 [B, G, S, D], axes [2]), [B, G, rep, S, D]), [B, G*rep, S, D])
// with y4 a head split: every head of y4 appears rep times in a row. The dims are compared
// symbolically, so the Expand provably repeats only the inserted axis for every shape.
std::optional<Heads> repeated_heads(const Graph& g, Value* v4) {
  Node* r = producer_if(v4, "Reshape");
  Node* e = r ? producer_if(r->input(0), "Expand") : nullptr;
  Node* u = e ? producer_if(e->input(0), "Unsqueeze") : nullptr;
  if (!u || !single_use(g, v4) || !single_use(g, r->input(0)) || !single_use(g, e->input(0)))
    return std::nullopt;
  std::vector<int64_t> axes = u->attrs.get_ints("axes");
  if (axes.empty() && u->num_inputs() > 1 && u->input(1) && u->input(1)->is_constant())
    axes = u->input(1)->constant->to_int64_vector();
  if (axes != std::vector<int64_t>{2} && axes != std::vector<int64_t>{-3}) return std::nullopt;
  const TensorType &yt = u->input(0)->type, &et = e->output(0)->type, &rt = v4->type;
  if (yt.rank() != 4 || et.rank() != 5 || rt.rank() != 4) return std::nullopt;
  const auto &y = *yt.dims, &ex = *et.dims, &rs = *rt.dims;
  if (!ex[2].is_static() || !y[1].is_static() || !rs[1].is_static() ||
      rs[1].value != y[1].value * ex[2].value || !same_dim(ex[0], y[0]) ||
      !same_dim(ex[1], y[1]) || !same_dim(ex[3], y[2]) || !same_dim(ex[4], y[3]) ||
      !same_dim(rs[0], y[0]) || !same_dim(rs[2], y[2]) || !same_dim(rs[3], y[3]))
    return std::nullopt;
  auto hs = split_heads(g, u->input(0), {0, 2, 1, 3});
  if (!hs) return std::nullopt;
  hs->rep = ex[2].value;
  hs->nodes.insert(hs->nodes.end(), {u, e, r});
  return hs;
}

// K^T [B, H, D, S]: a head split transposed (0,2,3,1), or repeated heads transposed (0,1,3,2).
std::optional<Heads> key_heads(const Graph& g, Value* kt4) {
  if (auto hs = split_heads(g, kt4, {0, 2, 3, 1})) return hs;
  Node* t = producer_if(kt4, "Transpose");
  if (!t || !single_use(g, kt4) || transpose_perm(*t) != std::vector<int64_t>{0, 1, 3, 2})
    return std::nullopt;
  auto hs = repeated_heads(g, t->input(0));
  if (hs) hs->nodes.push_back(t);
  return hs;
}

// V [B, H, S, D]: a head split, or repeated heads.
std::optional<Heads> value_heads(const Graph& g, Value* v4) {
  if (auto hs = split_heads(g, v4, {0, 2, 1, 3})) return hs;
  return repeated_heads(g, v4);
}

struct FoldAttentionHeads {
  struct Match {
    std::vector<Node*> group;
    Value *q, *k, *v, *mask, *y;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& attn) {
    if (!is_kiln_op(&attn, "Attention")) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", attn.label(), why));
      return std::nullopt;
    };
    const auto q = split_heads(ctx.g, attn.input(0), {0, 2, 1, 3});
    const auto k = key_heads(ctx.g, attn.input(1));
    const auto v = value_heads(ctx.g, attn.input(2));
    if (!q || !k || !v) return reject("Q, K or V is not a head split of a [B, S, H*D] tensor");
    if (k->h != v->h || k->rep != v->rep || q->h != k->h * k->rep || q->d != k->d)
      return reject("Q, K and V split differently");
    const TensorType &qt = q->x->type, &kt = k->x->type, &vt = v->x->type;
    if (!same_dim((*qt.dims)[0], (*kt.dims)[0]) || !same_dim((*qt.dims)[0], (*vt.dims)[0]) ||
        !same_dim((*kt.dims)[1], (*vt.dims)[1]))
      return reject("Q, K and V do not provably share the batch and K/V the sequence");
    // The output side: transposed back, then reshaped (any shape keeps the element order).
    Node* t = sole_consumer(ctx.g, attn.output(0));
    if (!is_op(t, "Transpose") || transpose_perm(*t) != std::vector<int64_t>{0, 2, 1, 3})
      return reject("the output is not transposed back to [B, S, H, Dv]");
    Node* r = sole_consumer(ctx.g, t->output(0));
    if (!is_op(r, "Reshape")) return reject("the transposed output is not reshaped");
    Attributes a;
    a.set("num_heads", Attribute::Int(q->h));
    if (k->rep > 1) a.set("kv_heads", Attribute::Int(k->h));
    a.set("scale", Attribute::Float(attn.attrs.get_float("scale", 1.f)));
    if (attn.attrs.get_int("nan_to_zero", 0)) a.set("nan_to_zero", Attribute::Int(1));
    Value* mask = attn.input(3);
    Value* y = t->output(0);  // the layer's output: [B, S, H*Dv] once shapes are re-inferred
    TensorType yt(qt.dtype, {(*qt.dims)[0], (*qt.dims)[1], Dim(q->h * v->d)});
    Value probe;
    probe.type = yt;
    auto layer = scratch_layer("kiln", "MultiHeadAttention", {q->x, k->x, v->x, mask}, a, &probe);
    if (!ctx.backend_supports("kiln", "MultiHeadAttention", a, qt.dtype, layer->nodes()[0]))
      return std::nullopt;
    std::vector<Node*> group = {&attn, t};
    for (const Heads* hs : {&*q, &*k, &*v})
      group.insert(group.end(), hs->nodes.begin(), hs->nodes.end());
    return Match{group, q->x, k->x, v->x, mask, y, std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, m.group, "kiln", "MultiHeadAttention", {m.q, m.k, m.v, m.mask},
                              m.attrs, m.y)
        .status();
  }
};

}  // namespace

Expected<bool> fold_attention_heads(PassContext& ctx) {
  return apply_pattern<FoldAttentionHeads>(ctx);
}

}  // namespace kiln::passes
