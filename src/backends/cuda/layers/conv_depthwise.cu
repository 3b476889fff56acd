// kiln's depthwise convolution (group = C, M = K x C: K filters per input channel, K = 1 the
// plain depthwise layer) on NHWC tensors, with bias, residual and activation fused: MobileNet's
// and EfficientNet's 3x3/5x5 layers, ConvNeXt's 7x7, FastViT's and MobileOne's K = 2
// downsampling layers. cuDNN runs these through its legacy grouped path (~1.2 ms for one 112x112
// layer at batch 32, 20x the memory floor). The direct kernel: each thread makes V adjacent
// output channels of one output pixel with 16-byte stores, the V / K input channels under them
// one vector load a tap from L1, and the weights are float [tap][M] for vector loads. The strip
// kernels (variants strip4/8, stream4/8; K = 1) make a row of outputs a thread from inputs held
// in registers, the tile kernels (tile8/16, tile8r2/16r2) from a patch in shared memory.
#include <algorithm>
#include <map>
#include <vector>

#include "device_util_host.h"
#include "tactics/check.h"
#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "layers/conv_common.h"

namespace kiln::gpu {
namespace {

// C: input channels; M = K x C output channels (K = 1: M = C).
struct DwParams {
  int N, H, W, C, P, Q, kh, kw, sh, sw, dh, dw, ph, pw, M, K;
};

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// KC: the multiplier K known at compile time (V % KC == 0: the V outputs read V / KC adjacent
// input channels, one vector); KC = 0: K from p, one scalar input load per output channel.
template <typename T, int V, int KC>
__global__ void dwconv_nhwc(const T* __restrict__ x, const float* __restrict__ w,
                            const float* __restrict__ bias, const T* __restrict__ z,
                            T* __restrict__ y, DwParams p, ActParams act) {
  static_assert(V % (KC ? KC : 1) == 0, "whole input channels per thread");
  constexpr int IV = KC ? V / KC : 1;
  const int MV = p.M / V;
  const int total = p.N * p.P * p.Q * MV;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int mv = i % MV;
    int r = i / MV;
    const int q = r % p.Q;
    r /= p.Q;
    const int op = r % p.P;
    const int n = r / p.P;
    const int c0 = mv * V;
    float acc[V];
#pragma unroll
    for (int l = 0; l < V; ++l) acc[l] = bias ? bias[c0 + l] : 0.f;
    for (int a = 0; a < p.kh; ++a) {
      const int ih = op * p.sh - p.ph + a * p.dh;
      if (ih < 0 || ih >= p.H) continue;
      for (int b = 0; b < p.kw; ++b) {
        const int iw = q * p.sw - p.pw + b * p.dw;
        if (iw < 0 || iw >= p.W) continue;
        const T* px = x + ((static_cast<int64_t>(n) * p.H + ih) * p.W + iw) * p.C;
        const Pack<float, V> wv =
            *reinterpret_cast<const Pack<float, V>*>(w + (a * p.kw + b) * p.M + c0);
        if constexpr (KC == 0) {
#pragma unroll
          for (int l = 0; l < V; ++l) acc[l] += load(px, (c0 + l) / p.K) * wv.v[l];
        } else {
          const Pack<T, IV> xv = *reinterpret_cast<const Pack<T, IV>*>(px + c0 / KC);
#pragma unroll
          for (int l = 0; l < V; ++l) acc[l] += load(xv.v, l / KC) * wv.v[l];
        }
      }
    }
    const int64_t yo = ((static_cast<int64_t>(n) * p.P + op) * p.Q + q) * p.M + c0;
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

// The strip, stream and tile kernels' common parts: thread i's place (batch, output row, first
// output column of its strip, first channel), its accumulators set to the bias, and the
// epilogue: residual, activation and V-channel vector stores of the strip's outputs inside the
// row (16 bytes in the strip and stream kernels, 2 channels in the tile kernels).
struct StripAt {
  int n, op, q0, c0;
};
template <int V, int TW>
__device__ __forceinline__ StripAt strip_at(int64_t i, const DwParams& p) {
  const int CV = p.C / V, strips = (p.Q + TW - 1) / TW;
  const int cv = static_cast<int>(i % CV);
  int64_t r = i / CV;
  const int qs = static_cast<int>(r % strips);
  r /= strips;
  return {static_cast<int>(r / p.P), static_cast<int>(r % p.P), qs * TW, cv * V};
}
template <int V, int TW>
__device__ __forceinline__ void strip_init(float (&acc)[TW][V], const float* bias, int c0) {
#pragma unroll
  for (int l = 0; l < V; ++l) {
    const float b0 = bias ? bias[c0 + l] : 0.f;
#pragma unroll
    for (int t = 0; t < TW; ++t) acc[t][l] = b0;
  }
}
// kSum: the stored outputs (after the activation, before rounding to T) are also added to
// sum[V] (FusedConvMean's spatial mean).
template <typename T, int V, int TW, bool kSum, typename F>
__device__ __forceinline__ void strip_store_with(float (&acc)[TW][V], const StripAt& at,
                                                 const T* z, T* y, const DwParams& p, F f,
                                                 float* sum) {
  int64_t yo = ((static_cast<int64_t>(at.n) * p.P + at.op) * p.Q + at.q0) * p.C + at.c0;
#pragma unroll
  for (int t = 0; t < TW; ++t, yo += p.C) {
    if (at.q0 + t >= p.Q) break;
    if (z) {
      const Pack<T, V> zv = *reinterpret_cast<const Pack<T, V>*>(z + yo);
#pragma unroll
      for (int l = 0; l < V; ++l) acc[t][l] += load(zv.v, l);
    }
    Pack<T, V> out;
#pragma unroll
    for (int l = 0; l < V; ++l) {
      const float v = f(acc[t][l]);
      store(out.v, l, v);
      if constexpr (kSum) sum[l] += v;
    }
    *reinterpret_cast<Pack<T, V>*>(y + yo) = out;
  }
}
// The activation chosen once a thread, not per output (apply_act switches on its code).
template <typename T, int V, int TW, bool kSum = false>
__device__ __forceinline__ void strip_store(float (&acc)[TW][V], const StripAt& at, const T* z,
                                            T* y, const DwParams& p, const ActParams& act,
                                            float* sum = nullptr) {
  if (act.act == Act::kNone)
    strip_store_with<T, V, TW, kSum>(acc, at, z, y, p, [](float v) { return v; }, sum);
  else
    strip_store_with<T, V, TW, kSum>(acc, at, z, y, p,
                                     [&](float v) { return apply_act(v, act); }, sum);
}

// The strip form: a thread makes TW outputs along a row for V adjacent channels. Per filter row
// it loads the SPAN input vectors under its strip once into registers and reuses each for up to
// KW taps, where the direct kernel above reads KW x KH inputs (and the weights) per output: for
// ConvNeXt's 7x7 layers the inputs are read about 7x fewer times. Dilation 1, square strides
// along the row (S), any padding and filter height.
template <typename T, int V, int KW, int S, int TW>
__global__ void __launch_bounds__(256)
    dwconv_nhwc_strip(const T* __restrict__ x, const float* __restrict__ w,
                      const float* __restrict__ bias, const T* __restrict__ z,
                      T* __restrict__ y, DwParams p, ActParams act) {
  static_assert(sizeof(T) * V == 16, "one 16-byte vector of channels");
  constexpr int SPAN = (TW - 1) * S + KW;
  const int64_t total = int64_t(p.N) * p.P * ((p.Q + TW - 1) / TW) * (p.C / V);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const StripAt at = strip_at<V, TW>(i, p);
    const int n = at.n, op = at.op, q0 = at.q0, c0 = at.c0;
    float acc[TW][V];
    strip_init<V, TW>(acc, bias, c0);
    const int iw0 = q0 * S - p.pw;
    for (int a = 0; a < p.kh; ++a) {
      const int ih = op * p.sh - p.ph + a;
      if (ih < 0 || ih >= p.H) continue;
      const T* row = x + (static_cast<int64_t>(n) * p.H + ih) * p.W * p.C + c0;
      uint4 xin[SPAN];
#pragma unroll
      for (int j = 0; j < SPAN; ++j) {
        const int iw = iw0 + j;
        xin[j] = iw >= 0 && iw < p.W ? *reinterpret_cast<const uint4*>(row + int64_t(iw) * p.C)
                                     : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int b = 0; b < KW; ++b) {
        const Pack<float, V> wv =
            *reinterpret_cast<const Pack<float, V>*>(w + (a * KW + b) * p.C + c0);
#pragma unroll
        for (int t = 0; t < TW; ++t) {
          const T* xv = reinterpret_cast<const T*>(&xin[t * S + b]);
#pragma unroll
          for (int l = 0; l < V; ++l) acc[t][l] += load(xv, l) * wv.v[l];
        }
      }
    }
    strip_store<T, V, TW>(acc, at, z, y, p, act);
  }
}

// The stream form (variants stream4, stream8): the strip form's outputs, with the filter row's
// KW weight vectors held in registers and the SPAN input vectors streamed once, each converted
// to float once and added to every output whose window covers it (the strip form converts an
// input once per tap it meets). At most 128 registers for strips of 4 (two blocks an SM).
template <typename T, int V, int KW, int S, int TW>
__global__ void __launch_bounds__(256, TW <= 4 ? 2 : 1)
    dwconv_nhwc_stream(const T* __restrict__ x, const float* __restrict__ w,
                      const float* __restrict__ bias, const T* __restrict__ z,
                      T* __restrict__ y, DwParams p, ActParams act) {
  static_assert(sizeof(T) * V == 16, "one 16-byte vector of channels");
  constexpr int SPAN = (TW - 1) * S + KW;
  const int64_t total = int64_t(p.N) * p.P * ((p.Q + TW - 1) / TW) * (p.C / V);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const StripAt at = strip_at<V, TW>(i, p);
    const int n = at.n, op = at.op, q0 = at.q0, c0 = at.c0;
    float acc[TW][V];
    strip_init<V, TW>(acc, bias, c0);
    const int iw0 = q0 * S - p.pw;
    for (int a = 0; a < p.kh; ++a) {
      const int ih = op * p.sh - p.ph + a;
      if (ih < 0 || ih >= p.H) continue;
      const T* row = x + (static_cast<int64_t>(n) * p.H + ih) * p.W * p.C + c0;
      Pack<float, V> wrow[KW];
#pragma unroll
      for (int b = 0; b < KW; ++b)
        wrow[b] = *reinterpret_cast<const Pack<float, V>*>(w + (a * KW + b) * p.C + c0);
#pragma unroll
      for (int j = 0; j < SPAN; ++j) {
        const int iw = iw0 + j;
        const uint4 raw = iw >= 0 && iw < p.W
                              ? *reinterpret_cast<const uint4*>(row + int64_t(iw) * p.C)
                              : make_uint4(0, 0, 0, 0);
        const T* xv = reinterpret_cast<const T*>(&raw);
        float xf[V];
#pragma unroll
        for (int l = 0; l < V; ++l) xf[l] = load(xv, l);
#pragma unroll
        for (int t = 0; t < TW; ++t) {
          const int b = j - t * S;  // the tap of output t that input j is under
          if (b < 0 || b >= KW) continue;
#pragma unroll
          for (int l = 0; l < V; ++l) acc[t][l] += xf[l] * wrow[b].v[l];
        }
      }
    }
    strip_store<T, V, TW>(acc, at, z, y, p, act);
  }
}

// The tile form (variants tile8, tile16, tile8r2, tile16r2): a block makes TH x TWB outputs of
// 32 channels. It copies the input patch under them (with the halo, zero outside the image) and
// the 32 channels' filters into shared memory with 16-byte asynchronous copies, then each thread
// makes R strips of SW outputs along R adjacent rows for 2 channels from shared memory: per input
// row the filter rows' KW weight pairs, and the SPAN input pairs under the strips each read and
// converted once for all R strips (R = 2: about a fifth fewer instructions an output, the loads
// and conversions shared, for twice the accumulators). The strip and
// stream forms above read inputs and weights from global memory each filter row and wait on
// them; here the global reads are issued together at the start and everything after runs from
// shared memory. The two half-warps take vertically adjacent strips, and the patch's rows are
// padded so that their reads fall in different banks. Square strides S (both axes), dilation 1,
// C a multiple of 8.
constexpr int kTileC = 32;  // channels a block

// FusedConvMean's second output, the mean of Y over its P x Q positions ([N, C], T), made by the
// tile kernels as they store Y: each block adds its 32 channels' sums into `sums` (float atomics),
// counts itself done in `done`, and the last block of an image's channel block writes the means
// and zeroes its sums and count again, so the next run (a graph replay too) finds them zero. Both
// arrays belong to the layer (one per execution context, zeroed when made), not to the shared
// workspace, which nothing zeroes. The order of the atomic adds varies: a mean may differ
// between runs in its last bits.
template <typename T>
struct DwMean {
  float* sums = nullptr;      // [N][C]
  unsigned* done = nullptr;   // [N][channel blocks]
  T* mean = nullptr;          // [N][C]
  float inv_area = 0;         // 1 / (P x Q)
};

// The block's part of the mean: thread sums of channels c0 + 2 x (lane % 16) + {0, 1}, meeting in
// shared memory `red` (kThreads / 32 x kTileC floats and a flag, free again: the caller
// synchronized after its last read of it).
template <typename T, int kThreads>
__device__ __forceinline__ void dw_block_mean(float (&sum)[2], float* red, int n, int c0,
                                              int tiles, const DwParams& p, const DwMean<T>& m) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned* last = reinterpret_cast<unsigned*>(red + kThreads / 32 * kTileC);
#pragma unroll
  for (int j = 0; j < 2; ++j) sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 16);
  if (lane < 16) {
    red[warp * kTileC + 2 * lane] = sum[0];
    red[warp * kTileC + 2 * lane + 1] = sum[1];
  }
  __syncthreads();
  const int t = threadIdx.x, c = c0 + t;
  const int64_t nc = int64_t(n) * p.C + c;
  if (t < kTileC && c < p.C) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) s += red[w * kTileC + t];
    atomicAdd(m.sums + nc, s);
  }
  __threadfence();  // the adds reach memory before the block counts itself done
  __syncthreads();
  unsigned* done = m.done + int64_t(n) * ((p.C + kTileC - 1) / kTileC) + c0 / kTileC;
  if (t == 0) *last = atomicAdd(done, 1u) == unsigned(tiles - 1);
  __syncthreads();
  if (!*last) return;
  if (t < kTileC && c < p.C) store(m.mean, nc, atomicExch(m.sums + nc, 0.f) * m.inv_area);
  if (t == 0) *done = 0;
}
template <typename T, int KH, int KW, int S, int TH, int TWB, int SW, int R>
struct DwTile {
  static constexpr int NSC = TWB / SW;               // strips a row
  static constexpr int kThreads = 16 * TH / R * NSC;  // 16 channel pairs x TH / R x NSC strips
  static constexpr int RIN = (TH - 1) * S + KH;      // patch rows
  static constexpr int CIN = (TWB - 1) * S + KW;     // patch columns
  // The patch's row stride in elements: its row plus the least padding (whole 16-byte chunks)
  // that puts the two half-warps' reads, R x S rows apart, 64 bytes apart modulo 128: other
  // banks.
  static constexpr int row_stride() {
    constexpr int chunk = 16 / sizeof(T);
    for (int e = 0;; e += chunk)
      if ((R * S * (CIN * kTileC + e) * int(sizeof(T))) % 128 == 64) return CIN * kTileC + e;
  }
  static constexpr int RS = row_stride();
  static constexpr int SPAN = (SW - 1) * S + KW;
  static constexpr size_t kWeightBytes = size_t(KH) * KW * kTileC * sizeof(float);
  static constexpr size_t kSmem = kWeightBytes + size_t(RIN) * RS * sizeof(T);
  static_assert(TH % (2 * R) == 0 && TWB % SW == 0, "pairs of strips of R rows");
};

template <typename T, int KH, int KW, int S, int TH, int TWB, int SW, int R, bool kMean>
__global__ void __launch_bounds__(DwTile<T, KH, KW, S, TH, TWB, SW, R>::kThreads,
                                  R == 1 && DwTile<T, KH, KW, S, TH, TWB, SW, R>::kThreads <= 256
                                      ? 5
                                      : 1)
    dwconv_nhwc_tile(const T* __restrict__ x, const float* __restrict__ w,
                     const float* __restrict__ bias, const T* __restrict__ z,
                     T* __restrict__ y, DwParams p, ActParams act, DwMean<T> mean) {
  using G = DwTile<T, KH, KW, S, TH, TWB, SW, R>;
  constexpr int CB = kTileC, CH = 16 / sizeof(T), CPP = CB / CH;  // 16-byte chunks a pixel
  extern __shared__ __align__(16) unsigned char smem[];
  float* ws = reinterpret_cast<float*>(smem);                 // [KH * KW][CB]
  T* xs = reinterpret_cast<T*>(smem + G::kWeightBytes);       // [RIN][RS: CIN x CB, padding]
  int b = blockIdx.x;
  const int cblocks = (p.C + CB - 1) / CB, tq = (p.Q + TWB - 1) / TWB, tp = (p.P + TH - 1) / TH;
  const int c0 = (b % cblocks) * CB;
  b /= cblocks;
  const int ow0 = (b % tq) * TWB;
  b /= tq;
  const int oh0 = (b % tp) * TH, n = b / tp;
  // Every copy is issued before any is waited for (cp.async, zeros where a chunk lies outside
  // the image or past the last channel): one trip to memory a block, not one a loop round.
  for (int i = threadIdx.x; i < KH * KW * (CB / 4); i += G::kThreads) {
    const int tap = i / (CB / 4), c = c0 + (i % (CB / 4)) * 4;  // 4 floats a chunk
    cp_async16(ws + tap * CB + c - c0, c < p.C ? w + tap * p.C + c : w, c < p.C);
  }
  // A thread copies one 16-byte chunk (ch) of every PSTEP-th pixel: the chunk's channel and
  // its bounds test once, a pixel's place from its row and column in the patch.
  constexpr int PSTEP = G::kThreads / CPP;
  static_assert(G::kThreads % CPP == 0, "whole pixels a pass");
  const int ch = threadIdx.x % CPP, cc = c0 + ch * CH;
  const int ih0 = oh0 * S - p.ph, iw0 = ow0 * S - p.pw;
  const T* xn = x + int64_t(n) * p.H * p.W * p.C + cc;
  T* xd = xs + ch * CH;
  for (int pix = threadIdx.x / CPP; pix < G::RIN * G::CIN; pix += PSTEP) {
    const int r = pix / G::CIN, c = pix - r * G::CIN;
    const int ih = ih0 + r, iw = iw0 + c;
    const bool in = cc < p.C && unsigned(ih) < unsigned(p.H) && unsigned(iw) < unsigned(p.W);
    cp_async16(xd + r * G::RS + c * CB, in ? xn + int64_t(ih * p.W + iw) * p.C : x, in);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cp = lane & 15, scol = (warp % G::NSC) * SW;
  const int srow = ((warp / G::NSC) * 2 + (lane >> 4)) * R;  // the strips' first row
  const int op = oh0 + srow, c = c0 + 2 * cp;
  // A warp's strips share a column: one wholly right of the map (Q = 56 in tiles of 16) skips
  // (with kMean it still meets the block for the mean).
  const bool live = op < p.P && c < p.C && ow0 + scol < p.Q;
  if (!kMean && !live) return;
  float sum[2] = {0.f, 0.f};
  if (live) {
  float acc[R][SW][2];
#pragma unroll
  for (int r = 0; r < R; ++r) strip_init<2, SW>(acc[r], bias, c);
  // Input row i of the strips' window feeds strip r through filter row i - r x S: with R = 2
  // each input row is read and converted once for two strips.
#pragma unroll
  for (int i = 0; i < (R - 1) * S + KH; ++i) {
    float2 wr[R][KW];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int a = i - r * S;
      if (a < 0 || a >= KH) continue;
#pragma unroll
      for (int k = 0; k < KW; ++k)
        wr[r][k] = *reinterpret_cast<const float2*>(ws + (a * KW + k) * CB + 2 * cp);
    }
    const T* xr = xs + (srow * S + i) * G::RS + scol * S * CB + 2 * cp;
#pragma unroll
    for (int j = 0; j < G::SPAN; ++j) {
      const Pack<T, 2> xv = *reinterpret_cast<const Pack<T, 2>*>(xr + j * CB);
      const float x0 = load(xv.v, 0), x1 = load(xv.v, 1);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int a = i - r * S;
        if (a < 0 || a >= KH) continue;
#pragma unroll
        for (int t = 0; t < SW; ++t) {
          const int k = j - t * S;  // the tap of output t that input j is under
          if (k < 0 || k >= KW) continue;
          acc[r][t][0] += x0 * wr[r][k].x;
          acc[r][t][1] += x1 * wr[r][k].y;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (op + r < p.P)
      strip_store<T, 2, SW, kMean>(acc[r], StripAt{n, op + r, ow0 + scol, c}, z, y, p, act, sum);
  }
  if constexpr (kMean) {
    __syncthreads();  // every warp is done with the filters and the patch: reused below
    dw_block_mean<T, G::kThreads>(sum, ws, n, c0, tp * tq, p, mean);
  }
}

template <typename T, int KH, int KW, int S, int TH, int TWB, int SW, int R>
bool launch_tile_shape(const T* x, const float* w, const float* b, const T* z, T* y,
                       const DwParams& p, const ActParams& act, const DwMean<T>& mean,
                       cudaStream_t stream) {
  using G = DwTile<T, KH, KW, S, TH, TWB, SW, R>;
  static_assert(G::kSmem >= (G::kThreads / 32 + 1) * kTileC * sizeof(float),
                "room for the mean's sums");
  auto kernel = mean.sums ? dwconv_nhwc_tile<T, KH, KW, S, TH, TWB, SW, R, true>
                          : dwconv_nhwc_tile<T, KH, KW, S, TH, TWB, SW, R, false>;
  // Above 48 KB of shared memory a kernel has to ask for it, on each device it runs on: asked at
  // every launch of those few shapes (7x7 at stride 2 in tile16, some float32 ones), a host call
  // that graph replays do not repeat.
  if (G::kSmem > 48 * 1024 &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(G::kSmem)) != cudaSuccess)
    return false;
  const int64_t blocks = int64_t(p.N) * ((p.P + TH - 1) / TH) * ((p.Q + TWB - 1) / TWB) *
                         ((p.C + kTileC - 1) / kTileC);
  if (blocks >= (int64_t(1) << 31)) return false;
  kernel<<<static_cast<unsigned>(blocks), G::kThreads, G::kSmem, stream>>>(x, w, b, z, y, p, act,
                                                                           mean);
  return true;
}

// The tile kernels compiled: square 3x3, 5x5 and 7x7 filters at strides 1 and 2; tile8 is a
// block of 8 x 8 outputs (small maps: ConvNeXt's and EfficientNet's 7x7 and 14x14 stages), tile16
// 8 x 16, tile8r2 8 x 8 and tile16r2 16 x 16 with two rows a thread; strips of 8 outputs at
// stride 1, 4 at stride 2.
template <typename T, int TH, int TWB, int R>
bool launch_tile(const T* x, const float* w, const float* b, const T* z, T* y, const DwParams& p,
                 const ActParams& act, const DwMean<T>& mean, cudaStream_t stream) {
  if (p.kh != p.kw || p.sh != p.sw || p.C % (16 / int(sizeof(T))) != 0) return false;
#define KILN_DW_TILE(K, S, SW)                                                                \
  if (p.kw == K && p.sw == S)                                                                 \
    return launch_tile_shape<T, K, K, S, TH, TWB, SW, R>(x, w, b, z, y, p, act, mean, stream);
  KILN_DW_TILE(3, 1, 8) KILN_DW_TILE(5, 1, 8) KILN_DW_TILE(7, 1, 8)
  KILN_DW_TILE(3, 2, 4) KILN_DW_TILE(5, 2, 4) KILN_DW_TILE(7, 2, 4)
#undef KILN_DW_TILE
  return false;
}

// The strip and stream kernels compiled: filter widths 3, 5, 7 at strides 1 and 2, strips of 4
// or 8.
template <typename T, int V, int TW, bool STREAM>
bool launch_strip(const T* x, const float* w, const float* b, const T* z, T* y, const DwParams& p,
                  const ActParams& act, cudaStream_t stream) {
  if (p.C % V != 0) return false;
  const int64_t threads = int64_t(p.N) * p.P * ((p.Q + TW - 1) / TW) * (p.C / V);
  const unsigned grid = grid_for(threads);
#define KILN_DW_STRIP(KW, S)                                                                   \
  if (p.kw == KW && p.sw == S) {                                                               \
    if constexpr (STREAM)                                                                      \
      dwconv_nhwc_stream<T, V, KW, S, TW><<<grid, kBlock, 0, stream>>>(x, w, b, z, y, p, act); \
    else                                                                                       \
      dwconv_nhwc_strip<T, V, KW, S, TW><<<grid, kBlock, 0, stream>>>(x, w, b, z, y, p, act);  \
    return true;                                                                               \
  }
  KILN_DW_STRIP(3, 1) KILN_DW_STRIP(5, 1) KILN_DW_STRIP(7, 1)
  KILN_DW_STRIP(3, 2) KILN_DW_STRIP(5, 2) KILN_DW_STRIP(7, 2)
#undef KILN_DW_STRIP
  return false;
}

bool strip_applies(const LayerDesc& d) {
  const Tensor* w = d.in_const(1);
  if (!w || w->rank() != 4 || w->shape()[0] != d.node->attrs.get_int("group", 1)) return false;
  const int64_t kw = w->shape()[3];
  const std::vector<int64_t> dil = d.node->attrs.get_ints("dilations");
  const std::vector<int64_t> str = d.node->attrs.get_ints("strides");
  const bool dil1 = std::all_of(dil.begin(), dil.end(), [](int64_t v) { return v == 1; });
  const int64_t sw = str.size() == 2 ? str[1] : 1;
  return dil1 && (kw == 3 || kw == 5 || kw == 7) && (sw == 1 || sw == 2);
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
  if (group < 2 || w->rank() != 4 || w->shape()[0] % group != 0 || w->shape()[1] != 1)
    return *why = "not depthwise (group = C, M a multiple of C)", false;
  if (n.op_type == "FusedConv" || n.op_type == "FusedConvMean") {
    ActParams a;
    if (!read_activation(n.attrs, &a)) return *why = "unknown activation", false;
    if (n.input(3) && d.in_type(3).dims != d.out_type(0).dims)
      return *why = "the residual broadcasts", false;
  }
  return true;
}

class DepthwiseConvLayer final : public Layer {
 public:
  explicit DepthwiseConvLayer(const LayerDesc& d)
      : node_(d.node),
        strip_(d.variant == "strip4" || d.variant == "stream4"                        ? 4
               : d.variant == "strip8" || d.variant == "stream8" || d.variant.rfind("tile8", 0) == 0
                   ? 8
               : d.variant.rfind("tile16", 0) == 0 ? 16
                                                   : 0),
        rows_(d.variant.size() > 2 && d.variant.compare(d.variant.size() - 2, 2, "r2") == 0 ? 2
                                                                                          : 1),
        mean_(d.node->op_type == "FusedConvMean"),
        form_(d.variant.rfind("stream", 0) == 0 ? Form::kStream
              : d.variant.rfind("tile", 0) == 0 ? Form::kTile
                                                : Form::kStrip) {
    if (d.node->op_type != "Conv") read_activation(d.node->attrs, &act_);
    // Weights [M,1,kh,kw] -> float [kh*kw][M]; bias float [M]. Uploaded at the first configure.
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
    if (g.N * g.out[0] * g.out[1] * g.M >= (int64_t(1) << 31) ||
        g.N * g.in[0] * g.in[1] * g.C >= (int64_t(1) << 31))
      return KILN_ERROR("{}: tensor too large for the depthwise kernel", node_->label());
    p_ = {static_cast<int>(g.N), static_cast<int>(g.in[0]), static_cast<int>(g.in[1]),
          static_cast<int>(g.C), static_cast<int>(g.out[0]), static_cast<int>(g.out[1]),
          static_cast<int>(g.kernel[0]), static_cast<int>(g.kernel[1]),
          static_cast<int>(g.stride[0]), static_cast<int>(g.stride[1]),
          static_cast<int>(g.dilation[0]), static_cast<int>(g.dilation[1]),
          static_cast<int>(g.pad_begin[0]), static_cast<int>(g.pad_begin[1]),
          static_cast<int>(g.M), static_cast<int>(g.M / g.C)};
    if (!weights_.get()) {
      const size_t wb = host_w_.size() * sizeof(float), bb = host_b_.size() * sizeof(float);
      KILN_RETURN_IF_ERROR(weights_.reserve(wb + bb + 16, "depthwise conv weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(weights_.get(), host_w_.data(), wb, "depthwise weights"));
      KILN_RETURN_IF_ERROR(cuda::upload(bias_ptr(), host_b_.data(), bb, "depthwise bias"));
    }
    if (mean_) {  // the mean's running sums and block counts (DwMean): zero, and grown, here
      const size_t sums = size_t(p_.N) * p_.C * sizeof(float);
      const size_t bytes = sums + size_t(p_.N) * ((p_.C + kTileC - 1) / kTileC) * sizeof(unsigned);
      if (bytes > mean_bytes_) {
        KILN_RETURN_IF_ERROR(mean_state_.reserve(bytes, "depthwise mean sums"));
        if (cudaMemset(mean_state_.get(), 0, bytes) != cudaSuccess)
          return KILN_ERROR("{}: cannot zero the mean's sums", node_->label());
        mean_bytes_ = bytes;
      }
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
    bool launched = true;
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, float>) {
        constexpr int V = 16 / sizeof(T);
        const T* x = static_cast<const T*>(in[0].data);
        T* y = static_cast<T*>(out[0].data);
        const T* zp = z ? static_cast<const T*>(z->data) : nullptr;
        const int64_t pixels = int64_t(p_.N) * p_.P * p_.Q;
        const bool strip_ok = vec_ok && p_.K == 1 && p_.dh == 1 && p_.dw == 1;
        DwMean<T> mean;
        if (mean_) {
          mean.sums = static_cast<float*>(mean_state_.get());
          mean.done = reinterpret_cast<unsigned*>(mean.sums + int64_t(p_.N) * p_.C);
          mean.mean = static_cast<T*>(out[1].data);
          mean.inv_area = 1.f / static_cast<float>(int64_t(p_.P) * p_.Q);
          // Only the tile kernels make the mean (the variants offered: tile ones).
          launched = strip_ok && form_ == Form::kTile && launch_strips<T, V>(x, w, b, zp, y, mean, rc.stream);
          return;
        }
        if (strip_ok && strip_ > 0 && launch_strips<T, V>(x, w, b, zp, y, mean, rc.stream)) return;
        // Vector paths: K = 1 and K = 2 (FastViT's), each V outputs reading V / K inputs.
        const bool vec = vec_ok && p_.M % V == 0;
        if (vec && p_.K == 1)
          dwconv_nhwc<T, V, 1><<<grid_for(pixels * p_.M / V), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
        else if (vec && p_.K == 2)
          dwconv_nhwc<T, V, 2><<<grid_for(pixels * p_.M / V), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
        else if (p_.K == 1)
          dwconv_nhwc<T, 1, 1><<<grid_for(pixels * p_.M), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
        else
          dwconv_nhwc<T, 1, 0><<<grid_for(pixels * p_.M), kBlock, 0, rc.stream>>>(x, w, b, zp, y, p_, act_);
      }
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    if (!launched)
      return KILN_ERROR("{}: no tile kernel for this shape, which the mean needs", node_->label());
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
  template <typename T, int V>
  bool launch_strips(const T* x, const float* w, const float* b, const T* z, T* y,
                     const DwMean<T>& m, cudaStream_t s) const {
    switch (form_) {
      case Form::kStrip:
        return strip_ == 4 ? launch_strip<T, V, 4, false>(x, w, b, z, y, p_, act_, s)
                           : launch_strip<T, V, 8, false>(x, w, b, z, y, p_, act_, s);
      case Form::kStream:
        return strip_ == 4 ? launch_strip<T, V, 4, true>(x, w, b, z, y, p_, act_, s)
                           : launch_strip<T, V, 8, true>(x, w, b, z, y, p_, act_, s);
      case Form::kTile:
        if (rows_ == 2)
          return strip_ == 8 ? launch_tile<T, 8, 8, 2>(x, w, b, z, y, p_, act_, m, s)
                             : launch_tile<T, 16, 16, 2>(x, w, b, z, y, p_, act_, m, s);
        return strip_ == 8 ? launch_tile<T, 8, 8, 1>(x, w, b, z, y, p_, act_, m, s)
                           : launch_tile<T, 8, 16, 1>(x, w, b, z, y, p_, act_, m, s);
    }
    return false;
  }
  enum class Form { kStrip, kStream, kTile };
  int strip_;  // strip4/stream4: 4 outputs a thread along a row; tile8: 8 wide; 0: direct kernel
  Form form_;  // which of the strip, stream and tile kernels
  int rows_;   // tile kernels: output rows a thread (the variants ending in r2: 2)
  bool mean_;  // FusedConvMean: output 1 is Y's spatial mean (DwMean)
  ActParams act_;
  std::vector<float> host_w_, host_b_;
  DeviceMemory weights_;
  DeviceMemory mean_state_;  // DwMean's sums and counts, mean_bytes_ of them zeroed
  size_t mean_bytes_ = 0;
  DwParams p_{};
};

}  // namespace

bool depthwise_conv_supports(const LayerDesc& d, std::string* why) {
  return depthwise_supports(d, why);
}
// FusedConvMean: what the tile kernels take (one filter a channel, square 3x3, 5x5 or 7x7 at
// stride 1 or 2, dilation 1, C a multiple of the 16-byte vector); test-backend-ops' cases
// conv.dw_mean_* check it against the CPU backend.
bool depthwise_mean_supports(const LayerDesc& d, std::string* why) {
  if (!depthwise_supports(d, why)) return false;
  const Tensor& w = *d.in_const(1);
  if (w.shape()[0] != d.node->attrs.get_int("group", 1)) return *why = "a channel multiplier", false;
  if (!strip_applies(d) || w.shape()[2] != w.shape()[3])
    return *why = "not a square 3x3, 5x5 or 7x7 filter at stride 1 or 2, dilation 1", false;
  const std::vector<int64_t> str = d.node->attrs.get_ints("strides");
  if (str.size() == 2 && str[0] != str[1]) return *why = "unequal strides", false;
  const Dim& c = (*d.in_type(0).dims)[1];
  const int64_t vec = d.in[0].dtype == DataType::kFloat16 ? 8 : 4;
  if (!c.is_static() || c.value % vec != 0)
    return *why = "channels not a known multiple of the 16-byte vector", false;
  return true;
}
std::vector<std::string> depthwise_mean_variants(const LayerDesc&) {
  return {"tile8", "tile16", "tile8r2", "tile16r2"};
}
// The tuner times the direct kernel ("") and, where they apply, the strip, stream and
// tile kernels (4 and 8 outputs a thread; tiles 8 and 16 wide, one or two rows a thread) (a run
// whose tensors are not 16-byte aligned takes the direct kernel).
std::vector<std::string> depthwise_conv_variants(const LayerDesc& d) {
  if (!strip_applies(d)) return {""};
  const Tensor* w = d.in_const(1);
  if (w->shape()[2] != w->shape()[3]) return {"", "strip4", "strip8", "stream4", "stream8"};
  return {"", "strip4", "strip8", "stream4", "stream8", "tile8", "tile16", "tile8r2", "tile16r2"};
}
Expected<std::unique_ptr<Layer>> create_depthwise_conv(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new DepthwiseConvLayer(d));
}

}  // namespace kiln::gpu
