// The INT8 steps of a build (docs/quantization.md):
//   before the optimizer: map_qdq turns an explicitly quantized model's Q/DQ nodes into scales;
//   after it: quantize_for_build gives the activations their scales (explicit, cached or
//   calibrated) and marks the layers that run in INT8.
#pragma once

#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "kiln/engine.h"
#include "kiln/status.h"

namespace kiln::quant {

// Q -> DQ pairs on activations become the activation's scale; DQ of an int8 constant becomes a
// float constant carrying its (per-channel) scales; DQ of any other constant (an int32 bias, a
// uint8 weight) the float constant it computes. A pattern kiln's symmetric int8 cannot express
// (asymmetric or uint8 activations, a Q without its DQ, scales that are not constants, ...) is
// left as QuantizeLinear/DequantizeLinear ops, computed in float as ONNX defines them.
struct QdqMapping {
  bool any = false;  // the graph had Q/DQ nodes
  size_t kept = 0;   // Q/DQ nodes left as ops
  std::string why;   // why the first of them was left, naming its node
};
Expected<QdqMapping> map_qdq(Graph& g);

// Held-out batches for --accuracy-budget out of n: a fifth, at least 1 (0 when n < 2).
size_t heldout_batches(size_t n);

// After the optimizer. Returns a summary for the build options: where the scales came from,
// the INT8 layers, and the conv/gemm layers left in float with the reason. The scales are those
// of `fp32_graph`, the model optimized at FP32 (nullptr: g is that graph): calibration runs it,
// and a calibration cache is keyed by its fingerprint, so one cache serves a model's builds
// whatever float precision (--fp16, --best, --layer-precisions) surrounds their INT8 layers.
Expected<nlohmann::json> quantize_for_build(Graph& g, const BuildConfig& c, bool explicit_scales,
                                            const Graph* fp32_graph = nullptr);

// --accuracy-budget (accuracy_budget.cpp): builds INT8 engines from `onnx_path` through the
// Engine API, measures each one's outputs against the FP32 engine's on held-out calibration
// batches (relative L2, the worst output), and moves the most sensitive INT8 layers back to
// float (FP16 with --fp16) one at a time until the error is within the budget.
// The INT8 layers of an engine's graph as the layer names that --layer-precisions pins, one group
// per INT8 layer: its own name, and the names of every other layer of `float_graph` (the same
// model optimized without --int8, whose layer names the pins use) that it covers. Layers fused
// after INT8 marking (kiln.FusedConvPair) cover two: moving one back to float must pin both, or
// the other would run INT8 alone and never be measured by itself.
std::vector<std::vector<std::string>> int8_layer_groups(const Graph& int8_graph,
                                                        const Graph& float_graph);

struct BudgetResult {
  std::unique_ptr<Engine> engine;  // the last engine built
  nlohmann::json report;           // budget, errors, sensitivities, layers moved, speed cost
};
Expected<BudgetResult> fit_accuracy_budget(const std::string& onnx_path, const BuildConfig& c);

}  // namespace kiln::quant
