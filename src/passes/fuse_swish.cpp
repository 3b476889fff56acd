// Swish (SiLU) recognised from the form every PyTorch exporter writes for nn.SiLU / F.silu:
//   Mul(x, Sigmoid(x))  (either operand order)                   =>  Swish(x)
//   Mul(x, Sigmoid(Mul(x, a)))  (a a scalar constant)             =>  Swish(x, alpha=a)
// ONNX's own op since opset 24; as one op it is an activation that convolutions and matrix
// products take in their epilogue (fuse_conv_act), as EfficientNet's and RegNet's layers and
// Llama's SwiGLU gate need. The Sigmoid's value must be used by the Mul only.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseSwish {
  struct Match {
    Node* mul;
    Node* sigmoid;
    Node* scale;  // the Mul(x, a) inside the Sigmoid, or nullptr
    Value* x;
    float alpha;
  };

  static std::optional<Match> match(PassContext& ctx, Node& mul) {
    if (!is_op(&mul, "Mul") || mul.num_inputs() != 2 || !mul.output(0)) return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      Value* x = mul.input(static_cast<size_t>(1 - side));
      Node* sig = producer_if(mul.input(static_cast<size_t>(side)), "Sigmoid");
      if (!sig || !x || !is_float_type(x->type.dtype)) continue;
      Value* u = sig->input(0);
      Match m{&mul, sig, nullptr, x, 1.0f};
      if (u != x) {
        Node* sc = u ? u->producer : nullptr;
        Value* inner = nullptr;
        std::optional<double> a;
        if (is_op(sc, "Mul") && sc->num_inputs() == 2)
          for (int k = 0; k < 2 && !inner; ++k)
            if (sc->input(static_cast<size_t>(k)) == x &&
                (a = scalar_const(sc->input(static_cast<size_t>(1 - k)))))
              inner = x;
        if (!inner) continue;
        if (!single_use(ctx.g, u)) {
          ctx.note(fmt::format("{}: x * a is used elsewhere", sc->label()));
          continue;
        }
        m.scale = sc;
        m.alpha = static_cast<float>(*a);
      }
      if (!single_use(ctx.g, sig->output(0))) {
        ctx.note(fmt::format("{}: the sigmoid is used elsewhere too", sig->label()));
        continue;
      }
      if (mul.output(0)->type.dtype != x->type.dtype || !same_dims(mul.output(0)->type, x->type)) {
        ctx.note(fmt::format("{}: the product broadcasts x", mul.label()));
        continue;
      }
      return m;
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Attributes a;
    if (m.alpha != 1.0f) a.set("alpha", Attribute::Float(m.alpha));
    std::vector<Node*> group = {m.sigmoid, m.mul};
    if (m.scale) group.insert(group.begin(), m.scale);
    return replace_with_layer(ctx, group, "", "Swish", {m.x}, std::move(a), m.mul->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_swish(PassContext& ctx) { return apply_pattern<FuseSwish>(ctx); }

}  // namespace kiln::passes
