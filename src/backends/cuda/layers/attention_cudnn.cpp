// kiln.MultiHeadAttention on cuDNN's fused attention (`mha.cudnn`): the SDPA node of cuDNN's
// frontend graph API (header-only C++, PyPI's nvidia-cudnn-frontend), FP16 with float
// statistics, inference only (no softmax statistics written). Q, K and V are described to cuDNN
// as [B, H, S, D] through the projections' own strides (packed QKV: one tensor, three offsets),
// and Y as [B, H, Sq, Dv] over the merged [B, Sq, H*Dv] layout, so the head split and merge cost
// nothing, as in mha.flash; the additive mask is cuDNN's bias, broadcast over batch and heads
// where it has one of them. One graph per shape, built at configure and kept; the tuner times it
// against mha.flash. Built only with the frontend's headers (src/backends/cuda/CMakeLists.txt).
// cuDNN writes 0 for a row the mask removes entirely: it takes masked attention only where kiln's
// nan_to_zero asks for that (SDPA's exports); unmasked attention (ViT) always.
#if KILN_HAVE_CUDNN_FRONTEND
#include <cmath>
#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include "layers/attention_mha.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "tactics.h"

// The frontend reaches cuDNN through this handle (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING): the
// libcudnn.so.9 kiln already links, opened by cudnn_handle().
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace kiln::gpu {
namespace {

namespace fe = cudnn_frontend;

bool cudnn_handle() {
  static const bool ok = [] {
    cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_NOLOAD);
    if (!cudnn_frontend::cudnn_dlhandle)
      cudnn_frontend::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW);
    return cudnn_frontend::cudnn_dlhandle != nullptr;
  }();
  return ok;
}

enum Uid : int64_t { kQ = 1, kK, kV, kBias, kY };

Status fe_check(fe::error_t e, const Node& n, const char* step) {
  if (e.is_good()) return Status::Ok();
  return KILN_ERROR("{}: cuDNN's fused attention: {}: {}", n.label(), step, e.get_message());
}

class CudnnMhaLayer final : public Layer {
 public:
  explicit CudnnMhaLayer(const LayerDesc& d) : node_(d.node) {
    scale_ = d.node->attrs.get_float("scale", 1.f);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    KILN_ASSIGN_OR_RETURN(s_, mha_shape(n, in, out[0]));
    if (s_.Dv != s_.D) return KILN_ERROR("{}: mha.cudnn takes V's head size as Q's", n.label());
    mask_ = in.size() > 3 && in[3].present() ? in[3].dtype : DataType::kUndefined;
    ptrs_ = {{kQ, nullptr}, {kK, nullptr}, {kV, nullptr}, {kY, nullptr}};
    if (mask_ != DataType::kUndefined) ptrs_[kBias] = nullptr;
    std::array<int64_t, 4> ms{};
    if (mask_ != DataType::kUndefined) {
      KILN_ASSIGN_OR_RETURN(ms, mask_strides(n, in[3], s_));
    }
    if (s_.B == 0 || s_.Sq == 0 || s_.Sk == 0) return size_t{0};
    const auto key = std::make_tuple(s_.B, s_.Sq, s_.Sk, ms[0], ms[1], ms[2], ms[3]);
    auto& g = graphs_[key];
    if (!g) {
      KILN_ASSIGN_OR_RETURN(g, build(rc, ms));
    }
    graph_ = g.get();
    int64_t ws = 0;
    KILN_RETURN_IF_ERROR(fe_check(graph_->get_workspace_size(ws), n, "workspace size"));
    return static_cast<size_t>(ws);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (s_.B == 0 || s_.Sq == 0) return Status::Ok();
    if (s_.Sk == 0) return KILN_ERROR("{}: no keys (sequence length 0)", node_->label());
    auto bytes = [](const DeviceTensor& t) { return static_cast<char*>(const_cast<void*>(t.data)); };
    char* q = bytes(in[0]);
    char* k = s_.packed ? q : bytes(in[1]);
    char* v = s_.packed ? q : bytes(in[2]);
    constexpr int64_t kHalf = 2;  // bytes of a float16
    ptrs_[kQ] = q + s_.q_off * kHalf;  // the keys exist: no allocation per inference
    ptrs_[kK] = k + s_.k_off * kHalf;
    ptrs_[kV] = v + s_.v_off * kHalf;
    ptrs_[kY] = out[0].data;
    if (mask_ != DataType::kUndefined) ptrs_[kBias] = const_cast<void*>(in[3].data);
    return fe_check(graph_->execute(rc.cudnn, ptrs_, rc.workspace), *node_, "execute");
  }

 private:
  Expected<std::unique_ptr<fe::graph::Graph>> build(const RunContext& rc,
                                                    const std::array<int64_t, 4>& ms) {
    const Node& n = *node_;
    if (!cudnn_handle()) return KILN_ERROR("{}: mha.cudnn: cannot open libcudnn.so.9", n.label());
    auto g = std::make_unique<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto tensor = [&](const char* name, int64_t uid, int i, int64_t heads, int64_t s) {
      // [B, H, S, D]: batch, head, row and element strides in the projection's (or a KV
      // cache's) layout (K and V with Hkv heads: cuDNN's SDPA takes grouped-query attention so).
      return g->tensor(fe::graph::Tensor_attributes()
                           .set_name(name)
                           .set_uid(uid)
                           .set_dim({s_.B, heads, s, s_.D})
                           .set_stride({s_.stride_b(i), s_.stride_h(i), s_.stride_s(i), 1}));
    };
    auto q = tensor("Q", kQ, 0, s_.H, s_.Sq);
    auto k = tensor("K", kK, 1, s_.Hkv, s_.Sk);
    auto v = tensor("V", kV, 2, s_.Hkv, s_.Sk);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("mha")
                       .set_generate_stats(false)
                       .set_attn_scale(scale_);
    if (mask_ != DataType::kUndefined) {
      // cuDNN's bias is [B or 1, H or 1, Sq, Sk]; a mask broadcast over Sq or Sk keeps the
      // full extent with stride 0 (cuDNN may refuse it: the build then fails and the tuner
      // keeps mha.flash).
      auto bias = g->tensor(
          fe::graph::Tensor_attributes()
              .set_name("bias")
              .set_uid(kBias)
              .set_dim({ms[0] ? s_.B : 1, ms[1] ? s_.H : 1, s_.Sq, s_.Sk})
              .set_stride({ms[0] ? ms[0] : 1, ms[1] ? ms[1] : 1, ms[2], ms[3]})
              .set_data_type(mask_ == DataType::kFloat16 ? fe::DataType_t::HALF
                                                         : fe::DataType_t::FLOAT));
      options.set_bias(bias);
    }
    auto [y, stats] = g->sdpa(q, k, v, options);
    (void)stats;
    y->set_output(true)
        .set_uid(kY)
        .set_dim({s_.B, s_.H, s_.Sq, s_.D})
        .set_stride({s_.batch_stride(s_.Sq, s_.H * s_.D), s_.D, s_.seq_stride(s_.H * s_.D), 1});
    KILN_RETURN_IF_ERROR(fe_check(g->validate(), n, "validate"));
    KILN_RETURN_IF_ERROR(fe_check(g->build_operation_graph(rc.cudnn), n, "operation graph"));
    KILN_RETURN_IF_ERROR(
        fe_check(g->create_execution_plans({fe::HeurMode_t::A}), n, "execution plans"));
    KILN_RETURN_IF_ERROR(fe_check(g->check_support(rc.cudnn), n, "support"));
    KILN_RETURN_IF_ERROR(fe_check(g->build_plans(), n, "plans"));
    return g;
  }

  const Node* node_;
  float scale_ = 1.f;
  MhaShape s_;
  DataType mask_ = DataType::kUndefined;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
  std::map<Key, std::unique_ptr<fe::graph::Graph>> graphs_;  // by shape and mask strides
  fe::graph::Graph* graph_ = nullptr;                         // this shape's
  std::unordered_map<int64_t, void*> ptrs_;                   // the variant pack, by uid
};

}  // namespace

namespace {
bool finite_constant(const Tensor* t) {
  if (!t) return false;
  for (int64_t i = 0; i < t->numel(); ++i)
    if (!std::isfinite(t->at_double(i))) return false;
  return true;
}
}  // namespace

bool mha_cudnn_supports(const LayerDesc& d, std::string* why) {
  if (mha_has_rotary(*d.node)) return *why = "the rotary is applied only by mha.flash", false;
  int64_t dq = 0, dv = 0;
  if (!mha_f16_head_sizes(d, &dq, &dv, why)) return false;
  if (dq % 8 != 0 || dq > 256 || dv != dq)
    return *why = "head sizes up to 256, multiples of 8, V's as Q's", false;
  // cuDNN 9's SDPA takes heads up to 256 on Hopper (up to 128 on older GPUs: the graph's
  // support check then fails at configure, and the tuner drops the candidate).
  // cuDNN writes 0 for a row the mask removes entirely (test-backend-ops' mha_masked_row_nan):
  // kiln's nan_to_zero, where ONNX's softmax gives NaN.
  // A constant mask of finite values (a relative-position bias: Swin, BEiT) removes no row, so
  // the two agree there.
  const bool masked = d.node->num_inputs() > 3 && d.node->input(3) != nullptr;
  if (masked && d.node->attrs.get_int("nan_to_zero", 0) == 0 && !finite_constant(d.in_const(3)))
    return *why = "a row the mask removes entirely is 0 here, NaN without nan_to_zero", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_mha_cudnn(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new CudnnMhaLayer(d));
}

}  // namespace kiln::gpu
#endif  // KILN_HAVE_CUDNN_FRONTEND
