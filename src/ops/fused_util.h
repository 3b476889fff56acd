// Shared pieces of the fused layers' CPU kernels: they compose the registry's reference
// kernels, so a fused layer computes exactly what its unfused nodes compute.
#pragma once

#include <string>
#include <vector>

#include "ops/op.h"

namespace kiln::fused {

// Runs ai.onnx op `op_type` with `attrs` on `inputs`, reporting errors against `owner`.
Expected<Tensor> run_op(const Node& owner, const std::string& op_type, const Attributes& attrs,
                        const std::vector<const Tensor*>& inputs);
// Attributes of `a` whose names start with `prefix`, with the prefix removed.
Attributes strip_prefix(const Attributes& a, const std::string& prefix);
// Applies n's `activation` (with its act_* attributes) to y; no activation returns y.
Expected<Tensor> apply_activation(const Node& n, Tensor y);
// Applies a FusedConv's post steps (post_ops, post_values; ops/fused.h) to y in order.
Expected<Tensor> apply_post(const Node& n, Tensor y);
// y + z where z broadcasts into y without changing y's shape.
Expected<Tensor> add_same_shape(const Node& n, const Tensor& y, const Tensor& z, const char* what);
// kiln.FusedConvPair adds its two convolutions' outputs without broadcasting: an error naming
// the layer and both shapes unless they are equal.
Status check_pair_shapes(const Node& n, const Tensor& y1, const Tensor& y2);

}  // namespace kiln::fused

namespace kiln {
// The CPU reference of an INT8 layer (fused_int8.cpp): kiln.FusedConv / kiln.FusedConvPair /
// kiln.FusedGemm with int8 = 1, computed as a GPU INT8 kernel does.
Status cpu_int8_layer(KernelContext& ctx);
}  // namespace kiln
