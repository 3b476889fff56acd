// Attention over the heads of projections, merged back afterwards, becomes one layer that reads
// Q, K, V and writes Y in the projections' own layout (no transposes in memory):
//   q4 = the heads of x [B, S, N] (or [S, B, N]) through any chain of layout ops  (k, v alike)
//   y = Reshape(Transpose(kiln.Attention(q4, kt4, v4, mask?), [0,2,1,3]), s)
//     =>  y = Reshape(kiln.MultiHeadAttention(x.., mask?), s)
//         [num_heads = H, scale, nan_to_zero; packed where Q, K, V are parts of one x;
//          seq_first where x is [S, B, N] (output transposed back [2,0,1,3]); the layer's
//          output is [B, S, H*Dv] or [S, B, H*Dv]]
// The chain (Reshape, Transpose, Squeeze, Unsqueeze, Gather, Slice, Split, Expand, Tile, Concat
// of copies) is replayed as a strided view of x (walk_heads, head_walk.h), so any export's head
// split folds: BERT's Transpose(Reshape(q)), GPT-2's Split of c_attn, timm's
// reshape/permute/unbind, nn.MultiheadAttention's unflatten/transpose/select and [S, B*H, D]
// reshapes, dynamo's K transposed through merged dims. K and V may have fewer heads, each repeated
// (grouped-query attention): a repetition is a factor of stride 0 in the view, however it was
// written (HF's repeat_kv as Unsqueeze, Expand and Reshape, in any order with the other layout ops;
// repeat_interleave as a Gather of head indices; Tile or a Concat of copies of one K/V head), and
// the layer reads the Hkv heads in place with kv_heads = Hkv (query head h reads K/V head
// h / (H / Hkv)). Each of Q, K and V may be read from any tensor along its chain (a part of a
// packed projection, or the part itself): the layer takes a choice that makes them one packed
// tensor, else one that makes them three whole ones. K and V may also be tensors already split
// into heads, [B, Hkv, S, D] (a decoder's KV cache: Concat(past, new)), read in place by head
// (kv_heads, kv_head_major) beside a whole Q. Dims are compared symbolically, so the
// fold holds for every shape of the profile. The output's Reshape stays (it costs nothing: the
// output has the transposed result's element order, whatever shape s gives it, [B, S, H*Dv] or
// GPT-2's [B*S, H*Dv]); remove_noops drops it when it is the identity.
#include <algorithm>

#include "ops/shape_values.h"
#include "passes/head_walk.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct Choice {
  const Heads *q, *k, *v;
  bool packed;     // parts of one projection [.., (H + 2 Hkv)*D]; else three whole tensors
  bool seq_first;  // the layer's layout
};

bool is_one(const Dim& d) { return d.is_static() && d.value == 1; }

// Q, K and V read from these bases, if the layer can take them so: split alike (K and V heads
// repeated alike, H a multiple of Hkv), one layout, a shared batch (and K/V sequence), and one
// packed tensor or three whole ones. Else nullopt and why.
std::optional<Choice> choose(const Heads& q, const Heads& k, const Heads& v, const char** why) {
  if (k.h != v.h || k.rep != v.rep || q.rep != 1 || q.h != k.h * k.rep || q.d != k.d) {
    *why = "Q, K and V split differently";
    return std::nullopt;
  }
  // One position of one sequence ([1, 1, N]: a decoding step at batch 1) is either layout: it
  // takes the others' (head-major K and V: batch-first).
  auto either = [](const Heads& h) {
    return !h.head_major && is_one((*h.x->type.dims)[0]) && is_one((*h.x->type.dims)[1]);
  };
  bool sf = false;
  for (const Heads* h : {&q, &k, &v})
    if (!either(*h)) {
      sf = h->seq_first && !h->head_major;
      break;
    }
  bool fits = !q.head_major && k.head_major == v.head_major && !(sf && k.head_major);
  for (const Heads* h : {&q, &k, &v}) fits &= either(*h) || h->head_major || h->seq_first == sf;
  if (!fits) {
    *why = "Q, K and V differ in layout (batch-first, sequence-first, head-major K and V)";
    return std::nullopt;
  }
  const int bx = sf ? 1 : 0, sx = 1 - bx;
  const int kb = k.head_major ? 0 : bx, ks = k.head_major ? 2 : sx;  // K's and V's axes
  const TensorType &qt = q.x->type, &kt = k.x->type, &vt = v.x->type;
  if (!same_dim((*qt.dims)[bx], (*kt.dims)[kb]) || !same_dim((*qt.dims)[bx], (*vt.dims)[kb]) ||
      !same_dim((*kt.dims)[ks], (*vt.dims)[ks])) {
    *why = "Q, K and V do not provably share the batch and K/V the sequence";
    return std::nullopt;
  }
  if (k.head_major) {  // Q whole [B, S, H*D]; K and V whole [B, Hkv, S, D] (heads_from)
    if (q.offset != 0 || (*qt.dims)[2].value != q.h * q.d) {
      *why = "Q is not a whole tensor beside head-major K and V";
      return std::nullopt;
    }
    return Choice{&q, &k, &v, false, false};
  }
  const int64_t d = q.d, nq = q.h * d, nk = k.h * d;
  const bool packed = q.x == k.x && q.x == v.x && q.offset == 0 && k.offset == nq &&
                      v.offset == nq + nk && (*qt.dims)[2].value == nq + 2 * nk;
  const bool separate = !packed && q.offset == 0 && k.offset == 0 && v.offset == 0 &&
                        (*qt.dims)[2].value == nq && (*kt.dims)[2].value == nk &&
                        (*vt.dims)[2].value == k.h * v.d;
  if (!packed && !separate) {
    *why = "Q, K and V are neither one packed projection nor three whole tensors";
    return std::nullopt;
  }
  return Choice{&q, &k, &v, packed, sf};
}

// The nodes the layer replaces: the attention, its output's Transpose t and the ops of the
// layout chains of the choice whose results are read inside the group only. An op whose result is
// also read elsewhere or is a graph output (a decoder's present K and V heads, returned for the
// cache) stays for those readers, and so do the ops before it; the layer reads the projection in
// place all the same.
std::vector<Node*> layer_group(const Graph& g, Node& attn, Node& t, const Choice& c) {
  std::vector<Node*> group = {&attn, &t};
  for (const Heads* hs : {c.q, c.k, c.v})
    for (Node* n : hs->nodes)
      if (std::find(group.begin(), group.end(), n) == group.end()) group.push_back(n);
  auto inside = [&](const Node* n) {
    return std::find(group.begin(), group.end(), n) != group.end();
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 2; i < group.size(); ++i) {
      bool outside = false;
      for (const Value* o : group[i]->outputs()) {
        if (!o) continue;
        outside |= g.is_graph_output(o);
        for (const auto& [user, slot] : o->uses()) outside |= !inside(user);
      }
      if (outside) {
        group.erase(group.begin() + static_cast<std::ptrdiff_t>(i));
        changed = true;
        break;
      }
    }
  }
  return group;
}

struct FoldAttentionHeads {
  struct Match {
    std::vector<Node*> group;
    std::vector<Value*> inputs;  // Q (or packed QKV), K, V, mask
    Value* y;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& attn) {
    if (!is_kiln_op(&attn, "Attention")) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", attn.label(), why));
      return std::nullopt;
    };
    const std::vector<Heads> qs = walk_heads(attn.input(0), "bhsd");
    const std::vector<Heads> ks = walk_heads(attn.input(1), "bhds");
    const std::vector<Heads> vs = walk_heads(attn.input(2), "bhsd");
    if (qs.empty() || ks.empty() || vs.empty())
      return reject("Q, K or V is not a view of the heads of a [B, S, N] or [S, B, N] tensor");
    // The output side: transposed back, then reshaped (any shape keeps the element order).
    Node* t = sole_consumer(ctx.g, attn.output(0));
    if (!is_op(t, "Transpose")) return reject("the output is not transposed back to Q's layout");
    Node* r = sole_consumer(ctx.g, t->output(0));
    if (!is_op(r, "Reshape")) return reject("the transposed output is not reshaped");
    const char* why = "Q, K and V split differently";
    std::optional<Choice> c;
    for (const bool want_packed : {true, false})  // one packed tensor rather than three
      for (size_t i = 0; i < qs.size() && !c; ++i)
        for (size_t j = 0; j < ks.size() && !c; ++j)
          for (size_t l = 0; l < vs.size() && !c; ++l)
            if (auto ch = choose(qs[i], ks[j], vs[l], &why); ch && ch->packed == want_packed)
              c = ch;
    if (!c) return reject(why);
    const std::vector<Node*> group = layer_group(ctx.g, attn, *t, *c);
    const Heads *q = c->q, *k = c->k, *v = c->v;
    const bool packed = c->packed, sf = c->seq_first;
    const TensorType& qt = q->x->type;
    const std::vector<int64_t> back = sf ? std::vector<int64_t>{2, 0, 1, 3}
                                         : std::vector<int64_t>{0, 2, 1, 3};
    if (transpose_perm(*t) != back)
      return reject("the output is not transposed back to Q's layout");
    Attributes a;
    a.set("num_heads", Attribute::Int(q->h));
    if (k->rep > 1) a.set("kv_heads", Attribute::Int(k->h));
    a.set("scale", Attribute::Float(attn.attrs.get_float("scale", 1.f)));
    if (attn.attrs.get_int("nan_to_zero", 0)) a.set("nan_to_zero", Attribute::Int(1));
    if (packed) a.set("packed", Attribute::Int(1));
    if (sf) a.set("seq_first", Attribute::Int(1));
    if (k->head_major) a.set("kv_head_major", Attribute::Int(1));
    Value* mask = attn.input(3);
    std::vector<Value*> ins = {q->x, packed ? nullptr : k->x, packed ? nullptr : v->x, mask};
    Value* y = t->output(0);  // the layer's output: [B, S, H*Dv] once shapes are re-inferred
    TensorType yt(qt.dtype, {(*qt.dims)[0], (*qt.dims)[1], Dim(q->h * v->d)});
    Value probe;
    probe.type = yt;
    auto layer = scratch_layer("kiln", "MultiHeadAttention", ins, a, &probe);
    if (!ctx.backend_supports("kiln", "MultiHeadAttention", a, qt.dtype, layer->nodes()[0]))
      return std::nullopt;
    return Match{group, ins, y, std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, m.group, "kiln", "MultiHeadAttention", m.inputs, m.attrs, m.y)
        .status();
  }
};

}  // namespace

Expected<bool> fold_attention_heads(PassContext& ctx) {
  return apply_pattern<FoldAttentionHeads>(ctx);
}

}  // namespace kiln::passes
