// Concrete shapes for one set of input shapes: shape inference over the whole graph, and the
// host nodes (Shape, Size, and what is computed only from shapes and constants) evaluated on the
// CPU with their reference kernels. Runs when an execution context's input shapes change.
#pragma once

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "plan.h"

namespace kiln::gpu {

struct ShapeResult {
  std::unordered_map<const Value*, std::vector<int64_t>> shapes;          // every value
  std::unordered_map<const Value*, std::shared_ptr<const Tensor>> host;   // host-node outputs
  // With `partial`: the values whose shapes only the data decides (outputs of data-dependent
  // ops and of control flow, and everything computed from them); they have no entry in shapes.
  std::unordered_set<const Value*> dynamic;
};

// `input_shapes` follow g.inputs(); host_nodes[k] says whether node k runs on the host.
// `input_values` (empty, or one per input) gives the values of inputs read on the host (shape
// tensors, host_value_inputs()); nullptr for the others. Errors name the node whose inference
// failed.
// `partial`: a shape that the data decides (ShapeResult::dynamic) is no error; an input whose
// shape is empty in `input_shapes` (a subgraph's input known only at run time) is dynamic too.
Expected<ShapeResult> evaluate_shapes(const Graph& g, const std::vector<bool>& host_nodes,
                                      const std::vector<std::vector<int64_t>>& input_shapes,
                                      const std::vector<std::shared_ptr<const Tensor>>& input_values = {},
                                      bool partial = false);
// Shape or Size of a tensor of shape `dims` (they need only the shape, never the data).
Tensor eval_shape_op(const Node& n, const std::vector<int64_t>& dims);
// Whether the sizes of n's outputs depend on the data (OpDef::bound) or on control flow.
bool data_dependent(const Node& n);

}  // namespace kiln::gpu
