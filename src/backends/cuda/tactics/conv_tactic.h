// Convolution tactics for the CUDA backend: one small interface, one implementation per library
// path (cuDNN graph API, cuDNN legacy API, cuBLASLt GEMM for 1x1, CUTLASS INT8), each bound to one
// problem. The tuner (today: bench/kernels) enumerates candidates, times them and keeps a name.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"

typedef struct cudnnContext* cudnnHandle_t;
typedef struct cublasLtContext* cublasLtHandle_t;

#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif

namespace kiln::cuda {

// Errors are kiln's one kind of error value (include/kiln/status.h).
using Status = ::kiln::Status;

// FP16: half tensors, fp32 accumulate. TF32: float tensors, tensor cores round inputs to tf32.
// INT8: int8 x and w, int32 accumulate, then the INT8 epilogue (ConvProblem below).
enum class Precision { kFP16, kTF32, kINT8 };
const char* precision_name(Precision p);
size_t element_size(Precision p);

// Fused epilogue after the convolution: y = act(conv(x, w) + bias [+ residual]). INT8 problems
// use it too (see ConvProblem): kNone there means scale only, no bias. There is no "ReLU without
// bias": a layer without one passes a zero bias.
enum class Epilogue { kNone, kBias, kBiasRelu, kBiasAddRelu, kBiasAdd };
const char* epilogue_name(Epilogue e);
KILN_HD inline bool epilogue_has_residual(Epilogue e) {
  return e == Epilogue::kBiasAddRelu || e == Epilogue::kBiasAdd;
}
KILN_HD inline bool epilogue_has_relu(Epilogue e) {
  return e == Epilogue::kBiasRelu || e == Epilogue::kBiasAddRelu;
}

// All tensors are NHWC (activations) and KRSC (filters), densely packed.
struct ConvShape {
  int n = 1, c = 0, h = 0, w = 0;  // input
  int k = 0, r = 1, s = 1;         // filters (each over c / groups channels)
  int stride = 1, pad = 0;         // square stride and symmetric padding
  int groups = 1;                  // > 1: grouped (cuDNN's graph API only)
  KILN_HD int p() const { return (h + 2 * pad - r) / stride + 1; }
  KILN_HD int q() const { return (w + 2 * pad - s) / stride + 1; }
  KILN_HD int64_t x_elems() const { return int64_t(n) * h * w * c; }
  KILN_HD int64_t w_elems() const { return int64_t(k) * r * s * (c / groups); }
  KILN_HD int64_t y_elems() const { return int64_t(n) * p() * q() * k; }
  KILN_HD int64_t macs() const { return y_elems() * r * s * (c / groups); }
  KILN_HD bool is_1x1_s1() const { return r == 1 && s == 1 && stride == 1 && pad == 0; }
  std::string str() const;
};

// INT8 arithmetic (kiln's INT8 layer, docs/quantization.md), per output element of channel k:
//   y   = float(acc) * channel_scale[k]        acc: the exact int32 sum of int8 x * int8 w
//   y   = y + bias[k]                          when the epilogue has a bias (float32 bias)
//   y   = y + (residual_scale > 0 ? float(z) * residual_scale : float(z))
//                                              when it has a residual: int8 z, or half z
//   y   = relu(y), then min(y, relu_clip) when relu_clip > 0     when it has a ReLU
//   out = output_scale > 0 ? int8 sat(rne(y / output_scale)) : half(y)
// Tactics may reassociate the scalings (multiply by reciprocals, fold 1/output_scale into
// channel_scale, fuse into FMAs): results may differ from this order by one int8 code, or by
// rounding on half outputs. A combination a library cannot fuse is refused by supports().
// With channel_scale empty an INT8 problem is the kernel study's per-tensor path: epilogue kNone,
// out = int8 sat(rne(acc * int8_scale)), as if channel_scale were K copies of int8_scale and
// output_scale 1 (int8_epilogue() below gives that view).
// The activation of an epilogue that has one (epilogue_has_relu): ReLU (clipped where relu_clip
// > 0) on every library path; the others only in cuDNN's graph API, as its pointwise modes
// (HardSwish, which has none, as x * min(max(x + 3, 0), 6) / 6 in four of them).
enum class Activation { kRelu, kSwish, kSigmoid, kTanh, kGelu, kGeluTanh, kLeakyRelu, kHardSwish };

// A FusedConv's post steps after the activation (ops/fused.h): y = op(y, value) for the binary
// ops, op(y) for the others, in float32. cuDNN's graph API computes them in its epilogue (Pow only
// as a square); cuBLASLt's 1x1 tactic as a pass over its output (launch_post_steps). In the
// order of ops/fused.h's kPostOps, the binary ops first.
enum class PostOp {
  kAdd, kSub, kMul, kDiv, kPow, kMax, kMin, kRelu, kSigmoid, kTanh, kNeg, kAbs, kExp, kSqrt, kErf
};
struct PostStep {
  PostOp op = PostOp::kAdd;
  float value = 0.f;
};
constexpr int kMaxPostSteps = 8;

struct ConvProblem {
  ConvShape shape;
  Precision precision = Precision::kFP16;
  Epilogue epilogue = Epilogue::kBiasRelu;
  Activation act = Activation::kRelu;
  float act_alpha = 0.f;    // Swish's beta (x * sigmoid(alpha x)) or LeakyRelu's slope
  float int8_scale = 1.0f;  // INT8 per-tensor path only (channel_scale empty)
  float relu_clip = 0.f;    // > 0: the ReLU is clipped at this value (ReLU6); cuDNN graph only
  // INT8 epilogue, see above. channel_scale[k] = sx * sw[k] (float32, rounded once), K values.
  std::vector<float> channel_scale;
  float residual_scale = 0.f;  // > 0: the residual is int8 with this scale; 0: it is half
  float output_scale = 0.f;    // > 0: y is int8 with this scale; 0: y is half
  std::vector<PostStep> post;  // float epilogues only, after the activation (or the sum)
};

// The INT8 epilogue of a problem with the per-tensor path expressed in the general form.
struct Int8Epilogue {
  std::vector<float> channel_scale;  // K values
  bool bias = false, residual = false, relu = false;
  float relu_clip = 0.f;       // > 0: clipped ReLU
  float residual_scale = 0.f;  // > 0: int8 residual
  float output_scale = 1.f;    // > 0: int8 output
  bool int8_residual() const { return residual && residual_scale > 0; }
  bool int8_output() const { return output_scale > 0; }
  // All channel scales equal (a library with only a scalar alpha can take it).
  bool uniform_scale() const;
};
Int8Epilogue int8_epilogue(const ConvProblem& p);
// Whether an INT8 problem's fields are consistent (scale count, signs, clip only with ReLU).
bool int8_problem_valid(const ConvProblem& p, std::string* why);
// Element sizes of y and of the residual: the precision's, except INT8 half outputs/residuals.
size_t output_element_size(const ConvProblem& p);
// Groups 1 and no activation but ReLU: what every library path except cuDNN's graph takes.
bool plain_problem(const ConvProblem& p, std::string* why);
size_t residual_element_size(const ConvProblem& p);

// Device pointers for one execution. bias: K elements (half for FP16, float for TF32 and INT8);
// residual: same shape as y, in y's type (INT8: int8 when residual_scale > 0, else half); both
// may be null when the epilogue does not use them. INT8 tactics may keep a scaled copy of the
// bias: its contents must stay the same for as long as the pointer does (it is a constant).
struct ConvBuffers {
  const void* x = nullptr;
  const void* bias = nullptr;
  const void* residual = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Library handles shared by all tactics of one stream. Not owned.
struct LibraryHandles {
  cudnnHandle_t cudnn = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  size_t max_workspace_bytes = size_t(256) << 20;
};

// A tactic is one implementation bound to one problem. Lifetime: create (cheap), init (builds
// plans, may run library auto-tuning), prepare_weights (once, at build time), then run many times.
class ConvTactic {
 public:
  virtual ~ConvTactic() = default;
  // Stable name, e.g. "cudnn_graph.fp16.e41" or "cublaslt.fp16.h0.a66.t22.s35.k1.c-1": stored in
  // plans and timing caches.
  virtual std::string name() const = 0;
  // The library path ("cudnn_graph", "cudnn_legacy", "cublaslt", "cutlass_sm90") the tactic wraps.
  virtual std::string family() const = 0;
  virtual Status init(const ConvProblem& problem, const LibraryHandles& handles,
                      cudaStream_t stream) = 0;
  virtual size_t workspace_size() const = 0;
  // weights_krsc: device pointer to K*R*S*C elements of the problem's element type.
  virtual Status prepare_weights(const void* weights_krsc, cudaStream_t stream) = 0;
  virtual Status run(const ConvBuffers& buffers, cudaStream_t stream) = 0;
  // Anything the report should say about how init went (fallbacks, library messages).
  virtual std::string note() const { return {}; }
};

// A library path: says whether it can run a problem and, if so, makes its candidate tactics
// (one per engine configuration or algorithm the library offers). supports() is cheap and does no
// GPU work; its reason is printed when a path is skipped.
class ConvTacticSource {
 public:
  virtual ~ConvTacticSource() = default;
  virtual std::string family() const = 0;
  virtual bool supports(const ConvProblem& problem, std::string* why_not) const = 0;
  virtual std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem& problem,
                                                              const LibraryHandles& handles,
                                                              std::string* note) = 0;
};

// Every library path compiled into this build, in a fixed order.
std::vector<std::unique_ptr<ConvTacticSource>> make_conv_tactic_sources();

// Per-source knobs the tuner may set (e.g. how many cuDNN engine configs to keep).
struct TacticLimits {
  int max_cudnn_graph_configs = 12;
  int max_cudnn_rtc_configs = 3;  // runtime-compiled engines cost ~1 s each to build
  int max_cublaslt_algos = 6;
  int max_legacy_algos = 1;  // cudnnFind ranks; 1 keeps only its winner
};
void set_tactic_limits(const TacticLimits& limits);
const TacticLimits& tactic_limits();

// Library versions for timing-cache keys and reports.
std::string library_versions();

}  // namespace kiln::cuda
