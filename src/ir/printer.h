// Human-readable dumps of a Graph (used by `kiln build --dump-graph DIR` and `kiln inspect`).
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln {

// A stable text listing:
//   graph 'name' (opset 21)
//   inputs:
//     %x: float32[N,3,224,224]
//   constants:
//     %shape: int64[2] = [1, -1]
//     %w: float32[64,3,7,7] = [0.1, -0.2, 0.3, 0.05, ...] (9408 values)
//   nodes:
//     %y: float32[N,64,112,112] = Conv[kernel_shape=[7,7]](%x, %w, _)  # conv1, import, covers:
//     conv1
//   outputs:
//     %y: float32[N,64,112,112]
// Absent optional inputs print as `_`; attributes are sorted by name; kiln-domain ops print as
// `kiln.Op`.
std::string graph_to_text(const Graph& g);

// Graphviz dot: nodes are boxes labelled with op type and name, with their constant inputs
// folded into the label (one line each) so that big graphs stay readable; graph inputs and
// outputs are ellipses; edges carry the tensor type.
std::string graph_to_dot(const Graph& g);

// One value's summary as in graph_to_text's constants section: "int64[2] = [1, -1]".
std::string constant_summary(const Value& v);

}  // namespace kiln
