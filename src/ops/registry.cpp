// The one table of all ops: every family's OpDef list, in one explicit place.
#include <map>

#include "ops/op.h"

namespace kiln {
namespace {

using FamilyFn = std::span<const OpDef> (*)();
constexpr FamilyFn kFamilies[] = {
    elementwise_ops,  activation_ops, conv_ops,       pool_ops,       gemm_ops,
    norm_ops,         softmax_ops,    resize_ops,     shape_ops,      index_ops,
    reduce_ops,       quant_ops,      norm_extra_ops, scatter_ops,    einsum_ops,
    attention_ops,    rotary_ops,     rnn_ops,        fused_ops,      transformer_ops,
    control_flow_ops, sampling_ops,   detection_ops,  fused_norm_ops, spectral_ops,
    col2im_ops,       quant_linear_ops, deform_conv_ops,
};

std::vector<std::string>& duplicates() {
  static std::vector<std::string> d;
  return d;
}

const std::map<std::pair<std::string_view, std::string_view>, const OpDef*>& table() {
  static const auto* t = [] {
    auto* m = new std::map<std::pair<std::string_view, std::string_view>, const OpDef*>();
    for (FamilyFn f : kFamilies)
      for (const OpDef& d : f()) {
        if (m->count({d.domain, d.op_type})) duplicates().push_back(std::string(d.op_type));
        (*m)[{d.domain, d.op_type}] = &d;
      }
    return m;
  }();
  return *t;
}

}  // namespace

const OpDef* find_op(std::string_view domain, std::string_view op_type) {
  if (domain == "ai.onnx") domain = "";
  auto it = table().find({domain, op_type});
  return it == table().end() ? nullptr : it->second;
}

bool input_is_type_only(const Node& n, size_t i) {
  return (n.domain.empty() || n.domain == "ai.onnx") && n.op_type == "CastLike" && i == 1;
}

std::vector<std::string> duplicate_op_definitions() {
  table();
  return duplicates();
}

std::vector<const OpDef*> all_ops() {
  std::vector<const OpDef*> out;
  for (const auto& [k, v] : table()) out.push_back(v);
  return out;
}

}  // namespace kiln
