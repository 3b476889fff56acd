// A 2-D product over flattened rows becomes the batched product it stands for:
//   Reshape(Gemm(Reshape(x [.., K], [P, K]), W, C), [.., N])  =>  FusedGemm[MatMul](x, W', C')
//   Reshape(Gemm(...), [.., h, d]) with h*d = N  =>  Reshape(FusedGemm[MatMul](x, W', C'), [.., h,
//   d]) (also FusedGemm[Gemm] with its activation, and MatMul without C)
// W' is W, or W transposed at build time for transB = 1; C' is C as the bias [N]. GPT-2's
// Conv1D exports this way (x.view(-1, K) -> addmm -> view back); folded, the layers around it
// see the [B, S, N] tensors every other transformer has, and the residual and attention
// patterns apply. The leading dims are compared symbolically (every shape of a profile). The
// second form is the head split written onto the flat product (torch 2.5's dynamo export at
// static shapes: [B*S, N] reshaped to [B, S, H, D] at once): the head split then reads a
// [B, S, N] tensor, as fold_attention_heads expects.
#include <cstring>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

Tensor transposed_2d(const Tensor& w) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  Tensor t(w.dtype(), {cols, rows});
  const size_t es = dtype_size(w.dtype());
  const auto* src = static_cast<const uint8_t*>(w.raw());
  auto* dst = static_cast<uint8_t*>(t.raw());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, es);
  return t;
}

struct FoldGemmReshape {
  struct Match {
    Node *gemm, *r2;
    Value* x;
    bool trans_b;
    Attributes attrs;
    bool split;  // the last Reshape splits N: it stays, reading the batched product
  };

  static bool gemm_like(const Node* n) {
    return is_op(n, "Gemm") || is_op(n, "MatMul") ||
           (is_kiln_op(n, "FusedGemm") && !n->input(3) && n->attrs.get_int("int8", 0) == 0);
  }

  static std::optional<Match> match(PassContext& ctx, Node& r2) {
    if (!is_op(&r2, "Reshape")) return std::nullopt;
    Node* g = r2.input(0) ? r2.input(0)->producer : nullptr;
    if (!gemm_like(g) || !single_use(ctx.g, g->output(0))) return std::nullopt;
    Node* r1 = producer_if(g->input(0), "Reshape");
    if (!r1) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{} -> {}: {}", g->label(), r2.label(), why));
      return std::nullopt;
    };
    const bool gemm_attrs = is_op(g, "Gemm") || g->attrs.get_string("base", "") == "Gemm";
    if (gemm_attrs &&
        (g->attrs.get_int("transA", 0) != 0 || g->attrs.get_float("alpha", 1.f) != 1.f ||
         (g->input(2) && g->attrs.get_float("beta", 1.f) != 1.f)))
      return reject("transA, alpha or beta is not the plain product");
    const Value* w = g->input(1);
    const Value* c = g->input(2);
    if (!w || !w->is_constant() || w->constant->rank() != 2)
      return reject("the weight is not a 2-D constant");
    const bool tb = gemm_attrs && g->attrs.get_int("transB", 0) != 0;
    const int64_t N = w->constant->dim(tb ? 0 : 1);
    if (c && (!c->is_constant() || c->constant->numel() != N ||
              (c->constant->rank() == 2 && c->constant->dim(0) != 1) || c->constant->rank() > 2))
      return reject("C is not a constant bias of N values");
    const TensorType &x = r1->input(0)->type, &flat = r1->output(0)->type, &y = r2.output(0)->type;
    if (x.rank() < 3 || flat.rank() != 2 || y.rank() < x.rank() ||
        !same_dim((*flat.dims)[1], x.dims->back()))
      return reject("the reshapes do not flatten and restore the leading dims");
    int64_t tail = 1;  // y's dims past the leading ones: N, or N split
    for (int64_t i = x.rank() - 1; i < y.rank(); ++i)
      tail = (*y.dims)[i].is_static() ? tail * (*y.dims)[i].value : -1;
    if (tail != N) return reject("the last reshape does not restore N (or split it)");
    for (int64_t i = 0; i + 1 < x.rank(); ++i)
      if (!same_dim((*x.dims)[i], (*y.dims)[i]))
        return reject("the leading dims are not provably restored");
    if (!is_float_type(x.dtype)) return reject("not a float type");
    Attributes a;
    for (const auto& [k, v] : g->attrs.all())  // the activation and its act_* attributes
      if (k == "activation" || k.rfind("act_", 0) == 0) a.set(k, v);
    a.set("base", Attribute::String("MatMul"));
    if (!ctx.backend_supports("kiln", "FusedGemm", a, x.dtype)) return std::nullopt;
    return Match{g, &r2, r1->input(0), tb, std::move(a), y.rank() > x.rank()};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const Tensor& w = *m.gemm->input(1)->constant;
    Value* wv = m.gemm->input(1);
    if (m.trans_b) wv = g.add_constant(g.unique_name(wv->name + "_t"), transposed_2d(w));
    Value* bias = m.gemm->input(2);
    if (bias && bias->constant->rank() != 1) {
      KILN_ASSIGN_OR_RETURN(Tensor b, bias->constant->reshaped({bias->constant->numel()}));
      bias = g.add_constant(g.unique_name(bias->name + "_1d"), std::move(b));
    }
    if (!m.split)
      return replace_with_layer(ctx, {m.gemm, m.r2}, "kiln", "FusedGemm", {m.x, wv, bias}, m.attrs,
                                m.r2->output(0))
          .status();
    const std::string name = g.unique_name(m.gemm->name);
    Node* fused = g.insert_node_before(m.gemm, "FusedGemm", name, {m.x, wv, bias}, {name}, "kiln");
    fused->attrs = m.attrs;
    fused->origin = ctx.pass;
    merge_onnx_nodes(*fused, *m.gemm);
    g.set_input(m.r2, 0, fused->output(0));
    return g.remove_node(m.gemm);
  }
};

}  // namespace

Expected<bool> fold_gemm_reshape(PassContext& ctx) { return apply_pattern<FoldGemmReshape>(ctx); }

}  // namespace kiln::passes
