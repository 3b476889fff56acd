// cuDNN graph (backend) API: conv -> +bias -> (+residual) -> (activation) as one operation
// graph, NHWC; grouped convolutions too (the group count is C over the filter's channels). The
// activation is ReLU (clipped for ReLU6) or, in FP16/TF32, any of cuDNN's pointwise modes that
// ConvProblem::act names (Swish, Sigmoid, Tanh, GELU in both forms, leaky ReLU).
// INT8: conv (int32 accumulate, float out) -> x channel scale -> (+bias) -> (+residual) -> (ReLU)
// -> (x 1/output scale) -> int8 or half. The heuristics (mode A, then the fallback list) name
// engine configurations; each one becomes a tactic, and init() finalizes its execution plan
// (runtime-compiled engines compile here; on sm_90 they are the only INT8 engines).
#include <cudnn.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <set>
#include <utility>

#include "check.h"
#include "conv_sources.h"
#include "device_buffer.h"

namespace kiln::cuda {
namespace {

// RAII holder for one backend descriptor.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  Desc() = default;
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  Desc(Desc&& o) noexcept : d(o.d) { o.d = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d, o.d);
    return *this;
  }
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
};

Status create(cudnnBackendDescriptorType_t type, Desc* out) {
  KILN_CUDNN(cudnnBackendCreateDescriptor(type, &out->d));
  return {};
}

Status set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* value, const char* what) {
  return cudnn_status(cudnnBackendSetAttribute(d.d, name, type, count, value), what);
}

enum Uid : int64_t {
  kX = 1,
  kW = 2,
  kY = 3,
  kBias = 4,
  kResidual = 5,
  kScale = 6,     // INT8: channel scale
  kResScale = 7,  // INT8 with an int8 residual: 1 / residual scale
  kOutScale = 8,  // INT8: residual scale / output scale (each 1 when absent), when not 1
  kHsOffset = 9,  // HardSwish: 3 per channel
  kHsScale = 10,  // HardSwish: 1/6 per channel
  kPost = 20,     // post step i's scalar, per channel: kPost + i
};

struct Dims {
  int64_t dim[4];
  int64_t stride[4];
};
// Backend tensors always list dims as N, C, H, W; NHWC is expressed by the strides.
Dims nhwc(int64_t n, int64_t c, int64_t h, int64_t w) {
  return {{n, c, h, w}, {c * h * w, 1, w * c, c}};
}

Status make_tensor(int64_t uid, cudnnDataType_t type, const Dims& d, bool is_virtual, Desc* t) {
  KILN_TRY(create(CUDNN_BACKEND_TENSOR_DESCRIPTOR, t));
  const int64_t align = 16;
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type"));
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, d.dim, "tensor dims"));
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, d.stride, "tensor strides"));
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid"));
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "alignment"));
  KILN_TRY(set(*t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "virtual"));
  KILN_CUDNN(cudnnBackendFinalize(t->d));
  return {};
}

// relu_clip > 0: ReLU's upper clip; alpha: leaky ReLU's slope (RELU_FWD) or Swish's beta.
Status make_pointwise(cudnnPointwiseMode_t mode, const Desc& x, const Desc* b, const Desc& y,
                      Desc* pw, Desc* op, double relu_clip = 0, double alpha = 0) {
  KILN_TRY(create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, pw));
  const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  KILN_TRY(set(*pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pw mode"));
  KILN_TRY(set(*pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pw prec"));
  if (relu_clip > 0) {
    KILN_TRY(set(*pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &relu_clip,
                 "pw relu clip"));
  }
  if (mode == CUDNN_POINTWISE_RELU_FWD && alpha != 0) {
    KILN_TRY(set(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE, CUDNN_TYPE_DOUBLE, 1, &alpha,
                 "pw leaky slope"));
  }
  if (mode == CUDNN_POINTWISE_SWISH_FWD) {
    KILN_TRY(set(*pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &alpha, "pw beta"));
  }
  KILN_CUDNN(cudnnBackendFinalize(pw->d));
  KILN_TRY(create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op));
  KILN_TRY(set(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &pw->d, "pw desc"));
  KILN_TRY(set(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x.d,
               "pw x"));
  if (b) {
    KILN_TRY(set(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d,
                 "pw b"));
  }
  KILN_TRY(set(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y.d,
               "pw y"));
  KILN_CUDNN(cudnnBackendFinalize(op->d));
  return {};
}

// The operation graph of one problem, shared by all engine configurations tried on it.
struct OpGraph {
  std::deque<Desc> keep;  // tensors, pointwise descriptors and ops the graph refers to
  Desc graph;
  // INT8: the [1,K,1,1] float scale tensors the graph multiplies by (uid, device values).
  std::vector<std::pair<int64_t, DeviceBuffer>> scales;
};

// One pointwise step of the epilogue chain: mode, uid of operand B (0: none), B's element type
// and whether B is per channel ([1,K,1,1]) or a full output-shaped tensor (the residual). With
// b_step >= 0, B is instead the output of that earlier step (HardSwish multiplies by its input).
struct Step {
  cudnnPointwiseMode_t mode;
  int64_t uid;
  cudnnDataType_t b_type;
  bool per_channel;
  double relu_clip;
  double alpha = 0;  // make_pointwise's
  int b_step = -1;
};

// The activation step of a float epilogue.
Step activation_step(const ConvProblem& p, cudnnDataType_t io) {
  switch (p.act) {
    case Activation::kSwish:
      return {CUDNN_POINTWISE_SWISH_FWD, 0, io, true, 0.0, p.act_alpha};
    case Activation::kSigmoid:
      return {CUDNN_POINTWISE_SIGMOID_FWD, 0, io, true, 0.0};
    case Activation::kTanh:
      return {CUDNN_POINTWISE_TANH_FWD, 0, io, true, 0.0};
    case Activation::kGelu:
      return {CUDNN_POINTWISE_GELU_FWD, 0, io, true, 0.0};
    case Activation::kGeluTanh:
      return {CUDNN_POINTWISE_GELU_APPROX_TANH_FWD, 0, io, true, 0.0};
    case Activation::kLeakyRelu:
      return {CUDNN_POINTWISE_RELU_FWD, 0, io, true, 0.0, p.act_alpha};
    case Activation::kRelu:
    case Activation::kHardSwish:  // not one mode: hard_swish_steps
      break;
  }
  return {CUDNN_POINTWISE_RELU_FWD, 0, io, true, double(p.relu_clip)};
}

Status upload_scale(OpGraph* g, int64_t uid, const std::vector<float>& v) {
  DeviceBuffer b;
  if (!b.allocate(v.size() * sizeof(float))) return Status::Error("scale allocation failed");
  KILN_TRY(upload(b.get(), v.data(), v.size() * sizeof(float), "cuDNN graph scale upload"));
  g->scales.emplace_back(uid, std::move(b));
  return {};
}

// HardSwish after the chain's last step (its output h): y = min(max(h + 3, 0), 6) * h * (1/6),
// the constants as [1,K,1,1] float tensors (cuDNN's pointwise B operands).
Status hard_swish_steps(const ConvProblem& p, OpGraph* g, std::vector<Step>* chain) {
  const int h = int(chain->size()) - 1;
  const size_t k = size_t(p.shape.k);
  chain->push_back({CUDNN_POINTWISE_ADD, kHsOffset, CUDNN_DATA_FLOAT, true, 0.0});
  KILN_TRY(upload_scale(g, kHsOffset, std::vector<float>(k, 3.f)));
  chain->push_back({CUDNN_POINTWISE_RELU_FWD, 0, CUDNN_DATA_FLOAT, true, 6.0});
  chain->push_back({CUDNN_POINTWISE_MUL, 0, CUDNN_DATA_FLOAT, true, 0.0, 0.0, h});
  chain->push_back({CUDNN_POINTWISE_MUL, kHsScale, CUDNN_DATA_FLOAT, true, 0.0});
  return upload_scale(g, kHsScale, std::vector<float>(k, 1.f / 6.f));
}

// A FusedConv's post steps after the chain so far (ConvProblem::post): a binary step's scalar as
// a [1,K,1,1] float tensor, a square as the previous output times itself.
Status post_steps(const ConvProblem& p, OpGraph* g, std::vector<Step>* chain) {
  static constexpr std::pair<PostOp, cudnnPointwiseMode_t> kModes[] = {
      {PostOp::kAdd, CUDNN_POINTWISE_ADD},         {PostOp::kSub, CUDNN_POINTWISE_SUB},
      {PostOp::kMul, CUDNN_POINTWISE_MUL},         {PostOp::kDiv, CUDNN_POINTWISE_DIV},
      {PostOp::kMax, CUDNN_POINTWISE_MAX},         {PostOp::kMin, CUDNN_POINTWISE_MIN},
      {PostOp::kRelu, CUDNN_POINTWISE_RELU_FWD},   {PostOp::kSigmoid, CUDNN_POINTWISE_SIGMOID_FWD},
      {PostOp::kTanh, CUDNN_POINTWISE_TANH_FWD},   {PostOp::kNeg, CUDNN_POINTWISE_NEG},
      {PostOp::kAbs, CUDNN_POINTWISE_ABS},         {PostOp::kExp, CUDNN_POINTWISE_EXP},
      {PostOp::kSqrt, CUDNN_POINTWISE_SQRT},       {PostOp::kErf, CUDNN_POINTWISE_ERF}};
  for (size_t i = 0; i < p.post.size(); ++i) {
    const PostStep& s = p.post[i];
    if (s.op == PostOp::kPow) {  // only a square (post_supported)
      const int prev = int(chain->size()) - 1;
      chain->push_back({CUDNN_POINTWISE_MUL, 0, CUDNN_DATA_FLOAT, true, 0.0, 0.0, prev});
      continue;
    }
    const auto* m = std::find_if(std::begin(kModes), std::end(kModes),
                                 [&](const auto& e) { return e.first == s.op; });
    if (m == std::end(kModes)) return Status::Error("a post step cuDNN has no mode for");
    const bool binary = s.op == PostOp::kAdd || s.op == PostOp::kSub || s.op == PostOp::kMul ||
                        s.op == PostOp::kDiv || s.op == PostOp::kMax || s.op == PostOp::kMin;
    if (!binary) {
      chain->push_back({m->second, 0, CUDNN_DATA_FLOAT, true, 0.0});
      continue;
    }
    const int64_t uid = kPost + int64_t(i);
    chain->push_back({m->second, uid, CUDNN_DATA_FLOAT, true, 0.0});
    KILN_TRY(upload_scale(g, uid, std::vector<float>(size_t(p.shape.k), s.value)));
  }
  return {};
}

// The INT8 chain. An int8 residual z enters as (y / sz + z) * sz: the chain's operands are
// plain tensors (no scaled-residual branch, which the fusion engines may not take), the bias
// stays the caller's, and the ReLU clip and final scale absorb sz. Scales uploaded here.
Status int8_chain(const ConvProblem& p, OpGraph* g, std::vector<Step>* chain) {
  const Int8Epilogue e = int8_epilogue(p);
  const size_t k = e.channel_scale.size();
  const float r = e.int8_residual() ? e.residual_scale : 1.f;
  chain->push_back({CUDNN_POINTWISE_MUL, kScale, CUDNN_DATA_FLOAT, true, 0.0});
  KILN_TRY(upload_scale(g, kScale, e.channel_scale));
  if (e.bias) chain->push_back({CUDNN_POINTWISE_ADD, kBias, CUDNN_DATA_FLOAT, true, 0.0});
  if (e.residual) {
    if (e.int8_residual()) {
      chain->push_back({CUDNN_POINTWISE_MUL, kResScale, CUDNN_DATA_FLOAT, true, 0.0});
      KILN_TRY(upload_scale(g, kResScale, std::vector<float>(k, 1.f / r)));
    }
    const cudnnDataType_t z = e.int8_residual() ? CUDNN_DATA_INT8 : CUDNN_DATA_HALF;
    chain->push_back({CUDNN_POINTWISE_ADD, kResidual, z, false, 0.0});
  }
  if (e.relu) {
    const double clip = e.relu_clip > 0 ? double(e.relu_clip / r) : 0.0;
    chain->push_back({CUDNN_POINTWISE_RELU_FWD, 0, CUDNN_DATA_FLOAT, true, clip});
  }
  const float out = e.int8_output() ? r / e.output_scale : r;
  if (out != 1.f) {
    chain->push_back({CUDNN_POINTWISE_MUL, kOutScale, CUDNN_DATA_FLOAT, true, 0.0});
    KILN_TRY(upload_scale(g, kOutScale, std::vector<float>(k, out)));
  }
  return {};
}

Status build_graph(const ConvProblem& p, cudnnHandle_t handle, OpGraph* g) {
  const ConvShape& s = p.shape;
  const bool int8 = p.precision == Precision::kINT8;
  const cudnnDataType_t io = p.precision == Precision::kFP16   ? CUDNN_DATA_HALF
                             : p.precision == Precision::kTF32 ? CUDNN_DATA_FLOAT
                                                               : CUDNN_DATA_INT8;
  const cudnnDataType_t comp = int8 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT;
  const cudnnDataType_t y_type = int8 && output_element_size(p) == 2 ? CUDNN_DATA_HALF : io;
  auto add = [&](Desc&& d) -> const Desc& {
    g->keep.push_back(std::move(d));
    return g->keep.back();
  };
  Desc x, w, y, conv_out;
  KILN_TRY(make_tensor(kX, io, nhwc(s.n, s.c, s.h, s.w), false, &x));
  KILN_TRY(make_tensor(kW, io, nhwc(s.k, s.c / s.groups, s.r, s.s), false, &w));
  KILN_TRY(make_tensor(kY, y_type, nhwc(s.n, s.k, s.p(), s.q()), false, &y));
  const Desc& xd = add(std::move(x));
  const Desc& wd = add(std::move(w));
  const Desc& yd = add(std::move(y));

  Desc conv;
  KILN_TRY(create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &conv));
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dims = 2, one[2] = {1, 1}, stride[2] = {s.stride, s.stride},
                pad[2] = {s.pad, s.pad};
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "comp"));
  KILN_TRY(
      set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "mode"));
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims, "dims"));
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one, "dil"));
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride, "str"));
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "pre"));
  KILN_TRY(set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad, "post"));
  KILN_CUDNN(cudnnBackendFinalize(conv.d));
  const Desc& convd = add(std::move(conv));

  const bool fused = p.epilogue != Epilogue::kNone || int8;
  const Desc* conv_y = &yd;
  if (fused) {
    KILN_TRY(make_tensor(100, CUDNN_DATA_FLOAT, nhwc(s.n, s.k, s.p(), s.q()), true, &conv_out));
    conv_y = &add(std::move(conv_out));
  }
  Desc conv_op;
  KILN_TRY(create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &conv_op));
  const float alpha = 1.f, beta = 0.f;
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               1, &xd.d, "op x"));
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               1, &wd.d, "op w"));
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               1, &conv_y->d, "op y"));
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &convd.d, "op conv"));
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha,
               "alpha"));
  KILN_TRY(set(conv_op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta,
               "beta"));
  KILN_CUDNN(cudnnBackendFinalize(conv_op.d));
  std::vector<cudnnBackendDescriptor_t> ops = {add(std::move(conv_op)).d};

  // Chain the epilogue: each pointwise op writes a virtual float tensor, the last writes y.
  std::vector<Step> chain;
  if (int8) {
    KILN_TRY(int8_chain(p, g, &chain));
  } else {
    chain.push_back({CUDNN_POINTWISE_ADD, kBias, io, true, 0.0});
    if (epilogue_has_residual(p.epilogue)) {
      chain.push_back({CUDNN_POINTWISE_ADD, kResidual, io, false, 0.0});
    }
    if (epilogue_has_relu(p.epilogue) && p.act == Activation::kHardSwish)
      KILN_TRY(hard_swish_steps(p, g, &chain));
    else if (epilogue_has_relu(p.epilogue))
      chain.push_back(activation_step(p, io));
    KILN_TRY(post_steps(p, g, &chain));
  }
  const Desc* cur = conv_y;
  std::vector<const Desc*> step_out;  // each step's output, for a later step's b_step
  for (size_t i = 0; fused && i < chain.size(); ++i) {
    const bool last = i + 1 == chain.size();
    const Desc* b = nullptr;
    if (chain[i].b_step >= 0) {
      b = step_out[size_t(chain[i].b_step)];
    } else if (chain[i].uid != 0) {
      Desc bt;
      const Dims d = chain[i].per_channel ? nhwc(1, s.k, 1, 1) : nhwc(s.n, s.k, s.p(), s.q());
      KILN_TRY(make_tensor(chain[i].uid, chain[i].b_type, d, false, &bt));
      b = &add(std::move(bt));
    }
    const Desc* out = &yd;
    if (!last) {
      Desc v;
      KILN_TRY(
          make_tensor(101 + int64_t(i), CUDNN_DATA_FLOAT, nhwc(s.n, s.k, s.p(), s.q()), true, &v));
      out = &add(std::move(v));
    }
    Desc pw, op;
    KILN_TRY(
        make_pointwise(chain[i].mode, *cur, b, *out, &pw, &op, chain[i].relu_clip, chain[i].alpha));
    add(std::move(pw));
    ops.push_back(add(std::move(op)).d);
    cur = out;
    step_out.push_back(out);
  }

  KILN_TRY(create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &g->graph));
  KILN_TRY(set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
               "graph handle"));
  KILN_TRY(set(g->graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
               int64_t(ops.size()), ops.data(), "graph ops"));
  KILN_CUDNN(cudnnBackendFinalize(g->graph.d));
  return {};
}

// Engine configurations the heuristics propose in one mode.
Status heuristic_configs(const OpGraph& g, cudnnBackendHeurMode_t mode, std::vector<Desc>* out) {
  Desc heur;
  KILN_TRY(create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur));
  KILN_TRY(set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
               &g.graph.d, "heur graph"));
  KILN_TRY(set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heur mode"));
  KILN_CUDNN(cudnnBackendFinalize(heur.d));
  int64_t count = 0;
  KILN_CUDNN(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<Desc> cfgs(size_t(std::max<int64_t>(count, 0)));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& c : cfgs) {
    KILN_TRY(create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &c));
    raw.push_back(c.d);
  }
  int64_t got = 0;
  if (count > 0) {
    KILN_CUDNN(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  }
  cfgs.resize(size_t(std::min(got, count)));
  for (auto& c : cfgs) out->push_back(std::move(c));
  return {};
}

// What an engine's numerical notes say about its arithmetic.
struct Numerics {
  bool tensor_core = false;
  bool down_converts = false;      // converts float32 inputs to a 16-bit type before the math
  bool reduced_reduction = false;  // accumulates in less than float32
  bool transformed = false;        // FFT or Winograd: multiplies transformed values
};

// "e<global index>[.rtc][.k<knob>=<value>...]", and whether the engine compiles at run time.
std::string config_name(const Desc& cfg, bool* runtime_compiled, Numerics* numerics) {
  *runtime_compiled = false;
  *numerics = {};
  Desc engine;
  if (!create(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine).ok()) return "e?";
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg.d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &engine.d) != CUDNN_STATUS_SUCCESS) {
    return "e?";
  }
  int64_t index = -1;
  cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                           &index);
  std::string name = "e";
  name += std::to_string(index);
  cudnnBackendBehaviorNote_t behavior[8];
  if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               8, &n, behavior) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, 8); ++i) {
      if (behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) *runtime_compiled = true;
    }
  }
  cudnnBackendNumericalNote_t notes[16];
  if (cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                               CUDNN_TYPE_NUMERICAL_NOTE, 16, &n, notes) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) {
      if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) numerics->tensor_core = true;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) numerics->down_converts = true;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)
        numerics->reduced_reduction = true;
      if (notes[i] == CUDNN_NUMERICAL_NOTE_FFT || notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD ||
          notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4 ||
          notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6 ||
          notes[i] == CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13)
        numerics->transformed = true;
    }
  }
  if (*runtime_compiled) name += ".rtc";
  int64_t knob_count = 0;
  cudnnBackendGetAttribute(cfg.d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                           0, &knob_count, nullptr);
  std::vector<Desc> knobs(size_t(std::max<int64_t>(knob_count, 0)));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& k : knobs) {
    if (!create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &k).ok()) return name;
    raw.push_back(k.d);
  }
  if (knob_count > 0 && cudnnBackendGetAttribute(cfg.d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, knob_count, &n,
                                                 raw.data()) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min(n, knob_count); ++i) {
      cudnnBackendKnobType_t type;
      int64_t value = 0, m = 0;
      cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                               CUDNN_TYPE_KNOB_TYPE, 1, &m, &type);
      cudnnBackendGetAttribute(raw[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64,
                               1, &m, &value);
      name += ".k" + std::to_string(int(type)) + "=" + std::to_string(value);
    }
  }
  return name;
}

class CudnnGraphConvTactic final : public ConvTactic {
 public:
  CudnnGraphConvTactic(std::shared_ptr<OpGraph> graph, Desc cfg, std::string name)
      : graph_(std::move(graph)), cfg_(std::move(cfg)), name_(std::move(name)) {}

  std::string name() const override { return name_; }
  std::string family() const override { return "cudnn_graph"; }

  Status init(const ConvProblem& p, const LibraryHandles& h, cudaStream_t stream) override {
    problem_ = p;
    handle_ = h.cudnn;
    if (p.precision == Precision::kINT8) {
      const Int8Epilogue e = int8_epilogue(p);
      int8_bias_ = e.bias;
      int8_residual_ = e.residual;
    }
    KILN_CUDNN(cudnnSetStream(handle_, stream));
    KILN_TRY(create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan_));
    // Deprecated in newer cuDNN (the handle comes from the graph); harmless where accepted.
    cudnnBackendSetAttribute(plan_.d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                             &handle_);
    KILN_TRY(set(plan_, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &cfg_.d, "plan cfg"));
    KILN_CUDNN(cudnnBackendFinalize(plan_.d));
    int64_t n = 0, ws = 0;
    KILN_CUDNN(cudnnBackendGetAttribute(plan_.d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                        CUDNN_TYPE_INT64, 1, &n, &ws));
    if (size_t(ws) > h.max_workspace_bytes) {
      return Status::Error("workspace " + std::to_string(ws) + " B over the limit");
    }
    workspace_ = size_t(ws);
    return {};
  }

  size_t workspace_size() const override { return workspace_; }

  Status prepare_weights(const void* w, cudaStream_t stream) override {
    return copy_weights_krsc(weights_, problem_, w, stream);
  }

  Status run(const ConvBuffers& b, cudaStream_t stream) override {
    KILN_CUDNN(cudnnSetStream(handle_, stream));
    std::vector<int64_t> uids = {kX, kW, kY};
    std::vector<void*> ptrs = {const_cast<void*>(b.x), weights_.get(), b.y};
    for (const auto& [uid, buf] : graph_->scales) {  // INT8's scales, HardSwish's and post steps' constants
      uids.push_back(uid);
      ptrs.push_back(buf.get());
    }
    if (problem_.precision == Precision::kINT8) {
      if (int8_bias_) {
        uids.push_back(kBias);
        ptrs.push_back(const_cast<void*>(b.bias));
      }
      if (int8_residual_) {
        uids.push_back(kResidual);
        ptrs.push_back(const_cast<void*>(b.residual));
      }
    } else if (problem_.epilogue != Epilogue::kNone) {
      uids.push_back(kBias);
      ptrs.push_back(const_cast<void*>(b.bias));
      if (epilogue_has_residual(problem_.epilogue)) {
        uids.push_back(kResidual);
        ptrs.push_back(const_cast<void*>(b.residual));
      }
    }
    // Rebuilding the variant pack costs host time that would show at batch 1: reuse it while
    // the pointers stay the same.
    if (!pack_.d || ptrs != pack_ptrs_ || b.workspace != pack_ws_) {
      Desc pack;
      KILN_TRY(create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
      KILN_TRY(set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()),
                   uids.data(), "pack uids"));
      KILN_TRY(set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                   int64_t(ptrs.size()), ptrs.data(), "pack ptrs"));
      void* ws = b.workspace;
      KILN_TRY(set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws, "ws"));
      KILN_CUDNN(cudnnBackendFinalize(pack.d));
      pack_ = std::move(pack);
      pack_ptrs_ = ptrs;
      pack_ws_ = b.workspace;
    }
    KILN_CUDNN(cudnnBackendExecute(handle_, plan_.d, pack_.d));
    return {};
  }

 private:
  std::shared_ptr<OpGraph> graph_;
  Desc cfg_;
  std::string name_;
  ConvProblem problem_;
  bool int8_bias_ = false, int8_residual_ = false;
  cudnnHandle_t handle_ = nullptr;
  Desc plan_;
  size_t workspace_ = 0;
  DeviceBuffer weights_;
  Desc pack_;
  std::vector<void*> pack_ptrs_;
  void* pack_ws_ = nullptr;
};

class CudnnGraphSource final : public ConvTacticSource {
 public:
  std::string family() const override { return "cudnn_graph"; }

  bool supports(const ConvProblem& p, std::string* why) const override {
    if (p.precision == Precision::kINT8 && !plain_problem(p, why)) return false;
    const ConvShape& s = p.shape;
    if (s.groups < 1 || s.c % s.groups != 0 || s.k % s.groups != 0)
      return *why = "channels not divisible by the group count", false;
    if (s.groups > 1 && s.groups == s.c)
      return *why = "depthwise (kiln.dwconv and cudnn.conv take it)", false;
    if (p.precision == Precision::kINT8 && p.shape.c % 4 != 0) {
      *why = "INT8 needs C % 4 == 0";
      return false;
    }
    return int8_problem_valid(p, why);
  }

  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem& p, const LibraryHandles& h,
                                                      std::string* note) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    auto graph = std::make_shared<OpGraph>();
    Status s = build_graph(p, h.cudnn, graph.get());
    if (!s.ok()) {
      *note = "operation graph: " + s.message();
      return out;
    }
    std::vector<Desc> cfgs;
    Status a = heuristic_configs(*graph, CUDNN_HEUR_MODE_A, &cfgs);
    Status f = heuristic_configs(*graph, CUDNN_HEUR_MODE_FALLBACK, &cfgs);
    if (!a.ok()) *note += "heuristics A: " + a.message() + "; ";
    if (!f.ok()) *note += "fallback: " + f.message() + "; ";
    const char* prec = precision_name(p.precision);
    std::set<std::string> seen;
    int runtime_compiled = 0, lossy = 0;
    for (auto& cfg : cfgs) {
      bool rtc = false;
      Numerics num;
      const std::string name =
          std::string("cudnn_graph.") + prec + "." + config_name(cfg, &rtc, &num);
      if (!seen.insert(name).second) continue;
      // TF32 promises float32 storage with TF32 products: an engine that converts float32
      // inputs to half (it overflows on large activations), reduces in less than float32, or
      // rounds FFT/Winograd-transformed values to TF32 (the transform amplifies the rounding) is
      // not a TF32 candidate. (FP16 engines are left as they were; their accuracy is checked
      // against the 1e-2 bound by bench/device_check.sh models.)
      if (p.precision == Precision::kTF32 &&
          (num.down_converts || num.reduced_reduction || num.transformed)) {
        ++lossy;
        continue;
      }
      if (int(out.size()) >= tactic_limits().max_cudnn_graph_configs) {
        *note += "kept the first " + std::to_string(out.size()) + " of " +
                 std::to_string(cfgs.size()) + " configs; ";
        break;
      }
      if (rtc && ++runtime_compiled > tactic_limits().max_cudnn_rtc_configs) continue;
      out.push_back(std::make_unique<CudnnGraphConvTactic>(graph, std::move(cfg), name));
    }
    if (lossy) *note += std::to_string(lossy) + " lossy engine configs skipped; ";
    if (cfgs.empty()) *note += "heuristics returned no engine config; ";
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cudnn_graph_source() {
  return std::make_unique<CudnnGraphSource>();
}

}  // namespace kiln::cuda
