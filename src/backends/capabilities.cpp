#include "backends/capabilities.h"

#include <algorithm>

#include "ops/fused.h"
#include "ops/op.h"
#ifdef KILN_WITH_CUDA
#include "backends/cuda/layer.h"
#endif

namespace kiln {

namespace {

bool cpu_supports(const LayerCapabilityQuery& q) {
  const OpDef* def = find_op(q.domain, q.op_type);
  if (!def || !def->cpu || !def->infer) return false;
  if (q.precision != "fp32" && q.precision != "fp64") return false;
  if (q.domain != "kiln") return true;
  if (q.dtype != DataType::kFloat32 && q.dtype != DataType::kFloat64) return false;
  return q.attrs ? fused_layer_supported(q.op_type, *q.attrs) : false;
}

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
  if (q.domain != "kiln") return true;
  return q.attrs ? fused_layer_supported(q.op_type, *q.attrs) : false;
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
