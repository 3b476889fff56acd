// The library INT8 convolutions (tactics/: cuDNN graph, cuBLASLt IMMA for 1x1 stride 1, CUTLASS
// sm90's implicit-GEMM conv, its persistent GEMMs for 1x1 stride 1, and the persistent conv for
// the rest) as tactics of kiln.FusedConv int8 = 1, next to kiln's own conv_int8 (conv_int8.cu). The
// layer fills the ConvProblem's INT8 epilogue (conv_tactic.h) from the node's scales:
// channel_scale[k] = sx * sw[k], the bias (zeros when the node has none), the residual int8 with
// its scale or half, ReLU or ReLU clipped at Clip's max, and Y int8 with its scale or half. Each
// library's own supports() refuses what it cannot fuse. The variant is the rank of the library's
// candidate, as for the FP16/TF32 fused tactics (conv_fused.cpp).
#include "device_util_host.h"
#include "kernels/activation.cuh"
#include "layers/conv_common.h"
#include "layers/conv_ranked.h"
#include "quant/int8.h"
#include "tactics/check.h"
#include "tactics/conv_sources.h"
#include "tactics/conv_tactic.h"

namespace kiln::gpu {
namespace {

enum class Library { kCudnnGraph, kCublasLt, kCutlass, kCutlassGemm, kCutlassPconv };

std::unique_ptr<cuda::ConvTacticSource> make_source(Library lib) {
  switch (lib) {
    case Library::kCudnnGraph:
      return cuda::make_cudnn_graph_source();
    case Library::kCublasLt:
      return cuda::make_cublaslt_source();
#if KILN_HAVE_CUTLASS
    case Library::kCutlass:
      return cuda::make_cutlass_sm90_source();
    case Library::kCutlassGemm:
      return cuda::make_cutlass_sm90_gemm_source();
    case Library::kCutlassPconv:
      return cuda::make_cutlass_sm90_pconv_source();
#else
    case Library::kCutlass:
    case Library::kCutlassGemm:
    case Library::kCutlassPconv:
      return nullptr;
#endif
  }
  return nullptr;
}

// The INT8 problem a FusedConv int8 = 1 node describes at its chosen formats (shape sizes other
// than the filter's are filled at configure), or why it is not one these tactics take.
bool describe_int8(const LayerDesc& d, cuda::ConvProblem* p, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kINT8 || !quant::runs_int8(n) || n.op_type != "FusedConv")
    return *why = "INT8 FusedConv layers only (int8 = 1)", false;
  if (std::string b = quant::int8_blocker(n); !b.empty()) return *why = b, false;
  if (d.in_type(0).rank() != 4) return *why = "not 2-D", false;
  if (d.in[0].dtype != DataType::kInt8 || d.in[0].layout != Layout::kNHWC)
    return *why = "X must be int8 NHWC", false;
  const Tensor* w = d.in_const(1);
  const Value* wv = n.input(1);
  if (!w || w->rank() != 4 || wv->quant_scales.empty())
    return *why = "weights are not a constant with INT8 scales", false;
  if (!library_conv_geometry(n, p, why)) return false;
  const int64_t K = w->dim(0);
  if (w->dim(1) % 4 != 0) return *why = "input channels not a multiple of 4", false;
  // The residual: int8 with its scale, or half. The activation: none, ReLU, or Clip(0, hi) as
  // a clipped ReLU. Every epilogue here has a bias (zeros when the node has none): the tactics
  // have no ReLU without one.
  const bool residual = n.num_inputs() > 3 && n.input(3);
  if (!library_conv_epilogue(n, residual, /*clip_with_residual=*/true, p, why)) return false;
  p->residual_scale = 0.f;
  if (residual) {
    if (d.in_type(3).dims != d.out_type(0).dims) return *why = "the residual broadcasts", false;
    if (d.in[3].layout != Layout::kNHWC) return *why = "the residual is not NHWC", false;
    if (d.in[3].dtype == DataType::kInt8)
      p->residual_scale = n.input(3)->quant_scales[0];
    else if (d.in[3].dtype != DataType::kFloat16)
      return *why = "a float32 residual", false;
  }
  // Y: int8 with its scale, or half.
  if (d.out[0].layout != Layout::kNHWC) return *why = "Y is not NHWC", false;
  if (d.out[0].dtype == DataType::kInt8)
    p->output_scale = n.output(0)->quant_scales[0];
  else if (d.out[0].dtype == DataType::kFloat16)
    p->output_scale = 0.f;
  else
    return *why = "a float32 output", false;
  if (n.input(2)) {
    const Tensor* b = d.in_const(2);
    if (!b || b->numel() != K) return *why = "the bias is not a constant of K values", false;
  }
  const float sx = n.input(0)->quant_scales[0];
  const auto& sw = wv->quant_scales;
  p->channel_scale.resize(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k)
    p->channel_scale[static_cast<size_t>(k)] = sx * sw[sw.size() == 1 ? 0 : static_cast<size_t>(k)];
  p->precision = cuda::Precision::kINT8;
  p->shape.k = static_cast<int>(K);
  p->shape.c = static_cast<int>(w->dim(1));
  p->shape.r = static_cast<int>(w->dim(2));
  p->shape.s = static_cast<int>(w->dim(3));
  return true;
}

class LibraryInt8ConvLayer final : public Layer {
 public:
  LibraryInt8ConvLayer(const LayerDesc& d, Library lib)
      : desc_(d), lib_(lib), tactics_(d.variant, d.tuning) {
    use_layer_tactic_limits();
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    cuda::ConvProblem p;
    std::string why;
    if (!describe_int8(desc_, &p, &why)) return Status::Error(why);
    const auto& x = in[0].shape;
    p.shape.n = static_cast<int>(x[0]);
    p.shape.h = static_cast<int>(x[2]);
    p.shape.w = static_cast<int>(x[3]);
    if (p.shape.p() != out[0].shape[2] || p.shape.q() != out[0].shape[3])
      return KILN_ERROR("output size differs from the tactic's geometry");
    // An empty batch runs nothing (cuDNN refuses zero-sized descriptors).
    if (out[0].numel() == 0) return size_t{0};
    KILN_RETURN_IF_ERROR(upload_bias(p));
    // The int8 KRSC weights, quantized per output channel as the CPU reference does; the staged
    // copy lives until the tactic has its own (get() synchronizes).
    DeviceMemory staged;
    auto weights = [&]() -> Expected<const void*> {
      const Node& n = *desc_.node;
      const Tensor q = quant::quantize_weights(*desc_.in_const(1), n.input(1)->quant_scales,
                                               quant::weight_channel_axis(n));
      KILN_ASSIGN_OR_RETURN(Tensor krsc,
                            to_device_format(q, TensorFormat{DataType::kInt8, Layout::kNHWC}));
      KILN_RETURN_IF_ERROR(staged.reserve(std::max<size_t>(krsc.nbytes(), 256), "INT8 weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(staged.get(), krsc.raw(), krsc.nbytes(), "INT8 weights"));
      return static_cast<const void*>(staged.get());
    };
    KILN_ASSIGN_OR_RETURN(current_, tactics_.get(
                                        p, rc, [this] { return make_source(lib_); }, weights));
    return current_->workspace_size();
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    return run_library_conv(current_, bias_.get(), rc, in, out);
  }

 private:
  // Once: the float32 bias on the device (zeros without one). It never changes behind its
  // pointer, as the tactics that keep a scaled copy of it require.
  Status upload_bias(const cuda::ConvProblem& p) {
    if (bias_.get()) return Status::Ok();
    std::vector<float> bias(static_cast<size_t>(p.shape.k), 0.f);
    if (const Tensor* b = desc_.node->input(2) ? desc_.in_const(2) : nullptr)
      for (int64_t k = 0; k < p.shape.k; ++k)
        bias[static_cast<size_t>(k)] = static_cast<float>(b->at_double(k));
    KILN_RETURN_IF_ERROR(bias_.reserve(bias.size() * sizeof(float), "INT8 conv bias"));
    KILN_RETURN_IF_ERROR(
        cuda::upload(bias_.get(), bias.data(), bias.size() * sizeof(float), "INT8 conv bias"));
    return Status::Ok();
  }

  LayerDesc desc_;
  Library lib_;
  RankedConvTactics tactics_;
  DeviceMemory bias_;
  cuda::ConvTactic* current_ = nullptr;
};

template <Library kLib>
Expected<std::unique_ptr<Layer>> create(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new LibraryInt8ConvLayer(d, kLib));
}

// Cheap checks only (no GPU work): the node's form and the library's own supports() at the
// filter's geometry (batch and image size do not change what a library fuses).
template <Library kLib>
bool supports(const LayerDesc& d, std::string* why) {
  cuda::ConvProblem p;
  if (!describe_int8(d, &p, why)) return false;
  auto src = make_source(kLib);
  if (!src) return *why = "this build has no CUTLASS", false;
  p.shape.n = 1;
  p.shape.h = p.shape.w = std::max(p.shape.r, p.shape.s) + 2 * p.shape.stride;
  if (const auto& dims = d.in_type(0).dims;
      dims && (*dims)[2].is_static() && (*dims)[3].is_static()) {
    p.shape.h = static_cast<int>((*dims)[2].value);
    p.shape.w = static_cast<int>((*dims)[3].value);
  }
  return src->supports(p, why);
}

std::vector<std::string> ranks3(const LayerDesc&) { return {"0", "1", "2"}; }
std::vector<std::string> ranks6(const LayerDesc&) { return {"0", "1", "2", "3", "4", "5"}; }

}  // namespace

std::span<const TacticDef> int8_library_conv_tactics() {
  static const TacticDef kTactics[] = {
      {"kiln", "FusedConv", "cudnn_graph.int8", kI8 | kF16 | kNHWC | kReassociated, 0,
       supports<Library::kCudnnGraph>, create<Library::kCudnnGraph>, ranks6},
      {"kiln", "FusedConv", "cublaslt.conv1x1.int8", kI8 | kF16 | kNHWC | kReassociated, 0,
       supports<Library::kCublasLt>, create<Library::kCublasLt>, ranks3},
      {"kiln", "FusedConv", "cutlass_sm90.int8", kI8 | kF16 | kNHWC | kReassociated, 0,
       supports<Library::kCutlass>, create<Library::kCutlass>, ranks3},
      {"kiln", "FusedConv", "cutlass_sm90_gemm.int8", kI8 | kF16 | kNHWC | kReassociated, 0,
       supports<Library::kCutlassGemm>, create<Library::kCutlassGemm>, ranks3},
      {"kiln", "FusedConv", "cutlass_sm90_pconv.int8", kI8 | kF16 | kNHWC | kReassociated, 0,
       supports<Library::kCutlassPconv>, create<Library::kCutlassPconv>, ranks3},
  };
  return kTactics;
}

}  // namespace kiln::gpu
