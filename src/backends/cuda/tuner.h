// The tuner: times a layer's candidate tactics on the GPU at the profile's opt shapes and keeps
// the fastest. Inputs are random (fresh per layer), weights are the layer's real constants in
// the candidate's formats, the median of several timed rounds counts. A round is captured once
// as a CUDA graph and replayed, so a small layer's time is the GPU's, as in an engine run with
// CUDA graphs, not the host's launch cost (5 to 10 us a launch, more than a batch-1 transformer
// layer's kernel); a layer that cannot be captured is timed on the stream. Times come from and go to
// the timing cache, so a rebuild with the same cache makes the same choices without timing.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <tuple>
#include <vector>

#include "device_util_host.h"
#include "plan.h"
#include "shape_eval.h"
#include "timing_cache.h"

namespace kiln::gpu {

class Tuner {
 public:
  static Expected<std::unique_ptr<Tuner>> create(TimingCache* cache, size_t workspace_limit);
  ~Tuner();
  // Times every candidate (cache first); returns the index of the fastest and fills each
  // candidate's time_ms (-1 when it failed). `why` gets, per failed candidate, the reason.
  Expected<size_t> choose(const Node& n, std::vector<LayerChoice>& candidates,
                          const ShapeResult& shapes, std::vector<std::string>* why);
  // Configures the layer's only candidate at the shapes, as the engine will (no data, no run):
  // an error naming the node and tactic where it cannot run there, or needs more workspace than
  // the limit. choose() does this for each candidate it times; a layer with one candidate is not
  // timed, and without this check would fail only when the engine first runs.
  Status check(const Node& n, const LayerChoice& c, const ShapeResult& shapes);
  // The wall time the last choose() spent on each candidate (creating, configuring and timing
  // it; 0 where the timing cache answered), in seconds: the --verbose log's.
  const std::vector<double>& last_walls() const { return walls_; }
  // The cache key of a candidate: op, attributes, shapes and formats, precision, tactic.
  static std::string signature(const Node& n, const LayerChoice& c, const ShapeResult& shapes);
  // The time of a kiln.Reformat of value `v` (its shape in `shapes`, its INT8 scale) from one
  // format to another (cache first). The format choice (format_choice.h) weighs these against
  // layer times, so a layer's choice pays for the conversions it causes.
  Expected<double> reformat_ms(const Value& v, const TensorFormat& from, const TensorFormat& to,
                               const ShapeResult& shapes);

 private:
  Tuner() = default;
  // signature(), and the workspace limit where it is not the default: a time (or failure) found
  // under another limit says nothing of whether the candidate fits this one.
  std::string key(const Node& n, const LayerChoice& c, const ShapeResult& shapes) const;
  // The node's tensors at the shapes in the candidate's formats, as configure() sees them (host
  // values of constants and shape-computed values; no device data).
  static void describe(const Node& n, const LayerChoice& c, const ShapeResult& shapes,
                       std::vector<DeviceTensor>* in, std::vector<DeviceTensor>* out);
  // `best_so_far` (ms, or <= 0): a candidate over 3x that is timed once only.
  Expected<double> time_candidate(const Node& n, const LayerChoice& c, const ShapeResult& shapes,
                                  double best_so_far);
  // `runs` back-to-back calls of `run` as one instantiated CUDA graph; null when the calls
  // cannot be captured (the stream is left out of capture either way).
  cudaGraphExec_t capture_runs(const std::function<Status()>& run, int runs);
  TimingCache* cache_ = nullptr;
  size_t workspace_limit_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::unique_ptr<LibraryHandles> handles_;
  DeviceMemory workspace_;
  DeviceMemory cublas_ws_;  // cuBLAS's own, so that it never allocates inside a capture
  std::vector<std::unique_ptr<DeviceMemory>> buffers_;
  uint64_t seed_ = 1;
  std::vector<double> walls_;
  // The node being chosen for: its host-known inputs on the device, per format (time_candidate).
  std::map<std::tuple<const Tensor*, DataType, Layout>, std::unique_ptr<DeviceMemory>> host_inputs_;
};

}  // namespace kiln::gpu
