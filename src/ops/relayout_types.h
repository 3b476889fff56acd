// The step types of one kiln.Relayout node, prepared once: its steps as a small graph whose input
// types are set and inferred again at each call. A layer configured at every new shape (a loop
// body whose shapes change each iteration) then skips rebuilding that graph each time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

class InferContext;

class RelayoutTypes {
 public:
  // The steps of `n` (a kiln.Relayout of `num_inputs` inputs), or why its program is malformed.
  static Expected<std::unique_ptr<RelayoutTypes>> prepare(const Node& n, size_t num_inputs);
  // Each step's type (the last is the layer's) for inputs of these types, inferred as the
  // registry infers the ops themselves; or why not.
  Expected<std::vector<TensorType>> infer(const std::vector<TensorType>& inputs);

 private:
  RelayoutTypes() = default;
  std::string label_;
  Graph g_;
  std::vector<Value*> in_, results_;
};

// kiln.Relayout's shape inference (the op table's) through `steps`, prepared at the first call:
// an executor that infers one node at many shapes keeps `steps` for it.
Status infer_relayout_with(InferContext& ctx, std::unique_ptr<RelayoutTypes>& steps);

}  // namespace kiln
