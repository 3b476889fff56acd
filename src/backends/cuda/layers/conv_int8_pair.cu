// conv_int8.pair: kiln.FusedConvPair (int8 = 1), two 1x1 convolutions whose sum feeds one
// activation, as one persistent kernel: ResNet's first bottleneck block of stage 1, where the
// block's expand convolution and its downsample join in the residual Add and ReLU
//
//   y = act(conv(X, W) * s1 + conv(X2, W2) * s2 + b1 + b2)   ->   int8 codes of Y
//
// Run as two layers, the expand writes its full output (int8 codes, 4x the channels of its input)
// and the downsample reads it back as its residual: at batch 256, 411 MB that the pair never
// moves (0.34 ms as two layers, 0.20 ms as the pair on the H100). The pair is one GEMM whose reduction is the two inputs'
// channels side by side: each tile's pixel rows are X's C1 codes, then X2's C2 codes (X2 read at
// its own stride), the weight rows W's then W2's. The two halves accumulate into separate int32
// accumulators (their scales differ per channel), which the epilogue dequantizes, adds and
// quantizes, reassociated as the pointwise kernel's (pw_epilogue_fused: within one code of the
// CPU reference, fused_int8.cpp). The frame is the pointwise kernel's (conv_int8_pointwise.cu):
// the weight slice, the channels' epilogue constants and a two-stage cp.async ring of 64-pixel
// tiles in shared memory, persistent blocks walking the tiles.
#include <algorithm>
#include <vector>

#include "device_util_host.h"
#include "layers/conv_common.h"
#include "layers/conv_int8_pair.cuh"
#include "layers/conv_int8_pw.cuh"
#include "ops/fused_util.h"
#include "quant/int8.h"
#include "tactics/check.h"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 256;  // 8 warps: 2 along the pixels x 4 along the channels
constexpr int kTileM = 64;     // pixels per tile

// Shared memory: W [N][C1 + C2 + 16], X [2][64][C1 + C2 + 16], the output ring [2][64][N + 16],
// then the channels' PairChannel [N] (rows padded by 16 bytes: fragment and pair accesses fall in
// distinct banks).
template <int N, int C1, int C2>
constexpr int smem_bytes() {
  constexpr int kRow = C1 + C2 + 16;
  return N * kRow + 2 * kTileM * kRow + 2 * kTileM * (N + 16) + N * 16;
}

// Issues the cp.async copies of a tile's C codes of one input into its rows' columns
// [col0, col0 + C) (rows of kRow bytes).
template <int C, int kRow>
__device__ __forceinline__ void load_input(int8_t* xt, int col0, const PairInput& in, int m0,
                                           int M, int P, int Q, const FastDiv& by_q,
                                           const FastDiv& by_pq, int tid) {
  constexpr int kChunks = C / 16;
#pragma unroll
  for (int j = 0; j < kTileM * kChunks / kThreads; ++j) {
    const int i = tid + j * kThreads, r = i / kChunks, c = i % kChunks, m = m0 + r;
    const bool ok = m < M;
    const int64_t row = ok ? pair_input_row(in, m, P, Q, by_q, by_pq) : 0;
    cp_async16(xt + r * kRow + col0 + c * 16, in.x + row * C + c * 16, ok);
  }
}

template <int N, int C1, int C2, bool Relu>
__global__ void __launch_bounds__(kThreads)
    int8_pair(PairInput a, PairInput b, const int8_t* __restrict__ w,
              const PairChannel* __restrict__ ch, int8_t* __restrict__ y, int M, int K, int P,
              int Q, int tiles, FastDiv by_q, FastDiv by_pq) {
  constexpr int C = C1 + C2, kXRow = C + 16, kZRow = N + 16;
  constexpr int kWChunks = C / 16;
  constexpr int WM = kTileM / 32, WN = 8 / WM;  // warps along the pixels and the channels
  constexpr int NW = N / WN, NI = NW / 8;       // channels per warp, 8-channel mma columns
  constexpr bool kSmall1 = C1 <= 256, kSmall2 = C2 <= 256;  // |acc| <= 2^22: acc_to_float
  static_assert(C1 % 64 == 0 && C2 % 64 == 0, "each input's tile rows fill whole thread rounds");
  extern __shared__ __align__(16) unsigned char smem[];
  int8_t* ws = reinterpret_cast<int8_t*>(smem);
  int8_t* xs = ws + N * kXRow;
  int8_t* zy = xs + 2 * kTileM * kXRow;
  auto* sc = reinterpret_cast<PairChannel*>(zy + 2 * kTileM * kZRow);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.x * N;

  for (int i = tid; i < N * kWChunks; i += kThreads)
    cp_async16(ws + (i / kWChunks) * kXRow + (i % kWChunks) * 16,
               w + static_cast<int64_t>(k0 + i / kWChunks) * C + (i % kWChunks) * 16, true);
  for (int i = tid; i < N; i += kThreads) cp_async16(sc + i, ch + k0 + i, true);

  auto load_tile = [&](int stage, int tile) {
    int8_t* xt = xs + stage * kTileM * kXRow;
    load_input<C1, kXRow>(xt, 0, a, tile * kTileM, M, P, Q, by_q, by_pq, tid);
    load_input<C2, kXRow>(xt, C1, b, tile * kTileM, M, P, Q, by_q, by_pq, tid);
  };

  const int wm = (warp % WM) * 32, wn = (warp / WM) * NW;
  const PwLaneAddrs la = pw_lane_addrs(ws, kXRow, wm, wn, lane);
  pw_tile_ring(
      tiles, load_tile,
      [&](int st, int) {
        const uint32_t xb = smem_u32(xs + st * kTileM * kXRow);
        int32_t acc1[2][NI][4] = {}, acc2[2][NI][4] = {};
        pw_mma_steps<0, C1 / 32>(acc1, xb, la, kXRow);   // X's channels
        pw_mma_steps<C1 / 32, C / 32>(acc2, xb, la, kXRow);  // X2's
        // Per pair of adjacent channels of a row (pw_fragments): fma(acc2, s2, fma(acc1, s1, b)).
        int8_t* zt = zy + st * kTileM * kZRow;
        pw_fragments<NI>(wm, wn, lane, [&](int mi, int ni, int row, int col) {
          const PairChannel e0 = sc[col], e1 = sc[col + 1];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float t0 =
                __fmaf_rn(acc_to_float<kSmall2>(acc2[mi][ni][2 * h]), e0.s2,
                          __fmaf_rn(acc_to_float<kSmall1>(acc1[mi][ni][2 * h]), e0.s1, e0.b));
            const float t1 =
                __fmaf_rn(acc_to_float<kSmall2>(acc2[mi][ni][2 * h + 1]), e1.s2,
                          __fmaf_rn(acc_to_float<kSmall1>(acc1[mi][ni][2 * h + 1]), e1.s1, e1.b));
            *reinterpret_cast<uint16_t*>(zt + (row + 8 * h) * kZRow + col) = static_cast<uint16_t>(
                __byte_perm(fused_code<Relu>(t0), fused_code<Relu>(t1), 0x0040));
          }
        });
      },
      [&](int st, int tile) {
        const int m0 = tile * kTileM;
        pw_store_rows<N, kThreads, kTileM>(y, m0, M - m0, K, k0, zy + st * kTileM * kZRow, kZRow,
                                           tid);
      });
}

// Blocks of one instantiation that fit on an SM, found at configure (prepare).
template <int N, int C1, int C2, bool Relu>
int& resident_blocks() {
  static int blocks = 0;
  return blocks;
}

template <int N, int C1, int C2, bool Relu>
cudaError_t prepare_one() {
  constexpr int bytes = smem_bytes<N, C1, C2>();
  return prepare_persistent(int8_pair<N, C1, C2, Relu>, kThreads, bytes, bytes,
                            &resident_blocks<N, C1, C2, Relu>());
}

template <int N, int C1, int C2, bool Relu>
const char* launch(const PairLaunch& l, bool prepare, cudaStream_t stream) {
  if (prepare) {
    const cudaError_t e = prepare_one<N, C1, C2, Relu>();
    return e == cudaSuccess ? "" : cudaGetErrorString(e);
  }
  const int per_sm = resident_blocks<N, C1, C2, Relu>();
  if (per_sm <= 0) return "not prepared, or no block fits on an SM";
  const int tiles = (l.M + kTileM - 1) / kTileM, cblocks = l.K / N;
  const int rows = std::max(1, std::min(tiles, per_sm * sm_count() / cblocks));
  int8_pair<N, C1, C2, Relu><<<dim3(cblocks, rows), kThreads, smem_bytes<N, C1, C2>(), stream>>>(
      l.a, l.b, l.w, l.ch, l.y, l.M, l.K, l.P, l.Q, tiles, FastDiv(l.Q), FastDiv(l.P * l.Q));
  return "";
}

// The instantiated shape: ResNet's stage-1 pair, (C1, C2) = (64, 64) (the expand from 64
// channels, the downsample from the stem's 64). Stages 2 and 3's pairs, (128, 256) and
// (256, 512) with the downsample at stride 2, ran too (H100, docs/perf.md, eleventh session):
// 0.236 and 0.196 ms against 0.233 and 0.185 for their two layers. Their weight slices and
// rows fill shared memory, so one block of 8 warps per SM issues a third of the time; the wgmma
// pair kernel (conv_int8_pair_wgmma.cu) takes them instead.
constexpr int kC1 = 64, kC2 = 64;
constexpr const char* kShapeWhy = "(C1, C2) must be (64, 64)";

bool shape_known(int c1, int c2) { return c1 == kC1 && c2 == kC2; }

template <int N, bool Relu>
const char* dispatch_c(int c1, int c2, const PairLaunch& l, bool prepare, cudaStream_t s) {
  if (shape_known(c1, c2)) return launch<N, kC1, kC2, Relu>(l, prepare, s);
  return kShapeWhy;
}

// The two kernel families: wgmma (conv_int8_pair_wgmma.cu), or mma.sync (this file) with tile_n
// output channels per block (128 or 64).
const char* dispatch(bool wgmma, int tile_n, bool relu, int c1, int c2, const PairLaunch& l,
                     bool prepare, cudaStream_t s) {
  if (wgmma) return launch_int8_pair_wgmma(relu, c1, c2, l, prepare, s);
  if (tile_n == 128)
    return relu ? dispatch_c<128, true>(c1, c2, l, prepare, s)
                : dispatch_c<128, false>(c1, c2, l, prepare, s);
  return relu ? dispatch_c<64, true>(c1, c2, l, prepare, s)
              : dispatch_c<64, false>(c1, c2, l, prepare, s);
}

// The shared memory a tile of tile_n channels needs (the limit is the device's opt-in maximum,
// 227 KiB on the H100; the check is host-side, at build time).
int pair_smem(int tile_n, int c1, int c2) {
  const int row = c1 + c2 + 16;
  return tile_n * row + 2 * kTileM * row + 2 * kTileM * (tile_n + 16) + tile_n * 16;
}
constexpr int kSmemLimit = 227 * 1024;

// The second convolution's attributes as a Node of its own (conv_geometry reads them there).
Node second_conv(const Node& n) {
  Node s;
  s.name = n.name + "/conv2";
  s.op_type = "Conv";
  s.attrs = fused::strip_prefix(n.attrs, "conv2_");
  return s;
}

// Each of the two convolutions: 1x1, unpadded, ungrouped.
bool pair_conv_fits(const Attributes& a, const Tensor* w, std::string* why) {
  if (!unpadded_1x1(a, w, why)) return false;
  if (a.get_int("group", 1) != 1) return *why = "grouped", false;
  return true;
}

// wgmma: the tactic conv_int8.pair.wgmma (conv_int8_pair_wgmma.cu), else conv_int8.pair.
bool pair_supports(const LayerDesc& d, std::string* why, bool wgmma) {
  const Node& n = *d.node;
  if (d.precision != Precision::kINT8 || !quant::runs_int8(n))
    return *why = "INT8 layers only (int8 = 1)", false;
  if (std::string bl = quant::int8_blocker(n); !bl.empty()) return *why = bl, false;
  const Tensor* w1 = d.in_const(1);
  const Tensor* w2 = d.in_const(4);
  if (!w1 || !w2 || n.input(1)->quant_scales.empty() || n.input(4)->quant_scales.empty())
    return *why = "weights without INT8 scales", false;
  if (!pair_conv_fits(n.attrs, w1, why) || !pair_conv_fits(second_conv(n).attrs, w2, why))
    return false;
  if (w1->dim(0) != w2->dim(0)) return *why = "the convolutions' output channels differ", false;
  for (size_t i : {size_t{0}, size_t{3}})
    if (d.in[i].dtype != DataType::kInt8 || d.in[i].layout != Layout::kNHWC)
      return *why = "X and X2 must be stored int8 NHWC", false;
  if (d.out[0].dtype != DataType::kInt8 || d.out[0].layout != Layout::kNHWC)
    return *why = "Y must be stored int8 NHWC (its value needs an INT8 scale)", false;
  if (!none_or_relu(n, why)) return false;
  const int c1 = static_cast<int>(w1->dim(1)), c2 = static_cast<int>(w2->dim(1));
  if (wgmma) {
    if (const char* e = int8_pair_wgmma_unfit(c1, c2, static_cast<int>(w1->dim(0))); *e)
      return *why = e, false;
    for (int64_t st : n.attrs.get_ints("strides", {}))
      if (st != 1) return *why = "the first convolution must be stride 1 (X read row by row)", false;
  } else {
    if (!shape_known(c1, c2)) return *why = kShapeWhy, false;
    if (w1->dim(0) % 64 != 0) return *why = "K must be a multiple of 64", false;
  }
  for (size_t b : {size_t{2}, size_t{5}})
    if (n.input(b) && (!d.in_const(b) || d.in_const(b)->numel() != w1->dim(0)))
      return *why = "a bias is not one constant per output channel", false;
  return true;
}

// n128m64 where K is a multiple of 128 and the tile fits in shared memory, n64m64 always.
std::vector<std::string> pair_variants(const LayerDesc& d) {
  const Tensor* w1 = d.in_const(1);
  const Tensor* w2 = d.in_const(4);
  if (!w1 || !w2 || w1->rank() != 4 || w2->rank() != 4) return {"n64m64"};
  const int c1 = static_cast<int>(w1->dim(1)), c2 = static_cast<int>(w2->dim(1));
  if (w1->dim(0) % 128 == 0 && pair_smem(128, c1, c2) <= kSmemLimit) return {"n128m64", "n64m64"};
  return {"n64m64"};
}

class Int8PairLayer final : public Layer {
 public:
  // wgmma: the wgmma kernel; else the mma.sync one, its variant giving its tile_n.
  Int8PairLayer(const LayerDesc& d, bool wgmma)
      : node_(d.node), wgmma_(wgmma), tile_n_(d.variant.starts_with("n128") ? 128 : 64) {}

  // Host side, once: the int8 weights [K][C1 + C2] (W's row, then W2's) and the channels'
  // epilogue constants.
  Status init(const LayerDesc& d) {
    const Node& n = *node_;
    ActParams act;
    read_activation(n.attrs, &act);
    relu_ = act.act == Act::kRelu;
    const Tensor& w1 = *d.in_const(1);
    const Tensor& w2 = *d.in_const(4);
    K_ = static_cast<int>(w1.dim(0));
    c1_ = static_cast<int>(w1.dim(1));
    c2_ = static_cast<int>(w2.dim(1));
    if (!wgmma_ && pair_smem(tile_n_, c1_, c2_) > kSmemLimit)
      return KILN_ERROR("{}: variant n{} does not fit in shared memory", n.label(), tile_n_);
    const Tensor q1 = quant::quantize_weights(w1, n.input(1)->quant_scales, 0);
    const Tensor q2 = quant::quantize_weights(w2, n.input(4)->quant_scales, 0);
    const int C = c1_ + c2_;
    host_w_.resize(static_cast<size_t>(K_) * C);
    for (int k = 0; k < K_; ++k) {
      std::copy_n(q1.data<int8_t>() + static_cast<int64_t>(k) * c1_, c1_,
                  host_w_.begin() + static_cast<int64_t>(k) * C);
      std::copy_n(q2.data<int8_t>() + static_cast<int64_t>(k) * c2_, c2_,
                  host_w_.begin() + static_cast<int64_t>(k) * C + c1_);
    }
    const float sx1 = n.input(0)->quant_scales[0], sx2 = n.input(3)->quant_scales[0];
    const float sy = n.output(0)->quant_scales[0];
    const auto& sw1 = n.input(1)->quant_scales;
    const auto& sw2 = n.input(4)->quant_scales;
    const Tensor* b1 = n.input(2) ? d.in_const(2) : nullptr;
    const Tensor* b2 = n.input(5) ? d.in_const(5) : nullptr;
    host_ch_.resize(static_cast<size_t>(K_));
    for (int k = 0; k < K_; ++k) {
      const auto ks = static_cast<size_t>(k);
      // The reference's sx * sw[k] (one float32 rounding), then divided by Y's scale, as the
      // pointwise kernel's reassociated epilogue.
      const float s1 = sx1 * sw1[sw1.size() == 1 ? 0 : ks];
      const float s2 = sx2 * sw2[sw2.size() == 1 ? 0 : ks];
      const float bias = (b1 ? static_cast<float>(b1->at_double(k)) : 0.f) +
                         (b2 ? static_cast<float>(b2->at_double(k)) : 0.f);
      host_ch_[ks] = PairChannel{s1 / sy, s2 / sy, bias / sy, 0.f};
    }
    return Status::Ok();
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(ConvGeom g1, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    KILN_ASSIGN_OR_RETURN(ConvGeom g2,
                          conv_geometry(second_conv(*node_), in[3].shape, in[4].shape, false));
    if (g1.nsp != 2 || g2.nsp != 2) return KILN_ERROR("{}: not 2-D convolutions", node_->label());
    if (g1.N != g2.N || g1.out[0] != g2.out[0] || g1.out[1] != g2.out[1])
      return KILN_ERROR("{}: the two convolutions' outputs differ in shape", node_->label());
    auto input = [](const ConvGeom& g) {
      PairInput p{};
      p.H = static_cast<int>(g.in[0]), p.W = static_cast<int>(g.in[1]);
      p.sh = static_cast<int>(g.stride[0]), p.sw = static_cast<int>(g.stride[1]);
      p.contiguous = p.sh == 1 && p.sw == 1;
      return p;
    };
    a_ = input(g1);
    b_ = input(g2);
    P_ = static_cast<int>(g1.out[0]), Q_ = static_cast<int>(g1.out[1]);
    const int64_t M = g1.N * g1.out[0] * g1.out[1];
    if (in[0].numel() >= (int64_t(1) << 31) || in[3].numel() >= (int64_t(1) << 31) ||
        out[0].numel() >= (int64_t(1) << 31) || M * K_ != out[0].numel())
      return KILN_ERROR("{}: tensor too large or shapes inconsistent for the INT8 pair kernel",
                        node_->label());
    M_ = static_cast<int>(M);
    if (!wgmma_ && K_ % tile_n_ != 0)
      return KILN_ERROR("{}: K = {} is not a multiple of the variant's {} channels", node_->label(),
                        K_, tile_n_);
    PairLaunch none{};
    if (const char* e = dispatch(wgmma_, tile_n_, relu_, c1_, c2_, none, true, nullptr); *e)
      return KILN_ERROR("{}: INT8 pair kernel: {}", node_->label(), e);
    if (!weights_.get()) {
      const size_t wb = (host_w_.size() + 255) / 256 * 256;
      const size_t cb = host_ch_.size() * sizeof(PairChannel);
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + cb, "INT8 pair weights"));
      auto* base = static_cast<char*>(weights_.get());
      KILN_RETURN_IF_ERROR(cuda::upload(base, host_w_.data(), host_w_.size(), "INT8 pair weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(base + wb, host_ch_.data(), cb, "INT8 pair epilogue"));
      ch_ = reinterpret_cast<const PairChannel*>(base + wb);
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    if (in[0].dtype != DataType::kInt8 || in[3].dtype != DataType::kInt8 ||
        out[0].dtype != DataType::kInt8)
      return KILN_ERROR("{}: the INT8 pair kernel reads and writes int8 only", node_->label());
    if (!aligned16(in[0].data) || !aligned16(in[3].data) || !aligned16(out[0].data))
      return KILN_ERROR("{}: INT8 pair kernel: a tensor is not 16-byte aligned", node_->label());
    PairLaunch l{a_, b_, static_cast<const int8_t*>(weights_.get()), ch_,
                 static_cast<int8_t*>(out[0].data), M_, K_, P_, Q_};
    l.a.x = static_cast<const int8_t*>(in[0].data);
    l.b.x = static_cast<const int8_t*>(in[3].data);
    if (const char* e = dispatch(wgmma_, tile_n_, relu_, c1_, c2_, l, false, rc.stream); *e)
      return KILN_ERROR("{}: INT8 pair kernel: {}", node_->label(), e);
    KILN_CUDA_LAUNCH_CHECK("INT8 pair kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool wgmma_;
  int tile_n_;
  bool relu_ = false;
  int K_ = 0, c1_ = 0, c2_ = 0, M_ = 0, P_ = 0, Q_ = 0;
  PairInput a_{}, b_{};
  std::vector<int8_t> host_w_;
  std::vector<PairChannel> host_ch_;
  const PairChannel* ch_ = nullptr;
  DeviceMemory weights_;  // int8 weights, then the channels' epilogue constants
};

Expected<std::unique_ptr<Layer>> create_pair(const LayerDesc& d, bool wgmma) {
  std::string why;
  if (!pair_supports(d, &why, wgmma))
    return KILN_ERROR("{}: INT8 pair kernel: {}", d.node->label(), why);
  auto layer = std::make_unique<Int8PairLayer>(d, wgmma);
  KILN_RETURN_IF_ERROR(layer->init(d));
  return std::unique_ptr<Layer>(std::move(layer));
}

}  // namespace

bool int8_pair_supports(const LayerDesc& d, std::string* why) {
  return pair_supports(d, why, false);
}
std::vector<std::string> int8_pair_variants(const LayerDesc& d) { return pair_variants(d); }
Expected<std::unique_ptr<Layer>> create_int8_pair(const LayerDesc& d) {
  return create_pair(d, false);
}
bool int8_pair_wgmma_supports(const LayerDesc& d, std::string* why) {
  return pair_supports(d, why, true);
}
Expected<std::unique_ptr<Layer>> create_int8_pair_wgmma(const LayerDesc& d) {
  return create_pair(d, true);
}

}  // namespace kiln::gpu
