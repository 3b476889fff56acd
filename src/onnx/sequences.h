// Sequence ops kiln reads without a sequence type (the IR has tensors only).
#pragma once

#include <string>

#include "kiln/status.h"

namespace onnx {
class GraphProto;
}

namespace kiln {

// SplitToSequence(x, split?) whose every reader is SequenceAt at a constant position becomes, for
// each reader, the Slice of x that position takes (and a Squeeze where keepdims = 0 without a
// split): PyTorch's dynamo exporter writes chunk() and unbind() this way (Phi-3's gate_up_proj
// chunked in two). The Slices are the parts of a Split (slices_to_split makes them one). Other
// sequence uses are left, for the importer to refuse by name. Runs on the proto, before import,
// in the graph and its subgraphs.
Status lower_split_to_sequence(onnx::GraphProto& g, const std::string& base_dir);

}  // namespace kiln
