// kiln's stem convolution (tactic kiln.conv.stem): kiln.FusedConv in FP16 on NHWC images with
// few input channels (C <= 4: a CNN's first layer, e.g. ResNet's 7x7/2 on RGB), bias and
// activation fused. cuDNN pads C = 3 up to 8 for each of the 49 taps (the kernel study: 0.6 ms,
// 23% of the H100's FP16 rate, at batch 256); here the whole filter is one GEMM reduction: each
// filter row's S*C taps are contiguous in an NHWC input row, padded only to a multiple of 8
// (7*3 = 21 -> 24, so the reduction is 7*24 = 168 -> 176 instead of 49*8 = 392).
//
// A block computes 128 output pixels x NT channels (NT = 64, or 32 when K is not a multiple of
// 64) with mma.sync m16n8k16 (float16 in, float32 accumulation), 8 warps of 32 x NT/2. The
// filter (NT x reduction, float16) stays in shared memory; the im2col tile of each 16-wide
// reduction step is gathered by the threads (8 consecutive reduction elements each, which are
// consecutive halves of one input row) into one of two buffers while the tensor cores work on
// the other. The epilogue (bias, activation, float16) stages the tile in shared memory and writes
// it out in 16-byte stores.
//
// kiln.FusedConvPool (tactic kiln.convpool.stem) is the same kernel with the max-pool in its
// epilogue: the tile's rows are the patch of convolution outputs under 3 x 8 pooled pixels, and
// only the pooled pixels are written. Its fallback, kiln.convpool.direct, is at the end.
#include <algorithm>
#include <vector>

#include "device_util_host.h"
#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "layers/conv_common.h"
#include "ops/fused_util.h"

namespace kiln::gpu {
namespace {

constexpr int kStemM = 128;        // output pixels per block
constexpr int kStemThreads = 256;  // 8 warps: 4 along the pixels x 2 along the channels
constexpr int kStemARow = 24;      // halves per im2col tile row: 16 + 8 of padding
constexpr int kStemMaxReduction = 176;

struct StemGeom {
  int N, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh;
  int SC, SCp, Kp;  // taps of one filter row (S * C), padded to 8; the reduction padded to 16
  int M;            // output pixels
};

// kiln.FusedConvPool: the max-pool after the convolution. A block makes kPoolTH x kPoolTW pooled
// pixels of one image from the patch of convolution outputs their windows cover (3x8 pooled
// pixels of a 3x3/2 pool: 7 x 17 = 119 of the tile's 128 rows).
constexpr int kPoolTH = 3, kPoolTW = 8;
struct PoolGeom {
  int PP, PQ, kh, kw, sh, sw, ph, pw;  // pooled size, window, strides, leading pads
  int rows, cols;                       // the convolution patch of a block
  int tiles_h, tiles_w;                 // blocks per image
};

__device__ __forceinline__ __half2 neg_inf2() {
  const __half h = __ushort_as_half(0xFC00u);  // float16 -inf: the max-pool's padding
  return __halves2half2(h, h);
}

template <int NT>
constexpr int stem_smem_bytes(int Kp) {
  const int main = NT * (Kp + 8) * 2 + 2 * kStemM * kStemARow * 2;
  const int out = kStemM * (NT + 8) * 2;
  return main > out ? main : out;
}

// Fragments (PTX ISA, m16n8k16 .f16; lane = 4 * gq + tq): A (16 x 16, row-major) a0 = A[gq][2tq,
// 2tq+1], a1 = A[gq+8][2tq..], a2 = A[gq][2tq+8..], a3 = A[gq+8][2tq+8..]; B (16 x 8, column-major)
// b0 = B[2tq, 2tq+1][gq], b1 = B[2tq+8..][gq]; C c0,c1 = C[gq][2tq, 2tq+1], c2,c3 = C[gq+8][...].
// With the im2col tile stored [pixel][k] and the filter [channel][k], each is one 32-bit word.
// POOL: the tile's rows are a patch of convolution outputs (PoolGeom) and the block writes their
// max-pool; else they are 128 consecutive output pixels.
template <int C, int NT, bool POOL>
__global__ void __launch_bounds__(kStemThreads)
    conv_stem(const __half* __restrict__ x, const __half* __restrict__ w,
              const float* __restrict__ bias, __half* __restrict__ y, StemGeom g, PoolGeom pg,
              ActParams act) {
  extern __shared__ __align__(16) unsigned char smem[];
  __half* ws = reinterpret_cast<__half*>(smem);  // [NT][Kp + 8]
  __half* as = ws + NT * (g.Kp + 8);               // [2][kStemM][kStemARow]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.x * NT, m0 = blockIdx.y * kStemM;
  const int wrow = g.Kp + 8;
  // POOL: this block's image, its first pooled pixel and the patch's first convolution output.
  int pn = 0, py0 = 0, px0 = 0, oy0 = 0, ox0 = 0;
  if constexpr (POOL) {
    const int per_image = pg.tiles_h * pg.tiles_w, t = blockIdx.y % per_image;
    pn = blockIdx.y / per_image;
    py0 = (t / pg.tiles_w) * kPoolTH;
    px0 = (t % pg.tiles_w) * kPoolTW;
    oy0 = py0 * pg.sh - pg.ph;
    ox0 = px0 * pg.sw - pg.pw;
  }
  // Tile row -> the convolution output it holds: (n, p, q), or false past the tile's pixels.
  auto conv_pixel = [&](int row, int* n, int* p, int* q) {
    if constexpr (POOL) {
      if (row >= pg.rows * pg.cols) return false;
      *n = pn;
      *p = oy0 + row / pg.cols;
      *q = ox0 + row % pg.cols;
      return *p >= 0 && *p < g.P && *q >= 0 && *q < g.Q;
    } else {
      const int m = m0 + row;
      if (m >= g.M) return false;
      *q = m % g.Q;
      *p = (m / g.Q) % g.P;
      *n = m / (g.Q * g.P);
      return true;
    }
  };
  // The filter rows of this block's channels, in 16-byte chunks.
  const int chunks = g.Kp / 8;
  for (int i = tid; i < NT * chunks; i += kStemThreads) {
    const int r = i / chunks, c = i % chunks;
    *reinterpret_cast<uint4*>(ws + r * wrow + c * 8) =
        *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(k0 + r) * g.Kp + c * 8);
  }
  // This thread gathers 8 reduction elements (k = step * 16 + kh .. + 7) of tile row `row`.
  const int row = tid / 2, kh = (tid % 2) * 8;
  int nh = -1, ih0 = 0, iw0 = 0;
  {
    int n, p, q;
    if (conv_pixel(row, &n, &p, &q)) {
      nh = n * g.H;
      ih0 = p * g.sh - g.ph;
      iw0 = q * g.sw - g.pw;
    }
  }
  uint32_t v[4];  // 8 halves, two per word (registers; no local array of halves)
  auto gather = [&](int step) {
    const int k = step * 16 + kh;  // a multiple of 8, so all 8 lie in one filter row
    const int r = k / g.SCp, j0 = k - r * g.SCp;
    const int ih = ih0 + r * g.dh;
    const bool row_ok = nh >= 0 && r < g.R && ih >= 0 && ih < g.H;
    const auto* base = reinterpret_cast<const unsigned short*>(x) +
                       (static_cast<int64_t>(nh + ih) * g.W + iw0) * C;
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      uint32_t lo = 0, hi = 0;  // float16 zero is all bits clear
      const int j = j0 + e;
      if (row_ok && j < g.SC && iw0 + j / C >= 0 && iw0 + j / C < g.W) lo = base[j];
      if (row_ok && j + 1 < g.SC && iw0 + (j + 1) / C >= 0 && iw0 + (j + 1) / C < g.W)
        hi = base[j + 1];
      v[e / 2] = lo | (hi << 16);  // the lower k in the low half, as mma fragments expect
    }
  };
  auto stage = [&](int buf) {
    *reinterpret_cast<uint4*>(as + (buf * kStemM + row) * kStemARow + kh) =
        make_uint4(v[0], v[1], v[2], v[3]);
  };
  constexpr int NI = NT / 16;  // 8-channel mma columns per warp
  float acc[2][NI][4] = {};
  const int wm = (warp % 4) * 32, wn = (warp / 4) * (NT / 2);
  const int gq = lane / 4, tq = lane % 4;
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(ws);
  const int steps = g.Kp / 16;
  gather(0);
  stage(0);
  __syncthreads();
  for (int s = 0; s < steps; ++s) {
    const int cur = s & 1;
    const bool more = s + 1 < steps;
    if (more) gather(s + 1);  // in flight during the multiplies below
    const uint32_t* a32 = reinterpret_cast<const uint32_t*>(as + cur * kStemM * kStemARow);
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int r = wm + mi * 16 + gq;
      a[mi][0] = a32[r * (kStemARow / 2) + tq];
      a[mi][1] = a32[(r + 8) * (kStemARow / 2) + tq];
      a[mi][2] = a32[r * (kStemARow / 2) + tq + 4];
      a[mi][3] = a32[(r + 8) * (kStemARow / 2) + tq + 4];
    }
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
      const int col = wn + ni * 8 + gq;
      const uint32_t b0 = w32[col * (wrow / 2) + s * 8 + tq];
      const uint32_t b1 = w32[col * (wrow / 2) + s * 8 + tq + 4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) mma_f16(acc[mi][ni], a[mi], b0, b1);
    }
    // The other buffer was last read in step s - 1, which every warp finished before the
    // barrier that ended it.
    if (more) stage(cur ^ 1);
    __syncthreads();
  }
  // Epilogue into a [kStemM][NT + 8] tile over the (now unused) filter and im2col buffers.
  __half* out = reinterpret_cast<__half*>(smem);
  constexpr int orow = NT + 8;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm + mi * 16 + gq + 8 * h;
      int n, p, q;
      // POOL: outputs outside the convolution's image are the pool's padding (-inf).
      const bool inside = !POOL || conv_pixel(r, &n, &p, &q);
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = wn + ni * 8 + tq * 2;
        const float y0 = apply_act(acc[mi][ni][2 * h] + bias[k0 + col], act);
        const float y1 = apply_act(acc[mi][ni][2 * h + 1] + bias[k0 + col + 1], act);
        *reinterpret_cast<__half2*>(out + r * orow + col) =
            inside ? __floats2half2_rn(y0, y1) : neg_inf2();
      }
    }
  __syncthreads();
  constexpr int row_chunks = NT / 8;
  if constexpr (POOL) {
    // Each pooled pixel's 8-channel chunk: the max over its window of the patch, 16-byte stores.
    for (int i = tid; i < kPoolTH * kPoolTW * row_chunks; i += kStemThreads) {
      const int c = i % row_chunks, pl = i / row_chunks;
      const int ly = pl / kPoolTW, lx = pl % kPoolTW;
      const int py = py0 + ly, px = px0 + lx;
      if (py >= pg.PP || px >= pg.PQ) continue;
      __half2 m[4];
      for (int e = 0; e < 4; ++e) m[e] = neg_inf2();
      for (int dy = 0; dy < pg.kh; ++dy)
        for (int dx = 0; dx < pg.kw; ++dx) {
          const int r = (ly * pg.sh + dy) * pg.cols + lx * pg.sw + dx;
          const uint4 v = *reinterpret_cast<const uint4*>(out + r * orow + c * 8);
          const __half2* h2 = reinterpret_cast<const __half2*>(&v);
          for (int e = 0; e < 4; ++e) m[e] = __hmax2(m[e], h2[e]);
        }
      *reinterpret_cast<uint4*>(y + ((static_cast<int64_t>(pn) * pg.PP + py) * pg.PQ + px) * g.K +
                                k0 + c * 8) = *reinterpret_cast<const uint4*>(m);
    }
  } else {
    for (int i = tid; i < kStemM * row_chunks; i += kStemThreads) {
      const int r = i / row_chunks, c = i % row_chunks;
      if (m0 + r < g.M)
        *reinterpret_cast<uint4*>(y + static_cast<int64_t>(m0 + r) * g.K + k0 + c * 8) =
            *reinterpret_cast<const uint4*>(out + r * orow + c * 8);
    }
  }
}

int round_up(int v, int m) { return (v + m - 1) / m * m; }

// kiln.FusedConvPool's max-pool (its "pool_" attributes): 2-D, one output, no dilation, no
// ceil mode, explicit pads.
struct PoolAttrs {
  int kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0;
};
bool read_pool(const Node& n, PoolAttrs* p, std::string* why) {
  const Attributes a = fused::strip_prefix(n.attrs, "pool_");
  const auto k = a.get_ints("kernel_shape", {});
  const auto st = a.get_ints("strides", {1, 1});
  const auto pads = a.get_ints("pads", {0, 0, 0, 0});
  const auto dil = a.get_ints("dilations", {1, 1});
  if (k.size() != 2 || st.size() != 2 || pads.size() != 4 || dil.size() != 2)
    return *why = "not a 2-D max-pool", false;
  if (dil[0] != 1 || dil[1] != 1) return *why = "a dilated max-pool", false;
  if (a.get_int("ceil_mode", 0) != 0) return *why = "a max-pool with ceil_mode", false;
  if (a.get_int("storage_order", 0) != 0) return *why = "a max-pool with storage_order", false;
  const std::string ap = a.get_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID") return *why = "a max-pool with auto_pad " + ap, false;
  *p = {static_cast<int>(k[0]), static_cast<int>(k[1]), static_cast<int>(st[0]),
        static_cast<int>(st[1]), static_cast<int>(pads[0]), static_cast<int>(pads[1]),
        static_cast<int>(pads[2]), static_cast<int>(pads[3])};
  if (ap == "VALID") p->pt = p->pl = p->pb = p->pr = 0;
  if (p->kh < 1 || p->kw < 1 || p->sh < 1 || p->sw < 1) return *why = "a bad max-pool window", false;
  return true;
}
bool is_conv_pool(const Node& n) { return n.op_type == "FusedConvPool"; }

// What both FusedConvPool/stem kernels need of the layer: a 2-D, ungrouped convolution with
// constant weights and bias, no residual, an activation they know. Returns the weights.
const Tensor* plain_conv(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  const Tensor* w = d.in_const(1);
  if (!w || w->rank() != 4 || d.in_type(0).rank() != 4)
    return *why = "not a 2-D convolution with constant weights", nullptr;
  if (n.attrs.get_int("group", 1) != 1) return *why = "grouped", nullptr;
  if (n.input(2) && !d.in_const(2)) return *why = "the bias is not constant", nullptr;
  if (n.num_inputs() > 3 && n.input(3)) return *why = "a residual", nullptr;
  ActParams a;
  if (!read_activation(n.attrs, &a)) return *why = "unknown activation", nullptr;
  return w;
}

bool stem_supports(const LayerDesc& d, std::string* why) {
  if (!unverified_tactics_enabled(why)) return false;
  const Node& n = *d.node;
  if (d.precision != Precision::kFP16) return *why = "FP16 layers only", false;
  if (d.in[0].dtype != DataType::kFloat16 || d.out[0].dtype != DataType::kFloat16 ||
      d.in[0].layout != Layout::kNHWC || d.out[0].layout != Layout::kNHWC)
    return *why = "float16 NHWC X and Y only", false;
  const Tensor* w = plain_conv(d, why);
  if (!w) return false;
  const int64_t K = w->dim(0), C = w->dim(1), R = w->dim(2), S = w->dim(3);
  if (C < 1 || C > 4) return *why = "more than 4 input channels (not a stem)", false;
  if (K % 32 != 0) return *why = "K is not a multiple of 32", false;
  const auto dil = n.attrs.get_ints("dilations", {1, 1});
  if (dil.size() == 2 && dil[1] != 1) return *why = "dilated along the width", false;
  if (round_up(static_cast<int>(R * round_up(static_cast<int>(S * C), 8)), 16) > kStemMaxReduction)
    return *why = "the filter is too large for the stem kernel", false;
  if (is_conv_pool(n)) {
    PoolAttrs pa;
    if (!read_pool(n, &pa, why)) return false;
    if (pa.kh > 3 || pa.kw > 3 || pa.sh > 2 || pa.sw > 2)
      return *why = "a max-pool window over 3x3 or a stride over 2", false;
    if (((kPoolTH - 1) * pa.sh + pa.kh) * ((kPoolTW - 1) * pa.sw + pa.kw) > kStemM)
      return *why = "the pool's patch does not fit the tile", false;
  }
  return true;
}

class StemConvLayer final : public Layer {
 public:
  explicit StemConvLayer(const LayerDesc& d) : node_(d.node) {
    read_activation(d.node->attrs, &act_);
    // Weights [K,C,R,S] -> float16 [K][Kp], reduction index r * SCp + s * C + c, zero-padded.
    const Tensor& w = *d.in_const(1);
    K_ = static_cast<int>(w.dim(0));
    C_ = static_cast<int>(w.dim(1));
    R_ = static_cast<int>(w.dim(2));
    S_ = static_cast<int>(w.dim(3));
    SCp_ = round_up(S_ * C_, 8);
    Kp_ = round_up(R_ * SCp_, 16);
    host_w_.assign(static_cast<size_t>(K_) * Kp_, __float2half(0.f));
    for (int k = 0; k < K_; ++k)
      for (int c = 0; c < C_; ++c)
        for (int r = 0; r < R_; ++r)
          for (int s = 0; s < S_; ++s)
            host_w_[static_cast<size_t>(k) * Kp_ + r * SCp_ + s * C_ + c] = __float2half(
                static_cast<float>(w.at_double(((static_cast<int64_t>(k) * C_ + c) * R_ + r) * S_ + s)));
    host_b_.assign(static_cast<size_t>(K_), 0.f);
    if (const Tensor* b = d.node->input(2) ? d.in_const(2) : nullptr)
      for (int k = 0; k < K_; ++k) host_b_[static_cast<size_t>(k)] = static_cast<float>(b->at_double(k));
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(ConvGeom c, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (c.nsp != 2) return KILN_ERROR("{}: not a 2-D convolution", node_->label());
    const int64_t M = c.N * c.out[0] * c.out[1];
    if (M * K_ >= (int64_t(1) << 31) || c.N * c.in[0] * c.in[1] * C_ >= (int64_t(1) << 31) ||
        (M + kStemM - 1) / kStemM > 65535)
      return KILN_ERROR("{}: tensor too large for the stem kernel", node_->label());
    g_ = {static_cast<int>(c.N), static_cast<int>(c.in[0]), static_cast<int>(c.in[1]), K_, R_,
          S_, static_cast<int>(c.out[0]), static_cast<int>(c.out[1]),
          static_cast<int>(c.stride[0]), static_cast<int>(c.stride[1]),
          static_cast<int>(c.pad_begin[0]), static_cast<int>(c.pad_begin[1]),
          static_cast<int>(c.dilation[0]), S_ * C_, SCp_, Kp_, static_cast<int>(M)};
    if (is_conv_pool(*node_)) {
      PoolAttrs pa;
      std::string why;
      if (!read_pool(*node_, &pa, &why)) return KILN_ERROR("{}: {}", node_->label(), why);
      pg_ = {(g_.P + pa.pt + pa.pb - pa.kh) / pa.sh + 1,
             (g_.Q + pa.pl + pa.pr - pa.kw) / pa.sw + 1,
             pa.kh, pa.kw, pa.sh, pa.sw, pa.pt, pa.pl,
             (kPoolTH - 1) * pa.sh + pa.kh, (kPoolTW - 1) * pa.sw + pa.kw, 0, 0};
      pg_.tiles_h = (pg_.PP + kPoolTH - 1) / kPoolTH;
      pg_.tiles_w = (pg_.PQ + kPoolTW - 1) / kPoolTW;
      if (out[0].shape.size() != 4 || out[0].shape[2] != pg_.PP || out[0].shape[3] != pg_.PQ)
        return KILN_ERROR("{}: the output is not the max-pool's size", node_->label());
      if (static_cast<int64_t>(g_.N) * pg_.tiles_h * pg_.tiles_w > 65535)
        return KILN_ERROR("{}: tensor too large for the stem kernel", node_->label());
    }
    if (!weights_.get()) {
      const size_t wb = round_up(static_cast<int>(host_w_.size() * sizeof(__half)), 256);
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + host_b_.size() * sizeof(float), "stem conv weights"));
      KILN_CUDA_CHECK(cudaMemcpy(weights_.get(), host_w_.data(), host_w_.size() * sizeof(__half),
                                 cudaMemcpyHostToDevice));
      bias_ = reinterpret_cast<float*>(static_cast<char*>(weights_.get()) + wb);
      KILN_CUDA_CHECK(cudaMemcpy(bias_, host_b_.data(), host_b_.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    if (reinterpret_cast<uintptr_t>(out[0].data) % 16 != 0)
      return KILN_ERROR("{}: the stem kernel needs a 16-byte aligned output", node_->label());
    const auto* x = static_cast<const __half*>(in[0].data);
    auto* y = static_cast<__half*>(out[0].data);
    const auto* w = static_cast<const __half*>(weights_.get());
    const bool wide = K_ % 64 == 0, pool = is_conv_pool(*node_);
    const int blocks = pool ? g_.N * pg_.tiles_h * pg_.tiles_w : (g_.M + kStemM - 1) / kStemM;
    const dim3 grid(K_ / (wide ? 64 : 32), blocks);
    const int bytes = wide ? stem_smem_bytes<64>(Kp_) : stem_smem_bytes<32>(Kp_);
    auto go = [&](auto kernel) {
      kernel<<<grid, kStemThreads, bytes, rc.stream>>>(x, w, bias_, y, g_, pg_, act_);
    };
    switch (C_ * 4 + (wide ? 2 : 0) + (pool ? 1 : 0)) {
      case 4: go(conv_stem<1, 32, false>); break;
      case 5: go(conv_stem<1, 32, true>); break;
      case 6: go(conv_stem<1, 64, false>); break;
      case 7: go(conv_stem<1, 64, true>); break;
      case 8: go(conv_stem<2, 32, false>); break;
      case 9: go(conv_stem<2, 32, true>); break;
      case 10: go(conv_stem<2, 64, false>); break;
      case 11: go(conv_stem<2, 64, true>); break;
      case 12: go(conv_stem<3, 32, false>); break;
      case 13: go(conv_stem<3, 32, true>); break;
      case 14: go(conv_stem<3, 64, false>); break;
      case 15: go(conv_stem<3, 64, true>); break;
      case 16: go(conv_stem<4, 32, false>); break;
      case 17: go(conv_stem<4, 32, true>); break;
      case 18: go(conv_stem<4, 64, false>); break;
      case 19: go(conv_stem<4, 64, true>); break;
      default: return KILN_ERROR("{}: {} input channels", node_->label(), C_);
    }
    KILN_CUDA_LAUNCH_CHECK("stem conv kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  ActParams act_;
  int K_ = 0, C_ = 0, R_ = 0, S_ = 0, SCp_ = 0, Kp_ = 0;
  std::vector<__half> host_w_;
  std::vector<float> host_b_;
  DeviceMemory weights_;  // float16 [K][Kp], then float bias [K]
  float* bias_ = nullptr;
  StemGeom g_{};
  PoolGeom pg_{};
};

// --- kiln.FusedConvPool's fallback (tactic kiln.convpool.direct, caps kFallback): any float type
// and layout, one thread per pooled output, each convolution output of its window computed
// directly. It makes the fused layer run where the stem kernel does not (strict FP32 for INT8
// calibration, a layer pinned to FP32), never fast: the optimizer fuses only for the stem kernel.

struct DirectGeom {
  int N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw;
  int PP, PQ, pkh, pkw, psh, psw, pph, ppw;
  bool nhwc;
};

template <typename T, typename Acc>
__global__ void conv_pool_direct(const T* __restrict__ x, const Acc* __restrict__ w,
                                 const Acc* __restrict__ bias, T* __restrict__ y, DirectGeom g,
                                 ActParams act) {
  const int64_t total = static_cast<int64_t>(g.N) * g.K * g.PP * g.PQ;
  KILN_GRID_STRIDE(i, total) {
    int64_t r = i;
    int n, k, py, px;
    if (g.nhwc) {
      k = static_cast<int>(r % g.K), r /= g.K;
      px = static_cast<int>(r % g.PQ), r /= g.PQ;
      py = static_cast<int>(r % g.PP), n = static_cast<int>(r / g.PP);
    } else {
      px = static_cast<int>(r % g.PQ), r /= g.PQ;
      py = static_cast<int>(r % g.PP), r /= g.PP;
      k = static_cast<int>(r % g.K), n = static_cast<int>(r / g.K);
    }
    Acc best = -INFINITY;
    for (int dy = 0; dy < g.pkh; ++dy)
      for (int dx = 0; dx < g.pkw; ++dx) {
        const int oy = py * g.psh - g.pph + dy, ox = px * g.psw - g.ppw + dx;
        if (oy < 0 || oy >= g.P || ox < 0 || ox >= g.Q) continue;  // the pool's padding
        Acc acc = bias ? bias[k] : Acc(0);
        for (int c = 0; c < g.C; ++c)
          for (int rr = 0; rr < g.R; ++rr) {
            const int ih = oy * g.sh - g.ph + rr * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            for (int ss = 0; ss < g.S; ++ss) {
              const int iw = ox * g.sw - g.pw + ss * g.dw;
              if (iw < 0 || iw >= g.W) continue;
              const int64_t xi = g.nhwc ? ((static_cast<int64_t>(n) * g.H + ih) * g.W + iw) * g.C + c
                                        : ((static_cast<int64_t>(n) * g.C + c) * g.H + ih) * g.W + iw;
              acc += static_cast<Acc>(load(x, xi)) * w[((static_cast<int64_t>(k) * g.C + c) * g.R + rr) * g.S + ss];
            }
          }
        // Rounded to T before the max, as the unfused layers store the convolution's output.
        T v;
        store(&v, 0, apply_act(acc, act));
        const Acc a = static_cast<Acc>(load(&v, 0));
        best = a > best ? a : best;
      }
    store(y, i, best);
  }
}

bool direct_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (!is_conv_pool(n)) return *why = "kiln.FusedConvPool only", false;
  const DataType t = d.in[0].dtype;
  if ((t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kFloat64) ||
      d.out[0].dtype != t || d.in[0].layout != d.out[0].layout)
    return *why = "X and Y of one float type and layout", false;
  const Tensor* w = plain_conv(d, why);
  if (!w) return false;
  PoolAttrs pa;
  return read_pool(n, &pa, why);
}

class DirectConvPoolLayer final : public Layer {
 public:
  explicit DirectConvPoolLayer(const LayerDesc& d) : node_(d.node) {
    read_activation(d.node->attrs, &act_);
    const Tensor& w = *d.in_const(1);
    host_w_.resize(static_cast<size_t>(w.numel()));
    for (int64_t i = 0; i < w.numel(); ++i) host_w_[static_cast<size_t>(i)] = w.at_double(i);
    if (const Tensor* b = d.node->input(2) ? d.in_const(2) : nullptr) {
      host_b_.resize(static_cast<size_t>(b->numel()));
      for (int64_t i = 0; i < b->numel(); ++i) host_b_[static_cast<size_t>(i)] = b->at_double(i);
    }
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(ConvGeom c, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (c.nsp != 2) return KILN_ERROR("{}: not a 2-D convolution", node_->label());
    PoolAttrs pa;
    std::string why;
    if (!read_pool(*node_, &pa, &why)) return KILN_ERROR("{}: {}", node_->label(), why);
    const int P = static_cast<int>(c.out[0]), Q = static_cast<int>(c.out[1]);
    g_ = {static_cast<int>(c.N), static_cast<int>(c.C), static_cast<int>(c.in[0]),
          static_cast<int>(c.in[1]), static_cast<int>(c.M), static_cast<int>(c.kernel[0]),
          static_cast<int>(c.kernel[1]), P, Q, static_cast<int>(c.stride[0]),
          static_cast<int>(c.stride[1]), static_cast<int>(c.pad_begin[0]),
          static_cast<int>(c.pad_begin[1]), static_cast<int>(c.dilation[0]),
          static_cast<int>(c.dilation[1]), (P + pa.pt + pa.pb - pa.kh) / pa.sh + 1,
          (Q + pa.pl + pa.pr - pa.kw) / pa.sw + 1, pa.kh, pa.kw, pa.sh, pa.sw, pa.pt, pa.pl,
          out[0].layout == Layout::kNHWC};
    if (out[0].shape.size() != 4 || out[0].shape[2] != g_.PP || out[0].shape[3] != g_.PQ)
      return KILN_ERROR("{}: the output is not the max-pool's size", node_->label());
    double64_ = in[0].dtype == DataType::kFloat64;
    if (!weights_.get()) {
      const size_t es = double64_ ? sizeof(double) : sizeof(float);
      const size_t wb = (host_w_.size() * es + 255) / 256 * 256;
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + host_b_.size() * es + 16, "conv-pool weights"));
      auto up = [&](const std::vector<double>& v, char* dst) -> Status {
        if (double64_) {
          KILN_CUDA_CHECK(cudaMemcpy(dst, v.data(), v.size() * sizeof(double), cudaMemcpyHostToDevice));
        } else {
          std::vector<float> f(v.begin(), v.end());
          KILN_CUDA_CHECK(cudaMemcpy(dst, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
        }
        return Status::Ok();
      };
      char* base = static_cast<char*>(weights_.get());
      KILN_RETURN_IF_ERROR(up(host_w_, base));
      if (!host_b_.empty()) KILN_RETURN_IF_ERROR(up(host_b_, base + wb));
      bias_ = host_b_.empty() ? nullptr : base + wb;
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    const int64_t total = out[0].numel();
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, double>) {
        conv_pool_direct<double, double><<<grid_for(total), kBlock, 0, rc.stream>>>(
            static_cast<const double*>(in[0].data), static_cast<const double*>(weights_.get()),
            static_cast<const double*>(bias_), static_cast<double*>(out[0].data), g_, act_);
      } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, __half>) {
        conv_pool_direct<T, float><<<grid_for(total), kBlock, 0, rc.stream>>>(
            static_cast<const T*>(in[0].data), static_cast<const float*>(weights_.get()),
            static_cast<const float*>(bias_), static_cast<T*>(out[0].data), g_, act_);
      }
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("conv-pool kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  ActParams act_;
  std::vector<double> host_w_, host_b_;
  DeviceMemory weights_;  // [K][C][R][S], then the bias, in float (double for float64)
  const void* bias_ = nullptr;
  bool double64_ = false;
  DirectGeom g_{};
};

}  // namespace

bool conv_pool_direct_supports(const LayerDesc& d, std::string* why) {
  return direct_supports(d, why);
}
Expected<std::unique_ptr<Layer>> create_conv_pool_direct(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new DirectConvPoolLayer(d));
}

bool stem_conv_supports(const LayerDesc& d, std::string* why) { return stem_supports(d, why); }
Expected<std::unique_ptr<Layer>> create_stem_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new StemConvLayer(d));
}

}  // namespace kiln::gpu
