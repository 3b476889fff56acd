#include "backends/capabilities.h"

#include <algorithm>

#include "ops/fused.h"
#include "ops/op.h"
#ifdef KILN_WITH_CUDA
#include "backends/cuda/layer.h"
#include "backends/cuda/lower.h"
#endif

namespace kiln {

namespace {

bool cpu_supports(const LayerCapabilityQuery& q) {
  // Kernel-shaped layers: their CPU kernels are the references for other backends; on the CPU
  // the fusion saves nothing.
  if (q.domain == "kiln" && (q.op_type == "FusedConvPool" || q.op_type == "FusedConvPair" ||
                             q.op_type == "FusedConvMean"))
    return false;
  const OpDef* def = find_op(q.domain, q.op_type);
  if (!def || !def->cpu || !def->infer) return false;
  if (q.precision != "fp32" && q.precision != "fp64") return false;
  if (q.domain != "kiln") return true;
  if (q.dtype != DataType::kFloat32 && q.dtype != DataType::kFloat64) return false;
  return q.attrs ? fused_layer_supported(q.op_type, *q.attrs) : false;
}

#ifdef KILN_WITH_CUDA
// Does one of `tactics` (not a fallback) take the layer `n` at the build precision, in the
// formats lowering would offer it (gpu::float_choice, NHWC and linear)? An FP16 build's layers
// are FP16 (what runs in TF32 there is a fallback); an FP32 build's are TF32 or strict FP32.
// At int8 (the passes after INT8 marking), an INT8 tactic in gpu::make_int8_choice's formats.
bool tactic_takes(const std::vector<const gpu::TacticDef*>& tactics, const Node& n,
                  const std::string& precision) {
  if (precision == "int8") {  // a layer marked int8 = 1: its INT8 candidates
    for (const gpu::TacticDef* t : tactics) {
      std::string why;
      if (!(t->caps & gpu::kI8)) continue;
      const gpu::LayerChoice c = gpu::make_int8_choice(n, *t, DataType::kFloat16);
      if (gpu::tactic_supports(*t, c.desc(&n), &why)) return true;
    }
    return false;
  }
  const std::vector<gpu::Precision> precs =
      precision == "fp16" ? std::vector<gpu::Precision>{gpu::Precision::kFP16}
                          : std::vector<gpu::Precision>{gpu::Precision::kTF32, gpu::Precision::kFP32};
  for (const gpu::TacticDef* t : tactics) {
    if (t->caps & gpu::kFallback) continue;
    for (gpu::Precision p : precs)
      for (bool nhwc : {true, false}) {
        std::string why;
        const gpu::LayerChoice c = gpu::float_choice(n, *t, p, nhwc);
        if (gpu::tactic_supports(*t, c.desc(&n), &why)) return true;
      }
  }
  return false;
}
#endif

// cuda: a layer is supported when the GPU tactic table has an implementation of the op (the
// same table lowering dispatches from); fused layers also need their activation or chain steps
// to be ones every backend's fused kernels know (fused_layer_supported).
bool cuda_supports(const LayerCapabilityQuery& q) {
#ifdef KILN_WITH_CUDA
  const auto tactics = gpu::tactics_for(q.domain, q.op_type);
  if (tactics.empty()) return false;
  if (q.precision == "int8" &&  // INT8 kernels: the layers with a tactic taking int8 storage
      std::none_of(tactics.begin(), tactics.end(), [](auto* t) { return t->caps & gpu::kI8; }))
    return false;
  if (q.domain == "kiln" && !(q.attrs && fused_layer_supported(q.op_type, *q.attrs))) return false;
  return !q.node || tactic_takes(tactics, *q.node, q.precision);
#else
  return false;
#endif
}

}  // namespace

bool backend_supports_layer(const std::string& backend, const LayerCapabilityQuery& query) {
  if (backend == "cpu") return cpu_supports(query);
  if (backend == "cuda") return cuda_supports(query);
  return false;
}

}  // namespace kiln
