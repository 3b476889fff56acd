// RMSNormalization recognised from its decomposed form over the trailing axes, as exporters
// write it before opset 23 (Llama, T5, Gemma: x * rsqrt(mean(x^2) + eps) * g):
//   r = Sqrt(ReduceMean(x^2) + eps);  n = x / r  or  x * Reciprocal(r);  [n * g]
//     =>  RMSNormalization(x, g, axis = -k, epsilon = eps)
// x^2 may be Pow(x, 2) or Mul(x, x); g must be a constant of the normalized shape (a missing g
// becomes ones). So a backend implements one RMSNorm layer for old and new exports alike.
// Every intermediate must stay inside the pattern.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseRmsNorm {
  struct Match {
    std::vector<Node*> nodes;
    Value* x;
    Value* out;
    Tensor scale;
    int64_t k;
    float eps;
  };

  // n = x / r, x * Reciprocal(r) or x * (1 / r) (rsqrt as exporters write it):
  // (x, r, the Reciprocal or Div(1, r) node, or nullptr).
  static bool split_normalize(Node& n, Value** x, Value** r, Node** recip) {
    if (is_op(&n, "Div") && n.num_inputs() == 2) {
      *x = n.input(0), *r = n.input(1), *recip = nullptr;
      return true;
    }
    if (!is_op(&n, "Mul") || n.num_inputs() != 2) return false;
    for (int s = 0; s < 2; ++s) {
      Value* in = n.input(static_cast<size_t>(s));
      Node* rc = producer_if(in, "Reciprocal");
      Node* dv = producer_if(in, "Div");
      if (dv && dv->num_inputs() == 2 && is_scalar_const(dv->input(0), 1.0)) rc = dv;
      if (rc) {
        *x = n.input(static_cast<size_t>(1 - s)), *r = rc->input(rc == dv ? 1 : 0), *recip = rc;
        return true;
      }
    }
    return false;
  }

  // x = Sub(y, ReduceMean(y)): the tail of a LayerNorm, which fuse_layernorm takes whole.
  static bool centred(const Value* x) {
    Node* sub = producer_if(x, "Sub");
    Node* rm = sub ? producer_if(sub->input(1), "ReduceMean") : nullptr;
    return rm && rm->input(0) == sub->input(0);
  }

  static std::optional<Match> match(PassContext& ctx, Node& norm_node) {
    Value *x = nullptr, *r = nullptr;
    Node* recip = nullptr;
    if (!split_normalize(norm_node, &x, &r, &recip)) return std::nullopt;
    Node* sqrt = producer_if(r, "Sqrt");
    Node* add_eps = sqrt ? producer_if(sqrt->input(0), "Add") : nullptr;
    Value* ms = nullptr;
    std::optional<double> eps;
    for (int s = 0; add_eps && s < 2 && !eps; ++s)
      if ((eps = scalar_const(add_eps->input(static_cast<size_t>(1 - s)))))
        ms = add_eps->input(static_cast<size_t>(s));
    Node* rm = ms ? producer_if(ms, "ReduceMean") : nullptr;
    Node* sq = rm && rm->input(0) ? rm->input(0)->producer : nullptr;
    const bool square =
        (is_op(sq, "Pow") && sq->input(0) == x && is_scalar_const(sq->input(1), 2.0)) ||
        (is_op(sq, "Mul") && sq->input(0) == x && sq->input(1) == x);
    if (!square) return std::nullopt;
    if (centred(x)) {
      ctx.note(
          fmt::format("{}: x is centred (a LayerNorm, left to fuse_layernorm)", norm_node.label()));
      return std::nullopt;
    }
    const int64_t rank = x->type.rank();
    auto axes = trailing_axes(rm, rank);
    if (!axes) {
      ctx.note(fmt::format("{}: the mean of squares is not over the trailing axes", rm->label()));
      return std::nullopt;
    }
    const int64_t k = static_cast<int64_t>(axes->size());
    std::vector<int64_t> norm;
    for (int64_t i = rank - k; i < rank; ++i) {
      const Dim& dm = (*x->type.dims)[static_cast<size_t>(i)];
      if (!dm.is_static()) {
        ctx.note(fmt::format("{}: the normalized dims are not static", norm_node.label()));
        return std::nullopt;
      }
      norm.push_back(dm.value);
    }
    std::vector<Node*> nodes = {sq, rm, add_eps, sqrt, &norm_node};
    if (recip) nodes.push_back(recip);
    Value* out = norm_node.output(0);
    std::optional<Tensor> scale = absorb_affine(ctx.g, "Mul", norm, nodes, out);
    if (!group_is_closed(ctx.g, nodes, out)) {
      ctx.note(fmt::format("RMSNorm pattern at {}: an intermediate has another consumer",
                           norm_node.label()));
      return std::nullopt;
    }
    const DataType t = x->type.dtype;
    if (!is_float_type(t) || (scale && scale->dtype() != t)) return std::nullopt;
    if (!scale) scale = ones(norm, t);
    if (!ctx.backend_supports("", "RMSNormalization", {}, t)) return std::nullopt;
    return Match{nodes, x, out, *scale, k, static_cast<float>(*eps)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Attributes a;
    a.set("axis", Attribute::Int(-m.k));
    a.set("epsilon", Attribute::Float(m.eps));
    std::vector<Value*> ins = {m.x,
                               g.add_constant(g.unique_name(m.nodes[0]->name + "_scale"), m.scale)};
    // Named after the square, the node that opens the pattern.
    return replace_with_layer(ctx, m.nodes, "", "RMSNormalization", ins, std::move(a), m.out)
        .status();
  }
};

}  // namespace

Expected<bool> fuse_rmsnorm(PassContext& ctx) { return apply_pattern<FuseRmsNorm>(ctx); }

}  // namespace kiln::passes
