// Structural checks of a Graph: run after import and after every pass in debug/verbose builds.
#pragma once

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

// Checks that the graph is well formed:
// - value names and node names are unique;
// - every node's op is known to the op registry (all unknown ops are listed in one message);
// - every node input is a graph input, a constant, or the output of an earlier node;
// - producers agree with Node::outputs, and no value has two producers;
// - graph inputs have no producer; graph outputs are produced, inputs or constants;
// - use lists agree with node inputs in both directions;
// - Node::index is the node's position;
// - every subgraph (a graph attribute) passes the same checks.
// The error lists the problems found (up to a few), each naming the node (label()) or value.
Status verify_graph(const Graph& g);

}  // namespace kiln
