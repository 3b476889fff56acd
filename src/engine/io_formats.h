// The types of an engine's inputs and outputs, chosen at build time: trtexec's --inputIOFormats
// and --outputIOFormats (kiln build --input-io-formats / --output-io-formats). An FP16 engine
// whose float32 output is declared float16 writes its last layer's FP16 result straight into the
// caller's buffer, where a float32 output needs it widened: GPT-2's logits at batch 32 are 823 MB
// in float32 and 412 MB in float16.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

// `specs`: empty keeps the model's types; one spec applies to every float32 or float16 tensor
// (the others keep their types); more must give one per tensor, in the model's order. A spec is
// a type, "fp32" or "fp16" (also "float32", "float16") for a float tensor and the tensor's own
// type for any other ("int64", "bool", ...), optionally with trtexec's format, ":chw" or
// ":linear" (kiln's inputs and outputs are row-major); spaces around a spec are ignored.
struct IoFormats {
  std::vector<std::string> inputs, outputs;
};

// Changes `g`'s declared input and output types to `f`'s, with a Cast after each retyped input
// (to the type the model computes in) and before each retyped output (from it), named after the
// tensor; a retyped tensor keeps its name. An FP16 engine stores the cast's input and output
// alike, so the cast costs nothing there (the CUDA backend's movement.cast_same_storage layer; the
// layer before an output writes the caller's buffer itself). Errors name the option and tensor.
Status apply_io_formats(Graph& g, const IoFormats& f);

}  // namespace kiln
