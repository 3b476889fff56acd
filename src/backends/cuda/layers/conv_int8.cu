// kiln's INT8 layers (docs/quantization.md): kiln.FusedConv and kiln.FusedGemm with int8 = 1 as
// one implicit GEMM on int8 codes with int32 accumulation and the fused float epilogue
//
//   y = float(acc) * (sx * sw[c])  [* alpha]  [+ b[c]]  [+ z | + q(z) * sz]  -> act -> y | q(y/sy)
//
// computed with explicitly rounded float operations in the CPU reference's order, so that the
// result equals src/ops/fused_int8.cpp's (up to the activation functions' last bit).
//
// The convolution reads X NHWC (C % 4 == 0: four channels make one 32-bit word) and int8 KRSC
// weights quantized once from the float constant (quant::quantize_weights); a FusedGemm is the
// same problem with H = W = R = S = 1 (rows of X are the pixels). Two kernels, two tactics the
// tuner times against each other and the float ones:
//   mma:  tensor cores (mma.sync m16n8k32 s8, sm_80+): a block computes 128 pixels x 64
//         channels, 8 warps of 32 x 32, staging 64 codes of the reduction per step in two
//         shared-memory buffers (the next step's loads overlap this step's multiplies);
//   dp4a: SIMT __dp4a, 64 x 64 tiles, 4 x 4 outputs per thread (the simple reference kernel).
// Not yet: cp.async (loads straight to shared memory), ldmatrix, wider global loads.
#include <algorithm>
#include <vector>

#include "device_util_host.h"
#include "tactics/check.h"
#include "kernels/device_util.cuh"
#include "kernels/int8.cuh"
#include "layers/conv_common.h"
#include "layers/conv_int8.cuh"
#include "quant/int8.h"

namespace kiln::gpu {
namespace {

constexpr int kTileM = 64, kTileN = 64, kTileK = 8;  // pixels, channels, 32-bit words
constexpr int kThreads = 256;

template <typename Out>
__device__ __forceinline__ void epilogue(int32_t acc, int64_t i, int k, const Int8Epilogue& e,
                                         Out* y) {
  float z = 0.f;
  if (e.z) {
    if (e.z_type == DataType::kInt8)
      z = dequantize_code(static_cast<const int8_t*>(e.z)[i], e.sz);
    else if (e.z_type == DataType::kFloat16)
      z = __half2float(static_cast<const __half*>(e.z)[i]);
    else
      z = static_cast<const float*>(e.z)[i];
  }
  const float v = epilogue_value(acc, k, e, e.z != nullptr, z);
  if constexpr (std::is_same_v<Out, int8_t>)
    y[i] = quantize_code(v, e.sy);
  else
    store(y, i, v);
}

// The epilogue as a call: inlined 32 times it made the mma kernel's loop too large to unroll,
// which put the accumulators in local memory.
template <typename Out>
__device__ __noinline__ void epilogue_call(int32_t acc, int64_t i, int k, const Int8Epilogue& e,
                                           Out* y) {
  epilogue(acc, i, k, e, y);
}

// x: NHWC int8 viewed as words [N][H][W][C4]; w: KRSC int8 as words [K][R*S*C4];
// y: [M][K] (NHWC, or the Gemm's row-major output).
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    int8_conv_dp4a(const int32_t* __restrict__ x, const int32_t* __restrict__ w,
                   Out* __restrict__ y, Int8Geom g, Int8Epilogue e) {
  __shared__ __align__(16) int32_t xs[kTileK][kTileM + 4];
  __shared__ __align__(16) int32_t ws[kTileK][kTileN + 4];
  const int tid = threadIdx.x;
  const int m0 = blockIdx.x * kTileM, k0 = blockIdx.y * kTileN;
  // This thread loads word `kk` of pixel rows `lr` and `lr + 32` and of channels `k0 + lr`, +32.
  const int kk = tid % kTileK, lr = tid / kTileK;
  int pn[2], ph[2], pq[2];
  bool pvalid[2];
  for (int e2 = 0; e2 < 2; ++e2) {
    const int m = m0 + lr + 32 * e2;
    pvalid[e2] = m < g.M;
    const int mm = pvalid[e2] ? m : 0;
    pq[e2] = mm % g.Q;
    ph[e2] = (mm / g.Q) % g.P;
    pn[e2] = mm / (g.Q * g.P);
  }
  int32_t acc[4][4] = {};
  const int tx = tid % 16, ty = tid / 16;  // outputs: pixels ty*4.., channels tx*4..
  for (int kw0 = 0; kw0 < g.KW; kw0 += kTileK) {
    const int kw = kw0 + kk;
    const bool kin = kw < g.KW;
    const int c4 = kin ? kw % g.C4 : 0;
    const int rs = kin ? kw / g.C4 : 0;
    const int r = rs / g.S, s = rs % g.S;
    for (int e2 = 0; e2 < 2; ++e2) {
      int32_t v = 0;
      const int ih = ph[e2] * g.sh - g.ph + r * g.dh, iw = pq[e2] * g.sw - g.pw + s * g.dw;
      if (kin && pvalid[e2] && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
        v = x[((static_cast<int64_t>(pn[e2]) * g.H + ih) * g.W + iw) * g.C4 + c4];
      xs[kk][lr + 32 * e2] = v;
      const int k = k0 + lr + 32 * e2;
      ws[kk][lr + 32 * e2] = kin && k < g.K ? w[static_cast<int64_t>(k) * g.KW + kw] : 0;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTileK; ++t) {
      const int4 a = *reinterpret_cast<const int4*>(&xs[t][ty * 4]);
      const int4 b = *reinterpret_cast<const int4*>(&ws[t][tx * 4]);
      const int av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + ty * 4 + i;
    if (m >= g.M) continue;
    for (int j = 0; j < 4; ++j) {
      const int k = k0 + tx * 4 + j;
      if (k < g.K) epilogue(acc[i][j], static_cast<int64_t>(m) * g.K + k, k, e, y);
    }
  }
}

constexpr int kMmaM = 128, kMmaN = 64, kMmaKW = 16;  // pixels, channels, words per step
constexpr int kMmaStride = kMmaKW + 4;               // padded rows: conflict-free fragment reads

// Fragments (PTX ISA, m16n8k32 .s8; lane = 4 * gq + tq): A (16 x 32, row-major) a0 = A[gq][4tq..],
// a1 = A[gq+8][4tq..], a2 = A[gq][16+4tq..], a3 = A[gq+8][16+4tq..]; B (32 x 8, column-major)
// b0 = B[4tq..][gq], b1 = B[16+4tq..][gq]; C c0,c1 = C[gq][2tq, 2tq+1], c2,c3 = C[gq+8][...].
// With X tiles stored [pixel][word] and W tiles [channel][word], each is one 32-bit word.
template <typename Out>
__global__ void __launch_bounds__(kThreads)
    int8_conv_mma(const int32_t* __restrict__ x, const int32_t* __restrict__ w, Out* __restrict__ y,
                  Int8Geom g, Int8Epilogue e) {
  // Two buffers: while the warps multiply one step's tiles, the next step's words are in flight
  // from global memory to registers and then go to the other buffer (one barrier per step).
  __shared__ __align__(16) uint32_t xs[2][kMmaM][kMmaStride];
  __shared__ __align__(16) uint32_t ws[2][kMmaN][kMmaStride];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int m0 = blockIdx.x * kMmaM, k0 = blockIdx.y * kMmaN;
  // This thread loads word `kk` of pixel rows lr + 16 e (e < 8) and channel rows lr + 16 e (e < 4).
  const int kk = tid % kMmaKW, lr = tid / kMmaKW;
  int ih0[8] = {}, iw0[8] = {}, nh[8];  // nh: n * H, or -1 past the last pixel
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = m0 + lr + 16 * i;
    nh[i] = -1;
    if (m < g.M) {
      ih0[i] = ((m / g.Q) % g.P) * g.sh - g.ph;
      iw0[i] = (m % g.Q) * g.sw - g.pw;
      nh[i] = (m / (g.Q * g.P)) * g.H;
    }
  }
  // This thread's words of the step starting at reduction word kw0 (zeros outside).
  uint32_t xr[8], wr[4];
  auto load = [&](int kw0) {
    const int kw = kw0 + kk;
    const bool kin = kw < g.KW;
    const int c4 = kin ? kw % g.C4 : 0;
    const int rs = kin ? kw / g.C4 : 0;
    const int dh = (rs / g.S) * g.dh, dw = (rs % g.S) * g.dw;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int32_t v = 0;
      const int ih = ih0[i] + dh, iw = iw0[i] + dw;
      if (kin && nh[i] >= 0 && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W)
        v = x[(static_cast<int64_t>(nh[i] + ih) * g.W + iw) * g.C4 + c4];
      xr[i] = static_cast<uint32_t>(v);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + lr + 16 * i;
      wr[i] = kin && k < g.K ? static_cast<uint32_t>(w[static_cast<int64_t>(k) * g.KW + kw]) : 0u;
    }
  };
  auto stage = [&](int buf) {
#pragma unroll
    for (int i = 0; i < 8; ++i) xs[buf][lr + 16 * i][kk] = xr[i];
#pragma unroll
    for (int i = 0; i < 4; ++i) ws[buf][lr + 16 * i][kk] = wr[i];
  };
  int32_t acc[2][4][4] = {};
  const int wm = (warp % 4) * 32, wn = (warp / 4) * 32;
  const int gq = lane / 4, tq = lane % 4;
  load(0);
  stage(0);
  __syncthreads();
  int cur = 0;
  for (int kw0 = 0; kw0 < g.KW; kw0 += kMmaKW) {
    const bool more = kw0 + kMmaKW < g.KW;
    if (more) load(kw0 + kMmaKW);  // in flight during the multiplies below
#pragma unroll
    for (int o = 0; o < kMmaKW; o += 8) {  // two k32 steps
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int row = wm + mi * 16 + gq;
        a[mi][0] = xs[cur][row][o + tq];
        a[mi][1] = xs[cur][row + 8][o + tq];
        a[mi][2] = xs[cur][row][o + tq + 4];
        a[mi][3] = xs[cur][row + 8][o + tq + 4];
      }
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const int col = wn + ni * 8 + gq;
        const uint32_t b0 = ws[cur][col][o + tq], b1 = ws[cur][col][o + tq + 4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_s8(acc[mi][ni], a[mi], b0, b1);
      }
    }
    // The other buffer was last read in the previous step, which every warp finished before
    // the barrier that ended it.
    if (more) stage(cur ^ 1);
    __syncthreads();
    cur ^= 1;
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = m0 + wm + mi * 16 + gq + (c >= 2 ? 8 : 0);
        const int k = k0 + wn + ni * 8 + tq * 2 + (c & 1);
        if (m < g.M && k < g.K)
          epilogue_call(acc[mi][ni][c], static_cast<int64_t>(m) * g.K + k, k, e, y);
      }
}

bool is_conv(const Node& n) { return n.op_type == "FusedConv"; }

// The constant C / bias of the layer: its values broadcast over the output channels (a vector of
// K values, or one), or why not.
bool channel_vector(const Tensor* t, int64_t K, bool conv, std::string* why) {
  if (!t) return *why = "the bias / C is not constant", false;
  if (t->numel() == 1 && !conv) return true;
  if (t->numel() != K) return *why = "the bias / C is not one value per output channel", false;
  // conv: [K]; gemm: broadcast along rows, so only its last dimension may be K.
  if (!conv)
    for (int64_t d = 0; d + 1 < t->rank(); ++d)
      if (t->dim(d) != 1) return *why = "C is not a row vector", false;
  return true;
}

bool int8_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kINT8 || !quant::runs_int8(n))
    return *why = "INT8 layers only (int8 = 1)", false;
  if (std::string b = quant::int8_blocker(n); !b.empty()) return *why = b, false;
  const Value* wv = n.input(1);
  const Tensor* w = d.in_const(1);
  if (!w || wv->quant_scales.empty()) return *why = "weights without INT8 scales", false;
  if (d.in[0].dtype != DataType::kInt8) return *why = "X is not stored as int8", false;
  ActParams act;
  if (!read_activation(n.attrs, &act)) return *why = "unknown activation", false;
  const DataType yt = d.out[0].dtype;
  if (yt != DataType::kInt8 && yt != DataType::kFloat32 && yt != DataType::kFloat16)
    return *why = "Y must be int8, float32 or float16", false;
  const bool conv = is_conv(n);
  int64_t C, K;
  if (conv) {
    if (w->rank() != 4 || d.in_type(0).rank() != 4) return *why = "not a 2-D convolution", false;
    if (d.in[0].layout != Layout::kNHWC || d.out[0].layout != Layout::kNHWC)
      return *why = "needs NHWC", false;
    if (n.attrs.get_int("group", 1) != 1) return *why = "grouped", false;
    C = w->dim(1);
    K = w->dim(0);
    if (n.input(3)) {
      if (d.in_type(3).dims != d.out_type(0).dims) return *why = "the residual broadcasts", false;
      const DataType zt = d.in[3].dtype;
      if (zt != DataType::kInt8 && zt != DataType::kFloat32 && zt != DataType::kFloat16)
        return *why = "residual must be int8, float32 or float16", false;
      if (d.in[3].layout != Layout::kNHWC) return *why = "the residual is not NHWC", false;
    }
  } else {
    const std::string base = n.attrs.get_string("base", "");
    if (base == "Gemm" && n.attrs.get_int("transA", 0) != 0) return *why = "transA", false;
    if (w->rank() != 2) return *why = "W is not 2-D", false;
    const bool wt = base == "Gemm" && n.attrs.get_int("transB", 0) != 0;
    C = wt ? w->dim(1) : w->dim(0);
    K = wt ? w->dim(0) : w->dim(1);
    if (d.in[0].layout != Layout::kLinear || d.out[0].layout != Layout::kLinear)
      return *why = "needs row-major tensors", false;
    if (base == "Gemm" && d.in_type(0).rank() != 2) return *why = "Gemm's A is not 2-D", false;
    if (n.num_inputs() > 3 && n.input(3)) return *why = "a residual on a FusedGemm", false;
  }
  if (C % 4 != 0) return *why = "the reduction (input channels) is not a multiple of 4", false;
  if (n.input(2) && !channel_vector(d.in_const(2), K, conv, why)) return false;
  return true;
}

// Which kernel a tactic runs: the implicit GEMM on tensor cores or on __dp4a, the pipelined one
// for int8 chains with 64-channel multiples (conv_int8_pipelined.cu), or the persistent ones for
// their 1x1 layers (conv_int8_pointwise.cu) and 3x3 layers (conv_int8_3x3.cu on mma.sync,
// conv_int8_3x3_wgmma.cu on wgmma).
enum class Int8Kernel { kMma, kDp4a, kPipelined, kPointwise, kConv3x3, kConv3x3Wgmma };

class Int8ConvLayer final : public Layer {
 public:
  Int8ConvLayer(const LayerDesc& d, Int8Kernel kernel)
      : node_(d.node),
        kernel_(kernel),
        tile_n_(d.variant.starts_with("n64") ? 64 : 128),
        tile_m_(d.variant.ends_with("m64") ? 64 : 128) {}

  // Host side, once: int8 weights [K][R][S][C] and the epilogue's per-channel arrays.
  Status init(const LayerDesc& d) {
    const Node& n = *node_;
    read_activation(n.attrs, &e_.act);
    const Value* wv = n.input(1);
    const Tensor& w = *d.in_const(1);
    const Tensor q = quant::quantize_weights(w, wv->quant_scales, quant::weight_channel_axis(n));
    const int8_t* qp = q.data<int8_t>();
    conv_ = is_conv(n);
    const std::string base = n.attrs.get_string("base", "");
    if (conv_) {
      K_ = w.dim(0), C_ = w.dim(1), R_ = w.dim(2), S_ = w.dim(3);
    } else {
      const bool wt = base == "Gemm" && n.attrs.get_int("transB", 0) != 0;
      K_ = wt ? w.dim(0) : w.dim(1);
      C_ = wt ? w.dim(1) : w.dim(0);
      R_ = S_ = 1;
      transposed_ = !wt;  // W is [C][K]: reorder to [K][C]
    }
    host_w_.resize(static_cast<size_t>(K_ * R_ * S_ * C_));
    for (int64_t k = 0; k < K_; ++k)
      for (int64_t c = 0; c < C_; ++c)
        for (int64_t rs = 0; rs < R_ * S_; ++rs) {
          const int64_t src = conv_         ? (k * C_ + c) * R_ * S_ + rs
                              : transposed_ ? c * K_ + k
                                            : k * C_ + c;
          host_w_[static_cast<size_t>((k * R_ * S_ + rs) * C_ + c)] = qp[src];
        }
    const float sx = n.input(0)->quant_scales[0];
    const auto& sw = wv->quant_scales;
    host_ep_.resize(static_cast<size_t>(2 * K_));
    for (int64_t k = 0; k < K_; ++k)
      host_ep_[static_cast<size_t>(k)] = sx * sw[sw.size() == 1 ? 0 : static_cast<size_t>(k)];
    if (const Tensor* b = n.input(2) ? d.in_const(2) : nullptr) {
      has_bias_ = true;
      const float beta = !conv_ && base == "Gemm" ? n.attrs.get_float("beta", 1.f) : 1.f;
      for (int64_t k = 0; k < K_; ++k) {
        float v = static_cast<float>(b->at_double(b->numel() == 1 ? 0 : k));
        if (beta != 1.f) v *= beta;  // the reference scales C by beta in float32
        host_ep_[static_cast<size_t>(K_ + k)] = v;
      }
    }
    if (!conv_) e_.alpha = n.attrs.get_float("alpha", 1.f);
    if (const Value* y = n.output(0); y && y->has_quant_scale()) e_.sy = y->quant_scales[0];
    if (conv_ && n.input(3) && n.input(3)->has_quant_scale()) e_.sz = n.input(3)->quant_scales[0];
    return Status::Ok();
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const auto& x = in[0].shape;
    if (conv_) {
      KILN_ASSIGN_OR_RETURN(ConvGeom cg, conv_geometry(*node_, x, in[1].shape, false));
      if (cg.nsp != 2) return KILN_ERROR("{}: not a 2-D convolution", node_->label());
      g_ = {static_cast<int>(cg.N),
            static_cast<int>(cg.in[0]),
            static_cast<int>(cg.in[1]),
            static_cast<int>(C_ / 4),
            static_cast<int>(K_),
            static_cast<int>(R_),
            static_cast<int>(S_),
            static_cast<int>(cg.out[0]),
            static_cast<int>(cg.out[1]),
            static_cast<int>(cg.stride[0]),
            static_cast<int>(cg.stride[1]),
            static_cast<int>(cg.dilation[0]),
            static_cast<int>(cg.dilation[1]),
            static_cast<int>(cg.pad_begin[0]),
            static_cast<int>(cg.pad_begin[1]),
            0,
            0};
    } else {
      int64_t rows = 1;
      for (size_t i = 0; i + 1 < x.size(); ++i) rows *= x[i];
      g_ = {static_cast<int>(rows),
            1,
            1,
            static_cast<int>(C_ / 4),
            static_cast<int>(K_),
            1,
            1,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            0,
            0,
            0};
    }
    if (kernel_ == Int8Kernel::kPipelined) KILN_CUDA_CHECK(prepare_int8_pipelined());
    if (kernel_ == Int8Kernel::kPointwise) KILN_CUDA_CHECK(prepare_int8_pointwise());
    g_.M = g_.N * g_.P * g_.Q;
    g_.KW = g_.R * g_.S * g_.C4;
    if (kernel_ == Int8Kernel::kConv3x3)
      KILN_CUDA_CHECK(prepare_int8_conv3x3(g_, e_.act.act == Act::kRelu, &per_sm_));
    if (kernel_ == Int8Kernel::kConv3x3Wgmma)
      KILN_CUDA_CHECK(prepare_int8_conv3x3_wgmma(g_, e_.act.act == Act::kRelu, &per_sm_));
    if (in[0].numel() >= (int64_t(1) << 33) || out[0].numel() >= (int64_t(1) << 31) ||
        static_cast<int64_t>(g_.M) * g_.K != out[0].numel())
      return KILN_ERROR("{}: tensor too large or shapes inconsistent for the INT8 kernel",
                        node_->label());
    if (!weights_.get()) {
      const size_t wb = (host_w_.size() + 255) / 256 * 256;
      const size_t eb = host_ep_.size() * sizeof(float);
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + eb, "INT8 weights"));
      auto* base = static_cast<char*>(weights_.get());
      KILN_RETURN_IF_ERROR(cuda::upload(base, host_w_.data(), host_w_.size(), "INT8 conv weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(base + wb, host_ep_.data(), eb, "INT8 conv epilogue"));
      e_.scale = reinterpret_cast<const float*>(base + wb);
      e_.bias = has_bias_ ? e_.scale + K_ : nullptr;
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    Int8Epilogue e = e_;
    if (conv_ && in.size() > 3 && in[3].present()) {
      e.z = in[3].data;
      e.z_type = in[3].dtype;
    }
    if (kernel_ == Int8Kernel::kPipelined || kernel_ == Int8Kernel::kPointwise ||
        kernel_ == Int8Kernel::kConv3x3 || kernel_ == Int8Kernel::kConv3x3Wgmma) {
      static constexpr const char* kNames[] = {"", "", "pipelined", "pointwise", "3x3", "3x3 wgmma"};
      const char* name = kNames[static_cast<int>(kernel_)];
      if (out[0].dtype != DataType::kInt8)
        return KILN_ERROR("{}: the {} INT8 kernel writes int8 only", node_->label(), name);
      const auto* x = static_cast<const int8_t*>(in[0].data);
      const auto* w = static_cast<const int8_t*>(weights_.get());
      auto* y = static_cast<int8_t*>(out[0].data);
      const int tile_n = K_ % tile_n_ == 0 ? tile_n_ : 64;
      const char* why =
          kernel_ == Int8Kernel::kConv3x3 ? launch_int8_conv3x3(x, w, y, g_, e, per_sm_, rc.stream)
          : kernel_ == Int8Kernel::kConv3x3Wgmma
              ? launch_int8_conv3x3_wgmma(x, w, y, g_, e, per_sm_, rc.stream)
          : kernel_ == Int8Kernel::kPointwise
              ? launch_int8_pointwise(x, w, y, g_, e, tile_n, tile_m_, rc.stream)
              : launch_int8_pipelined(x, w, y, g_, e, tile_n, rc.stream);
      if (*why) return KILN_ERROR("{}: {} INT8 kernel: {}", node_->label(), name, why);
      KILN_CUDA_LAUNCH_CHECK("INT8 conv kernel (int8 output)");
      return Status::Ok();
    }
    const auto* x = static_cast<const int32_t*>(in[0].data);
    const auto* w = static_cast<const int32_t*>(weights_.get());
    const bool ok = [&] {
      switch (out[0].dtype) {
        case DataType::kInt8:
          return launch(x, w, static_cast<int8_t*>(out[0].data), e, rc.stream);
        case DataType::kFloat32:
          return launch(x, w, static_cast<float*>(out[0].data), e, rc.stream);
        case DataType::kFloat16:
          return launch(x, w, static_cast<__half*>(out[0].data), e, rc.stream);
        default:
          return false;
      }
    }();
    if (!ok) return KILN_ERROR("{}: output type {}", node_->label(), dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("INT8 conv kernel");
    return Status::Ok();
  }

 private:
  template <typename Out>
  bool launch(const int32_t* x, const int32_t* w, Out* y, const Int8Epilogue& e, cudaStream_t s) {
    if (kernel_ == Int8Kernel::kMma) {
      const dim3 grid((g_.M + kMmaM - 1) / kMmaM, (g_.K + kMmaN - 1) / kMmaN);
      int8_conv_mma<<<grid, kThreads, 0, s>>>(x, w, y, g_, e);
    } else {
      const dim3 grid((g_.M + kTileM - 1) / kTileM, (g_.K + kTileN - 1) / kTileN);
      int8_conv_dp4a<<<grid, kThreads, 0, s>>>(x, w, y, g_, e);
    }
    return true;
  }

  const Node* node_;
  Int8Kernel kernel_;
  int tile_n_;  // the pipelined/pointwise kernel's output channels per block (variant n128 / n64)
  int tile_m_;  // the pointwise kernel's pixels per tile (128; variant ...m64: 64)
  int per_sm_ = 0;  // the 3x3 kernels' resident blocks per SM at the configured shapes
  bool conv_ = true, transposed_ = false, has_bias_ = false;
  int64_t K_ = 0, C_ = 0, R_ = 1, S_ = 1;
  std::vector<int8_t> host_w_;
  std::vector<float> host_ep_;  // scale[K], then bias[K]
  Int8Epilogue e_;
  Int8Geom g_{};
  DeviceMemory weights_;  // int8 weights, then the epilogue arrays
};

// The pipelined kernel's problems (conv_int8_pipelined.cu): what int8_supports takes, with C and
// K multiples of 64, Y int8 and the residual int8 or absent.
bool pipelined_supports(const LayerDesc& d, std::string* why) {
  if (!int8_supports(d, why)) return false;
  const Node& n = *d.node;
  if (!is_conv(n)) return *why = "convolutions only", false;
  const Tensor* w = d.in_const(1);
  if (w->dim(1) % 64 != 0 || w->dim(0) % 64 != 0)
    return *why = "C and K must be multiples of 64", false;
  if (d.out[0].dtype != DataType::kInt8) return *why = "Y is not stored as int8", false;
  if (n.input(3) && d.in[3].dtype != DataType::kInt8) return *why = "the residual is not int8", false;
  return true;
}

// The pipelined kernel's variants: 128 or 64 output channels per block (64 only when K is not a
// multiple of 128). Wider tiles read X once per 128 channels; narrower ones use half the
// registers, so more blocks keep loads in flight.
std::vector<std::string> pipelined_variants(const LayerDesc& d) {
  const Tensor* w = d.in_const(1);
  if (w && w->rank() >= 1 && w->dim(0) % 128 == 0) return {"n128", "n64"};
  return {"n64"};
}

// The persistent pointwise kernel's problems (conv_int8_pointwise.cu): the pipelined kernel's,
// as a 1x1 convolution without padding (any stride), C of 64, 128 or 256, no activation or ReLU.
// Its variants are the pipelined kernel's (128 or 64 output channels per block).
bool pointwise_supports(const LayerDesc& d, std::string* why) {
  if (!pipelined_supports(d, why)) return false;
  const Node& n = *d.node;
  const Tensor* w = d.in_const(1);
  if (!unpadded_1x1(n.attrs, w, why)) return false;
  if (const int64_t C = w->dim(1); C != 64 && C != 128 && C != 256)
    return *why = "C must be 64, 128 or 256 (the weight slice stays in shared memory)", false;
  return none_or_relu(n, why);
}

// The persistent 3x3 kernels' problems (conv_int8_3x3.cu, conv_int8_3x3_wgmma.cu): the
// pipelined kernel's, as a 3x3 convolution with stride 1, padding 1 on every side and dilation
// 1, C of 64 or 128, no activation or ReLU, and an input width known at build time for which the
// kernel's input patch fits in shared memory (`unfit`; a wider image at run time would not
// launch).
bool conv3x3_supports(const LayerDesc& d, std::string* why,
                      const char* (*unfit)(const Int8Geom&) = int8_conv3x3_unfit) {
  if (!pipelined_supports(d, why)) return false;
  const Node& n = *d.node;
  const Tensor* w = d.in_const(1);
  if (w->rank() != 4 || w->dim(2) != 3 || w->dim(3) != 3) return *why = "not a 3x3 convolution", false;
  auto all = [&](const char* attr, int64_t v) {
    const auto a = n.attrs.get_ints(attr, {});
    return std::all_of(a.begin(), a.end(), [v](int64_t x) { return x == v; });
  };
  if (!all("strides", 1) || !all("dilations", 1)) return *why = "strided or dilated", false;
  if (n.attrs.get_ints("pads", {}).size() != 4 || !all("pads", 1) ||
      n.attrs.get_string("auto_pad", "NOTSET") != "NOTSET")
    return *why = "padding is not 1 on every side", false;
  if (const int64_t C = w->dim(1); C != 64 && C != 128)
    return *why = "C must be 64 or 128 (the filter stays in shared memory)", false;
  if (!none_or_relu(n, why)) return false;
  const TensorType& xt = d.in_type(0);
  if (xt.rank() != 4 || !(*xt.dims)[3].is_static())
    return *why = "the input width is not known at build time", false;
  Int8Geom g{};
  g.N = 1, g.C4 = static_cast<int>(w->dim(1) / 4), g.K = static_cast<int>(w->dim(0));
  g.R = g.S = 3, g.sh = g.sw = g.dh = g.dw = g.ph = g.pw = 1;
  g.W = g.Q = static_cast<int>((*xt.dims)[3].value);
  g.H = g.P = (*xt.dims)[2].is_static() ? static_cast<int>((*xt.dims)[2].value) : 1 << 20;
  if (const char* u = unfit(g); *u) return *why = u, false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_int8(const LayerDesc& d, Int8Kernel kernel) {
  std::string why;
  const bool ok = kernel == Int8Kernel::kPipelined    ? pipelined_supports(d, &why)
                  : kernel == Int8Kernel::kPointwise ? pointwise_supports(d, &why)
                  : kernel == Int8Kernel::kConv3x3   ? conv3x3_supports(d, &why)
                  : kernel == Int8Kernel::kConv3x3Wgmma
                      ? conv3x3_supports(d, &why, int8_conv3x3_wgmma_unfit)
                                                     : int8_supports(d, &why);
  if (!ok) return KILN_ERROR("{}: INT8 kernel: {}", d.node->label(), why);
  auto layer = std::make_unique<Int8ConvLayer>(d, kernel);
  KILN_RETURN_IF_ERROR(layer->init(d));
  return std::unique_ptr<Layer>(std::move(layer));
}

}  // namespace

bool unpadded_1x1(const Attributes& a, const Tensor* w, std::string* why) {
  if (!w || w->rank() != 4 || w->dim(2) != 1 || w->dim(3) != 1)
    return *why = "not a 1x1 convolution", false;
  const auto pads = a.get_ints("pads", {});
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; }) ||
      a.get_string("auto_pad", "NOTSET") != "NOTSET")
    return *why = "padded", false;
  return true;
}

// The persistent kernels' epilogues compile in no activation or ReLU only.
bool none_or_relu(const Node& n, std::string* why) {
  ActParams act;
  if (!read_activation(n.attrs, &act)) return *why = "unknown activation", false;
  if (act.act != Act::kNone && act.act != Act::kRelu) return *why = "activations other than ReLU", false;
  return true;
}

bool int8_conv_supports(const LayerDesc& d, std::string* why) { return int8_supports(d, why); }
bool int8_pipelined_supports(const LayerDesc& d, std::string* why) {
  return pipelined_supports(d, why);
}
std::vector<std::string> int8_pipelined_variants(const LayerDesc& d) {
  return pipelined_variants(d);
}
// The pointwise kernel's: the pipelined kernel's channel tiles, each also with 64-pixel tiles
// (m64: half the shared memory and registers, twice the blocks per SM).
std::vector<std::string> int8_pointwise_variants(const LayerDesc& d) {
  std::vector<std::string> v = pipelined_variants(d);
  for (size_t i = 0, n = v.size(); i < n; ++i) v.push_back(v[i] + "m64");
  return v;
}
Expected<std::unique_ptr<Layer>> create_int8_conv(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kMma);
}
Expected<std::unique_ptr<Layer>> create_int8_conv_dp4a(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kDp4a);
}
Expected<std::unique_ptr<Layer>> create_int8_pipelined(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kPipelined);
}
bool int8_pointwise_supports(const LayerDesc& d, std::string* why) {
  return pointwise_supports(d, why);
}
Expected<std::unique_ptr<Layer>> create_int8_pointwise(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kPointwise);
}
bool int8_conv3x3_supports(const LayerDesc& d, std::string* why) { return conv3x3_supports(d, why); }
Expected<std::unique_ptr<Layer>> create_int8_conv3x3(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kConv3x3);
}
bool int8_conv3x3_wgmma_supports(const LayerDesc& d, std::string* why) {
  return conv3x3_supports(d, why, int8_conv3x3_wgmma_unfit);
}
Expected<std::unique_ptr<Layer>> create_int8_conv3x3_wgmma(const LayerDesc& d) {
  return create_int8(d, Int8Kernel::kConv3x3Wgmma);
}

}  // namespace kiln::gpu
