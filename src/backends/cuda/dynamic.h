// The dynamic region of a CUDA engine: layers whose shapes the data decides (data-dependent ops
// such as NonZero, control flow, and everything computed from them; ShapeResult::dynamic). They
// run layer by layer with shapes learned as the run goes, as ONNX Runtime runs every kernel:
// per node, shape inference on a private copy of the graph, outputs from a device pool, the layer
// configured where its shapes changed, then run; a data-dependent layer's sizes are read back
// once the stream reaches it (one synchronisation); If, Loop and Scan read their condition or
// trip count on the host and run their subgraphs' own plans (lower.cpp: subplans) the same way.
// A layer whose inputs are all known on the host and small runs its reference kernel there
// (host_instead): no upload, launch and read-back for a loop body's scalar arithmetic.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "device_util_host.h"
#include "kiln/engine.h"
#include "ops/relayout_types.h"
#include "plan.h"

namespace kiln::gpu {

// Elements a value may hold to be computed on the host instead of the device, where all its
// inputs are known there (DynamicGraph::host_instead), or read back once for a loop body.
constexpr int64_t kHostSmall = 4096;

// The layers of the main graph's prefix (dynamic_prefix.cpp): those before any size the data
// decides, replayed as one CUDA graph per input shape; all false where no device layer is one.
std::vector<bool> prefix_layers(const Graph& g, const Plan& plan);

// Device memory for a dynamic run's tensors. A block goes back to the pool when the last
// shared_ptr to it goes, and is handed out again: every user runs on the context's one stream,
// so a block freed there is free in stream order (as PyTorch's caching allocator has it).
class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool();
  Expected<std::shared_ptr<void>> get(size_t bytes, const std::string& what);
  size_t held_bytes() const { return held_; }

 private:
  struct Free {
    std::multimap<size_t, void*> blocks;
    bool pool_alive = true;
  };
  std::shared_ptr<Free> free_ = std::make_shared<Free>();
  size_t held_ = 0;
};

// One value during a dynamic run: on the device (t.data), on the host (host), or both.
struct DynValue {
  DeviceTensor t;                      // shape and storage format; data null where not on device
  std::shared_ptr<void> block;         // what t.data points into, kept alive with the value
  std::shared_ptr<const Tensor> host;  // the logical value on the host, where known
  bool known() const { return t.data || host || t.dtype == DataType::kUndefined; }
};

// What every dynamic graph of a context shares: the stream and library handles (rc), the
// workspace, the pool, the host-mapped buffer data-dependent layers write their sizes to, and the
// engine's weights (for the main graph's constants).
struct DynamicRuntime {
  RunContext* rc = nullptr;
  DeviceMemory* workspace = nullptr;
  DevicePool pool;
  DevicePool* alloc = nullptr;  // where layers' outputs come from now: &pool unless a prefix's
  DevicePool& pool_now() { return alloc ? *alloc : pool; }
  // Whether the main graph's prefix may replay as a CUDA graph (the context's set_use_cuda_graph).
  bool graphs = true;
  bool dry = false;  // layers are configured and their outputs allocated, but nothing runs
  // Host-mapped memory the data-dependent layers in flight write their sizes to: kMaxDynRank
  // entries per output, a slot per layer until the run reads them (DynamicGraph::run).
  int64_t* dims = nullptr;
  size_t dims_outputs = 0;  // capacity, in outputs
  size_t dims_used = 0;     // outputs given to layers whose sizes are not read yet
  // The engine's copy of constant `v` in format `f` (main graph), or nullptr (a subgraph's own
  // constants are uploaded by its DynamicGraph).
  std::function<void*(const Value*, const TensorFormat&)> engine_weight;
  std::vector<Tensor> staged;  // host copies uploaded during the run (upload)
  // Where a profile is asked for: each node's wall-clock time, the stream synchronised before
  // and after it (its kernels, host work and size read-backs); control flow's bodies are timed
  // node by node instead of the If/Loop/Scan node as a whole.
  std::vector<LayerTiming>* times = nullptr;
  ~DynamicRuntime();
  Status ensure_dims(size_t outputs);
  // Copies a host tensor (already in device format) to `dst` on the stream.
  Status upload(void* dst, Tensor host);
  // kMaxDynRank entries for each of `outputs` outputs of a layer in flight, or nullptr when the
  // buffer is full (the caller reads the pending sizes first, which frees it).
  int64_t* take_dims(size_t outputs);
  // Copies a device value to the host (synchronising the stream) as logical type `to`.
  Expected<std::shared_ptr<const Tensor>> read_back(const DynValue& v, DataType to);
};

class DynamicGraph {
 public:
  ~DynamicGraph();
  // `g` and `plan` must outlive the DynamicGraph; `engine_weights`: g's constants are in the
  // engine's weights (the main graph), else uploaded here at first use.
  static Expected<std::unique_ptr<DynamicGraph>> create(const Graph& g, const Plan& plan,
                                                        bool engine_weights);
  // Runs the graph on `inputs` (one per graph input, each in the format the plan's first
  // consumers expect) and returns its outputs.
  Expected<std::vector<DynValue>> run(DynamicRuntime& rt, std::vector<DynValue> inputs);
  // The prefix (dynamic_prefix.cpp: the main graph's layers before any size the data decides,
  // replayed as a CUDA graph per input shape): the device memory its shapes hold, and the
  // captures held.
  size_t prefix_held_bytes() const;
  size_t prefix_graphs() const;

 private:
  DynamicGraph(const Graph& g, const Plan& plan, bool engine_weights);  // dynamic_prefix.cpp
  struct Step;
  // A data-dependent layer that ran but whose sizes are not read yet: its outputs' values hold the
  // op's bound until resolve() reads the sizes, after one synchronisation for all of them.
  struct Awaiting {
    size_t node;
    const int64_t* dims;
  };
  Status resolve(DynamicRuntime& rt, std::vector<DynValue>& val);
  bool ready(size_t k) const;  // every input of node k has its size
  Status run_node(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  Status run_layer(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  Status run_host(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  bool host_instead(const DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  Status run_if(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  Status run_loop(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  Status run_scan(DynamicRuntime& rt, size_t k, std::vector<DynValue>& val);
  // A Loop's or Scan's small captured values read back once before the first iteration.
  Status mirror_captures(DynamicRuntime& rt, size_t k, std::vector<DynValue>& ins,
                         std::vector<DynValue>& val);
  Expected<DeviceTensor> device_input(DynamicRuntime& rt, size_t k, size_t i,
                                      std::vector<DynValue>& val);
  Expected<std::shared_ptr<const Tensor>> host_value(DynamicRuntime& rt, const Value* v,
                                                     std::vector<DynValue>& val);
  void learn(size_t idx, const DynValue& v);  // the scratch graph's type (and value) of idx
  DynamicGraph* sub(size_t k, const std::string& name);
  DynValue pass(const Value* v, const std::vector<DynValue>& val) const;  // a node input as is
  void set_output(size_t k, size_t o, DynValue v, std::vector<DynValue>& val);
  // A node has run: its inputs' remaining uses drop, and a value with none left goes.
  void consumed(size_t k, std::vector<DynValue>& val, std::vector<int>& left);

  // The prefix (dynamic_prefix.cpp): the layers whose inputs are graph inputs read on the
  // device, constants and the prefix's own values, none data-dependent or control flow. Its
  // first run at an input shape runs it layer by layer (from a pool of its own), the second
  // captures it, later ones replay the capture.
  struct Prefix;
  void plan_prefix();
  bool prefix_on(const DynamicRuntime& rt) const;
  Status run_prefix(DynamicRuntime& rt, std::vector<DynValue>& val, std::vector<int>& left);
  Status run_prefix_nodes(DynamicRuntime& rt, std::vector<DynValue>& val, std::vector<int>& left);
  std::vector<size_t> prefix_nodes_;     // in order
  std::vector<bool> in_prefix_;          // per node
  std::vector<size_t> prefix_inputs_;    // slots of the graph inputs the prefix reads
  std::vector<size_t> prefix_outputs_;   // slots of prefix values read after it or returned
  std::map<std::string, std::unique_ptr<Prefix>> prefixes_;  // per input shapes
  uint64_t prefix_clock_ = 0;

  const Graph& g_;
  const Plan& plan_;
  bool engine_weights_;
  std::unique_ptr<Graph> scratch_;          // inference's copy, retyped as values are learned
  std::unordered_map<const Value*, size_t> index_;  // value -> slot
  std::vector<const Value*> value_;         // slot -> the value (g_.values() copies: not per use)
  std::vector<std::vector<size_t>> reads_;  // per node: the slots of its computed inputs
  std::vector<Value*> scratch_value_;       // slot -> the scratch graph's value
  std::vector<int> uses_;                   // slot -> node inputs and graph outputs reading it
  std::vector<std::unique_ptr<Layer>> layers_;  // per node; null: host node or control flow
  std::vector<std::string> configured_;     // per node: the shapes it was last configured for
  struct ShapeMemo {  // per node: its output shapes at the input shapes and host values `key`
    std::string key;
    std::vector<std::vector<int64_t>> shapes;
  };
  std::vector<ShapeMemo> shapes_;
  std::vector<ShapeMemo> host_shapes_;  // the same where the layer ran on the host (host_instead)
  std::vector<std::unique_ptr<RelayoutTypes>> relayout_types_;  // per kiln.Relayout node, for out_shapes
  Expected<const std::vector<std::vector<int64_t>>*> out_shapes(size_t k, const std::string& key,
                                                                bool bound, ShapeMemo& memo);
  std::map<std::pair<size_t, std::string>, std::unique_ptr<DynamicGraph>> subs_;
  std::map<std::tuple<const Value*, DataType, Layout>, std::shared_ptr<void>> consts_;
  std::vector<std::shared_ptr<void>> keep_;  // this run's uploads of host values
  std::vector<Awaiting> awaiting_;           // this run's layers whose sizes are not read yet
  std::vector<bool> sized_;                  // per slot: the value's shape is its real one
  bool ran_on_host_ = false;                 // the node run_node ran last ran on the host
};

// Stacks same-shaped device values along a new axis `axis` (a Loop's or Scan's scan outputs),
// in reverse order if `reverse`; `empty_dims` shapes the result of no parts (unknown dims as 0).
Expected<DynValue> stack_values(DynamicRuntime& rt, std::vector<DynValue>& parts, int64_t axis,
                                bool reverse, const TensorFormat& f,
                                const std::vector<int64_t>& empty_dims, const std::string& what);
// Slice t of a row-major device value along `axis`, the axis removed (a view where it can be).
Expected<DynValue> slice_value(DynamicRuntime& rt, const DynValue& x, int64_t axis, int64_t t);

}  // namespace kiln::gpu
