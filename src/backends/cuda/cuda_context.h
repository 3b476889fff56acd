// The cuda backend's execution context (executor.cpp: the engine's static path; executor_dynamic.cpp:
// an engine whose shapes the data decides, run as one dynamic region). Internal to the backend.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dynamic.h"
#include "executor.h"
#include "layer.h"
#include "shape_eval.h"

namespace kiln::gpu {

struct LayerRun {
  const Node* node = nullptr;
  const LayerChoice* choice = nullptr;
  std::unique_ptr<Layer> layer;
  std::vector<std::unique_ptr<Layer>> alternates;  // per choice->alternates
};

// Everything that depends on the input shapes.
struct Instance {
  std::vector<std::vector<int64_t>> input_shapes;
  ShapeResult shapes;
  std::vector<std::vector<DeviceTensor>> ins, outs;  // per layer run
  std::vector<std::vector<TensorRef>> in_refs, out_refs;
  std::vector<bool> skip;                            // aliased Reshape-like layers: no work
  std::vector<int> alternate;                        // per layer run: -1, or the Alternate (plan.h)
                                                     // of the tuning point nearest these shapes
  size_t arena_bytes = 0;
  size_t workspace_bytes = 0;
  std::vector<uint8_t> upload_host;                  // host values, converted and packed
  DeviceMemory uploads;
  struct OutputCopy {
    size_t output;
    TensorRef src;
    std::shared_ptr<const Tensor> host;  // host-known outputs (constants, shape values)
  };
  std::vector<OutputCopy> output_copies;
  std::vector<std::vector<int64_t>> output_shapes;
  std::vector<size_t> output_bytes;
  // CUDA graphs of this shape, one per set of input and output addresses (a caller that
  // allocates its outputs afresh each call, as PyTorch's allocator does, alternates between a few
  // addresses), at most kGraphsPerShape, the least recently used replaced. A set of addresses is
  // captured once it repeats one of the last kGraphsPerShape calls' (`recent`): a caller whose
  // addresses are new at every call keeps running layer by layer rather than capturing each time.
  struct Graph {
    std::vector<void*> io;
    cudaGraphExec_t exec = nullptr;
    uint64_t config = 0;  // the context's config_generation_ at capture
    uint64_t used = 0;
  };
  static constexpr size_t kGraphsPerShape = 4;
  std::vector<Graph> graphs;
  // The addresses of the last calls run layer by layer: a ring of kGraphsPerShape, its vectors
  // reused (remember_direct), so a run layer by layer allocates nothing once it is full.
  std::vector<std::vector<void*>> recent;
  size_t recent_next = 0;
  void remember_direct(const std::vector<void*>& io) {
    if (recent.size() < kGraphsPerShape) {
      recent.push_back(io);
    } else {
      recent[recent_next].assign(io.begin(), io.end());
      recent_next = (recent_next + 1) % kGraphsPerShape;
    }
  }
  bool ran_direct = false;  // once run without capture (layers' first-run work is not captured)
  bool no_capture = false;  // a capture of this shape failed: it runs layer by layer from then on
  void drop_graphs() {
    for (Graph& g : graphs) cudaGraphExecDestroy(g.exec);
    graphs.clear();
  }
  ~Instance() { drop_graphs(); }
};

class CudaContext final : public ExecutionContext {
 public:
  explicit CudaContext(std::shared_ptr<CudaEngineState> e) : e_(std::move(e)), g_(e_->graph()) {}
  ~CudaContext() override {
    if (stream_) cudaStreamSynchronize(stream_);
    instances_.clear();
    runs_.clear();
    handles_.reset();
    for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
    for (cudaEvent_t ev : fence_)
      if (ev) cudaEventDestroy(ev);
    if (stream_) cudaStreamDestroy(stream_);
  }

  // Streams, library handles and the layers (or the dynamic region: init_dynamic).
  Status init();

  Expected<std::vector<Tensor>> execute(const std::map<std::string, Tensor>& inputs,
                                        std::vector<LayerTiming>* timings) override;
  Status init_dynamic();
  Expected<std::vector<Tensor>> execute_dynamic(const std::map<std::string, Tensor>& inputs,
                                                std::vector<LayerTiming>* timings);
  Expected<std::vector<DynValue>> run_dynamic(cudaStream_t s, std::vector<DynValue> ins,
                                              std::vector<LayerTiming>* timings);
  Status enqueue_dynamic(cudaStream_t s, std::vector<LayerTiming>* timings);
  Status set_output_allocator(const std::string& name, OutputAllocator* a) override {
    KILN_ASSIGN_OR_RETURN(size_t o, index_of(name, false));
    if (!dynamic_)
      return KILN_ERROR("output '{}': this engine's output sizes follow from the input shapes: "
                        "set its device address (set_tensor_address) instead", name);
    out_alloc_[o] = a;
    out_given_[o] = nullptr;
    return Status::Ok();
  }
  Expected<std::vector<const Tensor*>> checked_inputs(const std::map<std::string, Tensor>& inputs) const;
  Status set_input_shape(const std::string& name, const std::vector<int64_t>& dims) override;
  Expected<std::vector<int64_t>> tensor_shape(const std::string& name) override;
  Status set_tensor_address(const std::string& name, void* ptr) override;
  Status enqueue(CUstream_st* stream, std::vector<LayerTiming>* layer_times) override;
  Status enqueue_read(CUstream_st* stream, std::vector<LayerTiming>* layer_times);
  Status launch(Instance& inst, cudaStream_t s, std::vector<LayerTiming>* layer_times);
  Expected<MemoryInfo> plan_device_memory() override {
    if (dynamic_) return memory_info();  // its memory comes and goes with the data
    for (size_t i = 0; i < g_.inputs().size(); ++i)
      if (!input_set_[i]) return KILN_ERROR("input '{}': shape not set", g_.inputs()[i]->name);
    KILN_RETURN_IF_ERROR(read_host_inputs());
    KILN_ASSIGN_OR_RETURN(Instance * inst, instance_for(input_shapes_));
    KILN_RETURN_IF_ERROR(configure(*inst));
    return memory_info();
  }
  Status set_debug_tensors(const std::vector<std::string>& names) override {
    std::map<const Value*, std::string> want;
    for (const std::string& n : names) {
      const Value* v = g_.find_value(n);
      if (!v) return KILN_ERROR("debug tensor '{}': the engine's graph has no value of that name", n);
      want[v] = n;
    }
    debug_ = std::move(want);
    debug_out_.clear();
    return Status::Ok();
  }
  std::map<std::string, Tensor> debug_tensors() const override { return debug_out_; }
  Status set_use_cuda_graph(bool on) override {
    use_graph_ = on;
    return Status::Ok();
  }
  size_t cuda_graph_count() const override {
    if (dynamic_) return dyn_graph_->prefix_graphs();  // the prefix's, one per input shape
    size_t n = 0;
    for (const auto& [k, inst] : instances_) n += inst->graphs.size();
    return n;
  }
  MemoryInfo memory_info() const override {
    MemoryInfo m;
    m.weights = e_->weight_bytes();
    m.activations = dynamic_ ? dyn_rt_.pool.held_bytes() + dyn_graph_->prefix_held_bytes()
                    : current_ ? current_->arena_bytes : arena_.bytes();
    m.workspace = current_ ? current_->workspace_bytes : workspace_.bytes();
    return m;
  }

 private:
  void set_shape(size_t i, const std::vector<int64_t>& s) {
    input_shapes_[i] = s;
    input_set_[i] = true;
  }
  Expected<Instance*> instance_for(const std::vector<std::vector<int64_t>>& shapes);
  std::vector<bool> plan_host_inputs() const;
  // host_src (optional, per input): host memory holding the input's bytes, read instead of its
  // address (execute() passes the caller's tensors: no device round trip).
  Status read_host_inputs(const std::vector<const void*>* host_src = nullptr);
  Expected<std::unique_ptr<Instance>> make_instance(const std::vector<std::vector<int64_t>>& s);
  Status configure(Instance& inst);
  // Layer by layer rather than as a CUDA graph (for this call's addresses, io_): without CUDA
  // graphs, when timing layers, with debug copies (they synchronize), at the first run of an
  // instance (what layers do once at their first run, a tactic's constants, library plans,
  // happens outside a capture, where allocations are not allowed), with KILN_GRAPH_SHAPES=1
  // when the layers are configured for other shapes (the instance's graphs are then taken as
  // stale), after a failed capture, and for addresses that neither have a graph nor repeat a
  // recent call's.
  // With graph_shapes_ > 1 an instance's graphs outlive the layers' configuration for other
  // shapes (graph_valid), so the configured shape no longer decides.
  bool runs_direct(const Instance& inst, const std::vector<LayerTiming>* layer_times) const {
    if (!use_graph_ || layer_times || !debug_.empty() || !inst.ran_direct || inst.no_capture ||
        (graph_shapes_ <= 1 && current_ != &inst))
      return true;
    for (const Instance::Graph& g : inst.graphs)
      if (g.io == io_ && graph_valid(g)) return false;
    return std::find(inst.recent.begin(), inst.recent.end(), io_) == inst.recent.end();
  }
  // Whether a captured graph may be replayed now. A graph holds its kernels' arguments by value
  // and reads the arena, the workspace, the weights, the instance's uploads and the caller's
  // addresses (io); configuring the layers for another shape changes none of those (layers keep
  // their per-shape library plans; the arena and workspace only grow, and when they do every
  // graph is dropped, configure()). So with graph_shapes_ > 1 a graph stays valid across
  // reconfigurations; with 1 (KILN_GRAPH_SHAPES=1) only the configured shape's graphs are.
  bool graph_valid(const Instance::Graph& g) const {
    return graph_shapes_ > 1 || g.config == config_generation_;
  }
  // Past graph_shapes_ shapes holding graphs, the graphs of the least recently replayed shape go
  // (not `keep`'s): a server whose batches take a few sizes keeps each size's graphs, and one
  // whose batches take every size does not hold a graph for each.
  void limit_graph_shapes(const Instance* keep) {
    for (;;) {
      size_t holding = 0;
      Instance* lru = nullptr;
      uint64_t lru_used = UINT64_MAX;
      for (auto& [k, other] : instances_) {
        if (other->graphs.empty()) continue;
        ++holding;
        uint64_t used = 0;
        for (const Instance::Graph& g : other->graphs) used = std::max(used, g.used);
        if (other.get() != keep && used < lru_used) {
          lru_used = used;
          lru = other.get();
        }
      }
      if (holding <= graph_shapes_ || !lru) return;
      lru->drop_graphs();
      // Its addresses must repeat again before it captures again: where more shapes are live
      // than keep graphs, a shape is not captured anew at each of its calls.
      lru->recent.clear();
      lru->recent_next = 0;
    }
  }
  // KILN_GRAPH_SHAPES: how many input shapes keep their captured graphs (default 8); 1 keeps only
  // the shape the layers are configured for, so a call whose shape differs from the last call's
  // runs layer by layer (kiln 0.2's behaviour).
  static size_t graph_shapes_setting() {
    const char* v = std::getenv("KILN_GRAPH_SHAPES");
    if (!v || !*v) return kDefaultGraphShapes;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    return end && *end == '\0' && n >= 1 ? static_cast<size_t>(n) : kDefaultGraphShapes;
  }
  static constexpr size_t kDefaultGraphShapes = 8;
  // This call's input and output addresses into io_ (a buffer kept across calls: no allocation).
  void gather_io() {
    io_.assign(in_addr_.begin(), in_addr_.end());
    io_.insert(io_.end(), out_addr_.begin(), out_addr_.end());
  }
  Layer& layer_of(const Instance& inst, size_t s) const {
    const int a = inst.alternate[s];
    return a < 0 ? *runs_[s].layer : *runs_[s].alternates[a];
  }
  void* resolve(const Instance& inst, const TensorRef& r) const;
  void bind(Instance& inst);
  Status run_layers(Instance& inst, std::vector<LayerTiming>* times);
  Status copy_outputs(Instance& inst, cudaStream_t s);
  Expected<size_t> index_of(const std::string& name, bool input) const;

  std::shared_ptr<CudaEngineState> e_;
  const Graph& g_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t bound_stream_ = nullptr;
  std::unique_ptr<LibraryHandles> handles_;
  RunContext rc_;
  bool pdl_ = false;  // programmatic dependent launch available (pdl_available())
  std::vector<LayerRun> runs_;
  // Per input shapes and the values of the inputs read on the host.
  std::map<std::pair<std::vector<std::vector<int64_t>>, std::string>, std::unique_ptr<Instance>> instances_;
  // Inputs whose values layers read on the host (shape tensors): their address is read with
  // cudaMemcpyDefault (host memory, as TensorRT asks of shape tensors, or device memory) when an
  // inference is planned, and their values select the instance.
  std::vector<bool> host_in_;
  std::vector<std::shared_ptr<const Tensor>> host_vals_;
  Instance* current_ = nullptr;     // the instance whose shapes the layers are configured for
  DeviceMemory arena_, workspace_, cublas_ws_;
  std::vector<std::vector<int64_t>> input_shapes_;
  std::vector<bool> input_set_;
  std::vector<void*> in_addr_, out_addr_;
  std::vector<void*> io_;           // this call's addresses, inputs then outputs (enqueue_read)
  uint64_t generation_ = 1;         // bumps when an address or the arena changes
  uint64_t bound_generation_ = 0;
  uint64_t config_generation_ = 1;  // bumps when the layers are configured for another shape
  uint64_t graph_clock_ = 0;        // orders graph launches (least recently used)
  size_t graph_shapes_ = kDefaultGraphShapes;  // shapes that keep their graphs (KILN_GRAPH_SHAPES)
  bool use_graph_ = true;
  std::vector<cudaEvent_t> events_;
  cudaEvent_t fence_[2] = {};  // into and out of the context's stream (legacy-stream callers)
  // Host path staging (execute()).
  std::vector<std::unique_ptr<DeviceMemory>> staging_in_, staging_out_;
  // Debug tensors (set_debug_tensors): values to copy back after their layer, and the copies.
  std::vector<uint8_t> scratch_;    // read_host_inputs
  std::map<const Value*, std::string> debug_;
  std::map<std::string, Tensor> debug_out_;
  Status keep_debug(const Instance& inst, size_t run);
  // An engine whose shapes the data decides (dynamic.h): its graph runs as one dynamic region.
  bool dynamic_ = false;
  DynamicRuntime dyn_rt_;
  std::unique_ptr<DynamicGraph> dyn_graph_;
  std::vector<std::vector<int64_t>> dyn_out_shapes_;  // the last inference's output shapes
  cudaStream_t dyn_stream_ = nullptr;        // the stream the last dynamic run used
  std::vector<OutputAllocator*> out_alloc_;  // enqueue()'s outputs (set_output_allocator)
  std::vector<void*> out_given_;             // what each allocator returned last
};

}  // namespace kiln::gpu
