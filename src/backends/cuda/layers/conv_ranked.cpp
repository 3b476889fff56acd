#include "layers/conv_ranked.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "kernels/activation.cuh"

namespace kiln::gpu {

void use_layer_tactic_limits() {
  cuda::TacticLimits limits;
  limits.max_cudnn_graph_configs = 6;
  limits.max_cudnn_rtc_configs = 1;
  limits.max_cublaslt_algos = 3;
  cuda::set_tactic_limits(limits);
}

bool library_conv_geometry(const Node& n, cuda::ConvProblem* p, std::string* why,
                           bool allow_groups) {
  const int64_t group = n.attrs.get_int("group", 1);
  if (group != 1 && !allow_groups) return *why = "grouped", false;
  if (group < 1 || group > (int64_t(1) << 30)) return *why = "bad group count", false;
  p->shape.groups = static_cast<int>(group);
  for (int64_t v : n.attrs.get_ints("dilations", {1, 1}))
    if (v != 1) return *why = "dilated", false;
  const auto st = n.attrs.get_ints("strides", {1, 1});
  if (st.size() != 2 || st[0] != st[1]) return *why = "non-square strides", false;
  const std::string ap = n.attrs.get_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID") return *why = "auto_pad", false;
  const auto pads = n.attrs.get_ints("pads", {0, 0, 0, 0});
  if (pads.size() != 4 || pads[0] != pads[1] || pads[0] != pads[2] || pads[0] != pads[3])
    return *why = "asymmetric or non-square padding", false;
  p->shape.stride = static_cast<int>(st[0]);
  p->shape.pad = static_cast<int>(pads[0]);
  return true;
}

bool library_conv_epilogue(const Node& n, bool residual, bool clip_with_residual,
                           cuda::ConvProblem* p, std::string* why, bool any_activation) {
  const std::string act = n.attrs.get_string("activation", "");
  const bool clip = act == "Clip" && n.attrs.get_float("act_min", -1.f) == 0.f &&
                    n.attrs.get_float("act_max", 0.f) > 0.f && (clip_with_residual || !residual);
  p->act = cuda::Activation::kRelu;
  if (!act.empty() && act != "Relu" && !clip) {
    ActParams a;
    if (!any_activation || !read_activation(n.attrs, &a)) return *why = "activation " + act, false;
    // The activations cuDNN's graph has a pointwise mode for (HardSwish: a few of them).
    static constexpr std::pair<Act, cuda::Activation> kModes[] = {
        {Act::kSwish, cuda::Activation::kSwish},
        {Act::kSigmoid, cuda::Activation::kSigmoid},
        {Act::kTanh, cuda::Activation::kTanh},
        {Act::kGelu, cuda::Activation::kGelu},
        {Act::kGeluTanh, cuda::Activation::kGeluTanh},
        {Act::kLeakyRelu, cuda::Activation::kLeakyRelu},
        {Act::kHardSwish, cuda::Activation::kHardSwish}};
    const auto* m = std::find_if(std::begin(kModes), std::end(kModes),
                                 [&](const auto& e) { return e.first == a.act; });
    if (m == std::end(kModes))
      return *why = "activation " + act + " (no pointwise mode in cuDNN)", false;
    p->act = m->second;
    p->act_alpha = a.alpha;
  }
  const bool relu = !act.empty();
  p->epilogue = residual ? (relu ? cuda::Epilogue::kBiasAddRelu : cuda::Epilogue::kBiasAdd)
                         : (relu ? cuda::Epilogue::kBiasRelu : cuda::Epilogue::kBias);
  p->relu_clip = clip ? n.attrs.get_float("act_max", 0.f) : 0.f;
  return true;
}

Status run_library_conv(cuda::ConvTactic* t, const void* bias, const RunContext& rc,
                        std::span<const DeviceTensor> in, std::span<const DeviceTensor> out) {
  if (out[0].numel() == 0) return Status::Ok();
  cuda::ConvBuffers b;
  b.x = in[0].data;
  b.bias = bias;
  b.residual = in.size() > 3 && in[3].present() ? in[3].data : nullptr;
  b.y = out[0].data;
  b.workspace = rc.workspace;
  b.workspace_bytes = rc.workspace_bytes;
  if (!t) return KILN_ERROR("the layer was not configured");
  return t->run(b, rc.stream);
}

Expected<cuda::ConvTactic*> RankedConvTactics::get(
    const cuda::ConvProblem& p, const RunContext& rc,
    const std::function<std::unique_ptr<cuda::ConvTacticSource>()>& make_source,
    const std::function<Expected<const void*>()>& weights) {
  const std::string key = p.shape.str();
  if (auto it = cache_.find(key); it != cache_.end()) return it->second.get();
  auto src = make_source();
  if (!src) return KILN_ERROR("this build has no such library path");
  std::string why;
  if (!src->supports(p, &why)) return Status::Error(why);
  cuda::LibraryHandles h{rc.cudnn, rc.cublaslt, rc.workspace_limit};
  std::string note;
  auto cands = src->candidates(p, h, &note);
  if (cands.empty()) return KILN_ERROR("no candidate ({})", note);
  if (tuning_ && static_cast<size_t>(rank_) >= cands.size())
    return KILN_ERROR("the library offers only {} candidates", cands.size());
  std::unique_ptr<cuda::ConvTactic> t =
      std::move(cands[std::min<size_t>(static_cast<size_t>(rank_), cands.size() - 1)]);
  KILN_RETURN_IF_ERROR(t->init(p, h, rc.stream));
  KILN_ASSIGN_OR_RETURN(const void* w, weights());
  KILN_RETURN_IF_ERROR(t->prepare_weights(w, rc.stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(rc.stream));
  return cache_.emplace(key, std::move(t)).first->second.get();
}

}  // namespace kiln::gpu
