// The op registry: one OpDef per op, holding its opset upgrade, shape/type inference and CPU
// reference kernel. Each op family lives in one file (src/ops/<family>.cpp) and exposes its
// table through a function declared at the bottom of this header; registry.cpp lists them all.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

// --- import: canonicalise a node imported at an older opset into the newest form -----------
// Example: Squeeze-11 has an `axes` attribute; the canonical (opset 13+) form takes axes as
// input 1, so the upgrade moves the attribute into a constant input.
class ImportContext {
 public:
  ImportContext(Graph& g, Node& n, int opset) : graph_(g), node_(n), opset_(opset) {}
  Graph& graph() { return graph_; }
  Node& node() { return node_; }
  int opset() const { return opset_; }  // the model's ai.onnx opset
  // Adds a constant value named after the node.
  Value* add_constant(const std::string& what, Tensor t);
  // Moves int-list attribute `attr` (if present) into input slot `index` as an int64 tensor
  // (1-D, or a scalar when `scalar` is set). Missing attribute: the input stays absent.
  void attr_to_input(const std::string& attr, size_t index, bool scalar = false);
  // Same for a float attribute -> scalar float input of `dtype`.
  void float_attr_to_input(const std::string& attr, size_t index, DataType dtype, float def,
                           bool always);

 private:
  Graph& graph_;
  Node& node_;
  int opset_;
};

// --- shape and type inference ----------------------------------------------------------------
class InferContext {
 public:
  InferContext(const Node& n, std::vector<TensorType>& outputs) : node_(n), outputs_(outputs) {}
  const Node& node() const { return node_; }
  const Attributes& attrs() const { return node_.attrs; }
  size_t num_inputs() const { return node_.num_inputs(); }
  size_t num_outputs() const { return node_.num_outputs(); }
  bool has_input(size_t i) const { return node_.input(i) != nullptr; }
  // The input's type; an absent input reads as an undefined type with unknown rank.
  const TensorType& input_type(size_t i) const;
  // The input's value when it is a constant (initializer or folded), else nullptr.
  const Tensor* input_const(size_t i) const;
  // The elements of a small integer input when known: a constant's values, or the symbolic
  // shape value infer_shapes recorded (Value::shape_value).
  std::optional<std::vector<SymInt>> input_value(size_t i) const;
  void set_output(size_t i, TensorType t) {
    if (i < outputs_.size()) outputs_[i] = std::move(t);
  }

 private:
  const Node& node_;
  std::vector<TensorType>& outputs_;
};

// --- CPU reference kernels ---------------------------------------------------------------------
// Runs a subgraph (an If branch, a Loop or Scan body) on its inputs: what a control-flow op's
// kernel asks of the executor that runs it (the CPU executor; ops do not depend on backends).
class SubgraphRunner {
 public:
  virtual ~SubgraphRunner() = default;
  virtual Expected<std::vector<Tensor>> run(const Graph& g, const std::vector<Tensor>& inputs) = 0;
};

class KernelContext {
 public:
  KernelContext(const Node& n, std::vector<const Tensor*> inputs, std::vector<Tensor>& outputs,
                SubgraphRunner* subgraphs = nullptr)
      : node_(n), inputs_(std::move(inputs)), outputs_(outputs), subgraphs_(subgraphs) {}
  const Node& node() const { return node_; }
  const Attributes& attrs() const { return node_.attrs; }
  size_t num_inputs() const { return inputs_.size(); }
  // Input i, or nullptr when the optional input is absent.
  const Tensor* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  size_t num_outputs() const { return outputs_.size(); }
  void set_output(size_t i, Tensor t) {
    if (i < outputs_.size()) outputs_[i] = std::move(t);
  }
  // The executor's subgraph runner; nullptr where a kernel runs alone (constant folding).
  SubgraphRunner* subgraphs() const { return subgraphs_; }

 private:
  const Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor>& outputs_;
  SubgraphRunner* subgraphs_ = nullptr;
};

using ImportFn = Status (*)(ImportContext&);
using InferFn = Status (*)(InferContext&);
using CpuKernelFn = Status (*)(KernelContext&);

struct OpDef {
  std::string_view domain;   // "" for ai.onnx, "kiln" for kiln's own (fused) layers
  std::string_view op_type;
  InferFn infer = nullptr;
  CpuKernelFn cpu = nullptr;
  ImportFn upgrade = nullptr;  // null: the node is already in canonical form at every opset
  // The newest ONNX version of the op that kiln runs; 0: every version up to kNewestKnownOpset
  // (src/ops/op_versions.inc lists them). A model whose opset selects a newer version is refused.
  int max_version = 0;
  // For an op whose output sizes depend on the data (NonZero's count, NonMaxSuppression's
  // selections): inference at the largest sizes the data can give, from static input shapes.
  // An executor that sizes memory before the data is known (the cuda backend) allocates these.
  InferFn bound = nullptr;
};

// --- ONNX op versions ---------------------------------------------------------------------------
// The newest ai.onnx opset whose op versions kiln knows (src/ops/op_versions.inc).
inline constexpr int kNewestKnownOpset = 28;
// The opsets at which an ai.onnx op's schema changed (ascending; empty for unknown ops).
std::vector<int> onnx_op_history(std::string_view op_type);
// The version of the op selected by a model's `opset` (the newest since-version <= opset;
// opsets above kNewestKnownOpset count as kNewestKnownOpset); 0 when it did not exist yet.
int onnx_op_version(std::string_view op_type, int opset);
// Refuses a node whose op did not exist at `opset`, or whose selected version is newer than
// the OpDef's max_version; the message names the node, op and version.
Status check_op_version(const Node& n, int opset);

// Looks an op up by domain ("" and "ai.onnx" are the same) and type; nullptr if unknown.
const OpDef* find_op(std::string_view domain, std::string_view op_type);
std::vector<const OpDef*> all_ops();
// Input i of the node is read only for its type (CastLike's target_type): a value computed at
// run time there does not keep the node from being folded or evaluated on the host.
bool input_is_type_only(const Node& n, size_t i);
// Ops defined by more than one family (must be empty; checked by a unit test).
std::vector<std::string> duplicate_op_definitions();

// Runs inference over the whole graph in node order, filling every value's type. Values that
// already carry a more specific type (e.g. from the model's value_info) keep known dims.
Status infer_shapes(Graph& g);

// --- helpers shared by op families ------------------------------------------------------------
// Normalises a possibly negative axis into [0, rank); error names the node. A scalar (rank 0) has
// no axis: every axis of one is an error, so a caller may index the dims with the result.
Expected<int64_t> normalize_axis(int64_t axis, int64_t rank, const Node& n);
// Multidirectional (numpy) broadcasting of concrete shapes.
Expected<std::vector<int64_t>> broadcast_shapes(const std::vector<std::vector<int64_t>>& shapes,
                                                const Node& n);
// Broadcasting of symbolic dims (unknown dims stay unknown unless the other side is > 1).
Expected<std::vector<Dim>> broadcast_dims(const std::vector<std::vector<Dim>>& dims, const Node& n);
// Row-major strides of a shape, and strides of `in` broadcast to `out` (0 on broadcast axes).
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in,
                                       const std::vector<int64_t>& out);
// Infer helper for ops whose output 0 has the type of input `i`.
Status infer_same_as_input(InferContext& ctx, size_t i = 0);

// --- the op families (each defined in src/ops/<family>.cpp) -----------------------------------
std::span<const OpDef> elementwise_ops();  // unary/binary math, logic, Where, Clip, Cast, ...
std::span<const OpDef> activation_ops();   // Relu, Sigmoid, Elu, Selu, HardSwish, PRelu, ...
std::span<const OpDef> conv_ops();         // Conv, ConvTranspose
std::span<const OpDef> pool_ops();         // MaxPool, AveragePool, Global*Pool
std::span<const OpDef> gemm_ops();         // Gemm, MatMul
std::span<const OpDef> norm_ops();         // BatchNormalization, InstanceNorm, LayerNorm
std::span<const OpDef> softmax_ops();      // Softmax, LogSoftmax, Hardmax
std::span<const OpDef> resize_ops();       // Resize, Pad, DepthToSpace, SpaceToDepth
std::span<const OpDef> shape_ops();        // Reshape, Shape, Size, Flatten, Squeeze, ...
std::span<const OpDef> index_ops();        // Gather*, Trilu, CumSum, TopK, ArgMax, ArgMin, ...
std::span<const OpDef> reduce_ops();       // Reduce*
std::span<const OpDef> quant_ops();        // QuantizeLinear, DequantizeLinear
std::span<const OpDef> quant_linear_ops(); // MatMulInteger, ConvInteger, QLinearMatMul/Conv
std::span<const OpDef> norm_extra_ops();   // RMSNorm, GroupNorm, LpNorm, MeanVarianceNorm
std::span<const OpDef> scatter_ops();      // ScatterND, ScatterElements, NonZero
std::span<const OpDef> einsum_ops();       // Einsum
std::span<const OpDef> attention_ops();    // Attention (ONNX's, opset 23-25)
std::span<const OpDef> rotary_ops();       // RotaryEmbedding
std::span<const OpDef> control_flow_ops(); // If, Loop, Scan
std::span<const OpDef> rnn_ops();          // LSTM, GRU, RNN
std::span<const OpDef> sampling_ops();     // GridSample
std::span<const OpDef> spectral_ops();     // DFT, STFT, the windows, MelWeightMatrix
std::span<const OpDef> col2im_ops();       // Col2Im
std::span<const OpDef> deform_conv_ops();  // DeformConv
std::span<const OpDef> detection_ops();    // RoiAlign, NonMaxSuppression
std::span<const OpDef> fused_ops();        // kiln's fused layers (the optimizer's output)
std::span<const OpDef> transformer_ops();  // kiln.MultiHeadAttention, kiln.SkipLayerNorm
std::span<const OpDef> fused_norm_ops();   // kiln.FusedGroupNorm

}  // namespace kiln
