// What the engine asks of a backend. The cpu backend runs the graph with its reference kernels
// (backends/cpu); the cuda backend lowers the graph to GPU layers at build time, keeps a plan of
// per-layer tactics in the engine, and runs them at run time (backends/cuda).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "engine/profile.h"
#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

// Per-engine state a backend keeps (for cuda: the validated plan and the weights on the device,
// shared by the engine's contexts). The engine outlives its contexts.
class BackendEngine {
 public:
  virtual ~BackendEngine() = default;
  virtual Expected<std::unique_ptr<ExecutionContext>> create_context() = 0;
};

namespace gpu {
// Lowers and tunes `g` for the cuda backend (inserting reformat layers); returns the plan.
Expected<nlohmann::json> build_cuda_plan(Graph& g, const BuildConfig& c, const Profile& profile);
// Validates the plan against the graph; weights go to the GPU when the first context is made.
Expected<std::shared_ptr<BackendEngine>> load_cuda_engine(const Graph& g,
                                                          const nlohmann::json& plan,
                                                          const Profile& profile);
}  // namespace gpu

}  // namespace kiln
