#include "dynamic.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <limits>

#include "ops/control_flow.h"
#include "ops/op.h"
#include "shape_eval.h"
#include "tactics/check.h"

namespace kiln::gpu {
namespace {

constexpr size_t kMinBlock = 256;

std::string op_label(const Node& n) { return n.label(); }

DeviceTensor host_only(const Tensor& t) {
  DeviceTensor d;
  d.dtype = t.dtype();
  d.shape = t.shape();
  return d;
}

// A shape appended to a memo key as its rank and raw dims (no formatting: this runs per layer).
void append_shape(std::string& key, const std::vector<int64_t>& shape) {
  key += static_cast<char>(shape.size());
  key.append(reinterpret_cast<const char*>(shape.data()), shape.size() * sizeof(int64_t));
}

DynValue host_scalar_i64(int64_t v) {
  auto t = std::make_shared<const Tensor>(Tensor::scalar<int64_t>(v));
  return {host_only(*t), nullptr, t};
}

DynValue host_scalar_bool(bool v) {
  auto t = std::make_shared<const Tensor>(Tensor::scalar<bool>(v));
  return {host_only(*t), nullptr, t};
}

}  // namespace

// --- DevicePool -----------------------------------------------------------------------------

DevicePool::~DevicePool() {
  free_->pool_alive = false;
  for (auto& [bytes, p] : free_->blocks) cudaFree(p);
  free_->blocks.clear();
}

Expected<std::shared_ptr<void>> DevicePool::get(size_t bytes, const std::string& what) {
  bytes = std::max(kMinBlock, (bytes + kMinBlock - 1) / kMinBlock * kMinBlock);
  void* p = nullptr;
  size_t size = bytes;
  // The smallest free block that fits and wastes at most half of itself.
  auto it = free_->blocks.lower_bound(bytes);
  if (it != free_->blocks.end() && it->first <= 2 * bytes) {
    p = it->second;
    size = it->first;
    free_->blocks.erase(it);
  } else {
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      // Free blocks the pool holds back may be what is missing.
      for (auto& [b, q] : free_->blocks) cudaFree(q);
      held_ = 0;
      free_->blocks.clear();
      if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        return KILN_ERROR("out of GPU memory: {} needs {} MiB ({} MiB free of {} MiB)", what,
                          bytes >> 20, free_bytes >> 20, total >> 20);
      }
    }
    held_ += bytes;
  }
  std::shared_ptr<Free> f = free_;
  return std::shared_ptr<void>(p, [f, size](void* q) {
    if (f->pool_alive)
      f->blocks.emplace(size, q);
    else
      cudaFree(q);
  });
}

// --- DynamicRuntime -------------------------------------------------------------------------

DynamicRuntime::~DynamicRuntime() {
  if (dims) cudaFreeHost(dims);
}

int64_t* DynamicRuntime::take_dims(size_t outputs) {
  if (dims_used + outputs > dims_outputs) return nullptr;
  int64_t* d = dims + dims_used * kMaxDynRank;
  dims_used += outputs;
  return d;
}

Status DynamicRuntime::ensure_dims(size_t outputs) {
  if (outputs <= dims_outputs) return Status::Ok();
  if (dims) cudaFreeHost(dims);
  dims = nullptr;
  // Host memory the device writes through (UVA: the same address on both sides).
  KILN_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&dims),
                                outputs * kMaxDynRank * sizeof(int64_t), cudaHostAllocMapped));
  dims_outputs = outputs;
  return Status::Ok();
}

// In stream order: the block may have been another value's, still read by queued kernels. The
// host copy stays alive until the run ends (a pageable copy may read it after the call returns).
Status DynamicRuntime::upload(void* dst, Tensor host) {
  if (host.nbytes())
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst, host.raw(), host.nbytes(), cudaMemcpyHostToDevice, rc->stream));
  staged.push_back(std::move(host));
  return Status::Ok();
}

Expected<std::shared_ptr<const Tensor>> DynamicRuntime::read_back(const DynValue& v, DataType to) {
  if (v.host) return v.host;
  if (!v.t.data && v.t.numel() != 0) return KILN_ERROR("a value to read back has no data");
  KILN_ASSIGN_OR_RETURN(Tensor t, copy_to_host(v.t, to, rc->stream));
  return std::make_shared<const Tensor>(std::move(t));
}

// --- DynamicGraph ---------------------------------------------------------------------------

Expected<std::unique_ptr<DynamicGraph>> DynamicGraph::create(const Graph& g, const Plan& plan,
                                                             bool engine_weights) {
  if (plan.layers.size() != g.nodes().size())
    return KILN_ERROR("graph '{}': {} plan records for {} nodes", g.name, plan.layers.size(),
                      g.nodes().size());
  std::unique_ptr<DynamicGraph> d(new DynamicGraph(g, plan, engine_weights));
  d->scratch_ = g.clone();
  for (const Value* v : g.values()) {
    d->index_[v] = d->scratch_value_.size();
    d->value_.push_back(v);
    d->scratch_value_.push_back(d->scratch_->find_value(v->name));
    if (!d->scratch_value_.back())
      return KILN_ERROR("graph '{}': value '{}' has no copy", g.name, v->name);
  }
  d->uses_.assign(d->scratch_value_.size(), 0);
  for (const Node* n : g.nodes()) {
    d->reads_.emplace_back();
    for (const Value* v : n->inputs()) {
      if (!v) continue;
      ++d->uses_[d->index_.at(v)];
      if (!v->is_constant()) d->reads_.back().push_back(d->index_.at(v));
    }
  }
  for (const Value* v : g.outputs()) ++d->uses_[d->index_.at(v)];
  d->configured_.resize(g.nodes().size());
  d->shapes_.resize(g.nodes().size());
  d->host_shapes_.resize(g.nodes().size());
  d->relayout_types_.resize(g.nodes().size());
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* n = g.nodes()[k];
    const LayerChoice& c = plan.layers[k];
    if (c.is_host()) {
      d->layers_.emplace_back();
      continue;
    }
    if (!c.subplans.empty()) {
      for (const auto& [name, sp] : c.subplans) {
        const Graph* sg = n->attrs.get_graph(name);
        if (!sg) return KILN_ERROR("{}: no subgraph '{}' for its plan", n->label(), name);
        auto sub = create(*sg, *sp, /*engine_weights=*/false);
        if (!sub.ok()) return sub.status().with_context(n->label());
        d->subs_[{k, name}] = std::move(sub).value();
      }
      d->layers_.emplace_back();
      continue;
    }
    auto layer = c.tactic->create(c.desc(n));
    if (!layer.ok()) return layer.status().with_context(n->label());
    d->layers_.push_back(std::move(layer).value());
  }
  if (engine_weights) d->plan_prefix();  // the main graph's
  return d;
}

DynamicGraph* DynamicGraph::sub(size_t k, const std::string& name) {
  auto it = subs_.find({k, name});
  return it == subs_.end() ? nullptr : it->second.get();
}

void DynamicGraph::learn(size_t idx, const DynValue& v) {
  Value* sv = scratch_value_[idx];
  const Value* orig = value_[idx];
  sized_[idx] = true;
  if (!sv || orig->is_constant()) return;
  std::vector<Dim> dims(v.t.shape.begin(), v.t.shape.end());
  sv->type = TensorType(orig->type.dtype, std::move(dims));
  sv->constant = v.host;
}

Expected<std::shared_ptr<const Tensor>> DynamicGraph::host_value(DynamicRuntime& rt,
                                                                 const Value* v,
                                                                 std::vector<DynValue>& val) {
  if (v->is_constant()) return v->constant;
  DynValue& dv = val[index_.at(v)];
  if (!dv.known()) return KILN_ERROR("'{}' was not computed", v->name);
  if (!dv.host) {
    KILN_ASSIGN_OR_RETURN(dv.host, rt.read_back(dv, v->type.dtype));
  }
  return dv.host;
}

Expected<DeviceTensor> DynamicGraph::device_input(DynamicRuntime& rt, size_t k, size_t i,
                                                  std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  const TensorFormat& f = plan_.layers[k].in[i];
  const Value* v = n->input(i);
  DeviceTensor t;
  if (!v) return t;
  if (!f.present()) {  // read on the host only
    KILN_ASSIGN_OR_RETURN(auto h, host_value(rt, v, val));
    t = host_only(*h);
    t.dtype = v->type.dtype;
    t.host = h.get();
    return t;
  }
  auto upload = [&](const Tensor& h, std::shared_ptr<void>& block) -> Status {
    KILN_ASSIGN_OR_RETURN(Tensor d, to_device_format(h, f));
    KILN_ASSIGN_OR_RETURN(block, rt.pool_now().get(d.nbytes(), "'" + v->name + "'"));
    return rt.upload(block.get(), std::move(d));
  };
  if (v->is_constant()) {
    t.shape = v->constant->shape();
    t.dtype = f.dtype;
    t.layout = f.layout;
    t.host = v->constant.get();
    if (engine_weights_ && rt.engine_weight) {
      t.data = rt.engine_weight(v, f);
      return t;
    }
    const auto key = std::make_tuple(v, f.dtype, f.layout);
    auto it = consts_.find(key);
    if (it == consts_.end()) {
      std::shared_ptr<void> block;
      KILN_RETURN_IF_ERROR(upload(*v->constant, block));
      it = consts_.emplace(key, std::move(block)).first;
    }
    t.data = it->second.get();
    return t;
  }
  DynValue& dv = val[index_.at(v)];
  if (!dv.known()) return KILN_ERROR("{}: input '{}' was not computed", n->label(), v->name);
  if (dv.t.data && dv.t.dtype == f.dtype && dv.t.layout == f.layout) {
    t = dv.t;
    t.host = dv.host.get();
    return t;
  }
  if (!dv.host)
    return KILN_ERROR("{}: input '{}' is stored as {} but the layer reads {}", n->label(), v->name,
                      TensorFormat{dv.t.dtype, dv.t.layout}.str(), f.str());
  // A value computed on the host (or given as one): uploaded in this format for this run.
  std::shared_ptr<void> block;
  KILN_RETURN_IF_ERROR(upload(*dv.host, block));
  if (!dv.t.data) {
    dv.t.data = block.get();
    dv.t.dtype = f.dtype;
    dv.t.layout = f.layout;
    dv.block = block;
  }
  t = host_only(*dv.host);
  t.data = block.get();
  t.dtype = f.dtype;
  t.layout = f.layout;
  t.host = dv.host.get();
  keep_.push_back(std::move(block));
  return t;
}

Expected<std::vector<DynValue>> DynamicGraph::run(DynamicRuntime& rt, std::vector<DynValue> inputs) {
  if (inputs.size() != g_.inputs().size())
    return KILN_ERROR("graph '{}' takes {} inputs, not {}", g_.name, g_.inputs().size(),
                      inputs.size());
  keep_.clear();
  std::vector<DynValue> val(scratch_value_.size());
  std::vector<int> left = uses_;
  for (size_t s = 0; s < scratch_value_.size(); ++s) {
    const Value* orig = value_[s];
    if (orig->is_constant()) continue;
    scratch_value_[s]->constant.reset();
    scratch_value_[s]->type = orig->type;
  }
  // A value is sized once it is made (learn()); a data-dependent layer's outputs only once
  // resolve() has read their sizes. Nodes wait for their inputs to be sized (ready()).
  sized_.assign(scratch_value_.size(), false);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t idx = index_.at(g_.inputs()[i]);
    val[idx] = std::move(inputs[i]);
    learn(idx, val[idx]);
  }
  // Waves: nodes run in order while their inputs' sizes are known; a node that reads a value a
  // data-dependent layer sized only on the device waits, and once no node can run, one
  // synchronisation reads every pending size (SSDlite's 90 per-class NonZeros: one read, not 90).
  awaiting_.clear();
  std::vector<size_t> todo;
  const bool prefix = prefix_on(rt);
  if (prefix) KILN_RETURN_IF_ERROR(run_prefix(rt, val, left));
  for (size_t k = 0; k < g_.nodes().size(); ++k)
    if (!prefix || !in_prefix_[k]) todo.push_back(k);
  while (!todo.empty()) {
    std::vector<size_t> waiting;
    for (size_t k : todo) {
      if (!ready(k)) {
        waiting.push_back(k);
        continue;
      }
      KILN_RETURN_IF_ERROR(run_node(rt, k, val));
      consumed(k, val, left);
    }
    if (!waiting.empty() && awaiting_.empty())
      return KILN_ERROR("graph '{}': {} nodes wait for sizes no layer computes", g_.name,
                        waiting.size());
    KILN_RETURN_IF_ERROR(resolve(rt, val));
    todo = std::move(waiting);
  }
  std::vector<DynValue> out;
  for (const Value* v : g_.outputs()) {
    if (v->is_constant()) {
      out.push_back({host_only(*v->constant), nullptr, v->constant});
      continue;
    }
    out.push_back(val[index_.at(v)]);
    if (!out.back().known()) return KILN_ERROR("graph output '{}' was not computed", v->name);
  }
  return out;
}

void DynamicGraph::consumed(size_t k, std::vector<DynValue>& val, std::vector<int>& left) {
  for (size_t idx : reads_[k])
    if (--left[idx] == 0) val[idx] = DynValue{};
}

bool DynamicGraph::ready(size_t k) const {
  for (size_t idx : reads_[k])
    if (!sized_[idx]) return false;
  return true;
}

Status DynamicGraph::run_node(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  const LayerChoice& c = plan_.layers[k];
  Status st;
  // A subgraph's run takes the sizes buffer from its start: what is pending here is read first.
  if (!c.is_host() && !c.subplans.empty()) KILN_RETURN_IF_ERROR(resolve(rt, val));
  const bool timed = rt.times && (c.is_host() || c.subplans.empty());
  std::chrono::steady_clock::time_point t0;
  if (timed) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));
    t0 = std::chrono::steady_clock::now();
  }
  ran_on_host_ = c.is_host();
  if (c.is_host()) st = run_host(rt, k, val);
  else if (n->op_type == "If" && !c.subplans.empty()) st = run_if(rt, k, val);
  else if (n->op_type == "Loop" && !c.subplans.empty()) st = run_loop(rt, k, val);
  else if (n->op_type == "Scan" && !c.subplans.empty()) st = run_scan(rt, k, val);
  else st = run_layer(rt, k, val);
  if (timed && st.ok()) {
    // The host's part: until the node's launches, read-backs and allocations returned; then the
    // wait for the GPU to finish what it queued.
    const auto t1 = std::chrono::steady_clock::now();
    KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));
    using Ms = std::chrono::duration<double, std::milli>;
    const double ms = Ms(std::chrono::steady_clock::now() - t0).count();
    const std::string type = n->domain.empty() ? n->op_type : n->domain + "." + n->op_type;
    rt.times->push_back({n->name, ran_on_host_ ? type + " (host)" : type, ms, Ms(t1 - t0).count()});
  }
  if (st.ok() || st.message().find(n->label()) != std::string::npos) return st;
  return st.with_context(n->label());
}

// The sizes of the data-dependent layers in flight, after one synchronisation.
Status DynamicGraph::resolve(DynamicRuntime& rt, std::vector<DynValue>& val) {
  if (awaiting_.empty()) return Status::Ok();
  KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));
  for (const Awaiting& a : awaiting_) {
    const Node* n = g_.nodes()[a.node];
    for (size_t o = 0; o < n->num_outputs(); ++o) {
      const Value* y = n->output(o);
      if (!y) continue;
      const size_t idx = index_.at(y);
      DynValue& v = val[idx];
      for (size_t d = 0; d < v.t.shape.size(); ++d) {
        const int64_t got = a.dims[kMaxDynRank * o + d];
        if (got < 0 || got > v.t.shape[d])
          return KILN_ERROR("{}: output '{}' dim {} came back as {}, outside [0, {}]", n->label(),
                            y->name, d, got, v.t.shape[d]);
        v.t.shape[d] = got;
      }
      sized_[idx] = true;
      learn(idx, v);
    }
  }
  awaiting_.clear();
  rt.dims_used = 0;
  return Status::Ok();
}

Status DynamicGraph::run_host(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  const Node* n = g_.nodes()[k];
  std::vector<Tensor> results(n->num_outputs());
  if (is_shape_op(n->domain, n->op_type)) {
    const Value* x = n->input(0);
    const std::vector<int64_t> shape =
        x->is_constant() ? x->constant->shape() : val[index_.at(x)].t.shape;
    results[0] = eval_shape_op(*n, shape);
  } else {
    const OpDef* def = find_op(n->domain, n->op_type);
    if (!def || !def->cpu) return KILN_ERROR("no host kernel");
    std::vector<std::shared_ptr<const Tensor>> held;
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      if (!v) {
        ins.push_back(nullptr);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(auto h, host_value(rt, v, val));
      held.push_back(h);
      ins.push_back(h.get());
    }
    KernelContext kctx(*n, ins, results);
    KILN_RETURN_IF_ERROR(def->cpu(kctx));
  }
  for (size_t o = 0; o < n->num_outputs(); ++o) {
    const Value* v = n->output(o);
    if (!v) continue;
    auto t = std::make_shared<const Tensor>(std::move(results[o]));
    const size_t idx = index_.at(v);
    val[idx] = DynValue{host_only(*t), nullptr, t};
    learn(idx, val[idx]);
  }
  return Status::Ok();
}

namespace {
// The workspace grown to `need` bytes (after what is queued, which may read the old one).
Status fit_workspace(DynamicRuntime& rt, size_t need) {
  if (need > rt.rc->workspace_limit)
    return KILN_ERROR("needs {} MiB of workspace, over the engine's limit of {} MiB", need >> 20,
                      rt.rc->workspace_limit >> 20);
  if (need > rt.workspace->bytes()) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(rt.rc->stream));
    KILN_RETURN_IF_ERROR(rt.workspace->reserve(need, "layer workspace"));
  }
  return Status::Ok();
}
}  // namespace

// The output shapes of node k at the input shapes and host values `key`: inference on the
// scratch copy, whose inputs carry what this run learned; a data-dependent layer's at the op's
// bound, its real ones read back after it ran. They follow from the key, so the last run's are
// reused where it is the same (a detector run on images of one size: most of its layers' inputs).
Expected<const std::vector<std::vector<int64_t>>*> DynamicGraph::out_shapes(
    size_t k, const std::string& key, bool bound, ShapeMemo& memo) {
  const Node* n = g_.nodes()[k];
  if (memo.key == key && memo.shapes.size() == n->num_outputs()) return &memo.shapes;
  const OpDef* def = find_op(n->domain, n->op_type);
  if (!def || !def->infer) return KILN_ERROR("no shape inference");
  std::vector<TensorType> types(n->num_outputs());
  const Node& sn = *scratch_->nodes()[k];
  InferContext ictx(sn, types);
  if (n->domain == "kiln" && n->op_type == "Relayout") {
    // Its steps as a small graph, prepared once per layer and inferred again at each new shape
    // (a Loop body's Concats, every iteration).
    KILN_RETURN_IF_ERROR(infer_relayout_with(ictx, relayout_types_[k]));
  } else {
    KILN_RETURN_IF_ERROR(bound && def->bound ? def->bound(ictx) : def->infer(ictx));
  }
  memo.key.clear();
  memo.shapes.assign(n->num_outputs(), {});
  for (size_t o = 0; o < n->num_outputs(); ++o) {
    if (!n->output(o)) continue;
    auto shape = types[o].static_shape();
    if (!shape)
      return KILN_ERROR("the shape of output '{}' is not known when the run reaches it ({})",
                        n->output(o)->name, types[o].str());
    memo.shapes[o] = *shape;
  }
  memo.key = key;
  return &memo.shapes;
}

// Whether device layer k runs on the host instead: every input it reads is known there (computed
// on the host, read back, or a constant) and its inputs and outputs are small, so the host's
// reference kernel costs less than uploading them, a launch, and reading the result back for the
// next host reader (a Loop body's box arithmetic on a detection read from a captured tensor).
// Not in the prefix, whose layers are replayed from a CUDA graph.
bool DynamicGraph::host_instead(const DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  if (rt.dry || rt.alloc) return false;
  const Node* n = g_.nodes()[k];
  for (size_t idx : reads_[k])
    if (!val[idx].host || val[idx].host->numel() > kHostSmall) return false;
  const OpDef* def = find_op(n->domain, n->op_type);
  if (!def || !def->cpu || !def->infer) return false;
  std::string key;
  for (size_t i = 0; i < n->num_inputs(); ++i) {
    const Value* v = n->input(i);
    if (v && !v->is_constant()) {
      const size_t idx = index_.at(v);
      const DynValue& dv = val[idx];
      if (!scratch_value_[idx]->constant) learn(idx, dv);  // inference reads host values
      append_shape(key, dv.host->shape());
      key.append(static_cast<const char*>(dv.host->raw()), dv.host->nbytes());
    } else if (v) {
      append_shape(key, v->constant->shape());
    }
    key += '|';
  }
  const bool dds = plan_.layers[k].tactic->caps & kDataDependent;
  auto shapes = out_shapes(k, key, dds, host_shapes_[k]);
  if (!shapes.ok()) return false;  // the device path says why
  for (const auto& s : **shapes) {
    int64_t numel = 1;
    for (int64_t d : s) numel *= d;
    if (numel > kHostSmall) return false;
  }
  return true;
}

Status DynamicGraph::run_layer(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val) {
  ran_on_host_ = host_instead(rt, k, val);
  if (ran_on_host_) return run_host(rt, k, val);
  const Node* n = g_.nodes()[k];
  const LayerChoice& c = plan_.layers[k];
  std::vector<DeviceTensor> ins(n->num_inputs()), outs(n->num_outputs());
  std::string key;
  for (size_t i = 0; i < n->num_inputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(ins[i], device_input(rt, k, i, val));
    // A value read back for the host (Resize's sizes computed on the GPU) is one that inference
    // needs too.
    if (const Value* v = n->input(i); v && !v->is_constant() && !c.in[i].present())
      learn(index_.at(v), val[index_.at(v)]);
    append_shape(key, ins[i].shape);
    if (ins[i].host && !n->input(i)->is_constant())
      key.append(static_cast<const char*>(ins[i].host->raw()), ins[i].host->nbytes());
    key += '|';
  }
  const bool dds = c.tactic->caps & kDataDependent;
  KILN_ASSIGN_OR_RETURN(const auto* shapes, out_shapes(k, key, dds, shapes_[k]));
  std::vector<std::shared_ptr<void>> blocks(n->num_outputs());
  const int alias = c.tactic->alias_input;
  for (size_t o = 0; o < n->num_outputs(); ++o) {
    if (!n->output(o)) continue;
    outs[o].shape = (*shapes)[o];
    outs[o].dtype = c.out[o].dtype;
    outs[o].layout = c.out[o].layout;
    append_shape(key, (*shapes)[o]);
    // An alias layer (the Reshape family) relabels its input's memory where the formats agree.
    if (o == 0 && alias >= 0 && ins[alias].data && ins[alias].dtype == outs[o].dtype &&
        ins[alias].layout == outs[o].layout) {
      outs[o].data = ins[alias].data;
      const Value* src = n->input(alias);
      if (!src->is_constant()) blocks[o] = val[index_.at(src)].block;
      continue;
    }
    KILN_ASSIGN_OR_RETURN(blocks[o],
                          rt.pool_now().get(outs[o].nbytes(), "'" + n->output(o)->name + "'"));
    outs[o].data = blocks[o].get();
  }
  const bool aliased = alias >= 0 && outs[0].data == ins[alias].data && outs[0].data;
  Layer& layer = *layers_[k];
  if (!aliased && rt.dry && dds) return KILN_ERROR("a data-dependent layer cannot run dry");
  if (!aliased && configured_[k] != key) {
    auto need = layer.configure(*rt.rc, ins, outs);
    if (!need.ok()) return need.status();
    KILN_RETURN_IF_ERROR(fit_workspace(rt, *need));
    configured_[k] = key;
  }
  if (!aliased && !rt.dry) {  // a dry pass (dynamic_prefix.cpp) configures and sizes only
    rt.rc->workspace = rt.workspace->get();
    rt.rc->workspace_bytes = rt.workspace->bytes();
    rt.rc->pdl = false;
    rt.rc->out_dims = nullptr;
    if (dds) {
      // Its sizes go to a slot of their own, read with the other layers' in flight.
      int64_t* slot = rt.take_dims(n->num_outputs());
      if (!slot) {
        KILN_RETURN_IF_ERROR(resolve(rt, val));
        KILN_RETURN_IF_ERROR(rt.ensure_dims(std::max<size_t>(n->num_outputs(), 256)));
        slot = rt.take_dims(n->num_outputs());
      }
      rt.rc->out_dims = slot;
      awaiting_.push_back({k, slot});
    }
    if (poison_workspace() && rt.rc->workspace && rt.rc->workspace_bytes)
      KILN_CUDA_CHECK(
          cudaMemsetAsync(rt.rc->workspace, 0xA5, rt.rc->workspace_bytes, rt.rc->stream));
    Status st = layer.run(*rt.rc, ins, outs);
    rt.rc->out_dims = nullptr;
    KILN_RETURN_IF_ERROR(st);
  }
  for (size_t o = 0; o < n->num_outputs(); ++o) {
    if (!n->output(o)) continue;
    const size_t idx = index_.at(n->output(o));
    outs[o].host = nullptr;
    val[idx] = DynValue{outs[o], blocks[o], nullptr};
    if (dds) {
      sized_[idx] = false;  // its bound until resolve()
      continue;
    }
    learn(idx, val[idx]);
  }
  return Status::Ok();
}

}  // namespace kiln::gpu
