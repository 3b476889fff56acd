// kiln.FusedGemm int8 = 1 on CUTLASS's Hopper INT8 GEMMs with a float16 result
// (tactics/cutlass_sm90_gemm_i8f16.cu), for transformers' projections: X int8 with its value's
// scale sx, the weights quantized per output column at configure and kept as [N, K] (K-major),
// alpha[n] = sx * sw[n], the bias, the float16 residual and an erf or tanh GELU in the epilogue.
// Y is written as float16, not requantized: what reads a projection in a transformer (attention,
// LayerNorm, the next GEMM's quantizing reformat) reads float. Base MatMul with a constant
// [K, N] weight, or Gemm without transA, alpha or beta; A's leading dims are the GEMM's M.
// Variants are the compiled tiles; at a shape where the 256 x 128 tile would not give every SM
// a tile, the layer takes the 128 x 64 one. Built only with CUTLASS.
#if KILN_HAVE_CUTLASS
#include <map>
#include <memory>

#include "device_util_host.h"
#include "layers/gemm_cutlass_common.h"
#include "ops/op.h"
#include "quant/int8.h"
#include "tactics.h"
#include "tactics/check.h"
#include "tactics/cutlass_gemm_i8f16.h"

namespace kiln::gpu {
namespace {

// The weight's extents: K (the reduction) and N (the output columns), and whether it is stored
// [N, K] already (Gemm's transB).
struct WeightShape {
  int64_t K = 0, N = 0;
  bool nk = false;
};
WeightShape weight_shape(const Node& n, const Tensor& w) {
  const bool tb = n.attrs.get_string("base", "") == "Gemm" && n.attrs.get_int("transB", 0) != 0;
  return {tb ? w.dim(1) : w.dim(0), tb ? w.dim(0) : w.dim(1), tb};
}

bool supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kINT8 || !quant::runs_int8(n) || n.op_type != "FusedGemm")
    return *why = "INT8 FusedGemm layers only (int8 = 1)", false;
  if (std::string b = quant::int8_blocker(n); !b.empty()) return *why = b, false;
  const std::string base = n.attrs.get_string("base", "");
  if (base == "Gemm") {
    if (n.attrs.get_int("transA", 0) != 0 || n.attrs.get_float("alpha", 1.f) != 1.f ||
        (n.input(2) && n.attrs.get_float("beta", 1.f) != 1.f) || d.in_type(0).rank() != 2)
      return *why = "Gemm with transA, alpha or beta", false;
  } else if (base != "MatMul") {
    return *why = "unknown base '" + base + "'", false;
  }
  const Tensor* w = d.in_const(1);
  if (!w || w->rank() != 2 || n.input(1)->quant_scales.empty())
    return *why = "the weight is not a constant 2-D matrix with INT8 scales", false;
  const WeightShape ws = weight_shape(n, *w);
  if (ws.K % 16 != 0 || ws.N % 8 != 0)
    return *why = "K must be a multiple of 16 and N of 8 (TMA's 16-byte rows)", false;
  if (d.in_type(0).rank() < 2) return *why = "A must have rank >= 2", false;
  if (d.in[0].dtype != DataType::kInt8 || d.in[0].layout != Layout::kLinear)
    return *why = "X must be int8, row-major", false;
  if (d.out.empty() || d.out[0].dtype != DataType::kFloat16 || d.out[0].layout != Layout::kLinear)
    return *why = "writes a float16 row-major Y only", false;
  cuda::F16GemmAct act;
  if (!cutlass_gemm_act(n, &act) || act == cuda::F16GemmAct::kSwish)
    return *why = "activations: none, erf or tanh GELU", false;
  if (const Tensor* b = d.in_const(2); n.input(2) && (!b || b->numel() != ws.N))
    return *why = "the bias is not a constant of N values", false;
  if (n.num_inputs() > 3 && n.input(3)) {
    if (d.in[3].dtype != DataType::kFloat16 || d.in[3].layout != Layout::kLinear)
      return *why = "the residual must be float16, row-major", false;
    if (d.in_type(3).dims != d.out_type(0).dims) return *why = "the residual broadcasts", false;
  }
  return true;
}

std::vector<std::string> variants(const LayerDesc&) { return cuda::i8f16_gemm_tiles(); }

class Int8GemmCutlassLayer final : public Layer {
 public:
  explicit Int8GemmCutlassLayer(const LayerDesc& d) : desc_(d), tile_(d.variant) {
    cutlass_gemm_act(*d.node, &act_);
    if (tile_.empty()) tile_ = cuda::i8f16_gemm_tiles()[0];
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *desc_.node;
    const Tensor& w = *desc_.in_const(1);
    const WeightShape ws = weight_shape(n, w);
    const DeviceTensor &a = in[0], &y = out[0];
    K_ = ws.K;
    N_ = ws.N;
    if (a.shape.back() != K_)
      return KILN_ERROR("{}: A {} and W {} do not chain", n.label(), shape_str(a.shape),
                        shape_str(w.shape()));
    M_ = a.numel() / K_;
    std::vector<int64_t> want(a.shape.begin(), a.shape.end() - 1);
    want.push_back(N_);
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    residual_ = in.size() > 3 && in[3].present();
    if (residual_ && in[3].shape != y.shape)
      return KILN_ERROR("{}: the residual {} must have the output's shape {}", n.label(),
                        shape_str(in[3].shape), shape_str(y.shape));
    KILN_RETURN_IF_ERROR(upload_constants(ws).with_context(n.label()));
    if (M_ > INT32_MAX || M_ == 0) return size_t{0};
    const std::string tile = cutlass_tile_at(tile_, M_, N_);
    auto& g = gemms_[tile];
    if (!g) g = cuda::make_i8f16_gemm(act_, tile);
    if (!g) return KILN_ERROR("{}: no CUTLASS INT8 tile '{}'", n.label(), tile);
    gemm_ = g.get();
    size_t bytes = 0;
    KILN_RETURN_IF_ERROR(
        gemm_->configure(static_cast<int>(M_), static_cast<int>(N_), static_cast<int>(K_), &bytes)
            .with_context(n.label()));
    return bytes;
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const Node& n = *desc_.node;
    if (M_ == 0) return Status::Ok();
    if (M_ > INT32_MAX) return KILN_ERROR("{}: more than 2^31 rows", n.label());
    const void* r = residual_ ? in[3].data : nullptr;
    const void* x = in[0].data;
    const void* y = out[0].data;
    for (const void* p : {x, r, y})
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        return KILN_ERROR("{}: CUTLASS needs 16-byte aligned tensors", n.label());
    const float* bias = has_bias_ ? static_cast<const float*>(bias_.get()) : nullptr;
    return gemm_
        ->run(in[0].data, weights_.get(), static_cast<const float*>(alpha_.get()), bias, r,
              out[0].data, rc.workspace, rc.stream, rc.pdl)
        .with_context(n.label());
  }

 private:
  // Once: the int8 weights as [N, K], alpha = sx * sw[n] and the float32 bias, on the device.
  Status upload_constants(const WeightShape& ws) {
    if (weights_.get()) return Status::Ok();
    const Node& n = *desc_.node;
    const Value* wv = n.input(1);
    const Tensor q = quant::quantize_weights(*desc_.in_const(1), wv->quant_scales,
                                             quant::weight_channel_axis(n));
    const int8_t* qp = q.data<int8_t>();
    std::vector<int8_t> nk(static_cast<size_t>(ws.N * ws.K));
    for (int64_t c = 0; c < ws.N; ++c)
      for (int64_t k = 0; k < ws.K; ++k)
        nk[static_cast<size_t>(c * ws.K + k)] = ws.nk ? qp[c * ws.K + k] : qp[k * ws.N + c];
    const float sx = n.input(0)->quant_scales[0];
    const auto& sw = wv->quant_scales;
    std::vector<float> alpha(static_cast<size_t>(ws.N));
    for (int64_t c = 0; c < ws.N; ++c)
      alpha[static_cast<size_t>(c)] = sx * sw[sw.size() == 1 ? 0 : static_cast<size_t>(c)];
    std::vector<float> bias(static_cast<size_t>(ws.N), 0.f);
    has_bias_ = n.input(2) != nullptr;
    if (has_bias_)
      for (int64_t c = 0; c < ws.N; ++c)
        bias[static_cast<size_t>(c)] = static_cast<float>(desc_.in_const(2)->at_double(c));
    const size_t fbytes = bias.size() * sizeof(float);
    KILN_RETURN_IF_ERROR(weights_.reserve(nk.size(), "INT8 weights"));
    KILN_RETURN_IF_ERROR(alpha_.reserve(fbytes, "INT8 GEMM scales"));
    KILN_RETURN_IF_ERROR(bias_.reserve(fbytes, "INT8 GEMM bias"));
    KILN_RETURN_IF_ERROR(cuda::upload(weights_.get(), nk.data(), nk.size(), "INT8 weights"));
    KILN_RETURN_IF_ERROR(cuda::upload(alpha_.get(), alpha.data(), fbytes, "INT8 GEMM scales"));
    return cuda::upload(bias_.get(), bias.data(), fbytes, "INT8 GEMM bias");
  }

  LayerDesc desc_;
  std::string tile_;
  cuda::F16GemmAct act_ = cuda::F16GemmAct::kNone;
  int64_t M_ = 0, N_ = 0, K_ = 0;
  bool residual_ = false, has_bias_ = false;
  DeviceMemory weights_, alpha_, bias_;
  std::map<std::string, std::unique_ptr<cuda::I8F16Gemm>> gemms_;  // by tile
  cuda::I8F16Gemm* gemm_ = nullptr;                                 // this shape's
};

}  // namespace

bool gemm_int8_cutlass_supports(const LayerDesc& d, std::string* why) { return supports(d, why); }
std::vector<std::string> gemm_int8_cutlass_variants(const LayerDesc& d) { return variants(d); }
Expected<std::unique_ptr<Layer>> create_gemm_int8_cutlass(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new Int8GemmCutlassLayer(d));
}

}  // namespace kiln::gpu
#endif  // KILN_HAVE_CUTLASS
