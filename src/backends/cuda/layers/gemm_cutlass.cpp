// kiln.FusedGemm in FP16 on CUTLASS's Hopper GEMMs (tactics/cutlass_sm90_gemm_f16.cu): the bias,
// the residual and an erf or tanh GELU in the GEMM's epilogue, so a BERT or ViT FFN's first GEMM
// writes its GELU output directly (cuBLASLt's epilogues have only the tanh form), and Swish
// (SiLU; CLIP's quick GELU x * sigmoid(1.702 x)), which no cuBLAS epilogue has. Base MatMul
// with a constant [K, N] weight (GPT-2's Conv1D folded by fold_gemm_reshape, every projection);
// A's leading dims are the GEMM's M. Variants are the compiled tiles, timed at the profile's opt
// shape; at a shape where the 256x128 tile would not give every SM a tile (a dynamic engine at
// batch 1), the layer takes the 128x64 tile, four times as many. Built only with CUTLASS.
#if KILN_HAVE_CUTLASS
#include <map>
#include <memory>

#include "device_util_host.h"
#include "layers/gemm_common.h"
#include "layers/gemm_cutlass_common.h"
#include "ops/op.h"
#include "tactics.h"
#include "tactics/cutlass_gemm_f16.h"

namespace kiln::gpu {
namespace {

bool cutlass_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kFP16) return *why = "FP16 only", false;
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in[i].present() && d.in[i].dtype != DataType::kFloat16)
      return *why = "float16 only", false;
  if (d.out.empty() || d.out[0].dtype != DataType::kFloat16)
    return *why = "float16 output only", false;
  if (n.attrs.get_string("base", "") != "MatMul") return *why = "base MatMul only", false;
  cuda::F16GemmAct act;
  if (!cutlass_gemm_act(n, &act))
    return *why = "activations: none, erf or tanh GELU, Swish", false;
  const Tensor* w = d.in_const(1);
  if (!w || w->rank() != 2) return *why = "the weight is not a constant 2-D matrix", false;
  if (w->dim(0) % 8 != 0 || w->dim(1) % 8 != 0)
    return *why = "K and N must be multiples of 8", false;
  if (const Tensor* b = d.in_const(2); n.input(2) && (!b || b->numel() != w->dim(1)))
    return *why = "the bias is not a constant of N values", false;
  if (d.in_type(0).rank() < 2) return *why = "A must have rank >= 2", false;
  return true;
}

std::vector<std::string> cutlass_variants(const LayerDesc&) { return cuda::f16_gemm_tiles(); }

class GemmCutlassLayer final : public Layer {
 public:
  explicit GemmCutlassLayer(const LayerDesc& d) : node_(d.node), tile_(d.variant) {
    cutlass_gemm_act(*d.node, &act_);
    if (tile_.empty()) tile_ = cuda::f16_gemm_tiles()[0];
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor &a = in[0], &w = in[1], &y = out[0];
    K_ = a.shape.back();
    N_ = w.shape[1];
    if (w.shape[0] != K_)
      return KILN_ERROR("{}: A {} and W {} do not chain", n.label(), shape_str(a.shape),
                        shape_str(w.shape));
    M_ = K_ == 0 ? 0 : a.numel() / K_;
    std::vector<int64_t> want(a.shape.begin(), a.shape.end() - 1);
    want.push_back(N_);
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    residual_ = in.size() > 3 && in[3].present();
    if (residual_ && in[3].shape != y.shape)
      return KILN_ERROR("{}: the residual {} must have the output's shape {}", n.label(),
                        shape_str(in[3].shape), shape_str(y.shape));
    if (M_ > INT32_MAX || M_ == 0) return size_t{0};
    const std::string tile = cutlass_tile_at(tile_, M_, N_);
    auto& g = gemms_[tile];
    if (!g) g = cuda::make_f16_gemm(act_, tile, node_->attrs.get_float("act_alpha", 1.f));
    if (!g) return KILN_ERROR("{}: no CUTLASS tile '{}'", n.label(), tile);
    gemm_ = g.get();
    size_t ws = 0;
    KILN_RETURN_IF_ERROR(
        gemm_->configure(static_cast<int>(M_), static_cast<int>(N_), static_cast<int>(K_), &ws)
            .with_context(n.label()));
    return ws;
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (M_ == 0) return Status::Ok();
    if (M_ > INT32_MAX) return KILN_ERROR("{}: more than 2^31 rows", node_->label());
    const void* bias = in.size() > 2 && in[2].present() ? in[2].data : nullptr;
    const void* r = residual_ ? in[3].data : nullptr;
    for (const void* p :
         {static_cast<const void*>(in[0].data), static_cast<const void*>(in[1].data), bias, r,
          static_cast<const void*>(out[0].data)})
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        return KILN_ERROR("{}: CUTLASS needs 16-byte aligned tensors", node_->label());
    return gemm_->run(in[0].data, in[1].data, bias, r, out[0].data, rc.workspace, rc.stream,
                      rc.pdl)
        .with_context(node_->label());
  }

 private:
  const Node* node_;
  std::string tile_;
  cuda::F16GemmAct act_ = cuda::F16GemmAct::kNone;
  int64_t M_ = 0, N_ = 0, K_ = 0;
  bool residual_ = false;
  std::map<std::string, std::unique_ptr<cuda::F16Gemm>> gemms_;  // by tile
  cuda::F16Gemm* gemm_ = nullptr;                                 // this shape's
};

}  // namespace

bool gemm_cutlass_supports(const LayerDesc& d, std::string* why) {
  return cutlass_supports(d, why);
}
std::vector<std::string> gemm_cutlass_variants(const LayerDesc& d) { return cutlass_variants(d); }
Expected<std::unique_ptr<Layer>> create_gemm_cutlass(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GemmCutlassLayer(d));
}

}  // namespace kiln::gpu
#endif  // KILN_HAVE_CUTLASS
