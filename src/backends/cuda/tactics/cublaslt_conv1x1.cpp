// 1x1 stride-1 convolutions as cuBLASLt GEMMs. In NHWC a 1x1 convolution is
//   Y[M = N*H*W][K] = X[M][C] * W[K][C]^T,
// which in cuBLASLt's column-major terms is D (K x M) = op_T(W: C x K) * X (C x M), the "TN" form
// that the INT8 IMMA kernels require. The bias(+ReLU) epilogue is fused; the residual comes in as
// C with beta = 1. INT8: int32 accumulation, D = sat(rne(act(alpha * acc + beta * C + bias))) in
// int8 (float scale type). The per-tensor path uses a host alpha; kiln's INT8 epilogue uses
// CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST with the 1/output scale folded in:
//   alpha[k] = channel_scale[k] / sy, beta = sz / sy (int8 residual as C), bias[k] / sy
// (a scaled copy made by cublasLtMatrixTransform), epilogue BIAS / RELU_BIAS / RELU. The bias is
// float32: for IMMA with int8 C the bias type is the scale type (cublasLt.h,
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE). Not fusable, refused by supports(): half output (IMMA's
// C/D are int8 with a float scale type, or int32), a half residual (C has D's type), a clipped
// ReLU (no such epilogue).
#include <cublasLt.h>

#include <memory>

#include "../kernels/conv_kernels.h"
#include "check.h"
#include "conv_sources.h"
#include "device_buffer.h"

namespace kiln::cuda {
namespace {

struct LtProblem {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  // INT8 epilogue (channel_scale set): device alpha vector, host beta, bias scaling.
  bool alpha_vector = false;
  DeviceBuffer alpha;  // K floats: channel_scale[k] / output_scale
  float beta = 0.f;    // residual_scale / output_scale with an int8 residual
  float bias_scale = 0.f;  // 1 / output_scale with a bias (scaled by a kiln kernel), else 0
  ~LtProblem() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    for (auto l : {a, b, c, d}) {
      if (l) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

// Why cuBLASLt cannot fuse an INT8 problem's epilogue, or "" when it can.
std::string int8_refusal(const ConvProblem& p) {
  if (p.precision != Precision::kINT8 || p.channel_scale.empty()) return {};
  const Int8Epilogue e = int8_epilogue(p);
  if (!e.int8_output()) return "IMMA writes D in int8 (float scale type) or int32, not half";
  if (e.residual && !e.int8_residual()) {
    return "the residual enters as C, which must have D's type (int8): a half residual is not "
           "fused";
  }
  if (e.relu_clip > 0) return "cuBLASLt has no clipped-ReLU epilogue";
  return {};
}

// kiln's INT8 epilogue on the matmul descriptor: alpha vector, beta, bias/ReLU epilogue.
Status set_int8_epilogue(const ConvProblem& p, LtProblem* lt) {
  const Int8Epilogue e = int8_epilogue(p);
  const float sy = e.output_scale;
  std::vector<float> alpha(e.channel_scale.size());
  for (size_t i = 0; i < alpha.size(); ++i) alpha[i] = e.channel_scale[i] / sy;
  if (!lt->alpha.allocate(alpha.size() * sizeof(float))) return Status::Error("alpha allocation");
  KILN_TRY(upload(lt->alpha.get(), alpha.data(), alpha.size() * sizeof(float), "cuBLASLt alpha upload"));
  lt->alpha_vector = true;
  lt->beta = e.int8_residual() ? e.residual_scale / sy : 0.f;
  const cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST;
  KILN_CUBLAS(
      cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
  const cublasLtEpilogue_t ep =
      e.relu ? (e.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU)
             : (e.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
  KILN_CUBLAS(
      cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  if (!e.bias) return {};
  const cudaDataType_t f32 = CUDA_R_32F;
  KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32,
                                             sizeof(f32)));
  lt->bias_scale = 1.f / sy;
  return {};
}

Status build_lt_problem(const ConvProblem& p, LtProblem* lt) {
  const ConvShape& s = p.shape;
  const int64_t m = int64_t(s.n) * s.h * s.w;
  cudaDataType_t io = CUDA_R_16F, scale = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (p.precision == Precision::kTF32) {
    io = CUDA_R_32F;
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  } else if (p.precision == Precision::kINT8) {
    io = CUDA_R_8I;
    compute = CUBLAS_COMPUTE_32I;
  }
  KILN_CUBLAS(cublasLtMatmulDescCreate(&lt->desc, compute, scale));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
  KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
  if (p.precision != Precision::kINT8 && p.epilogue != Epilogue::kNone) {
    const cublasLtEpilogue_t ep =
        epilogue_has_relu(p.epilogue) ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS(
        cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    const cudaDataType_t bias_type = io;
    KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                               &bias_type, sizeof(bias_type)));
  }
  if (p.precision == Precision::kINT8 && !p.channel_scale.empty()) {
    KILN_TRY(set_int8_epilogue(p, lt));
  }
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&lt->a, io, s.c, s.k, s.c));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&lt->b, io, s.c, m, s.c));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&lt->c, io, s.k, m, s.k));
  KILN_CUBLAS(cublasLtMatrixLayoutCreate(&lt->d, io, s.k, m, s.k));
  return {};
}

std::string algo_name(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    int32_t v = -1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    return std::to_string(v);
  };
  std::string name = "a";
  name += get(CUBLASLT_ALGO_CONFIG_ID);
  name += ".t" + get(CUBLASLT_ALGO_CONFIG_TILE_ID);
  name += ".s" + get(CUBLASLT_ALGO_CONFIG_STAGES_ID);
  name += ".k" + get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
  name += ".c" + get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
  return name;
}

class CublasLtConvTactic final : public ConvTactic {
 public:
  CublasLtConvTactic(std::shared_ptr<LtProblem> lt, cublasLtMatmulHeuristicResult_t h,
                     std::string name)
      : lt_(std::move(lt)), heur_(h), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::string family() const override { return "cublaslt"; }
  Status init(const ConvProblem& p, const LibraryHandles& h, cudaStream_t) override {
    problem_ = p;
    handle_ = h.cublaslt;
    // The scaled INT8 bias is made at the first run; its memory here (a run may be captured
    // into a CUDA graph, where nothing may be allocated).
    if (lt_->bias_scale != 0.f && !scaled_bias_.allocate(size_t(p.shape.k) * sizeof(float)))
      return Status::Error("INT8 bias allocation failed");
    return {};
  }
  size_t workspace_size() const override { return heur_.workspaceSize; }
  Status prepare_weights(const void* w, cudaStream_t stream) override {
    return copy_weights_krsc(weights_, problem_, w, stream);
  }
  Status run(const ConvBuffers& b, cudaStream_t stream) override {
    if (lt_->alpha_vector) return run_int8(b, stream);
    const bool residual = epilogue_has_residual(problem_.epilogue);
    if (problem_.precision != Precision::kINT8 && problem_.epilogue != Epilogue::kNone) {
      KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt_->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &b.bias, sizeof(b.bias)));
    }
    const float alpha = problem_.precision == Precision::kINT8 ? problem_.int8_scale : 1.f;
    const float beta = residual ? 1.f : 0.f;
    const void* c = residual ? b.residual : b.y;
    KILN_CUBLAS(cublasLtMatmul(handle_, lt_->desc, &alpha, weights_.get(), lt_->a, b.x, lt_->b,
                               &beta, c, lt_->c, b.y, lt_->d, &heur_.algo, b.workspace,
                               b.workspace_bytes, stream));
    return {};
  }

 private:
  // kiln's INT8 epilogue: alpha is the device vector, beta a host value, the bias a scaled copy
  // (remade when the bias pointer changes; its contents are a constant of the layer).
  Status run_int8(const ConvBuffers& b, cudaStream_t stream) {
    const bool residual = epilogue_has_residual(problem_.epilogue);
    if (lt_->bias_scale != 0.f) {
      if (b.bias != scaled_from_) {
        scale_floats(static_cast<const float*>(b.bias), static_cast<float*>(scaled_bias_.get()),
                     problem_.shape.k, lt_->bias_scale, stream);
        KILN_CUDA(cudaGetLastError());
        scaled_from_ = b.bias;
      }
      const void* bias = scaled_bias_.get();
      KILN_CUBLAS(cublasLtMatmulDescSetAttribute(lt_->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &bias, sizeof(bias)));
    }
    const void* c = residual ? b.residual : b.y;
    KILN_CUBLAS(cublasLtMatmul(handle_, lt_->desc, lt_->alpha.get(), weights_.get(), lt_->a, b.x,
                               lt_->b, &lt_->beta, c, lt_->c, b.y, lt_->d, &heur_.algo, b.workspace,
                               b.workspace_bytes, stream));
    return {};
  }

  std::shared_ptr<LtProblem> lt_;
  cublasLtMatmulHeuristicResult_t heur_;
  std::string name_;
  ConvProblem problem_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer weights_;
  DeviceBuffer scaled_bias_;  // INT8: bias / output_scale
  const void* scaled_from_ = nullptr;
};

class CublasLtSource final : public ConvTacticSource {
 public:
  std::string family() const override { return "cublaslt"; }
  bool supports(const ConvProblem& p, std::string* why) const override {
    if (!plain_problem(p, why)) return false;
    if (!p.shape.is_1x1_s1()) {
      *why = "not a 1x1 stride-1 convolution";
      return false;
    }
    if (p.precision == Precision::kINT8 && (p.shape.c % 4 != 0 || p.shape.k % 4 != 0)) {
      *why = "IMMA needs C and K multiples of 4";
      return false;
    }
    if (!int8_problem_valid(p, why)) return false;
    const std::string refusal = int8_refusal(p);
    if (!refusal.empty()) *why = refusal;
    return refusal.empty();
  }
  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem& p, const LibraryHandles& h,
                                                      std::string* note) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    auto lt = std::make_shared<LtProblem>();
    Status s = build_lt_problem(p, lt.get());
    if (!s.ok()) {
      *note = s.message();
      return out;
    }
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) {
      *note = "cublasLtMatmulPreferenceCreate failed";
      return out;
    }
    const size_t ws = std::min<size_t>(h.max_workspace_bytes, size_t(64) << 20);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    std::vector<cublasLtMatmulHeuristicResult_t> results(
        size_t(std::max(tactic_limits().max_cublaslt_algos, 1)));
    int returned = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(h.cublaslt, lt->desc, lt->a, lt->b, lt->c, lt->d, pref,
                                       int(results.size()), results.data(), &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS || returned == 0) {
      *note = cublas_status(hs, "cublasLtMatmulAlgoGetHeuristic").message() +
              (returned == 0 ? " (no algorithm)" : "");
      return out;
    }
    for (int i = 0; i < returned; ++i) {
      if (results[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
      const std::string name = std::string("cublaslt.") + precision_name(p.precision) + ".h" +
                               std::to_string(i) + "." + algo_name(results[size_t(i)].algo);
      out.push_back(std::make_unique<CublasLtConvTactic>(lt, results[size_t(i)], name));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cublaslt_source() {
  return std::make_unique<CublasLtSource>();
}

}  // namespace kiln::cuda
