// The graph edits the cuda lowering makes before it chooses tactics (lower.h, prepare_for_gpu):
// forms of a layer that no GPU kernel takes become forms that one does.
#include <fmt/format.h>

#include <algorithm>

#include "layer.h"
#include "lower.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "quant/int8.h"

namespace kiln::gpu {
namespace {

// A fused float layer that no tactic takes (a residual that broadcasts, an activation no
// epilogue computes, an attention with the rotary that mha.flash cannot run: not FP16, another
// head size, a FusedConvMean at a shape the depthwise kernel lacks, a FusedGroupNorm outside an
// FP16 NHWC build) is split back into the ops it fuses (unfuse_layer, ops/fused.h), which the
// GPU runs, rather than failing the build. A split's parts are checked in turn (FusedConvMean's
// FusedConv may split again).
Expected<bool> split_untaken_layers(Graph& g, const GpuBuildOptions& o) {
  bool split = false;
  for (bool again = true; again;) {
    again = false;
    for (Node* n : std::vector<Node*>(g.nodes())) {
      const bool splits =
          n->domain == "kiln" && (n->op_type == "FusedConv" || n->op_type == "FusedGemm" ||
                                  n->op_type == "FusedConvMean" || n->op_type == "FusedGroupNorm" ||
                                  (n->op_type == "MultiHeadAttention" && mha_has_rotary(*n)));
      if (!splits || quant::runs_int8(*n) || some_tactic_takes(*n, o)) continue;
      if (o.log)
        *o.log << n->label() << ": no GPU kernel takes the fused layer; split into its ops\n";
      KILN_RETURN_IF_ERROR(unfuse_layer(g, n));
      split = again = true;
    }
  }
  return split;
}

// An op whose float inputs the spec lets differ in type (GridSample's grid, T2: Deformable DETR
// samples a float32 map with a float64 grid) that no tactic takes so: each float input of
// another type than input 0's is cast to it first, as TensorRT, which has no float64, runs such
// a model; the op's outputs keep their types. (The CPU backend computes the op as typed.)
bool cast_mixed_float_inputs(Graph& g, const GpuBuildOptions& o) {
  bool cast = false;
  for (Node* n : std::vector<Node*>(g.nodes())) {
    const Value* x = n->num_inputs() ? n->input(0) : nullptr;
    if (!x || !dtype_is_float(x->type.dtype) || quant::runs_int8(*n) ||
        tactics_for(n->domain, n->op_type).empty())
      continue;
    const DataType want = x->type.dtype;
    auto other = [&](const Value* v) {
      return v && dtype_is_float(v->type.dtype) && v->type.dtype != want;
    };
    if (std::none_of(n->inputs().begin(), n->inputs().end(), other) || some_tactic_takes(*n, o))
      continue;
    for (size_t i = 1; i < n->num_inputs(); ++i) {
      Value* v = n->input(i);
      if (!other(v)) continue;
      if (o.log)
        *o.log << fmt::format("{}: no GPU kernel takes input {} '{}' as {}; cast to {}\n",
                              n->label(), i, v->name, dtype_name(v->type.dtype), dtype_name(want));
      Node* c =
          g.insert_node_before(n, "Cast", g.unique_name(n->name + "/cast_input"), {v},
                               {g.unique_name(v->name + "/" + std::string(dtype_name(want)))});
      c->attrs.set("to", Attribute::Int(static_cast<int64_t>(want)));
      c->origin = "cast_mixed_float_inputs";
      c->onnx_nodes = n->onnx_nodes;
      g.set_input(n, i, c->output(0));
      cast = true;
    }
  }
  return cast;
}

}  // namespace

Status prepare_for_gpu(Graph& g, const GpuBuildOptions& o) {
  KILN_ASSIGN_OR_RETURN(const bool split, split_untaken_layers(g, o));
  const bool cast = cast_mixed_float_inputs(g, o);
  if (!split && !cast) return Status::Ok();
  KILN_RETURN_IF_ERROR(g.topo_sort());
  g.renumber();
  return infer_shapes(g);
}

}  // namespace kiln::gpu
