// The CUDA backend's build product: one LayerChoice per graph node (in node order), stored in the
// engine's metadata as JSON (docs/engine-format.md, "backend plan").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "layer.h"

namespace kiln::gpu {

struct LayerChoice {
  const TacticDef* tactic = nullptr;  // nullptr: a host node (evaluated when shapes are set)
  std::string variant;
  Precision precision = Precision::kTF32;
  std::vector<TensorFormat> in, out;  // dtype kUndefined: absent, or read on the host
  double time_ms = -1;                // tuned time at the opt shape (-1: not timed)
  std::vector<std::pair<std::string, double>> timed;  // every candidate timed, "name/variant"
  bool is_host() const { return tactic == nullptr; }
  LayerDesc desc(const Node* n) const { return {n, in, out, precision, variant}; }
};

struct Plan {
  std::vector<LayerChoice> layers;  // per graph node, node order
  size_t workspace_limit = size_t(1) << 30;
};

// The plan as the engine stores it; each record also says whether the layer launches a kernel
// (not for host layers, nor for aliases of their input unless they make a graph output), and
// "kernel_layers" counts those that do (kiln inspect).
nlohmann::json plan_to_json(const Plan& p, const Graph& g);
// Validates every record against the graph (counts, tactic names, formats); errors name the node.
Expected<Plan> plan_from_json(const Graph& g, const nlohmann::json& j);

}  // namespace kiln::gpu
