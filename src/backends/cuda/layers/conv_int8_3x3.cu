// The persistent 3x3 INT8 convolution (tactic conv_int8.conv3x3): 3x3, stride 1, padding 1,
// dilation 1, C of 64 or 128 input channels, K a multiple of 64, Y int8, the residual int8 or
// absent, no activation or ReLU: the 3x3 layers of ResNet's first two stages in an INT8 chain,
// where the libraries' INT8 kernels were slower than cuDNN's FP16 one on the H100 (stage 1's
// 64-channel 3x3: CUTLASS INT8 0.21 ms against FP16 0.15 at batch 256, docs/perf.md). On the H100
// it takes those in 0.114 ms; at C = 128 (one block per SM: its filter is 72 KiB) CUTLASS stays
// faster and the tuner keeps it.
//
// An implicit GEMM on mma.sync m16n8k32 s8 without an im2col matrix, in the pointwise kernel's
// frame (conv_int8_pointwise.cu):
//   - each block keeps its 64 output channels' whole filter, [64][3][3][C] (36 or 72 KiB), and
//     their scales and biases in shared memory for its life, and walks tiles of 128 consecutive
//     output pixels of one image (gridDim.y apart);
//   - a tile's input patch is the full-width input rows under its output rows, one halo row above
//     and below (zero-filled outside the image) and a zero column at each side (written once):
//     whole rows are contiguous in NHWC, so the patch arrives in 16-byte cp.async chunks, two
//     stages deep (tile i + 1's patch and residual load while tile i is multiplied);
//   - the A fragments of tap (r, s) are read straight from the patch by ldmatrix, each lane giving
//     the address of its output pixel's input pixel for that tap (the pixel's patch position plus
//     a per-tap offset): rows are C + 16 bytes apart, so the 8 rows of a matrix fall in distinct
//     banks except where a tile's rows wrap; the filter's B fragments by ldmatrix too;
//   - the reassociated epilogue of the pointwise kernel (pw_epilogue_fused), with the accumulator
//     converted by the conversion unit (9 * C * 127 * 128 exceeds the byte trick's 2^22).
#include <algorithm>

#include "device_util_host.h"
#include "kernels/fast_div.cuh"
#include "layers/conv_int8_pw.cuh"

namespace kiln::gpu {
namespace {

constexpr int kTileM = 128;    // output pixels per tile
constexpr int kThreads = 256;  // 8 warps: 4 along the pixels x 2 along the channels
constexpr int kN = 64;         // output channels per block
constexpr int kZRow = kN + 16;
constexpr int kSmemLimit = 227 * 1024;  // the H100's opt-in shared memory per block

// Input rows a tile's patch holds: the output rows 128 consecutive pixels of a W-wide image span,
// plus the two halo rows, at most the image's rows plus the halo.
int patch_rows(int H, int W) { return std::min((W - 1 + kTileM - 1) / W + 1, H) + 2; }

// Shared memory: the filter [64][9C + 16], the residual/output ring [2][128][80], the channels'
// scale and bias [64][2], then the patch ring [2][rows][W + 2][C + 16] (pixels padded by 16
// bytes: the 8 rows of an ldmatrix fall in distinct banks).
int64_t smem_bytes(int C, int H, int W) {
  return int64_t{kN} * (9 * C + 16) + 2 * kTileM * kZRow + kN * 8 +
         2 * int64_t{patch_rows(H, W)} * (W + 2) * (C + 16);
}

// Tile t: its image, its first output pixel within the image, how many pixels it has, and the
// first output row it touches.
struct Tile3 {
  int n, m0, count, p0;
};
__device__ __forceinline__ Tile3 tile3(int t, int tpi, int pq, const FastDiv& by_q) {
  Tile3 s;
  s.n = t / tpi;
  s.m0 = (t - s.n * tpi) * kTileM;
  s.count = min(kTileM, pq - s.m0);
  s.p0 = static_cast<int>(by_q.div(static_cast<uint32_t>(s.m0)));
  return s;
}

template <int C, int Act>
__global__ void __launch_bounds__(kThreads)
    int8_conv3x3(const int8_t* __restrict__ x, const int8_t* __restrict__ w,
                 int8_t* __restrict__ y, Int8Geom g, Int8Epilogue e, int tiles, int tpi,
                 int prows, FastDiv by_q) {
  constexpr int kXRow = C + 16, kWRow = 9 * C + 16;
  constexpr int kXChunks = C / 16, kWChunks = 9 * C / 16, kZChunks = kN / 16;
  constexpr int NI = kN / 16;  // 8-channel mma columns per warp (a warp covers 32 channels)
  extern __shared__ __align__(16) unsigned char smem[];
  int8_t* ws = reinterpret_cast<int8_t*>(smem);
  int8_t* zy = ws + kN * kWRow;
  float* sb = reinterpret_cast<float*>(zy + 2 * kTileM * kZRow);
  int8_t* xs = reinterpret_cast<int8_t*>(sb + 2 * kN);
  static_assert((kN * kWRow + 2 * kTileM * kZRow) % 16 == 0, "sb must stay aligned");
  const int H = g.H, W = g.W, K = g.K, pq = g.P * g.Q, QP = W + 2;
  const int stage_bytes = prows * QP * kXRow;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.x * kN;
  const auto* z = static_cast<const int8_t*>(e.z);

  for (int i = tid; i < kN * kWChunks; i += kThreads)
    cp_async16(ws + (i / kWChunks) * kWRow + (i % kWChunks) * 16,
               w + static_cast<int64_t>(k0 + i / kWChunks) * 9 * C + (i % kWChunks) * 16, true);
  for (int i = tid; i < kN; i += kThreads) {  // divided by Y's scale: the reassociated epilogue
    sb[2 * i] = __fdiv_rn(e.scale[k0 + i], e.sy);
    sb[2 * i + 1] = e.bias ? __fdiv_rn(e.bias[k0 + i], e.sy) : 0.f;
  }
  // The zero columns left and right of every patch row, in both stages: never loaded over.
  for (int i = tid; i < 2 * prows * 2 * kXChunks; i += kThreads) {
    const int c = i % kXChunks, side = (i / kXChunks) % 2, row = i / (2 * kXChunks);
    *reinterpret_cast<int4*>(xs + (row * QP + side * (QP - 1)) * kXRow + c * 16) =
        make_int4(0, 0, 0, 0);
  }
  const float szy = __fdiv_rn(e.sz, e.sy);
  auto load_tile = [&](int stage, int t) {
    const Tile3 s = tile3(t, tpi, pq, by_q);
    const int p1 = static_cast<int>(by_q.div(static_cast<uint32_t>(s.m0 + s.count - 1)));
    int8_t* xt = xs + stage * stage_bytes;
    for (int pr = 0; pr < p1 - s.p0 + 3; ++pr) {
      const int ih = s.p0 - 1 + pr;
      const bool ok = ih >= 0 && ih < H;
      const int8_t* src = x + (static_cast<int64_t>(s.n) * H + (ok ? ih : 0)) * W * C;
      int8_t* dst = xt + (pr * QP + 1) * kXRow;
      for (int i = tid; i < W * kXChunks; i += kThreads) {
        const int px = i / kXChunks, c = i % kXChunks;
        cp_async16(dst + px * kXRow + c * 16, src + px * C + c * 16, ok);
      }
    }
    if (z) {
      int8_t* zt = zy + stage * kTileM * kZRow;
      const int64_t zrow = static_cast<int64_t>(s.n) * pq + s.m0;
#pragma unroll
      for (int j = 0; j < kTileM * kZChunks / kThreads; ++j) {
        const int i = tid + j * kThreads, r = i / kZChunks, c = i % kZChunks;
        const bool ok = r < s.count;
        cp_async16(zt + r * kZRow + c * 16, z + (ok ? zrow + r : 0) * K + k0 + c * 16, ok);
      }
    }
  };

  const int wm = (warp % 4) * 32, wn = (warp / 4) * (kN / 2);
  const int arow = ldm_a_row(lane), akb = ldm_a_k(lane);
  const uint32_t wbase = smem_u32(ws) + (wn + ldm_b_row(lane)) * kWRow + ldm_b_k(lane);
  pw_tile_ring(
      tiles, load_tile,
      [&](int st, int tile) {
        const Tile3 s = tile3(tile, tpi, pq, by_q);
        const uint32_t xbase = smem_u32(xs + st * stage_bytes);
        uint32_t abase[2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          // Rows past the tile's last pixel read that pixel's inputs; their codes are not stored.
          const int m = s.m0 + min(wm + mi * 16 + arow, s.count - 1);
          const int p = static_cast<int>(by_q.div(static_cast<uint32_t>(m))), q = m - p * W;
          abase[mi] = xbase + ((p - s.p0) * QP + q) * kXRow + akb;
        }
        int32_t acc[2][NI][4] = {};
#pragma unroll
        for (int r = 0; r < 3; ++r)
#pragma unroll
          for (int sx = 0; sx < 3; ++sx) {
            const uint32_t toff = (r * QP + sx) * kXRow;
#pragma unroll
            for (int kk = 0; kk < C / 32; ++kk) {
              const uint32_t a[2] = {abase[0] + toff + kk * 32, abase[1] + toff + kk * 32};
              ldm_mma_k32<NI>(acc, a, wbase + (r * 3 + sx) * C + kk * 32, kWRow);
            }
          }
        pw_epilogue_fused<Act == kPwRelu, false>(acc, zy + st * kTileM * kZRow, kZRow, sb, wm,
                                                     wn, lane, szy, z != nullptr);
      },
      [&](int st, int tile) {
        const Tile3 s = tile3(tile, tpi, pq, by_q);
        pw_store_rows<kN, kThreads>(y, static_cast<int64_t>(s.n) * pq + s.m0, s.count, K, k0,
                                    zy + st * kTileM * kZRow, kZRow, tid);
      });
}

template <int C, int Act>
cudaError_t prepare_one(int64_t bytes, int* per_sm) {
  return prepare_persistent(int8_conv3x3<C, Act>, kThreads, kSmemLimit, static_cast<size_t>(bytes),
                            per_sm);
}

}  // namespace

const char* int8_conv3x3_problem_unfit(const Int8Geom& g) {
  const int C = g.C4 * 4;
  if (g.R != 3 || g.S != 3 || g.sh != 1 || g.sw != 1 || g.dh != 1 || g.dw != 1 || g.ph != 1 ||
      g.pw != 1 || g.P != g.H || g.Q != g.W)
    return "not a 3x3 convolution with stride 1 and padding 1";
  if (C != 64 && C != 128) return "C must be 64 or 128";
  if (g.K % kN != 0) return "K must be a multiple of 64";
  return "";
}

const char* int8_conv3x3_launch_unfit(const int8_t* x, const int8_t* w, const int8_t* y,
                                      const Int8Epilogue& e) {
  if (e.z && e.z_type != DataType::kInt8) return "the residual is not int8";
  if (e.alpha != 1.f) return "Gemm's alpha (convolutions only)";
  if (e.act.act != Act::kNone && e.act.act != Act::kRelu) return "activations other than ReLU";
  if (!aligned16(x) || !aligned16(w) || !aligned16(y) || (e.z && !aligned16(e.z)))
    return "a tensor is not 16-byte aligned";
  return "";
}

const char* int8_conv3x3_unfit(const Int8Geom& g) {
  if (const char* why = int8_conv3x3_problem_unfit(g); *why) return why;
  if (g.W < 1 || smem_bytes(g.C4 * 4, std::max(g.H, 1), g.W) > kSmemLimit)
    return "the image is too wide for the input patch in shared memory";
  return "";
}

cudaError_t prepare_int8_conv3x3(const Int8Geom& g, bool relu, int* per_sm) {
  *per_sm = 0;
  if (*int8_conv3x3_unfit(g)) return cudaSuccess;  // launch says why
  const int C = g.C4 * 4;
  const int64_t bytes = smem_bytes(C, g.H, g.W);
  if (C == 64)
    return relu ? prepare_one<64, kPwRelu>(bytes, per_sm) : prepare_one<64, kPwNone>(bytes, per_sm);
  return relu ? prepare_one<128, kPwRelu>(bytes, per_sm) : prepare_one<128, kPwNone>(bytes, per_sm);
}

const char* launch_int8_conv3x3(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                const Int8Epilogue& e, int per_sm, cudaStream_t stream) {
  if (const char* why = int8_conv3x3_unfit(g); *why) return why;
  if (const char* why = int8_conv3x3_launch_unfit(x, w, y, e); *why) return why;
  if (per_sm <= 0) return "not prepared (prepare_int8_conv3x3), or no block fits on an SM";
  if (g.N == 0) return "";
  const int C = g.C4 * 4, pq = g.P * g.Q, tpi = (pq + kTileM - 1) / kTileM;
  const int tiles = g.N * tpi, cblocks = g.K / kN, prows = patch_rows(g.H, g.W);
  const int rows = std::max(1, std::min(tiles, per_sm * sm_count() / cblocks));
  const size_t bytes = static_cast<size_t>(smem_bytes(C, g.H, g.W));
  const dim3 grid(cblocks, rows);
  const bool relu = e.act.act == Act::kRelu;
  const FastDiv by_q(g.Q);
  if (C == 64) {
    if (relu)
      int8_conv3x3<64, kPwRelu><<<grid, kThreads, bytes, stream>>>(x, w, y, g, e, tiles, tpi, prows, by_q);
    else
      int8_conv3x3<64, kPwNone><<<grid, kThreads, bytes, stream>>>(x, w, y, g, e, tiles, tpi, prows, by_q);
  } else if (relu) {
    int8_conv3x3<128, kPwRelu><<<grid, kThreads, bytes, stream>>>(x, w, y, g, e, tiles, tpi, prows, by_q);
  } else {
    int8_conv3x3<128, kPwNone><<<grid, kThreads, bytes, stream>>>(x, w, y, g, e, tiles, tpi, prows, by_q);
  }
  return "";
}

}  // namespace kiln::gpu
