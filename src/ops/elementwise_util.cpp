// Definitions of the shared elementwise helpers declared in elementwise_util.h.
#include "ops/elementwise_util.h"

namespace kiln::ew {

const char* const kLegacyAxisAttr = "kiln_broadcast_axis";

namespace {

std::string mask_names(uint32_t mask) {
  std::string s;
  for (int v = 0; v < 32; ++v) {
    if (!((mask >> v) & 1u)) continue;
    if (!s.empty()) s += ", ";
    s += dtype_name(static_cast<DataType>(v));
  }
  return s;
}

}  // namespace

Status check_dtype(const Node& n, const char* what, DataType t, uint32_t mask) {
  if (t == DataType::kUndefined || in_mask(mask, t)) return Status::Ok();
  return KILN_ERROR("{}: {} has type {}, which {} does not support (supported: {})", n.label(),
                    what, dtype_name(t), n.op_type, mask_names(mask));
}

Status check_same_dtype(const Node& n, DataType a, DataType b) {
  if (a == DataType::kUndefined || b == DataType::kUndefined || a == b) return Status::Ok();
  return KILN_ERROR("{}: inputs have different types {} and {}", n.label(), dtype_name(a),
                    dtype_name(b));
}

Expected<const Tensor*> require_input(const KernelContext& ctx, size_t i) {
  const Tensor* t = ctx.input(i);
  if (!t || t->empty_storage())
    return KILN_ERROR("{}: missing required input {}", ctx.node().label(), i);
  return t;
}

namespace {

Expected<std::vector<int64_t>> align_at_axis(const Node& n, int64_t axis_attr, int64_t rank_a,
                                             std::vector<int64_t> b) {
  const int64_t axis = axis_attr < 0 ? axis_attr + rank_a : axis_attr;
  const int64_t trailing = rank_a - axis - static_cast<int64_t>(b.size());
  if (axis < 0 || trailing < 0)
    return KILN_ERROR(
        "{}: legacy broadcast axis {} does not fit second input of rank {} into "
        "rank {}",
        n.label(), axis_attr, b.size(), rank_a);
  b.insert(b.end(), static_cast<size_t>(trailing), 1);
  return b;
}

}  // namespace

Expected<std::vector<int64_t>> legacy_aligned_shape(const Node& n, int64_t rank_a,
                                                    std::vector<int64_t> b) {
  const Attribute* a = n.attrs.find(kLegacyAxisAttr);
  if (!a) return b;
  return align_at_axis(n, a->i, rank_a, std::move(b));
}

Status upgrade_drop_consumed_inputs(ImportContext& ctx) {
  ctx.node().attrs.erase("consumed_inputs");
  return Status::Ok();
}

Status upgrade_legacy_broadcast(ImportContext& ctx) {
  Node& n = ctx.node();
  n.attrs.erase("consumed_inputs");
  if (ctx.opset() >= 7) return Status::Ok();
  const bool broadcast = n.attrs.get_int("broadcast", 0) != 0;
  const Attribute* axis_attr = n.attrs.find("axis");
  const bool has_axis = axis_attr != nullptr;  // read before the erase below frees it
  const int64_t axis = has_axis ? axis_attr->i : 0;
  n.attrs.erase("broadcast");
  n.attrs.erase("axis");
  // Without an axis, legacy broadcasting is suffix matching: the same as numpy's.
  if (!broadcast || !has_axis) return Status::Ok();
  Value* a = n.input(0);
  Value* b = n.input(1);
  if (a && b && b->is_constant() && a->type.has_rank()) {
    // Fold the alignment into the constant right away.
    Tensor bt = *b->constant;
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                          align_at_axis(n, axis, a->type.rank(), bt.shape()));
    KILN_ASSIGN_OR_RETURN(Tensor r, bt.reshaped(shape));
    ctx.graph().set_input(&n, 1, ctx.add_constant("aligned", std::move(r)));
    return Status::Ok();
  }
  n.attrs.set(kLegacyAxisAttr, Attribute::Int(axis));
  return Status::Ok();
}

Status binary_infer_dims(InferContext& ctx, DataType out_dtype) {
  const Node& n = ctx.node();
  const TensorType& a = ctx.input_type(0);
  const TensorType& b = ctx.input_type(1);
  if (!a.has_rank() || !b.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(out_dtype));
    return Status::Ok();
  }
  std::vector<Dim> bd = *b.dims;
  if (n.attrs.has(kLegacyAxisAttr)) {
    std::vector<int64_t> fake(bd.size(), 1);
    KILN_ASSIGN_OR_RETURN(auto aligned, legacy_aligned_shape(n, a.rank(), fake));
    bd.resize(aligned.size(), Dim(1));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> dims, broadcast_dims({*a.dims, bd}, n));
  ctx.set_output(0, TensorType(out_dtype, std::move(dims)));
  return Status::Ok();
}

Expected<std::vector<int64_t>> binary_out_shape(const Node& n, const Tensor& a, Tensor& b_view) {
  if (n.attrs.has(kLegacyAxisAttr)) {
    KILN_ASSIGN_OR_RETURN(auto aligned, legacy_aligned_shape(n, a.rank(), b_view.shape()));
    KILN_ASSIGN_OR_RETURN(b_view, b_view.reshaped(aligned));
  }
  return broadcast_shapes({a.shape(), b_view.shape()}, n);
}

}  // namespace kiln::ew
