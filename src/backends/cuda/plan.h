// The CUDA backend's build product: one LayerChoice per graph node (in node order), stored in the
// engine's metadata as JSON (docs/engine-format.md, "backend plan").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "layer.h"

namespace kiln::gpu {

// A layer's tactic at another tuning point of a dynamic profile (Plan::points), where it was
// faster than the opt shape's choice: same op, precision and formats, so the same weights and
// neighbours; the executor runs it for input shapes nearer that point.
struct Alternate {
  size_t point = 1;  // index into Plan::points (never 0, the opt shapes)
  const TacticDef* tactic = nullptr;
  std::string variant;
  double time_ms = -1;  // its tuned time at that point
};

struct Plan;

struct LayerChoice {
  const TacticDef* tactic = nullptr;  // nullptr: a host node (evaluated when shapes are set)
  std::string variant;
  Precision precision = Precision::kTF32;
  std::vector<TensorFormat> in, out;  // dtype kUndefined: absent, or read on the host
  double time_ms = -1;                // tuned time at the opt shape (-1: not timed)
  std::vector<std::pair<std::string, double>> timed;  // every candidate timed, "name/variant"
  std::vector<Alternate> alternates;  // at most one per tuning point other than the opt shapes
  // A control-flow layer's subgraphs, each lowered into a plan of its own (graph attribute name,
  // plan of that subgraph), which the executor runs when the condition or trip count is known.
  std::vector<std::pair<std::string, std::shared_ptr<Plan>>> subplans;
  // In the dynamic region: the layer reads or writes a value whose size the data decides.
  bool dynamic = false;
  bool is_host() const { return tactic == nullptr; }
  LayerDesc desc(const Node* n) const { return {n, in, out, precision, variant}; }
  LayerDesc desc(const Node* n, const Alternate& a) const {
    return {n, in, out, precision, a.variant};
  }
};

using InputShapes = std::vector<std::vector<int64_t>>;  // per graph input, in order

struct Plan {
  std::vector<LayerChoice> layers;  // per graph node, node order
  size_t workspace_limit = size_t(1) << 30;
  // The input shapes the layers were tuned at: points[0] the profile's opt shapes, then any
  // further points of a dynamic profile (lower.h: tuning_points). Empty in an engine tuned at
  // one point only.
  std::vector<InputShapes> points;
};

// The tuning point nearest to `shapes` (index into `points`; 0 when there are none): the least
// sum over every dimension of |log(shape / point)|, so batch 8 is nearer 32 than 1.
size_t nearest_point(const std::vector<InputShapes>& points, const InputShapes& shapes);

// Graph outputs written through: where graph output j is made by a chain of layers that relabel
// memory (alias_input = 0, the same format in and out: the Reshape family, a Cast between types
// stored alike) from a value a kernel layer writes, that value -> j. The kernel then writes
// straight into the output's buffer and the chain launches nothing. A value that is a graph input
// or output, a constant, or computed on the host is never such a value, nor one given to an
// earlier output.
std::unordered_map<const Value*, size_t> written_through_outputs(const Plan& p, const Graph& g);

// The plan as the engine stores it; each record also says whether the layer launches a kernel
// (not for host layers, nor for aliases of their input unless they copy into a graph output),
// and "kernel_layers" counts those that do (kiln inspect). The engine adds "kernels", the
// cubins of generated_kernels() (cuda_backend.cpp); plan_from_json imports them.
nlohmann::json plan_to_json(const Plan& p, const Graph& g);
// The generated kernels (rtc.h) the plan's layers and alternates run: their variants.
std::vector<std::string> generated_kernels(const Plan& p);
// Validates every record against the graph (counts, tactic names, formats); errors name the node.
Expected<Plan> plan_from_json(const Graph& g, const nlohmann::json& j);

}  // namespace kiln::gpu
