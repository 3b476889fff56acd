// kiln's stem convolution (tactic kiln.conv.stem): kiln.FusedConv in FP16 on NHWC images with
// few input channels (C <= 4: a CNN's first layer, e.g. ResNet's 7x7/2 on RGB), bias and
// activation fused. cuDNN pads C = 3 up to 8 for each of the 49 taps (the kernel study: 0.6 ms,
// 23% of the H100's FP16 rate, at batch 256); here the whole filter is one GEMM reduction over
// r, s and c with C padded only to 4 (7 * 7 * 4 = 196 -> 208 instead of 49 * 8 = 392).
//
// A block is persistent: it loads its NT channels' filter (float16 [NT][reduction]) into shared
// memory once and then walks tiles of 128 convolution outputs (a 2-D patch of one image: 4 x 32
// outputs, or the patch under 3 x 8 pooled outputs). Per tile it copies the tile's input patch
// (IH x IW pixels, C padded to Cp, zeros outside the image) into shared memory once; the im2col
// matrix is never built: an A fragment word is the patch word at (the pixel's corner) + (the
// reduction index's offset), from a small table. The next tile's patch is loaded into registers
// while the tensor cores work on this one (mma.sync m16n8k16, float16 in, float32 accumulation,
// 8 warps of 32 x NT/2). The epilogue (bias, activation, float16) stages the tile in shared
// memory and writes it out in 16-byte stores.
//
// kiln.FusedConvPool (tactic kiln.convpool.stem) is the same kernel with the max-pool in its
// epilogue: the tile's rows are the patch of convolution outputs under 3 x 8 pooled pixels (7 x 17
// = 119 of the 128 rows for a 3x3/2 pool), and only the pooled pixels are written. Its fallback,
// kiln.convpool.direct, is at the end.
//
// On the H100 (docs/perf.md, sixth session) both forms are correct but slow: ResNet-50's stem at
// batch 256 takes 0.93 ms here against cuDNN's 0.60 ms (the tuner keeps cuDNN), the pooled form
// 1.10 ms against 0.92 ms for cuDNN's stem plus the max-pool, so the pooled form stays gated
// (unverified_tactics_enabled) and the optimizer does not fuse. The tensor-core feed is what is
// slow (~92 TFLOPS); a profile of it is the next step.
#include <algorithm>
#include <vector>

#include "device_util_host.h"
#include "tactics/check.h"
#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "layers/conv_common.h"
#include "ops/fused_util.h"

namespace kiln::gpu {
namespace {

constexpr int kStemM = 128;        // convolution outputs per tile
constexpr int kStemThreads = 256;  // 8 warps: 4 along the outputs x 2 along the channels
constexpr int kStemTH = 4, kStemTW = 32;  // a plain tile: 4 x 32 outputs
constexpr int kPoolTH = 3, kPoolTW = 8;   // a pooled tile: 3 x 8 pooled outputs
constexpr int kStemMaxReduction = 224;    // R * S * Cp, padded to 16
constexpr int kStemMaxPatch = 4096;       // halves of one input patch buffer (8 KiB)
constexpr int kStemPrefetch = 12;         // patch elements per thread: IH * IW * C <= 3072

struct StemGeom {
  int N, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh;
  int Cp, Kp;                   // channels per tap in shared memory (C padded to even); the
                                // reduction R * S * Cp padded to 16
  int TH, TW;                   // a tile's convolution outputs: TH x TW <= kStemM
  int IH, IW, rowh;             // its input patch: IH x IW pixels, rowh = IW * Cp halves per row
  int tiles_h, tiles_w, tiles;  // tiles per image along h and w; tiles in all
  // kiln.FusedConvPool: the pooled size, the window, strides and leading pads.
  int PP, PQ, pkh, pkw, psh, psw, pph, ppw;
};

template <int NT>
constexpr int stem_smem_bytes(int Kp) {
  return NT * (Kp + 8) * 2 + 2 * kStemMaxPatch * 2 + kStemM * (NT + 8) * 2 + Kp / 2 * 4;
}

// Tile t: its image and the first convolution output of its patch (for a pooled tile, also its
// first pooled output).
struct StemTile {
  int n, oy0, ox0, py0, px0;
};
template <bool POOL>
__device__ __forceinline__ StemTile stem_tile(const StemGeom& g, int t) {
  const int per_image = g.tiles_h * g.tiles_w, r = t % per_image;
  StemTile s{t / per_image, 0, 0, 0, 0};
  if constexpr (POOL) {
    s.py0 = (r / g.tiles_w) * kPoolTH;
    s.px0 = (r % g.tiles_w) * kPoolTW;
    s.oy0 = s.py0 * g.psh - g.pph;
    s.ox0 = s.px0 * g.psw - g.ppw;
  } else {
    s.oy0 = (r / g.tiles_w) * g.TH;
    s.ox0 = (r % g.tiles_w) * g.TW;
  }
  return s;
}

// Fragments (PTX ISA, m16n8k16 .f16; lane = 4 * gq + tq): A (16 x 16, row-major) a0 = A[gq][2tq,
// 2tq+1], a1 = A[gq+8][2tq..], a2 = A[gq][2tq+8..], a3 = A[gq+8][2tq+8..]; B (16 x 8, column-major)
// b0 = B[2tq, 2tq+1][gq], b1 = B[2tq+8..][gq]; C c0,c1 = C[gq][2tq, 2tq+1], c2,c3 = C[gq+8][...].
// A[m][k] (k = (r * S + s) * Cp + c, a pair of k in one word as Cp is even) is the patch word at
// corner(m) + offs[k / 2]; the filter is stored [channel][k], so b0 and b1 are one word each.
template <int C, int NT, bool POOL>
__global__ void __launch_bounds__(kStemThreads, 2)
    conv_stem(const __half* __restrict__ x, const __half* __restrict__ w,
              const float* __restrict__ bias, __half* __restrict__ y, StemGeom g, ActParams act) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int wrow = g.Kp + 8;                      // halves per filter row (+8: no bank conflicts)
  __half* ws = reinterpret_cast<__half*>(smem);  // [NT][wrow]
  __half* patch = ws + NT * wrow;                 // [2][kStemMaxPatch]
  __half* out = patch + 2 * kStemMaxPatch;        // [kStemM][NT + 8]: the epilogue's tile
  int* offs = reinterpret_cast<int*>(out + kStemM * (NT + 8));  // [Kp / 2], -1: padding
  constexpr int orow = NT + 8;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.y * NT;
  // The filter rows of this block's channels (16-byte chunks), the offset table, and zeroed patch
  // buffers (the padding channels c >= C stay zero; the loads write only c < C).
  const int chunks = g.Kp / 8;
  for (int i = tid; i < NT * chunks; i += kStemThreads) {
    const int r = i / chunks, c = i % chunks;
    *reinterpret_cast<uint4*>(ws + r * wrow + c * 8) =
        *reinterpret_cast<const uint4*>(w + static_cast<int64_t>(k0 + r) * g.Kp + c * 8);
  }
  const int SCp = g.S * g.Cp;
  for (int i = tid; i < g.Kp / 2; i += kStemThreads) {
    const int k = 2 * i, r = k / SCp;
    offs[i] = r < g.R ? (r * g.dh * g.rowh + (k - r * SCp)) / 2 : -1;
  }
  for (int i = tid; i < 2 * kStemMaxPatch / 8; i += kStemThreads)
    reinterpret_cast<uint4*>(patch)[i] = make_uint4(0, 0, 0, 0);
  // This thread's patch elements (flat NHWC order within the patch, so loads coalesce):
  // (iy << 16) | (ix << 3) | c, or -1 past the patch.
  const int npatch = g.IH * g.IW * C;
  int where[kStemPrefetch];
#pragma unroll
  for (int i = 0; i < kStemPrefetch; ++i) {
    const int e = tid + i * kStemThreads;
    const int iy = e / (g.IW * C), rem = e - iy * g.IW * C, ix = rem / C;
    where[i] = e < npatch ? (iy << 16) | (ix << 3) | (rem - ix * C) : -1;
  }
  uint32_t pre[kStemPrefetch / 2];  // two float16 bit patterns per register (one each ran slower)
  const auto* xs = reinterpret_cast<const unsigned short*>(x);
  auto fetch = [&](int t) {
    const StemTile tl = stem_tile<POOL>(g, t);
    const int ih0 = tl.oy0 * g.sh - g.ph, iw0 = tl.ox0 * g.sw - g.pw;
    const int64_t img = static_cast<int64_t>(tl.n) * g.H;
#pragma unroll
    for (int i = 0; i < kStemPrefetch; ++i) {
      const int ih = ih0 + (where[i] >> 16), iw = iw0 + ((where[i] >> 3) & 0x1fff);
      const uint32_t v = where[i] >= 0 && ih >= 0 && ih < g.H && iw >= 0 && iw < g.W
                             ? xs[((img + ih) * g.W + iw) * C + (where[i] & 7)]
                             : 0u;  // float16 zero: the convolution's padding
      pre[i / 2] = i % 2 == 0 ? v : pre[i / 2] | (v << 16);
    }
  };
  auto place = [&](int buf) {
    auto* ps = reinterpret_cast<unsigned short*>(patch + buf * kStemMaxPatch);
#pragma unroll
    for (int i = 0; i < kStemPrefetch; ++i)
      if (where[i] >= 0)
        ps[(where[i] >> 16) * g.rowh + ((where[i] >> 3) & 0x1fff) * g.Cp + (where[i] & 7)] =
            static_cast<unsigned short>(pre[i / 2] >> (16 * (i % 2)));
  };
  // The 4 tile rows whose A fragments this lane loads: their corners (patch words) and (ly, lx).
  constexpr int NI = NT / 16;  // 8-channel mma columns per warp
  const int wm = (warp % 4) * 32, wn = (warp / 4) * (NT / 2);
  const int gq = lane / 4, tq = lane % 4;
  int corner[2][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = wm + mi * 16 + gq + 8 * h;
      const int ly = m / g.TW, lx = m % g.TW;
      corner[mi][h] = m < g.TH * g.TW ? (ly * g.sh * g.rowh + lx * g.sw * g.Cp) / 2 : 0;
    }
  const uint32_t* w32 = reinterpret_cast<const uint32_t*>(ws);
  const int steps = g.Kp / 16;
  int t = blockIdx.x;
  __syncthreads();  // zeroed buffers before the first patch lands
  if (t < g.tiles) {
    fetch(t);
    place(0);
  }
  __syncthreads();
  for (int it = 0; t < g.tiles; ++it, t += gridDim.x) {
    const int buf = it & 1, next = t + gridDim.x;
    if (next < g.tiles) fetch(next);  // in flight during the multiplies below
    const uint32_t* p32 = reinterpret_cast<const uint32_t*>(patch + buf * kStemMaxPatch);
    float acc[2][NI][4] = {};
    for (int s = 0; s < steps; ++s) {
      const int o0 = offs[s * 8 + tq], o1 = offs[s * 8 + tq + 4];
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        a[mi][0] = o0 >= 0 ? p32[corner[mi][0] + o0] : 0u;
        a[mi][1] = o0 >= 0 ? p32[corner[mi][1] + o0] : 0u;
        a[mi][2] = o1 >= 0 ? p32[corner[mi][0] + o1] : 0u;
        a[mi][3] = o1 >= 0 ? p32[corner[mi][1] + o1] : 0u;
      }
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int col = wn + ni * 8 + gq;
        const uint32_t b0 = w32[col * (wrow / 2) + s * 8 + tq];
        const uint32_t b1 = w32[col * (wrow / 2) + s * 8 + tq + 4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) mma_f16(acc[mi][ni], a[mi], b0, b1);
      }
    }
    // Epilogue into `out` (free: the last tile's stores ended with a barrier).
    const StemTile tl = stem_tile<POOL>(g, t);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm + mi * 16 + gq + 8 * h;
        // POOL: outputs outside the convolution's image are the pool's padding (-inf).
        bool inside = true;
        if constexpr (POOL) {
          const int oy = tl.oy0 + r / g.TW, ox = tl.ox0 + r % g.TW;
          inside = r < g.TH * g.TW && oy >= 0 && oy < g.P && ox >= 0 && ox < g.Q;
        }
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int col = wn + ni * 8 + tq * 2;
          const float y0 = apply_act(acc[mi][ni][2 * h] + bias[k0 + col], act);
          const float y1 = apply_act(acc[mi][ni][2 * h + 1] + bias[k0 + col + 1], act);
          *reinterpret_cast<__half2*>(out + r * orow + col) =
              inside ? __floats2half2_rn(y0, y1) : half2_neg_inf();
        }
      }
    // The other patch buffer was last read by the previous tile's multiplies, which every warp
    // finished before the barriers that ended it.
    if (next < g.tiles) place(buf ^ 1);
    __syncthreads();
    constexpr int row_chunks = NT / 8;
    if constexpr (POOL) {
      // Each pooled pixel's 8-channel chunk: the max over its window of the patch.
      for (int i = tid; i < kPoolTH * kPoolTW * row_chunks; i += kStemThreads) {
        const int c = i % row_chunks, pl = i / row_chunks;
        const int ly = pl / kPoolTW, lx = pl % kPoolTW;
        const int py = tl.py0 + ly, px = tl.px0 + lx;
        if (py >= g.PP || px >= g.PQ) continue;
        __half2 m[4];
        for (int e = 0; e < 4; ++e) m[e] = half2_neg_inf();
        for (int dy = 0; dy < g.pkh; ++dy)
          for (int dx = 0; dx < g.pkw; ++dx) {
            const int r = (ly * g.psh + dy) * g.TW + lx * g.psw + dx;
            const uint4 v = *reinterpret_cast<const uint4*>(out + r * orow + c * 8);
            const __half2* h2 = reinterpret_cast<const __half2*>(&v);
            for (int e = 0; e < 4; ++e) m[e] = __hmax2(m[e], h2[e]);
          }
        *reinterpret_cast<uint4*>(
            y + ((static_cast<int64_t>(tl.n) * g.PP + py) * g.PQ + px) * g.K + k0 + c * 8) =
            *reinterpret_cast<const uint4*>(m);
      }
    } else {
      for (int i = tid; i < kStemM * row_chunks; i += kStemThreads) {
        const int r = i / row_chunks, c = i % row_chunks;
        const int p = tl.oy0 + r / g.TW, q = tl.ox0 + r % g.TW;
        if (r < g.TH * g.TW && p < g.P && q < g.Q)
          *reinterpret_cast<uint4*>(
              y + ((static_cast<int64_t>(tl.n) * g.P + p) * g.Q + q) * g.K + k0 + c * 8) =
              *reinterpret_cast<const uint4*>(out + r * orow + c * 8);
      }
    }
    __syncthreads();  // `out` free and the next patch in place
  }
}

int round_up(int v, int m) { return (v + m - 1) / m * m; }

}  // namespace

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

void StemWeights::read_bias(const LayerDesc& d, int K) {
  b.assign(static_cast<size_t>(K), 0.f);
  if (const Tensor* t = d.node->input(2) ? d.in_const(2) : nullptr)
    for (int k = 0; k < K; ++k) b[static_cast<size_t>(k)] = static_cast<float>(t->at_double(k));
}

Status StemWeights::upload_once(const std::string& what) {
  if (mem.get()) return Status::Ok();
  const size_t w_bytes = w.size() * sizeof(__half), wb = (w_bytes + 255) / 256 * 256;
  KILN_RETURN_IF_ERROR(mem.reserve(wb + b.size() * sizeof(float), what));
  KILN_RETURN_IF_ERROR(cuda::upload(mem.get(), w.data(), w_bytes, what.c_str()));
  float* dst = reinterpret_cast<float*>(static_cast<char*>(mem.get()) + wb);
  KILN_RETURN_IF_ERROR(cuda::upload(dst, b.data(), b.size() * sizeof(float), what.c_str()));
  bias = dst;
  return Status::Ok();
}

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

namespace {

// The stem kernel's geometry for a convolution (and its pool) of these sizes; false with the
// reason where a tile's patch or filter does not fit.
bool stem_geometry(int N, int H, int W, int C, int K, int R, int S, int P, int Q, int sh, int sw,
                   int ph, int pw, int dh, const PoolAttrs* pool, StemGeom* g, std::string* why) {
  *g = {};
  g->N = N, g->H = H, g->W = W, g->K = K, g->R = R, g->S = S, g->P = P, g->Q = Q;
  g->sh = sh, g->sw = sw, g->ph = ph, g->pw = pw, g->dh = dh;
  g->Cp = C % 2 == 0 ? C : C + 1;
  g->Kp = round_up(R * S * g->Cp, 16);
  if (g->Kp > kStemMaxReduction) return *why = "the filter is too large for the stem kernel", false;
  if (pool) {
    if (pool->kh > 3 || pool->kw > 3 || pool->sh > 2 || pool->sw > 2)
      return *why = "a max-pool window over 3x3 or a stride over 2", false;
    g->pkh = pool->kh, g->pkw = pool->kw, g->psh = pool->sh, g->psw = pool->sw;
    g->pph = pool->pt, g->ppw = pool->pl;
    g->PP = (P + pool->pt + pool->pb - pool->kh) / pool->sh + 1;
    g->PQ = (Q + pool->pl + pool->pr - pool->kw) / pool->sw + 1;
    g->TH = (kPoolTH - 1) * pool->sh + pool->kh;
    g->TW = (kPoolTW - 1) * pool->sw + pool->kw;
    g->tiles_h = (g->PP + kPoolTH - 1) / kPoolTH;
    g->tiles_w = (g->PQ + kPoolTW - 1) / kPoolTW;
  } else {
    g->TH = kStemTH, g->TW = kStemTW;
    g->tiles_h = (P + kStemTH - 1) / kStemTH;
    g->tiles_w = (Q + kStemTW - 1) / kStemTW;
  }
  g->IH = (g->TH - 1) * sh + (R - 1) * dh + 1;
  g->IW = (g->TW - 1) * sw + S;
  g->rowh = g->IW * g->Cp;
  if (g->IH * g->rowh > kStemMaxPatch || g->IH * g->IW * C > kStemPrefetch * kStemThreads ||
      g->IW >= (1 << 13))
    return *why = "a tile's input patch does not fit the stem kernel (strides or filter too large)", false;
  const int64_t tiles = static_cast<int64_t>(N) * g->tiles_h * g->tiles_w;
  if (tiles >= (int64_t(1) << 31)) return *why = "tensor too large for the stem kernel", false;
  g->tiles = static_cast<int>(tiles);
  return true;
}

bool stem_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  // The pooled form makes the optimizer fuse the stem and its max-pool before any timing, and on
  // the H100 it is slower than cuDNN's stem plus kiln's max-pool (1.10 against 0.92 ms for
  // ResNet-50 at batch 256, docs/perf.md): gated until it wins. The plain form is timed against
  // cuDNN by the tuner like any tactic.
  if (is_conv_pool(n) &&
      !unverified_tactics_enabled(why, "the fused stem + max-pool is slower than the unfused pair"))
    return false;
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
  const auto st = n.attrs.get_ints("strides", {1, 1});
  if (st.size() != 2 || R > 64 || S > 64 || st[0] > 64 || st[1] > 64 || dil[0] > 64)
    return *why = "a filter, stride or dilation over 64", false;
  PoolAttrs pa;
  const bool pool = is_conv_pool(n);
  if (pool && !read_pool(n, &pa, why)) return false;
  // The tile sizes do not depend on the image's size: check them on a nominal one.
  StemGeom g;
  return stem_geometry(1, 64, 64, static_cast<int>(C), static_cast<int>(K), static_cast<int>(R),
                       static_cast<int>(S), 64, 64, static_cast<int>(st[0]),
                       static_cast<int>(st[1]), 0, 0, static_cast<int>(dil[0]),
                       pool ? &pa : nullptr, &g, why);
}

using StemKernel = void (*)(const __half*, const __half*, const float*, __half*, StemGeom, ActParams);

template <int C>
StemKernel stem_kernel_for(bool wide, bool pool) {
  if (wide) return pool ? conv_stem<C, 64, true> : conv_stem<C, 64, false>;
  return pool ? conv_stem<C, 32, true> : conv_stem<C, 32, false>;
}

class StemConvLayer final : public Layer {
 public:
  explicit StemConvLayer(const LayerDesc& d) : node_(d.node) {
    read_activation(d.node->attrs, &act_);
    // Weights [K,C,R,S] -> float16 [K][Kp], reduction index (r * S + s) * Cp + c, zero-padded.
    const Tensor& w = *d.in_const(1);
    K_ = static_cast<int>(w.dim(0));
    C_ = static_cast<int>(w.dim(1));
    R_ = static_cast<int>(w.dim(2));
    S_ = static_cast<int>(w.dim(3));
    Cp_ = C_ % 2 == 0 ? C_ : C_ + 1;
    Kp_ = round_up(R_ * S_ * Cp_, 16);
    weights_.w.assign(static_cast<size_t>(K_) * Kp_, __float2half(0.f));
    for (int k = 0; k < K_; ++k)
      for (int c = 0; c < C_; ++c)
        for (int r = 0; r < R_; ++r)
          for (int s = 0; s < S_; ++s)
            weights_.w[static_cast<size_t>(k) * Kp_ + (r * S_ + s) * Cp_ + c] = __float2half(
                static_cast<float>(w.at_double(((static_cast<int64_t>(k) * C_ + c) * R_ + r) * S_ + s)));
    weights_.read_bias(d, K_);
    const bool wide = K_ % 64 == 0, pool = is_conv_pool(*node_);
    switch (C_) {
      case 1: kernel_ = stem_kernel_for<1>(wide, pool); break;
      case 2: kernel_ = stem_kernel_for<2>(wide, pool); break;
      case 3: kernel_ = stem_kernel_for<3>(wide, pool); break;
      case 4: kernel_ = stem_kernel_for<4>(wide, pool); break;
      default: break;  // supports() refused it; configure() says so
    }
    nt_ = wide ? 64 : 32;
    smem_ = wide ? stem_smem_bytes<64>(Kp_) : stem_smem_bytes<32>(Kp_);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    if (!kernel_) return KILN_ERROR("{}: {} input channels", node_->label(), C_);
    KILN_ASSIGN_OR_RETURN(ConvGeom c, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (c.nsp != 2) return KILN_ERROR("{}: not a 2-D convolution", node_->label());
    if (c.N * c.in[0] * c.in[1] * C_ >= (int64_t(1) << 31) ||
        c.N * c.out[0] * c.out[1] * K_ >= (int64_t(1) << 31))
      return KILN_ERROR("{}: tensor too large for the stem kernel", node_->label());
    PoolAttrs pa;
    const bool pool = is_conv_pool(*node_);
    std::string why;
    if (pool && !read_pool(*node_, &pa, &why)) return KILN_ERROR("{}: {}", node_->label(), why);
    if (!stem_geometry(static_cast<int>(c.N), static_cast<int>(c.in[0]), static_cast<int>(c.in[1]),
                       C_, K_, R_, S_, static_cast<int>(c.out[0]), static_cast<int>(c.out[1]),
                       static_cast<int>(c.stride[0]), static_cast<int>(c.stride[1]),
                       static_cast<int>(c.pad_begin[0]), static_cast<int>(c.pad_begin[1]),
                       static_cast<int>(c.dilation[0]), pool ? &pa : nullptr, &g_, &why))
      return KILN_ERROR("{}: {}", node_->label(), why);
    const int64_t expect_h = pool ? g_.PP : g_.P, expect_w = pool ? g_.PQ : g_.Q;
    if (out[0].shape.size() != 4 || out[0].shape[2] != expect_h || out[0].shape[3] != expect_w)
      return KILN_ERROR("{}: the output is not the {}'s size", node_->label(),
                        pool ? "max-pool" : "convolution");
    // Persistent blocks: two per SM (each keeps its filter in shared memory), at most one per tile.
    const int sms = sm_count();
    if (sms <= 0) return KILN_ERROR("{}: the GPU's SM count is not available", node_->label());
    blocks_ = static_cast<int>(std::min<int64_t>(g_.tiles, 2 * static_cast<int64_t>(sms)));
    // Over the default 48 KiB of dynamic shared memory: an opt-in per kernel and device, made at
    // configure time (not while a run may be captured into a CUDA graph).
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel_, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_));
    KILN_RETURN_IF_ERROR(weights_.upload_once("stem conv weights"));
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0 || g_.tiles == 0) return Status::Ok();
    if (reinterpret_cast<uintptr_t>(out[0].data) % 16 != 0)
      return KILN_ERROR("{}: the stem kernel needs a 16-byte aligned output", node_->label());
    const dim3 grid(blocks_, K_ / nt_);
    kernel_<<<grid, kStemThreads, smem_, rc.stream>>>(
        static_cast<const __half*>(in[0].data), weights_.weights(), weights_.bias,
        static_cast<__half*>(out[0].data), g_, act_);
    KILN_CUDA_LAUNCH_CHECK("stem conv kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  ActParams act_;
  int K_ = 0, C_ = 0, R_ = 0, S_ = 0, Cp_ = 0, Kp_ = 0, nt_ = 64, smem_ = 0, blocks_ = 0;
  StemKernel kernel_ = nullptr;
  StemWeights weights_;  // float16 [K][Kp]
  StemGeom g_{};
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
          KILN_RETURN_IF_ERROR(cuda::upload(dst, v.data(), v.size() * sizeof(double), "conv-pool weights"));
        } else {
          std::vector<float> f(v.begin(), v.end());
          KILN_RETURN_IF_ERROR(cuda::upload(dst, f.data(), f.size() * sizeof(float), "conv-pool weights"));
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
