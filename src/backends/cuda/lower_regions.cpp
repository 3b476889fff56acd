// Two parts of lowering that decide where a node runs rather than how: the host (shape arithmetic
// and the small values it needs: host_value_inputs, host_nodes) and, for control flow, the plans
// of its subgraphs (lower_subgraphs), which the executor's dynamic region runs.
#include <fmt/format.h>

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "lower.h"
#include "ops/control_flow.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

namespace {
// Shape arithmetic, not activations: a value this small may be computed on the host.
constexpr int64_t kMaxHostValueElements = 1024;
bool small_value(const Value& v) {
  const auto s = v.type.static_shape();
  if (!s) return false;
  int64_t n = 1;
  for (int64_t d : *s) n *= d;
  return n <= kMaxHostValueElements;
}
// A value larger than shape arithmetic whatever its unknown dims: the dims known multiply past
// the limit (Faster R-CNN's RoI pooling fills zeros of [rois, 256, 7, 7] from a shape it
// computed on the host).
bool large_value(const Value& v) {
  if (!v.type.dims) return false;
  int64_t n = 1;
  for (const Dim& d : *v.type.dims)
    if (d.is_static() && (n *= std::max<int64_t>(d.value, 1)) > kMaxHostValueElements) return true;
  return false;
}
}  // namespace

std::vector<bool> host_value_inputs(const Graph& g) {
  // The values some layer reads on the host (shape, axes, pads, ...), then, walking back through
  // the nodes that compute them, those nodes' inputs while they stay small: a Range whose limit
  // is Cast(size) of a graph input `size` makes `size` an input read on the host (so the Cast
  // runs on the host too, see host_nodes) instead of a value computed on the GPU too late.
  std::unordered_set<const Value*> needed;
  std::vector<std::pair<const Value*, bool>> work;  // value, reached through a producer
  for (const Node* n : g.nodes()) {
    if (is_shape_op(n->domain, n->op_type)) continue;
    // An op whose output shape depends on its input's values has no GPU layer: with small
    // inputs it runs on the host.
    if ((n->domain.empty() || n->domain == "ai.onnx") &&
        (n->op_type == "NonZero" || n->op_type == "NonMaxSuppression"))
      for (const Value* v : n->inputs()) work.emplace_back(v, true);
    // So does an op with no GPU kernel at all (a window function of a size given at run time,
    // a DFT whose axis is an input): its CPU kernel, where its inputs are small.
    if (n->attrs.subgraphs().empty() && tactics_for(n->domain, n->op_type).empty()) {
      const OpDef* def = find_op(n->domain, n->op_type);
      if (def && def->cpu)
        for (const Value* v : n->inputs()) work.emplace_back(v, true);
    }
    for (const TacticDef* t : tactics_for(n->domain, n->op_type))
      for (size_t s = 0; s < n->num_inputs(); ++s)
        if ((t->host_inputs >> s) & 1u) work.emplace_back(n->input(s), false);
  }
  while (!work.empty()) {
    auto [v, derived] = work.back();
    work.pop_back();
    if (!v || v->is_constant() || (derived && !small_value(*v)) || !needed.insert(v).second)
      continue;
    const Node* p = v->producer;
    if (!p || is_shape_op(p->domain, p->op_type) || !small_value(*v)) continue;
    for (size_t i = 0; i < p->num_inputs(); ++i)
      if (!input_is_type_only(*p, i)) work.emplace_back(p->input(i), true);
  }
  std::vector<bool> out(g.inputs().size(), false);
  for (size_t i = 0; i < g.inputs().size(); ++i) out[i] = needed.count(g.inputs()[i]) > 0;
  return out;
}

std::vector<bool> host_nodes(const Graph& g, const std::vector<bool>& host_inputs) {
  std::vector<bool> host(g.nodes().size(), false);
  std::unordered_set<const Value*> host_vals;
  for (size_t i = 0; i < host_inputs.size() && i < g.inputs().size(); ++i)
    if (host_inputs[i]) host_vals.insert(g.inputs()[i]);
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* n = g.nodes()[k];
    bool h = is_shape_op(n->domain, n->op_type);
    // Control flow is the executor's: its subgraphs have GPU plans of their own.
    if (!h && n->attrs.subgraphs().empty()) {
      h = true;
      for (size_t i = 0; i < n->num_inputs(); ++i) {
        const Value* v = n->input(i);
        if (v && !v->is_constant() && !host_vals.count(v) && !input_is_type_only(*n, i)) h = false;
      }
    }
    // Small inputs can make a large output (ConstantOfShape, Expand, Tile, Range): that one is
    // made on the GPU where a tactic takes it, not made on the host and uploaded.
    if (h && !is_shape_op(n->domain, n->op_type) && !tactics_for(n->domain, n->op_type).empty())
      for (const Value* v : n->outputs())
        if (v && large_value(*v)) h = false;
    host[k] = h;
    if (h)
      for (const Value* v : n->outputs())
        if (v) host_vals.insert(v);
  }
  return host;
}

// A control-flow layer's subgraphs, each lowered into a plan of its own whose inputs arrive and
// outputs leave in the formats of the layer's own slots (ops/control_flow.h maps them). Their
// shapes are known only at run time (a Loop's carried values may change from one iteration to
// the next): every layer there takes its first supported tactic.
Status lower_subgraphs(const Node& n, const GpuBuildOptions& o, LayerChoice* c) {
  const TensorFormat scalar_i64{DataType::kInt64, Layout::kLinear};
  const TensorFormat scalar_bool{DataType::kBool, Layout::kLinear};
  for (Graph* sg : n.attrs.subgraphs()) {
    std::string name;
    for (const auto& [an, a] : n.attrs.all())
      if (a.kind == Attribute::Kind::kGraph && a.g.get() == sg) name = an;
    GpuBuildOptions so = o;
    so.subgraph = true;
    so.extra_points.clear();
    so.input_formats.clear();
    so.output_formats.clear();
    const size_t caps = static_cast<size_t>(capture_count(n));
    const size_t formal = n.num_inputs() - caps;
    if (n.op_type == "If") {
      so.input_formats.assign(c->in.begin() + 1, c->in.end());
      so.output_formats = c->out;
    } else if (n.op_type == "Loop") {
      const size_t carried = formal - 2;
      so.input_formats = {scalar_i64, scalar_bool};
      so.input_formats.insert(so.input_formats.end(), c->in.begin() + 2, c->in.end());
      so.output_formats = {scalar_bool};
      so.output_formats.insert(so.output_formats.end(), c->out.begin(), c->out.end());
      (void)carried;
    } else {  // Scan: states, slices of the scanned inputs and captures, as the node's
      so.input_formats = c->in;
      so.output_formats = c->out;
    }
    for (TensorFormat& f : so.input_formats)
      if (!f.present()) f = TensorFormat{DataType::kUndefined, Layout::kLinear};
    std::vector<std::vector<int64_t>> unknown(sg->inputs().size());
    std::ostringstream sublog;
    so.log = o.log ? &sublog : nullptr;
    auto plan = lower_for_gpu(*sg, unknown, so);
    if (!plan.ok()) return plan.status().with_context(fmt::format("{}: '{}'", n.label(), name));
    if (o.log)
      *o.log << n.label() << ": subgraph '" << name << "' planned:\n" << sublog.str();
    c->subplans.emplace_back(name, std::make_shared<Plan>(std::move(plan).value()));
  }
  return Status::Ok();
}

}  // namespace kiln::gpu
