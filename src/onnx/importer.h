// ONNX model -> kiln Graph. Nodes are mapped one to one (Constant nodes become constant values)
// and upgraded to their newest-opset form by each op's `upgrade` hook; nothing is optimized here.
#pragma once

#include <memory>
#include <string>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

inline constexpr int kMinOnnxOpset = 1;
// The newest opset kiln knows (ops' versions up to it are in src/ops/op_versions.inc). A newer
// model still imports, with a warning: its ops are assumed unchanged after this opset.
inline constexpr int kMaxOnnxOpset = 28;

// Reads and imports a .onnx file (external data is resolved relative to its folder). The graph
// comes back with types inferred and verified. A model with unsupported ops is refused before
// anything else with one message listing every unsupported op type and its nodes.
Expected<std::unique_ptr<Graph>> import_onnx_file(const std::string& path);
Expected<std::unique_ptr<Graph>> import_onnx_bytes(const std::string& bytes,
                                                   const std::string& base_dir,
                                                   const std::string& source_name);

}  // namespace kiln
