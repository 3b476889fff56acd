// Einsum (opset 12; opset 28 adds bfloat16): numpy's einsum over one equation such as
// "bij,bjk->bik". Supported: any number of inputs, repeated labels within a term (diagonals),
// one "..." per term (broadcast like numpy), and the implicit form without "->" (output =
// "..." then the labels used once, in alphabetical order).
//
// The reference kernel loops over every combination of labels: floats accumulate in double,
// integers in int64, and the result is rounded once to the input type.
#include <algorithm>
#include <map>

#include "core/dispatch.h"
#include "ops/einsum.h"
#include "ops/op.h"

namespace kiln {
namespace {

// A term's labels; kEllipsis marks where "..." stands.
constexpr int kEllipsis = -1;

struct Equation {
  std::vector<std::vector<int>> inputs;  // label codes (letters), kEllipsis for "..."
  std::vector<int> output;
};

Expected<std::vector<int>> parse_term(const Node& n, const std::string& t) {
  std::vector<int> out;
  bool ellipsis = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '.') {
      if (t.compare(i, 3, "...") != 0 || ellipsis)
        return KILN_ERROR("{}: bad einsum term '{}' (one '...' at most)", n.label(), t);
      ellipsis = true;
      out.push_back(kEllipsis);
      i += 2;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      out.push_back(c);
    } else {
      return KILN_ERROR("{}: bad character '{}' in einsum term '{}'", n.label(), c, t);
    }
  }
  return out;
}

Expected<Equation> parse_equation(const Node& n, size_t num_inputs) {
  std::string eq;
  for (char c : n.attrs.get_string("equation", ""))
    if (c != ' ') eq += c;
  if (eq.empty()) return KILN_ERROR("{}: equation is missing", n.label());
  Equation e;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(std::vector<int> t, parse_term(n, lhs.substr(start, comma - start)));
    e.inputs.push_back(std::move(t));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (e.inputs.size() != num_inputs)
    return KILN_ERROR("{}: equation '{}' has {} terms for {} inputs", n.label(), eq,
                      e.inputs.size(), num_inputs);
  std::map<int, int> count;
  bool any_ellipsis = false;
  for (const auto& t : e.inputs)
    for (int l : t) {
      if (l == kEllipsis)
        any_ellipsis = true;
      else
        ++count[l];
    }
  if (arrow != std::string::npos) {
    KILN_ASSIGN_OR_RETURN(e.output, parse_term(n, eq.substr(arrow + 2)));
    for (int l : e.output) {
      if (l == kEllipsis ? !any_ellipsis : !count.count(l))
        return KILN_ERROR("{}: output label '{}' of '{}' is in no input", n.label(),
                          l == kEllipsis ? std::string("...") : std::string(1, char(l)), eq);
      if (l != kEllipsis && std::count(e.output.begin(), e.output.end(), l) > 1)
        return KILN_ERROR("{}: output label '{}' repeats in '{}'", n.label(), char(l), eq);
    }
  } else {
    if (any_ellipsis) e.output.push_back(kEllipsis);
    for (const auto& [l, c] : count)  // std::map: alphabetical (upper case first, as numpy)
      if (c == 1) e.output.push_back(l);
  }
  return e;
}

// Sizes of every label and of the broadcast "..." dims, checked against the input shapes.
struct Layout {
  std::map<int, int64_t> label_size;
  std::vector<int64_t> ellipsis;  // broadcast shape of the "..." dims
};

Expected<Layout> layout(const Node& n, const Equation& e,
                        const std::vector<std::vector<int64_t>>& shapes) {
  Layout L;
  std::vector<std::vector<int64_t>> ell;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const auto& t = e.inputs[i];
    const bool has_ell = std::count(t.begin(), t.end(), kEllipsis) > 0;
    const int64_t named = static_cast<int64_t>(t.size()) - (has_ell ? 1 : 0);
    const int64_t rank = static_cast<int64_t>(shapes[i].size());
    if (has_ell ? rank < named : rank != named)
      return KILN_ERROR("{}: input {} has rank {}, its einsum term names {} dims", n.label(), i,
                        rank, named);
    const int64_t ne = rank - named;
    size_t d = 0;
    for (int l : t) {
      if (l == kEllipsis) {
        ell.emplace_back(shapes[i].begin() + static_cast<int64_t>(d),
                         shapes[i].begin() + static_cast<int64_t>(d) + ne);
        d += static_cast<size_t>(ne);
        continue;
      }
      const int64_t s = shapes[i][d++];
      auto [it, fresh] = L.label_size.emplace(l, s);
      if (!fresh && it->second != s)
        return KILN_ERROR("{}: einsum label '{}' has sizes {} and {}", n.label(), char(l),
                          it->second, s);
    }
  }
  KILN_ASSIGN_OR_RETURN(L.ellipsis, broadcast_shapes(ell, n));
  return L;
}

Status check_types(const Node& n, const std::vector<DataType>& types) {
  for (DataType t : types) {
    if (t == DataType::kUndefined) continue;
    if (t != types[0])
      return KILN_ERROR("{}: Einsum inputs must share one type, got {} and {}", n.label(),
                        dtype_name(types[0]), dtype_name(t));
    if (!dtype_is_float(t) && !dtype_is_integer(t))
      return KILN_ERROR("{}: Einsum does not support type {}", n.label(), dtype_name(t));
  }
  return Status::Ok();
}

Status infer_einsum(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(Equation e, parse_equation(n, ctx.num_inputs()));
  std::vector<DataType> types;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) types.push_back(ctx.input_type(i).dtype);
  KILN_RETURN_IF_ERROR(check_types(n, types));
  const DataType dt = types.empty() ? DataType::kUndefined : types[0];
  std::map<int, Dim> label_dim;
  std::vector<std::vector<Dim>> ell;
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    const TensorType& t = ctx.input_type(i);
    const auto& term = e.inputs[i];
    const bool has_ell = std::count(term.begin(), term.end(), kEllipsis) > 0;
    if (!t.has_rank()) {
      if (has_ell) {
        ctx.set_output(0, TensorType::unknown_rank(dt));
        return Status::Ok();
      }
      continue;
    }
    const int64_t named = static_cast<int64_t>(term.size()) - (has_ell ? 1 : 0);
    if (has_ell ? t.rank() < named : t.rank() != named)
      return KILN_ERROR("{}: input {} has rank {}, its einsum term names {} dims", n.label(), i,
                        t.rank(), named);
    size_t d = 0;
    for (int l : term) {
      if (l == kEllipsis) {
        const auto first = t.dims->begin() + static_cast<int64_t>(d);
        ell.emplace_back(first, first + (t.rank() - named));
        d += static_cast<size_t>(t.rank() - named);
        continue;
      }
      const Dim& dim = (*t.dims)[d++];
      auto it = label_dim.find(l);
      if (it == label_dim.end() || (!it->second.is_static() && dim.is_static())) label_dim[l] = dim;
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> ell_out, broadcast_dims(ell, n));
  std::vector<Dim> out;
  for (int l : e.output) {
    if (l == kEllipsis)
      out.insert(out.end(), ell_out.begin(), ell_out.end());
    else
      out.push_back(label_dim.count(l) ? label_dim[l] : Dim());
  }
  ctx.set_output(0, TensorType(dt, std::move(out)));
  return Status::Ok();
}

// Loop variables: the "..." dims first (ids 0..E-1), then one per label. Each input and the
// output address a variable through a stride (0 where a "..." dim of size 1 is broadcast).
template <typename Acc>
void einsum_loop(const std::vector<const Tensor*>& in, const std::vector<int64_t>& sizes,
                 const std::vector<std::vector<int64_t>>& in_strides,
                 const std::vector<int64_t>& out_strides, std::vector<Acc>& out) {
  const size_t V = sizes.size();
  for (int64_t s : sizes)
    if (s == 0) return;
  std::vector<int64_t> idx(V, 0), off(in.size(), 0);
  int64_t o = 0;
  while (true) {
    Acc prod = 1;
    for (size_t i = 0; i < in.size(); ++i) {
      if constexpr (std::is_same_v<Acc, double>)
        prod *= in[i]->at_double(off[i]);
      else
        prod *= in[i]->at_int(off[i]);
    }
    out[static_cast<size_t>(o)] += prod;
    size_t v = V;
    while (v > 0) {
      --v;
      for (size_t i = 0; i < in.size(); ++i) off[i] += in_strides[i][v];
      o += out_strides[v];
      if (++idx[v] < sizes[v]) break;
      for (size_t i = 0; i < in.size(); ++i) off[i] -= in_strides[i][v] * sizes[v];
      o -= out_strides[v] * sizes[v];
      idx[v] = 0;
      if (v == 0) return;
    }
    if (V == 0) return;
  }
}

}  // namespace

Expected<EinsumPlan> plan_einsum(const Node& n, const std::vector<std::vector<int64_t>>& shapes) {
  KILN_ASSIGN_OR_RETURN(Equation e, parse_equation(n, shapes.size()));
  KILN_ASSIGN_OR_RETURN(Layout L, layout(n, e, shapes));
  const int64_t E = static_cast<int64_t>(L.ellipsis.size());
  EinsumPlan P;
  std::vector<int64_t>& sizes = P.sizes;
  sizes = L.ellipsis;
  std::map<int, size_t> var;
  for (const auto& [l, s] : L.label_size) {
    var[l] = sizes.size();
    sizes.push_back(s);
  }
  const size_t num_in = shapes.size();
  P.in_strides.assign(num_in, std::vector<int64_t>(sizes.size(), 0));
  for (size_t i = 0; i < num_in; ++i) {
    const std::vector<int64_t> st = contiguous_strides(shapes[i]);
    const int64_t named = static_cast<int64_t>(e.inputs[i].size()) -
                          std::count(e.inputs[i].begin(), e.inputs[i].end(), kEllipsis);
    const int64_t ne = static_cast<int64_t>(shapes[i].size()) - named;
    size_t d = 0;
    for (int l : e.inputs[i]) {
      if (l != kEllipsis) {
        P.in_strides[i][var[l]] += st[d++];  // += : a repeated label walks the diagonal
        continue;
      }
      for (int64_t k = 0; k < ne; ++k, ++d)  // right-aligned against the broadcast dims
        if (shapes[i][d] != 1) P.in_strides[i][static_cast<size_t>(E - ne + k)] = st[d];
    }
  }
  for (int l : e.output) {
    if (l == kEllipsis) {
      for (int64_t k = 0; k < E; ++k) {
        P.out_shape.push_back(L.ellipsis[static_cast<size_t>(k)]);
        P.out_vars.push_back(static_cast<size_t>(k));
      }
    } else {
      P.out_shape.push_back(sizes[var[l]]);
      P.out_vars.push_back(var[l]);
    }
  }
  // Variables the output does not name ("..." dims included) are summed over.
  P.out_strides.assign(sizes.size(), 0);
  const std::vector<int64_t> ost = contiguous_strides(P.out_shape);
  for (size_t k = 0; k < P.out_vars.size(); ++k) P.out_strides[P.out_vars[k]] = ost[k];
  return P;
}

namespace {

Status cpu_einsum(KernelContext& ctx) {
  const Node& n = ctx.node();
  std::vector<const Tensor*> in;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<DataType> types;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.input(i)) return KILN_ERROR("{}: input {} is missing", n.label(), i);
    in.push_back(ctx.input(i));
    shapes.push_back(ctx.input(i)->shape());
    types.push_back(ctx.input(i)->dtype());
  }
  if (in.empty()) return KILN_ERROR("{}: Einsum needs at least one input", n.label());
  KILN_RETURN_IF_ERROR(check_types(n, types));
  KILN_ASSIGN_OR_RETURN(EinsumPlan P, plan_einsum(n, shapes));
  const std::vector<int64_t>& sizes = P.sizes;
  const std::vector<std::vector<int64_t>>& in_strides = P.in_strides;
  const std::vector<int64_t>& out_strides = P.out_strides;
  const std::vector<int64_t>& out_shape = P.out_shape;
  const DataType dt = types[0];
  Tensor y(dt, out_shape);
  if (dtype_is_float(dt)) {
    std::vector<double> acc(static_cast<size_t>(y.numel()), 0.0);
    einsum_loop<double>(in, sizes, in_strides, out_strides, acc);
    Tensor t(DataType::kFloat64, out_shape);
    std::copy(acc.begin(), acc.end(), t.data<double>());
    y = t.cast(dt);
  } else {
    std::vector<int64_t> acc(static_cast<size_t>(y.numel()), 0);
    einsum_loop<int64_t>(in, sizes, in_strides, out_strides, acc);
    Tensor t(DataType::kInt64, out_shape);
    std::copy(acc.begin(), acc.end(), t.data<int64_t>());
    y = t.cast(dt);
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "Einsum", infer_einsum, cpu_einsum, nullptr},
};

}  // namespace

std::span<const OpDef> einsum_ops() { return kOps; }

}  // namespace kiln
