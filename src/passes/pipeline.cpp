#include "passes/pipeline.h"

#include "ops/op.h"

namespace kiln {

// Filled in by the optimizer (issue 3): the ordered list of passes.
Status optimize_graph(Graph& g, const OptimizeOptions& options) {
  if (options.opt_level < 0 || options.opt_level > 2)
    return KILN_ERROR("--opt-level must be 0, 1 or 2 (got {})", options.opt_level);
  return infer_shapes(g);
}

}  // namespace kiln
