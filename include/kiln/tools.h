// The reports of the kiln CLI as library calls, for front ends other than the CLI (the Python
// package): each returns the JSON text the CLI prints or exports (schemas in docs/report.md).
#pragma once

#include <string>

#include "kiln/engine.h"

namespace kiln {

// What `kiln inspect --json` prints for an engine file, for a loaded engine: backend, target,
// build options, inputs, outputs, layers (type, precision, tactic, INT8 scales, the ONNX nodes
// each covers) and weights; for a cuda engine also "device_memory" per profile point.
std::string inspect_json(const Engine& e);

}  // namespace kiln
