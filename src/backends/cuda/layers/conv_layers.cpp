// The cuDNN convolution layers (cudnn.conv, cudnn.convt) and the conv family's table.
#include <cudnn.h>

#include <algorithm>
#include <map>

#include "layers/conv_common.h"
#include "tactics.h"

namespace kiln::gpu {

// conv_fused.cpp: the kernel study's tactics (cuDNN graph API, cuBLASLt 1x1) as kiln tactics.
bool fused_conv_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_cudnn_graph_conv(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_cublaslt_conv(const LayerDesc& d);
std::vector<std::string> cudnn_graph_variants(const LayerDesc& d);
std::vector<std::string> cublaslt_variants(const LayerDesc& d);
bool cublaslt_conv_supports(const LayerDesc& d, std::string* why);
// conv_depthwise.cu: kiln's NHWC depthwise convolution with the fused epilogue.
bool depthwise_conv_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_depthwise_conv(const LayerDesc& d);
std::vector<std::string> depthwise_conv_variants(const LayerDesc& d);
bool depthwise_mean_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> depthwise_mean_variants(const LayerDesc& d);
// conv_int8.cu: kiln's INT8 FusedConv / FusedGemm (int8 = 1) with the fused float epilogue.
bool int8_conv_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_int8_conv(const LayerDesc& d);  // tensor cores
Expected<std::unique_ptr<Layer>> create_int8_conv_dp4a(const LayerDesc& d);
bool int8_pipelined_supports(const LayerDesc& d, std::string* why);
bool stem_conv_supports(const LayerDesc& d, std::string* why);  // conv_stem.cu
Expected<std::unique_ptr<Layer>> create_stem_conv(const LayerDesc& d);
bool stem_s2d_supports(const LayerDesc& d, std::string* why);  // conv_stem_s2d.cu
Expected<std::unique_ptr<Layer>> create_stem_s2d(const LayerDesc& d);
bool stem_s2d_int8_supports(const LayerDesc& d, std::string* why);
std::vector<std::string> stem_s2d_int8_variants(const LayerDesc& d);
bool conv_pool_direct_supports(const LayerDesc& d, std::string* why);  // conv_stem.cu
Expected<std::unique_ptr<Layer>> create_conv_pool_direct(const LayerDesc& d);
std::vector<std::string> int8_pipelined_variants(const LayerDesc& d);
std::vector<std::string> int8_pointwise_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_int8_pipelined(const LayerDesc& d);  // conv_int8_pipelined.cu
bool int8_pointwise_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_int8_pointwise(const LayerDesc& d);  // conv_int8_pointwise.cu
bool int8_conv3x3_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_int8_conv3x3(const LayerDesc& d);  // conv_int8_3x3.cu
bool int8_conv3x3_wgmma_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_int8_conv3x3_wgmma(const LayerDesc& d);
bool int8_pair_supports(const LayerDesc& d, std::string* why);  // conv_int8_pair.cu
std::vector<std::string> int8_pair_variants(const LayerDesc& d);
Expected<std::unique_ptr<Layer>> create_int8_pair(const LayerDesc& d);
bool int8_pair_wgmma_supports(const LayerDesc& d, std::string* why);  // conv_int8_pair.cu
Expected<std::unique_ptr<Layer>> create_int8_pair_wgmma(const LayerDesc& d);

namespace {

constexpr int kNumFwdAlgos = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;

bool is_fused(const LayerDesc& d) { return d.node->op_type == "FusedConv"; }

bool conv_supports_any(const LayerDesc& d, std::string* why, bool swish) {
  const int rank = static_cast<int>(d.in_type(0).rank());
  if (rank < 3 || rank > 5) return *why = "cuDNN convolutions take 1-3 spatial axes", false;
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kFloat64)
    return *why = "float types only", false;
  if (d.in[0].layout == Layout::kNHWC && t == DataType::kFloat64)
    return *why = "no NHWC float64 convolution", false;
  if (is_fused(d)) {
    ActParams a;
    if (!read_activation(d.node->attrs, &a)) return *why = "unknown activation", false;
    // Swish joins a convolution only where the convolution's own kernel computes it (kiln's
    // depthwise kernel, cuDNN's graph API): here it is one more pass, as fast as its own layer,
    // so only the fallback entry (`swish`) takes it, for shapes cuDNN's graph has no engine for.
    if ((a.act == Act::kSwish) != swish)
      return *why = swish ? "the fallback entry takes Swish only"
                          : "Swish runs in its own layer after cuDNN",
             false;
    // The residual must have the output's shape (a broadcast residual runs unfused).
    if (d.node->input(3) && d.in_type(3).dims != d.out_type(0).dims)
      return *why = "the residual broadcasts", false;
  }
  return true;
}

bool conv_supports(const LayerDesc& d, std::string* why) {
  return conv_supports_any(d, why, false);
}
bool conv_swish_supports(const LayerDesc& d, std::string* why) {
  return is_fused(d) && conv_supports_any(d, why, true);
}

// TF32 (float32 storage, TF32 tensor-core products) promises about 1e-3 of FP32. The FFT and
// Winograd algorithms transform inputs and filters and multiply the transformed values, which
// tensor-op math rounds to TF32's 10-bit mantissa after a transform that amplifies that
// rounding; they are not TF32 candidates. (Suspected cause of an EfficientNet-B0 TF32 engine
// that once reached 1.6e-2 when the tuner's choice varied; strict FP32 and FP16 keep them.)
bool algo_allowed(Precision p, DataType storage, int algo) {
  if (p != Precision::kTF32 || storage != DataType::kFloat32) return true;
  switch (static_cast<cudnnConvolutionFwdAlgo_t>(algo)) {
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return false;
    default:
      return true;
  }
}

std::vector<std::string> conv_variants(const LayerDesc& d) {
  std::vector<std::string> v = {""};  // "": cuDNN's own heuristic choice (allowed ones only)
  const DataType storage = d.node ? d.in_type(0).dtype : DataType::kFloat32;
  for (int a = 0; a < kNumFwdAlgos; ++a)
    if (algo_allowed(d.precision, storage, a)) v.push_back(std::to_string(a));
  return v;
}

class CudnnConvLayer final : public Layer {
 public:
  explicit CudnnConvLayer(const LayerDesc& d) : desc_(d), node_(d.node) {
    if (is_fused(d)) read_activation(d.node->attrs, &act_);
    forced_algo_ = d.variant.empty() ? -1 : std::stoi(d.variant);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(g_, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (out[0].numel() == 0 || in[0].numel() == 0) return size_t{0};  // cuDNN refuses 0 dims
    nhwc_ = in[0].layout == Layout::kNHWC;
    pad_ = !symmetric_pads(g_);
    KILN_RETURN_IF_ERROR(descs_.set(g_, in[0].dtype, desc_.precision, nhwc_, false, pad_));
    // The tuned algorithm; at a shape other than the one it was timed at, cuDNN's heuristic
    // choice when the tuned one does not support it (never during tuning: the tuner drops it).
    size_t forced_ws = 0;
    const bool forced_ok =
        forced_algo_ >= 0 && algo_allowed(desc_.precision, in[0].dtype, forced_algo_) &&
        (desc_.tuning ||
         (cudnnGetConvolutionForwardWorkspaceSize(
              rc.cudnn, descs_.x, descs_.w, descs_.conv, descs_.y,
              static_cast<cudnnConvolutionFwdAlgo_t>(forced_algo_), &forced_ws) ==
              CUDNN_STATUS_SUCCESS &&
          forced_ws + (pad_ ? padded_input_bytes(g_, in[0].dtype) : 0) <= rc.workspace_limit));
    if (forced_ok) {
      algo_ = static_cast<cudnnConvolutionFwdAlgo_t>(forced_algo_);
    } else {
      cudnnConvolutionFwdAlgoPerf_t perf[kNumFwdAlgos];
      int n = 0;
      KILN_RETURN_IF_ERROR(cudnn_check(
          cudnnGetConvolutionForwardAlgorithm_v7(rc.cudnn, descs_.x, descs_.w, descs_.conv,
                                                 descs_.y, kNumFwdAlgos, &n, perf),
          "cudnnGetConvolutionForwardAlgorithm_v7"));
      bool found = false;
      for (int i = 0; i < n && !found; ++i) {
        size_t ws = 0;
        if (perf[i].status == CUDNN_STATUS_SUCCESS &&
            algo_allowed(desc_.precision, in[0].dtype, perf[i].algo) &&
            cudnnGetConvolutionForwardWorkspaceSize(rc.cudnn, descs_.x, descs_.w, descs_.conv,
                                                    descs_.y, perf[i].algo, &ws) ==
                CUDNN_STATUS_SUCCESS &&
            ws + (pad_ ? padded_input_bytes(g_, in[0].dtype) : 0) <= rc.workspace_limit) {
          algo_ = perf[i].algo;
          found = true;
        }
      }
      if (!found) return KILN_ERROR("cuDNN has no algorithm for this convolution");
    }
    size_t ws = 0;
    KILN_RETURN_IF_ERROR(cudnn_check(
        cudnnGetConvolutionForwardWorkspaceSize(rc.cudnn, descs_.x, descs_.w, descs_.conv,
                                                descs_.y, algo_, &ws),
        "cudnnGetConvolutionForwardWorkspaceSize (algorithm not supported here)"));
    algo_ws_ = (ws + 255) / 256 * 256;
    return algo_ws_ + (pad_ ? padded_input_bytes(g_, in[0].dtype) : 0);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const DeviceTensor& y = out[0];
    if (y.numel() == 0) return Status::Ok();
    const void* x = in[0].data;
    if (pad_) {
      void* padded = static_cast<uint8_t*>(rc.workspace) + algo_ws_;
      KILN_RETURN_IF_ERROR(launch_pad_input(in[0], padded, g_, rc.stream));
      x = padded;
    }
    const double one_d = 1.0, zero_d = 0.0;
    const float one_f = 1.0f, zero_f = 0.0f;
    const bool dbl = y.dtype == DataType::kFloat64;
    KILN_RETURN_IF_ERROR(cudnn_check(
        cudnnConvolutionForward(rc.cudnn, dbl ? static_cast<const void*>(&one_d) : &one_f,
                                descs_.x, x, descs_.w, in[1].data, descs_.conv, algo_,
                                rc.workspace, algo_ws_, dbl ? static_cast<const void*>(&zero_d) : &zero_f,
                                descs_.y, y.data),
        "cudnnConvolutionForward"));
    const DeviceTensor* bias = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
    const DeviceTensor* z = in.size() > 3 && in[3].present() ? &in[3] : nullptr;
    return launch_conv_epilogue(y, bias, z, act_, rc.stream);
  }

 private:
  LayerDesc desc_;
  const Node* node_;
  ActParams act_;
  int forced_algo_ = -1;
  ConvGeom g_;
  bool nhwc_ = false, pad_ = false;
  CudnnConvDescs descs_;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  size_t algo_ws_ = 0;
};

class CudnnConvTransposeLayer final : public Layer {
 public:
  explicit CudnnConvTransposeLayer(const LayerDesc& d) : desc_(d), node_(d.node) {}

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(g_, conv_geometry(*node_, in[0].shape, in[1].shape, true));
    if (out[0].numel() == 0) return size_t{0};
    if (in[0].numel() == 0)  // nothing to convolve: the output is the bias (or zeros)
      return KILN_ERROR("a transposed convolution of an empty input is not supported");
    KILN_RETURN_IF_ERROR(descs_.set(g_, in[0].dtype, desc_.precision, false, true, false));
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int n = 0;
    KILN_RETURN_IF_ERROR(cudnn_check(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(rc.cudnn, descs_.w, descs_.y, descs_.conv,
                                                    descs_.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                    &n, perf),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7"));
    full_shape_ = {g_.N, g_.M};
    for (int d = 0; d < g_.nsp; ++d) full_shape_.push_back(full_transpose_out(g_, d));
    int64_t full = 1;
    for (int64_t s : full_shape_) full *= s;
    full_bytes_ = (static_cast<size_t>(full) * dtype_size(in[0].dtype) + 255) / 256 * 256;
    for (int i = 0; i < n; ++i) {
      size_t ws = 0;
      if (perf[i].status != CUDNN_STATUS_SUCCESS ||
          cudnnGetConvolutionBackwardDataWorkspaceSize(rc.cudnn, descs_.w, descs_.y, descs_.conv,
                                                       descs_.x, perf[i].algo, &ws) !=
              CUDNN_STATUS_SUCCESS ||
          ws + full_bytes_ > rc.workspace_limit)
        continue;
      algo_ = perf[i].algo;
      algo_ws_ = (ws + 255) / 256 * 256;
      return algo_ws_ + full_bytes_;
    }
    return KILN_ERROR("cuDNN has no algorithm for this transposed convolution");
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    void* full = static_cast<uint8_t*>(rc.workspace) + algo_ws_;
    const double one_d = 1.0, zero_d = 0.0;
    const float one_f = 1.0f, zero_f = 0.0f;
    const bool dbl = out[0].dtype == DataType::kFloat64;
    {
      KILN_RETURN_IF_ERROR(cudnn_check(
          cudnnConvolutionBackwardData(rc.cudnn, dbl ? static_cast<const void*>(&one_d) : &one_f,
                                       descs_.w, in[1].data, descs_.y, in[0].data, descs_.conv,
                                       algo_, rc.workspace, algo_ws_,
                                       dbl ? static_cast<const void*>(&zero_d) : &zero_f,
                                       descs_.x, full),
          "cudnnConvolutionBackwardData"));
    }
    const DeviceTensor* bias = in.size() > 2 && in[2].present() ? &in[2] : nullptr;
    return launch_crop_bias(full, full_shape_, out[0], bias, g_, rc.stream);
  }

 private:
  LayerDesc desc_;
  const Node* node_;
  ConvGeom g_;
  CudnnConvDescs descs_;
  cudnnConvolutionBwdDataAlgo_t algo_ = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
  size_t algo_ws_ = 0, full_bytes_ = 0;
  std::vector<int64_t> full_shape_;
};

bool convt_supports(const LayerDesc& d, std::string* why) {
  const int rank = static_cast<int>(d.in_type(0).rank());
  if (rank < 3 || rank > 5) return *why = "cuDNN convolutions take 1-3 spatial axes", false;
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kFloat64)
    return *why = "float types only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new CudnnConvLayer(d));
}
Expected<std::unique_ptr<Layer>> create_convt(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new CudnnConvTransposeLayer(d));
}

const TacticDef kConvTactics[] = {
    {"", "Conv", "cudnn.conv", kF32 | kF16 | kF64 | kNHWC, 0, conv_supports, create_conv,
     conv_variants},
    {"kiln", "FusedConv", "cudnn.conv.fused", kF32 | kF16 | kF64 | kNHWC, 0, conv_supports,
     create_conv, conv_variants},
    {"kiln", "FusedConv", "cudnn_graph.fused", kF32 | kF16 | kNHWC | kPostSteps, 0,
     fused_conv_supports, create_cudnn_graph_conv, cudnn_graph_variants},
    // Swish after cuDNN's legacy convolution, as a second pass: for a FusedConv with Swish that
    // cuDNN's graph API has no engine for (kFallback: never a reason to fuse it).
    {"kiln", "FusedConv", "cudnn.conv.fused.swish", kF32 | kF16 | kF64 | kNHWC | kFallback, 0,
     conv_swish_supports, create_conv, conv_variants},
    {"kiln", "FusedConv", "cublaslt.conv1x1", kF32 | kF16 | kNHWC | kPostSteps, 0,
     cublaslt_conv_supports, create_cublaslt_conv, cublaslt_variants},
    // A plain Conv with a bias (BatchNorm folded, nothing else fused) takes the same fused
    // tactics with a bias-only epilogue.
    {"", "Conv", "cudnn_graph.conv", kF32 | kF16 | kNHWC, 0, fused_conv_supports,
     create_cudnn_graph_conv, cudnn_graph_variants},
    {"", "Conv", "cublaslt.conv1x1.conv", kF32 | kF16 | kNHWC, 0, cublaslt_conv_supports,
     create_cublaslt_conv, cublaslt_variants},
    {"", "Conv", "kiln.dwconv", kF32 | kF16 | kNHWC, 0, depthwise_conv_supports,
     create_depthwise_conv, depthwise_conv_variants},
    {"kiln", "FusedConv", "kiln.conv.stem", kF16 | kNHWC, 0, stem_conv_supports, create_stem_conv},
    {"kiln", "FusedConvPool", "kiln.convpool.stem", kF16 | kNHWC, 0, stem_conv_supports,
     create_stem_conv},
    // The pooled stem on the model's float32 NCHW images, float16 or int8-code output.
    {"kiln", "FusedConvPool", "kiln.convpool.s2d", kF32 | kF16 | kNHWC | kRawIn0, 0,
     stem_s2d_supports, create_stem_s2d},
    {"kiln", "FusedConvPool", "kiln.convpool.s2d.quantize",
     kF32 | kF16 | kNHWC | kRawIn0 | kQuantOut, 0, stem_s2d_supports, create_stem_s2d},
    // ... and in INT8 (a layer marked int8 = 1: X quantized as it is read, int8 filter and MMAs).
    {"kiln", "FusedConvPool", "kiln.convpool.s2d.int8",
     kI8 | kF32 | kF16 | kNHWC | kRawIn0 | kReassociated, 0, stem_s2d_int8_supports,
     create_stem_s2d, stem_s2d_int8_variants},
    {"kiln", "FusedConvPool", "kiln.convpool.direct", kF32 | kF16 | kF64 | kNHWC | kFallback, 0,
     conv_pool_direct_supports, create_conv_pool_direct},
    {"kiln", "FusedConv", "kiln.dwconv.fused", kF32 | kF16 | kNHWC, 0, depthwise_conv_supports,
     create_depthwise_conv, depthwise_conv_variants},
    // ... with its output's spatial mean as a second output (squeeze-excitation's pool).
    {"kiln", "FusedConvMean", "kiln.dwconv.mean", kF32 | kF16 | kNHWC, 0, depthwise_mean_supports,
     create_depthwise_conv, depthwise_mean_variants},
    // INT8 layers (docs/quantization.md): int8 storage (kI8), float32/float16 float tensors.
    {"kiln", "FusedConv", "conv_int8", kI8 | kF32 | kF16 | kNHWC, 0, int8_conv_supports,
     create_int8_conv},
    {"kiln", "FusedConv", "conv_int8.dp4a", kI8 | kF32 | kF16 | kNHWC, 0, int8_conv_supports,
     create_int8_conv_dp4a},
    {"kiln", "FusedConv", "conv_int8.pipelined", kI8 | kF32 | kF16 | kNHWC, 0,
     int8_pipelined_supports, create_int8_pipelined, int8_pipelined_variants},
    {"kiln", "FusedConv", "conv_int8.pointwise", kI8 | kF32 | kF16 | kNHWC | kReassociated, 0,
     int8_pointwise_supports, create_int8_pointwise, int8_pointwise_variants},
    {"kiln", "FusedConv", "conv_int8.conv3x3", kI8 | kF32 | kF16 | kNHWC | kReassociated, 0,
     int8_conv3x3_supports, create_int8_conv3x3},
    {"kiln", "FusedConv", "conv_int8.conv3x3.wgmma", kI8 | kF32 | kF16 | kNHWC | kReassociated, 0,
     int8_conv3x3_wgmma_supports, create_int8_conv3x3_wgmma},
    // Two 1x1 convolutions summed into one activation (ResNet's expand + downsample), INT8 only.
    {"kiln", "FusedConvPair", "conv_int8.pair", kI8 | kF32 | kF16 | kNHWC | kReassociated, 0,
     int8_pair_supports, create_int8_pair, int8_pair_variants},
    {"kiln", "FusedConvPair", "conv_int8.pair.wgmma", kI8 | kF32 | kF16 | kNHWC | kReassociated, 0,
     int8_pair_wgmma_supports, create_int8_pair_wgmma},
    {"", "ConvTranspose", "cudnn.convt", kF32 | kF16 | kF64, 0, convt_supports, create_convt},
};

}  // namespace

std::span<const TacticDef> conv_tactics() { return kConvTactics; }

}  // namespace kiln::gpu
