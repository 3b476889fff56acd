// kiln's depthwise convolution (group = C = M, one filter per channel) on NHWC tensors, with
// bias, residual and activation fused: MobileNet's and EfficientNet's 3x3/5x5 layers. cuDNN runs
// these through its legacy grouped path (~1.2 ms for one 112x112 layer at batch 32, 20x the
// memory floor); here each thread makes V adjacent channels of one output pixel with 16-byte
// loads, the taps' inputs come from L1, and the weights are float [tap][C] for vector loads.
#include <algorithm>
#include <map>
#include <vector>

#include "device_util_host.h"
#include "tactics/check.h"
#include "kernels/device_util.cuh"
#include "layers/conv_common.h"

namespace kiln::gpu {
namespace {

struct DwParams {
  int N, H, W, C, P, Q, kh, kw, sh, sw, dh, dw, ph, pw;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
__global__ void dwconv_nhwc(const T* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ bias, const T* __restrict__ z,
                            T* __restrict__ y, DwParams p, ActParams act) {
  const int CV = p.C / V;
  const int total = p.N * p.P * p.Q * CV;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int cv = i % CV;
    int r = i / CV;
    const int q = r % p.Q;
    r /= p.Q;
    const int op = r % p.P;
    const int n = r / p.P;
    const int c0 = cv * V;
    float acc[V];
#pragma unroll
    for (int l = 0; l < V; ++l) acc[l] = bias ? bias[c0 + l] : 0.f;
    for (int a = 0; a < p.kh; ++a) {
      const int ih = op * p.sh - p.ph + a * p.dh;
      if (ih < 0 || ih >= p.H) continue;
      for (int b = 0; b < p.kw; ++b) {
        const int iw = q * p.sw - p.pw + b * p.dw;
        if (iw < 0 || iw >= p.W) continue;
        const Pack<T, V> xv = *reinterpret_cast<const Pack<T, V>*>(
            x + ((static_cast<int64_t>(n) * p.H + ih) * p.W + iw) * p.C + c0);
        const Pack<float, V> wv =
            *reinterpret_cast<const Pack<float, V>*>(w + (a * p.kw + b) * p.C + c0);
#pragma unroll
        for (int l = 0; l < V; ++l) acc[l] += load(xv.v, l) * wv.v[l];
      }
    }
    const int64_t yo = ((static_cast<int64_t>(n) * p.P + op) * p.Q + q) * p.C + c0;
    Pack<T, V> out;
    if (z) {
      const Pack<T, V> zv = *reinterpret_cast<const Pack<T, V>*>(z + yo);
#pragma unroll
      for (int l = 0; l < V; ++l) acc[l] += load(zv.v, l);
    }
#pragma unroll
    for (int l = 0; l < V; ++l) store(out.v, l, apply_act(acc[l], act));
    *reinterpret_cast<Pack<T, V>*>(y + yo) = out;
  }
}

bool depthwise_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.in_type(0).rank() != 4) return *why = "not 2-D", false;
  if (d.in[0].layout != Layout::kNHWC) return *why = "needs NHWC", false;
  if (d.in[0].dtype != DataType::kFloat16 && d.in[0].dtype != DataType::kFloat32)
    return *why = "float16 or float32 only", false;
  const Tensor* w = d.in_const(1);
  if (!w) return *why = "weights are not constant", false;
  if (n.input(2) && !d.in_const(2)) return *why = "the bias is not constant", false;
  const int64_t group = n.attrs.get_int("group", 1);
  if (group < 2 || w->rank() != 4 || w->shape()[0] != group || w->shape()[1] != 1)
    return *why = "not depthwise (group = C = M)", false;
  if (n.op_type == "FusedConv") {
    ActParams a;
    if (!read_activation(n.attrs, &a)) return *why = "unknown activation", false;
    if (n.input(3) && d.in_type(3).dims != d.out_type(0).dims)
      return *why = "the residual broadcasts", false;
  }
  return true;
}

class DepthwiseConvLayer final : public Layer {
 public:
  explicit DepthwiseConvLayer(const LayerDesc& d) : node_(d.node) {
    if (d.node->op_type == "FusedConv") read_activation(d.node->attrs, &act_);
    // Weights [C,1,kh,kw] -> float [kh*kw][C]; bias float [C]. Uploaded at the first configure.
    const Tensor& w = *d.in_const(1);
    const int64_t C = w.shape()[0], taps = w.shape()[2] * w.shape()[3];
    host_w_.resize(static_cast<size_t>(C * taps));
    for (int64_t c = 0; c < C; ++c)
      for (int64_t t = 0; t < taps; ++t)
        host_w_[static_cast<size_t>(t * C + c)] = static_cast<float>(w.at_double(c * taps + t));
    if (const Tensor* b = d.in_const(2)) {
      host_b_.resize(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) host_b_[static_cast<size_t>(c)] = static_cast<float>(b->at_double(c));
    }
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(ConvGeom g, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (g.N * g.out[0] * g.out[1] * g.C >= (int64_t(1) << 31) ||
        g.N * g.in[0] * g.in[1] * g.C >= (int64_t(1) << 31))
      return KILN_ERROR("{}: tensor too large for the depthwise kernel", node_->label());
    p_ = {static_cast<int>(g.N), static_cast<int>(g.in[0]), static_cast<int>(g.in[1]),
          static_cast<int>(g.C), static_cast<int>(g.out[0]), static_cast<int>(g.out[1]),
          static_cast<int>(g.kernel[0]), static_cast<int>(g.kernel[1]),
          static_cast<int>(g.stride[0]), static_cast<int>(g.stride[1]),
          static_cast<int>(g.dilation[0]), static_cast<int>(g.dilation[1]),
          static_cast<int>(g.pad_begin[0]), static_cast<int>(g.pad_begin[1])};
    if (!weights_.get()) {
      const size_t wb = host_w_.size() * sizeof(float), bb = host_b_.size() * sizeof(float);
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + bb + 16, "depthwise conv weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(weights_.get(), host_w_.data(), wb, "depthwise weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(bias_ptr(), host_b_.data(), bb, "depthwise bias"));
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    const DeviceTensor* z = in.size() > 3 && in[3].present() ? &in[3] : nullptr;
    const float* w = static_cast<const float*>(weights_.get());
    const float* b = host_b_.empty() ? nullptr : bias_ptr();
    const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
    const bool vec_ok = aligned(in[0].data) && aligned(out[0].data) && (!z || aligned(z->data));
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, float>) {
        constexpr int V = 16 / sizeof(T);
        const T* x = static_cast<const T*>(in[0].data);
        T* y = static_cast<T*>(out[0].data);
        const T* zp = z ? static_cast<const T*>(z->data) : nullptr;
        const int64_t pixels = int64_t(p_.N) * p_.P * p_.Q;
        if (vec_ok && p_.C % V == 0)
          dwconv_nhwc<T, V><<<grid_for(pixels * p_.C / V), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
        else
          dwconv_nhwc<T, 1><<<grid_for(pixels * p_.C), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
      }
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("depthwise conv kernel");
    return Status::Ok();
  }

 private:
  float* bias_ptr() const {
    // after the weights, 16-byte aligned
    const size_t off = (host_w_.size() * sizeof(float) + 15) / 16 * 16;
    return reinterpret_cast<float*>(static_cast<char*>(weights_.get()) + off);
  }
  const Node* node_;
  ActParams act_;
  std::vector<float> host_w_, host_b_;
  DeviceMemory weights_;
  DwParams p_{};
};

}  // namespace

bool depthwise_conv_supports(const LayerDesc& d, std::string* why) {
  return depthwise_supports(d, why);
}
Expected<std::unique_ptr<Layer>> create_depthwise_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new DepthwiseConvLayer(d));
}

}  // namespace kiln::gpu
