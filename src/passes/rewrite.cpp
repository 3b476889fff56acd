#include "passes/rewrite.h"

#include <algorithm>
#include <cmath>

#include "backends/capabilities.h"
#include "ops/shape_values.h"

namespace kiln::passes {

bool PassContext::backend_supports(const std::string& domain, const std::string& op_type,
                                   const Attributes& attrs, DataType dtype, const Node* node) {
  LayerCapabilityQuery q{domain, op_type, &attrs, dtype, opts.precision, node};
  const bool ok = backend_supports_layer(opts.backend, q);
  if (!ok)
    note(fmt::format("the {} backend cannot run {}{} ({}) as one layer at {}", opts.backend,
                     domain.empty() ? "" : domain + ".", op_type, dtype_name(dtype),
                     opts.precision));
  return ok;
}

std::unique_ptr<Graph> scratch_layer(const std::string& domain, const std::string& op_type,
                                     const std::vector<Value*>& inputs, const Attributes& attrs,
                                     const Value* out) {
  auto g = std::make_unique<Graph>();
  std::vector<Value*> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = inputs[i];
    if (!v) {
      ins.push_back(nullptr);
      continue;
    }
    Value* c = g->add_value("in" + std::to_string(i), v->type);
    c->constant = v->constant;
    c->quant_scales = v->quant_scales;
    c->quant_axis = v->quant_axis;
    ins.push_back(c);
  }
  Node* n = g->add_node(op_type, "layer", ins, {"out"}, domain);
  n->attrs = attrs;
  n->output(0)->type = out->type;
  // Its output's scale too: an INT8 layer writes int8 where the value has one.
  n->output(0)->quant_scales = out->quant_scales;
  n->output(0)->quant_axis = out->quant_axis;
  return g;
}

std::vector<double> tensor_values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.at_double(i);
  return v;
}

bool is_op(const Node* n, const char* op_type) {
  return n && n->domain.empty() && n->op_type == op_type;
}
bool is_kiln_op(const Node* n, const char* op_type) {
  return n && n->domain == "kiln" && n->op_type == op_type;
}

Node* producer_if(const Value* v, const char* op_type) {
  return v && is_op(v->producer, op_type) ? v->producer : nullptr;
}

bool single_use(const Graph& g, const Value* v) {
  return v && v->uses().size() == 1 && !g.is_graph_output(v);
}

Node* sole_consumer(const Graph& g, const Value* v) {
  return single_use(g, v) ? v->uses()[0].first : nullptr;
}

std::optional<double> scalar_const(const Value* v) {
  if (!v || !v->is_constant() || v->constant->numel() != 1) return std::nullopt;
  return v->constant->at_double(0);
}

bool is_scalar_const(const Value* v, double expected, double rel_tol) {
  auto s = scalar_const(v);
  // A 16-bit constant holds the value only to its own precision (sqrt 2 is 1.4140625 in
  // float16): the tolerance is at least one unit in its last place.
  const DataType t = v && v->constant ? v->constant->dtype() : DataType::kFloat32;
  if (t == DataType::kFloat16) rel_tol = std::max(rel_tol, 1.0 / 1024);
  if (t == DataType::kBFloat16) rel_tol = std::max(rel_tol, 1.0 / 128);
  return s && std::abs(*s - expected) <= rel_tol * std::max(1.0, std::abs(expected));
}

bool is_float_type(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

bool same_dims(const TensorType& a, const TensorType& b) {
  if (!a.dims || !b.dims || a.dims->size() != b.dims->size()) return false;
  for (size_t i = 0; i < a.dims->size(); ++i)
    if (!same_dim((*a.dims)[i], (*b.dims)[i])) return false;
  return true;
}

std::vector<int64_t> transpose_perm(const Node& n) {
  std::vector<int64_t> p = n.attrs.get_ints("perm");
  const Value* x = n.input(0);
  if (p.empty() && x && x->type.has_rank())
    for (int64_t i = x->type.rank() - 1; i >= 0; --i) p.push_back(i);
  return p;
}

std::optional<std::pair<int64_t, int64_t>> splits_last_axis(const Node* r) {
  if (!is_op(r, "Reshape") || !r->input(0) || !r->output(0)) return std::nullopt;
  const TensorType &x = r->input(0)->type, &y = r->output(0)->type;
  if (!x.has_rank() || y.rank() != x.rank() + 1 || x.rank() < 1) return std::nullopt;
  const int64_t k = x.rank() - 1;
  for (int64_t i = 0; i < k; ++i)
    if (!same_dim((*x.dims)[i], (*y.dims)[i])) return std::nullopt;
  const Dim &whole = (*x.dims)[k], &h = (*y.dims)[k], &d = (*y.dims)[k + 1];
  if (!whole.is_static() || !h.is_static() || !d.is_static() || h.value * d.value != whole.value)
    return std::nullopt;
  return std::make_pair(h.value, d.value);
}

bool group_is_closed(const Graph& g, const std::vector<Node*>& group, const Value* out) {
  for (const Node* n : group)
    for (const Value* o : n->outputs()) {
      if (!o || o == out) continue;
      if (g.is_graph_output(o)) return false;
      for (auto [user, idx] : o->uses())
        if (std::find(group.begin(), group.end(), user) == group.end()) return false;
    }
  return true;
}

Value* other_input(const Node* n, const Value* v) {
  if (!n || n->num_inputs() != 2 || n->input(0) == n->input(1)) return nullptr;
  if (n->input(0) == v) return n->input(1);
  if (n->input(1) == v) return n->input(0);
  return nullptr;
}

Value* operand_besides_const(const Node* n, const char* op_type, double c,
                             std::optional<bool> c_first) {
  if (!is_op(n, op_type) || n->num_inputs() != 2) return nullptr;
  if ((!c_first || !*c_first) && is_scalar_const(n->input(1), c)) return n->input(0);
  if ((!c_first || *c_first) && is_scalar_const(n->input(0), c)) return n->input(1);
  return nullptr;
}

bool broadcasts_into(const TensorType& other, const TensorType& target) {
  if (!other.dims || !target.dims || other.dims->size() > target.dims->size()) return false;
  const size_t off = target.dims->size() - other.dims->size();
  for (size_t i = 0; i < other.dims->size(); ++i) {
    const Dim& o = (*other.dims)[i];
    const Dim& t = (*target.dims)[off + i];
    if (o.is_static() && o.value == 1) continue;
    if (same_dim(o, t)) continue;
    return false;
  }
  return true;
}

bool mask_fits_scores(const Node& mha, const TensorType& mask) {
  const Value* q = mha.input(0);
  const Value* k = mha.attrs.get_int("packed", 0) != 0 ? q : mha.input(1);
  if (!q || !k || q->type.rank() != 3 || k->type.rank() != 3 || mask.rank() > 4) return false;
  const std::vector<Dim>& qd = *q->type.dims;
  const int sf = mha.attrs.get_int("seq_first", 0) != 0;  // Q, K: [S, B, ..]
  return broadcasts_into(
      mask, TensorType(mask.dtype, {qd[sf], Dim(1), qd[1 - sf], (*k->type.dims)[1 - sf]}));
}

bool activation_attrs(const Node& act, Attributes& to, std::string* why) {
  to.set("activation", Attribute::String(act.op_type));
  if (act.op_type != "Clip") {
    if (act.num_inputs() > 1) return *why = "the activation has extra inputs", false;
    copy_attrs_prefixed(act.attrs, to, "act_");
    return true;
  }
  for (size_t i = 1; i <= 2; ++i) {
    if (act.num_inputs() <= i || !act.input(i)) continue;
    auto bound = scalar_const(act.input(i));
    if (!bound) return *why = "Clip bounds are not constant scalars", false;
    to.set(i == 1 ? "act_min" : "act_max", Attribute::Float(static_cast<float>(*bound)));
  }
  return true;
}

void copy_attrs_prefixed(const Attributes& from, Attributes& to, const std::string& prefix) {
  for (const auto& [k, a] : from.all()) to.set(prefix + k, a);
}

Node* Replacement::add(const std::string& op_type, const std::vector<Value*>& inputs,
                       const std::string& what, size_t outputs) {
  Graph& g = ctx_.g;
  const std::string base = op_.name + "/" + what;
  std::vector<std::string> outs;
  for (size_t i = 0; i < outputs; ++i) outs.push_back(g.unique_name(base));
  Node* p = g.insert_node_before(&op_, op_type, g.unique_name(base), inputs, outs);
  p->origin = ctx_.pass;
  merge_onnx_nodes(*p, op_);
  return p;
}

Value* Replacement::constant(const std::string& what, Tensor t) {
  return ctx_.g.add_constant(ctx_.g.unique_name(op_.name + "/" + what), std::move(t));
}

Status Replacement::finish(Node* last) {
  Value* out = op_.output(0);
  KILN_RETURN_IF_ERROR(ctx_.g.remove_node(&op_, /*force=*/true));
  ctx_.g.set_node_output(last, 0, out);
  return Status::Ok();
}

void merge_onnx_nodes(Node& to, const Node& from) {
  for (const std::string& s : from.onnx_nodes)
    if (std::find(to.onnx_nodes.begin(), to.onnx_nodes.end(), s) == to.onnx_nodes.end())
      to.onnx_nodes.push_back(s);
}

namespace {
std::optional<ColumnPart> slice_part(const Value* v) {
  Node* s = producer_if(v, "Slice");
  if (!s || !s->input(0) || !s->input(0)->type.has_rank() || !v->type.has_rank()) return std::nullopt;
  Value* x = s->input(0);
  const int64_t r = x->type.rank();
  const auto sl = axis_slice(s, r);
  if (r < 1 || !sl || sl->axis != r - 1 || sl->step != 1 || v->type.rank() != r ||
      !x->type.dims->back().is_static() || !v->type.dims->back().is_static())
    return std::nullopt;
  const int64_t d = x->type.dims->back().value;
  auto clamp = [d](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + d : i, 0, d); };
  const int64_t start = clamp(sl->start), end = std::max(start, clamp(sl->end));
  if (end - start != v->type.dims->back().value) return std::nullopt;
  return ColumnPart{s, x, start, end - start};
}
}  // namespace

std::optional<ColumnPart> column_part(const Value* v) {
  if (!v) return std::nullopt;
  if (auto p = slice_part(v)) return p;
  Node* s = producer_if(v, "Split");
  if (!s || !s->input(0) || !s->input(0)->type.has_rank()) return std::nullopt;
  Value* x = s->input(0);
  const int64_t r = x->type.rank();
  const int64_t axis = s->attrs.get_int("axis", 0);
  if (r < 1 || (axis != -1 && axis != r - 1)) return std::nullopt;
  int64_t start = 0;
  for (size_t i = 0; i < s->num_outputs(); ++i) {
    const Value* o = s->output(i);
    if (!o || !o->type.has_rank() || o->type.rank() != r || !o->type.dims->back().is_static())
      return std::nullopt;
    const int64_t w = o->type.dims->back().value;
    if (o == v) return ColumnPart{s, x, start, w};
    start += w;
  }
  return std::nullopt;
}

// A Slice of one axis, its bounds known (see rewrite.h).
std::optional<AxisSlice> axis_slice(const Node* s, int64_t rank) {
  if (!is_op(s, "Slice")) return std::nullopt;
  // Constants, or values whose every element shape inference knows (a start computed from a
  // static dim: TorchScript's x[..., x.shape[-1] // 2:]).
  auto ints = [&](size_t i) -> std::optional<std::vector<int64_t>> {
    const Value* v = s->num_inputs() > i ? s->input(i) : nullptr;
    if (!v) return std::vector<int64_t>{};
    if (v->is_constant()) return v->constant->to_int64_vector();
    const auto known = known_shape_value(v);
    if (!known) return std::nullopt;
    std::vector<int64_t> r;
    for (const SymInt& e : *known) {
      if (!e.value) return std::nullopt;
      r.push_back(*e.value);
    }
    return r;
  };
  const auto starts = ints(1), ends = ints(2), axes = ints(3), steps = ints(4);
  if (!starts || !ends || !axes || !steps || starts->size() != 1 || ends->size() != 1 ||
      axes->size() > 1 || steps->size() > 1)
    return std::nullopt;
  int64_t axis = axes->empty() ? 0 : (*axes)[0];
  if (axis < 0) axis += rank;
  return AxisSlice{axis, (*starts)[0], (*ends)[0], steps->empty() ? 1 : (*steps)[0]};
}

std::optional<std::vector<int64_t>> trailing_axes(const Node* rm, int64_t rank) {
  if (!is_op(rm, "ReduceMean") || rank < 1 || rm->attrs.get_int("keepdims", 1) != 1)
    return std::nullopt;
  std::vector<int64_t> axes = rm->attrs.get_ints("axes");
  if (rm->input(1)) {
    if (!rm->input(1)->is_constant()) return std::nullopt;
    axes = rm->input(1)->constant->to_int64_vector();
  }
  if (axes.empty()) return std::nullopt;
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i))
      return std::nullopt;
  return axes;
}

// A constant equal in shape to the normalized dims (leading 1s allowed), as a tensor of exactly
// that shape.
std::optional<Tensor> affine_param(const Value* v, const std::vector<int64_t>& norm) {
  if (!v || !v->is_constant()) return std::nullopt;
  const Tensor& t = *v->constant;
  std::vector<int64_t> s = t.shape();
  while (s.size() > norm.size() && s.front() == 1) s.erase(s.begin());
  if (s != norm) return std::nullopt;
  auto r = t.reshaped(norm);
  if (!r.ok()) return std::nullopt;
  return *r;
}

std::optional<Tensor> absorb_affine(const Graph& g, const char* op_type,
                                    const std::vector<int64_t>& norm, std::vector<Node*>& group,
                                    Value*& out) {
  Node* n = sole_consumer(g, out);
  if (!is_op(n, op_type)) return std::nullopt;
  std::optional<Tensor> t = affine_param(other_input(n, out), norm);
  if (!t) return std::nullopt;
  group.push_back(n);
  out = n->output(0);
  return t;
}

Tensor ones(const std::vector<int64_t>& norm, DataType t) {
  int64_t count = 1;
  for (int64_t d : norm) count *= d;
  return Tensor::from<float>(norm, std::vector<float>(static_cast<size_t>(count), 1.f)).cast(t);
}

Expected<Node*> replace_with_layer(PassContext& ctx, const std::vector<Node*>& group,
                                   const std::string& domain, const std::string& op_type,
                                   const std::vector<Value*>& inputs, Attributes attrs,
                                   Value* out) {
  Graph& g = ctx.g;
  if (group.empty() || !out || !out->producer)
    return KILN_ERROR("{}: empty group or output", ctx.pass);
  std::vector<Node*> sorted = group;
  std::sort(sorted.begin(), sorted.end(), [](Node* a, Node* b) { return a->index < b->index; });
  // Safety net for match(): every other value the group makes must stay inside it.
  for (Node* n : sorted)
    for (Value* o : n->outputs()) {
      if (!o || o == out) continue;
      if (g.is_graph_output(o))
        return KILN_ERROR("{}: {} output '{}' is a graph output", ctx.pass, n->label(), o->name);
      for (auto [user, idx] : o->uses())
        if (std::find(sorted.begin(), sorted.end(), user) == sorted.end())
          return KILN_ERROR("{}: {} output '{}' is used outside the fused group", ctx.pass,
                            n->label(), o->name);
    }
  const std::string name = group[0]->name;
  Node* fused =
      g.insert_node_before(sorted.back(), op_type, g.unique_name(name), inputs, {}, domain);
  fused->attrs = std::move(attrs);
  fused->origin = ctx.pass;
  fused->onnx_nodes.clear();
  for (Node* n : sorted) merge_onnx_nodes(*fused, *n);
  for (auto it = sorted.rbegin(); it != sorted.rend(); ++it)
    KILN_RETURN_IF_ERROR(g.remove_node(*it, /*force=*/true));
  g.set_node_output(fused, 0, out);
  fused->name = name;
  return fused;
}

Expected<bool> bypass_node(Graph& g, Node* n, Value* out, Value* in) {
  for (Value* o : n->outputs())
    if (o && o != out && (!o->uses().empty() || g.is_graph_output(o))) return false;
  if (!g.is_graph_output(out)) {
    g.replace_all_uses(out, in);
    KILN_RETURN_IF_ERROR(g.remove_node(n, true));
    return true;
  }
  // `out` is a graph output: keep its name by letting in's producer produce it.
  if (!in || !in->producer || g.is_graph_output(in) || g.is_graph_input(in) || in->is_constant())
    return false;
  Node* p = in->producer;
  const size_t idx = static_cast<size_t>(in->producer_index);
  KILN_RETURN_IF_ERROR(g.remove_node(n, true));
  g.replace_all_uses(in, out);
  g.set_node_output(p, idx, out);
  return true;
}

}  // namespace kiln::passes
