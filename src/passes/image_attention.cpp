// Attention over an image's pixels (or windows of them) becomes the sequence-major form
// fold_attention_heads folds, in both layouts timm writes it. Channel-first (timm's Attention2d,
// CoAtNet's and MaxViT's "rw" blocks):
//   x4 = Conv(x, W, b) [B, G*P*D, H, W]; (q, k, v) = Split(Reshape(x4, [B, G, P*D, H*W]), axis 2)
//     (each [B, G, D, S]: per head g its P parts side by side, q at g*P*D + 0, k at + D, ...)
//     =>  W, b with their output channels reordered to part, head, d (q's heads, then k's, ...);
//         xs = Reshape(Transpose(x4, [0,2,3,1]), [B, S, P*G*D]); (qs, ks, vs) = Split(xs, axis 2);
//         q = Transpose(Reshape(qs, [B, S, G, D]), [0,2,3,1])  (k, v alike)
//   y = Reshape(Transpose(attn [B, G, S, D], [0,1,3,2]), [B, G*D, H, W])
//     =>  y = Transpose(Reshape(Reshape(Transpose(attn, [0,2,1,3]), [B, S, G*D]),
//                               [B, H, W, G*D]), [0,3,1,2])
// Both sides then read and write a [B, S, N] tensor, the projections' layout that
// fold_attention_heads reads in place (the three parts now one packed projection); in NHWC
// storage the transposes between the image and [B, S, N] are relabels. The first rewrite needs
// the projection's weights as constants read only here, and parts that reach a kiln.Attention.
// Channels-last (MaxViT's window and grid attention over [B*windows, h, w, C]):
//   Reshape(MatMul(x4 [B, H, W, K], W) (+ b; or their kiln.FusedGemm), [B, H*W, ...])
//     =>  Reshape(MatMul(Reshape(x4, [B, H*W, K]), W) (+ b), [B, H*W, ...])
// the product over the pixels as rows of a [B, S, K] tensor (a relabel of x4), so the head split
// reads the [B, S, N] projection fold_attention_heads expects; only where it reaches an attention.
#include <cstring>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

Value* ints(Graph& g, const std::string& base, std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return g.add_constant(g.unique_name(base), Tensor::from<int64_t>({n}, v));
}

// Adds op(ins) before `pos` with one output of type `t`.
Value* add(PassContext& ctx, Node* pos, const char* op, std::vector<Value*> ins,
           const std::string& base, TensorType t, std::vector<int64_t> perm = {}) {
  const std::string name = ctx.g.unique_name(base);
  Node* n = ctx.g.insert_node_before(pos, op, name, std::move(ins), {name});
  if (!perm.empty()) n->attrs.set("perm", Attribute::Ints(std::move(perm)));
  n->origin = ctx.pass;
  n->output(0)->type = std::move(t);
  return n->output(0);
}

// True when `v` reaches a kiln.Attention through at most `hops` layout ops (a head split's).
bool reaches_attention(const Value* v, int hops) {
  for (const auto& [user, slot] : v->uses()) {
    if (is_kiln_op(user, "Attention")) return true;
    if (hops == 0) continue;
    for (const char* op : {"Transpose", "Reshape", "Split", "Squeeze", "Gather", "Slice"})
      if (is_op(user, op))
        for (const Value* o : user->outputs())
          if (o && reaches_attention(o, hops - 1)) return true;
  }
  return false;
}

struct HeadsOfAnImage {
  struct Match {
    Node* conv;
    Node* reshape;
    Node* split;
    int64_t g, p, d;
  };

  static std::optional<Match> match(PassContext& ctx, Node& s) {
    if (!is_op(&s, "Split") || s.attrs.get_int("axis", 0) != 2 || s.num_outputs() < 2)
      return std::nullopt;
    Node* r = producer_if(s.input(0), "Reshape");
    Node* c = r ? producer_if(r->input(0), "Conv") : nullptr;
    if (!c) return std::nullopt;
    const Graph& g = ctx.g;
    const TensorType& x4 = c->output(0)->type;
    const TensorType& y = r->output(0)->type;
    auto why = [&](const char* w) {
      ctx.note(fmt::format("{}: {}", s.label(), w));
      return std::nullopt;
    };
    if (!x4.has_rank() || x4.rank() != 4 || !y.has_rank() || y.rank() != 4)
      return why("not [B, C, H, W] split as [B, G, P*D, H*W]");
    const auto& xd = *x4.dims;
    const auto& yd = *y.dims;
    if (!xd[1].is_static() || !xd[2].is_static() || !xd[3].is_static() || !yd[1].is_static() ||
        !yd[2].is_static() || !same_dim(xd[0], yd[0]) ||
        !same_dim(yd[3], Dim(xd[2].value * xd[3].value)) ||
        yd[1].value * yd[2].value != xd[1].value)
      return why("the Reshape is not [B, C, H, W] -> [B, G, C/G, H*W]");
    const int64_t parts = static_cast<int64_t>(s.num_outputs());
    if (yd[2].value % parts) return why("the parts are not equal");
    const int64_t d = yd[2].value / parts;
    for (size_t i = 0; i < s.num_outputs(); ++i) {
      const Value* o = s.output(i);
      if (!o || !o->type.has_rank() || o->type.rank() != 4 || !(*o->type.dims)[2].is_static() ||
          (*o->type.dims)[2].value != d || g.is_graph_output(o))
        return why("the parts are not equal");
      if (!reaches_attention(o, 2)) return why("a part does not reach an attention");
    }
    if (!single_use(g, c->output(0)) || !single_use(g, r->output(0)))
      return why("the projection or its Reshape has other readers");
    const Value* w = c->input(1);
    const Value* b = c->num_inputs() > 2 ? c->input(2) : nullptr;
    // A grouped convolution ties its output channels to input groups: they cannot be reordered.
    if (c->attrs.get_int("group", 1) != 1) return why("the projection is a grouped convolution");
    if (!w || !w->is_constant() || (b && !b->is_constant()) || w->uses().size() != 1 ||
        (b && b->uses().size() != 1) || c->output(0)->has_quant_scale() || w->has_quant_scale())
      return why("the projection's weights are not constants of its own");
    return Match{c, r, &s, yd[1].value, parts, d};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const int64_t G = m.g, P = m.p, D = m.d, C = G * P * D;
    // New channel (p, g, d) is old channel (g, p, d).
    std::vector<int64_t> from(static_cast<size_t>(C));
    for (int64_t p = 0; p < P; ++p)
      for (int64_t h = 0; h < G; ++h)
        for (int64_t e = 0; e < D; ++e) from[(p * G + h) * D + e] = (h * P + p) * D + e;
    for (size_t i = 1; i < std::min<size_t>(3, m.conv->num_inputs()); ++i) {
      const Value* v = m.conv->input(i);
      if (!v) continue;
      const Tensor& t = *v->constant;
      const int64_t row = t.numel() / C;
      Tensor u(t.dtype(), t.shape());
      const size_t bytes = static_cast<size_t>(row) * dtype_size(t.dtype());
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(static_cast<uint8_t*>(u.raw()) + c * bytes,
                    static_cast<const uint8_t*>(t.raw()) + from[c] * bytes, bytes);
      g.set_input(m.conv, i, g.add_constant(g.unique_name(v->name + "_by_part"), std::move(u)));
    }
    Value* x4 = m.conv->output(0);
    const auto& xd = *x4->type.dims;
    const DataType dt = x4->type.dtype;
    const Dim B = xd[0], S(xd[2].value * xd[3].value);
    Node* at = m.split;
    Value* hwc = add(ctx, at, "Transpose", {x4}, x4->name + "_hwc",
                     TensorType(dt, {B, xd[2], xd[3], xd[1]}), {0, 2, 3, 1});
    Value* xs = add(ctx, at, "Reshape", {hwc, ints(g, x4->name + "_seq_shape", {0, S.value, C})},
                    x4->name + "_seq", TensorType(dt, {B, S, Dim(C)}));
    std::vector<std::string> names;
    for (int64_t p = 0; p < P; ++p) names.push_back(g.unique_name(xs->name + "_part"));
    Node* split = g.insert_node_before(
        at, "Split", g.unique_name(xs->name + "_split"),
        {xs, ints(g, xs->name + "_widths", std::vector<int64_t>(static_cast<size_t>(P), G * D))},
        names);
    split->attrs.set("axis", Attribute::Int(2));
    split->origin = ctx.pass;
    for (int64_t p = 0; p < P; ++p) {
      Value* part = split->output(static_cast<size_t>(p));
      part->type = TensorType(dt, {B, S, Dim(G * D)});
      Value* heads = add(ctx, at, "Reshape", {part, ints(g, part->name + "_heads", {0, 0, G, D})},
                         part->name + "_heads", TensorType(dt, {B, S, Dim(G), Dim(D)}));
      Value* q = add(ctx, at, "Transpose", {heads}, part->name + "_gds",
                     m.split->output(static_cast<size_t>(p))->type, {0, 2, 3, 1});
      g.replace_all_uses(m.split->output(static_cast<size_t>(p)), q);
    }
    KILN_RETURN_IF_ERROR(g.remove_node(m.split));
    return g.remove_node(m.reshape);
  }
};

struct HeadsToAnImage {
  struct Match {
    Node* transpose;
    Node* reshape;
  };

  // Q comes from HeadsOfAnImage's parts (through at most two of the model's layout ops): only
  // then does fold_attention_heads fold the whole attention.
  static bool from_image_heads(PassContext& ctx, const Node& a) {
    const Node* n = a.input(0) ? a.input(0)->producer : nullptr;
    for (int hop = 0; n && hop < 3; ++hop) {
      if (n->origin == ctx.pass) return true;
      if (!is_op(n, "Transpose") && !is_op(n, "Reshape")) return false;
      n = n->input(0) ? n->input(0)->producer : nullptr;
    }
    return false;
  }

  static std::optional<Match> match(PassContext& ctx, Node& a) {
    if (!is_kiln_op(&a, "Attention") || !from_image_heads(ctx, a)) return std::nullopt;
    Node* t = sole_consumer(ctx.g, a.output(0));
    if (!t || !is_op(t, "Transpose") || transpose_perm(*t) != std::vector<int64_t>{0, 1, 3, 2})
      return std::nullopt;
    Node* r = sole_consumer(ctx.g, t->output(0));
    const TensorType& y = a.output(0)->type;
    if (!r || !is_op(r, "Reshape") || !y.has_rank() || y.rank() != 4 ||
        !r->output(0)->type.has_rank() || r->output(0)->type.rank() != 4)
      return std::nullopt;
    const auto& yd = *y.dims;
    const auto& od = *r->output(0)->type.dims;
    if (!yd[1].is_static() || !yd[3].is_static() || !od[1].is_static() || !od[2].is_static() ||
        !od[3].is_static() || od[1].value != yd[1].value * yd[3].value ||
        !same_dim(yd[2], Dim(od[2].value * od[3].value)) || !same_dim(yd[0], od[0])) {
      ctx.note(fmt::format("{}: its heads are not merged into an image [B, G*D, H, W]", a.label()));
      return std::nullopt;
    }
    return Match{t, r};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* y = m.transpose->input(0);
    const auto& yd = *y->type.dims;
    const auto& od = *m.reshape->output(0)->type.dims;
    const DataType dt = y->type.dtype;
    const int64_t N = od[1].value;
    Node* at = m.reshape;
    Value* sgd = add(ctx, at, "Transpose", {y}, y->name + "_sgd",
                     TensorType(dt, {yd[0], yd[2], yd[1], yd[3]}), {0, 2, 1, 3});
    Value* sn = add(ctx, at, "Reshape", {sgd, ints(g, y->name + "_sn_shape", {0, 0, N})},
                    y->name + "_sn", TensorType(dt, {yd[0], yd[2], Dim(N)}));
    Value* hwn = add(ctx, at, "Reshape",
                     {sn, ints(g, y->name + "_hwn_shape", {0, od[2].value, od[3].value, N})},
                     y->name + "_hwn", TensorType(dt, {yd[0], od[2], od[3], Dim(N)}));
    Value* img = add(ctx, at, "Transpose", {hwn}, y->name + "_image", m.reshape->output(0)->type,
                     {0, 3, 1, 2});
    g.replace_all_uses(m.reshape->output(0), img);
    KILN_RETURN_IF_ERROR(g.remove_node(m.reshape));
    return g.remove_node(m.transpose);
  }
};

struct ProjectionOverImageRows {
  struct Match {
    Node* product;
    Node* bias;  // Add(product, b), or nullptr
  };

  static std::optional<Match> match(PassContext& ctx, Node& r) {
    if (!is_op(&r, "Reshape") || !r.input(0) || !r.input(0)->producer) return std::nullopt;
    Node* p = r.input(0)->producer;
    Node* bias = nullptr;
    if (is_op(p, "Add") && p->input(1) && p->input(1)->is_constant() &&
        p->input(1)->constant->rank() == 1 && p->input(0) && p->input(0)->producer &&
        single_use(ctx.g, p->output(0))) {
      bias = p;
      p = p->input(0)->producer;
    }
    const bool gemm = is_kiln_op(p, "FusedGemm") && p->attrs.get_string("base", "") == "MatMul" &&
                      p->attrs.get_int("int8", 0) == 0 && (p->num_inputs() < 4 || !p->input(3));
    if (!gemm && !is_op(p, "MatMul")) return std::nullopt;
    if (!p->input(0) || !p->input(1) || !p->input(1)->is_constant() ||
        p->input(1)->constant->rank() != 2 || !single_use(ctx.g, p->output(0)))
      return std::nullopt;
    const TensorType& xt = p->input(0)->type;
    const TensorType& rt = r.output(0)->type;
    if (!xt.has_rank() || xt.rank() != 4 || !rt.has_rank() || rt.rank() < 3) return std::nullopt;
    const auto& xd = *xt.dims;
    const auto& rd = *rt.dims;
    if (!xd[1].is_static() || !xd[2].is_static() || !xd[3].is_static() || !same_dim(rd[0], xd[0]) ||
        !rd[1].is_static() || rd[1].value != xd[1].value * xd[2].value)
      return std::nullopt;
    if (!reaches_attention(r.output(0), 4)) {
      ctx.note(fmt::format("{}: the product's rows reach no attention", r.label()));
      return std::nullopt;
    }
    return Match{p, bias};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* x4 = m.product->input(0);
    const auto& xd = *x4->type.dims;
    const Dim S(xd[1].value * xd[2].value);
    Value* rows = add(ctx, m.product, "Reshape",
                      {x4, ints(g, x4->name + "_rows_shape", {0, S.value, xd[3].value})},
                      x4->name + "_rows", TensorType(x4->type.dtype, {xd[0], S, xd[3]}));
    g.set_input(m.product, 0, rows);
    const int64_t n = m.product->input(1)->constant->dim(1);
    for (Node* p : {m.product, m.bias})
      if (p) p->output(0)->type = TensorType(p->output(0)->type.dtype, {xd[0], S, Dim(n)});
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> image_attention(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool a, apply_pattern<HeadsOfAnImage>(ctx));
  KILN_ASSIGN_OR_RETURN(bool b, apply_pattern<HeadsToAnImage>(ctx));
  KILN_ASSIGN_OR_RETURN(bool c, apply_pattern<ProjectionOverImageRows>(ctx));
  return a || b || c;
}

}  // namespace kiln::passes
