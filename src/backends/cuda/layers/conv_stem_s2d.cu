// kiln's pooled stem (tactics kiln.convpool.s2d and kiln.convpool.s2d.quantize): a CNN's first
// layer and its max-pool as one kernel (kiln.FusedConvPool in FP16: ResNet's 7x7/2 convolution on
// RGB, bias and ReLU, then the 3x3/2 max-pool). It reads the model's own float32 NCHW images
// (tactic cap kRawIn0: no reformat ahead of it) and writes only the pooled tensor, float16 NHWC,
// or (the .quantize form, kQuantOut) the int8 codes the next INT8 layer reads. Unfused, ResNet-50
// at batch 256 spends ~1 ms here on the H100: the images' reformat, cuDNN's stem writing 411 MB
// of float16 and the max-pool reading it back.
//
// Space-to-depth: a stride-2 convolution on an image is a stride-1 convolution on the image's
// 2 x 2 pixel blocks (16 channels: a, b, c for the block's row, column and the RGB channel padded
// to 4). A 7 x 7 filter (8 x 8 with a zero row and column in front when the padding is odd) is a
// 4 x 4 filter over blocks, so the reduction is 16 taps of 16 float16: each tap's slice of an A
// row is one 32-byte block in shared memory, which ldmatrix reads directly (no im2col, no
// per-element gather: the table-driven gather of kiln.conv.stem is what made it slow).
//
// A block is persistent: it keeps its 64 output channels' filter (16 taps x 64 x 16 float16,
// 32 KiB) in shared memory and walks tiles of 7 x 8 pooled outputs of one image (the max-pool is
// the stems' 3x3/2, fixed at compile time: the epilogue and the pool cost more instructions than
// the multiplies when their geometry is read at run time). A tile's convolution outputs are the
// 15 x 17 = 255 under its pooled outputs (padded to 256 rows); its input patch is 18 x 20 blocks
// (36 x 40 pixels). Four warps of 64 rows x 64 channels (m16n8k16, float32 accumulators that start
// at the bias) run the 16 taps, unrolled, every ldmatrix address a register plus an immediate; the
// epilogue (activation, float16 rounding: the values the unfused layers store) stages the tile in
// shared memory, where the max-pool reads it. The next tile's pixels arrive by 8-byte cp.async as
// float32 while the tensor cores work on this one, and are converted to float16 blocks after it.
// 16-byte block halves are XOR-swizzled so ldmatrix's eight rows hit distinct banks. On the H100
// (docs/perf.md, tenth session): 0.39 ms for ResNet-50 at batch 256, against ~1 ms unfused.
#include <algorithm>
#include <vector>

#include "device_util_host.h"
#include "kernels/device_util.cuh"
#include "kernels/int8.cuh"
#include "kernels/mma.cuh"
#include "layers/conv_common.h"
#include "quant/int8.h"
#include "tactics/check.h"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 128;        // 4 warps x 64 convolution outputs
constexpr int kNT = 64;              // output channels per block
constexpr int kPH = 7, kPW = 8;      // pooled outputs per tile (a 3x3/2 max-pool)
constexpr int kCH = 2 * kPH + 1, kCW = 2 * kPW + 1;  // the convolution outputs under them: 15 x 17
constexpr int kSH = kCH + 3, kSW = kCW + 3;  // the patch in 2 x 2 blocks (4 x 4 taps): 18 x 20
constexpr int kSP = 24;              // blocks per patch row in shared memory (a multiple of 8: a
                                     // tap's row offset keeps the swizzle, so it is an immediate)
constexpr int kIH = 2 * kSH, kIW = 2 * kSW;  // the patch in pixels
constexpr int kC = 3;                // input channels (RGB)
constexpr int kTaps = 16;            // 4 x 4 block taps
constexpr int kPatchElems = kC * kIH * kIW;                           // 4320 floats
constexpr int kPatchBytes = kSH * kSP * 32;                           // 13,824
constexpr int kFilterBytes = kTaps * kNT * 32;                        // 32 KiB
constexpr int kOutRow = kNT + 8;     // halves per staged output row (+8: no bank conflicts)
constexpr int kSmem = kFilterBytes + kPatchBytes + kPatchElems * 4 + 256 * kOutRow * 2 + kNT * 4;

struct S2dGeom {
  int H, W, K;         // input [tiles' images, 3, H, W] float32; K output channels
  int P, Q;            // the convolution's output size
  int ph, pw, oh, ow;  // its leading pads and their parities
  int PP, PQ;          // the pooled output size
  int pph, ppw;        // the max-pool's leading pads (0 or 1)
  int tiles_w, tiles;
};

// The byte offset of 16-byte half h of block q (XOR-swizzled by bit 2 of q).
__device__ __forceinline__ uint32_t block_half(int q, int h) {
  return static_cast<uint32_t>(q * 32 + ((h ^ ((q >> 2) & 1)) << 4));
}

// Tile t: image n, first pooled output (py0, px0), first convolution output (oy0, ox0).
struct Tile {
  int n, py0, px0, oy0, ox0;
};
__device__ __forceinline__ Tile tile_of(const S2dGeom& g, int t) {
  const int per_image = ((g.PP + kPH - 1) / kPH) * g.tiles_w, r = t % per_image;
  Tile s;
  s.n = t / per_image;
  s.py0 = (r / g.tiles_w) * kPH;
  s.px0 = (r % g.tiles_w) * kPW;
  s.oy0 = s.py0 * 2 - g.pph;
  s.ox0 = s.px0 * 2 - g.ppw;
  return s;
}

// Tile t's pixels by cp.async as float32 into `raw` ([c][row][col]; loads coalesce along the
// image rows; zeros outside the image: the convolution's padding). The patch's first pixel is two
// pixels per block row ahead of the convolution's window by its pad rounded up to even.
__device__ __forceinline__ void fetch_pixels(const float* __restrict__ x, const S2dGeom& g, int t,
                                             float* raw, int tid) {
  const Tile tl = tile_of(g, t);
  const int iy0 = 2 * tl.oy0 - g.ph - g.oh, ix0 = 2 * tl.ox0 - g.pw - g.ow;
  const float* img = x + static_cast<int64_t>(tl.n) * kC * g.H * g.W;
  if (tid < 6 * (kIW / 2)) {  // 120 threads: a column pair each, every sixth row
    const int p = tid % (kIW / 2), r0 = tid / (kIW / 2);
    const int ix = ix0 + 2 * p;
    const bool col_ok = ix >= 0 && ix < g.W;  // ix0 and W even: both pixels in, or both out
#pragma unroll
    for (int c = 0; c < kC; ++c)
#pragma unroll
      for (int row = r0; row < kIH; row += 6) {
        const int iy = iy0 + row;
        const bool ok = col_ok && iy >= 0 && iy < g.H;
        cp_async8(raw + (c * kIH + row) * kIW + 2 * p,
                  ok ? img + (static_cast<int64_t>(c) * g.H + iy) * g.W + ix : img, ok);
      }
  }
  cp_async_commit();
}

// The filter's 32-byte rows (one output channel's slice of a k-step) into shared memory, 16-byte
// halves swizzled by channel, from [step][K][32 bytes] in global memory.
__device__ __forceinline__ void load_filter(unsigned char* ws, const unsigned char* __restrict__ w,
                                            int steps, int K, int k0, int tid) {
  for (int i = tid; i < steps * kNT * 2; i += kThreads) {
    const int step = i / (2 * kNT), n = (i / 2) % kNT, h = i % 2;
    *reinterpret_cast<uint4*>(ws + (step * kNT + n) * 32 + ((h ^ ((n >> 2) & 1)) << 4)) =
        *reinterpret_cast<const uint4*>(w + (static_cast<int64_t>(step) * K + k0 + n) * 32 +
                                        h * 16);
  }
}

// B lanes of ldmatrix over the filter (load_filter's layout): channel nb * 16 + 8 * (lane / 16) +
// lane % 8, 16-byte half (lane / 8) % 2, for the 4 x 16 channels of a block.
__device__ __forceinline__ void filter_lanes(uint32_t (&bb)[4], const unsigned char* ws, int lane) {
#pragma unroll
  for (int nb = 0; nb < 4; ++nb) {
    const int n = nb * 16 + 8 * (lane / 16) + lane % 8;
    bb[nb] = smem_u32(ws) + n * 32 + ((((lane / 8) % 2) ^ ((n >> 2) & 1)) << 4);
  }
}

// One k-step of a warp's 64 rows x 64 channels: the step's B fragments from the filter (at byte
// offset `b_off` of each lane address), then per 16-row block its A fragment (at a[mt]) times
// the eight 8-channel columns. Mma is mma_f16 or mma_s8, Acc float or int32_t.
template <typename Acc, typename Mma>
__device__ __forceinline__ void warp_k_step(Acc (&acc)[4][8][4], const uint32_t (&a)[4],
                                            const uint32_t (&bb)[4], uint32_t b_off, Mma mma) {
  uint32_t b[4][4];
#pragma unroll
  for (int nb = 0; nb < 4; ++nb) ldmatrix_x4(b[nb], bb[nb] + b_off);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    uint32_t af[4];
    ldmatrix_x4(af, a[mt]);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      mma(acc[mt][nt], af, b[nt / 2][(nt % 2) * 2], b[nt / 2][(nt % 2) * 2 + 1]);
  }
}

// The epilogue's walk over a lane's accumulator rows: f(mt, h, r, inside) for row r = warp * 64 +
// mt * 16 + gq + 8h of the tile (a convolution output), `inside` whether it lies in the image
// (those outside are the max-pool's padding).
template <typename F>
__device__ __forceinline__ void for_each_acc_row(const S2dGeom& g, const Tile& tl, int warp, int gq,
                                                 F f) {
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 64 + mt * 16 + gq + 8 * h;
      const int oy = tl.oy0 + r / kCW, ox = tl.ox0 + r % kCW;
      f(mt, h, r, oy >= 0 && oy < g.P && ox >= 0 && ox < g.Q);
    }
}

// The epilogue's activation: none, ReLU (a packed float16 max), or any other (apply_act's switch,
// out of line: inlined per element it costs more instructions than the tile's multiplies, so the
// common two are their own instantiations).
__device__ __noinline__ float stem_act_any(float v, ActParams act) { return apply_act(v, act); }

template <bool Q8, int A>
__global__ void __launch_bounds__(kThreads, 2)
    stem_s2d(const float* __restrict__ x, const __half* __restrict__ w,
             const float* __restrict__ bias, void* __restrict__ yv, S2dGeom g, ActParams act,
             float scale, float inv) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ws = smem;                            // [tap][64][2 x 16 bytes]
  unsigned char* patch = smem + kFilterBytes;          // [kSH][kSP][2 x 16 bytes]
  float* raw = reinterpret_cast<float*>(patch + kPatchBytes);  // [kC][kIH][kIW]
  __half* out = reinterpret_cast<__half*>(raw + kPatchElems);   // [256][kOutRow]
  float* bias_s = reinterpret_cast<float*>(out + 256 * kOutRow);  // [kNT]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.y * kNT;
  // The filter (16-byte halves, swizzled by channel) and the bias.
  if (tid < kNT) bias_s[tid] = bias[k0 + tid];
  load_filter(ws, reinterpret_cast<const unsigned char*>(w), kTaps, g.K, k0, tid);

  // The next tile's pixels arrive by cp.async as float32 in `raw` (fetch_pixels); `convert` then
  // writes them to `patch` as float16 blocks, one 16-byte block half (b = 0, 1 x c = 0..3) per
  // step.
  auto fetch = [&](int t) { fetch_pixels(x, g, t, raw, tid); };
  auto convert = [&]() {
    for (int i = tid; i < kSH * kSW * 2; i += kThreads) {
      const int by = i / (2 * kSW), bx = (i / 2) % kSW, a = i % 2;
      const int q = by * kSP + bx, row = by * 2 + a, col = bx * 2;
      __half2 v[4];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const float2 f = *reinterpret_cast<const float2*>(raw + (c * kIH + row) * kIW + col);
        v[c] = __floats2half2_rn(f.x, f.y);  // (b = 0, b = 1) of channel c
      }
      uint4 o;  // b * 4 + c: (c0 c1) (c2 0) for b = 0, then b = 1
      o.x = __half_as_ushort(__low2half(v[0])) | (uint32_t(__half_as_ushort(__low2half(v[1]))) << 16);
      o.y = __half_as_ushort(__low2half(v[2]));
      o.z = __half_as_ushort(__high2half(v[0])) | (uint32_t(__half_as_ushort(__high2half(v[1]))) << 16);
      o.w = __half_as_ushort(__high2half(v[2]));
      *reinterpret_cast<uint4*>(patch + block_half(q, a)) = o;
    }
  };

  // ldmatrix lanes. A: row m = warp * 64 + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2) of the
  // tile, k half lane / 16; its block at tap (i, j) is q = qa[mt] + i * kSP + j, at byte
  // block_half(qa[mt] + j) + i * kSP * 32 (bit 2 of q, the swizzle, does not depend on i).
  // B: channel nb * 16 + 8 * (lane / 16) + lane % 8, k half (lane / 8) % 2.
  uint32_t aa[4][4];  // [mt][j]
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    const int m = warp * 64 + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
    const int qa = m < kCH * kCW ? (m / kCW) * kSP + m % kCW : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) aa[mt][j] = smem_u32(patch) + block_half(qa + j, lane / 16);
  }
  uint32_t bb[4];
  filter_lanes(bb, ws, lane);
  const int gq = lane / 4, tq = lane % 4;

  int t = blockIdx.x;
  if (t < g.tiles) fetch(t);
  cp_async_wait<0>();
  __syncthreads();  // the filter and the first tile's pixels in place
  if (t < g.tiles) convert();
  __syncthreads();
  for (; t < g.tiles; t += gridDim.x) {
    const int next = t + gridDim.x;
    if (next < g.tiles) fetch(next);  // lands during the multiplies below (`raw` was converted)
    float acc[4][8][4];
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = bias_s[nt * 8 + tq * 2 + e % 2];  // added first
#pragma unroll
    for (int tap = 0; tap < kTaps; ++tap) {
      const int i = tap / 4, j = tap % 4;
      const uint32_t a[4] = {aa[0][j] + i * kSP * 32, aa[1][j] + i * kSP * 32,
                             aa[2][j] + i * kSP * 32, aa[3][j] + i * kSP * 32};
      warp_k_step(acc, a, bb, tap * kNT * 32,
                  [](float(&c)[4], const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
                    mma_f16(c, af, b0, b1);
                  });
    }
    // Epilogue into `out` (free: the last tile's pooling ended with a barrier). Convolution
    // outputs outside the image are the max-pool's padding (-inf).
    const Tile tl = tile_of(g, t);
    for_each_acc_row(g, tl, warp, gq, [&](int mt, int h, int r, bool inside) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        __half2 v;
        if constexpr (A == kPwAny) {
          v = __floats2half2_rn(stem_act_any(acc[mt][nt][2 * h], act),
                                stem_act_any(acc[mt][nt][2 * h + 1], act));
        } else {
          v = __floats2half2_rn(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
          // ReLU after the rounding: the same float16 (rounding is monotone and keeps 0).
          if constexpr (A == kPwRelu) v = __hmax2(v, __float2half2_rn(0.f));
        }
        *reinterpret_cast<__half2*>(out + r * kOutRow + nt * 8 + tq * 2) =
            inside ? v : half2_neg_inf();
      }
    });
    cp_async_wait<0>();
    __syncthreads();  // every warp done with `patch`, `out` written, the next pixels landed
    if (next < g.tiles) convert();
    // The max-pool: each pooled pixel's 8-channel chunk is the max over its window.
    for (int i = tid; i < kPH * kPW * (kNT / 8); i += kThreads) {
      const int c = i % (kNT / 8), pl = i / (kNT / 8);
      const int ly = pl / kPW, lx = pl % kPW;
      const int py = tl.py0 + ly, px = tl.px0 + lx;
      if (py >= g.PP || px >= g.PQ) continue;
      __half2 m[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) m[e] = half2_neg_inf();
#pragma unroll
      for (int dy = 0; dy < 3; ++dy)
#pragma unroll
        for (int dx = 0; dx < 3; ++dx) {
          const int r = (ly * 2 + dy) * kCW + lx * 2 + dx;
          const uint4 v = *reinterpret_cast<const uint4*>(out + r * kOutRow + c * 8);
          const __half2* h2 = reinterpret_cast<const __half2*>(&v);
#pragma unroll
          for (int e = 0; e < 4; ++e) m[e] = __hmax2(m[e], h2[e]);
        }
      const int64_t o = ((static_cast<int64_t>(tl.n) * g.PP + py) * g.PQ + px) * g.K + k0 + c * 8;
      if constexpr (Q8) {
        // The quantizing reformat's codes of the pooled float16 values (pool.max.quantize's).
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = __half22float2(m[e]);
          // After ReLU the pooled values are >= 0: the clamp at 0 is exact there.
          const uint32_t pair = quantize_pair_inv<A == kPwRelu>(f.x, f.y, scale, inv) & 0xffffu;
          if (e < 2) lo |= pair << (16 * e);
          else hi |= pair << (16 * (e - 2));
        }
        *reinterpret_cast<uint2*>(static_cast<int8_t*>(yv) + o) = make_uint2(lo, hi);
      } else {
        *reinterpret_cast<uint4*>(static_cast<__half*>(yv) + o) = *reinterpret_cast<const uint4*>(m);
      }
    }
    __syncthreads();  // `out` free and the next tile's blocks in place
  }
}

// The INT8 form (kiln.convpool.s2d.int8, a layer marked int8 = 1): the images are quantized with
// X's scale as they are converted, the filter is int8 per output channel, and the 16 taps of 16
// channels are 8 k-steps of 32 (taps (i, 2jj) and (i, 2jj + 1): adjacent 16-byte blocks of the
// patch row, so a k-step's slice of an A row is 32 contiguous bytes that ldmatrix reads as it
// reads a float16 one) on mma.sync m16n8k32 s8 with int32 accumulators: half the tensor-core
// steps of the float16 form. What the multiplies save, per-element work would spend, so every
// step is full-rate float arithmetic (small_int_to_float, kMagicRound), reassociated as the INT8
// libraries compute it (kReassociated: within one code of the CPU reference): X's codes are
// sat(rne(x * (1 / sx))), Y's sat(rne(acc * (sx * sw[k] / sy) + b[k] / sy)) by one fused
// multiply-add (ReLU folded into the clamp; another activation is applied to the value first).
// The epilogue stages codes, four per 32-bit store (a lane's channels 2tq, 2tq + 1 of two
// 8-channel groups), and the max-pool of codes is the code of the max-pool (quantizing is
// monotone): the pool reads 16 channels per load, sign-extends the codes to 16-bit pairs (a byte
// permute per pair) for Hopper's three-input packed 16-bit max (DPX; a packed byte max is a dozen
// instructions on sm_90), and byte permutes put the channels back in order. (Staging int16 codes
// instead, which needs no extension, was slower: shared memory traffic, 0.39 against 0.33 ms.)
// Unswizzled blocks, 25 per patch row: 25 = 1 (mod 8), so eight consecutive convolution outputs
// hit eight distinct 16-byte bank groups even where they wrap to the next row. A third of the
// float16 form's shared memory: three blocks per SM fit (variant b3: 168 registers; b2: two
// blocks, more registers; the tuner times both and takes b3 for ResNet-50 on the H100).
constexpr int kSP8 = 25;                              // blocks per patch row (16 bytes each)
constexpr int kSteps8 = kTaps / 2;                    // k-steps of 32 int8
constexpr int kPatch8Bytes = kSH * kSP8 * 16;         // 7200
constexpr int kFilter8Bytes = kSteps8 * kNT * 32;     // 16 KiB
constexpr int kOut8Row = kNT + 16;                    // bytes per staged row of codes
constexpr int kSmem8 =
    kFilter8Bytes + kPatch8Bytes + kPatchElems * 4 + 256 * kOut8Row + 2 * kNT * 4;

// The INT8 epilogue: y = scale[k] * acc + bias[k] per output channel k, then Y's code of y (ReLU
// and no activation: scale = sx * sw[k] / sy and bias = b[k] / sy, y is in codes already; another
// activation: sx * sw[k] and b[k], y is the value, act(y) / sy its code).
struct S2dInt8Params {
  const unsigned char* w;  // int8 [k-step][K][32]
  const float* scale;      // [K]
  const float* bias;       // [K]
  float inv_sx;            // 1 / X's scale
  float inv_sy;            // 1 / Y's scale (another activation)
};

// sat(rne(t)) for t in codes, as the low byte of the result's bits (the other bytes are not the
// code): clamped to [lo, 127] and rounded by adding 1.5 * 2^23.
template <bool NonNegative>
__device__ __forceinline__ uint32_t code_bits(float t) {
  const float c = fminf(fmaxf(t, NonNegative ? 0.f : -128.f), 127.f);
  return __float_as_uint(__fadd_rn(c, kMagicRound));
}

template <int A, int MinBlocks>
__global__ void __launch_bounds__(kThreads, MinBlocks)
    stem_s2d_int8(const float* __restrict__ x, S2dInt8Params p, int8_t* __restrict__ y, S2dGeom g,
                  ActParams act) {
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* ws = smem;                                     // [step][64][2 x 16 bytes]
  unsigned char* patch = smem + kFilter8Bytes;                  // [kSH][kSP8][16 bytes]
  float* raw = reinterpret_cast<float*>(patch + kPatch8Bytes);  // [kC][kIH][kIW]
  unsigned char* out = reinterpret_cast<unsigned char*>(raw + kPatchElems);  // [256][kOut8Row]
  float* scale_s = reinterpret_cast<float*>(out + 256 * kOut8Row);          // [kNT]
  float* bias_s = scale_s + kNT;                                             // [kNT]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.y * kNT;
  if (tid < kNT) {
    scale_s[tid] = p.scale[k0 + tid];
    bias_s[tid] = p.bias[k0 + tid];
  }
  load_filter(ws, p.w, kSteps8, g.K, k0, tid);

  // `raw` -> `patch`: block (by, bx)'s half a (pixel row 2 by + a) is 8 codes, b * 4 + c, X's
  // codes for c < 3 (pixels outside the image are 0: code 0); byte c = 3 repeats c = 2's code,
  // which the filter's zeros there cancel.
  auto convert = [&]() {
    for (int i = tid; i < kSH * kSW * 2; i += kThreads) {
      const int by = i / (2 * kSW), bx = (i / 2) % kSW, a = i % 2;
      const int row = by * 2 + a, col = bx * 2;
      uint32_t q[kC][2];  // [c][b]: the code in the low byte
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const float2 f = *reinterpret_cast<const float2*>(raw + (c * kIH + row) * kIW + col);
        q[c][0] = code_bits<false>(__fmul_rn(f.x, p.inv_sx));
        q[c][1] = code_bits<false>(__fmul_rn(f.y, p.inv_sx));
      }
      uint2 o;
      o.x = __byte_perm(__byte_perm(q[0][0], q[1][0], 0x0040), q[2][0], 0x4410);
      o.y = __byte_perm(__byte_perm(q[0][1], q[1][1], 0x0040), q[2][1], 0x4410);
      *reinterpret_cast<uint2*>(patch + (by * kSP8 + bx) * 16 + a * 8) = o;
    }
  };

  // ldmatrix lanes as in the float16 form: A row m = warp * 64 + mt * 16 + (lane % 8) +
  // 8 * ((lane / 8) % 2), 16-byte half lane / 16 of the k-step's 32 bytes, which start at block
  // qa + i * kSP8 + 2 jj; B channel nb * 16 + 8 * (lane / 16) + lane % 8, half (lane / 8) % 2.
  uint32_t aa[4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt) {
    const int m = warp * 64 + mt * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
    const int qa = m < kCH * kCW ? (m / kCW) * kSP8 + m % kCW : 0;
    aa[mt] = smem_u32(patch) + (qa + lane / 16) * 16;
  }
  uint32_t bb[4];
  filter_lanes(bb, ws, lane);
  const int gq = lane / 4, tq = lane % 4;

  int t = blockIdx.x;
  if (t < g.tiles) fetch_pixels(x, g, t, raw, tid);
  cp_async_wait<0>();
  __syncthreads();
  if (t < g.tiles) convert();
  __syncthreads();
  for (; t < g.tiles; t += gridDim.x) {
    const int next = t + gridDim.x;
    if (next < g.tiles) fetch_pixels(x, g, next, raw, tid);
    int32_t acc[4][8][4] = {};
#pragma unroll
    for (int step = 0; step < kSteps8; ++step) {
      const uint32_t off = ((step / 2) * kSP8 + 2 * (step % 2)) * 16;
      const uint32_t a[4] = {aa[0] + off, aa[1] + off, aa[2] + off, aa[3] + off};
      warp_k_step(acc, a, bb, step * kNT * 32,
                  [](int32_t(&c)[4], const uint32_t(&af)[4], uint32_t b0, uint32_t b1) {
                    mma_s8(c, af, b0, b1);
                  });
    }
    // Epilogue: codes into `out` (free: the last tile's pooling ended with a barrier), the word
    // of row r, channel group pair (2 c16, 2 c16 + 1) and lane tq at r * kOut8Row + c16 * 16 +
    // tq * 4 holding channels 16 c16 + {2tq, 2tq + 1, 8 + 2tq, 9 + 2tq}. Convolution outputs
    // outside the image are the max-pool's padding (code -128, below or equal to every code, and
    // every window holds one output inside).
    const Tile tl = tile_of(g, t);
    for_each_acc_row(g, tl, warp, gq, [&](int mt, int h, int r, bool inside) {
#pragma unroll
      for (int c16 = 0; c16 < 4; ++c16) {
        uint32_t q[2][2];  // [e][j]: channel c16 * 16 + e * 8 + tq * 2 + j
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float2 cs = *reinterpret_cast<const float2*>(scale_s + c16 * 16 + e * 8 + tq * 2);
          const float2 cb = *reinterpret_cast<const float2*>(bias_s + c16 * 16 + e * 8 + tq * 2);
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            // |acc| <= 256 * 128 * 128 = 2^22: small_int_to_float is exact.
            const float v = __fmaf_rn(small_int_to_float(acc[mt][2 * c16 + e][2 * h + j]),
                                      j ? cs.y : cs.x, j ? cb.y : cb.x);
            if constexpr (A == kPwAny)
              q[e][j] = code_bits<false>(__fmul_rn(stem_act_any(v, act), p.inv_sy));
            else
              q[e][j] = code_bits<A == kPwRelu>(v);
          }
        }
        const uint32_t word = __byte_perm(__byte_perm(q[0][0], q[0][1], 0x0040),
                                          __byte_perm(q[1][0], q[1][1], 0x0040), 0x5410);
        *reinterpret_cast<uint32_t*>(out + r * kOut8Row + c16 * 16 + tq * 4) =
            inside ? word : 0x80808080u;
      }
    });
    cp_async_wait<0>();
    __syncthreads();  // every warp done with `patch`, `out` written, the next pixels landed
    if (next < g.tiles) convert();
    // The max-pool: each pooled pixel's 16-channel chunk is the max over its window.
    for (int i = tid; i < kPH * kPW * (kNT / 16); i += kThreads) {
      const int c = i % (kNT / 16), pl = i / (kNT / 16);
      const int ly = pl / kPW, lx = pl % kPW;
      const int py = tl.py0 + ly, px = tl.px0 + lx;
      if (py >= g.PP || px >= g.PQ) continue;
      // Word e of a staged chunk holds channels {2e, 2e + 1, 8 + 2e, 9 + 2e}: its codes
      // sign-extended to int16 pairs, (2e, 8 + 2e) and (2e + 1, 9 + 2e).
      uint32_t rm[3][8];  // [dy][2e + j]: the row's max of pair j of word e
#pragma unroll
      for (int dy = 0; dy < 3; ++dy) {
        uint4 v[3];
#pragma unroll
        for (int dx = 0; dx < 3; ++dx) {
          const int r = (ly * 2 + dy) * kCW + lx * 2 + dx;
          v[dx] = *reinterpret_cast<const uint4*>(out + r * kOut8Row + c * 16);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const uint32_t w0 = (&v[0].x)[e], w1 = (&v[1].x)[e], w2 = (&v[2].x)[e];
          rm[dy][2 * e] = __vimax3_s16x2(__byte_perm(w0, 0, 0xA280), __byte_perm(w1, 0, 0xA280),
                                         __byte_perm(w2, 0, 0xA280));
          rm[dy][2 * e + 1] = __vimax3_s16x2(
              __byte_perm(w0, 0, 0xB391), __byte_perm(w1, 0, 0xB391), __byte_perm(w2, 0, 0xB391));
        }
      }
      // Back to codes in channel order: the low bytes of the pairs make the staged word order
      // again, then four permutes put the channels in order.
      uint32_t w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[e] = __byte_perm(__vimax3_s16x2(rm[0][2 * e], rm[1][2 * e], rm[2][2 * e]),
                           __vimax3_s16x2(rm[0][2 * e + 1], rm[1][2 * e + 1], rm[2][2 * e + 1]),
                           0x6240);
      const uint4 o4 = make_uint4(__byte_perm(w[0], w[1], 0x5410), __byte_perm(w[2], w[3], 0x5410),
                                  __byte_perm(w[0], w[1], 0x7632), __byte_perm(w[2], w[3], 0x7632));
      const int64_t o = ((static_cast<int64_t>(tl.n) * g.PP + py) * g.PQ + px) * g.K + k0 + c * 16;
      *reinterpret_cast<uint4*>(y + o) = o4;
    }
    __syncthreads();  // `out` free and the next tile's blocks in place
  }
}

// What both forms need: the model's float32 NCHW RGB images of an even width, a 7x7/2 (or
// smaller) convolution with K a multiple of 64 and its 3x3/2 max-pool, Y NHWC.
bool s2d_geometry_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (!is_conv_pool(n)) return *why = "kiln.FusedConvPool only", false;
  if (d.in[0].dtype != DataType::kFloat32 || d.in[0].layout != Layout::kLinear)
    return *why = "X must be the model's float32 NCHW images", false;
  if (d.out[0].layout != Layout::kNHWC) return *why = "Y must be NHWC", false;
  const Tensor* w = plain_conv(d, why);
  if (!w) return false;
  // Pixel pairs arrive in 8-byte copies: an image row must start 8-byte aligned.
  const Dim& width = (*d.in_type(0).dims)[3];
  if (!width.is_static() || width.value % 2 != 0) return *why = "an image width not known to be even", false;
  if (w->dim(1) != kC) return *why = "3 input channels (RGB) only", false;
  if (w->dim(0) % kNT != 0) return *why = "K is not a multiple of 64", false;
  const auto st = n.attrs.get_ints("strides", {1, 1});
  const auto dil = n.attrs.get_ints("dilations", {1, 1});
  if (st.size() != 2 || st[0] != 2 || st[1] != 2) return *why = "stride 2 only", false;
  if (dil.size() != 2 || dil[0] != 1 || dil[1] != 1) return *why = "a dilated convolution", false;
  if (n.attrs.get_string("auto_pad", "NOTSET") != "NOTSET") return *why = "auto_pad", false;
  const auto pads = n.attrs.get_ints("pads", {0, 0, 0, 0});
  if (pads.size() != 4) return *why = "not 2-D pads", false;
  if (w->dim(2) + pads[0] % 2 > 8 || w->dim(3) + pads[1] % 2 > 8)
    return *why = "a filter over 4 x 4 blocks (7 x 7 with odd padding, 8 x 8 with even)", false;
  PoolAttrs pa;
  if (!read_pool(n, &pa, why)) return false;
  if (pa.kh != 3 || pa.kw != 3 || pa.sh != 2 || pa.sw != 2 || pa.pt > 1 || pa.pl > 1)
    return *why = "not a 3x3/2 max-pool with leading pads of at most 1", false;
  return true;
}

bool s2d_supports(const LayerDesc& d, std::string* why) {
  if (d.precision != Precision::kFP16) return *why = "FP16 layers only", false;
  const bool q8 = d.out[0].dtype == DataType::kInt8;
  if (!q8 && d.out[0].dtype != DataType::kFloat16) return *why = "Y must be float16 or int8", false;
  if (q8 && !d.node->output(0)->has_quant_scale()) return *why = "Y has no INT8 scale", false;
  return s2d_geometry_supports(d, why);
}

bool s2d_int8_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kINT8 || !quant::runs_int8(n))
    return *why = "INT8 layers only (int8 = 1)", false;
  if (std::string b = quant::int8_blocker(n); !b.empty()) return *why = b, false;
  if (n.input(1)->quant_scales.empty()) return *why = "the weights have no INT8 scales", false;
  if (d.out[0].dtype != DataType::kInt8 || !n.output(0)->has_quant_scale())
    return *why = "Y must be int8 (its value has a scale)", false;
  return s2d_geometry_supports(d, why);
}

class S2dStemLayer final : public Layer {
 public:
  explicit S2dStemLayer(const LayerDesc& d)
      : node_(d.node),
        int8_(d.precision == Precision::kINT8),
        q8_(d.out[0].dtype == DataType::kInt8),
        blocks_per_sm_(int8_ && d.variant != "b2" ? 3 : 2) {
    read_activation(d.node->attrs, &act_);
    if (q8_) {
      scale_ = d.node->output(0)->quant_scales.at(0);
      inv_ = 1.f / scale_;
    }
    // Weights [K,3,R,S] -> [tap][K][16]: tap (i, j), element a * 8 + b * 4 + c is
    // W[k][c][2i + a - oh][2j + b - ow] (zero outside the filter and for c = 3); float16, or the
    // int8 codes of W's per-channel scales (the INT8 form's k-step of 32 is two taps' rows).
    const Tensor& w = *d.in_const(1);
    K_ = static_cast<int>(w.dim(0));
    const int R = static_cast<int>(w.dim(2)), S = static_cast<int>(w.dim(3));
    const auto pads = d.node->attrs.get_ints("pads", {0, 0, 0, 0});
    const int oh = static_cast<int>(pads[0] % 2), ow = static_cast<int>(pads[1] % 2);
    Tensor wq;
    const std::vector<float>* sw = nullptr;
    if (int8_) {
      sw = &d.node->input(1)->quant_scales;
      wq = quant::quantize_weights(w, *sw, 0);
      w8_.assign(static_cast<size_t>(kTaps) * K_ * 16, 0);
    } else {
      weights_.w.assign(static_cast<size_t>(kTaps) * K_ * 16, __float2half(0.f));
    }
    for (int tap = 0; tap < kTaps; ++tap)
      for (int k = 0; k < K_; ++k)
        for (int e = 0; e < 16; ++e) {
          const int a = e / 8, b = (e / 4) % 2, c = e % 4;
          const int r = 2 * (tap / 4) + a - oh, s = 2 * (tap % 4) + b - ow;
          if (c >= kC || r < 0 || r >= R || s < 0 || s >= S) continue;
          const int64_t src = ((static_cast<int64_t>(k) * kC + c) * R + r) * S + s;
          const size_t dst = (static_cast<size_t>(tap) * K_ + k) * 16 + e;
          if (int8_)  // [step = tap / 2][k][32]: tap's 16 bytes at (tap % 2) * 16
            w8_[(static_cast<size_t>(tap / 2) * K_ + k) * 32 + (tap % 2) * 16 + e] =
                wq.data<int8_t>()[src];
          else
            weights_.w[dst] = __float2half(static_cast<float>(w.at_double(src)));
        }
    weights_.read_bias(d, K_);
    if (int8_) {
      // The epilogue's per-channel scale and bias (S2dInt8Params): in codes of Y unless the
      // activation needs the value.
      const float sx = d.node->input(0)->quant_scales.at(0);
      inv_sx_ = 1.f / sx;
      const bool in_codes = act_.act == Act::kNone || act_.act == Act::kRelu;
      const float inv_sy = in_codes ? inv_ : 1.f;
      epi_.resize(2 * static_cast<size_t>(K_));
      for (int k = 0; k < K_; ++k) {
        const float cs = sx * (*sw)[sw->size() == 1 ? 0 : static_cast<size_t>(k)];
        epi_[static_cast<size_t>(k)] = cs * inv_sy;
        epi_[static_cast<size_t>(K_ + k)] = weights_.b[static_cast<size_t>(k)] * inv_sy;
      }
    }
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    KILN_ASSIGN_OR_RETURN(ConvGeom c, conv_geometry(*node_, in[0].shape, in[1].shape, false));
    if (c.nsp != 2 || c.C != kC) return KILN_ERROR("{}: not a 2-D convolution of RGB images", node_->label());
    if (c.in[1] % 2 != 0) return KILN_ERROR("{}: the stem kernel needs an even image width", node_->label());
    PoolAttrs pa;
    std::string why;
    if (!read_pool(*node_, &pa, &why)) return KILN_ERROR("{}: {}", node_->label(), why);
    g_ = {};
    g_.H = static_cast<int>(c.in[0]), g_.W = static_cast<int>(c.in[1]);
    g_.K = K_, g_.P = static_cast<int>(c.out[0]), g_.Q = static_cast<int>(c.out[1]);
    g_.ph = static_cast<int>(c.pad_begin[0]), g_.pw = static_cast<int>(c.pad_begin[1]);
    g_.oh = g_.ph % 2, g_.ow = g_.pw % 2;
    g_.pph = pa.pt, g_.ppw = pa.pl;
    g_.PP = (g_.P + pa.pt + pa.pb - pa.kh) / pa.sh + 1;
    g_.PQ = (g_.Q + pa.pl + pa.pr - pa.kw) / pa.sw + 1;
    if (out[0].shape.size() != 4 || out[0].shape[2] != g_.PP || out[0].shape[3] != g_.PQ)
      return KILN_ERROR("{}: the output is not the max-pool's size", node_->label());
    if (c.N * kC * c.in[0] * c.in[1] >= (int64_t(1) << 31) ||
        c.N * g_.PP * g_.PQ * K_ >= (int64_t(1) << 31))
      return KILN_ERROR("{}: tensor too large for the stem kernel", node_->label());
    g_.tiles_w = (g_.PQ + kPW - 1) / kPW;
    const int64_t tiles = c.N * ((g_.PP + kPH - 1) / kPH) * g_.tiles_w;
    g_.tiles = static_cast<int>(tiles);
    // Persistent blocks: two per SM in float16, two or three in INT8 (registers and shared
    // memory), at most one per tile.
    const int sms = sm_count();
    if (sms <= 0) return KILN_ERROR("{}: the GPU's SM count is not available", node_->label());
    blocks_ =
        static_cast<int>(std::min<int64_t>(tiles, blocks_per_sm_ * static_cast<int64_t>(sms)));
    // Over the default 48 KiB of dynamic shared memory: an opt-in per kernel and device, made at
    // configure time (not while a run may be captured into a CUDA graph).
    if (int8_) {
      KILN_CUDA_CHECK(cudaFuncSetAttribute(int8_kernel(),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem8));
      KILN_RETURN_IF_ERROR(upload_int8());
    } else {
      KILN_CUDA_CHECK(
          cudaFuncSetAttribute(kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      KILN_RETURN_IF_ERROR(weights_.upload_once("pooled stem weights"));
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0 || g_.tiles == 0) return Status::Ok();
    if (reinterpret_cast<uintptr_t>(out[0].data) % 16 != 0)
      return KILN_ERROR("{}: the stem kernel needs a 16-byte aligned output", node_->label());
    const dim3 grid(blocks_, K_ / kNT);
    const float* x = static_cast<const float*>(in[0].data);
    if (int8_) {
      const S2dInt8Params p{w8_dev_, epi_dev_, epi_dev_ + K_, inv_sx_, inv_};
      int8_kernel()<<<grid, kThreads, kSmem8, rc.stream>>>(x, p, static_cast<int8_t*>(out[0].data),
                                                            g_, act_);
    } else {
      kernel()<<<grid, kThreads, kSmem, rc.stream>>>(x, weights_.weights(), weights_.bias,
                                                     out[0].data, g_, act_, scale_, inv_);
    }
    KILN_CUDA_LAUNCH_CHECK("pooled stem kernel");
    return Status::Ok();
  }

 private:
  using Kernel = void (*)(const float*, const __half*, const float*, void*, S2dGeom, ActParams,
                          float, float);
  template <bool Q8>
  Kernel kernel_for() const {
    if (act_.act == Act::kNone) return stem_s2d<Q8, kPwNone>;
    if (act_.act == Act::kRelu) return stem_s2d<Q8, kPwRelu>;
    return stem_s2d<Q8, kPwAny>;
  }
  Kernel kernel() const { return q8_ ? kernel_for<true>() : kernel_for<false>(); }
  using Int8Kernel = void (*)(const float*, S2dInt8Params, int8_t*, S2dGeom, ActParams);
  template <int MinBlocks>
  Int8Kernel int8_kernel_for() const {
    if (act_.act == Act::kNone) return stem_s2d_int8<kPwNone, MinBlocks>;
    if (act_.act == Act::kRelu) return stem_s2d_int8<kPwRelu, MinBlocks>;
    return stem_s2d_int8<kPwAny, MinBlocks>;
  }
  Int8Kernel int8_kernel() const {
    return blocks_per_sm_ == 3 ? int8_kernel_for<3>() : int8_kernel_for<2>();
  }

  // The INT8 form's device arrays, once: int8 weights, the epilogue's scales and biases.
  Status upload_int8() {
    if (int8_mem_.get()) return Status::Ok();
    const size_t wb = (w8_.size() + 255) / 256 * 256, eb = epi_.size() * sizeof(float);
    KILN_RETURN_IF_ERROR(int8_mem_.reserve(wb + eb, "INT8 stem weights"));
    char* base = static_cast<char*>(int8_mem_.get());
    KILN_RETURN_IF_ERROR(cuda::upload(base, w8_.data(), w8_.size(), "INT8 stem weights"));
    KILN_RETURN_IF_ERROR(cuda::upload(base + wb, epi_.data(), eb, "INT8 stem epilogue"));
    w8_dev_ = reinterpret_cast<const unsigned char*>(base);
    epi_dev_ = reinterpret_cast<const float*>(base + wb);
    return Status::Ok();
  }

  const Node* node_;
  bool int8_, q8_;
  int blocks_per_sm_;
  ActParams act_;
  float scale_ = 1.f, inv_ = 1.f;  // Y's scale (int8 output)
  int K_ = 0, blocks_ = 0;
  StemWeights weights_;  // float16 [tap][K][16] (float16 form) and the bias (both forms)
  std::vector<int8_t> w8_;   // INT8 form: [step][K][32]
  std::vector<float> epi_;   // its epilogue's scales [K], then biases [K] (S2dInt8Params)
  float inv_sx_ = 1.f;  // 1 / X's scale
  DeviceMemory int8_mem_;
  const unsigned char* w8_dev_ = nullptr;
  const float* epi_dev_ = nullptr;
  S2dGeom g_{};
};

}  // namespace

bool stem_s2d_supports(const LayerDesc& d, std::string* why) { return s2d_supports(d, why); }
bool stem_s2d_int8_supports(const LayerDesc& d, std::string* why) {
  return s2d_int8_supports(d, why);
}
std::vector<std::string> stem_s2d_int8_variants(const LayerDesc&) { return {"b3", "b2"}; }
Expected<std::unique_ptr<Layer>> create_stem_s2d(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new S2dStemLayer(d));
}

}  // namespace kiln::gpu
