// What `kiln inspect --json` shows of a graph (an ONNX model as imported, or an engine's
// optimized graph with its backend plan), and an engine's device memory per profile point.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

// Inputs, outputs, layers (type, precision, origin, the ONNX nodes covered, INT8 scales, and the
// backend's tactic per layer when `plan` has one record per node) and weights, merged into `meta`.
nlohmann::json describe_graph(const Graph& g, const std::string& kind, const nlohmann::json& meta,
                              const nlohmann::json& plan = nlohmann::json());

// The device memory of a cuda engine per profile point (min/opt/max shapes): the weights on the
// device and, for each point, the activation arena and the largest layer workspace, as a context
// plans them; {"note": why} where they cannot be planned (no GPU here, a planning error).
nlohmann::json describe_device_memory(const Engine& e);

}  // namespace kiln
