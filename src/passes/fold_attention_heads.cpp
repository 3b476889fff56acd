// Attention over the heads of projections, merged back afterwards, becomes one layer that reads
// Q, K, V and writes Y in the projections' own layout (no transposes in memory):
//   q4 = the heads of x [B, S, N] (or [S, B, N]) through any chain of layout ops  (k, v alike)
//   y = Reshape(Transpose(kiln.Attention(q4, kt4, v4, mask?), [0,2,1,3]), s)
//     =>  y = Reshape(kiln.MultiHeadAttention(x.., mask?), s)
//         [num_heads = H, scale, nan_to_zero; packed where Q, K, V are parts of one x;
//          seq_first where x is [S, B, N] (output transposed back [2,0,1,3]); the layer's
//          output is [B, S, H*Dv] or [S, B, H*Dv]]
// The chain (Reshape, Transpose, Squeeze, Unsqueeze, Gather, Slice, Split, Expand, Tile, Concat
// of copies) is replayed as a strided view of x (walk_heads), so any export's head split folds:
// BERT's Transpose(Reshape(q)), GPT-2's Split of c_attn, timm's reshape/permute/unbind,
// nn.MultiheadAttention's unflatten/transpose/select and [S, B*H, D] reshapes, dynamo's K
// transposed through merged dims. K and V may have fewer heads, each repeated (grouped-query
// attention): a repetition is a factor of stride 0 in the view, however it was written (HF's
// repeat_kv as Unsqueeze, Expand and Reshape, in any order with the other layout ops;
// repeat_interleave as a Gather of head indices; Tile or a Concat of copies of one K/V head), and
// the layer reads the Hkv heads in place with kv_heads = Hkv (query head h reads K/V head
// h / (H / Hkv)). Each of Q, K and V may be read from any tensor along its chain (a part of a
// packed projection, or the part itself): the layer takes a choice that makes them one packed
// tensor, else one that makes them three whole ones. Dims are compared symbolically, so the
// fold holds for every shape of the profile. The output's Reshape stays (it costs nothing: the
// output has the transposed result's element order, whatever shape s gives it, [B, S, H*Dv] or
// GPT-2's [B*S, H*Dv]); remove_noops drops it when it is the identity.
#include <algorithm>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct Heads {
  Value* x = nullptr;  // [B, S, N] or, sequence-first, [S, B, N]
  int64_t h = 0, d = 0;
  int64_t rep = 1;         // each head repeated rep times (grouped-query attention's K and V)
  int64_t offset = 0;      // of head 0 in x's last axis (a part of a packed projection)
  bool seq_first = false;  // x is [S, B, N]
  std::vector<Node*> nodes;
};

// --- the layout walk ------------------------------------------------------------------------
// A chain of layout ops from a 3-D tensor x to a head tensor, followed as a strided view of x:
// every dim of the view is a list of factors (outer to inner), each a size and a stride that is
// a multiple of one of x's axes' strides, so a reshape that merges dims whose strides do not
// line up (nn.MultiheadAttention's [S, B*H, D]) stays exact. Sizes may be symbolic (a dynamic
// batch or sequence); reshapes regroup factors by comparing sizes symbolically.

struct Factor {
  Dim size;
  int axis = 0;      // x's axis whose stride this is a multiple of; -1: a repetition
  int64_t mult = 0;  // the stride in units of that axis's stride (0 for a repetition)
};
constexpr int kRepeat = -1;           // the axis of a stride-0 factor (Expand, Tile, copies)
using ViewDim = std::vector<Factor>;  // no factors: size 1

struct View {
  std::vector<ViewDim> dims;
  int64_t off[3] = {0, 0, 0};  // per axis of x
};

bool unknown(const Dim& d) { return !d.is_static() && d.symbol.empty(); }
bool is_one(const Dim& d) { return d.is_static() && d.value == 1; }

// The dims' factors, outer to inner, without size-1 ones.
std::vector<Factor> flatten(const std::vector<ViewDim>& dims) {
  std::vector<Factor> f;
  for (const ViewDim& d : dims)
    for (const Factor& x : d)
      if (!is_one(x.size)) f.push_back(x);
  return f;
}

// The view reshaped to `to` (every dim known), splitting a static factor where a new dim ends
// inside it; false where the factors cannot be regrouped so (symbolic sizes that do not divide).
bool reshape(View& v, const std::vector<Dim>& to) {
  std::vector<Factor> flat = flatten(v.dims);
  std::vector<ViewDim> dims;
  size_t i = 0;
  for (const Dim& t : to) {
    if (unknown(t)) return false;
    ViewDim dim;
    Dim acc(1);
    while (!same_dim(acc, t)) {
      const Dim need = div_dims(t, acc);
      if (i == flat.size() || unknown(need)) return false;
      Factor& f = flat[i];
      if (!unknown(div_dims(need, f.size))) {  // the whole factor fits
        dim.push_back(f);
        acc = mul_dims(acc, f.size);
        ++i;
      } else if (f.size.is_static() && need.is_static() && f.size.value % need.value == 0) {
        const int64_t inner = f.size.value / need.value;  // the new dim ends inside f
        dim.push_back({need, f.axis, f.mult * inner});
        f.size = Dim(inner);
        acc = t;
      } else {
        return false;
      }
    }
    dims.push_back(std::move(dim));
  }
  if (i != flat.size()) return false;
  v.dims = std::move(dims);
  return true;
}

// The dim repeated `times` times as a whole (Tile's order: the copy index outermost).
void repeat_outer(ViewDim& dim, int64_t times) {
  if (times > 1) dim.insert(dim.begin(), Factor{Dim(times), kRepeat, 0});
}

// Gather of axis a with 1-D constant indices that repeat the axis's n elements: each r times in
// a row (repeat_interleave: i / r) or the whole axis r times (Tile: i % n).
bool gather_repeat(View& v, int64_t a, const Tensor& idx) {
  if (idx.rank() != 1) return false;
  std::vector<Factor> f;
  for (const Factor& x : v.dims[a])
    if (!is_one(x.size)) f.push_back(x);
  if (f.size() > 1 || (f.size() == 1 && !f[0].size.is_static())) return false;
  const int64_t n = f.empty() ? 1 : f[0].size.value, m = idx.numel();
  if (m % n != 0) return false;
  const int64_t rep = m / n;
  bool interleave = true, tile = true;
  for (int64_t i = 0; i < m; ++i) {
    int64_t j = idx.at_int(i);
    if (j < 0) j += n;
    interleave &= j == i / rep;
    tile &= j == i % n;
  }
  if (interleave) {
    if (rep > 1) f.push_back(Factor{Dim(rep), kRepeat, 0});
    v.dims[a] = f;
    return true;
  }
  if (!tile) return false;
  v.dims[a] = f;
  repeat_outer(v.dims[a], rep);
  return true;
}

// Expand to `out`'s (known) shape: a dim of size 1 broadcast to a larger one is a repetition.
bool expand(View& v, const Node& n, const Value* out) {
  const Value* in = n.input(0);
  if (!out->type.has_rank() || !in->type.has_rank()) return false;
  const std::vector<Dim>&od = *out->type.dims, &id = *in->type.dims;
  const size_t ro = od.size(), ri = id.size();
  if (ri != v.dims.size() || ro < ri) return false;
  std::vector<ViewDim> dims;
  for (size_t i = 0; i < ro; ++i) {
    const Dim& o = od[i];
    if (unknown(o)) return false;
    if (i < ro - ri) {  // a new leading dim
      dims.push_back(is_one(o) ? ViewDim{} : ViewDim{Factor{o, kRepeat, 0}});
      continue;
    }
    const size_t j = i - (ro - ri);
    if (same_dim(o, id[j])) {
      dims.push_back(v.dims[j]);
    } else if (is_one(id[j])) {
      dims.push_back({Factor{o, kRepeat, 0}});
    } else {
      return false;
    }
  }
  v.dims = std::move(dims);
  return true;
}

// Applies layout op n (whose input is the view) to the view, as it makes `out`; false where it is
// not a layout op the walk knows or does not keep the view exact.
bool apply(View& v, const Node& n, const Value* out) {
  const int64_t r = static_cast<int64_t>(v.dims.size());
  if (is_op(&n, "Transpose")) {
    const std::vector<int64_t> p = transpose_perm(n);
    if (static_cast<int64_t>(p.size()) != r) return false;
    std::vector<ViewDim> d;
    for (int64_t a : p) d.push_back(v.dims[a]);
    v.dims = std::move(d);
    return true;
  }
  if (is_op(&n, "Reshape") || is_op(&n, "Flatten") || is_op(&n, "Squeeze") ||
      is_op(&n, "Unsqueeze")) {
    if (!out->type.has_rank()) return false;
    return reshape(v, *out->type.dims);  // each a reshape to its (known) output shape
  }
  if (is_op(&n, "Gather")) {  // one constant index of an axis, or a repetition of its elements
    const Value* idx = n.input(1);
    if (!idx || !idx->is_constant()) return false;
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r) return false;
    if (idx->constant->numel() != 1) return gather_repeat(v, a, *idx->constant);
    const ViewDim& dim = v.dims[a];
    std::vector<Factor> f;
    for (const Factor& x : dim)
      if (!is_one(x.size)) f.push_back(x);
    int64_t i = idx->constant->at_int(0);
    if (f.size() > 1) return false;
    if (!f.empty()) {
      if (!f[0].size.is_static()) return false;
      if (i < 0) i += f[0].size.value;
      if (i < 0 || i >= f[0].size.value) return false;
      if (f[0].axis != kRepeat) v.off[f[0].axis] += i * f[0].mult;
    } else if (i != 0 && i != -1) {
      return false;
    }
    if (idx->constant->rank() == 0)
      v.dims.erase(v.dims.begin() + a);
    else
      v.dims[a] = {};
    return true;
  }
  if (is_op(&n, "Split")) {  // one part: a range of one axis, after the parts before it
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r || v.dims[a].size() != 1 || !v.dims[a][0].size.is_static() ||
        !out->type.has_rank() || !(*out->type.dims)[a].is_static())
      return false;
    int64_t begin = 0;
    for (size_t k = 0; k < n.num_outputs() && n.output(k) != out; ++k) {
      const Value* o = n.output(k);
      if (!o || !o->type.has_rank() || !(*o->type.dims)[a].is_static()) return false;
      begin += (*o->type.dims)[a].value;
    }
    Factor& f = v.dims[a][0];
    const int64_t len = (*out->type.dims)[a].value;
    if (begin + len > f.size.value) return false;
    if (f.axis != kRepeat) v.off[f.axis] += begin * f.mult;
    f.size = Dim(len);
    return true;
  }
  if (is_op(&n, "Expand")) return expand(v, n, out);
  if (is_op(&n, "Tile")) {
    const auto reps = known_shape_value(n.input(1));
    if (!reps || static_cast<int64_t>(reps->size()) != r) return false;
    for (int64_t a = 0; a < r; ++a) {
      if (!(*reps)[a].value || *(*reps)[a].value < 1) return false;
      repeat_outer(v.dims[a], *(*reps)[a].value);
    }
    return true;
  }
  if (is_op(&n, "Concat")) {  // copies of one tensor: a Tile of one axis
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r) return false;
    for (size_t i = 1; i < n.num_inputs(); ++i)
      if (n.input(i) != n.input(0)) return false;
    repeat_outer(v.dims[a], static_cast<int64_t>(n.num_inputs()));
    return true;
  }
  if (is_op(&n, "Slice")) {  // a step-1 range of one axis
    const auto sl = axis_slice(&n, r);
    if (!sl || sl->step != 1 || v.dims[sl->axis].size() != 1) return false;
    Factor& f = v.dims[sl->axis][0];
    if (!f.size.is_static()) return false;
    auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + f.size.value : x, int64_t{0},
                                                    f.size.value); };
    const int64_t b = clamp(sl->start), e = clamp(sl->end);
    if (e <= b) return false;
    if (f.axis != kRepeat) v.off[f.axis] += b * f.mult;
    f.size = Dim(e - b);
    return true;
  }
  return false;
}

bool layout_op(const Node* n) {
  for (const char* op : {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather",
                         "Slice", "Split", "Expand", "Tile", "Concat"})
    if (is_op(n, op)) return true;
  return false;
}

// The heads t4 reads when chain[0..n) (chain[0] makes t4) replays as a view of x, the input of
// chain[n - 1]; see walk_heads.
std::optional<Heads> heads_from(Value* t4, const char (&order)[5],
                                const std::vector<Node*>& chain,
                                const std::vector<const Value*>& made, size_t n) {
  Value* x = chain[n - 1]->input(0);
  if (!x->type.has_rank() || x->type.rank() != 3 || t4->type.rank() != 4) return std::nullopt;
  const std::vector<Dim>& xd = *x->type.dims;
  if (!xd[2].is_static()) return std::nullopt;
  View v;
  for (int a = 0; a < 3; ++a) v.dims.push_back({{xd[a], a, 1}});
  for (size_t i = n; i-- > 0;)
    if (!apply(v, *chain[i], made[i])) return std::nullopt;
  // One factor a dim (none: size 1), at the expected axes and strides.
  std::optional<Factor> at[4];
  int pos[4];  // b, h, s, d in t4's dims
  for (int i = 0; i < 4; ++i) pos[std::string("bhsd").find(order[i])] = i;
  int64_t rep = 1;  // the head dim's repetition: its innermost factor, of stride 0
  for (int i = 0; i < 4; ++i) {
    std::vector<Factor> f;
    for (const Factor& x : v.dims[pos[i]])
      if (!is_one(x.size)) f.push_back(x);
    if (i == 1 && !f.empty() && f.back().axis == kRepeat) {
      if (!f.back().size.is_static()) return std::nullopt;
      rep = f.back().size.value;
      f.pop_back();
    }
    // Any other repetition (of the batch, the sequence, or the heads in Tile's order) is not
    // grouped-query attention's.
    if (f.size() > 1 || (!f.empty() && f[0].axis == kRepeat)) return std::nullopt;
    if (!f.empty()) at[i] = f[0];
  }
  const auto& [fb, fh, fs, fd] = at;
  const std::vector<Dim>& td = *t4->type.dims;
  if (!td[pos[1]].is_static() || !td[pos[3]].is_static() || td[pos[1]].value % rep)
    return std::nullopt;
  const int64_t h = td[pos[1]].value / rep, d = td[pos[3]].value;
  if (!fd || fd->axis != 2 || fd->mult != 1 || (h > 1 && (!fh || fh->axis != 2 || fh->mult != d)))
    return std::nullopt;
  // The sequence's axis decides the layout; the batch has the other one, whole.
  int s_axis = fs ? fs->axis : -1, b_axis = fb ? fb->axis : -1;
  if (s_axis < 0) s_axis = b_axis == 0 ? 1 : 0;
  if (b_axis < 0) b_axis = 1 - s_axis;
  if (s_axis == 2 || b_axis + s_axis != 1) return std::nullopt;
  if ((fs && (fs->mult != 1 || !same_dim(fs->size, xd[s_axis]))) ||
      (fb && (fb->mult != 1 || !same_dim(fb->size, xd[b_axis]))) ||
      (!fs && !is_one(xd[s_axis])) || (!fb && !is_one(xd[b_axis])))
    return std::nullopt;
  if (v.off[0] || v.off[1] || v.off[2] % d || v.off[2] + h * d > xd[2].value) return std::nullopt;
  Heads hs{x, h, d, rep, v.off[2], b_axis == 1, {}};
  hs.nodes.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
  return hs;
}

// The heads t4 reads, when t4 (dims in `order`: for Q and V b, h, s, d; for K^T b, h, d, s) is
// x [B, S, N] or [S, B, N] through layout ops alone: head h's element (b, s, d) at
// x[b, s, offset + (h / rep)*D + d] (x's first two axes swapped for sequence-first). Every x up
// the chain that works, the farthest first (a chain may start at a 2-D product reshaped to 3-D:
// then the 3-D tensor is x; a part of a packed projection is an x, and so is the projection).
std::vector<Heads> walk_heads(Value* t4, const char (&order)[5]) {
  std::vector<Node*> chain;
  std::vector<const Value*> made;  // what each op of the chain makes on the way
  Value* x = t4;
  while (x->producer && layout_op(x->producer) && x->producer->input(0)) {
    chain.push_back(x->producer);
    made.push_back(x);
    x = x->producer->input(0);
  }
  std::vector<Heads> found;
  for (size_t n = chain.size(); n > 0; --n)
    if (auto hs = heads_from(t4, order, chain, made, n)) found.push_back(std::move(*hs));
  return found;
}

struct Choice {
  const Heads *q, *k, *v;
  bool packed;  // parts of one projection [.., (H + 2 Hkv)*D]; else three whole tensors
};

// Q, K and V read from these bases, if the layer can take them so: split alike (K and V heads
// repeated alike, H a multiple of Hkv), one layout, a shared batch (and K/V sequence), and one
// packed tensor or three whole ones. Else nullopt and why.
std::optional<Choice> choose(const Heads& q, const Heads& k, const Heads& v, const char** why) {
  if (k.h != v.h || k.rep != v.rep || q.rep != 1 || q.h != k.h * k.rep || q.d != k.d) {
    *why = "Q, K and V split differently";
    return std::nullopt;
  }
  if (q.seq_first != k.seq_first || q.seq_first != v.seq_first) {
    *why = "Q, K and V differ in layout (batch-first, sequence-first)";
    return std::nullopt;
  }
  const int bx = q.seq_first ? 1 : 0, sx = 1 - bx;
  const TensorType &qt = q.x->type, &kt = k.x->type, &vt = v.x->type;
  if (!same_dim((*qt.dims)[bx], (*kt.dims)[bx]) || !same_dim((*qt.dims)[bx], (*vt.dims)[bx]) ||
      !same_dim((*kt.dims)[sx], (*vt.dims)[sx])) {
    *why = "Q, K and V do not provably share the batch and K/V the sequence";
    return std::nullopt;
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
  return Choice{&q, &k, &v, packed};
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
    const bool packed = c->packed, sf = q->seq_first;
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
