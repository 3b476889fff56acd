// kiln.ElementwiseChain and kiln.Attention (see fused.h for their encodings).
#include <algorithm>
#include <cmath>
#include <optional>

#include "ops/fused.h"
#include "ops/fused_util.h"
#include "ops/shape_values.h"

namespace kiln {

namespace {

struct ChainProgram {
  std::vector<std::string> ops;
  std::vector<int64_t> arity, operands;
  int64_t concat_parts = 0;  // inputs 0..concat_parts-1 are operand 0's parts (>= 2), else 0
  int64_t concat_axis = 0;
  std::vector<int64_t> col_slices;  // (start, width) per input, or empty
  int64_t slice_width(size_t i) const {
    return col_slices.empty() ? 0 : col_slices[2 * i + 1];
  }
};

Expected<ChainProgram> read_program(const Node& n, size_t num_inputs) {
  ChainProgram p{n.attrs.get_strings("ops"), n.attrs.get_ints("arity"),
                 n.attrs.get_ints("operands"), n.attrs.get_int("concat_parts", 0),
                 n.attrs.get_int("concat_axis", 0), n.attrs.get_ints("col_slices")};
  if (p.ops.empty() || p.ops.size() != p.arity.size())
    return KILN_ERROR("{}: ops and arity must be non-empty and of equal length", n.label());
  if (p.concat_parts != 0 && (p.concat_parts < 2 || p.concat_parts > kMaxChainConcatParts ||
                              p.concat_parts > static_cast<int64_t>(num_inputs)))
    return KILN_ERROR("{}: concat_parts {} is not between 2 and {} inputs", n.label(),
                      p.concat_parts, std::min<int64_t>(kMaxChainConcatParts, num_inputs));
  if (!p.col_slices.empty()) {
    if (p.col_slices.size() != 2 * num_inputs)
      return KILN_ERROR("{}: col_slices has {} entries, not two per input ({})", n.label(),
                        p.col_slices.size(), num_inputs);
    for (size_t i = 0; i < num_inputs; ++i)
      if (p.col_slices[2 * i] < 0 || p.col_slices[2 * i + 1] < 0 ||
          (p.col_slices[2 * i + 1] > 0 && static_cast<int64_t>(i) < p.concat_parts))
        return KILN_ERROR("{}: bad col_slices for input {}", n.label(), i);
  }
  int64_t total = 0;
  for (int64_t a : p.arity) total += a;
  if (total != static_cast<int64_t>(p.operands.size()))
    return KILN_ERROR("{}: operands has {} entries, arity adds up to {}", n.label(),
                      p.operands.size(), total);
  size_t k = 0;
  for (size_t s = 0; s < p.ops.size(); ++s) {
    if (!chain_op_supported(p.ops[s]))
      return KILN_ERROR("{}: step {} op '{}' cannot be chained", n.label(), s, p.ops[s]);
    for (int64_t i = 0; i < p.arity[s]; ++i, ++k) {
      const int64_t o = p.operands[k];
      if (o < -2 || o >= static_cast<int64_t>(num_inputs) || (o == -1 && s == 0) ||
          (o >= 1 && o < p.concat_parts))
        return KILN_ERROR("{}: step {} has a bad operand {}", n.label(), s, o);
    }
  }
  return p;
}

// The concatenation's dims (its parts' dims with the axis summed), or why the parts do not
// concatenate. Unknown when a part's rank is.
Expected<std::optional<std::vector<Dim>>> concat_dims(const Node& n, const ChainProgram& p,
                                                      const std::vector<const TensorType*>& in) {
  if (!in[0]->has_rank()) return std::optional<std::vector<Dim>>();
  std::vector<Dim> out = *in[0]->dims;
  const int64_t r = static_cast<int64_t>(out.size());
  const int64_t axis = p.concat_axis < 0 ? p.concat_axis + r : p.concat_axis;
  if (axis < 0 || axis >= r)
    return KILN_ERROR("{}: concat_axis {} is out of range for rank {}", n.label(), p.concat_axis,
                      r);
  for (int64_t k = 1; k < p.concat_parts; ++k) {
    const TensorType& t = *in[static_cast<size_t>(k)];
    if (!t.has_rank()) return std::optional<std::vector<Dim>>();
    if (t.rank() != static_cast<int64_t>(out.size()) || t.dtype != in[0]->dtype)
      return KILN_ERROR("{}: concatenation part {} differs in rank or type", n.label(), k);
    const Dim& d = (*t.dims)[static_cast<size_t>(axis)];
    Dim& o = out[static_cast<size_t>(axis)];
    o = add_dims(o, d);
  }
  return std::optional<std::vector<Dim>>(std::move(out));
}

}  // namespace

Status infer_elementwise_chain(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ChainProgram p, read_program(n, ctx.num_inputs()));
  const int64_t first = p.operands[0];
  const DataType dt =
      first >= 0 ? ctx.input_type(static_cast<size_t>(first)).dtype : DataType::kUndefined;
  std::vector<std::vector<Dim>> dims;
  if (p.concat_parts > 0) {
    std::vector<const TensorType*> in;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) in.push_back(&ctx.input_type(i));
    KILN_ASSIGN_OR_RETURN(auto cat, concat_dims(n, p, in));
    if (!cat) {
      ctx.set_output(0, TensorType::unknown_rank(dt));
      return Status::Ok();
    }
    dims.push_back(std::move(*cat));
  }
  for (size_t i = static_cast<size_t>(p.concat_parts); i < ctx.num_inputs(); ++i) {
    const TensorType& t = ctx.input_type(i);
    if (!t.has_rank()) {
      ctx.set_output(0, TensorType::unknown_rank(dt));
      return Status::Ok();
    }
    dims.push_back(*t.dims);
    if (const int64_t w = p.slice_width(i); w > 0) {  // a column range of the input
      const Dim& last = t.dims->empty() ? Dim() : t.dims->back();
      const int64_t start = p.col_slices[2 * i];
      if (t.dims->empty() || (last.is_static() && start + w > last.value))
        return KILN_ERROR("{}: col_slices [{}, {}) exceed input {}'s {}", n.label(), start,
                          start + w, i, t.str());
      dims.back().back() = Dim(w);
    }
  }
  // No step changes the chain's shape (the optimizer guarantees it), so the result has the
  // broadcast shape of all external inputs.
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, broadcast_dims(dims, n));
  ctx.set_output(0, TensorType(dt, std::move(out)));
  return Status::Ok();
}

Status cpu_elementwise_chain(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ChainProgram p, read_program(n, ctx.num_inputs()));
  // The absorbed concatenation, made as the Concat op would (the reference stays the ops').
  Tensor cat;
  if (p.concat_parts > 0) {
    std::vector<const Tensor*> parts;
    for (int64_t i = 0; i < p.concat_parts; ++i) {
      parts.push_back(ctx.input(static_cast<size_t>(i)));
      if (!parts.back()) return KILN_ERROR("{}: concatenation part {} is missing", n.label(), i);
    }
    Attributes a;
    a.set("axis", Attribute::Int(p.concat_axis));
    KILN_ASSIGN_OR_RETURN(cat, fused::run_op(n, "Concat", a, parts));
  }
  // Inputs read as column ranges, sliced as the Slice op would.
  std::vector<Tensor> sliced(ctx.num_inputs());
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const int64_t w = p.slice_width(i);
    if (w == 0) continue;
    const Tensor* x = ctx.input(i);
    if (!x || x->rank() < 1) return KILN_ERROR("{}: input {} cannot be sliced", n.label(), i);
    const int64_t start = p.col_slices[2 * i];
    Tensor st = Tensor::from<int64_t>({1}, {start}), en = Tensor::from<int64_t>({1}, {start + w}),
           ax = Tensor::from<int64_t>({1}, {-1});
    KILN_ASSIGN_OR_RETURN(sliced[i], fused::run_op(n, "Slice", {}, {x, &st, &en, &ax}));
  }
  auto input = [&](size_t i) -> const Tensor* {
    return p.slice_width(i) > 0 ? &sliced[i] : ctx.input(i);
  };
  Tensor cur;
  size_t k = 0;
  for (size_t s = 0; s < p.ops.size(); ++s) {
    std::vector<const Tensor*> ins;
    for (int64_t i = 0; i < p.arity[s]; ++i, ++k) {
      const int64_t o = p.operands[k];
      if (o == 0 && p.concat_parts > 0) {
        ins.push_back(&cat);
        continue;
      }
      ins.push_back(o == -1 ? &cur : o == -2 ? nullptr : input(static_cast<size_t>(o)));
      if (o >= 0 && !ctx.input(static_cast<size_t>(o)))
        return KILN_ERROR("{}: input {} is missing", n.label(), o);
    }
    Attributes a = fused::strip_prefix(n.attrs, fmt::format("s{}_", s));
    KILN_ASSIGN_OR_RETURN(Tensor next, fused::run_op(n, p.ops[s], a, ins));
    cur = std::move(next);
  }
  ctx.set_output(0, std::move(cur));
  return Status::Ok();
}

// --- kiln.Attention
// -------------------------------------------------------------------------------

// Y = softmax(scale * Q Kt + mask) V: its batch dims are Q's, Kt's, the mask's and V's broadcast,
// as the two MatMuls and the Add compute them.
Status infer_attention(InferContext& ctx) {
  const TensorType& q = ctx.input_type(0);
  const TensorType& v = ctx.input_type(2);
  if (!q.has_rank() || !v.has_rank() || q.rank() < 2 || v.rank() < 2) {
    ctx.set_output(0, TensorType::unknown_rank(q.dtype));
    return Status::Ok();
  }
  std::vector<std::vector<Dim>> batches;
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, size_t{3}}) {
    if (!ctx.has_input(i)) continue;
    const TensorType& t = ctx.input_type(i);
    if (!t.has_rank()) {
      ctx.set_output(0, TensorType::unknown_rank(q.dtype));
      return Status::Ok();
    }
    if (t.rank() >= 2) batches.emplace_back(t.dims->begin(), t.dims->end() - 2);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, broadcast_dims(batches, ctx.node()));
  out.push_back((*q.dims)[q.dims->size() - 2]);
  out.push_back(v.dims->back());
  ctx.set_output(0, TensorType(q.dtype, std::move(out)));
  return Status::Ok();
}

Status cpu_attention(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (!ctx.input(0) || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: Q, K and V are required", n.label());
  KILN_ASSIGN_OR_RETURN(Tensor s, fused::run_op(n, "MatMul", {}, {ctx.input(0), ctx.input(1)}));
  const double scale = n.attrs.get_float("scale", 1.f);
  const DataType st = s.dtype();
  if (scale != 1.0 && (st == DataType::kFloat16 || st == DataType::kBFloat16)) {
    Tensor f = s.cast(DataType::kFloat32);  // scaled in float32, rounded once
    for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] *= static_cast<float>(scale);
    s = f.cast(st);
  } else if (scale != 1.0) {
    if (s.dtype() == DataType::kFloat32) {
      float* d = s.data<float>();
      for (int64_t i = 0; i < s.numel(); ++i) d[i] *= static_cast<float>(scale);
    } else if (s.dtype() == DataType::kFloat64) {
      double* d = s.data<double>();
      for (int64_t i = 0; i < s.numel(); ++i) d[i] *= scale;
    } else {
      return KILN_ERROR("{}: scaled attention needs a float type, got {}", n.label(),
                        dtype_name(s.dtype()));
    }
  }
  if (const Tensor* mask = ctx.input(3)) {  // broadcasts exactly as the unfused Add did
    KILN_ASSIGN_OR_RETURN(s, fused::run_op(n, "Add", {}, {&s, mask}));
  }
  Attributes sm;
  sm.set("axis", Attribute::Int(-1));
  KILN_ASSIGN_OR_RETURN(Tensor p, fused::run_op(n, "Softmax", sm, {&s}));
  if (n.attrs.get_int("nan_to_zero", 0) != 0) {  // rows the mask removed entirely give 0
    if (p.dtype() == DataType::kFloat32) {
      for (int64_t i = 0; i < p.numel(); ++i)
        if (std::isnan(p.data<float>()[i])) p.data<float>()[i] = 0.f;
    } else if (p.dtype() == DataType::kFloat64) {
      for (int64_t i = 0; i < p.numel(); ++i)
        if (std::isnan(p.data<double>()[i])) p.data<double>()[i] = 0.0;
    } else if (p.dtype() == DataType::kFloat16 || p.dtype() == DataType::kBFloat16) {
      Tensor f = p.cast(DataType::kFloat32);  // exact both ways
      for (int64_t i = 0; i < f.numel(); ++i)
        if (std::isnan(f.data<float>()[i])) f.data<float>()[i] = 0.f;
      p = f.cast(p.dtype());
    }
  }
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_op(n, "MatMul", {}, {&p, ctx.input(2)}));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

}  // namespace kiln
