// Layers an FP16 build keeps at FP32 for accuracy, whatever the tuner would pick.
#pragma once

#include <string>
#include <unordered_map>

#include "ir/graph.h"

namespace kiln::gpu {

// Sin and Cos, and the chain that computes their argument. A periodic function's error is its
// argument's absolute error, and an FP16 argument carries a relative one: a diffusion model's
// timestep times a frequency (up to 1000) is off by up to 0.5, as is a rotary embedding's
// position times its frequency at positions past 1000; PyTorch computes both in float32. The
// chain runs back from each Sin or Cos through elementwise arithmetic, layout ops and MatMul
// (rotary frequencies as an outer product) to graph inputs, constants and casts from integers;
// a Sin or Cos of an activation (a chain that reaches any other op) is left alone.
// Also sampling coordinates, as PyTorch's autocast keeps them: each GridSample, the elementwise
// and layout chain computing its grid (an iterative refinement's pixel positions, RAFT's:
// FP16 holds a position near 100 to 1/16 of a pixel, and twelve updates accumulate it) back to
// the first other op (through a convolution or GEMM whose residual add is the update), and the same kind of ops computing from that chain's values alone (the
// flow, positions less the base grid). Maps each node kept to why (the --verbose build log says
// so).
std::unordered_map<const Node*, std::string> keep_fp32_nodes(const Graph& g);

}  // namespace kiln::gpu
