// Activation memory planning: one arena for all intermediate tensors of an execution context,
// with tensors whose lifetimes do not overlap sharing bytes. Pure host code (tested on the CPU).
#pragma once

#include <cstddef>
#include <vector>

namespace kiln {

// One tensor: its size and the steps (layer indices, inclusive) from its producer to its last
// reader.
struct BufferRequest {
  size_t bytes = 0;
  int first = 0;
  int last = 0;
};

struct MemoryPlan {
  std::vector<size_t> offsets;  // per request, aligned to `alignment`
  size_t total = 0;             // arena size
};

// Greedy by size (largest first, each at the lowest offset free for its whole lifetime), the
// strategy TensorFlow Lite and TensorRT use: within a few percent of optimal on CNNs and
// transformers, and deterministic.
MemoryPlan plan_memory(const std::vector<BufferRequest>& requests, size_t alignment = 256);

}  // namespace kiln
