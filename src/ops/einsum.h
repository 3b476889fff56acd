// Einsum's loop structure, shared by the CPU kernel (einsum.cpp) and the CUDA layer
// (backends/cuda/layers/einsum.cu), so both sum the same products in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

// Loop variables: the broadcast "..." dims first, then one per label in alphabetical order
// (upper case first). Each input and the output address a variable through a stride (0 where
// a "..." dim of size 1 is broadcast, or where the output does not name the variable: those
// are summed over, in row-major order of the variables).
struct EinsumPlan {
  std::vector<int64_t> sizes;                    // per variable
  std::vector<std::vector<int64_t>> in_strides;  // per input, per variable
  std::vector<int64_t> out_strides;              // per variable
  std::vector<size_t> out_vars;                  // the variable of each output dim
  std::vector<int64_t> out_shape;
};

// The plan of node `n` (attribute `equation`) for inputs of these shapes.
Expected<EinsumPlan> plan_einsum(const Node& n, const std::vector<std::vector<int64_t>>& shapes);

}  // namespace kiln
