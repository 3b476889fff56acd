// kiln's public API: build an engine from ONNX, save/load it, and run it.
//
//   kiln::BuildConfig cfg;                         // backend, precision, shapes, opt level
//   auto engine = kiln::Engine::build_from_onnx("model.onnx", cfg);
//   engine.value()->save("model.kiln");
//   auto ctx = engine.value()->create_context();
//   auto outputs = ctx.value()->execute({{"input", tensor}});
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

class Graph;

struct LayerTiming {
  std::string name;
  std::string op_type;
  double ms = 0;
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
  bool verbose = false;        // passes explain why they did not apply
};

class ExecutionContext {
 public:
  virtual ~ExecutionContext() = default;
  // Runs the engine. Inputs by name (every engine input must be given); outputs come back in
  // engine output order. `timings`, when given, receives one entry per layer.
  virtual Expected<std::vector<Tensor>> execute(const std::map<std::string, Tensor>& inputs,
                                                std::vector<LayerTiming>* timings = nullptr) = 0;
};

class Engine {
 public:
  ~Engine();
  static Expected<std::unique_ptr<Engine>> build_from_onnx(const std::string& onnx_path,
                                                           const BuildConfig& config);
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

  Expected<std::unique_ptr<ExecutionContext>> create_context() const;

 private:
  Engine() = default;
  static Expected<std::unique_ptr<Engine>> from_graph(std::unique_ptr<Graph> g,
                                                      std::string backend, std::string target,
                                                      std::string options_json,
                                                      std::string kiln_version);
  std::unique_ptr<Graph> graph_;
  std::string backend_, target_, options_json_, kiln_version_;
  std::vector<TensorInfo> inputs_, outputs_;
};

// "cuda" when the CUDA backend is available and a GPU is present, else "cpu".
std::string default_backend();
// Why a backend cannot be used here ("" when it can).
std::string backend_unavailable_reason(const std::string& backend);
// The target string the named backend would write into an engine built on this machine.
std::string current_target(const std::string& backend);

}  // namespace kiln
