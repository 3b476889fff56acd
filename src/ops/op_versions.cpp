// The ONNX version history of every ai.onnx op kiln implements (src/ops/op_versions.inc,
// generated from the onnx package by scripts/gen_op_versions.py). The importer resolves which
// version of an op a model's opset means, so a model is judged op by op rather than refused
// for its opset number alone.
#include <algorithm>
#include <array>

#include "ops/op.h"

namespace kiln {
namespace {

struct OpHistory {
  std::string_view op;
  std::array<int16_t, 16> versions;  // ascending; unused slots are 0
};

constexpr OpHistory kHistory[] = {
#include "ops/op_versions.inc"
};

const OpHistory* find_history(std::string_view op) {
  for (const OpHistory& h : kHistory)
    if (h.op == op) return &h;
  return nullptr;
}

}  // namespace

std::vector<int> onnx_op_history(std::string_view op_type) {
  std::vector<int> out;
  if (const OpHistory* h = find_history(op_type))
    for (int16_t v : h->versions)
      if (v > 0) out.push_back(v);
  return out;
}

int onnx_op_version(std::string_view op_type, int opset) {
  int found = 0;
  for (int v : onnx_op_history(op_type))
    if (v <= std::min(opset, kNewestKnownOpset)) found = v;
  return found;
}

Status check_op_version(const Node& n, int opset) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return Status::Ok();
  const OpDef* def = find_op(n.domain, n.op_type);
  const std::vector<int> history = onnx_op_history(n.op_type);
  if (!def || history.empty()) return Status::Ok();
  const int v = onnx_op_version(n.op_type, opset);
  if (v == 0)
    return KILN_ERROR("{}: {} does not exist at opset {} (it was added in opset {})", n.label(),
                      n.op_type, opset, history.front());
  if (def->max_version != 0 && v > def->max_version)
    return KILN_ERROR("{}: {}-{} (opset {}) is not supported: kiln runs {} up to version {}",
                      n.label(), n.op_type, v, opset, n.op_type, def->max_version);
  return Status::Ok();
}

}  // namespace kiln
