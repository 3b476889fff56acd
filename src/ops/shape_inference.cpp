#include "ops/op.h"

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

}  // namespace

Status infer_shapes(Graph& g) {
  for (Node* n : g.nodes()) {
    const OpDef* def = find_op(n->domain, n->op_type);
    if (!def || !def->infer)
      return KILN_ERROR("{}: no shape inference for op '{}'", n->label(), n->op_type);
    std::vector<TensorType> outs(n->num_outputs());
    InferContext ctx(*n, outs);
    Status st = def->infer(ctx);
    if (!st.ok()) {
      if (st.message().find(n->label()) != std::string::npos) return st;
      return st.with_context(n->label());
    }
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      Value* v = n->output(i);
      if (v && !v->is_constant()) v->type = merge(outs[i], v->type);
    }
  }
  return Status::Ok();
}

}  // namespace kiln
