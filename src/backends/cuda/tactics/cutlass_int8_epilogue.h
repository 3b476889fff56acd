// kiln's INT8 epilogue (conv_tactic.h) as the constants of CUTLASS's
// PerColLinCombPerColBiasEltAct<Clamp> fusion, shared by the sm90 conv (cutlass_sm90_conv.cu),
// GEMM (cutlass_sm90_gemm.cu) and persistent conv (cutlass_sm90_pconv.cu) tactics:
//   y = clamp(alpha[k] * acc + bias'[k] + beta * z, lower, upper) -> int8 (round half to even,
//   saturating), with alpha = cs / sy, beta = sz / sy (int8 residual as C), bias' = bias / sy
// (scaled on the device, remade when the bias pointer changes) and the clamp bounds giving none,
// ReLU or clipped ReLU (y / sy commutes with the clamp at 0 and with its upper bound).
// Host code; it names no CUTLASS type itself (cutlass_status is a template).
#pragma once

#include <cuda_runtime.h>

#include <limits>
#include <string>
#include <vector>

#include "../kernels/conv_kernels.h"
#include "check.h"
#include "conv_tactic.h"
#include "device_buffer.h"

namespace kiln::cuda {

// Why the CUTLASS INT8 kernels cannot take a problem, or "" when they can: INT8 only, C and K
// multiples of 16 (TMA's 16-byte aligned rows), and, as the fused kernels, int8 output only and
// an int8 residual only (half outputs and residuals are not compiled).
inline std::string cutlass_int8_refusal(const ConvProblem& p) {
  if (p.precision != Precision::kINT8) return "only the INT8 kernels are compiled";
  if (p.shape.c % 16 != 0 || p.shape.k % 16 != 0)
    return "TMA needs C and K multiples of 16 int8 elements";
  std::string why;
  if (!int8_problem_valid(p, &why)) return why;
  const Int8Epilogue e = int8_epilogue(p);
  if (!e.int8_output()) return "the compiled kernels write int8 only, not half";
  if (e.residual && !e.int8_residual()) return "the compiled kernels read an int8 residual only";
  return {};
}

// A CUTLASS status as a Status naming the call (S is cutlass::Status; the caller includes
// CUTLASS).
template <class S>
Status cutlass_status(S s, const char* what) {
  if (s == S::kSuccess) return {};
  return Status::Error(std::string(what) + ": " + cutlassGetStatusString(s));
}

class CutlassInt8Constants {
 public:
  Status init(const ConvProblem& p) {
    const std::string why = cutlass_int8_refusal(p);
    if (!why.empty()) return Status::Error(why);
    const Int8Epilogue e = int8_epilogue(p);
    const float sy = e.output_scale;
    std::vector<float> alpha(e.channel_scale.size());
    for (size_t i = 0; i < alpha.size(); ++i) alpha[i] = e.channel_scale[i] / sy;
    k_ = static_cast<int>(alpha.size());
    if (!alpha_.allocate(alpha.size() * sizeof(float)) ||
        !scaled_bias_.allocate(alpha.size() * sizeof(float))) {
      return Status::Error("alpha/bias allocation failed");
    }
    KILN_TRY(
        upload(alpha_.get(), alpha.data(), alpha.size() * sizeof(float), "CUTLASS alpha upload"));
    beta_ = e.int8_residual() ? e.residual_scale / sy : 0.f;
    bias_scale_ = e.bias ? 1.f / sy : 0.f;
    lower_ = e.relu ? 0.f : std::numeric_limits<float>::lowest();
    upper_ = e.relu_clip > 0 ? e.relu_clip / sy : std::numeric_limits<float>::max();
    scaled_from_ = nullptr;
    return {};
  }

  // The bias divided by the output scale, remade when the bias pointer changes (a constant).
  Status refresh_bias(const void* bias, cudaStream_t stream) {
    if (bias_scale_ == 0 || bias == scaled_from_) return {};
    scale_floats(static_cast<const float*>(bias), scaled_bias_.as<float>(), k_, bias_scale_,
                 stream);
    KILN_CUDA(cudaGetLastError());
    scaled_from_ = bias;
    return {};
  }

  // Fills a PerColLinCombPerColBiasEltAct<Clamp> argument struct (CUTLASS's epilogue.thread).
  template <class ThreadArgs>
  void fill(ThreadArgs& t) const {
    t.alpha_ptr = alpha_.as<float>();
    t.beta = beta_;
    t.bias_ptr = bias_scale_ != 0 ? scaled_bias_.as<float>() : nullptr;
    t.activation.lower_bound = lower_;
    t.activation.upper_bound = upper_;
  }

 private:
  int k_ = 0;
  DeviceBuffer alpha_, scaled_bias_;
  float beta_ = 0.f, bias_scale_ = 0.f, lower_ = 0.f, upper_ = 0.f;
  const void* scaled_from_ = nullptr;
};

// One execution of a CUTLASS device adapter (GemmUniversalAdapter or ConvUniversalAdapter).
// initialize() builds TMA descriptors on the host, so it is redone only when a pointer differs
// from the last run's. Without a residual the fused kernels read y as C (times beta = 0, so C is
// never loaded: C has no "absent"). make_args(x, c, y) gives the adapter's Arguments; constants
// (the fused kernels' only, else null) rescale a bias whose pointer changed.
class CutlassRunner {
 public:
  template <class Adapter, class MakeArgs>
  Status run(Adapter& op, const ConvProblem& p, const ConvBuffers& b,
             CutlassInt8Constants* constants, cudaStream_t stream, MakeArgs make_args) {
    const void* c = epilogue_has_residual(p.epilogue) ? b.residual : b.y;
    if (b.x != x_ || b.y != y_ || b.workspace != ws_ || c != c_) {
      auto args = make_args(b.x, c, b.y);
      KILN_TRY(cutlass_status(op.initialize(args, b.workspace, stream), "initialize"));
      x_ = b.x;
      c_ = c;
      y_ = b.y;
      ws_ = b.workspace;
    }
    if (constants) KILN_TRY(constants->refresh_bias(b.bias, stream));
    KILN_TRY(cutlass_status(op.run(stream), "run"));
    KILN_CUDA(cudaGetLastError());
    return {};
  }

 private:
  const void* x_ = nullptr;
  const void* c_ = nullptr;
  void* y_ = nullptr;
  void* ws_ = nullptr;
};

}  // namespace kiln::cuda
