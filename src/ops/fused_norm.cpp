// kiln.FusedGroupNorm(X, scale, bias, addend?): a GroupNorm with the elementwise work on either
// side of it that a kernel does while it passes over the data anyway,
//   Y = act(GroupNormalization(X + addend, scale, bias))
// (attributes num_groups, epsilon as GroupNormalization's opset-21 form, scale and bias per
// channel; activation and act_* as the other fused layers'). The addend broadcasts into X over
// the spatial axes only ([N or 1, C or 1, 1, ...]): a diffusion UNet's timestep embedding, added
// before every ResNet block's second norm. Made by passes/fuse_groupnorm_act.cpp; the CPU kernel
// chains the reference kernels (Add, GroupNormalization, the activation).
#include "ops/fused.h"
#include "ops/fused_util.h"
#include "ops/op.h"

namespace kiln {
namespace {

Attributes norm_attrs(const Node& n) {
  Attributes a;
  a.set("num_groups", Attribute::Int(n.attrs.get_int("num_groups", 0)));
  a.set("epsilon", Attribute::Float(n.attrs.get_float("epsilon", 1e-5f)));
  return a;
}

Status infer_fused_groupnorm(InferContext& ctx) {
  const Node& n = ctx.node();
  if (!n.input(0) || !n.input(1) || !n.input(2))
    return KILN_ERROR("{}: FusedGroupNorm needs X, scale and bias", n.label());
  if (!dtype_is_float(ctx.input_type(0).dtype))
    return KILN_ERROR("{}: X must be a float tensor, got {}", n.label(),
                      dtype_name(ctx.input_type(0).dtype));
  return infer_same_as_input(ctx, 0);
}

Status cpu_fused_groupnorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (!ctx.input(0) || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: FusedGroupNorm needs X, scale and bias", n.label());
  Tensor x = *ctx.input(0);
  if (const Tensor* t = ctx.input(3)) {
    KILN_ASSIGN_OR_RETURN(x, fused::add_same_shape(n, x, *t, "addend"));
  }
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_op(n, "GroupNormalization", norm_attrs(n),
                                                {&x, ctx.input(1), ctx.input(2)}));
  KILN_ASSIGN_OR_RETURN(y, fused::apply_activation(n, std::move(y)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"kiln", "FusedGroupNorm", infer_fused_groupnorm, cpu_fused_groupnorm, nullptr},
};

}  // namespace

std::span<const OpDef> fused_norm_ops() { return kOps; }

// kiln.FusedGroupNorm -> [Add(X, addend)] -> GroupNormalization -> [activation], in its place.
Status unfuse_groupnorm(Graph& g, Node* n) {
  if (!n->output(0) || n->num_inputs() < 3)
    return KILN_ERROR("{}: FusedGroupNorm without X, scale, bias or Y", n->label());
  const DataType dt = n->output(0)->type.dtype;
  Value* y = n->input(0);
  Node* last = nullptr;
  auto part = [&](const std::string& op, std::vector<Value*> ins, Attributes a = {}) {
    const std::string name = g.unique_name(n->name + "/" + op);
    Node* p = g.insert_node_before(n, op, name, ins, {name});
    p->attrs = std::move(a);
    p->origin = n->origin.empty() ? "unfuse" : n->origin + "+unfuse";
    p->onnx_nodes = n->onnx_nodes;
    p->output(0)->type = n->output(0)->type;
    last = p;
    y = p->output(0);
  };
  if (n->num_inputs() > 3 && n->input(3)) part("Add", {y, n->input(3)});
  part("GroupNormalization", {y, n->input(1), n->input(2)}, norm_attrs(*n));
  const std::string act = n->attrs.get_string("activation", "");
  if (act == "Clip") {
    std::vector<Value*> clip = {y, nullptr, nullptr};
    for (const auto& [i, key] : {std::pair<int, const char*>{1, "act_min"}, {2, "act_max"}})
      if (n->attrs.has(key))
        clip[i] = g.add_constant(g.unique_name(n->name + "/" + key),
                                 Tensor::scalar<float>(n->attrs.get_float(key, 0)).cast(dt));
    while (!clip.back()) clip.pop_back();
    part("Clip", clip);
  } else if (!act.empty()) {
    part(act, {y}, fused::strip_prefix(n->attrs, "act_"));
  }
  Value* out = n->output(0);
  KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
  g.set_node_output(last, 0, out);
  g.remove_dead_values();
  return Status::Ok();
}

}  // namespace kiln
