// If, Loop and Scan (ops/control_flow.h): inference types each subgraph from the node's inputs;
// the reference kernels run the subgraphs through the executor's SubgraphRunner.
#include "ops/control_flow.h"

#include <cstring>

#include "ops/op.h"
#include "ops/shape_util.h"

namespace kiln {

int64_t capture_count(const Node& n) { return n.attrs.get_int("kiln_captures", 0); }

Expected<std::vector<TensorType>> infer_subgraph(
    Graph& sub, const std::vector<TensorType>& inputs,
    const std::vector<std::optional<std::vector<SymInt>>>& shape_values) {
  if (inputs.size() != sub.inputs().size())
    return KILN_ERROR("subgraph '{}' takes {} inputs but is given {}", sub.name,
                      sub.inputs().size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    Value* v = sub.inputs()[i];
    if (!v) continue;
    TensorType t = inputs[i];
    if (t.dtype == DataType::kUndefined) t.dtype = v->type.dtype;  // as declared
    if (!t.dims && v->type.dims && t.dtype == v->type.dtype) t.dims = v->type.dims;
    v->type = std::move(t);
    v->shape_value = i < shape_values.size() ? shape_values[i] : std::nullopt;
  }
  for (Node* n : sub.nodes())
    for (Value* o : n->outputs())
      if (o && !o->is_constant()) {
        o->type = TensorType();
        o->shape_value.reset();
      }
  KILN_RETURN_IF_ERROR(infer_shapes(sub).with_context(fmt::format("subgraph '{}'", sub.name)));
  std::vector<TensorType> out;
  for (const Value* v : sub.outputs()) out.push_back(v ? v->type : TensorType());
  return out;
}

Expected<TensorType> join_types(const TensorType& a, const TensorType& b, const Node& n,
                                const std::string& what) {
  if (a.dtype != DataType::kUndefined && b.dtype != DataType::kUndefined && a.dtype != b.dtype)
    return KILN_ERROR("{}: {} is {} one way and {} the other", n.label(), what,
                      dtype_name(a.dtype), dtype_name(b.dtype));
  TensorType t;
  t.dtype = a.dtype != DataType::kUndefined ? a.dtype : b.dtype;
  if (!a.dims || !b.dims || a.dims->size() != b.dims->size()) return t;
  std::vector<Dim> dims;
  for (size_t i = 0; i < a.dims->size(); ++i)
    dims.push_back((*a.dims)[i] == (*b.dims)[i] ? (*a.dims)[i] : Dim());
  t.dims = std::move(dims);
  return t;
}

namespace {

bool same_type(const TensorType& a, const TensorType& b) {
  return a.dtype == b.dtype && a.dims == b.dims;
}

// The types and shape values of inputs [from, num_inputs) of `n`.
void feeds_of(const Node& n, size_t from, std::vector<TensorType>& types,
              std::vector<std::optional<std::vector<SymInt>>>& svs) {
  for (size_t i = from; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    types.push_back(v ? v->type : TensorType());
    svs.push_back(v ? v->shape_value : std::nullopt);
  }
}

// A condition or trip count: one element of `want` (where known).
Status check_scalar_input(const InferContext& ctx, size_t i, DataType want, const char* what) {
  if (!ctx.has_input(i)) return Status::Ok();
  const TensorType& t = ctx.input_type(i);
  if (t.dtype != DataType::kUndefined && t.dtype != want)
    return KILN_ERROR("{}: {} must be {}, not {}", ctx.node().label(), what, dtype_name(want),
                      dtype_name(t.dtype));
  if (t.dims)
    for (const Dim& d : *t.dims)
      if (d.is_static() && d.value != 1)
        return KILN_ERROR("{}: {} must hold one element, not {}", ctx.node().label(), what,
                          t.str());
  return Status::Ok();
}

Expected<Graph*> subgraph(const Node& n, const char* name, size_t inputs, size_t outputs) {
  Graph* g = n.attrs.get_graph(name);
  if (!g) return KILN_ERROR("{}: needs the graph attribute '{}'", n.label(), name);
  if (g->inputs().size() != inputs)
    return KILN_ERROR("{}: '{}' takes {} inputs, not the {} this node feeds it", n.label(), name,
                      g->inputs().size(), inputs);
  if (g->outputs().size() != outputs)
    return KILN_ERROR("{}: '{}' has {} outputs, not the {} this node needs", n.label(), name,
                      g->outputs().size(), outputs);
  return g;
}

Expected<size_t> formal_inputs(const Node& n, size_t at_least) {
  const int64_t caps = capture_count(n);
  if (caps < 0 || static_cast<size_t>(caps) > n.num_inputs() ||
      n.num_inputs() - static_cast<size_t>(caps) < at_least)
    return KILN_ERROR("{}: {} inputs with {} captured values is malformed", n.label(),
                      n.num_inputs(), caps);
  return n.num_inputs() - static_cast<size_t>(caps);
}

SubgraphRunner* runner_of(const KernelContext& ctx) { return ctx.subgraphs(); }

Expected<std::vector<Tensor>> run_sub(KernelContext& ctx, const char* name,
                                      const std::vector<Tensor>& ins) {
  SubgraphRunner* r = runner_of(ctx);
  if (!r) return KILN_ERROR("{}: a subgraph runs only inside an executor", ctx.node().label());
  const Graph* g = ctx.node().attrs.get_graph(name);
  if (!g) return KILN_ERROR("{}: needs the graph attribute '{}'", ctx.node().label(), name);
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, r->run(*g, ins));
  if (outs.size() != g->outputs().size())
    return KILN_ERROR("{}: '{}' gave {} outputs, not {}", ctx.node().label(), name, outs.size(),
                      g->outputs().size());
  return outs;
}

Expected<bool> scalar_truth(const Tensor* t, const Node& n, const char* what) {
  if (!t) return KILN_ERROR("{}: {} is missing", n.label(), what);
  if (t->numel() != 1)
    return KILN_ERROR("{}: {} must hold one element, not {}", n.label(), what, t->desc());
  return t->at_double(0) != 0.0;
}

// Stacks same-shaped tensors along a new axis `axis` (0..rank), in reverse order if `reverse`.
// `empty_like`: the element's type for a sequence of length 0 (unknown dims count as 0).
Expected<Tensor> stack(const std::vector<Tensor>& parts, int64_t axis, bool reverse,
                       const TensorType& empty_like, const Node& n, size_t which) {
  if (parts.empty()) {
    std::vector<int64_t> shape;
    if (empty_like.dims)
      for (const Dim& d : *empty_like.dims) shape.push_back(d.is_static() ? d.value : 0);
    shape.insert(shape.begin() + std::min<int64_t>(axis, static_cast<int64_t>(shape.size())), 0);
    return Tensor(empty_like.dtype == DataType::kUndefined ? DataType::kFloat32 : empty_like.dtype,
                  shape);
  }
  const Tensor& first = parts[0];
  for (size_t t = 1; t < parts.size(); ++t)
    if (parts[t].dtype() != first.dtype() || parts[t].shape() != first.shape())
      return KILN_ERROR("{}: scan output {} is {} in iteration 0 but {} in iteration {}",
                        n.label(), which, first.desc(), parts[t].desc(), t);
  const int64_t len = static_cast<int64_t>(parts.size());
  std::vector<int64_t> shape = first.shape();
  shape.insert(shape.begin() + axis, len);
  Tensor out(first.dtype(), shape);
  // Element (outer, t, inner) of the output takes element (outer, inner) of part t.
  const int64_t inner = shape_detail::product(std::span(first.shape()).subspan(axis));
  const int64_t outer = first.numel() / std::max<int64_t>(inner, 1);
  const size_t es = dtype_size(first.dtype()), row = static_cast<size_t>(inner) * es;
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t t = 0; t < len; ++t) {
    const auto* src = static_cast<const uint8_t*>(parts[reverse ? len - 1 - t : t].raw());
    for (int64_t o = 0; o < outer && row; ++o)
      std::memcpy(dst + (o * len + t) * row, src + o * row, row);
  }
  return out;
}

// Slice `t` of `x` along `axis`, the axis removed.
Tensor slice_at(const Tensor& x, int64_t axis, int64_t t) {
  std::vector<int64_t> shape = x.shape(), strides = contiguous_strides(x.shape());
  const int64_t offset = t * strides[axis];
  shape.erase(shape.begin() + axis);
  strides.erase(strides.begin() + axis);
  Tensor out(x.dtype(), shape);
  shape_detail::strided_copy(x.raw(), offset, strides, out.raw(), shape, dtype_size(x.dtype()));
  return out;
}

// --- If(cond, captures...) -------------------------------------------------------------------
Status infer_if(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(size_t formal, formal_inputs(n, 1));
  if (formal != 1) return KILN_ERROR("{}: If takes one input (the condition)", n.label());
  KILN_RETURN_IF_ERROR(check_scalar_input(ctx, 0, DataType::kBool, "the condition"));
  const size_t caps = n.num_inputs() - formal;
  KILN_ASSIGN_OR_RETURN(Graph* then_g, subgraph(n, "then_branch", caps, n.num_outputs()));
  KILN_ASSIGN_OR_RETURN(Graph* else_g, subgraph(n, "else_branch", caps, n.num_outputs()));
  std::vector<TensorType> types;
  std::vector<std::optional<std::vector<SymInt>>> svs;
  feeds_of(n, 1, types, svs);
  auto t = infer_subgraph(*then_g, types, svs);
  auto e = infer_subgraph(*else_g, types, svs);
  // A branch that cannot run at these input types is fine as long as it is not taken (ONNX
  // evaluates the taken branch only): AffineGrid's function splits a 2-D size in its then branch,
  // which a 3-D size, whose condition folds only later, never takes. Both failing, or the taken
  // one, is an error; with the condition unknown, the other branch's types are the outputs' (and
  // the failing branch fails the run that takes it).
  const Tensor* cond = ctx.input_const(0);
  const int taken = cond && cond->numel() == 1 ? (cond->at_double(0) != 0.0 ? 1 : 0) : -1;
  if (taken == 1 || (taken == -1 && !e.ok())) KILN_RETURN_IF_ERROR(t.status());
  if (taken == 0 || (taken == -1 && !t.ok())) KILN_RETURN_IF_ERROR(e.status());
  for (size_t i = 0; i < n.num_outputs(); ++i) {
    if (taken >= 0 || !t.ok() || !e.ok()) {
      ctx.set_output(i, (taken == 1 || (taken == -1 && t.ok())) ? (*t)[i] : (*e)[i]);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(TensorType j, join_types((*t)[i], (*e)[i], n, fmt::format("output {}", i)));
    ctx.set_output(i, std::move(j));
  }
  return Status::Ok();
}

Status cpu_if(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(bool cond, scalar_truth(ctx.input(0), n, "the condition"));
  std::vector<Tensor> ins;
  for (size_t i = 1; i < ctx.num_inputs(); ++i) ins.push_back(ctx.input(i) ? *ctx.input(i) : Tensor());
  KILN_ASSIGN_OR_RETURN(auto outs, run_sub(ctx, cond ? "then_branch" : "else_branch", ins));
  for (size_t i = 0; i < outs.size(); ++i) ctx.set_output(i, std::move(outs[i]));
  return Status::Ok();
}

// --- Loop(M, cond, v_initial..., captures...) --------------------------------------------------
struct LoopShape {
  size_t carried = 0, scans = 0;
};

Expected<LoopShape> loop_shape(const Node& n) {
  KILN_ASSIGN_OR_RETURN(size_t formal, formal_inputs(n, 2));
  LoopShape s{formal - 2, 0};
  if (n.num_outputs() < s.carried)
    return KILN_ERROR("{}: {} loop-carried values but only {} outputs", n.label(), s.carried,
                      n.num_outputs());
  s.scans = n.num_outputs() - s.carried;
  return s;
}

Status infer_loop(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(LoopShape s, loop_shape(n));
  KILN_RETURN_IF_ERROR(check_scalar_input(ctx, 0, DataType::kInt64, "the trip count M"));
  KILN_RETURN_IF_ERROR(check_scalar_input(ctx, 1, DataType::kBool, "the condition"));
  if (!ctx.has_input(0) && !ctx.has_input(1))
    return KILN_ERROR("{}: Loop has neither a trip count (M) nor a condition: it never ends",
                      n.label());
  const size_t caps = n.num_inputs() - 2 - s.carried;
  KILN_ASSIGN_OR_RETURN(Graph* body, subgraph(n, "body", 2 + s.carried + caps, 1 + s.carried + s.scans));
  std::vector<TensorType> types{TensorType(DataType::kInt64, {}), TensorType(DataType::kBool, {})};
  std::vector<std::optional<std::vector<SymInt>>> svs(2);
  feeds_of(n, 2, types, svs);
  for (size_t i = 0; i < s.carried; ++i) svs[2 + i].reset();  // they change from iteration to iteration
  // A carried value's type holds for every iteration once joining the body's result changes it
  // no more (each join only forgets: a few rounds reach it).
  std::vector<TensorType> outs;
  bool stable = false;
  for (int round = 0; round < 8 && !stable; ++round) {
    KILN_ASSIGN_OR_RETURN(outs, infer_subgraph(*body, types, svs));
    stable = true;
    for (size_t i = 0; i < s.carried; ++i) {
      KILN_ASSIGN_OR_RETURN(TensorType j, join_types(types[2 + i], outs[1 + i], n,
                                                     fmt::format("loop-carried value {}", i)));
      if (!same_type(j, types[2 + i])) stable = false;
      types[2 + i] = std::move(j);
    }
  }
  // The body is left typed at the joined types (the optimizer reads its shapes as ones that
  // hold for every iteration).
  if (!stable) {
    KILN_ASSIGN_OR_RETURN(outs, infer_subgraph(*body, types, svs));
  }
  for (size_t i = 0; i < s.carried; ++i) ctx.set_output(i, types[2 + i]);
  // The iteration count is known only for a constant M without a condition.
  Dim trips;
  if (const Tensor* m = ctx.input_const(0); m && m->numel() == 1 && !ctx.has_input(1))
    trips = Dim(std::max<int64_t>(m->at_int(0), 0));
  for (size_t k = 0; k < s.scans; ++k) {
    const TensorType& e = outs[1 + s.carried + k];
    TensorType t = TensorType::unknown_rank(e.dtype);
    if (e.dims) {
      std::vector<Dim> dims{trips};
      dims.insert(dims.end(), e.dims->begin(), e.dims->end());
      t.dims = std::move(dims);
    }
    ctx.set_output(s.carried + k, std::move(t));
  }
  return Status::Ok();
}

Status cpu_loop(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(LoopShape s, loop_shape(n));
  const Graph* body = n.attrs.get_graph("body");
  if (!body) return KILN_ERROR("{}: needs the graph attribute 'body'", n.label());
  int64_t trips = std::numeric_limits<int64_t>::max();
  if (const Tensor* m = ctx.input(0)) {
    if (m->numel() != 1)
      return KILN_ERROR("{}: the trip count M must hold one element, not {}", n.label(), m->desc());
    trips = m->at_int(0);
    if (trips < 0)
      return KILN_ERROR("{}: the trip count M is {}; it must be 0 or more", n.label(), trips);
  }
  bool cond = true;
  if (ctx.input(1)) {
    KILN_ASSIGN_OR_RETURN(cond, scalar_truth(ctx.input(1), n, "the condition"));
  }
  std::vector<Tensor> ins(2 + s.carried);
  for (size_t i = 0; i < s.carried; ++i) {
    if (!ctx.input(2 + i)) return KILN_ERROR("{}: loop-carried value {} is missing", n.label(), i);
    ins[2 + i] = *ctx.input(2 + i);
  }
  for (size_t i = 2 + s.carried; i < ctx.num_inputs(); ++i)
    ins.push_back(ctx.input(i) ? *ctx.input(i) : Tensor());
  std::vector<std::vector<Tensor>> scans(s.scans);
  for (int64_t it = 0; it < trips && cond; ++it) {
    ins[0] = Tensor::scalar<int64_t>(it);
    ins[1] = Tensor::scalar<bool>(cond);
    KILN_ASSIGN_OR_RETURN(auto outs, run_sub(ctx, "body", ins));
    // Without a condition input the body's condition output is ignored (the spec's for loop).
    if (ctx.input(1)) {
      KILN_ASSIGN_OR_RETURN(cond, scalar_truth(&outs[0], n, "the body's condition output"));
    }
    for (size_t i = 0; i < s.carried; ++i) ins[2 + i] = std::move(outs[1 + i]);
    for (size_t k = 0; k < s.scans; ++k) scans[k].push_back(std::move(outs[1 + s.carried + k]));
  }
  for (size_t i = 0; i < s.carried; ++i) ctx.set_output(i, std::move(ins[2 + i]));
  for (size_t k = 0; k < s.scans; ++k) {
    const Value* elem = body->outputs()[1 + s.carried + k];
    KILN_ASSIGN_OR_RETURN(Tensor t, stack(scans[k], 0, false, elem ? elem->type : TensorType(), n, k));
    ctx.set_output(s.carried + k, std::move(t));
  }
  return Status::Ok();
}

// --- Scan(states..., scan_inputs..., captures...) ----------------------------------------------
struct ScanShape {
  size_t states = 0, inputs = 0, outputs = 0;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;  // as given (axes not normalised)
};

Expected<ScanShape> scan_shape(const Node& n) {
  KILN_ASSIGN_OR_RETURN(size_t formal, formal_inputs(n, 0));
  const int64_t m = n.attrs.get_int("num_scan_inputs", -1);
  if (m < 1 || static_cast<size_t>(m) > formal)
    return KILN_ERROR("{}: num_scan_inputs is {} with {} inputs", n.label(), m, formal);
  ScanShape s;
  s.inputs = static_cast<size_t>(m);
  s.states = formal - s.inputs;
  if (n.num_outputs() < s.states)
    return KILN_ERROR("{}: {} state variables but only {} outputs", n.label(), s.states,
                      n.num_outputs());
  s.outputs = n.num_outputs() - s.states;
  auto list = [&](const char* name, size_t count, std::vector<int64_t>& out) -> Status {
    out = n.attrs.get_ints(name, std::vector<int64_t>(count, 0));
    if (out.size() != count)
      return KILN_ERROR("{}: {} has {} entries for {} scanned tensors", n.label(), name,
                        out.size(), count);
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(list("scan_input_axes", s.inputs, s.in_axes));
  KILN_RETURN_IF_ERROR(list("scan_input_directions", s.inputs, s.in_dirs));
  KILN_RETURN_IF_ERROR(list("scan_output_axes", s.outputs, s.out_axes));
  KILN_RETURN_IF_ERROR(list("scan_output_directions", s.outputs, s.out_dirs));
  return s;
}

Status infer_scan(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ScanShape s, scan_shape(n));
  const size_t caps = n.num_inputs() - s.states - s.inputs;
  KILN_ASSIGN_OR_RETURN(Graph* body, subgraph(n, "body", s.states + s.inputs + caps, s.states + s.outputs));
  std::vector<TensorType> types;
  std::vector<std::optional<std::vector<SymInt>>> svs;
  feeds_of(n, 0, types, svs);
  Dim len;
  for (size_t j = 0; j < s.inputs; ++j) {
    TensorType& t = types[s.states + j];
    svs[s.states + j].reset();
    if (!t.dims) continue;
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(s.in_axes[j], t.rank(), n));
    const Dim d = (*t.dims)[static_cast<size_t>(a)];
    if (d.is_static() && len.is_static() && d.value != len.value)
      return KILN_ERROR("{}: scanned inputs have lengths {} and {}", n.label(), len.value, d.value);
    if (!len.is_static() && (d.is_static() || len.symbol.empty())) len = d;
    t.dims->erase(t.dims->begin() + a);
  }
  for (size_t i = 0; i < s.states; ++i) svs[i].reset();
  std::vector<TensorType> outs;
  bool stable = false;
  for (int round = 0; round < 8 && !stable; ++round) {
    KILN_ASSIGN_OR_RETURN(outs, infer_subgraph(*body, types, svs));
    stable = true;
    for (size_t i = 0; i < s.states; ++i) {
      KILN_ASSIGN_OR_RETURN(TensorType j, join_types(types[i], outs[i], n,
                                                     fmt::format("state variable {}", i)));
      if (!same_type(j, types[i])) stable = false;
      types[i] = std::move(j);
    }
    if (stable) break;
  }
  for (size_t i = 0; i < s.states; ++i) ctx.set_output(i, types[i]);
  for (size_t k = 0; k < s.outputs; ++k) {
    const TensorType& e = outs[s.states + k];
    TensorType t = TensorType::unknown_rank(e.dtype);
    if (e.dims) {
      KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(s.out_axes[k], e.rank() + 1, n));
      std::vector<Dim> dims = *e.dims;
      dims.insert(dims.begin() + a, len);
      t.dims = std::move(dims);
    }
    ctx.set_output(s.states + k, std::move(t));
  }
  return Status::Ok();
}

Status cpu_scan(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ScanShape s, scan_shape(n));
  const Graph* body = n.attrs.get_graph("body");
  if (!body) return KILN_ERROR("{}: needs the graph attribute 'body'", n.label());
  std::vector<Tensor> ins;
  for (size_t i = 0; i < s.states; ++i) {
    if (!ctx.input(i)) return KILN_ERROR("{}: state variable {} is missing", n.label(), i);
    ins.push_back(*ctx.input(i));
  }
  std::vector<int64_t> axes(s.inputs);
  int64_t len = -1;
  for (size_t j = 0; j < s.inputs; ++j) {
    const Tensor* x = ctx.input(s.states + j);
    if (!x) return KILN_ERROR("{}: scanned input {} is missing", n.label(), j);
    KILN_ASSIGN_OR_RETURN(axes[j], normalize_axis(s.in_axes[j], x->rank(), n));
    const int64_t l = x->dim(axes[j]);
    if (len >= 0 && l != len)
      return KILN_ERROR("{}: scanned inputs have lengths {} and {}", n.label(), len, l);
    len = l;
    ins.emplace_back();
  }
  for (size_t i = s.states + s.inputs; i < ctx.num_inputs(); ++i)
    ins.push_back(ctx.input(i) ? *ctx.input(i) : Tensor());
  std::vector<std::vector<Tensor>> scans(s.outputs);
  for (int64_t t = 0; t < len; ++t) {
    for (size_t j = 0; j < s.inputs; ++j)
      ins[s.states + j] = slice_at(*ctx.input(s.states + j), axes[j], s.in_dirs[j] ? len - 1 - t : t);
    KILN_ASSIGN_OR_RETURN(auto outs, run_sub(ctx, "body", ins));
    for (size_t i = 0; i < s.states; ++i) ins[i] = std::move(outs[i]);
    for (size_t k = 0; k < s.outputs; ++k) scans[k].push_back(std::move(outs[s.states + k]));
  }
  for (size_t i = 0; i < s.states; ++i) ctx.set_output(i, std::move(ins[i]));
  for (size_t k = 0; k < s.outputs; ++k) {
    const Value* elem = body->outputs()[s.states + k];
    const TensorType et = elem ? elem->type : TensorType();
    const int64_t rank = scans[k].empty() ? et.rank() : scans[k][0].rank();
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(s.out_axes[k], std::max<int64_t>(rank, 0) + 1, n));
    KILN_ASSIGN_OR_RETURN(Tensor out, stack(scans[k], a, s.out_dirs[k] != 0, et, n, k));
    ctx.set_output(s.states + k, std::move(out));
  }
  return Status::Ok();
}

// Scan-8 scanned a leading batch axis and took sequence_lens; opset 9 dropped both.
Status upgrade_scan(ImportContext& ctx) {
  if (ctx.opset() < 9)
    return KILN_ERROR("{}: Scan before opset 9 (batched, with sequence_lens) is not supported; "
                      "re-export at opset 9 or later", ctx.node().label());
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "If", infer_if, cpu_if, nullptr},
    {"", "Loop", infer_loop, cpu_loop, nullptr},
    {"", "Scan", infer_scan, cpu_scan, upgrade_scan},
};

}  // namespace

std::span<const OpDef> control_flow_ops() { return kOps; }

}  // namespace kiln
