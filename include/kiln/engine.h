// kiln's public API: build an engine from ONNX, save/load it, and run it.
//
//   kiln::BuildConfig cfg;                         // backend, precision, shapes, opt level
//   auto engine = kiln::Engine::build_from_onnx("model.onnx", cfg);
//   engine.value()->save("model.kiln");
//   auto ctx = engine.value()->create_context();
//   auto outputs = ctx.value()->execute({{"input", tensor}});
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

// cudaStream_t is `CUstream_st*`; declared here so this header needs no CUDA include.
struct CUstream_st;

namespace kiln {

class Graph;

struct LayerTiming {
  std::string name;
  std::string op_type;
  double ms = 0;
  // Of ms, the host's part where it is known (a CUDA engine's dynamic region: from the stream
  // being idle until the layer's launches, reads and allocations returned; the rest of ms is the
  // wait for the GPU to finish them). -1 where not measured.
  double host_ms = -1;
};

struct TensorInfo {
  std::string name;
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> dims;            // -1 for a dynamic dimension
  std::vector<std::string> dim_names;   // symbol of each dynamic dimension ("" if none)
  std::string str() const;              // "input: float32[N,3,224,224]"
};

// Shapes per input name, as given on the command line ("name:1x3x224x224").
using ShapeMap = std::map<std::string, std::vector<int64_t>>;

struct BuildConfig {
  std::string backend;       // "cpu" or "cuda"; empty = default_backend()
  bool fp16 = false;         // allow FP16 kernels
  bool int8 = false;         // allow INT8 kernels
  int opt_level = 2;         // 0 = import as is, 1 = folding and cleanup, 2 = everything
  ShapeMap shapes;           // fixed input shapes (min = opt = max)
  ShapeMap min_shapes, opt_shapes, max_shapes;  // an optimization profile for dynamic inputs
  std::string dump_graph_dir;  // write the graph after each pass here (text + dot)
  bool verbose = false;        // passes explain why they did not apply; tactics and their times
  // cuda backend:
  bool tf32 = true;            // FP32 matrix products may use TF32 tensor cores (--no-tf32: off)
  std::map<std::string, std::string> layer_precisions;  // node name ("*": every other) -> "fp32" | "fp16" | "int8"
  std::string timing_cache;    // --timing-cache FILE: reuse and record tactic timings
  size_t workspace_limit = 0;  // --mem-pool-size workspace:N bytes (0: 1 GiB)
  std::string layout = "auto"; // "auto" (NHWC for FP16/TF32 CNN layers), "linear", "nhwc"
  // The engine's input and output types (trtexec's --inputIOFormats / --outputIOFormats): empty
  // keeps the model's; one spec ("fp16", "fp32", optionally ":chw") for every float tensor, or
  // one per tensor in order (a non-float tensor's own type, e.g. "int64"). An FP16 engine with
  // fp16 outputs writes its last layers' results as they are, with no float32 conversion.
  std::vector<std::string> input_io_formats, output_io_formats;
  bool tune = true;            // time tactic candidates (false: first supported; for tests)
  std::string force_tactic;    // tests: only this tactic (by name) for the layers it implements
  // tests: the GPU's free and total memory the build is checked against (0: ask the GPU)
  size_t gpu_memory_free = 0, gpu_memory_total = 0;
  // INT8 (docs/quantization.md). A model with Q/DQ nodes carries its own scales; any other
  // model is calibrated on `calib_data` or takes the scales of a matching `calib_cache`.
  // input name ("" = the only input) -> folder of .npy files, or of images (also in class
  // subfolders) preprocessed by `calib_images`, as `kiln run` preprocesses an image input
  std::map<std::string, std::string> calib_data;
  struct CalibImages {
    int resize_short = 0;         // > 0: shorter side to this, then center-crop to the input's HxW
    int resize_h = 0, resize_w = 0;  // > 0: exactly this size (the input's HxW when both are 0)
    std::vector<float> mean, std;    // per channel, of values in [0, 1]; empty: 0 and 1
    bool nhwc = false;               // the input is [N,H,W,C]
    // Options given with no calibration images to apply to are an error (false: they also
    // serve something else, as kiln run's image inputs).
    bool error_if_unused = true;
    bool any() const {
      return resize_short || resize_h || resize_w || !mean.empty() || !std.empty() || nhwc;
    }
  } calib_images;
  std::string calib_algo;          // entropy | minmax | percentile; "" = entropy, or the cache's
  double calib_percentile = 99.99;
  size_t calib_batches = 0;        // use at most this many batches (0: all)
  std::string calib_cache;         // reused when it matches the model; written after calibrating
  // > 0: the largest relative L2 error of any output, INT8 against FP32, allowed on held-out
  // calibration batches; the most sensitive INT8 layers move back to float until it fits.
  double accuracy_budget = 0;
  std::function<void(const std::string&)> progress;  // calibration and search progress lines
};

// Device memory an execution context uses, in bytes.
struct MemoryInfo {
  size_t weights = 0;      // the engine's weights on the device (shared by its contexts)
  size_t activations = 0;  // the context's activation arena, for its current shapes
  size_t workspace = 0;    // scratch of the layer that needs most
};

// Device memory for the outputs of an engine whose output sizes the data decides (TensorRT's
// IOutputAllocator): enqueue() asks each output's allocator for its memory once the size is known.
class OutputAllocator {
 public:
  virtual ~OutputAllocator() = default;
  // Device memory of at least `bytes` for output `name`; `current` is what this allocator returned
  // for it last time (null the first time), to be kept where it is large enough. Null fails the
  // inference (where `bytes` is not 0).
  virtual void* reallocate_output(const std::string& name, void* current, size_t bytes) = 0;
  // The output's shape in this inference, once its memory was asked for.
  virtual void notify_shape(const std::string& name, const std::vector<int64_t>& dims) = 0;
};

class ExecutionContext {
 public:
  virtual ~ExecutionContext() = default;
  // Runs the engine. Inputs by name (every engine input must be given); outputs come back in
  // engine output order. `timings`, when given, receives one entry per layer.
  virtual Expected<std::vector<Tensor>> execute(const std::map<std::string, Tensor>& inputs,
                                                std::vector<LayerTiming>* timings = nullptr) = 0;

  // --- The device path (cuda backend), as TensorRT's execution context: set every input's
  // shape and every input's and output's device address, then enqueue on a stream. enqueue
  // returns once the work is queued; nothing is allocated per inference (the first enqueue
  // after a shape change plans memory and configures layers).
  virtual Status set_input_shape(const std::string& name, const std::vector<int64_t>& dims);
  // An input's shape as set, or an output's shape for the inputs' current shapes.
  virtual Expected<std::vector<int64_t>> tensor_shape(const std::string& name);
  virtual Status set_tensor_address(const std::string& name, void* device_ptr);
  // `layer_times`, when given, makes the run synchronous and times each layer with events.
  virtual Status enqueue(CUstream_st* stream, std::vector<LayerTiming>* layer_times = nullptr);
  // CUDA graphs (cuda backend; on by default): an inference whose input shapes and input and
  // output addresses repeat one of the last few calls' is captured once as a CUDA graph and
  // replayed from then on, one launch instead of one per layer (results are the same). Off: every
  // layer is launched at every inference.
  virtual Status set_use_cuda_graph(bool on);
  virtual MemoryInfo memory_info() const { return {}; }
  // Plans memory and configures the layers for the input shapes set (what the first enqueue
  // after a shape change does, allocating the arena and workspace) and reports the memory.
  virtual Expected<MemoryInfo> plan_device_memory();

  // --- Debugging (what `kiln compare --per-layer` uses): every later execute() also keeps the
  // named intermediate tensors, read back with debug_tensors(). Names are value names of the
  // optimized graph (a fused layer's output keeps the ONNX name of the value it produces). The
  // tensors come back in the logical layout (NCHW order) and the value's declared type (FP16
  // storage converted back). It slows execute() down: on the GPU each tensor is copied to the
  // host synchronously after its layer (enqueue then runs synchronously too), and CUDA graphs
  // are not used. An empty list turns it off; an unknown name is an error.
  virtual Status set_debug_tensors(const std::vector<std::string>& names);
  // The tensors the last execute() kept, by name.
  virtual std::map<std::string, Tensor> debug_tensors() const { return {}; }

  // How many CUDA graphs the context holds (captured, replayed when their call repeats; see
  // set_use_cuda_graph). Last in the class: added within 0.2, it leaves the other functions'
  // places in the virtual table as they were.
  virtual size_t cuda_graph_count() const { return 0; }
  // The device path of an engine whose output sizes the data decides (data-dependent ops, control
  // flow; `kiln inspect` says so): every output needs an allocator, which enqueue() asks for the
  // output's memory once its size is known; the addresses set for outputs are not used. enqueue()
  // synchronises the stream where the run reads a size back. The allocator must outlive its use;
  // null removes it. (After cuda_graph_count: the earlier virtual table is unchanged.)
  virtual Status set_output_allocator(const std::string& name, OutputAllocator* allocator);
};

class BackendEngine;
namespace quant {
struct BudgetResult;
}

class Engine {
 public:
  ~Engine();
  static Expected<std::unique_ptr<Engine>> build_from_onnx(const std::string& onnx_path,
                                                           const BuildConfig& config);
  // The same from a graph already imported or made in code (`source` names it in messages).
  static Expected<std::unique_ptr<Engine>> build_from_graph(std::unique_ptr<Graph> g,
                                                            const BuildConfig& config,
                                                            const std::string& source = "graph");
  static Expected<std::unique_ptr<Engine>> load(const std::string& path);
  Status save(const std::string& path) const;

  const std::vector<TensorInfo>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return outputs_; }
  const std::string& backend() const { return backend_; }
  const std::string& target() const { return target_; }
  const std::string& kiln_version() const { return kiln_version_; }
  // Build options as a JSON object string.
  const std::string& build_options_json() const { return options_json_; }
  // The optimized graph (kiln's internal IR; for inspection tools).
  const Graph& graph() const { return *graph_; }
  // The backend's plan as JSON text: for cuda, one record per graph node (tactic, precision,
  // formats, tuned time); "{}" for cpu. docs/engine-format.md describes it.
  const std::string& backend_plan_json() const { return plan_json_; }

  Expected<std::unique_ptr<ExecutionContext>> create_context() const;

 private:
  Engine() = default;
  static Expected<std::unique_ptr<Engine>> from_graph(std::unique_ptr<Graph> g,
                                                      std::string backend, std::string target,
                                                      std::string options_json,
                                                      std::string kiln_version,
                                                      std::string plan_json);
  std::unique_ptr<Graph> graph_;
  std::string backend_, target_, options_json_, kiln_version_;
  std::string plan_json_;  // the backend's plan (per-layer tactics), JSON text
  std::shared_ptr<BackendEngine> backend_engine_;  // what the backend keeps per engine
  std::vector<TensorInfo> inputs_, outputs_;
};

// "cuda" when the CUDA backend is available and a GPU is present, else "cpu".
std::string default_backend();
// Why a backend cannot be used here ("" when it can).
std::string backend_unavailable_reason(const std::string& backend);
// The target string the named backend would write into an engine built on this machine.
std::string current_target(const std::string& backend);

}  // namespace kiln
