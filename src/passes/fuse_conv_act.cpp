// An activation joins the convolution or matrix product that feeds it:
//   Conv|FusedConv(...) -> Act          =>  kiln.FusedConv(..., activation=Act)
//   Gemm|MatMul|FusedGemm(...) -> Act   =>  kiln.FusedGemm(..., activation=Act)
// Act: Relu, Clip (constant bounds, e.g. ReLU6), Sigmoid, Tanh, LeakyRelu, HardSwish, Gelu
// (erf or tanh form, as fuse_gelu produces it), Swish (as fuse_swish produces it; only where a
// backend kernel computes it in the layer). Only when the producer's output has no other
// consumer and the producer carries no activation yet.
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The layer op an activation can join: "FusedConv", "FusedGemm" or "".
std::string target_of(const Node* p) {
  if (!p) return "";
  const bool has_act = !p->attrs.get_string("activation", "").empty();
  if (is_op(p, "Conv") || (is_kiln_op(p, "FusedConv") && !has_act && !has_post_steps(*p)))
    return "FusedConv";
  if (is_op(p, "Gemm") || is_op(p, "MatMul") || (is_kiln_op(p, "FusedGemm") && !has_act))
    return "FusedGemm";
  return "";
}

struct FuseConvAct {
  struct Match {
    Node* producer;
    Node* act;
    std::string op;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& act) {
    if (!act.domain.empty() || !fused_activation_supported(act.op_type) || !act.input(0))
      return std::nullopt;
    Value* y = act.input(0);
    Node* p = y->producer;
    const std::string op = target_of(p);
    if (op.empty()) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", p->label(), act.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, y))
      return reject("the intermediate has another consumer or is a graph output");
    if (!is_float_type(y->type.dtype)) return reject("not a float type");
    Attributes a = p->attrs;
    if (p->domain.empty() && op == "FusedGemm") a.set("base", Attribute::String(p->op_type));
    std::string why;
    if (!activation_attrs(act, a, &why)) return reject(why);
    // Swish joins only a layer whose own kernel computes it (kiln's depthwise convolution,
    // cuDNN's graph API in FP16/TF32; not cuBLASLt or cuDNN's legacy layer, where it would be a
    // second pass): the backend judges the would-be layer, not just its attributes.
    std::unique_ptr<Graph> scratch;
    if (act.op_type == "Swish")
      scratch = scratch_layer("kiln", op, p->inputs(), a, act.output(0));
    if (!ctx.backend_supports("kiln", op, a, y->type.dtype,
                              scratch ? scratch->nodes().back() : nullptr))
      return reject("the backend has no kernel for this layer with its activation");
    return Match{p, &act, op, std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins(m.producer->inputs().begin(), m.producer->inputs().end());
    return replace_with_layer(ctx, {m.producer, m.act}, "kiln", m.op, ins, m.attrs,
                              m.act->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_conv_act(PassContext& ctx) { return apply_pattern<FuseConvAct>(ctx); }

}  // namespace kiln::passes
