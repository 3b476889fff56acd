// Attention over heads split from [B, S, H*D] tensors, merged back afterwards, becomes one layer
// that reads Q, K, V and writes Y in the projections' own layout (no transposes in memory):
//   q4 = Transpose(Reshape(q, [B, S, H, D]), [0,2,1,3])     (v4 alike)
//   kt4 = Transpose(Reshape(k, [B, S, H, D]), [0,2,3,1])
//   y = Reshape(Transpose(kiln.Attention(q4, kt4, v4, mask?), [0,2,1,3]), s)
//     =>  y = Reshape(kiln.MultiHeadAttention(q, k, v, mask?), s)
//         [num_heads = H, scale, nan_to_zero; the layer's output is [B, S, H*Dv]]
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
  std::vector<Node*> nodes;
};

// v4 = Transpose(Reshape(x, [.., H, D]), perm), each used once.
std::optional<Heads> split_heads(const Graph& g, Value* v4, const std::vector<int64_t>& perm) {
  Node* t = producer_if(v4, "Transpose");
  if (!t || !single_use(g, v4) || transpose_perm(*t) != perm) return std::nullopt;
  Node* r = t->input(0) ? t->input(0)->producer : nullptr;
  const auto hd = splits_last_axis(r);
  if (!hd || !single_use(g, t->input(0)) || r->input(0)->type.rank() != 3) return std::nullopt;
  return Heads{r->input(0), hd->first, hd->second, {r, t}};
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
    const auto k = split_heads(ctx.g, attn.input(1), {0, 2, 3, 1});
    const auto v = split_heads(ctx.g, attn.input(2), {0, 2, 1, 3});
    if (!q || !k || !v) return reject("Q, K or V is not a head split of a [B, S, H*D] tensor");
    if (q->h != k->h || q->h != v->h || q->d != k->d) return reject("Q, K and V split differently");
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
