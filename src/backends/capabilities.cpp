#include "backends/capabilities.h"

#include "ops/fused.h"
#include "ops/op.h"

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

}  // namespace

bool backend_supports_layer(const std::string& backend, const LayerCapabilityQuery& query) {
  if (backend == "cpu") return cpu_supports(query);
  return false;  // cuda: declares no fused layers yet
}

}  // namespace kiln
