// The residual add in front of a LayerNorm joins it:
//   LayerNormalization(Add(a, b), scale, bias)  =>  kiln.SkipLayerNorm(a, b, scale, bias)
// a and b of the same shape, normalized over the last axis. When the sum is read elsewhere too
// (a pre-norm transformer's residual stream), the layer also writes it as its second output.
// The backend computes the sum and the statistics in float32 (no overflow in FP16 engines).
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseSkipLayerNorm {
  struct Match {
    Node* add;
    Node* ln;
    bool keep_sum;
  };

  static std::optional<Match> match(PassContext& ctx, Node& ln) {
    if (!is_op(&ln, "LayerNormalization")) return std::nullopt;
    Node* add = producer_if(ln.input(0), "Add");
    if (!add || add->num_inputs() != 2) return std::nullopt;
    const Value *a = add->input(0), *b = add->input(1), *s = add->output(0);
    const int64_t rank = s->type.rank();
    const int64_t axis = ln.attrs.get_int("axis", -1);
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{} -> {}: {}", add->label(), ln.label(), why));
      return std::nullopt;
    };
    if (axis != -1 && axis != rank - 1) return reject("it normalizes more than the last axis");
    for (size_t o = 1; o < ln.num_outputs(); ++o)
      if (ln.output(o) && (!ln.output(o)->uses().empty() || ctx.g.is_graph_output(ln.output(o))))
        return reject("the LayerNorm's mean or inverse deviation is used");
    if (!a || !b || a->is_constant() || b->is_constant() || !same_dims(a->type, b->type) ||
        !same_dims(a->type, s->type))
      return reject("the Add's operands do not provably have one shape");
    if (!is_float_type(s->type.dtype)) return reject("not a float type");
    Attributes attrs = ln.attrs;
    attrs.set("axis", Attribute::Int(-1));
    auto layer = scratch_layer("kiln", "SkipLayerNorm",
                               {add->input(0), add->input(1), ln.input(1), ln.input(2)}, attrs,
                               ln.output(0));
    if (!ctx.backend_supports("kiln", "SkipLayerNorm", attrs, s->type.dtype, layer->nodes()[0]))
      return std::nullopt;
    const bool keep = !single_use(ctx.g, s);
    return Match{add, &ln, keep};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Attributes a = m.ln->attrs;
    a.set("axis", Attribute::Int(-1));
    Value* sum = m.add->output(0);
    Value* y = m.ln->output(0);
    Node* n = g.insert_node_before(
        m.ln, "SkipLayerNorm", g.unique_name(m.ln->name),
        {m.add->input(0), m.add->input(1), m.ln->input(1), m.ln->input(2)}, {}, "kiln");
    n->attrs = std::move(a);
    n->origin = ctx.pass;
    merge_onnx_nodes(*n, *m.add);
    merge_onnx_nodes(*n, *m.ln);
    const std::string name = m.ln->name;
    KILN_RETURN_IF_ERROR(g.remove_node(m.ln, /*force=*/true));
    KILN_RETURN_IF_ERROR(g.remove_node(m.add, /*force=*/true));
    g.set_node_output(n, 0, y);
    if (m.keep_sum) g.set_node_output(n, 1, sum);
    n->name = name;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fuse_skip_layernorm(PassContext& ctx) {
  return apply_pattern<FuseSkipLayerNorm>(ctx);
}

}  // namespace kiln::passes
