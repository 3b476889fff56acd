// BatchNormalization with constant parameters folded into the layer that produces its input:
//   Conv|ConvTranspose(x, W, b) -> BN  =>  Conv|ConvTranspose(x, W * s, (b - mean) * s + beta)
//   Gemm(a, B, C) -> BN  =>  Gemm(a, B * s, beta*C*s + t)       (per output column)
//   MatMul(a [M,K], B [K,N] const) -> BN  =>  Gemm(a, B * s, t)
//   MatMul(a [..., K], B [K, N] const) -> Flatten|Reshape to [M, N] -> BN
//     =>  MatMul(a, B * s) -> Add(t) -> the Flatten|Reshape     (LeViT's Linear + BatchNorm1d
//         over its tokens: the view keeps the channel axis last, so the BN's channels are the
//         product's columns)
// with s = scale / sqrt(var + eps), t = beta - mean * s. Needs constant weights and BN
// parameters, and the producer's output used by the BN (or the view) only.
#include <cmath>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

Tensor make_like(const Tensor& like, std::vector<int64_t> shape, const std::vector<double>& v) {
  return Tensor::from<double>(std::move(shape), v).cast(like.dtype());
}

struct FoldBatchNorm {
  struct Match {
    Node* producer;
    Node* bn;
    Node* view = nullptr;  // a Flatten/Reshape between a MatMul and the BN
  };

  // A Flatten or Reshape of a MatMul's output to the BN's 2-D input that keeps the last axis (the
  // MatMul's columns stay the BN's channels), read by the BN alone: the MatMul, else nullptr.
  static Node* matmul_behind_view(PassContext& ctx, Node* view, const Node& bn) {
    if (!view || !(is_op(view, "Flatten") || is_op(view, "Reshape")) || !view->input(0))
      return nullptr;
    Node* mm = view->input(0)->producer;
    const TensorType &in = view->input(0)->type, &out = view->output(0)->type;
    if (!is_op(mm, "MatMul") || !single_use(ctx.g, view->output(0)) || !in.dims || !out.dims ||
        out.dims->size() != 2 || in.dims->empty())
      return nullptr;
    const Dim& c = in.dims->back();
    return c.is_static() && c == out.dims->back() ? mm : nullptr;
  }

  static bool const_input(const Node& n, size_t i) {
    return n.input(i) && n.input(i)->is_constant();
  }

  static std::optional<Match> match(PassContext& ctx, Node& bn) {
    if (!is_op(&bn, "BatchNormalization")) return std::nullopt;
    Node* p = bn.input(0) ? bn.input(0)->producer : nullptr;
    Node* view = nullptr;
    if (Node* mm = matmul_behind_view(ctx, p, bn)) view = p, p = mm;
    if (!p || !(is_op(p, "Conv") || is_op(p, "ConvTranspose") || is_op(p, "Gemm") ||
                is_op(p, "MatMul"))) {
      ctx.note(
          fmt::format("{}: input is not made by Conv, ConvTranspose, Gemm or MatMul", bn.label()));
      return std::nullopt;
    }
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{} -> {}: {}", p->label(), bn.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, p->output(0)))
      return reject("the intermediate has another consumer or is a graph output");
    for (size_t i = 1; i <= 4; ++i)
      if (!const_input(bn, i)) return reject("BatchNorm parameters are not constant");
    if (bn.attrs.get_int("training_mode", 0) != 0) return reject("BatchNorm is in training mode");
    for (size_t i = 1; i < bn.num_outputs(); ++i)
      if (bn.output(i) && (!bn.output(i)->uses().empty() || ctx.g.is_graph_output(bn.output(i))))
        return reject("BatchNorm running statistics are used");
    if (!const_input(*p, 1) || (p->input(2) && !const_input(*p, 2)))
      return reject("weights or bias are not constant");
    const int64_t channels = bn.input(1)->constant->numel();
    for (size_t i = 2; i <= 4; ++i)
      if (bn.input(i)->constant->numel() != channels) return reject("parameter sizes differ");
    const Tensor& w = *p->input(1)->constant;
    if (!dtype_is_float(w.dtype())) return reject("weights are not floating point");
    if (p->op_type == "Conv" && (w.rank() < 3 || w.dim(0) != channels))
      return reject("channel count differs");
    if (p->op_type == "ConvTranspose" &&
        (w.rank() < 3 || w.dim(1) * p->attrs.get_int("group", 1) != channels))
      return reject("channel count differs");
    if (p->op_type == "Gemm" || p->op_type == "MatMul") {
      if (w.rank() != 2 || (!view && p->output(0)->type.rank() != 2))
        return reject("not a 2-D product");
      const bool tb = p->op_type == "Gemm" && p->attrs.get_int("transB", 0) != 0;
      if ((tb ? w.dim(0) : w.dim(1)) != channels) return reject("channel count differs");
      if (p->input(2)) {
        const Tensor& c = *p->input(2)->constant;
        if (c.numel() != 1 && c.numel() != channels) return reject("Gemm C is not per-column");
        if (c.numel() != 1 && c.rank() == 2 && c.dim(0) != 1)
          return reject("Gemm C is not per-column");
      }
    }
    return Match{p, &bn, view};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& p = *m.producer;
    Node& bn = *m.bn;
    const double eps = bn.attrs.get_float("epsilon", 1e-5f);
    const auto scale = tensor_values(*bn.input(1)->constant), beta = tensor_values(*bn.input(2)->constant),
               mean = tensor_values(*bn.input(3)->constant), var = tensor_values(*bn.input(4)->constant);
    const size_t C = scale.size();
    std::vector<double> s(C), t(C);
    for (size_t c = 0; c < C; ++c) {
      s[c] = scale[c] / std::sqrt(var[c] + eps);
      t[c] = beta[c] - mean[c] * s[c];
    }
    const Tensor& w = *p.input(1)->constant;
    std::vector<double> wv = tensor_values(w);
    std::vector<double> bias(C, 0.0);
    if (p.input(2)) {
      const Tensor& b = *p.input(2)->constant;
      for (size_t c = 0; c < C; ++c)
        bias[c] = b.at_double(b.numel() == 1 ? 0 : static_cast<int64_t>(c));
    }
    Attributes attrs = p.attrs;
    std::string op = p.op_type;
    if (op == "Conv") {
      const size_t per = wv.size() / C;
      for (size_t i = 0; i < wv.size(); ++i) wv[i] *= s[i / per];
    } else if (op == "ConvTranspose") {
      const size_t mg = static_cast<size_t>(w.dim(1)),
                   inner = wv.size() / static_cast<size_t>(w.dim(0) * w.dim(1));
      const size_t cg =
          static_cast<size_t>(w.dim(0)) / static_cast<size_t>(attrs.get_int("group", 1));
      for (size_t i = 0; i < wv.size(); ++i) {
        const size_t c = i / (mg * inner), j = (i / inner) % mg;
        wv[i] *= s[(c / cg) * mg + j];
      }
    } else {  // Gemm / MatMul: columns of op(B)
      const bool tb = op == "Gemm" && attrs.get_int("transB", 0) != 0;
      const size_t cols = static_cast<size_t>(w.dim(1));
      for (size_t i = 0; i < wv.size(); ++i) wv[i] *= s[tb ? i / cols : i % cols];
      const double gemm_beta = op == "Gemm" ? attrs.get_float("beta", 1.f) : 1.0;
      for (double& b : bias) b *= gemm_beta;
      attrs.set("beta", Attribute::Float(1.f));
      op = "Gemm";
    }
    std::vector<double> bv(C);
    for (size_t c = 0; c < C; ++c) bv[c] = bias[c] * s[c] + t[c];
    if (m.view) return fold_through_view(ctx, m, make_like(w, w.shape(), wv),
                                         make_like(w, {static_cast<int64_t>(C)}, bv));
    Value* w2 =
        ctx.g.add_constant(ctx.g.unique_name(p.name + "_w_bn"), make_like(w, w.shape(), wv));
    Value* b2 = ctx.g.add_constant(ctx.g.unique_name(p.name + "_b_bn"),
                                   make_like(w, {static_cast<int64_t>(C)}, bv));
    KILN_ASSIGN_OR_RETURN(Node * n, replace_with_layer(ctx, {&p, &bn}, "", op, {p.input(0), w2, b2},
                                                       attrs, bn.output(0)));
    (void)n;
    return Status::Ok();
  }

  // MatMul(a, B) -> view -> BN  =>  MatMul(a, w) -> Add(b) -> view, in place.
  static Status fold_through_view(PassContext& ctx, const Match& m, Tensor w, Tensor b) {
    Graph& g = ctx.g;
    Node& mm = *m.producer;
    g.set_input(&mm, 1, g.add_constant(g.unique_name(mm.name + "_w_bn"), std::move(w)));
    const std::string name = g.unique_name(mm.name + "/bn_shift");
    Node* add = g.insert_node_before(m.view, "Add", name,
                                     {mm.output(0), g.add_constant(name + "_b", std::move(b))},
                                     {name});
    add->origin = ctx.pass;
    add->onnx_nodes = m.bn->onnx_nodes;
    add->output(0)->type = mm.output(0)->type;
    g.set_input(m.view, 0, add->output(0));
    merge_onnx_nodes(mm, *m.bn);
    KILN_ASSIGN_OR_RETURN(bool bypassed,
                          bypass_node(g, m.bn, m.bn->output(0), m.view->output(0)));
    if (!bypassed) return KILN_ERROR("{}: cannot remove {}", ctx.pass, m.bn->label());
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fold_batchnorm(PassContext& ctx) { return apply_pattern<FoldBatchNorm>(ctx); }

}  // namespace kiln::passes
