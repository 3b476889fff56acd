// Q, K and V of a kiln.MultiHeadAttention read from one [B, S, (H + 2*Hkv)*D] tensor (packed = 1;
// Hkv = H unless grouped-query):
//   MHA(Split(x, [H*D, Hkv*D, Hkv*D], last axis))                =>  MHA(x)[packed]
//   MHA(FusedGemm(X, Wq, bq), FusedGemm(X, Wk, bk), FusedGemm(X, Wv, bv))
//     =>  MHA(FusedGemm(X, [Wq | Wk | Wv], [bq | bk | bv]))[packed]
// The first is GPT-2's c_attn followed by split(); the second makes BERT's and ViT's three
// projections one GEMM (weights concatenated at build time). The attention layer reads the
// three parts through strides, so no Split runs. Each part must be used by the attention only.
#include <cstring>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A projection of X: MatMul or a bias-only FusedGemm[MatMul] with a constant [K, N] weight.
bool plain_projection(const Node* n) {
  if (is_op(n, "MatMul")) return true;
  return is_kiln_op(n, "FusedGemm") && n->attrs.get_string("base", "") == "MatMul" &&
         n->attrs.get_string("activation", "").empty() && !n->input(3) &&
         n->attrs.get_int("int8", 0) == 0;
}

// Concatenates 2-D [K, Ni] weights along axis 1, or 1-D biases (absent ones as zeros).
Tensor concat_last(const std::vector<const Tensor*>& parts, const std::vector<int64_t>& widths,
                   DataType dt, int64_t rows) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  Tensor out(dt, rows == 0 ? std::vector<int64_t>{total} : std::vector<int64_t>{rows, total});
  const size_t es = dtype_size(dt);
  auto* dst = static_cast<uint8_t*>(out.raw());
  std::memset(dst, 0, static_cast<size_t>(out.numel()) * es);
  const int64_t r = std::max<int64_t>(rows, 1);
  int64_t col = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p]) {
      const auto* src = static_cast<const uint8_t*>(parts[p]->raw());
      for (int64_t i = 0; i < r; ++i)
        std::memcpy(dst + (i * total + col) * es, src + i * widths[p] * es, widths[p] * es);
    }
    col += widths[p];
  }
  return out;
}

struct PackQkv {
  struct Match {
    Node* mha;
    Node* split = nullptr;    // form 1
    std::vector<Node*> proj;  // form 2
  };

  static std::optional<Match> match(PassContext& ctx, Node& mha) {
    if (!is_kiln_op(&mha, "MultiHeadAttention") || mha.attrs.get_int("packed", 0) != 0)
      return std::nullopt;
    Value* parts[3] = {mha.input(0), mha.input(1), mha.input(2)};
    for (Value* p : parts)
      if (!p || !single_use(ctx.g, p) || p->type.rank() != 3) return std::nullopt;
    if (parts[0] == parts[1] || parts[1] == parts[2] || parts[0] == parts[2]) return std::nullopt;
    Attributes a = mha.attrs;
    a.set("packed", Attribute::Int(1));
    Node* s = parts[0]->producer;
    if (is_op(s, "Split") && s->num_outputs() == 3 && parts[1]->producer == s &&
        parts[2]->producer == s && parts[0] == s->output(0) && parts[1] == s->output(1) &&
        parts[2] == s->output(2)) {
      const Value* x = s->input(0);
      const int64_t axis = s->attrs.get_int("axis", 0);
      // Q's part is H heads wide, K's and V's Hkv heads each.
      const Dim &wq = parts[0]->type.dims->back(), &wk = parts[1]->type.dims->back();
      const int64_t h = mha.attrs.get_int("num_heads", 0), hkv = mha.attrs.get_int("kv_heads", h);
      if ((axis != -1 && axis != 2) || !wq.is_static() || !wk.is_static() ||
          wq.value * hkv != wk.value * h ||
          !same_dim(x->type.dims->back(), Dim(wq.value + 2 * wk.value)) ||
          !same_dims(parts[1]->type, parts[2]->type)) {
        ctx.note(fmt::format("{}: {} does not split its last axis into Q, K and V heads",
                             mha.label(), s->label()));
        return std::nullopt;
      }
      if (!supported(ctx, mha, a, x)) return std::nullopt;
      return Match{&mha, s, {}};
    }
    std::vector<Node*> proj;
    for (Value* p : parts) {
      Node* n = p->producer;
      if (!plain_projection(n) || !n->input(1)->is_constant() ||
          n->input(1)->constant->rank() != 2 || (n->input(2) && !n->input(2)->is_constant()) ||
          n->input(0) != parts[0]->producer->input(0))
        return std::nullopt;
      const Tensor& w = *n->input(1)->constant;
      if (!proj.empty() && (w.dim(0) != proj[0]->input(1)->constant->dim(0) ||
                            w.dtype() != proj[0]->input(1)->constant->dtype()))
        return std::nullopt;
      proj.push_back(n);
    }
    if (!supported(ctx, mha, a, proj[0]->input(0))) return std::nullopt;
    return Match{&mha, nullptr, proj};
  }

  static bool supported(PassContext& ctx, const Node& mha, const Attributes& a, const Value* x) {
    auto layer =
        scratch_layer("kiln", "MultiHeadAttention",
                      {const_cast<Value*>(x), nullptr, nullptr, mha.input(3)}, a, mha.output(0));
    return ctx.backend_supports("kiln", "MultiHeadAttention", a, x->type.dtype, layer->nodes()[0]);
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* packed = nullptr;
    if (m.split) {
      packed = m.split->input(0);
    } else {
      std::vector<const Tensor*> ws, bs;
      std::vector<int64_t> widths;
      for (Node* p : m.proj) {
        ws.push_back(p->input(1)->constant.get());
        bs.push_back(p->input(2) ? p->input(2)->constant.get() : nullptr);
        widths.push_back(ws.back()->dim(1));
      }
      const Tensor& w0 = *ws[0];
      Value* w = g.add_constant(g.unique_name(m.proj[0]->name + "_qkv_weight"),
                                concat_last(ws, widths, w0.dtype(), w0.dim(0)));
      Value* b = nullptr;
      if (bs[0] || bs[1] || bs[2])
        b = g.add_constant(g.unique_name(m.proj[0]->name + "_qkv_bias"),
                           concat_last(bs, widths, w0.dtype(), 0));
      Node* fused = g.insert_node_before(
          m.mha, "FusedGemm", g.unique_name(m.proj[0]->name + "_qkv"), {m.proj[0]->input(0), w, b},
          {g.unique_name(m.proj[0]->name + "_qkv")}, "kiln");
      fused->attrs.set("base", Attribute::String("MatMul"));
      fused->origin = ctx.pass;
      for (Node* p : m.proj) merge_onnx_nodes(*fused, *p);
      packed = fused->output(0);
    }
    g.set_input(m.mha, 0, packed);
    g.set_input(m.mha, 1, nullptr);
    g.set_input(m.mha, 2, nullptr);
    m.mha->attrs.set("packed", Attribute::Int(1));
    m.mha->origin = ctx.pass;
    if (m.split) merge_onnx_nodes(*m.mha, *m.split);
    for (Node* n : m.split ? std::vector<Node*>{m.split} : m.proj)
      KILN_RETURN_IF_ERROR(g.remove_node(n));
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> pack_qkv(PassContext& ctx) { return apply_pattern<PackQkv>(ctx); }

}  // namespace kiln::passes
