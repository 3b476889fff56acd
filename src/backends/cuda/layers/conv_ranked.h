// What the library conv tactics' layers share (conv_fused.cpp for FP16/TF32, conv_int8_lib.cpp
// for INT8): a layer's variant is a rank in the library's own candidate list, and per problem
// shape the layer keeps the tactic of that rank, initialized and holding its weights.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "layer.h"
#include "tactics/conv_tactic.h"

namespace kiln::gpu {

// The candidate limits both layers use (the kernel study: precompiled engines win in FP16/TF32;
// runtime-compiled ones cost up to a second of NVRTC each, so at most one — the only kind cuDNN
// offers for some residual and INT8 graphs — is considered).
void use_layer_tactic_limits();

// The geometry the library conv tactics take: no dilation, square strides, symmetric padding
// (auto_pad NOTSET or VALID), and groups 1 unless `allow_groups` (cuDNN's graph API). Fills the
// problem's stride, pad and groups, or says why not.
bool library_conv_geometry(const Node& n, cuda::ConvProblem* p, std::string* why,
                           bool allow_groups = false);

// The fused epilogue the library tactics take: the node's activation (none, ReLU, or Clip(0, hi)
// as a clipped ReLU; `clip_with_residual` false: no clipped ReLU after a residual add; with
// `any_activation`, also Swish, Sigmoid, Tanh, GELU and LeakyRelu: cuDNN graph's pointwise modes)
// over bias [+ residual]. Fills p->epilogue, p->act, p->act_alpha and p->relu_clip, or says why
// not.
bool library_conv_epilogue(const Node& n, bool residual, bool clip_with_residual,
                           cuda::ConvProblem* p, std::string* why, bool any_activation = false);

// Runs library conv tactic t (that configure chose) on the layer's tensors (X, -, -, residual?) -> Y with `bias`; an
// empty output runs nothing.
Status run_library_conv(cuda::ConvTactic* t, const void* bias, const RunContext& rc,
                        std::span<const DeviceTensor> in, std::span<const DeviceTensor> out);

class RankedConvTactics {
 public:
  // `variant`: the rank ("" = 0). `tuning`: a rank the library does not offer is refused (the
  // tuner drops the variant); otherwise, at shapes other than the one tuned, the nearest rank.
  RankedConvTactics(const std::string& variant, bool tuning)
      : rank_(variant.empty() ? 0 : std::stoi(variant)), tuning_(tuning) {}

  // The tactic for problem `p` from `make_source()`'s candidates; on first use of a shape it is
  // initialized and given the weights `weights()` returns (device KRSC in the problem's type).
  Expected<cuda::ConvTactic*> get(
      const cuda::ConvProblem& p, const RunContext& rc,
      const std::function<std::unique_ptr<cuda::ConvTacticSource>()>& make_source,
      const std::function<Expected<const void*>()>& weights);

 private:
  int rank_;
  bool tuning_;
  std::map<std::string, std::unique_ptr<cuda::ConvTactic>> cache_;  // per problem shape
};

}  // namespace kiln::gpu
