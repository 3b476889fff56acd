// Model-local ONNX functions (ModelProto.functions), inlined before import.
#pragma once

#include "kiln/status.h"

namespace onnx {
class ModelProto;
}

namespace kiln {

// Every call of a function the model defines (node domain and op_type = the function's domain
// and name) becomes the function's body: its inputs and outputs renamed to the call's, its other
// values and its nodes prefixed with the call's name, attributes that refer to the call's
// (ref_attr_name) given the call's values (or dropped where the call has none). Calls inside
// bodies are inlined too (up to 16 levels). PyTorch's dynamo exporter (torch 2.5, 2.6) keeps
// onnxscript helpers this way (aten_getitem over a SplitToSequence, Rank, IsScalar). A body
// with a graph attribute is left, for the importer to refuse by name.
Status inline_local_functions(onnx::ModelProto& m);

}  // namespace kiln
