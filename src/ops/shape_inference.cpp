#include "ops/op.h"
#include "ops/shape_values.h"

namespace kiln {
namespace {

// Keeps what `declared` (from the model) knows where inference left a dim unknown.
TensorType merge(const TensorType& inferred, const TensorType& declared) {
  TensorType out = inferred;
  if (out.dtype == DataType::kUndefined) out.dtype = declared.dtype;
  if (!out.dims) return declared.dims ? TensorType(out.dtype, *declared.dims) : out;
  if (declared.dims && declared.dims->size() == out.dims->size()) {
    for (size_t i = 0; i < out.dims->size(); ++i) {
      Dim& d = (*out.dims)[i];
      const Dim& e = (*declared.dims)[i];
      if (!d.is_static() && (e.is_static() || (d.symbol.empty() && !e.symbol.empty()))) d = e;
    }
  }
  return out;
}

// float8 and int4/uint4 tensors have no C++ element type in the kernels' type dispatch, so
// only these ops may see them: the conversions, and ops that move bytes without reading values.
bool takes_low_bit_types(const Node& n) {
  static const char* kOps[] = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear",
                               "Identity", "Reshape", "Shape", "Size"};
  if (!n.domain.empty() && n.domain != "ai.onnx") return false;
  for (const char* op : kOps)
    if (n.op_type == op) return true;
  return false;
}

Status check_low_bit_inputs(const Node& n) {
  if (takes_low_bit_types(n)) return Status::Ok();
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v && dtype_is_low_bit(v->type.dtype))
      return KILN_ERROR("{}: input '{}' is {}, which kiln supports only in Cast, CastLike, "
                        "QuantizeLinear and DequantizeLinear", n.label(), v->name,
                        dtype_name(v->type.dtype));
  }
  return Status::Ok();
}

// No tensor may hold more than 2^48 elements (a petabyte): a model that declares or computes
// such a shape is refused here, so that the shape arithmetic of later ops cannot overflow int64
// on it (tests/fuzz found declared dims of 6.7e18).
constexpr int64_t kMaxElements = int64_t{1} << 48;

Status check_size(const Value& v, const Node* n) {
  if (!v.type.dims) return Status::Ok();
  int64_t numel = 1;
  for (const Dim& d : *v.type.dims) {
    if (!d.is_static()) continue;
    if (d.value > kMaxElements || (d.value > 0 && numel > kMaxElements / d.value) ||
        (numel *= d.value) > kMaxElements)
      return KILN_ERROR("{}'{}' has type {}, more than 2^48 elements",
                        n ? n->label() + ": output " : "graph input ", v.name, v.type.str());
  }
  return Status::Ok();
}

}  // namespace

Status infer_shapes(Graph& g) {
  for (const Value* v : g.inputs()) KILN_RETURN_IF_ERROR(check_size(*v, nullptr));
  for (Node* n : g.nodes()) {
    const OpDef* def = find_op(n->domain, n->op_type);
    if (!def || !def->infer)
      return KILN_ERROR("{}: no shape inference for op '{}'", n->label(), n->op_type);
    KILN_RETURN_IF_ERROR(check_low_bit_inputs(*n));
    std::vector<TensorType> outs(n->num_outputs());
    InferContext ctx(*n, outs);
    Status st = def->infer(ctx);
    if (!st.ok()) {
      if (st.message().find(n->label()) != std::string::npos) return st;
      return st.with_context(n->label());
    }
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      Value* v = n->output(i);
      if (v && !v->is_constant()) {
        v->type = merge(outs[i], v->type);
        KILN_RETURN_IF_ERROR(check_size(*v, n));
      }
    }
    propagate_shape_value(*n);
  }
  return Status::Ok();
}

}  // namespace kiln
