// The persistent 3x3 INT8 convolution on Hopper's warpgroup MMA (tactic
// conv_int8.conv3x3.wgmma): the problems of conv_int8.conv3x3 (conv_int8_3x3.cu: 3x3, stride 1,
// padding 1, dilation 1, C of 64 or 128, K a multiple of 64, Y int8, the residual int8 or absent,
// no activation or ReLU) in the same persistent frame, with the tensor cores reading both
// operands from shared memory (wgmma m64n64k32 s8) instead of each warp reloading its fragments
// by ldmatrix: the mma.sync kernel's 32 x 32 warp tiles read 256 bytes of shared memory per
// m16n8k32 step and are bound by it (docs/perf.md, ninth and fourteenth sessions); a warpgroup's
// 64 x 64 wgmma reads 128.
//
// The implicit GEMM without gathers, on padded positions: output (p, q) of an image is position
// m = p * (W + 2) + q (the columns q = W and W + 1 are computed and dropped, 2 / (W + 2) of the
// work), and tap (r, s) of position m reads the input at padded position m + r * (W + 2) + s,
// where padded position (hp, wp) is input pixel (hp - 1, wp - 1) or zero. So a tap's A operand
// for 64 consecutive positions is 64 consecutive patch pixels: one wgmma descriptor, whatever
// the image width.
//   - each block keeps its 64 output channels' filter in shared memory for its life as 16-byte
//     chunks, chunk-major ([9 C / 16][64][16]: each k step's B is two 1 KiB chunk planes), with
//     the channels' scales and biases, and walks tiles of 128 consecutive padded positions of one
//     image (gridDim.y apart), two warpgroups of 64;
//   - a tile's patch is the 128 + 2 (W + 2) + 2 padded input positions under it, also stored
//     chunk-major ([C / 16][positions][16]: 8 consecutive positions of a chunk are one 128-byte
//     core matrix of the unswizzled K-major layout), zero-filled by cp.async where the position
//     is padding or past the image, in a ring of three stages;
//   - per tile and warpgroup, 9 taps x C / 32 k steps of wgmma with A and B descriptors moved
//     along the planes, issued without waiting; while they run, the warps finish the tile before
//     (two accumulator sets): the pointwise kernel's reassociated epilogue (pw_epilogue_fused:
//     the wgmma accumulator layout is mma.sync's, one 16-row block per warp) into that tile's
//     stage, no longer read, then its rows that are pixels stored; and the next tile's copies are
//     in flight. So a block keeps the tensor cores busy through its epilogues.
#include <algorithm>

#include "device_util_host.h"
#include "kernels/fast_div.cuh"
#include "kernels/wgmma.cuh"
#include "layers/conv_int8_pw.cuh"

namespace kiln::gpu {
namespace {

constexpr int kTileM = 128;    // padded positions per tile: 64 per warpgroup
constexpr int kThreads = 256;  // two warpgroups
constexpr int kN = 64;         // output channels per block
constexpr int kZRow = kN + 16;
constexpr int kSmemLimit = 227 * 1024;  // the H100's opt-in shared memory per block

// A tile's patch: its 128 positions and every position a tap reaches from them.
int patch_positions(int W) { return kTileM + 2 * (W + 2) + 2; }

// The patch's chunk planes are `stride` positions apart: the patch, or more for a narrow image
// so that a stage also holds a tile's output rows (128 x kZRow bytes), rounded up so that the
// stride in 16-byte units is 8 / (C / 16) modulo 8, so that the 8 lanes of a cp.async phase
// (C / 16 chunks of 8 / (C / 16) positions) write distinct banks.
int plane_stride(int C, int W) {
  const int want = 8 / (C / 16);
  int s = std::max(patch_positions(W), kTileM * kZRow / C);
  while (s % 8 != want % 8) ++s;
  return s;
}

// The patch ring: tile i's MMAs, tile i - 1's output rows, tile i + 1's copies landing (loads
// two tiles ahead in a fourth stage measured no faster on the H100).
constexpr int kStages = 3;

// Shared memory: the filter [9C/16][64][16], the channels' scale and bias [64][2], then the patch
// ring [3][C/16][stride][16] (a stage whose tile's MMAs are done holds its output rows).
int64_t smem_bytes(int C, int W) {
  return int64_t{kN} * 9 * C + kN * 8 + kStages * int64_t{C / 16} * plane_stride(C, W) * 16;
}

// Tile t: its image and its first padded position.
struct TileW {
  int n, m0;
};
__device__ __forceinline__ TileW tile_w(int t, int tpi) {
  const int n = t / tpi;
  return {n, (t - n * tpi) * kTileM};
}

// A block walks tiles blockIdx.y, + gridDim.y, ...: step i issues tile i + 1's copies, then tile
// i's MMAs (asynchronous), and while the tensor cores run them, finishes tile i - 1 (its MMAs
// waited for, its epilogue into the stage it was read from, its rows stored). So the MMAs of one
// tile overlap the epilogue and stores of the one before and the loads of the one after.
template <int C, int Act>
__global__ void __launch_bounds__(kThreads, 2)
    int8_conv3x3_wgmma(const int8_t* __restrict__ x, const int8_t* __restrict__ w,
                       int8_t* __restrict__ y, Int8Geom g, Int8Epilogue e, int tiles, int tpi,
                       int stride, FastDiv by_qp) {
  constexpr int kXChunks = C / 16, kWChunks = 9 * C / 16, kZChunks = kN / 16;
  extern __shared__ __align__(128) unsigned char smem[];
  int8_t* ws = reinterpret_cast<int8_t*>(smem);
  float* sb = reinterpret_cast<float*>(ws + kN * 9 * C);
  int8_t* xs = reinterpret_cast<int8_t*>(sb + 2 * kN);
  const int H = g.H, W = g.W, K = g.K, QP = W + 2;
  const int plane = stride * 16, stage_bytes = kXChunks * plane;
  const int positions = kTileM + 2 * QP + 2;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // The warpgroup, warp-uniform to the compiler: its descriptors then live in uniform registers.
  const int wg = __shfl_sync(0xffffffffu, warp / 4, 0);
  const int k0 = blockIdx.x * kN;
  const auto* z = static_cast<const int8_t*>(e.z);

  for (int i = tid; i < kN * kWChunks; i += kThreads) {
    const int n = i / kWChunks, j = i % kWChunks;
    cp_async16(ws + (j * kN + n) * 16, w + static_cast<int64_t>(k0 + n) * 9 * C + j * 16, true);
  }
  for (int i = tid; i < kN; i += kThreads) {  // divided by Y's scale: the reassociated epilogue
    sb[2 * i] = __fdiv_rn(e.scale[k0 + i], e.sy);
    sb[2 * i + 1] = e.bias ? __fdiv_rn(e.bias[k0 + i], e.sy) : 0.f;
  }
  const float szy = __fdiv_rn(e.sz, e.sy);
  // Padded position m of an image: its row p and column q (a pixel when p < H and q < W).
  auto pixel = [&](int m, int& p, int& q) {
    p = static_cast<int>(by_qp.div(static_cast<uint32_t>(m)));
    q = m - p * QP;
  };
  auto load = [&](int stage, int t) {
    const TileW s = tile_w(t, tpi);
    int8_t* xt = xs + stage * stage_bytes;
    for (int i = tid; i < positions * kXChunks; i += kThreads) {  // a chunk per thread
      const int pos = i / kXChunks, c = i % kXChunks;
      int hp, wp;
      pixel(s.m0 + pos, hp, wp);
      const int ih = hp - 1, iw = wp - 1;
      const bool ok = static_cast<unsigned>(ih) < static_cast<unsigned>(H) &&
                      static_cast<unsigned>(iw) < static_cast<unsigned>(W);
      const int8_t* src =
          x + ((static_cast<int64_t>(s.n) * H + (ok ? ih : 0)) * W + (ok ? iw : 0)) * C + c * 16;
      cp_async16(xt + (c * stride + pos) * 16, src, ok);
    }
  };
  // Calls f(r, c, offset) for this thread's 16-byte chunks c of the tile's rows r that are
  // pixels, offset their element offset in Y (and in the residual).
  auto for_each_pixel_chunk = [&](int t, auto&& f) {
    const TileW s = tile_w(t, tpi);
#pragma unroll
    for (int j = 0; j < kTileM * kZChunks / kThreads; ++j) {
      const int i = tid + j * kThreads, r = i / kZChunks, c = i % kZChunks;
      int p, q;
      pixel(s.m0 + r, p, q);
      if (p < H && q < W) f(r, c, ((static_cast<int64_t>(s.n) * H + p) * W + q) * K + k0 + c * 16);
    }
  };
  // Tile i's MMAs (this warpgroup's 64 positions, 64 * wg patch positions in; tap (r, s) starts
  // r * QP + s further, k step kk two chunk planes further: LBO is the next plane), issued
  // without waiting.
  auto mma = [&](int stage, int32_t(&acc)[1][kN / 8][4]) {
    // Made opaque per tile (wgmma_desc_opaque), so the compiler computes each descriptor where
    // it is used rather than keeping 36 of them in registers across the tile loop.
    uint64_t a = wgmma_desc_opaque(
        wgmma_desc(smem_u32(xs + stage * stage_bytes) + wg * 64 * 16, plane, 128));
    const uint64_t b0 = wgmma_desc_opaque(wgmma_desc(smem_u32(ws), kN * 16, 128));
    wgmma_fence_operand(acc[0]);
    wgmma_fence();
#pragma unroll
    for (int r = 0; r < 3; ++r) {
#pragma unroll
      for (int sx = 0; sx < 3; ++sx)
#pragma unroll
        for (int kk = 0; kk < C / 32; ++kk) {
          const int tap = r * 3 + sx;
          wgmma_s8_m64n64k32(acc[0], wgmma_desc_add(a, (2 * kk * stride + sx) * 16),
                             wgmma_desc_add(b0, (tap * kXChunks + 2 * kk) * kN * 16),
                             tap + kk > 0);
        }
      a = wgmma_desc_add(a, QP * 16);
    }
    wgmma_commit();
  };
  // Tile t (read from `stage`) once this warpgroup's MMAs of it are all that may still run
  // besides the next tile's: its output codes into the stage (rows of kZRow bytes; the residual's
  // codes copied there first), then stored.
  auto finish = [&](int stage, int t, const int32_t(&acc)[1][kN / 8][4]) {
    int8_t* zt = xs + stage * stage_bytes;
    __syncthreads();  // every warpgroup's MMAs of the tile are done: its patch may be overwritten
    if (z) {
      for_each_pixel_chunk(t, [&](int r, int c, int64_t off) {
        *reinterpret_cast<int4*>(zt + r * kZRow + c * 16) = *reinterpret_cast<const int4*>(z + off);
      });
      __syncthreads();
    }
    pw_epilogue_fused<Act == kPwRelu, false>(acc, zt, kZRow, sb, warp * 16, 0, lane, szy,
                                                 z != nullptr);
    __syncthreads();
    for_each_pixel_chunk(t, [&](int r, int c, int64_t off) {
      *reinterpret_cast<int4*>(y + off) = *reinterpret_cast<const int4*>(zt + r * kZRow + c * 16);
    });
  };

  const int step = gridDim.y;
  int32_t acc0[1][kN / 8][4], acc1[1][kN / 8][4];
  int tile = blockIdx.y, i = 0;
  load(0, tile);  // with the filter: one group
  cp_async_commit();
  // Starts tile i: its copies have landed (and every thread is done with tile i - 2's stores, so
  // stage (i + 1) % 3, which held it, is free): tile i + 1's copies, then tile i's MMAs.
  auto start_tile = [&](int32_t(&acc)[1][kN / 8][4]) {
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
    if (tile + step < tiles) load((i + 1) % kStages, tile + step);
    cp_async_commit();
    mma(i % kStages, acc);
    ++i;
    tile += step;
  };
  // Finishes the previous tile once its MMAs are done (all but the newest group, or all).
  auto finish_prev = [&](int32_t(&acc)[1][kN / 8][4], bool last) {
    if (last)
      wgmma_wait<0>();
    else
      wgmma_wait<1>();
    wgmma_fence_operand(acc[0]);
    finish((i + kStages - (last ? 1 : 2)) % kStages, tile - (last ? 1 : 2) * step, acc);
  };
  // Every path reads an accumulator only after the wait that covers its MMAs (else ptxas
  // serializes the wgmmas).
  start_tile(acc0);
  while (true) {
    if (tile >= tiles) {
      finish_prev(acc0, true);
      break;
    }
    start_tile(acc1);
    finish_prev(acc0, false);
    if (tile >= tiles) {
      finish_prev(acc1, true);
      break;
    }
    start_tile(acc0);
    finish_prev(acc1, false);
  }
  cp_async_wait<0>();
}

// Calls f with the kernel instantiated for C and the activation.
template <typename F>
auto with_kernel(int C, bool relu, F&& f) {
  if (C == 64)
    return relu ? f(int8_conv3x3_wgmma<64, kPwRelu>) : f(int8_conv3x3_wgmma<64, kPwNone>);
  return relu ? f(int8_conv3x3_wgmma<128, kPwRelu>) : f(int8_conv3x3_wgmma<128, kPwNone>);
}

}  // namespace

const char* int8_conv3x3_wgmma_unfit(const Int8Geom& g) {
  if (const char* why = int8_conv3x3_problem_unfit(g); *why) return why;
  if (g.W < 1 || g.W > 4096 || smem_bytes(g.C4 * 4, g.W) > kSmemLimit)
    return "the image is too wide for the input patch in shared memory";
  if (int64_t{g.H} * (g.W + 2) + 2 * kTileM >= (int64_t{1} << 31))
    return "the image is too large for 32-bit padded positions";
  return "";
}

cudaError_t prepare_int8_conv3x3_wgmma(const Int8Geom& g, bool relu, int* per_sm) {
  *per_sm = 0;
  if (*int8_conv3x3_wgmma_unfit(g)) return cudaSuccess;  // launch says why
  const size_t bytes = static_cast<size_t>(smem_bytes(g.C4 * 4, g.W));
  return with_kernel(g.C4 * 4, relu, [&](auto kernel) {
    return prepare_persistent(kernel, kThreads, kSmemLimit, bytes, per_sm);
  });
}

const char* launch_int8_conv3x3_wgmma(const int8_t* x, const int8_t* w, int8_t* y,
                                      const Int8Geom& g, const Int8Epilogue& e, int per_sm,
                                      cudaStream_t stream) {
  if (const char* why = int8_conv3x3_wgmma_unfit(g); *why) return why;
  if (const char* why = int8_conv3x3_launch_unfit(x, w, y, e); *why) return why;
  if (per_sm <= 0) return "not prepared (prepare_int8_conv3x3_wgmma), or no block fits on an SM";
  if (g.N == 0) return "";
  const int C = g.C4 * 4, QP = g.W + 2, tpi = (g.H * QP + kTileM - 1) / kTileM;
  const int tiles = g.N * tpi, cblocks = g.K / kN, stride = plane_stride(C, g.W);
  const int rows = std::max(1, std::min(tiles, per_sm * sm_count() / cblocks));
  const size_t bytes = static_cast<size_t>(smem_bytes(C, g.W));
  const dim3 grid(cblocks, rows);
  const bool relu = e.act.act == Act::kRelu;
  const FastDiv by_qp(QP);
  with_kernel(C, relu, [&](auto kernel) {
    kernel<<<grid, kThreads, bytes, stream>>>(x, w, y, g, e, tiles, tpi, stride, by_qp);
    return 0;
  });
  return "";
}

}  // namespace kiln::gpu
