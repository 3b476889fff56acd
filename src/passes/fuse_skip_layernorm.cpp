// The residual add in front of a LayerNorm joins it:
//   LayerNormalization(Add(a, b), scale, bias)  =>  kiln.SkipLayerNorm(a, b, scale, bias)
// a and b of the same shape, normalized over the last axis. When the sum is read elsewhere too
// (a pre-norm transformer's residual stream), the layer also writes it as its second output.
// The backend computes the sum and the statistics in float32 (no overflow in FP16 engines).
// A Reshape between the Add and the LayerNorm that keeps the last axis (Swin's blocks add on
// [B, H, W, C] and normalize [B, H*W, C]) moves onto the operands: the layer then adds
// Reshape(a) and Reshape(b), views that launch nothing, and its sum is the Reshape's output.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseSkipLayerNorm {
  struct Match {
    Node* add;
    Node* ln;
    bool keep_sum;
    Node* reshape = nullptr;  // between the Add and the LayerNorm, keeping the last axis
  };

  // The Reshape r feeding the LayerNorm when it keeps the last axis of an Add's sum that only r
  // reads, and its shape input exists before the Add (the operands' Reshapes go there).
  static Node* last_axis_reshape(PassContext& ctx, Value* x) {
    Node* r = producer_if(x, "Reshape");
    if (!r || !r->input(0) || !r->input(1)) return nullptr;
    Node* add = producer_if(r->input(0), "Add");
    if (!add || !single_use(ctx.g, add->output(0))) return nullptr;
    const TensorType &in = r->input(0)->type, &out = r->output(0)->type;
    if (!in.dims || !out.dims || in.dims->empty() || out.dims->empty()) return nullptr;
    const Dim &c_in = in.dims->back(), &c_out = out.dims->back();
    if (!c_in.is_static() || !(c_in == c_out)) return nullptr;
    const Node* shape = r->input(1)->producer;
    if (shape && shape->index > add->index) return nullptr;
    return r;
  }

  static std::optional<Match> match(PassContext& ctx, Node& ln) {
    if (!is_op(&ln, "LayerNormalization")) return std::nullopt;
    Node* reshape = last_axis_reshape(ctx, ln.input(0));
    Node* add = producer_if(reshape ? reshape->input(0) : ln.input(0), "Add");
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
    const bool keep = !single_use(ctx.g, reshape ? reshape->output(0) : s);
    return Match{add, &ln, keep, reshape};
  }

  // Reshape(v) as `r` reshapes, placed before the Add (r's shape input exists there).
  static Value* reshaped(PassContext& ctx, const Match& m, Value* v) {
    const std::string name = ctx.g.unique_name(v->name + "/reshaped");
    Node* r = ctx.g.insert_node_before(m.add, "Reshape", name, {v, m.reshape->input(1)}, {name});
    r->attrs = m.reshape->attrs;
    r->origin = ctx.pass;
    r->onnx_nodes = m.reshape->onnx_nodes;
    r->output(0)->type = m.reshape->output(0)->type;
    r->output(0)->type.dtype = v->type.dtype;
    return r->output(0);
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Attributes a = m.ln->attrs;
    a.set("axis", Attribute::Int(-1));
    Value* sum = m.reshape ? m.reshape->output(0) : m.add->output(0);
    Value* y = m.ln->output(0);
    Value* a0 = m.add->input(0);
    Value* a1 = m.add->input(1);
    if (m.reshape) {
      a0 = reshaped(ctx, m, a0);
      a1 = reshaped(ctx, m, a1);
    }
    Node* n = g.insert_node_before(m.ln, "SkipLayerNorm", g.unique_name(m.ln->name),
                                   {a0, a1, m.ln->input(1), m.ln->input(2)}, {}, "kiln");
    n->attrs = std::move(a);
    n->origin = ctx.pass;
    merge_onnx_nodes(*n, *m.add);
    if (m.reshape) merge_onnx_nodes(*n, *m.reshape);
    merge_onnx_nodes(*n, *m.ln);
    const std::string name = m.ln->name;
    KILN_RETURN_IF_ERROR(g.remove_node(m.ln, /*force=*/true));
    if (m.reshape) KILN_RETURN_IF_ERROR(g.remove_node(m.reshape, /*force=*/true));
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
