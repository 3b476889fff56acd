#include "conv_tactic.h"

#include <cublasLt.h>
#include <cudnn.h>

#include <cstdio>

#include "check.h"
#include "conv_sources.h"
#include "device_buffer.h"

namespace kiln::cuda {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFP16:
      return "fp16";
    case Precision::kTF32:
      return "tf32";
    case Precision::kINT8:
      return "int8";
  }
  return "?";
}

size_t element_size(Precision p) {
  switch (p) {
    case Precision::kFP16:
      return 2;
    case Precision::kTF32:
      return 4;
    case Precision::kINT8:
      return 1;
  }
  return 0;
}

Status copy_weights_krsc(DeviceBuffer& dst, const ConvProblem& problem, const void* weights,
                         cudaStream_t stream) {
  const size_t bytes = size_t(problem.shape.w_elems()) * element_size(problem.precision);
  if (!dst.allocate(bytes)) return Status::Error("weights allocation failed");
  KILN_CUDA(cudaMemcpyAsync(dst.get(), weights, bytes, cudaMemcpyDeviceToDevice, stream));
  return {};
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::kNone:
      return "none";
    case Epilogue::kBias:
      return "bias";
    case Epilogue::kBiasRelu:
      return "bias+relu";
    case Epilogue::kBiasAddRelu:
      return "bias+add+relu";
    case Epilogue::kBiasAdd:
      return "bias+add";
  }
  return "?";
}

std::string ConvShape::str() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "n%d %dx%dx%d -> %d k%dx%d s%d p%d", n, h, w, c, k, r, s, stride,
                pad);
  return buf;
}

namespace {
TacticLimits g_limits;
}

void set_tactic_limits(const TacticLimits& limits) { g_limits = limits; }
const TacticLimits& tactic_limits() { return g_limits; }

std::vector<std::unique_ptr<ConvTacticSource>> make_conv_tactic_sources() {
  std::vector<std::unique_ptr<ConvTacticSource>> sources;
  sources.push_back(make_cudnn_graph_source());
  sources.push_back(make_cudnn_legacy_source());
  sources.push_back(make_cublaslt_source());
#if KILN_HAVE_CUTLASS
  sources.push_back(make_cutlass_sm90_source());
#endif
  return sources;
}

std::string library_versions() {
  int cuda_rt = 0, driver = 0;
  cudaRuntimeGetVersion(&cuda_rt);
  cudaDriverGetVersion(&driver);
  std::string s = "cudart " + std::to_string(cuda_rt) + ", driver " + std::to_string(driver) +
                  ", cuDNN " + std::to_string(cudnnGetVersion()) + " (built with " +
                  std::to_string(CUDNN_VERSION) + "), cuBLASLt " +
                  std::to_string(cublasLtGetVersion());
#if KILN_HAVE_CUTLASS
  s += ", CUTLASS " + std::string(KILN_CUTLASS_VERSION);
#else
  s += ", CUTLASS not built";
#endif
  return s;
}

}  // namespace kiln::cuda
