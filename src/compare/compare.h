// Accuracy comparison of engines against a float64 reference (what `kiln compare` prints):
// per-tensor error metrics, the reference run of an ONNX model on the CPU backend in float64,
// and per-layer error localisation over the intermediate tensors both sides have.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/cpu_executor.h"
#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

struct TensorMetrics {
  double max_abs = 0;  // max |got - ref|
  double rel_l2 = 0;   // ||got - ref|| / ||ref||  (||got - ref|| when ref is all zeros)
  double cosine = 1;   // <got, ref> / (||got|| ||ref||); 1 when both are zero
  double top1 = -1;    // share of rows (all axes but the last) whose argmax over the last axis
                       // agrees; -1 when the last axis has fewer than 2 entries
  bool finite = true;  // got has no NaN/inf
};
// Both tensors are read as double; an element count mismatch is an error naming `what`.
Expected<TensorMetrics> compare_tensors(const Tensor& got, const Tensor& ref,
                                        const std::string& what);

// The ONNX model as imported (no optimization) on the CPU backend in float64.
class Reference {
 public:
  static Expected<std::unique_ptr<Reference>> create(const std::string& onnx_path);
  // The same for a graph made in code (tests).
  static Expected<std::unique_ptr<Reference>> from_graph(std::unique_ptr<Graph> g);
  const Graph& graph() const { return *graph_; }
  // Outputs in graph order, float ones in float64 (not rounded back); with `keep`, also the
  // named intermediate values, in float64.
  Expected<std::vector<Tensor>> run(const std::map<std::string, Tensor>& inputs,
                                    const std::vector<std::string>& keep = {},
                                    std::map<std::string, Tensor>* kept = nullptr) const;

 private:
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<CpuExecutor> ex_;
};

// Float values computed by the engine's layers (not inputs or constants) that the reference
// graph also computes under the same name, in the engine's layer order.
std::vector<std::string> common_tensors(const Graph& engine_graph, const Graph& reference);

struct LayerError {
  std::string layer, op_type, tensor;   // the engine layer, its type, the tensor compared
  std::vector<std::string> onnx_nodes;  // the ONNX nodes the layer covers
  TensorMetrics m;
  double upstream = 0;  // the largest error reaching the layer's inputs
  bool jump = false;
};
struct PerLayerReport {
  std::vector<LayerError> layers;  // in the engine's layer (topological) order
  int first_jump = -1;             // index into layers, -1 if none
  double floor = 0;
};

// The jump rule: a compared tensor's relative L2 error `e` jumps when e > floor and
// e > 10 x its upstream error, the largest error of the compared tensors that reach the
// layer's inputs (through layers not compared: their inputs' upstream error; graph inputs and
// constants: 0). Tensors whose element counts differ are not compared. So error that merely grows
// as it flows is not a jump, and the first layer (in topological order) that introduces a new, much
// larger error is named.
Expected<PerLayerReport> localise_error(const Graph& engine_graph,
                                        const std::map<std::string, Tensor>& got,
                                        const std::map<std::string, Tensor>& ref, double floor);

// The default floor of the jump rule for an engine's build options (precision, tf32): the
// relative L2 error every layer of that precision may add (fp32 1e-4, tf32/fp16 1e-2, int8 0.1).
double default_jump_floor(const Engine& e);
// "fp32", "tf32", "fp16" or "int8" from an engine's build options (cpu engines are fp32).
std::string engine_precision(const Engine& e);

}  // namespace kiln
