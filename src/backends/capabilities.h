// The capability query: may the optimizer turn a group of nodes into this one layer for the
// target backend? Passes describe the layer they would create; the backend answers from its
// own kernel table, so "supported?" and dispatch cannot drift apart. Passes never name a
// backend.
#pragma once

#include <string>

#include "ir/graph.h"
#include "kiln/types.h"

namespace kiln {

struct LayerCapabilityQuery {
  std::string domain;                     // "" for ai.onnx ops (Gelu, LayerNormalization), "kiln"
  std::string op_type;                    // e.g. "FusedConv", "ElementwiseChain", "Attention"
  const Attributes* attrs = nullptr;      // the layer's attributes (activation, chain program...)
  DataType dtype = DataType::kUndefined;  // element type of the layer's output
  std::string precision = "fp32";         // the build precision (fp32, fp16, int8)
  // The layer as it would be made (its inputs, with their types and constants, and attributes),
  // not yet in the graph: for layers whose kernels depend on more than attributes (cuda asks the
  // tactics' own supports() about it). nullptr: attributes only.
  const Node* node = nullptr;
};

// True when `backend` can run the described layer as one kernel at the query's precision.
// cpu: every kiln fused op it has a kernel for (float32/float64 data; activation and chain
// steps it knows), and every ai.onnx op with a registry kernel; not FusedConvPool,
// FusedConvPair or FusedConvMean (their kernels are the references for other backends; on the
// CPU the fusion saves nothing). cuda: every op with a tactic in the GPU tactic table
// (backends/cuda/tactic_table.cpp), the table lowering dispatches from; with `node`, a tactic
// whose supports() takes it at the build precision (int8: an INT8 tactic, in the formats of an
// INT8 candidate).
bool backend_supports_layer(const std::string& backend, const LayerCapabilityQuery& query);

}  // namespace kiln
