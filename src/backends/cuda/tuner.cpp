#include "tuner.h"

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>

#include "layer.h"
#include "memory_check.h"

namespace kiln::gpu {

Expected<std::unique_ptr<Tuner>> Tuner::create(TimingCache* cache, size_t workspace_limit) {
  std::unique_ptr<Tuner> t(new Tuner());
  t->cache_ = cache;
  t->workspace_limit_ = workspace_limit;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&t->stream_, cudaStreamNonBlocking));
  KILN_CUDA_CHECK(cudaEventCreate(&t->start_));
  KILN_CUDA_CHECK(cudaEventCreate(&t->stop_));
  KILN_ASSIGN_OR_RETURN(t->handles_, LibraryHandles::create(t->stream_));
  RunContext rc;
  t->handles_->bind(rc);
  KILN_RETURN_IF_ERROR(t->cublas_ws_.reserve(size_t(32) << 20, "cuBLAS workspace"));
  if (cublasSetWorkspace(rc.cublas, t->cublas_ws_.get(), t->cublas_ws_.bytes()) !=
      CUBLAS_STATUS_SUCCESS)
    return KILN_ERROR("cublasSetWorkspace failed");
  return t;
}

cudaGraphExec_t Tuner::capture_runs(const std::function<Status()>& run, int runs) {
  if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  bool ok = true;
  for (int i = 0; i < runs && ok; ++i) ok = run().ok();
  cudaGraph_t graph = nullptr;
  ok = cudaStreamEndCapture(stream_, &graph) == cudaSuccess && ok && graph;
  cudaGraphExec_t exec = nullptr;
  if (ok && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) exec = nullptr;
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a refused capture leaves its error behind; it is not the layer's
  return exec;
}

Tuner::~Tuner() {
  if (stream_) cudaStreamSynchronize(stream_);
  buffers_.clear();
  handles_.reset();
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::string Tuner::key(const Node& n, const LayerChoice& c, const ShapeResult& shapes) const {
  std::string k = signature(n, c, shapes);
  if (workspace_limit_ != RunContext{}.workspace_limit) k += fmt::format("|ws{}", workspace_limit_);
  return k;
}

std::string Tuner::signature(const Node& n, const LayerChoice& c, const ShapeResult& shapes) {
  std::string s = n.domain + "." + n.op_type + "{";
  for (const auto& [name, a] : n.attrs.all()) s += name + "=" + a.str() + ";";
  s += "}(";
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v) {
      auto it = shapes.shapes.find(v);
      s += it == shapes.shapes.end() ? "?" : shape_str(it->second);
      s += v->is_constant() ? "c" : "";
    }
    s += ':';  // appended apart: GCC 12 takes "..." + std::string&& for an overlapping copy
    s += i < c.in.size() && c.in[i].dtype != DataType::kUndefined ? c.in[i].str() : "-";
    s += ",";
  }
  s += ")->";
  for (const auto& f : c.out) s += f.str() + ",";
  s += fmt::format("|{}|{}/{}", precision_name(c.precision), c.tactic->name, c.variant);
  return s;
}

void Tuner::describe(const Node& n, const LayerChoice& c, const ShapeResult& shapes,
                     std::vector<DeviceTensor>* in, std::vector<DeviceTensor>* out) {
  in->assign(n.num_inputs(), DeviceTensor{});
  out->assign(n.num_outputs(), DeviceTensor{});
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (!v) continue;
    DeviceTensor& t = (*in)[i];
    t.shape = shapes.shapes.at(v);
    auto host = shapes.host.find(v);
    t.host = v->is_constant()            ? v->constant.get()
             : host != shapes.host.end() ? host->second.get()
                                         : nullptr;
    if (c.in[i].dtype == DataType::kUndefined) {  // read on the host only: its own type
      t.dtype = v->type.dtype;
      continue;
    }
    t.dtype = c.in[i].dtype;
    t.layout = c.in[i].layout;
  }
  for (size_t o = 0; o < n.num_outputs(); ++o) {
    const Value* v = n.output(o);
    if (!v) continue;
    DeviceTensor& t = (*out)[o];
    t.shape = shapes.shapes.at(v);
    t.dtype = c.out[o].dtype;
    t.layout = c.out[o].layout;
  }
}

Status Tuner::check(const Node& n, const LayerChoice& c, const ShapeResult& shapes) {
  auto fail = [&](const Status& s) {
    // The layer's message names the node already, mostly: name it once.
    std::string m = s.message();
    const std::string label = n.label() + ": ";
    if (m.rfind(label, 0) == 0) m.erase(0, label.size());
    return KILN_ERROR("{}: {}{}{} cannot run at the profile's shapes: {}", n.label(),
                      c.tactic->name, c.variant.empty() ? "" : "/", c.variant, m);
  };
  if (c.tactic->alias_input >= 0) return Status::Ok();  // launches nothing
  for (const std::vector<Value*>* vs : {&n.inputs(), &n.outputs()})
    for (const Value* v : *vs)
      if (v && !shapes.shapes.count(v)) return Status::Ok();  // shapes known only at run time
  // An input the layer reads on the host whose value only an inference gives (a graph input:
  // Reduce's axes, CumSum's axis): configured then, not now.
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (v && ((c.tactic->host_inputs >> i) & 1u) && !v->is_constant() && !shapes.host.count(v))
      return Status::Ok();
  }
  auto layer = c.tactic->create(c.desc(&n));  // as the engine makes it (not `tuning`)
  if (!layer.ok()) return fail(layer.status());
  std::vector<DeviceTensor> in, out;
  describe(n, c, shapes, &in, &out);
  RunContext rc;
  rc.stream = stream_;
  handles_->bind(rc);
  rc.workspace_limit = workspace_limit_;
  auto ws = (*layer)->configure(rc, in, out);
  if (!ws.ok()) return fail(ws.status());
  if (*ws > workspace_limit_)
    return fail(KILN_ERROR("needs {} bytes of workspace, over the limit of {} bytes", *ws,
                           workspace_limit_));
  return Status::Ok();
}

Expected<double> Tuner::time_candidate(const Node& n, const LayerChoice& c,
                                       const ShapeResult& shapes, double best_so_far) {
  LayerDesc desc = c.desc(&n);
  desc.tuning = true;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer, c.tactic->create(desc));
  std::vector<DeviceTensor> in, out;
  describe(n, c, shapes, &in, &out);
  size_t next = 0;
  auto buffer = [&](size_t bytes) -> Expected<void*> {
    if (next == buffers_.size()) buffers_.push_back(std::make_unique<DeviceMemory>());
    DeviceMemory& m = *buffers_[next++];
    KILN_RETURN_IF_ERROR(m.reserve(std::max<size_t>(bytes, 256), "tuning buffers"));
    return m.get();
  };
  std::vector<Tensor> converted;  // keeps host views alive
  converted.reserve(n.num_inputs());
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    DeviceTensor& t = in[i];
    if (!n.input(i) || c.in[i].dtype == DataType::kUndefined) continue;  // read on the host only
    if (t.host) {
      // A constant (a weight) or a value computed from shapes: converted and uploaded once for
      // all of the node's candidates that read it in this format (a large convolution's weights
      // took a third of a second a candidate).
      const auto key = std::make_tuple(t.host, c.in[i].dtype, c.in[i].layout);
      auto it = host_inputs_.find(key);
      if (it == host_inputs_.end()) {
        KILN_ASSIGN_OR_RETURN(Tensor d, to_device_format(*t.host, c.in[i]));
        auto m = std::make_unique<DeviceMemory>();
        KILN_RETURN_IF_ERROR(m->reserve(std::max<size_t>(d.nbytes(), 256), "tuning buffers"));
        KILN_CUDA_CHECK(cudaMemcpyAsync(m->get(), d.raw(), d.nbytes(), cudaMemcpyHostToDevice, stream_));
        converted.push_back(std::move(d));
        it = host_inputs_.emplace(key, std::move(m)).first;
      }
      t.data = it->second->get();
    } else {
      KILN_ASSIGN_OR_RETURN(t.data, buffer(t.nbytes()));
      KILN_RETURN_IF_ERROR(fill_random(t.data, t.dtype, t.numel(), seed_++, stream_));
    }
  }
  for (size_t o = 0; o < n.num_outputs(); ++o) {
    if (!n.output(o)) continue;
    KILN_ASSIGN_OR_RETURN(out[o].data, buffer(out[o].nbytes()));
  }
  RunContext rc;
  rc.stream = stream_;
  // Back to back as the engine would run this layer after another of its kind: a layer whose
  // kernels trigger their dependents overlaps its next run's start.
  rc.pdl = pdl_available() && layer->programmatic();
  handles_->bind(rc);
  rc.workspace_limit = workspace_limit_;
  KILN_ASSIGN_OR_RETURN(size_t ws, layer->configure(rc, in, out));
  if (ws > workspace_limit_)
    return KILN_ERROR("needs {} MiB of workspace, over the limit of {} MiB", ws >> 20,
                      workspace_limit_ >> 20);
  KILN_RETURN_IF_ERROR(workspace_.reserve(std::max<size_t>(ws, 256), "tuning workspace"));
  rc.workspace = workspace_.get();
  rc.workspace_bytes = ws;
  // Two single runs, each timed: the second decides how many runs make a round of about 1 ms.
  // The kernel study's screen: a candidate 3x slower than the best so far is not worth rounds.
  // Not below 50 us: there a single run on the stream is mostly the host's launch cost, and the
  // best so far a graph's GPU time. The first run may also pay one-time costs (a module's lazy
  // load), so it alone rejects only a candidate slower than 30x the best and 20 ms: cuDNN's
  // fallback engines take up to seconds a run on a VAE decoder's 512x512 convolutions.
  float once = 0;
  for (int i = 0; i < 2; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    KILN_RETURN_IF_ERROR(layer->run(rc, in, out));
    KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
    KILN_CUDA_CHECK(cudaEventElapsedTime(&once, start_, stop_));
    const bool slow = best_so_far > 0 && once > 3.0 * best_so_far && once > 0.05f;
    if (slow && (i == 1 || (once > 30.0 * best_so_far && once > 20.0f)))
      return static_cast<double>(once);
  }
  const int per_round = std::clamp(static_cast<int>(1.0f / std::max(once, 1e-4f)), 1, 50);
  cudaGraphExec_t graph = capture_runs([&] { return layer->run(rc, in, out); }, per_round);
  struct GraphGuard {
    cudaGraphExec_t g;
    ~GraphGuard() {
      if (g) cudaGraphExecDestroy(g);
    }
  } guard{graph};
  if (graph) KILN_CUDA_CHECK(cudaGraphLaunch(graph, stream_));  // the first launch uploads it
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    KILN_CUDA_CHECK(cudaEventRecord(start_, stream_));
    if (graph)
      KILN_CUDA_CHECK(cudaGraphLaunch(graph, stream_));
    else
      for (int i = 0; i < per_round; ++i) KILN_RETURN_IF_ERROR(layer->run(rc, in, out));
    KILN_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    rounds.push_back(ms / per_round);
  }
  std::nth_element(rounds.begin(), rounds.begin() + 2, rounds.end());
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return rounds[2];
}

Expected<double> Tuner::reformat_ms(const Value& v, const TensorFormat& from,
                                    const TensorFormat& to, const ShapeResult& shapes) {
  // A change of layout that relabels memory ([N, C, 1, 1]: lowering's reformat.relabel).
  if (from.dtype == to.dtype && layouts_share_bytes(v.type)) return 0.0;
  // A one-node graph: the Reformat of a value of v's type, shape and scale.
  Graph g;
  Value* x = g.add_value("x", v.type);
  x->quant_scales = v.quant_scales;
  x->quant_axis = v.quant_axis;
  g.add_input(x);
  Node* r = g.add_node("Reformat", "reformat", {x}, {"y"}, "kiln");
  r->output(0)->type = v.type;
  r->output(0)->quant_scales = v.quant_scales;
  r->output(0)->quant_axis = v.quant_axis;
  auto shape = shapes.shapes.find(&v);
  if (shape == shapes.shapes.end()) return KILN_ERROR("no shape for '{}'", v.name);
  ShapeResult s;
  s.shapes[x] = s.shapes[r->output(0)] = shape->second;
  LayerChoice c;
  c.tactic = find_tactic("reformat");
  c.precision = Precision::kFP32;
  c.in = {from};
  c.out = {to};
  const std::string key = this->key(*r, c, s);
  if (std::optional<double> ms = cache_ ? cache_->find(key) : std::nullopt; ms && *ms >= 0)
    return *ms;
  KILN_ASSIGN_OR_RETURN(double ms, time_candidate(*r, c, s, -1));
  if (cache_) cache_->put(key, ms);
  return ms;
}

Expected<size_t> Tuner::choose(const Node& n, std::vector<LayerChoice>& candidates,
                               const ShapeResult& shapes, std::vector<std::string>* why) {
  size_t best = candidates.size();
  std::string out_of_memory;  // the first candidate that failed for want of memory
  std::string first_failure;  // the first that failed at all
  walls_.assign(candidates.size(), 0.0);
  host_inputs_.clear();  // the last node's
  for (size_t i = 0; i < candidates.size(); ++i) {
    LayerChoice& c = candidates[i];
    // An alias candidate relabels its input's memory: the executor launches nothing for it.
    if (c.tactic->alias_input >= 0) {
      c.time_ms = 0;
      if (best == candidates.size() || candidates[best].time_ms > 0) best = i;
      continue;
    }
    const std::string key = this->key(n, c, shapes);
    std::optional<double> ms = cache_ ? cache_->find(key) : std::nullopt;
    if (!ms) {
      const auto t0 = std::chrono::steady_clock::now();
      auto t = time_candidate(n, c, shapes, best < candidates.size() ? candidates[best].time_ms : -1);
      walls_[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (t.ok()) {
        ms = *t;
        if (cache_) cache_->put(key, *ms);
      } else {
        if (first_failure.empty())
          first_failure = fmt::format("{}/{}: {}", c.tactic->name, c.variant, t.status().message());
        if (out_of_memory.empty() && is_out_of_memory(t.status().message()))
          out_of_memory = fmt::format("{}/{}: {}", c.tactic->name, c.variant, t.status().message());
        if (why)
          why->push_back(fmt::format("{}/{}: {} (tuning {:.3f} s)", c.tactic->name, c.variant,
                                     t.status().message(), walls_[i]));
        // Remembered as failing, unless memory was short: another build may have it.
        if (cache_ && !is_out_of_memory(t.status().message())) cache_->put(key, -1.0);
        c.time_ms = -1;
        continue;
      }
    }
    c.time_ms = *ms;
    if (*ms >= 0 && (best == candidates.size() || *ms < candidates[best].time_ms)) best = i;
  }
  if (best == candidates.size() && !out_of_memory.empty()) {
    const std::optional<GpuMemory> m = query_gpu_memory();
    return KILN_ERROR("{}: out of GPU memory: no tactic could run ({:.0f} MiB free of {:.0f} MiB; "
                      "first: {})", n.label(), m ? m->free / 1048576.0 : 0.0,
                      m ? m->total / 1048576.0 : 0.0, out_of_memory);
  }
  if (best == candidates.size() && first_failure.empty())
    return KILN_ERROR("{}: every candidate tactic failed (so the timing cache remembers)",
                      n.label());
  if (best == candidates.size())
    return KILN_ERROR("{}: every candidate tactic failed (first: {})", n.label(), first_failure);
  return best;
}

}  // namespace kiln::gpu
