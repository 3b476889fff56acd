// LayerNormalization recognised from its decomposed form over the trailing axes:
//   m = ReduceMean(x); d = x - m; v = ReduceMean(d^2); n = d / Sqrt(v + eps); [n * g] [+ b]
//     =>  LayerNormalization(x, g, b, axis = -k, epsilon = eps)
// d^2 may be Pow(d, 2) or Mul(d, d); g and b must be constants of the normalized shape (a
// missing g becomes ones). Every intermediate must stay inside the pattern.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseLayerNorm {
  struct Match {
    std::vector<Node*> nodes;
    Value* x;
    Value* out;
    Tensor scale;
    std::optional<Tensor> bias;
    int64_t k;
    float eps;
  };

  static std::optional<Match> match(PassContext& ctx, Node& div) {
    if (!is_op(&div, "Div")) return std::nullopt;
    Node* sub = producer_if(div.input(0), "Sub");
    Node* sqrt = producer_if(div.input(1), "Sqrt");
    if (!sub || !sqrt) return std::nullopt;
    Node* add_eps = producer_if(sqrt->input(0), "Add");
    Value* var = nullptr;
    std::optional<double> eps;
    for (int s = 0; add_eps && s < 2 && !eps; ++s)
      if ((eps = scalar_const(add_eps->input(static_cast<size_t>(1 - s)))))
        var = add_eps->input(static_cast<size_t>(s));
    Node* rm2 = var ? producer_if(var, "ReduceMean") : nullptr;
    Node* sq = rm2 && rm2->input(0) ? rm2->input(0)->producer : nullptr;
    Value* d = sub->output(0);
    const bool square =
        (is_op(sq, "Pow") && sq->input(0) == d && is_scalar_const(sq->input(1), 2.0)) ||
        (is_op(sq, "Mul") && sq->input(0) == d && sq->input(1) == d);
    Value* x = sub->input(0);
    Node* rm1 = producer_if(sub->input(1), "ReduceMean");
    if (!square || !rm1 || rm1->input(0) != x) return std::nullopt;
    const int64_t rank = x->type.rank();
    auto ax1 = trailing_axes(rm1, rank), ax2 = trailing_axes(rm2, rank);
    if (!ax1 || ax1 != ax2) {
      ctx.note(fmt::format("{}: the means are not over the same trailing axes", div.label()));
      return std::nullopt;
    }
    const int64_t k = static_cast<int64_t>(ax1->size());
    std::vector<int64_t> norm;
    for (int64_t i = rank - k; i < rank; ++i) {
      const Dim& dm = (*x->type.dims)[static_cast<size_t>(i)];
      if (!dm.is_static()) return std::nullopt;
      norm.push_back(dm.value);
    }
    std::vector<Node*> nodes = {rm1, sub, sq, rm2, add_eps, sqrt, &div};
    Value* out = div.output(0);
    std::optional<Tensor> scale = absorb_affine(ctx.g, "Mul", norm, nodes, out);
    std::optional<Tensor> bias = absorb_affine(ctx.g, "Add", norm, nodes, out);
    if (!group_is_closed(ctx.g, nodes, out)) {
      ctx.note(fmt::format("LayerNorm pattern at {}: an intermediate has another consumer",
                           div.label()));
      return std::nullopt;
    }
    if (!is_float_type(x->type.dtype)) return std::nullopt;
    if (!scale) scale = ones(norm, x->type.dtype);
    if (scale->dtype() != x->type.dtype || (bias && bias->dtype() != x->type.dtype))
      return std::nullopt;
    Attributes a;
    if (!ctx.backend_supports("", "LayerNormalization", a, x->type.dtype)) return std::nullopt;
    return Match{nodes, x, out, *scale, bias, k, static_cast<float>(*eps)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Attributes a;
    a.set("axis", Attribute::Int(-m.k));
    a.set("epsilon", Attribute::Float(m.eps));
    std::vector<Value*> ins = {m.x,
                               g.add_constant(g.unique_name(m.nodes[0]->name + "_scale"), m.scale)};
    if (m.bias) ins.push_back(g.add_constant(g.unique_name(m.nodes[0]->name + "_bias"), *m.bias));
    return replace_with_layer(ctx, m.nodes, "", "LayerNormalization", ins, std::move(a), m.out)
        .status();
  }
};

}  // namespace

Expected<bool> fuse_layernorm(PassContext& ctx) { return apply_pattern<FuseLayerNorm>(ctx); }

}  // namespace kiln::passes
