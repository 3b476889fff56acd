// cuDNN legacy convolution API for comparison: cudnnFindConvolutionForwardAlgorithm picks the
// algorithm (it times them itself), cudnnConvolutionForward runs it, and kiln's epilogue kernel
// adds bias/residual/ReLU in a second pass (the legacy fused call only fuses ReLU with one algo).
#include <cudnn.h>

#include "../kernels/conv_kernels.h"
#include "check.h"
#include "conv_sources.h"
#include "device_buffer.h"

namespace kiln::cuda {
namespace {

class CudnnLegacyConvTactic final : public ConvTactic {
 public:
  explicit CudnnLegacyConvTactic(int rank) : rank_(rank) {}
  ~CudnnLegacyConvTactic() override {
    if (x_) cudnnDestroyTensorDescriptor(x_);
    if (y_) cudnnDestroyTensorDescriptor(y_);
    if (w_) cudnnDestroyFilterDescriptor(w_);
    if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
  }

  std::string name() const override {
    return std::string("cudnn_legacy.") + precision_name(problem_.precision) + ".algo" +
           (algo_ < 0 ? std::string("?") : std::to_string(algo_)) +
           (math_ == CUDNN_TENSOR_OP_MATH ? ".tc" : "") + (found_ ? "" : ".nofind");
  }
  std::string family() const override { return "cudnn_legacy"; }

  Status init(const ConvProblem& p, const LibraryHandles& h, cudaStream_t stream) override {
    problem_ = p;
    handle_ = h.cudnn;
    std::string why;
    if (p.precision == Precision::kINT8 && !int8_scalar_alpha(p, &int8_alpha_, &why)) {
      return Status::Error(why);
    }
    KILN_CUDNN(cudnnSetStream(handle_, stream));
    const ConvShape& s = p.shape;
    const cudnnDataType_t io = p.precision == Precision::kFP16   ? CUDNN_DATA_HALF
                               : p.precision == Precision::kTF32 ? CUDNN_DATA_FLOAT
                                                                 : CUDNN_DATA_INT8;
    const cudnnDataType_t comp =
        p.precision == Precision::kINT8 ? CUDNN_DATA_INT32 : CUDNN_DATA_FLOAT;
    KILN_CUDNN(cudnnCreateTensorDescriptor(&x_));
    KILN_CUDNN(cudnnCreateTensorDescriptor(&y_));
    KILN_CUDNN(cudnnCreateFilterDescriptor(&w_));
    KILN_CUDNN(cudnnCreateConvolutionDescriptor(&conv_));
    KILN_CUDNN(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, io, s.n, s.c, s.h, s.w));
    KILN_CUDNN(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, io, s.n, s.k, s.p(), s.q()));
    KILN_CUDNN(cudnnSetFilter4dDescriptor(w_, io, CUDNN_TENSOR_NHWC, s.k, s.c, s.r, s.s));
    KILN_CUDNN(cudnnSetConvolution2dDescriptor(conv_, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                               CUDNN_CROSS_CORRELATION, comp));
    KILN_CUDNN(cudnnSetConvolutionMathType(conv_, CUDNN_TENSOR_OP_MATH));

    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    const cudnnStatus_t fs = cudnnFindConvolutionForwardAlgorithm(
        handle_, x_, w_, conv_, y_, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf);
    int seen = 0;
    if (fs == CUDNN_STATUS_SUCCESS) {
      for (int i = 0; i < returned; ++i) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > h.max_workspace_bytes) {
          continue;
        }
        if (seen++ == rank_) {
          algo_ = int(perf[i].algo);
          math_ = perf[i].mathType;
          workspace_ = perf[i].memory;
          found_ = true;
          break;
        }
      }
    }
    if (!found_) {
      if (rank_ != 0) return Status::Error("cudnnFind offered no algorithm of this rank");
      // Find refused (INT8 does on some versions): try the implicit-precomp-GEMM algorithm,
      // the one the INT8 documentation names.
      find_error_ = cudnn_status(fs, "cudnnFindConvolutionForwardAlgorithm").message();
      algo_ = int(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
      size_t ws = 0;
      Status st =
          cudnn_status(cudnnGetConvolutionForwardWorkspaceSize(
                           handle_, x_, w_, conv_, y_, cudnnConvolutionFwdAlgo_t(algo_), &ws),
                       "cudnnGetConvolutionForwardWorkspaceSize");
      if (!st.ok()) {
        return Status::Error(
            (fs == CUDNN_STATUS_SUCCESS ? std::string("find: no usable algo") : find_error_) +
            "; " + st.message());
      }
      workspace_ = ws;
    }
    KILN_CUDNN(cudnnSetConvolutionMathType(conv_, math_));
    return {};
  }

  size_t workspace_size() const override { return workspace_; }
  std::string note() const override { return find_error_; }

  Status prepare_weights(const void* w, cudaStream_t stream) override {
    return copy_weights_krsc(weights_, problem_, w, stream);
  }

  Status run(const ConvBuffers& b, cudaStream_t stream) override {
    KILN_CUDNN(cudnnSetStream(handle_, stream));
    const float alpha = problem_.precision == Precision::kINT8 ? int8_alpha_ : 1.f;
    const float beta = 0.f;
    KILN_CUDNN(cudnnConvolutionForward(handle_, &alpha, x_, b.x, w_, weights_.get(), conv_,
                                       cudnnConvolutionFwdAlgo_t(algo_), b.workspace,
                                       b.workspace_bytes, &beta, y_, b.y));
    if (problem_.precision != Precision::kINT8) {
      apply_epilogue(problem_, b.y, b.bias, b.residual, stream);
      KILN_CUDA(cudaGetLastError());
    }
    return {};
  }

 private:
  int rank_;
  ConvProblem problem_;
  cudnnHandle_t handle_ = nullptr;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  float int8_alpha_ = 1.f;
  int algo_ = -1;
  cudnnMathType_t math_ = CUDNN_DEFAULT_MATH;
  bool found_ = false;
  std::string find_error_;
  size_t workspace_ = 0;
  DeviceBuffer weights_;
};

class CudnnLegacySource final : public ConvTacticSource {
 public:
  std::string family() const override { return "cudnn_legacy"; }
  bool supports(const ConvProblem& p, std::string* why) const override {
    if (!plain_problem(p, why)) return false;
    if (p.precision == Precision::kINT8 && (p.shape.c % 4 != 0 || p.shape.k % 4 != 0)) {
      *why = "INT8 needs C and K multiples of 4";
      return false;
    }
    float alpha = 0.f;
    return p.precision != Precision::kINT8 || int8_scalar_alpha(p, &alpha, why);
  }
  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem&, const LibraryHandles&,
                                                      std::string*) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    for (int r = 0; r < tactic_limits().max_legacy_algos; ++r) {
      out.push_back(std::make_unique<CudnnLegacyConvTactic>(r));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cudnn_legacy_source() {
  return std::make_unique<CudnnLegacySource>();
}

}  // namespace kiln::cuda
