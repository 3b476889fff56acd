// The memory a GPU build cannot do without, checked against what the GPU has before any tactic
// is timed: a build whose activations cannot fit fails in seconds with one line naming both,
// instead of timing every candidate into out-of-memory failures.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "shape_eval.h"

namespace kiln::gpu {

struct GpuMemory {
  size_t free = 0, total = 0;
};

// What cudaMemGetInfo says; nullopt where no GPU answers (a machine without one), or where the
// CUDA context cannot be made for want of memory (`*no_room` set).
std::optional<GpuMemory> query_gpu_memory(bool* no_room = nullptr);

// A lower bound on the device memory building (and then running) the graph at these shapes
// takes: every weight the GPU layers read, plus the inputs and outputs of the layer with the
// largest (a tactic is timed with both in memory), each at the smallest element size the build
// allows (`min_float_bytes`: 4 for FP32, 2 with FP16; 1 for a tensor with INT8 scales) and
// graph inputs and outputs at their own type.
struct BuildMemoryEstimate {
  size_t weight_bytes = 0;
  size_t layer_bytes = 0;  // the largest layer's inputs and outputs
  std::string layer;       // that layer's label
  size_t total() const { return weight_bytes + layer_bytes; }
};
BuildMemoryEstimate estimate_build_memory(const Graph& g, const std::vector<bool>& host_nodes,
                                          const ShapeResult& shapes, size_t min_float_bytes);

// Ok when the estimate fits in `m.free`; else the one-line out-of-memory error.
Status check_build_memory(const BuildMemoryEstimate& need, const GpuMemory& m,
                          const std::string& shapes_text);

// Whether a tactic's failure message says it ran out of memory (cudaMalloc, cuBLAS or cuDNN).
bool is_out_of_memory(const std::string& message);

}  // namespace kiln::gpu
