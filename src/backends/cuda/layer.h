// The CUDA backend's extension point: a layer implementation ("tactic") runs one node of the
// optimized graph on the GPU. Adding a kernel is one file in layers/ (the kernel and its Layer
// class side by side) plus one line in tactic_table.cpp.
//
// Life of a tactic:
//   build:   lower.cpp asks every TacticDef of the node's op whether it supports() the node at
//            the chosen formats, the tuner times the candidates (variants()) at the profile's opt
//            shape, and the engine stores the winner's name and variant.
//   load:    create() makes the Layer once per execution context.
//   shapes:  configure() runs whenever the input shapes change (never per inference), with
//            concrete shapes; it returns the scratch it needs and may build library plans.
//   run:     run() enqueues work on rc.stream. It must not synchronize, allocate or return
//            before its kernels are enqueued; it may be captured into a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"
#include "kiln/tensor.h"

typedef struct cudnnContext* cudnnHandle_t;
typedef struct cublasLtContext* cublasLtHandle_t;
typedef struct cublasContext* cublasHandle_t;

namespace kiln::gpu {

// How a tensor is laid out in device memory. kLinear is ONNX's row-major order. kNHWC stores a
// 4-D tensor whose logical (ONNX) shape is [N,C,H,W] as N,H,W,C (channels last).
enum class Layout : uint8_t { kLinear = 0, kNHWC = 1 };
const char* layout_name(Layout l);
// Whether a tensor of type t holds the same bytes in both layouts, for every shape its dims
// allow: 4-D with one channel, or with H = W = 1 (a per-channel term [N, C, 1, 1], a
// squeeze-excitation gate). Its reformat between layouts only relabels memory.
bool layouts_share_bytes(const TensorType& t);

// The storage format of one tensor on the device.
struct TensorFormat {
  DataType dtype = DataType::kUndefined;  // kUndefined: absent optional input/output
  Layout layout = Layout::kLinear;
  bool present() const { return dtype != DataType::kUndefined; }
  bool operator==(const TensorFormat&) const = default;
  std::string str() const;  // "float16/nhwc"
};

// One tensor as a layer sees it at configure and run time.
struct DeviceTensor {
  void* data = nullptr;           // device memory; nullptr for an absent optional tensor
  const Tensor* host = nullptr;   // the value on the host when known before running (constants,
                                  // values computed from shapes), else nullptr
  DataType dtype = DataType::kUndefined;  // storage type on the device
  Layout layout = Layout::kLinear;
  std::vector<int64_t> shape;     // logical ONNX shape (NCHW order even when layout is kNHWC)
  bool present() const { return dtype != DataType::kUndefined; }
  int64_t numel() const;
  size_t nbytes() const;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
};

// What a layer may use while it configures and runs. Owned by the execution context (one per
// context, so contexts on different threads share nothing).
struct RunContext {
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* workspace = nullptr;      // scratch for the running layer: at least what configure() asked
  size_t workspace_bytes = 0;
  size_t workspace_limit = size_t(1) << 30;  // --mem-pool-size workspace:N (configure must fit)
  // Programmatic dependent launch (kernels/pdl.cuh): launch this layer's kernels so that they
  // may start while the kernel before them finishes. The executor and the tuner set it for a
  // layer that follows a Layer::programmatic() one, where the GPU has it (sm_90+) and KILN_PDL
  // is not 0; only kernels that keep pdl.cuh's rule read it.
  bool pdl = false;
  // For a kDataDependent layer: where its kernels write each output's actual dims (output o's at
  // out_dims[kMaxDynRank * o], as many as its rank), in host memory mapped into the device, which
  // the executor reads once the stream has reached the layer. nullptr for other layers.
  int64_t* out_dims = nullptr;
};
inline constexpr int kMaxDynRank = 8;

// Whether the current device runs programmatic dependent launch and KILN_PDL is not "0".
bool pdl_available();

// Math precision of a layer: the type float tensors are stored in, and for matrix products
// whether tensor cores may round float32 inputs to TF32. kINT8: a layer marked int8 = 1
// (docs/quantization.md) computing on int8 tensors with int32 accumulation; its X (and residual
// and Y when their values carry a scale) are stored int8, its other float tensors in float.
enum class Precision : uint8_t { kFP32 = 0, kTF32 = 1, kFP16 = 2, kINT8 = 3 };
const char* precision_name(Precision p);

// The node a layer implements, with the formats chosen for its inputs and outputs.
struct LayerDesc {
  const Node* node = nullptr;
  std::vector<TensorFormat> in, out;  // per input/output slot
  Precision precision = Precision::kTF32;
  std::string variant;                // tactic-specific parameters (e.g. a cuDNN engine config)
  bool tuning = false;                // made by the tuner, to be timed at the profile's opt shape
  // Build-time types of the node's inputs/outputs (dims may be symbolic).
  const TensorType& in_type(size_t i) const;
  const TensorType& out_type(size_t i) const;
  // The input's value when it is a constant of the engine, else nullptr.
  const Tensor* in_const(size_t i) const;
};

class Layer {
 public:
  virtual ~Layer() = default;
  // Concrete shapes are known (also of host values, in[i].host). Returns the workspace bytes the
  // layer needs for these shapes (at most rc.workspace_limit). Data pointers are not yet valid.
  virtual Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                                     std::span<const DeviceTensor> out) {
    return size_t{0};
  }
  virtual Status run(const RunContext& rc, std::span<const DeviceTensor> in,
                     std::span<const DeviceTensor> out) = 0;
  // True when run() launches its kernels through launch_kernel() (kernels/pdl.cuh), each keeping
  // its rule and calling pdl_launch_dependents(): the next layer's kernels then get rc.pdl. After
  // a kernel that does not trigger (a library's), a programmatic launch gains nothing and costs
  // a little, so the executor launches those plainly.
  virtual bool programmatic() const { return false; }
};

// Format capabilities of a tactic (bit flags).
enum FormatCaps : uint32_t {
  kF32 = 1u << 0,           // float tensors stored as float32
  kF16 = 1u << 1,           // float tensors stored as float16
  kNHWC = 1u << 2,          // 4-D activations may be NHWC (the layer reads DeviceTensor::layout)
  kAnyLayout = 1u << 3,     // layout-agnostic when every 4-D input has the output's shape
  kF64 = 1u << 4,           // float64 tensors (always stored as themselves)
  kI8 = 1u << 5,            // INT8 layers: float values stored as int8 codes (value = q * scale,
                            // the scale on the Value); the layer's float tensors still need
                            // kF32/kF16
  kFallback = 1u << 6,      // runs what no faster tactic takes (e.g. a fused layer at a precision
                            // its fast kernel lacks), never by itself a reason for the optimizer
                            // to make the layer (the capability query skips it)
  kQuantOut = 1u << 7,      // a float layer that writes output 0 as the int8 codes of its value's
                            // scale (sat(rne(y / s)), as the quantizing kiln.Reformat would): its
                            // candidates store that output int8, and exist only where the value
                            // has a scale, so it can feed an INT8 chain without a reformat
  kReassociated = 1u << 8,  // an INT8 tactic whose epilogue is reassociated as TensorRT and the
                            // INT8 libraries compute it (1/sy folded into the channel scale, fused
                            // multiply-adds): within one code of the CPU reference, not its exact
                            // codes (test-backend-ops holds it to the libraries' bound)
  kRawIn0 = 1u << 9,        // input 0 is read as the model stores it (its own float type,
                            // row-major) whatever the layer's precision and layout: a stem that
                            // reads float32 NCHW images itself, with no reformat ahead of it
  kF32Out = 1u << 11,       // an FP16 layer that can write output 0 as float32 where it is a graph
                            // output of that type: its extra candidate saves the reformat after
                            // it (a language model's logits)
  kQuantIn0 = 1u << 10,     // a float layer that reads input 0 as the int8 codes of its value's
                            // scale (kQuantOut's mirror): candidates exist only where the value
                            // has a scale, so an INT8 chain's last tensor needs no dequantizing
                            // reformat ahead of it
  kLayoutSwap = 1u << 12,   // an alias tactic of a Transpose between channels-first and
                            // channels-last (perm 0,2,3,1 or 0,3,1,2): its candidate stores the
                            // channels-first side NHWC and the other row-major, so both hold the
                            // same bytes and the layer relabels memory (lower.cpp)
  kPostSteps = 1u << 13,    // takes a kiln.FusedConv's post steps (post_ops, ops/fused.h); a
                            // tactic without it is not offered a layer that has them
  kDataDependent = 1u << 14,  // output sizes depend on the data (NonZero, NonMaxSuppression):
                              // configured and given memory at the op's bound (OpDef::bound), the
                              // layer writes the actual dims to RunContext::out_dims and its
                              // outputs row-major at those dims; the executor reads them back
};

using SupportsFn = bool (*)(const LayerDesc&, std::string* why_not);
using CreateFn = Expected<std::unique_ptr<Layer>> (*)(const LayerDesc&);
using VariantsFn = std::vector<std::string> (*)(const LayerDesc&);

struct TacticDef {
  std::string_view domain;     // "" for ai.onnx, "kiln" for fused layers
  std::string_view op_type;
  std::string_view name;       // stable id stored in engines and timing caches
  uint32_t caps = kF32;        // FormatCaps
  uint32_t host_inputs = 0;    // bit i: input i is read on the host (shape, axes, pads, ...) and
                               // must be known before running; it is not uploaded
  SupportsFn supports = nullptr;  // finer checks (types, attributes, ranks); nullptr: always
  CreateFn create = nullptr;
  VariantsFn variants = nullptr;  // candidates the tuner times; nullptr: one, variant ""
  int alias_input = -1;        // output 0 may be input k's memory (Reshape family): no kernel
};

// Whether tactic t takes layer d: t's supports() check, and a FusedConv's post steps only where t
// declares kPostSteps (another would drop them). Every place that offers a layer to a tactic asks
// this, not supports() alone.
bool tactic_supports(const TacticDef& t, const LayerDesc& d, std::string* why);

// The one table of GPU tactics (tactic_table.cpp), and the lookups built on it.
std::span<const TacticDef> all_tactics();
std::vector<const TacticDef*> tactics_for(std::string_view domain, std::string_view op_type);
const TacticDef* find_tactic(std::string_view name);

// Gated tactics take part only where KILN_UNVERIFIED_TACTICS=1: kernels written but not yet run
// on a GPU (the GPU session that first runs test-backend-ops on them removes the gate), and
// kernels whose mere support changes the graph (a fusion) before the tuner could see that they
// are slower. Their supports() asks this first with the reason, so no engine picks them by default.
bool unverified_tactics_enabled(std::string* why, const char* reason = "not yet run on a GPU");

// KILN_POISON_WORKSPACE=1 (test-backend-ops sets it): the executors fill the workspace with
// 0xA5 bytes before each layer runs, so a layer that counts on what it (or another layer) left
// there in an earlier run fails its tests instead of a model's second inference. Read once.
bool poison_workspace();

// Ops whose nodes run on the host when shapes are set (Shape, Size), whatever their inputs.
bool is_shape_op(std::string_view domain, std::string_view op_type);

// A Status from a CUDA runtime call; names the call.
Status cuda_check(cudaError_t e, const char* what);

}  // namespace kiln::gpu

#define KILN_CUDA_CHECK(call) KILN_RETURN_IF_ERROR(::kiln::gpu::cuda_check((call), #call))
// After a kernel launch: a launch error (bad configuration) becomes a Status.
#define KILN_CUDA_LAUNCH_CHECK(what) \
  KILN_RETURN_IF_ERROR(::kiln::gpu::cuda_check(cudaGetLastError(), what))
