// The one table of GPU tactics: every family's TacticDef list, in one explicit place. Lookups
// (what can run this op, which tactic has this name) and the capability query all read it.
#include <cstdlib>
#include <map>
#include <string>

#include "tactics.h"

namespace kiln::gpu {
namespace {

using FamilyFn = std::span<const TacticDef> (*)();
constexpr FamilyFn kFamilies[] = {
    reformat_tactics,       elementwise_tactics, movement_tactics,          reduce_tactics,
    groupnorm_tactics,      layernorm_rows_tactics, conv_tactics,   int8_library_conv_tactics,
    pool_tactics,           gemm_tactics,        relayout_tactics,          data_dependent_tactics,
    rnn_tactics,            sampling_tactics,
};

const std::vector<TacticDef>& table() {
  static const auto* t = [] {
    auto* v = new std::vector<TacticDef>();
    for (FamilyFn f : kFamilies)
      for (const TacticDef& d : f()) v->push_back(d);
    return v;
  }();
  return *t;
}

}  // namespace

std::span<const TacticDef> all_tactics() { return table(); }

std::vector<const TacticDef*> tactics_for(std::string_view domain, std::string_view op_type) {
  if (domain == "ai.onnx") domain = "";
  std::vector<const TacticDef*> out;
  for (const TacticDef& d : table())
    if (d.domain == domain && d.op_type == op_type) out.push_back(&d);
  return out;
}

bool unverified_tactics_enabled(std::string* why, const char* reason) {
  const char* v = std::getenv("KILN_UNVERIFIED_TACTICS");
  if (v && std::string_view(v) == "1") return true;
  if (why) *why = std::string(reason) + " (KILN_UNVERIFIED_TACTICS=1 enables it)";
  return false;
}

bool poison_workspace() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_POISON_WORKSPACE");
    return v && std::string_view(v) == "1";
  }();
  return on;
}

bool tactic_supports(const TacticDef& t, const LayerDesc& d, std::string* why) {
  if (!(t.caps & kPostSteps) && d.node && d.node->attrs.has("post_ops"))
    return *why = "no post steps (post_ops)", false;
  return !t.supports || t.supports(d, why);
}

const TacticDef* find_tactic(std::string_view name) {
  for (const TacticDef& d : table())
    if (d.name == name) return &d;
  return nullptr;
}

bool is_shape_op(std::string_view domain, std::string_view op_type) {
  return (domain.empty() || domain == "ai.onnx") && (op_type == "Shape" || op_type == "Size");
}

const char* layout_name(Layout l) { return l == Layout::kNHWC ? "nhwc" : "linear"; }

bool layouts_share_bytes(const TensorType& t) {
  if (t.rank() != 4) return false;
  auto one = [&](size_t i) { return (*t.dims)[i].is_static() && (*t.dims)[i].value == 1; };
  return one(1) || (one(2) && one(3));
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFP32: return "fp32";
    case Precision::kTF32: return "tf32";
    case Precision::kFP16: return "fp16";
    case Precision::kINT8: return "int8";
  }
  return "?";
}

std::string TensorFormat::str() const {
  return std::string(dtype_name(dtype)) + "/" + layout_name(layout);
}

int64_t DeviceTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
size_t DeviceTensor::nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }

const TensorType& LayerDesc::in_type(size_t i) const {
  static const TensorType kAbsent;
  const Value* v = node->input(i);
  return v ? v->type : kAbsent;
}
const TensorType& LayerDesc::out_type(size_t i) const {
  static const TensorType kAbsent;
  const Value* v = node->output(i);
  return v ? v->type : kAbsent;
}
const Tensor* LayerDesc::in_const(size_t i) const {
  const Value* v = node->input(i);
  return v && v->constant ? v->constant.get() : nullptr;
}

Status cuda_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();  // clear a sticky launch error so the context stays usable
  return KILN_ERROR("{}: {}", what, cudaGetErrorString(e));
}

}  // namespace kiln::gpu
