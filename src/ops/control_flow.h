// Control flow: If, Loop and Scan, whose subgraphs (graph attributes) the importer makes closed.
// A subgraph reads no value of an enclosing graph: each outer value it reads (a capture) is an
// input of the subgraph after its formal inputs, fed by an input of the node after the node's
// own inputs, in the same order for every subgraph of the node. The attribute `kiln_captures`
// says how many of the node's inputs are captures (0 when absent).
//
//   If:   inputs (cond, captures...);            branches' inputs (captures...)
//   Loop: inputs (M, cond, v_initial..., caps);   body's inputs (iter, cond, v..., caps)
//   Scan: inputs (states..., scan_inputs..., caps); body's inputs (states..., slices..., caps)
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

// How many of `n`'s inputs, the last ones, feed its subgraphs' captures.
int64_t capture_count(const Node& n);
// Whether `n` holds subgraphs (If, Loop, Scan).
inline bool has_subgraphs(const Node& n) { return !n.attrs.subgraphs().empty(); }

// Types a subgraph for the given input types (one per subgraph input; shape values where known)
// and returns its output types. Every type inside is recomputed from the inputs, so inferring
// again with other inputs (a Loop's carried values, a profile's shapes) leaves nothing stale.
Expected<std::vector<TensorType>> infer_subgraph(
    Graph& sub, const std::vector<TensorType>& inputs,
    const std::vector<std::optional<std::vector<SymInt>>>& shape_values = {});

// The type that describes both `a` and `b` (an If's two branches, a Loop's carried value before
// and after an iteration): equal dims stay, others become unknown; ranks that differ give an
// unknown rank. Element types must agree.
Expected<TensorType> join_types(const TensorType& a, const TensorType& b, const Node& n,
                                const std::string& what);

}  // namespace kiln
