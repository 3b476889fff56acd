// If, Loop and Scan in a dynamic run (dynamic.h): the condition and trip count are read on the
// host (read back from the device where the GPU computed them), and each branch or iteration
// runs the subgraph's own plan on the node's values as they are: no copies of captured values,
// a Scan's axis-0 slices are views, scan outputs are stacked with strided copies.
#include <fmt/format.h>

#include <limits>

#include "dynamic.h"
#include "ops/control_flow.h"
#include "ops/op.h"
#include "tactics/check.h"

namespace kiln::gpu {
namespace {

int64_t product(const std::vector<int64_t>& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// A host value uploaded into format `f` (row-major), when it is not on the device yet.
Status to_device(DynamicRuntime& rt, DynValue& v, const TensorFormat& f, const std::string& what) {
  if (v.t.data || !v.host) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(Tensor d, to_device_format(*v.host, f));
  KILN_ASSIGN_OR_RETURN(v.block, rt.pool.get(d.nbytes(), what));
  KILN_RETURN_IF_ERROR(rt.upload(v.block.get(), std::move(d)));
  v.t.data = v.block.get();
  v.t.dtype = f.dtype;
  v.t.layout = f.layout;
  return Status::Ok();
}

Expected<bool> truth(DynamicRuntime& rt, const DynValue& v, const char* what) {
  KILN_ASSIGN_OR_RETURN(auto h, rt.read_back(v, DataType::kBool));
  if (h->numel() != 1) return KILN_ERROR("{} must hold one element, not {}", what, h->desc());
  return h->at_double(0) != 0.0;
}

std::vector<int64_t> dims_or_zero(const TensorType& t) {
  std::vector<int64_t> s;
  if (t.dims)
    for (const Dim& d : *t.dims) s.push_back(d.is_static() ? d.value : 0);
  return s;
}

}  // namespace

Expected<DynValue> stack_values(DynamicRuntime& rt, std::vector<DynValue>& parts, int64_t axis,
                                bool reverse, const TensorFormat& f,
                                const std::vector<int64_t>& empty_dims, const std::string& what) {
  DynValue out;
  out.t.dtype = f.dtype;
  out.t.layout = Layout::kLinear;
  if (parts.empty()) {
    out.t.shape = empty_dims;
    out.t.shape.insert(out.t.shape.begin() + std::min<int64_t>(axis, empty_dims.size()), 0);
    KILN_ASSIGN_OR_RETURN(out.block, rt.pool.get(0, what));
    out.t.data = out.block.get();
    return out;
  }
  for (DynValue& p : parts) KILN_RETURN_IF_ERROR(to_device(rt, p, f, what));
  const std::vector<int64_t>& e = parts[0].t.shape;
  for (size_t t = 1; t < parts.size(); ++t)
    if (parts[t].t.shape != e || parts[t].t.dtype != parts[0].t.dtype)
      return KILN_ERROR("{} is {} in iteration 0 but {} in iteration {}", what, shape_str(e),
                        shape_str(parts[t].t.shape), t);
  const size_t es = dtype_size(parts[0].t.dtype);
  const int64_t len = static_cast<int64_t>(parts.size());
  const size_t outer = static_cast<size_t>(product(e, 0, axis));
  const size_t inner = static_cast<size_t>(product(e, axis, e.size())) * es;
  out.t.dtype = parts[0].t.dtype;
  out.t.shape = e;
  out.t.shape.insert(out.t.shape.begin() + axis, len);
  KILN_ASSIGN_OR_RETURN(out.block, rt.pool.get(outer * inner * len, what));
  out.t.data = out.block.get();
  auto* dst = static_cast<uint8_t*>(out.t.data);
  if (inner && outer)
    for (int64_t t = 0; t < len; ++t) {
      const DynValue& p = parts[reverse ? len - 1 - t : t];
      KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst + t * inner, len * inner, p.t.data, inner, inner, outer,
                                        cudaMemcpyDeviceToDevice, rt.rc->stream));
    }
  return out;
}

Expected<DynValue> slice_value(DynamicRuntime& rt, const DynValue& x, int64_t axis, int64_t t) {
  const std::vector<int64_t>& s = x.t.shape;
  const size_t es = dtype_size(x.t.dtype);
  const size_t outer = static_cast<size_t>(product(s, 0, axis));
  const size_t len = static_cast<size_t>(s[axis]);
  const size_t inner = static_cast<size_t>(product(s, axis + 1, s.size())) * es;
  DynValue out;
  out.t = x.t;
  out.t.host = nullptr;
  out.t.shape.erase(out.t.shape.begin() + axis);
  const auto* src = static_cast<const uint8_t*>(x.t.data) + t * inner;
  if (outer == 1) {  // a view into x
    out.t.data = const_cast<uint8_t*>(src);
    out.block = x.block;
    return out;
  }
  KILN_ASSIGN_OR_RETURN(out.block, rt.pool.get(outer * inner, "a scanned slice"));
  out.t.data = out.block.get();
  if (inner && outer)
    KILN_CUDA_CHECK(cudaMemcpy2DAsync(out.t.data, inner, src, len * inner, inner, outer,
                                      cudaMemcpyDeviceToDevice, rt.rc->stream));
  return out;
}

DynValue DynamicGraph::pass(const Value* v, const std::vector<DynValue>& val) const {
  if (!v) return {};
  if (v->is_constant()) {
    DynValue d;
    d.t.dtype = v->type.dtype;
    d.t.shape = v->constant->shape();
    d.host = v->constant;
    return d;
  }
  return val[index_.at(v)];
}

void DynamicGraph::set_output(size_t k, size_t o, DynValue v, std::vector<DynValue>& val) {
  const Value* y = g_.nodes()[k]->output(o);
  if (!y) return;
  const size_t idx = index_.at(y);
  val[idx] = std::move(v);
  learn(idx, val[idx]);
}

// A body reading a small tensor from outside (a detection's box by the iteration number) then
// computes on the host (host_instead) instead of on the device with a read-back per iteration.
Status DynamicGraph::mirror_captures(DynamicRuntime& rt, size_t k, std::vector<DynValue>& ins,
                                     std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  const size_t first = n->num_inputs() - static_cast<size_t>(capture_count(*n));
  for (size_t i = first; i < n->num_inputs(); ++i) {
    const Value* v = n->input(i);
    DynValue& d = ins[i];
    if (!v || v->is_constant() || d.host || !d.t.data || d.t.numel() > kHostSmall) continue;
    KILN_ASSIGN_OR_RETURN(d.host, rt.read_back(d, v->type.dtype));
    val[index_.at(v)].host = d.host;
  }
  return Status::Ok();
}

Status DynamicGraph::run_if(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  KILN_ASSIGN_OR_RETURN(auto c, host_value(rt, n->input(0), val));
  if (c->numel() != 1)
    return KILN_ERROR("the condition must hold one element, not {}", c->desc());
  const char* branch = c->at_double(0) != 0.0 ? "then_branch" : "else_branch";
  DynamicGraph* s = sub(k, branch);
  if (!s) return KILN_ERROR("'{}' has no plan", branch);
  std::vector<DynValue> ins;
  for (size_t i = 1; i < n->num_inputs(); ++i) ins.push_back(pass(n->input(i), val));
  KILN_ASSIGN_OR_RETURN(auto outs, s->run(rt, std::move(ins)));
  for (size_t o = 0; o < outs.size(); ++o) set_output(k, o, std::move(outs[o]), val);
  return Status::Ok();
}

Status DynamicGraph::run_loop(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  const LayerChoice& c = plan_.layers[k];
  const size_t formal = n->num_inputs() - static_cast<size_t>(capture_count(*n));
  const size_t carried = formal - 2, scans = n->num_outputs() - carried;
  DynamicGraph* body = sub(k, "body");
  const Graph* bg = n->attrs.get_graph("body");
  if (!body || !bg) return KILN_ERROR("the body has no plan");
  int64_t trips = std::numeric_limits<int64_t>::max();
  if (n->input(0)) {
    KILN_ASSIGN_OR_RETURN(auto m, host_value(rt, n->input(0), val));
    if (m->numel() != 1) return KILN_ERROR("the trip count M must hold one element");
    trips = m->at_int(0);
    if (trips < 0) return KILN_ERROR("the trip count M is {}; it must be 0 or more", trips);
  }
  bool cond = true;
  if (n->input(1)) {
    KILN_ASSIGN_OR_RETURN(auto cv, host_value(rt, n->input(1), val));
    if (cv->numel() != 1) return KILN_ERROR("the condition must hold one element");
    cond = cv->at_double(0) != 0.0;
  }
  std::vector<DynValue> ins(2);
  for (size_t i = 2; i < n->num_inputs(); ++i) ins.push_back(pass(n->input(i), val));
  if (trips > 1 && cond) KILN_RETURN_IF_ERROR(mirror_captures(rt, k, ins, val));
  std::vector<std::vector<DynValue>> parts(scans);
  for (int64_t it = 0; it < trips && cond; ++it) {
    ins[0] = DynValue{};
    ins[0].host = std::make_shared<const Tensor>(Tensor::scalar<int64_t>(it));
    ins[0].t.dtype = DataType::kInt64;
    ins[1] = DynValue{};
    ins[1].host = std::make_shared<const Tensor>(Tensor::scalar<bool>(cond));
    ins[1].t.dtype = DataType::kBool;
    KILN_ASSIGN_OR_RETURN(auto outs, body->run(rt, ins));
    if (n->input(1)) {
      KILN_ASSIGN_OR_RETURN(cond, truth(rt, outs[0], "the body's condition"));
    }
    for (size_t i = 0; i < carried; ++i) ins[2 + i] = std::move(outs[1 + i]);
    for (size_t j = 0; j < scans; ++j) parts[j].push_back(std::move(outs[1 + carried + j]));
  }
  for (size_t i = 0; i < carried; ++i) set_output(k, i, std::move(ins[2 + i]), val);
  for (size_t j = 0; j < scans; ++j) {
    const Value* e = bg->outputs()[1 + carried + j];
    KILN_ASSIGN_OR_RETURN(DynValue s,
                          stack_values(rt, parts[j], 0, false, c.out[carried + j],
                                       dims_or_zero(e->type), fmt::format("scan output {}", j)));
    set_output(k, carried + j, std::move(s), val);
  }
  return Status::Ok();
}

Status DynamicGraph::run_scan(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  const LayerChoice& c = plan_.layers[k];
  const size_t formal = n->num_inputs() - static_cast<size_t>(capture_count(*n));
  const size_t m = static_cast<size_t>(n->attrs.get_int("num_scan_inputs", 0));
  const size_t states = formal - m, outs_n = n->num_outputs() - states;
  DynamicGraph* body = sub(k, "body");
  const Graph* bg = n->attrs.get_graph("body");
  if (!body || !bg) return KILN_ERROR("the body has no plan");
  const auto in_axes = n->attrs.get_ints("scan_input_axes", std::vector<int64_t>(m, 0));
  const auto in_dirs = n->attrs.get_ints("scan_input_directions", std::vector<int64_t>(m, 0));
  const auto out_axes = n->attrs.get_ints("scan_output_axes", std::vector<int64_t>(outs_n, 0));
  const auto out_dirs = n->attrs.get_ints("scan_output_directions", std::vector<int64_t>(outs_n, 0));
  std::vector<DynValue> ins;
  for (size_t i = 0; i < n->num_inputs(); ++i) ins.push_back(pass(n->input(i), val));
  std::vector<DynValue> scanned(m);
  std::vector<int64_t> axes(m);
  int64_t len = -1;
  for (size_t j = 0; j < m; ++j) {
    scanned[j] = ins[states + j];
    KILN_RETURN_IF_ERROR(to_device(rt, scanned[j], c.in[states + j], "a scanned input"));
    KILN_ASSIGN_OR_RETURN(axes[j], normalize_axis(in_axes[j], scanned[j].t.rank(), *n));
    const int64_t l = scanned[j].t.shape[axes[j]];
    if (len >= 0 && l != len) return KILN_ERROR("scanned inputs have lengths {} and {}", len, l);
    len = l;
  }
  if (len > 1) KILN_RETURN_IF_ERROR(mirror_captures(rt, k, ins, val));
  std::vector<std::vector<DynValue>> parts(outs_n);
  for (int64_t t = 0; t < len; ++t) {
    for (size_t j = 0; j < m; ++j) {
      KILN_ASSIGN_OR_RETURN(ins[states + j],
                            slice_value(rt, scanned[j], axes[j], in_dirs[j] ? len - 1 - t : t));
    }
    KILN_ASSIGN_OR_RETURN(auto outs, body->run(rt, ins));
    for (size_t i = 0; i < states; ++i) ins[i] = std::move(outs[i]);
    for (size_t j = 0; j < outs_n; ++j) parts[j].push_back(std::move(outs[states + j]));
  }
  for (size_t i = 0; i < states; ++i) set_output(k, i, std::move(ins[i]), val);
  for (size_t j = 0; j < outs_n; ++j) {
    const TensorType& et = bg->outputs()[states + j]->type;
    const int64_t rank = parts[j].empty() ? std::max<int64_t>(et.rank(), 0) : parts[j][0].t.rank();
    KILN_ASSIGN_OR_RETURN(int64_t a, normalize_axis(out_axes[j], rank + 1, *n));
    KILN_ASSIGN_OR_RETURN(DynValue s, stack_values(rt, parts[j], a, out_dirs[j] != 0,
                                                   c.out[states + j], dims_or_zero(et),
                                                   fmt::format("scan output {}", j)));
    set_output(k, states + j, std::move(s), val);
  }
  return Status::Ok();
}

}  // namespace kiln::gpu
