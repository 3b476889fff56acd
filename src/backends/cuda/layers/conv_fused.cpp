// The kernel study's fused convolution tactics as kiln tactics: the cuDNN graph API (conv + bias
// [+ residual] [+ activation: ReLU, ReLU6, Swish, Sigmoid, Tanh, GELU, LeakyRelu] in one kernel,
// grouped convolutions too) and cuBLASLt for 1x1 stride-1 convolutions (GEMM with a bias/ReLU
// epilogue, groups 1). Both take 2-D NHWC float16 (FP16) or float32 (TF32) problems with square
// strides and symmetric padding; the variant is the rank of the library's candidate in its own
// heuristic order, timed by the tuner at the opt shape.
#include "device_util_host.h"
#include "tactics/check.h"
#include "layers/conv_common.h"
#include "layers/conv_ranked.h"
#include "ops/fused.h"
#include "tactics/conv_sources.h"
#include "tactics/conv_tactic.h"

namespace kiln::gpu {

// conv_post.cu: a FusedConv's post steps as a pass over y (n elements of `dtype`), in place.
Status launch_post_steps(void* y, int64_t n, DataType dtype,
                         const std::vector<cuda::PostStep>& steps, cudaStream_t stream);

namespace {

// The layer's post steps (post_ops, post_values: ops/fused.h) as the tactics' PostSteps.
bool post_steps(const Node& n, std::vector<cuda::PostStep>* out, std::string* why) {
  using cuda::PostOp;
  static_assert(std::size(kPostOps) == static_cast<size_t>(PostOp::kErf) + 1 &&
                    static_cast<int>(PostOp::kMin) + 1 == kPostOpsBinary,
                "cuda::PostOp numbers the steps of ops/fused.h's kPostOps in its order");
  const auto ops = n.attrs.get_strings("post_ops");
  const auto values = n.attrs.get_floats("post_values");
  if (ops.size() != values.size() || ops.size() > size_t(cuda::kMaxPostSteps))
    return *why = "malformed post steps", false;
  for (size_t i = 0; i < ops.size(); ++i) {
    const int op = post_op_index(ops[i]);
    if (op < 0) return *why = "post step " + ops[i], false;
    out->push_back({static_cast<PostOp>(op), values[i]});
  }
  return true;
}

// The problem a FusedConv node describes, or why it is not one the fused tactics take.
bool describe_problem(const LayerDesc& d, cuda::ConvProblem* p, std::string* why) {
  const Node& n = *d.node;
  if (d.in_type(0).rank() != 4) return *why = "not 2-D", false;
  if (d.in[0].layout != Layout::kNHWC) return *why = "needs NHWC", false;
  if (d.precision == Precision::kFP16 && d.in[0].dtype == DataType::kFloat16)
    p->precision = cuda::Precision::kFP16;
  else if (d.precision == Precision::kTF32 && d.in[0].dtype == DataType::kFloat32)
    p->precision = cuda::Precision::kTF32;
  else
    return *why = "FP16 or TF32 only", false;
  if (!library_conv_geometry(n, p, why, /*allow_groups=*/true)) return false;
  if (!d.in_const(1)) return *why = "weights are not constant", false;
  if (p->shape.groups > 1 && d.in_const(1)->shape().size() == 4 && d.in_const(1)->shape()[1] == 1)
    return *why = "depthwise (kiln.dwconv and cudnn.conv take it)", false;
  const bool bias = n.input(2) != nullptr, residual = n.input(3) != nullptr;
  if (!post_steps(n, &p->post, why)) return false;
  if (!bias && !residual && n.attrs.get_string("activation", "").empty() && p->post.empty()) {
    // a plain convolution (FastViT's, NFNet's grouped ones): no epilogue at all
    p->epilogue = cuda::Epilogue::kNone;
    return true;
  }
  // An epilogue without a bias (MetaFormer's bias-free 1x1 convolutions before StarReLU or a
  // residual add) runs with a bias of zeros that the layer keeps (FusedConvLayer::zero_bias_).
  if (residual && d.in_type(3).dims != d.out_type(0).dims)
    return *why = "broadcast residual", false;
  // ReLU6 (Clip to [0, hi]) is a clipped ReLU in cuDNN's graph, but not after a residual add.
  return library_conv_epilogue(n, residual, /*clip_with_residual=*/false, p, why,
                               /*any_activation=*/true);
}

class FusedConvLayer final : public Layer {
 public:
  FusedConvLayer(const LayerDesc& d, bool cublaslt)
      : desc_(d), cublaslt_(cublaslt), tactics_(d.variant, d.tuning) {
    use_layer_tactic_limits();
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    cuda::ConvProblem p;
    std::string why;
    if (!describe_problem(desc_, &p, &why)) return Status::Error(why);
    const auto& x = in[0].shape;
    const auto& w = in[1].shape;
    p.shape.n = static_cast<int>(x[0]);
    p.shape.c = static_cast<int>(x[1]);
    p.shape.h = static_cast<int>(x[2]);
    p.shape.w = static_cast<int>(x[3]);
    p.shape.k = static_cast<int>(w[0]);
    p.shape.r = static_cast<int>(w[2]);
    p.shape.s = static_cast<int>(w[3]);
    if (w[2] != w[3] && cublaslt_) return KILN_ERROR("non-square kernel");
    if (p.shape.p() != out[0].shape[2] || p.shape.q() != out[0].shape[3])
      return KILN_ERROR("output size differs from the tactic's geometry");
    // An empty batch runs nothing (cuDNN refuses zero-sized descriptors).
    if (out[0].numel() == 0) return size_t{0};
    // The tactic keeps its own copy of the weights (KRSC, the layer's storage type); the staged
    // copy lives until the tactic has it (get() synchronizes).
    DeviceMemory staged;
    auto weights = [&]() -> Expected<const void*> {
      const TensorFormat wf{in[1].dtype, Layout::kNHWC};
      KILN_ASSIGN_OR_RETURN(Tensor wt, to_device_format(*desc_.in_const(1), wf));
      KILN_RETURN_IF_ERROR(staged.reserve(std::max<size_t>(wt.nbytes(), 256), "conv weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(staged.get(), wt.raw(), wt.nbytes(), "conv weights"));
      return static_cast<const void*>(staged.get());
    };
    auto source = [this] {
      return cublaslt_ ? cuda::make_cublaslt_source() : cuda::make_cudnn_graph_source();
    };
    KILN_ASSIGN_OR_RETURN(current_, tactics_.get(p, rc, source, weights));
    post_ = p.post;
    const bool has_bias = in.size() > 2 && in[2].present();
    if (!has_bias && p.epilogue != cuda::Epilogue::kNone && !zero_bias_.get()) {
      // The bias type is the layer's storage type (half in FP16, float in TF32); zero bits are
      // 0 in both.
      const std::vector<uint8_t> zeros(size_t(p.shape.k) * dtype_size(out[0].dtype), 0);
      KILN_RETURN_IF_ERROR(zero_bias_.reserve(std::max<size_t>(zeros.size(), 256), "zero bias"));
      KILN_RETURN_IF_ERROR(cuda::upload(zero_bias_.get(), zeros.data(), zeros.size(), "zero bias"));
    }
    return current_->workspace_size();
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    KILN_RETURN_IF_ERROR(run_library_conv(
        current_, in.size() > 2 && in[2].present() ? in[2].data : zero_bias_.get(), rc, in, out));
    // cuBLASLt's epilogue stops at the activation: the post steps are a pass over y.
    if (!cublaslt_ || post_.empty() || out[0].numel() == 0) return Status::Ok();
    return launch_post_steps(out[0].data, out[0].numel(), out[0].dtype, post_, rc.stream);
  }

 private:
  LayerDesc desc_;
  bool cublaslt_;
  RankedConvTactics tactics_;
  cuda::ConvTactic* current_ = nullptr;
  DeviceMemory zero_bias_;  // the bias of a layer with an epilogue and no bias input
  std::vector<cuda::PostStep> post_;  // the layer's post steps (cuBLASLt: run as a second pass)
};

}  // namespace

bool fused_conv_supports(const LayerDesc& d, std::string* why) {
  cuda::ConvProblem p;
  if (!describe_problem(d, &p, why)) return false;
  for (const cuda::PostStep& s : p.post)  // cuDNN's POW is exp(b log(a)): a square only
    if (s.op == cuda::PostOp::kPow && s.value != 2.f) return *why = "Pow other than a square", false;
  return true;
}

bool cublaslt_conv_supports(const LayerDesc& d, std::string* why) {
  cuda::ConvProblem p;
  if (!describe_problem(d, &p, why)) return false;
  const auto& w = d.in_type(1);
  if (!w.is_static() || (*w.dims)[2].value != 1 || (*w.dims)[3].value != 1 || p.shape.stride != 1 ||
      p.shape.pad != 0)
    return *why = "not a 1x1 stride-1 convolution", false;
  if (p.relu_clip > 0) return *why = "cuBLASLt has no clipped ReLU epilogue", false;
  if (p.epilogue == cuda::Epilogue::kNone) return *why = "no bias", false;
  return cuda::plain_problem(p, why);
}

std::vector<std::string> cudnn_graph_variants(const LayerDesc&) {
  return {"0", "1", "2", "3", "4", "5"};
}
std::vector<std::string> cublaslt_variants(const LayerDesc&) { return {"0", "1", "2"}; }

Expected<std::unique_ptr<Layer>> create_cudnn_graph_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new FusedConvLayer(d, false));
}
Expected<std::unique_ptr<Layer>> create_cublaslt_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new FusedConvLayer(d, true));
}

}  // namespace kiln::gpu
