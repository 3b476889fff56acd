// Concrete shapes for one set of input shapes: shape inference over the whole graph, and the
// host nodes (Shape, Size, and what is computed only from shapes and constants) evaluated on the
// CPU with their reference kernels. Runs when an execution context's input shapes change.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "plan.h"

namespace kiln::gpu {

struct ShapeResult {
  std::unordered_map<const Value*, std::vector<int64_t>> shapes;          // every value
  std::unordered_map<const Value*, std::shared_ptr<const Tensor>> host;   // host-node outputs
};

// `input_shapes` follow g.inputs(); host_nodes[k] says whether node k runs on the host.
// `input_values` (empty, or one per input) gives the values of inputs read on the host (shape
// tensors, host_value_inputs()); nullptr for the others. Errors name the node whose inference
// failed.
Expected<ShapeResult> evaluate_shapes(const Graph& g, const std::vector<bool>& host_nodes,
                                      const std::vector<std::vector<int64_t>>& input_shapes,
                                      const std::vector<std::shared_ptr<const Tensor>>& input_values = {});

}  // namespace kiln::gpu
