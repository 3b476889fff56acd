// The CUDA backend at run time: the per-engine state (plan, weights on the device) and the
// execution context (its stream-bound library handles, activation arena, workspace, the
// configured layers for the current input shapes, and CUDA graphs).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "device_util_host.h"
#include "plan.h"

namespace kiln::gpu {

// Where a tensor's bytes live; resolved to a pointer when addresses are bound.
struct TensorRef {
  enum Kind : uint8_t { kNone, kArena, kWeights, kUploads, kInput, kOutput } kind = kNone;
  size_t offset = 0;  // in the arena/weights/uploads; the input/output index otherwise
};

class CudaEngineState final : public BackendEngine,
                              public std::enable_shared_from_this<CudaEngineState> {
 public:
  CudaEngineState(const Graph& g, Plan plan, Profile profile)
      : graph_(g), plan_(std::move(plan)), profile_(std::move(profile)) {}
  Expected<std::unique_ptr<ExecutionContext>> create_context() override;

  const Graph& graph() const { return graph_; }
  const Plan& plan() const { return plan_; }
  const Profile& profile() const { return profile_; }
  // Uploads every constant in each format a GPU layer reads it in (once per engine).
  Status ensure_weights();
  // Offset of constant `v` in format `f` within the weights buffer.
  size_t weight_offset(const Value* v, const TensorFormat& f) const;
  void* weights() const { return weights_.get(); }
  size_t weight_bytes() const { return weights_.bytes(); }

 private:
  const Graph& graph_;
  Plan plan_;
  Profile profile_;
  std::mutex mu_;
  bool uploaded_ = false;
  DeviceMemory weights_;
  std::map<std::pair<const Value*, std::string>, size_t> offsets_;
};

}  // namespace kiln::gpu
