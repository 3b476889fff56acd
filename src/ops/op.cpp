#include "ops/op.h"

#include <algorithm>

#include "ops/shape_values.h"

namespace kiln {

Value* ImportContext::add_constant(const std::string& what, Tensor t) {
  return graph_.add_constant(graph_.unique_name(node_.name + "_" + what), std::move(t));
}

void ImportContext::attr_to_input(const std::string& attr, size_t index, bool scalar) {
  const Attribute* a = node_.attrs.find(attr);
  if (!a) return;
  Tensor t;
  if (a->kind == Attribute::Kind::kInts) {
    t = Tensor::from<int64_t>({static_cast<int64_t>(a->ints.size())}, a->ints);
  } else if (a->kind == Attribute::Kind::kInt) {
    t = scalar ? Tensor::scalar<int64_t>(a->i) : Tensor::from<int64_t>({1}, {a->i});
  } else {
    return;  // wrong kind: left for the verifier to report
  }
  graph_.set_input(&node_, index, add_constant(attr, std::move(t)));
  node_.attrs.erase(attr);
}

void ImportContext::float_attr_to_input(const std::string& attr, size_t index, DataType dtype,
                                        float def, bool always) {
  const Attribute* a = node_.attrs.find(attr);
  if (!a && !always) return;
  const float v = a ? a->f : def;
  Tensor t = Tensor::scalar<float>(v).cast(dtype);
  graph_.set_input(&node_, index, add_constant(attr, std::move(t)));
  node_.attrs.erase(attr);
}

const TensorType& InferContext::input_type(size_t i) const {
  static const TensorType kAbsent;
  const Value* v = node_.input(i);
  return v ? v->type : kAbsent;
}

const Tensor* InferContext::input_const(size_t i) const {
  const Value* v = node_.input(i);
  return v && v->constant ? v->constant.get() : nullptr;
}

std::optional<std::vector<SymInt>> InferContext::input_value(size_t i) const {
  return known_shape_value(node_.input(i));
}

Expected<int64_t> normalize_axis(int64_t axis, int64_t rank, const Node& n) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  if (rank == 0) return KILN_ERROR("{}: axis {} of a scalar (rank 0)", n.label(), axis);
  if (a < 0 || a >= rank)
    return KILN_ERROR("{}: axis {} is out of range for rank {}", n.label(), axis, rank);
  return a;
}

Expected<std::vector<int64_t>> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes,
                                                const Node& n) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t o = rank - s.size() + k;
      const int64_t d = s[k];
      if (d == out[o] || d == 1) continue;
      if (out[o] == 1) { out[o] = d; continue; }
      return KILN_ERROR("{}: shapes {} cannot be broadcast together (dimension {} is {} vs {})",
                        n.label(), [&] {
                          std::string r;
                          for (const auto& x : shapes) r += shape_str(x) + " ";
                          return r;
                        }(), o, out[o], d);
    }
  }
  return out;
}

Expected<std::vector<Dim>> broadcast_dims(const std::vector<std::vector<Dim>>& dims,
                                          const Node& n) {
  size_t rank = 0;
  for (const auto& s : dims) rank = std::max(rank, s.size());
  std::vector<Dim> out(rank, Dim(1));
  for (const auto& s : dims) {
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t o = rank - s.size() + k;
      const Dim& d = s[k];
      Dim& cur = out[o];
      if (d.is_static() && d.value == 1) continue;
      if (cur.is_static() && cur.value == 1) { cur = d; continue; }
      if (d.is_static() && cur.is_static()) {
        if (d.value != cur.value)
          return KILN_ERROR("{}: dimension {} cannot be broadcast ({} vs {})", n.label(), o,
                            cur.value, d.value);
        continue;
      }
      if (d.is_static()) { cur = d; continue; }  // unknown vs known>1: known wins
      if (cur.is_static()) continue;
      if (!same_dim(d, cur)) cur = Dim();  // two different unknowns
    }
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * shape[i + 1];
  return s;
}

std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in,
                                       const std::vector<int64_t>& out) {
  std::vector<int64_t> s(out.size(), 0);
  const auto cs = contiguous_strides(in);
  const size_t off = out.size() - in.size();
  for (size_t k = 0; k < in.size(); ++k) s[off + k] = in[k] == 1 ? 0 : cs[k];
  return s;
}

Status infer_same_as_input(InferContext& ctx, size_t i) {
  ctx.set_output(0, ctx.input_type(i));
  return Status::Ok();
}

}  // namespace kiln
