// The prefix of an engine with a dynamic region: the layers that run before any size the data
// decides (a detector's backbone and heads, up to its first NonZero or NonMaxSuppression). Their
// shapes follow from the input shapes alone, so at each input shape they can replay as one CUDA
// graph, as a static engine's layers do, instead of one launch (and one shape inference) a layer.
//
// Per input shape: the first run runs the prefix layer by layer (what layers do once at their
// first run happens outside a capture), its values from a pool of the shape's own. The second
// makes a dry pass (every layer configured for this shape, the pool given the blocks the capture
// will take, nothing launched), captures the prefix, reading the graph inputs from blocks of that
// pool, and launches the capture; later runs copy the inputs there (device to device) and replay
// it. The values the rest of the graph reads stay in the
// pool's blocks, held by the capture, so no other value takes them. A capture that fails (a layer
// that synchronizes or allocates) leaves that shape layer by layer. Profiled runs (per-layer
// times) always run layer by layer.
#include <algorithm>
#include <string>
#include <unordered_map>

#include "dynamic.h"
#include "layer.h"
#include "ops/op.h"

namespace kiln::gpu {

struct DynamicGraph::Prefix {
  DevicePool pool;                // the prefix's values at this shape
  std::vector<DynValue> inputs;   // per prefix_inputs_: the blocks the capture reads
  std::vector<DynValue> outputs;  // per prefix_outputs_: what the capture writes
  cudaGraphExec_t exec = nullptr;
  void* workspace = nullptr;  // the workspace the capture uses
  int runs = 0, failed = 0;
  uint64_t used = 0;
  ~Prefix() {
    if (exec) cudaGraphExecDestroy(exec);
  }
};

DynamicGraph::DynamicGraph(const Graph& g, const Plan& plan, bool engine_weights)
    : g_(g), plan_(plan), engine_weights_(engine_weights) {}
DynamicGraph::~DynamicGraph() = default;

namespace {
constexpr size_t kPrefixShapes = 4;  // input shapes that keep a prefix capture
constexpr int kCaptureAttempts = 2;
}  // namespace

// Which nodes form the prefix. A node joins when every input it reads is a constant, a prefix
// value, or a graph input it reads on the device; a host node only where it computes from shapes
// or from host values of the prefix (so its results are fixed for an input shape); a device
// layer only where nothing it reads must be uploaded from the host during the run. Data-dependent
// layers and control flow never join. A prefix without a device layer has nothing to capture.
std::vector<bool> prefix_layers(const Graph& g, const Plan& plan) {
  const auto& nodes = g.nodes();
  std::vector<bool> in(nodes.size(), false);
  std::unordered_map<const Value*, int> made;  // 1 on the device, 2 on the host
  // Graph inputs the prefix may read: on the device, and read by no layer on the host (whose
  // value, not just its shape, would then decide the prefix's work).
  std::unordered_map<const Value*, bool> graph_input;
  for (const Value* v : g.inputs()) graph_input[v] = true;
  for (size_t k = 0; k < nodes.size(); ++k)
    for (size_t i = 0; i < nodes[k]->num_inputs(); ++i) {
      const Value* v = nodes[k]->input(i);
      if (v && graph_input.count(v) &&
          (plan.layers[k].is_host() || !plan.layers[k].in[i].present()) &&
          !is_shape_op(nodes[k]->domain, nodes[k]->op_type))
        graph_input[v] = false;
    }
  auto is_input = [&](const Value* v) {
    auto it = graph_input.find(v);
    return it != graph_input.end() && it->second;
  };
  bool device = false;
  for (size_t k = 0; k < nodes.size(); ++k) {
    const Node* n = nodes[k];
    const LayerChoice& c = plan.layers[k];
    if (!c.is_host() && ((c.tactic->caps & kDataDependent) || !c.subplans.empty())) continue;
    const bool shape_op = c.is_host() && is_shape_op(n->domain, n->op_type);
    bool ok = true;
    for (size_t i = 0; i < n->num_inputs() && ok; ++i) {
      const Value* v = n->input(i);
      if (!v || v->is_constant()) continue;
      const auto it = made.find(v);
      const int m = it == made.end() ? 0 : it->second;
      if (shape_op)
        ok = is_input(v) || m != 0;
      else if (!c.is_host() && c.in[i].present())  // read on the device
        ok = m == 1 || is_input(v);
      else
        ok = m == 2;  // read on the host: a host value of the prefix
    }
    if (!ok) continue;
    in[k] = true;
    device |= !c.is_host();
    for (const Value* y : n->outputs())
      if (y) made[y] = c.is_host() ? 2 : 1;
  }
  if (!device) in.assign(nodes.size(), false);
  return in;
}

// The prefix's nodes, the graph inputs its device layers read, and its values read after it.
void DynamicGraph::plan_prefix() {
  const auto& nodes = g_.nodes();
  in_prefix_ = prefix_layers(g_, plan_);
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (!in_prefix_[k]) continue;
    prefix_nodes_.push_back(k);
    const LayerChoice& c = plan_.layers[k];
    for (size_t i = 0; i < nodes[k]->num_inputs(); ++i) {
      const Value* v = nodes[k]->input(i);
      if (!v || v->is_constant() || c.is_host() || !c.in[i].present()) continue;
      if (std::find(g_.inputs().begin(), g_.inputs().end(), v) == g_.inputs().end()) continue;
      if (std::find(prefix_inputs_.begin(), prefix_inputs_.end(), index_.at(v)) ==
          prefix_inputs_.end())
        prefix_inputs_.push_back(index_.at(v));
    }
  }
  std::vector<bool> read_after(scratch_value_.size(), false);
  for (size_t k = 0; k < nodes.size(); ++k)
    if (!in_prefix_[k])
      for (const Value* v : nodes[k]->inputs())
        if (v && !v->is_constant()) read_after[index_.at(v)] = true;
  for (const Value* v : g_.outputs())
    if (!v->is_constant()) read_after[index_.at(v)] = true;
  for (size_t k : prefix_nodes_)
    for (const Value* y : nodes[k]->outputs())
      if (y && read_after[index_.at(y)]) prefix_outputs_.push_back(index_.at(y));
}

bool DynamicGraph::prefix_on(const DynamicRuntime& rt) const {
  return !prefix_nodes_.empty() && rt.graphs && !rt.times;
}

size_t DynamicGraph::prefix_held_bytes() const {
  size_t b = 0;
  for (const auto& [key, p] : prefixes_) b += p->pool.held_bytes();
  return b;
}

size_t DynamicGraph::prefix_graphs() const {
  size_t n = 0;
  for (const auto& [key, p] : prefixes_) n += p->exec != nullptr;
  return n;
}

Status DynamicGraph::run_prefix_nodes(DynamicRuntime& rt, std::vector<DynValue>& val,
                                      std::vector<int>& left) {
  for (size_t k : prefix_nodes_) {
    KILN_RETURN_IF_ERROR(run_node(rt, k, val));
    consumed(k, val, left);
  }
  return Status::Ok();
}

Status DynamicGraph::run_prefix(DynamicRuntime& rt, std::vector<DynValue>& val,
                                std::vector<int>& left) {
  std::string key;
  for (const Value* v : g_.inputs()) key += shape_str(val[index_.at(v)].t.shape) + '|';
  auto it = prefixes_.find(key);
  if (it == prefixes_.end()) {
    if (prefixes_.size() >= kPrefixShapes) {  // the least recently used shape's goes
      auto lru = std::min_element(prefixes_.begin(), prefixes_.end(),
                                  [](auto& a, auto& b) { return a.second->used < b.second->used; });
      KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));  // its blocks may still be read
      prefixes_.erase(lru);
    }
    it = prefixes_.emplace(key, std::make_unique<Prefix>()).first;
  }
  Prefix& p = *it->second;
  p.used = ++prefix_clock_;
  // A grown workspace is another address: the capture is stale.
  if (p.exec && p.workspace != rt.workspace->get()) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));
    cudaGraphExecDestroy(p.exec);
    p.exec = nullptr;
    p.inputs.clear();
    p.outputs.clear();
  }
  auto copy_inputs = [&]() -> Status {
    for (size_t j = 0; j < prefix_inputs_.size(); ++j) {
      const DynValue& from = val[prefix_inputs_[j]];
      if (from.t.nbytes())
        KILN_CUDA_CHECK(cudaMemcpyAsync(p.inputs[j].t.data, from.t.data, from.t.nbytes(),
                                        cudaMemcpyDeviceToDevice, rt.rc->stream));
    }
    return Status::Ok();
  };
  auto take_outputs = [&]() {
    for (size_t j = 0; j < prefix_outputs_.size(); ++j) {
      val[prefix_outputs_[j]] = p.outputs[j];
      learn(prefix_outputs_[j], p.outputs[j]);
    }
    for (size_t k : prefix_nodes_) consumed(k, val, left);
  };
  if (p.exec) {  // replay
    KILN_RETURN_IF_ERROR(copy_inputs());
    KILN_CUDA_CHECK(cudaGraphLaunch(p.exec, rt.rc->stream));
    take_outputs();
    return Status::Ok();
  }
  rt.alloc = &p.pool;
  struct Restore {
    DynamicRuntime& rt;
    ~Restore() { rt.alloc = nullptr; }
  } restore{rt};
  if (p.runs == 0 || p.failed >= kCaptureAttempts) {  // layer by layer, filling the pool
    ++p.runs;
    return run_prefix_nodes(rt, val, left);
  }
  // Capture: the graph inputs from the pool's blocks, the prefix's values kept for the replays.
  p.inputs.clear();
  std::vector<DynValue> given;
  for (size_t idx : prefix_inputs_) {
    DynValue d = val[idx];
    KILN_ASSIGN_OR_RETURN(d.block, p.pool.get(d.t.nbytes(), "'" + value_[idx]->name + "'"));
    d.t.data = d.block.get();
    p.inputs.push_back(d);
    given.push_back(val[idx]);
  }
  // A dry pass first, on copies: each layer configured for this shape outside the capture (a
  // library may allocate or synchronize there), and the pool given the blocks the capture takes.
  {
    std::vector<DynValue> dval = val;
    std::vector<int> dleft = left;
    for (size_t j = 0; j < prefix_inputs_.size(); ++j) dval[prefix_inputs_[j]] = p.inputs[j];
    rt.dry = true;
    const Status dry = run_prefix_nodes(rt, dval, dleft);
    rt.dry = false;
    KILN_RETURN_IF_ERROR(dry);
  }
  KILN_RETURN_IF_ERROR(copy_inputs());
  for (size_t j = 0; j < prefix_inputs_.size(); ++j) val[prefix_inputs_[j]] = p.inputs[j];
  std::vector<int> left_before = left;
  void* workspace_before = rt.workspace->get();
  KILN_CUDA_CHECK(cudaStreamBeginCapture(rt.rc->stream, cudaStreamCaptureModeThreadLocal));
  Status st = run_prefix_nodes(rt, val, left);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(rt.rc->stream, &graph);
  cudaGraphExec_t exec = nullptr;
  if (st.ok() && end == cudaSuccess && graph && rt.workspace->get() == workspace_before &&
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    exec = nullptr;
  if (graph) cudaGraphDestroy(graph);
  for (size_t j = 0; j < prefix_inputs_.size(); ++j) val[prefix_inputs_[j]] = given[j];
  if (!exec) {
    // Nothing ran: the prefix again, layer by layer, from what the run had before.
    cudaGetLastError();
    ++p.failed;
    p.inputs.clear();
    left = left_before;
    for (size_t k : prefix_nodes_)
      for (const Value* y : g_.nodes()[k]->outputs())
        if (y) val[index_.at(y)] = DynValue{};
    return run_prefix_nodes(rt, val, left);
  }
  p.exec = exec;
  p.workspace = rt.workspace->get();
  p.outputs.clear();
  for (size_t idx : prefix_outputs_) p.outputs.push_back(val[idx]);
  KILN_CUDA_CHECK(cudaGraphLaunch(p.exec, rt.rc->stream));
  return Status::Ok();
}

}  // namespace kiln::gpu
