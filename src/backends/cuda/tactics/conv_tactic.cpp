#include "conv_tactic.h"

#include <cublasLt.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

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

bool Int8Epilogue::uniform_scale() const {
  for (float v : channel_scale) {
    if (v != channel_scale.front()) return false;
  }
  return true;
}

Int8Epilogue int8_epilogue(const ConvProblem& p) {
  Int8Epilogue e;
  if (p.channel_scale.empty()) {  // the per-tensor path
    e.channel_scale.assign(size_t(std::max(p.shape.k, 0)), p.int8_scale);
    return e;
  }
  e.channel_scale = p.channel_scale;
  e.bias = p.epilogue != Epilogue::kNone;
  e.residual = epilogue_has_residual(p.epilogue);
  e.relu = epilogue_has_relu(p.epilogue);
  e.relu_clip = e.relu ? p.relu_clip : 0.f;
  e.residual_scale = p.residual_scale;
  e.output_scale = p.output_scale;
  return e;
}

bool plain_problem(const ConvProblem& p, std::string* why) {
  if (p.shape.groups != 1) return *why = "grouped", false;
  if (epilogue_has_relu(p.epilogue) && p.act != Activation::kRelu)
    return *why = "an activation other than ReLU (cuDNN's graph API only)", false;
  return true;
}

bool int8_problem_valid(const ConvProblem& p, std::string* why) {
  if (p.precision != Precision::kINT8) return true;
  auto bad = [&](const std::string& m) {
    *why = m;
    return false;
  };
  if (p.channel_scale.empty()) {
    if (p.epilogue != Epilogue::kNone) return bad("INT8 per-tensor path takes no epilogue");
    if (!(std::isfinite(p.int8_scale) && p.int8_scale > 0)) return bad("int8_scale not > 0");
    return true;
  }
  if (p.channel_scale.size() != size_t(p.shape.k)) {
    return bad("channel_scale has " + std::to_string(p.channel_scale.size()) + " values for K " +
               std::to_string(p.shape.k));
  }
  for (float v : p.channel_scale) {
    if (!(std::isfinite(v) && v > 0)) return bad("channel_scale values must be finite and > 0");
  }
  if (!(std::isfinite(p.residual_scale) && p.residual_scale >= 0) ||
      !(std::isfinite(p.output_scale) && p.output_scale >= 0)) {
    return bad("residual_scale and output_scale must be finite and >= 0");
  }
  if (p.relu_clip < 0 || (p.relu_clip > 0 && !epilogue_has_relu(p.epilogue))) {
    return bad("relu_clip needs a ReLU epilogue");
  }
  return true;
}

bool int8_scalar_alpha(const ConvProblem& p, float* alpha, std::string* why) {
  if (!int8_problem_valid(p, why)) return false;
  const Int8Epilogue e = int8_epilogue(p);
  if (!e.uniform_scale() || e.bias || e.residual || e.relu || !e.int8_output()) {
    *why =
        "scalar alpha only: per-channel scales, bias, residual, ReLU and half output are not "
        "fused";
    return false;
  }
  *alpha = p.channel_scale.empty() ? p.int8_scale : e.channel_scale.front() / e.output_scale;
  return true;
}

size_t output_element_size(const ConvProblem& p) {
  if (p.precision == Precision::kINT8 && !p.channel_scale.empty() && !(p.output_scale > 0)) {
    return 2;  // half
  }
  return element_size(p.precision);
}

size_t residual_element_size(const ConvProblem& p) {
  if (p.precision == Precision::kINT8 && !(p.residual_scale > 0)) return 2;  // half
  return element_size(p.precision);
}

std::string ConvShape::str() const {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "n%d %dx%dx%d -> %d k%dx%d s%d p%d", n, h, w, c, k, r, s, stride,
                pad);
  if (groups != 1)
    std::snprintf(buf + std::strlen(buf), sizeof(buf) - std::strlen(buf), " g%d", groups);
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
  sources.push_back(make_cutlass_sm90_gemm_source());
  sources.push_back(make_cutlass_sm90_pconv_source());
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
