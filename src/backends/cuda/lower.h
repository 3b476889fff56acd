// Lowering for the GPU: decides, for every node of the optimized graph, whether it runs on the
// host (shape arithmetic) or the GPU, the precision and storage formats of each GPU layer, the
// tactic (timed by the tuner when there is a choice), and inserts kiln.Reformat layers wherever
// a tensor's producer and consumer want different formats.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "memory_check.h"
#include "plan.h"

namespace kiln::gpu {

struct GpuBuildOptions {
  bool fp16 = false;  // float layers may store float16 and use FP16 tensor cores
  bool tf32 = true;   // FP32 matrix products may use TF32 tensor cores
  std::map<std::string, std::string> layer_precisions;  // node name ("*": every other) -> "fp32" | "fp16" | "int8"
  std::string layout = "auto";  // "auto" (NHWC for reduced-precision CNN layers), "linear", "nhwc"
  std::string timing_cache;     // path, or empty
  size_t workspace_limit = size_t(1) << 30;
  bool tune = true;             // time candidates (false: the first supported one, for tests)
  std::string force_tactic;     // tests: keep only this tactic (NAME or NAME/VARIANT) where it
                                // implements the op
  // More input shapes to tune at besides the opt shapes (a dynamic profile's small batch:
  // tuning_points). A layer whose fastest candidate of the chosen formats differs there keeps it
  // as an Alternate (plan.h), which the executor runs at shapes nearer that point.
  std::vector<InputShapes> extra_points;
  std::ostream* log = nullptr;  // --verbose: per-layer candidates and times
  // Tests: the free and total device memory the build is checked against (memory_check.h);
  // unset: what the GPU says (no check where none answers).
  std::optional<GpuMemory> gpu_memory;
  // A subgraph's plan (control flow): the formats its inputs arrive in and its outputs must
  // leave in, those of the control-flow layer's own slots; empty: declared type, row-major.
  std::vector<TensorFormat> input_formats, output_formats;
  bool subgraph = false;  // a control-flow layer's subgraph: it runs in the dynamic region
};

// The further tuning points of a profile (per graph input, in order, its min/opt/max): the opt
// shapes with every dimension 0 (the batch, by the convention of TensorRT and the exporters) at
// its minimum, where that minimum is below the opt value, so that an engine with a batch range
// can run at batch 1 the tactics a batch-1 engine would (a GEMM or attention tactic tuned for
// 4096 rows is seldom the best for 128). Empty for a static profile.
std::vector<InputShapes> tuning_points(const std::vector<std::vector<int64_t>>& min_shapes,
                                       const std::vector<std::vector<int64_t>>& opt_shapes);

// The graph edits made before choosing tactics (lower_prepare.cpp): a fused layer no tactic takes
// split into its ops, float inputs of mixed types that no tactic takes cast to input 0's type.
Status prepare_for_gpu(Graph& g, const GpuBuildOptions& o);
// Whether some tactic takes float layer `n` at one of the build's precisions, in either layout.
bool some_tactic_takes(const Node& n, const GpuBuildOptions& o);

// `opt_shapes` follow g.inputs() (the profile's opt shapes). Rewrites `g` (reformat layers) and
// returns the plan whose records follow the rewritten graph's node order.
Expected<Plan> lower_for_gpu(Graph& g, const std::vector<std::vector<int64_t>>& opt_shapes,
                             const GpuBuildOptions& o);

// Which nodes run on the host: Shape/Size, and nodes whose inputs are all constants or host
// values. Per node, in node order.
std::vector<bool> host_nodes(const Graph& g, const std::vector<bool>& host_inputs = {});
// Graph inputs whose values a layer reads on the host (TensorRT's shape tensors: Reshape's
// shape, Reduce's axes, Resize's sizes given as model inputs), directly or through small nodes
// that compute such a value (Range's limit = Cast(size)). Their values decide shapes, so the
// executor reads them on the host before planning an inference.
std::vector<bool> host_value_inputs(const Graph& g);

// A control-flow layer's subgraphs, each lowered into a plan of its own (LayerChoice::subplans)
// whose inputs arrive and outputs leave in the formats of the layer's own slots.
Status lower_subgraphs(const Node& n, const GpuBuildOptions& o, LayerChoice* c);

// A float candidate's formats for node `n` under tactic `t`: every device tensor in precision
// `p`'s storage type, 4-D tensors NHWC when `nhwc`, inputs the tactic reads on the host without
// a format. Lowering's candidates, and what the capability query asks a tactic about.
LayerChoice float_choice(const Node& n, const TacticDef& t, Precision p, bool nhwc);
// An INT8 candidate's formats (docs/quantization.md): X (and a FusedConvPair's X2) int8, the
// residual and Y int8 where their values carry a scale, else `flt`; 4-D tensors NHWC.
LayerChoice make_int8_choice(const Node& n, const TacticDef& t, DataType flt);

}  // namespace kiln::gpu
