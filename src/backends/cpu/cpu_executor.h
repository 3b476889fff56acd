// The CPU reference backend: runs a Graph node by node with the registry's reference kernels.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "kiln/engine.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

class CpuExecutor {
 public:
  // `float64` runs every float32 tensor as float64 (inputs, constants and kernels) and casts
  // the outputs back: a higher-precision reference for checking other backends.
  static Expected<std::unique_ptr<CpuExecutor>> create(const Graph& g, bool float64 = false);

  // Intermediate values to keep while running (ExecutionContext::set_debug_tensors).
  struct Debug {
    std::vector<std::pair<int, std::string>> slots;  // from debug_slots()
    std::map<std::string, Tensor> values;            // filled by run(); float64 mode keeps float64
  };
  // The slots of the named values; a name the graph lacks is an error.
  Expected<std::vector<std::pair<int, std::string>>> debug_slots(
      const std::vector<std::string>& names) const;

  // Inputs in graph-input order. Checks dtype, rank and static dims, and that a symbolic dim
  // (e.g. "N") has one size across all inputs.
  // `observe`, when given, sees every node output as it is computed (INT8 calibration reads
  // the intermediate tensors through it).
  using Observer = std::function<void(const Value&, const Tensor&)>;
  Expected<std::vector<Tensor>> run(const std::vector<Tensor>& inputs,
                                    std::vector<LayerTiming>* timings = nullptr,
                                    Debug* debug = nullptr, const Observer* observe = nullptr) const;

 private:
  class Subgraphs;
  explicit CpuExecutor(const Graph& g, bool float64) : graph_(g), float64_(float64) {}
  // `nested`: a subgraph's run, whose inputs come from the enclosing graph's run (already
  // widened in float64 mode, typed by inference) and whose outputs stay as computed.
  Expected<std::vector<Tensor>> run_impl(const std::vector<Tensor>& inputs,
                                         std::vector<LayerTiming>* timings, Debug* debug,
                                         const Observer* observe, bool nested) const;
  struct Step {
    const Node* node;
    const void* def;                  // const OpDef*
    std::vector<int> inputs;          // value slots (-1 = absent)
    std::vector<int> outputs;
    std::vector<int> release;         // slots whose last use is this step
  };
  const Graph& graph_;
  bool float64_;
  std::vector<Step> steps_;
  std::vector<int> input_slots_, output_slots_;
  std::vector<std::pair<int, std::shared_ptr<const Tensor>>> constants_;
  int num_slots_ = 0;
  std::map<std::string, int> slot_by_name_;
  // An executor per subgraph of this graph's nodes (If branches, Loop and Scan bodies).
  std::map<const Graph*, std::unique_ptr<CpuExecutor>> subgraphs_;
};

// Checks a runtime input against its declared type; `dims_seen` binds symbolic dims.
Status check_input(const Value& decl, const Tensor& t, std::map<std::string, int64_t>& dims_seen);

}  // namespace kiln
