// CudaContext (cuda_context.h): the static path, an engine whose every size follows from its
// input shapes; executor_dynamic.cpp runs the others.
#include "executor.h"

#include <cublas_v2.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "backends/cpu/cpu_executor.h"
#include "backends/memory_planner.h"
#include "cuda_context.h"
#include "shape_eval.h"
#include "tactics/check.h"

namespace kiln::gpu {
namespace {

std::string fmt_key(const TensorFormat& f) { return f.str(); }

}  // namespace

Status CudaContext::init() {
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KILN_ASSIGN_OR_RETURN(handles_, LibraryHandles::create(stream_));
  handles_->bind(rc_);
  rc_.stream = stream_;
  rc_.workspace_limit = e_->plan().workspace_limit;
  pdl_ = pdl_available();
  graph_shapes_ = graph_shapes_setting();
  // cuBLAS gets its own workspace, so it never allocates (nor can, inside graph capture).
  KILN_RETURN_IF_ERROR(cublas_ws_.reserve(size_t(32) << 20, "cuBLAS workspace"));
  if (cublasSetWorkspace(rc_.cublas, cublas_ws_.get(), cublas_ws_.bytes()) != CUBLAS_STATUS_SUCCESS)
    return KILN_ERROR("cublasSetWorkspace failed");
  bound_stream_ = stream_;
  const auto& nodes = g_.nodes();
  host_in_ = plan_host_inputs();
  // An engine with shapes that the data decides runs in its dynamic region (dynamic.h).
  for (size_t k = 0; k < nodes.size(); ++k) {
    const LayerChoice& c = e_->plan().layers[k];
    if (!c.is_host() && ((c.tactic->caps & kDataDependent) || !c.subplans.empty())) dynamic_ = true;
  }
  if (dynamic_) return init_dynamic();
  for (size_t k = 0; k < nodes.size(); ++k) {
    const LayerChoice& c = e_->plan().layers[k];
    if (c.is_host()) continue;
    LayerRun r;
    r.node = nodes[k];
    r.choice = &c;
    auto layer = c.tactic->create(c.desc(nodes[k]));
    if (!layer.ok()) return layer.status().with_context(nodes[k]->label());
    r.layer = std::move(layer).value();
    for (const Alternate& a : c.alternates) {
      auto alt = a.tactic->create(c.desc(nodes[k], a));
      if (!alt.ok()) return alt.status().with_context(nodes[k]->label());
      r.alternates.push_back(std::move(alt).value());
    }
    runs_.push_back(std::move(r));
  }
  host_vals_.assign(g_.inputs().size(), nullptr);
  input_shapes_.resize(g_.inputs().size());
  input_set_.assign(g_.inputs().size(), false);
  in_addr_.assign(g_.inputs().size(), nullptr);
  out_addr_.assign(g_.outputs().size(), nullptr);
  // Inputs whose shape is fixed are set already; the arena is sized for the profile's max.
  std::vector<std::vector<int64_t>> max_shapes;
  bool all_known = true;
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const Value* v = g_.inputs()[i];
    auto r = e_->profile().ranges().find(v->name);
    if (r != e_->profile().ranges().end()) {
      max_shapes.push_back(r->second.max);
      if (r->second.min == r->second.max) set_shape(i, r->second.min);
    } else if (auto s = v->type.static_shape()) {
      max_shapes.push_back(*s);
      set_shape(i, *s);
    } else {
      all_known = false;
    }
  }
  if (all_known && std::find(host_in_.begin(), host_in_.end(), true) == host_in_.end()) {
    KILN_ASSIGN_OR_RETURN(Instance * inst, instance_for(max_shapes));
    (void)inst;
  }
  return Status::Ok();
}


Expected<size_t> CudaContext::index_of(const std::string& name, bool input) const {
  const auto& list = input ? g_.inputs() : g_.outputs();
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i]->name == name) return i;
  return KILN_ERROR("the engine has no {} named '{}'", input ? "input" : "output", name);
}

Status CudaContext::set_input_shape(const std::string& name, const std::vector<int64_t>& dims) {
  KILN_ASSIGN_OR_RETURN(size_t i, index_of(name, true));
  const Value* v = g_.inputs()[i];
  std::map<std::string, int64_t> seen;
  Tensor probe = Tensor::view(v->type.dtype, dims, nullptr, nullptr);
  KILN_RETURN_IF_ERROR(check_input(*v, probe, seen));
  KILN_RETURN_IF_ERROR(e_->profile().check(name, dims));
  set_shape(i, dims);
  return Status::Ok();
}

Expected<std::vector<int64_t>> CudaContext::tensor_shape(const std::string& name) {
  for (size_t i = 0; i < g_.inputs().size(); ++i)
    if (g_.inputs()[i]->name == name) {
      if (!input_set_[i]) return KILN_ERROR("input '{}': shape not set", name);
      return input_shapes_[i];
    }
  KILN_ASSIGN_OR_RETURN(size_t o, index_of(name, false));
  if (dynamic_) {
    if (o < dyn_out_shapes_.size()) return dyn_out_shapes_[o];
    return KILN_ERROR("output '{}': the engine's shapes depend on the data; they are known after "
                      "an inference", name);
  }
  for (size_t i = 0; i < input_set_.size(); ++i)
    if (!input_set_[i])
      return KILN_ERROR("output '{}': set the shape of input '{}' first", name, g_.inputs()[i]->name);
  KILN_RETURN_IF_ERROR(read_host_inputs());
  KILN_ASSIGN_OR_RETURN(Instance * inst, instance_for(input_shapes_));
  return inst->output_shapes[o];
}

Status CudaContext::set_tensor_address(const std::string& name, void* ptr) {
  for (size_t i = 0; i < g_.inputs().size(); ++i)
    if (g_.inputs()[i]->name == name) {
      if (in_addr_[i] != ptr) ++generation_;
      in_addr_[i] = ptr;
      return Status::Ok();
    }
  KILN_ASSIGN_OR_RETURN(size_t o, index_of(name, false));
  if (out_addr_[o] != ptr) ++generation_;
  out_addr_[o] = ptr;
  return Status::Ok();
}

Expected<Instance*> CudaContext::instance_for(const std::vector<std::vector<int64_t>>& shapes) {
  // The steady case, the shapes of the instance the layers are configured for and no values
  // read on the host, without building the lookup key (no allocation per inference).
  if (current_ && current_->input_shapes == shapes &&
      std::all_of(host_vals_.begin(), host_vals_.end(), [](const auto& t) { return !t; }))
    return current_;
  std::string values;
  for (const auto& t : host_vals_)
    if (t) values.append(static_cast<const char*>(t->raw()), t->nbytes()).push_back('|');
  auto key = std::make_pair(shapes, std::move(values));
  auto it = instances_.find(key);
  if (it != instances_.end()) return it->second.get();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Instance> inst, make_instance(shapes));
  Instance* p = inst.get();
  instances_[std::move(key)] = std::move(inst);
  return p;
}

std::vector<bool> CudaContext::plan_host_inputs() const {
  std::vector<bool> out(g_.inputs().size(), false);
  const auto& nodes = g_.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    const LayerChoice& c = e_->plan().layers[k];
    if (is_shape_op(nodes[k]->domain, nodes[k]->op_type)) continue;  // reads shapes only
    for (size_t s = 0; s < nodes[k]->num_inputs(); ++s)
      for (size_t i = 0; i < g_.inputs().size(); ++i)
        if (nodes[k]->input(s) == g_.inputs()[i] &&
            (c.is_host() || (s < c.in.size() && c.in[s].dtype == DataType::kUndefined)))
          out[i] = true;
  }
  return out;
}

// The values of the inputs read on the host, from their addresses (or host_src); a new tensor
// only when the bytes changed (so a steady loop allocates nothing).
Status CudaContext::read_host_inputs(const std::vector<const void*>* host_src) {
  for (size_t i = 0; i < host_in_.size(); ++i) {
    if (!host_in_[i]) continue;
    const Value* v = g_.inputs()[i];
    Tensor probe = Tensor::view(v->type.dtype, input_shapes_[i], nullptr, nullptr);
    if (probe.nbytes() && !in_addr_[i])
      return KILN_ERROR("input '{}' is read on the host (its values decide shapes): set its "
                        "address (host or device memory) first", v->name);
    scratch_.resize(probe.nbytes());
    const void* src = host_src && i < host_src->size() ? (*host_src)[i] : nullptr;
    if (probe.nbytes() && src)
      std::memcpy(scratch_.data(), src, probe.nbytes());
    else if (probe.nbytes())
      KILN_CUDA_CHECK(cudaMemcpy(scratch_.data(), in_addr_[i], probe.nbytes(), cudaMemcpyDefault));
    const auto& cur = host_vals_[i];
    if (cur && cur->shape() == input_shapes_[i] &&
        std::memcmp(cur->raw(), scratch_.data(), scratch_.size()) == 0)
      continue;
    auto t = std::make_shared<Tensor>(v->type.dtype, input_shapes_[i]);
    if (probe.nbytes()) std::memcpy(t->raw(), scratch_.data(), scratch_.size());
    host_vals_[i] = std::move(t);
  }
  return Status::Ok();
}

Expected<std::unique_ptr<Instance>> CudaContext::make_instance(
    const std::vector<std::vector<int64_t>>& input_shapes) {
  auto inst = std::make_unique<Instance>();
  inst->input_shapes = input_shapes;
  std::vector<bool> host(g_.nodes().size());
  for (size_t k = 0; k < host.size(); ++k) host[k] = e_->plan().layers[k].is_host();
  KILN_ASSIGN_OR_RETURN(inst->shapes, evaluate_shapes(g_, host, input_shapes, host_vals_));
  const ShapeResult& S = inst->shapes;

  std::unordered_map<const Value*, TensorRef> ref;
  std::unordered_map<const Value*, const Value*> alias_root;
  std::unordered_map<const Value*, size_t> request_of;  // arena value -> request index
  std::vector<BufferRequest> requests;
  std::vector<const Value*> request_value;
  std::map<std::pair<const Value*, std::string>, size_t> upload_offset;
  for (size_t i = 0; i < g_.inputs().size(); ++i) ref[g_.inputs()[i]] = {TensorRef::kInput, i};
  std::unordered_map<const Value*, size_t> first_output;
  for (size_t j = 0; j < g_.outputs().size(); ++j) first_output.emplace(g_.outputs()[j], j);
  // Values a kernel writes straight into a graph output's buffer (plan.h), where only layers
  // that relabel memory come between them and the output.
  const auto through = written_through_outputs(e_->plan(), g_);

  const size_t n_runs = runs_.size();
  inst->ins.resize(n_runs);
  inst->outs.resize(n_runs);
  inst->in_refs.resize(n_runs);
  inst->out_refs.resize(n_runs);
  inst->skip.assign(n_runs, false);
  inst->alternate.assign(n_runs, -1);
  if (const size_t point = nearest_point(e_->plan().points, input_shapes); point != 0)
    for (size_t s = 0; s < n_runs; ++s)
      for (size_t a = 0; a < runs_[s].choice->alternates.size(); ++a)
        if (runs_[s].choice->alternates[a].point == point) inst->alternate[s] = static_cast<int>(a);
  auto root_of = [&](const Value* v) {
    auto it = alias_root.find(v);
    return it == alias_root.end() ? v : it->second;
  };
  for (size_t s = 0; s < n_runs; ++s) {
    const LayerRun& r = runs_[s];
    const Node* n = r.node;
    const LayerChoice& c = *r.choice;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      DeviceTensor t;
      TensorRef tr;
      if (v) {
        t.shape = S.shapes.at(v);
        auto hv = S.host.find(v);
        t.host = v->is_constant() ? v->constant.get()
                 : hv != S.host.end() ? hv->second.get() : nullptr;
        if (c.in[i].dtype == DataType::kUndefined) {
          t.dtype = v->type.dtype;  // read on the host only
        } else {
          t.dtype = c.in[i].dtype;
          t.layout = c.in[i].layout;
          if (v->is_constant()) {
            tr = {TensorRef::kWeights, e_->weight_offset(v, c.in[i])};
          } else if (hv != S.host.end()) {
            auto key = std::make_pair(v, fmt_key(c.in[i]));
            auto u = upload_offset.find(key);
            if (u == upload_offset.end()) {
              KILN_ASSIGN_OR_RETURN(Tensor d, to_device_format(*hv->second, c.in[i]));
              const size_t off = (inst->upload_host.size() + 255) / 256 * 256;
              inst->upload_host.resize(off + d.nbytes());
              if (d.nbytes()) std::memcpy(inst->upload_host.data() + off, d.raw(), d.nbytes());
              u = upload_offset.emplace(key, off).first;
            }
            tr = {TensorRef::kUploads, u->second};
          } else {
            auto it = ref.find(v);
            if (it == ref.end())
              return KILN_ERROR("{}: input '{}' has no producer on the GPU", n->label(), v->name);
            tr = it->second;
            auto rq = request_of.find(root_of(v));
            if (rq != request_of.end())
              requests[rq->second].last = std::max(requests[rq->second].last, static_cast<int>(s));
          }
        }
      }
      inst->ins[s].push_back(std::move(t));
      inst->in_refs[s].push_back(tr);
    }
    for (size_t o = 0; o < n->num_outputs(); ++o) {
      const Value* v = n->output(o);
      DeviceTensor t;
      TensorRef tr;
      if (v) {
        t.shape = S.shapes.at(v);
        t.dtype = c.out[o].dtype;
        t.layout = c.out[o].layout;
        auto go = first_output.find(v);
        auto wt = through.find(v);
        const Value* src = n->input(0);
        // kLayoutSwap (layer.h): its two layouts hold the same bytes.
        const bool same_storage = o == 0 && c.tactic->alias_input == 0 && src &&
                                  inst->in_refs[s][0].kind != TensorRef::kNone &&
                                  inst->ins[s][0].dtype == t.dtype &&
                                  (inst->ins[s][0].layout == t.layout ||
                                   (c.tactic->caps & kLayoutSwap));
        const bool can_alias = same_storage && go == first_output.end();
        if (go != first_output.end()) {
          tr = {TensorRef::kOutput, go->second};
          // The end of a written-through chain: its input is this output's buffer already.
          if (same_storage && inst->in_refs[s][0].kind == TensorRef::kOutput &&
              inst->in_refs[s][0].offset == go->second)
            inst->skip[s] = true;
        } else if (wt != through.end()) {
          tr = {TensorRef::kOutput, wt->second};
        } else if (can_alias) {
          tr = inst->in_refs[s][0];
          alias_root[v] = root_of(src);
          inst->skip[s] = true;
        } else {
          tr = {TensorRef::kArena, 0};
          request_of[v] = requests.size();
          requests.push_back({t.nbytes(), static_cast<int>(s), static_cast<int>(s)});
          request_value.push_back(v);
        }
        ref[v] = tr;
      }
      inst->outs[s].push_back(std::move(t));
      inst->out_refs[s].push_back(tr);
    }
  }
  const MemoryPlan mp = plan_memory(requests, 256);
  inst->arena_bytes = mp.total;
  std::unordered_map<const Value*, size_t> arena_offset;
  for (size_t q = 0; q < requests.size(); ++q) arena_offset[request_value[q]] = mp.offsets[q];
  auto fix = [&](TensorRef& tr, const Value* v) {
    if (tr.kind != TensorRef::kArena || !v) return;
    tr.offset = arena_offset.at(root_of(v));
  };
  for (size_t s = 0; s < n_runs; ++s) {
    for (size_t i = 0; i < runs_[s].node->num_inputs(); ++i) fix(inst->in_refs[s][i], runs_[s].node->input(i));
    for (size_t o = 0; o < runs_[s].node->num_outputs(); ++o) fix(inst->out_refs[s][o], runs_[s].node->output(o));
  }
  for (auto& [v, tr] : ref) fix(tr, v);
  // Outputs not written in place by a layer are copied at the end of each inference.
  for (size_t j = 0; j < g_.outputs().size(); ++j) {
    const Value* v = g_.outputs()[j];
    inst->output_shapes.push_back(S.shapes.at(v));
    inst->output_bytes.push_back(Tensor::view(v->type.dtype, S.shapes.at(v), nullptr, nullptr).nbytes());
    auto it = ref.find(v);
    if (it != ref.end() && it->second.kind == TensorRef::kOutput && it->second.offset == j) continue;
    Instance::OutputCopy oc{j, {}, nullptr};
    if (v->is_constant()) oc.host = v->constant;
    else if (auto h = S.host.find(v); h != S.host.end()) oc.host = h->second;
    else if (it != ref.end()) oc.src = it->second;
    else return KILN_ERROR("graph output '{}' is not computed", v->name);
    inst->output_copies.push_back(std::move(oc));
  }
  if (!inst->upload_host.empty()) {
    KILN_RETURN_IF_ERROR(inst->uploads.reserve(inst->upload_host.size(), "shape-dependent values"));
    KILN_RETURN_IF_ERROR(cuda::upload(inst->uploads.get(), inst->upload_host.data(),
                                      inst->upload_host.size(), "shape-dependent values"));
  }
  return inst;
}

Status CudaContext::configure(Instance& inst) {
  if (current_ == &inst) return Status::Ok();
  size_t ws = 0;
  for (size_t s = 0; s < runs_.size(); ++s) {
    if (inst.skip[s]) continue;
    auto need = layer_of(inst, s).configure(rc_, inst.ins[s], inst.outs[s]);
    if (!need.ok()) return need.status().with_context(runs_[s].node->label());
    if (*need > rc_.workspace_limit)
      return KILN_ERROR("{}: needs {} MiB of workspace, over the engine's limit of {} MiB",
                        runs_[s].node->label(), *need >> 20, rc_.workspace_limit >> 20);
    ws = std::max(ws, *need);
  }
  inst.workspace_bytes = ws;
  if (inst.arena_bytes > arena_.bytes() || ws > workspace_.bytes()) {
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    KILN_RETURN_IF_ERROR(arena_.reserve(inst.arena_bytes, "the activation arena"));
    KILN_RETURN_IF_ERROR(workspace_.reserve(std::max<size_t>(ws, 256), "layer workspace"));
    for (auto& [k, other] : instances_) other->drop_graphs();  // they hold the old addresses
    ++generation_;
  }
  rc_.workspace = workspace_.get();
  rc_.workspace_bytes = workspace_.bytes();
  current_ = &inst;
  ++generation_;
  // Layers configured for another shape: other shapes' graphs are captured again before use.
  ++config_generation_;
  return Status::Ok();
}

void* CudaContext::resolve(const Instance& inst, const TensorRef& r) const {
  auto* base = [&]() -> uint8_t* {
    switch (r.kind) {
      case TensorRef::kArena: return static_cast<uint8_t*>(arena_.get());
      case TensorRef::kWeights: return static_cast<uint8_t*>(e_->weights());
      case TensorRef::kUploads: return static_cast<uint8_t*>(inst.uploads.get());
      case TensorRef::kInput: return static_cast<uint8_t*>(in_addr_[r.offset]);
      case TensorRef::kOutput: return static_cast<uint8_t*>(out_addr_[r.offset]);
      default: return nullptr;
    }
  }();
  if (!base) return nullptr;
  return r.kind == TensorRef::kInput || r.kind == TensorRef::kOutput ? base : base + r.offset;
}

void CudaContext::bind(Instance& inst) {
  if (bound_generation_ == generation_) return;
  for (size_t s = 0; s < runs_.size(); ++s) {
    for (size_t i = 0; i < inst.ins[s].size(); ++i)
      inst.ins[s][i].data = resolve(inst, inst.in_refs[s][i]);
    for (size_t o = 0; o < inst.outs[s].size(); ++o)
      inst.outs[s][o].data = resolve(inst, inst.out_refs[s][o]);
  }
  bound_generation_ = generation_;
}

Status CudaContext::run_layers(Instance& inst, std::vector<LayerTiming>* times) {
  if (times && events_.size() < runs_.size() + 1) {
    for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
    events_.assign(runs_.size() + 1, nullptr);
    for (auto& ev : events_) KILN_CUDA_CHECK(cudaEventCreate(&ev));
  }
  if (times) KILN_CUDA_CHECK(cudaEventRecord(events_[0], rc_.stream));
  if (!debug_.empty()) KILN_RETURN_IF_ERROR(keep_debug(inst, runs_.size()));
  bool after_trigger = false;  // the last layer's kernels let their dependents start early
  for (size_t s = 0; s < runs_.size(); ++s) {
    if (!inst.skip[s]) {
      Layer& layer = layer_of(inst, s);
      rc_.pdl = pdl_ && after_trigger;
      if (poison_workspace() && rc_.workspace && rc_.workspace_bytes) {
        KILN_CUDA_CHECK(cudaMemsetAsync(rc_.workspace, 0xA5, rc_.workspace_bytes, rc_.stream));
        rc_.pdl = false;  // a memset, not a kernel, comes before it
      }
      Status st = layer.run(rc_, inst.ins[s], inst.outs[s]);
      if (!st.ok()) return st.with_context(runs_[s].node->label());
      after_trigger = layer.programmatic();
    }
    if (!debug_.empty()) KILN_RETURN_IF_ERROR(keep_debug(inst, s));
    if (times) KILN_CUDA_CHECK(cudaEventRecord(events_[s + 1], rc_.stream));
  }
  if (times) {
    KILN_CUDA_CHECK(cudaEventSynchronize(events_[runs_.size()]));
    for (size_t s = 0; s < runs_.size(); ++s) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[s], events_[s + 1]));
      times->push_back({runs_[s].node->name, runs_[s].node->domain.empty()
                                                 ? runs_[s].node->op_type
                                                 : runs_[s].node->domain + "." + runs_[s].node->op_type,
                        ms});
    }
  }
  return Status::Ok();
}

// After layer `run` (or, with run == runs_.size(), before the first): copies the requested
// values it produced to the host. Values known on the host and graph inputs come first.
Status CudaContext::keep_debug(const Instance& inst, size_t run) {
  if (run == runs_.size()) {
    debug_out_.clear();
    for (const auto& [v, name] : debug_) {
      if (v->is_constant()) debug_out_[name] = *v->constant;
      else if (auto h = inst.shapes.host.find(v); h != inst.shapes.host.end()) debug_out_[name] = *h->second;
      for (size_t i = 0; i < g_.inputs().size(); ++i)
        if (g_.inputs()[i] == v) {
          DeviceTensor t;
          t.data = in_addr_[i];
          t.dtype = v->type.dtype;
          t.shape = input_shapes_[i];
          KILN_ASSIGN_OR_RETURN(debug_out_[name], copy_to_host(t, v->type.dtype, rc_.stream));
        }
    }
    return Status::Ok();
  }
  const Node* n = runs_[run].node;
  for (size_t o = 0; o < n->num_outputs(); ++o) {
    auto it = n->output(o) ? debug_.find(n->output(o)) : debug_.end();
    if (it == debug_.end() || !inst.outs[run][o].present()) continue;
    auto t = copy_to_host(inst.outs[run][o], it->first->type.dtype, rc_.stream);
    if (!t.ok()) return t.status().with_context(n->label());
    // A float value an INT8 layer stored as int8 codes came back as the codes: scale them.
    if (inst.outs[run][o].dtype == DataType::kInt8 && t->dtype() == DataType::kFloat32 &&
        it->first->has_quant_scale())
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] *= it->first->quant_scales[0];
    debug_out_[it->second] = std::move(t).value();
  }
  return Status::Ok();
}

Status CudaContext::copy_outputs(Instance& inst, cudaStream_t s) {
  for (const auto& oc : inst.output_copies) {
    void* dst = out_addr_[oc.output];
    const size_t bytes = inst.output_bytes[oc.output];
    if (bytes == 0) continue;
    if (oc.host)
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, oc.host->raw(), bytes, cudaMemcpyHostToDevice, s));
    else
      KILN_CUDA_CHECK(cudaMemcpyAsync(dst, resolve(inst, oc.src), bytes, cudaMemcpyDeviceToDevice, s));
  }
  return Status::Ok();
}

Status CudaContext::enqueue(CUstream_st* stream, std::vector<LayerTiming>* layer_times) {
  if (dynamic_) return enqueue_dynamic(stream, layer_times);
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    if (!input_set_[i]) return KILN_ERROR("input '{}': shape not set", g_.inputs()[i]->name);
    if (!in_addr_[i] && !input_shapes_[i].empty() &&
        Tensor::view(g_.inputs()[i]->type.dtype, input_shapes_[i], nullptr, nullptr).nbytes())
      return KILN_ERROR("input '{}': no device address set", g_.inputs()[i]->name);
  }
  KILN_RETURN_IF_ERROR(read_host_inputs());
  return enqueue_read(stream, layer_times);
}

// enqueue() once the host-read inputs' values are read.
Status CudaContext::enqueue_read(CUstream_st* stream, std::vector<LayerTiming>* layer_times) {
  KILN_ASSIGN_OR_RETURN(Instance * inst, instance_for(input_shapes_));
  for (size_t j = 0; j < g_.outputs().size(); ++j)
    if (!out_addr_[j] && inst->output_bytes[j])
      return KILN_ERROR("output '{}': no device address set", g_.outputs()[j]->name);
  cudaStream_t s = stream ? stream : stream_;
  gather_io();
  // A graph (replayed or captured) is one launch wherever it goes: on the legacy stream too.
  if (s != cudaStreamLegacy || !runs_direct(*inst, layer_times))
    return launch(*inst, s, layer_times);
  // The legacy default stream (PyTorch's default stream): a launch there costs more than on a
  // non-blocking stream (it is ordered against the device's other blocking streams), about
  // 2.5 us a kernel on the H100. Layer by layer, the inference runs on the context's own stream,
  // fenced by an event each way, which keeps the legacy stream's order.
  for (cudaEvent_t& ev : fence_)
    if (!ev) KILN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(fence_[0], cudaStreamLegacy));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(stream_, fence_[0], 0));
  KILN_RETURN_IF_ERROR(launch(*inst, stream_, layer_times));
  KILN_CUDA_CHECK(cudaEventRecord(fence_[1], stream_));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamLegacy, fence_[1], 0));
  return Status::Ok();
}

// The inference of `inst` on `s`: a captured graph's replay, the layers, or a capture.
Status CudaContext::launch(Instance& instance, cudaStream_t s,
                           std::vector<LayerTiming>* layer_times) {
  Instance* inst = &instance;
  if (s != bound_stream_) {
    cudnnSetStream(rc_.cudnn, s);
    cublasSetStream(rc_.cublas, s);
    bound_stream_ = s;
  }
  rc_.stream = s;
  const std::vector<void*>& io = io_;  // gathered by enqueue_read
  const bool direct = runs_direct(*inst, layer_times);
  if (!direct) {
    for (Instance::Graph& g : inst->graphs)
      if (g.io == io && graph_valid(g)) {
        g.used = ++graph_clock_;
        KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
        return Status::Ok();
      }
  }
  KILN_RETURN_IF_ERROR(configure(*inst));
  bind(*inst);
  if (direct) {
    KILN_RETURN_IF_ERROR(run_layers(*inst, layer_times));
    inst->ran_direct = true;
    if (use_graph_ && !layer_times && debug_.empty()) inst->remember_direct(io);
    return copy_outputs(*inst, s);
  }
  // Graphs from before a reconfiguration go (KILN_GRAPH_SHAPES=1); past kGraphsPerShape, the
  // least recently used.
  std::erase_if(inst->graphs, [&](const Instance::Graph& g) {
    if (graph_valid(g)) return false;
    cudaGraphExecDestroy(g.exec);
    return true;
  });
  if (inst->graphs.size() >= Instance::kGraphsPerShape) {
    auto lru = std::min_element(inst->graphs.begin(), inst->graphs.end(),
                                [](const auto& a, const auto& b) { return a.used < b.used; });
    cudaGraphExecDestroy(lru->exec);
    inst->graphs.erase(lru);
  }
  // The default streams cannot be captured: the graph is captured on the context's own stream
  // and launched on the caller's.
  const cudaStream_t cap = s == cudaStreamLegacy || s == cudaStreamPerThread ? stream_ : s;
  if (cap != bound_stream_) {
    cudnnSetStream(rc_.cudnn, cap);
    cublasSetStream(rc_.cublas, cap);
    bound_stream_ = cap;
  }
  rc_.stream = cap;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
  Status st = run_layers(*inst, nullptr);
  if (st.ok()) st = copy_outputs(*inst, cap);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(cap, &graph);
  cudaGraphExec_t exec = nullptr;
  if (st.ok() && end == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    exec = nullptr;
  if (graph) cudaGraphDestroy(graph);
  if (!exec) {
    // Not capturable (a layer synchronizes or allocates, or another thread's work on the legacy
    // stream broke the capture): nothing ran; this shape runs layer by layer from now on.
    cudaGetLastError();
    inst->no_capture = true;
    return enqueue_read(s, layer_times);
  }
  inst->graphs.push_back({io, exec, config_generation_, ++graph_clock_});
  limit_graph_shapes(inst);
  KILN_CUDA_CHECK(cudaGraphLaunch(exec, s));
  return Status::Ok();
}

// The caller's tensors in graph-input order, each checked against its declaration and the profile.
Expected<std::vector<const Tensor*>> CudaContext::checked_inputs(
    const std::map<std::string, Tensor>& inputs) const {
  std::map<std::string, int64_t> dims_seen;
  std::vector<const Tensor*> out;
  for (const Value* v : g_.inputs()) {
    auto it = inputs.find(v->name);
    if (it == inputs.end()) return KILN_ERROR("input '{}' was not given", v->name);
    KILN_RETURN_IF_ERROR(check_input(*v, it->second, dims_seen));
    KILN_RETURN_IF_ERROR(e_->profile().check(v->name, it->second.shape()));
    out.push_back(&it->second);
  }
  return out;
}

Expected<std::vector<Tensor>> CudaContext::execute(const std::map<std::string, Tensor>& inputs,
                                                   std::vector<LayerTiming>* timings) {
  for (const auto& [name, t] : inputs) KILN_RETURN_IF_ERROR(index_of(name, true).status());
  if (dynamic_) return execute_dynamic(inputs, timings);
  KILN_ASSIGN_OR_RETURN(std::vector<const Tensor*> given, checked_inputs(inputs));
  std::vector<const void*> host_src(g_.inputs().size(), nullptr);
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const Value* v = g_.inputs()[i];
    const Tensor& x = *given[i];
    set_shape(i, x.shape());
    if (staging_in_.size() <= i) staging_in_.push_back(std::make_unique<DeviceMemory>());
    KILN_RETURN_IF_ERROR(staging_in_[i]->reserve(std::max<size_t>(x.nbytes(), 256),
                                                 "input '" + v->name + "'"));
    KILN_RETURN_IF_ERROR(set_tensor_address(v->name, staging_in_[i]->get()));
    // An input read on the host may feed GPU layers too, so it is staged like the others; its
    // host value is read from the caller's tensor.
    if (host_in_[i]) host_src[i] = x.raw();
    if (x.nbytes())
      KILN_CUDA_CHECK(cudaMemcpyAsync(staging_in_[i]->get(), x.raw(), x.nbytes(),
                                      cudaMemcpyHostToDevice, stream_));
  }
  KILN_RETURN_IF_ERROR(read_host_inputs(&host_src));
  KILN_ASSIGN_OR_RETURN(Instance * inst, instance_for(input_shapes_));
  for (size_t j = 0; j < g_.outputs().size(); ++j) {
    if (staging_out_.size() <= j) staging_out_.push_back(std::make_unique<DeviceMemory>());
    KILN_RETURN_IF_ERROR(staging_out_[j]->reserve(std::max<size_t>(inst->output_bytes[j], 256),
                                                  "output '" + g_.outputs()[j]->name + "'"));
    KILN_RETURN_IF_ERROR(set_tensor_address(g_.outputs()[j]->name, staging_out_[j]->get()));
  }
  KILN_RETURN_IF_ERROR(enqueue_read(stream_, timings));  // host-read inputs: read above
  std::vector<Tensor> out;
  for (size_t j = 0; j < g_.outputs().size(); ++j) {
    Tensor t(g_.outputs()[j]->type.dtype, inst->output_shapes[j]);
    if (t.nbytes())
      KILN_CUDA_CHECK(cudaMemcpyAsync(t.raw(), staging_out_[j]->get(), t.nbytes(),
                                      cudaMemcpyDeviceToHost, stream_));
    out.push_back(std::move(t));
  }
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}


Expected<std::unique_ptr<ExecutionContext>> CudaEngineState::create_context() {
  KILN_RETURN_IF_ERROR(ensure_weights());
  auto ctx = std::make_unique<CudaContext>(shared_from_this());
  KILN_RETURN_IF_ERROR(ctx->init());
  return std::unique_ptr<ExecutionContext>(std::move(ctx));
}

Status CudaEngineState::ensure_weights() {
  std::lock_guard<std::mutex> lock(mu_);
  if (uploaded_) return Status::Ok();
  std::vector<std::pair<size_t, Tensor>> pieces;
  size_t total = 0;
  const auto& nodes = graph_.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    const LayerChoice& c = plan_.layers[k];
    if (c.is_host()) continue;
    for (size_t i = 0; i < nodes[k]->num_inputs(); ++i) {
      const Value* v = nodes[k]->input(i);
      if (!v || !v->is_constant() || c.in[i].dtype == DataType::kUndefined) continue;
      auto key = std::make_pair(v, fmt_key(c.in[i]));
      if (offsets_.count(key)) continue;
      auto d = to_device_format(*v->constant, c.in[i]);
      if (!d.ok()) return d.status().with_context(nodes[k]->label());
      offsets_[key] = total;
      pieces.emplace_back(total, std::move(d).value());
      total = (total + pieces.back().second.nbytes() + 255) / 256 * 256;
    }
  }
  KILN_RETURN_IF_ERROR(weights_.reserve(std::max<size_t>(total, 256), "the engine's weights"));
  for (const auto& [off, t] : pieces)
    if (t.nbytes())
      KILN_RETURN_IF_ERROR(
          cuda::upload(static_cast<uint8_t*>(weights_.get()) + off, t.raw(), t.nbytes(), "the engine's weights"));
  uploaded_ = true;
  return Status::Ok();
}

size_t CudaEngineState::weight_offset(const Value* v, const TensorFormat& f) const {
  auto it = offsets_.find({v, fmt_key(f)});
  return it == offsets_.end() ? 0 : it->second;
}

}  // namespace kiln::gpu
