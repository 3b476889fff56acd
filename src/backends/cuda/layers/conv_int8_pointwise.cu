// The persistent pointwise INT8 convolution (conv_int8.pipelined's pw64 / pw128 variants): a 1x1
// convolution without padding (any stride), C of 64, 128 or 256 input channels and K a multiple of
// the block's N output channels, Y int8 and the residual int8 or absent: ResNet's expand, reduce
// and downsample layers in an INT8 chain. The H100 showed the per-tile kernels (the pipelined one
// and the libraries') spending their time in instructions and in per-tile start-up, each tile
// loading, multiplying and storing in turn (docs/perf.md). Here:
//   - each block keeps its N x C weight slice and the channels' scales and biases in shared memory
//     for its whole life, and walks pixel tiles of 128 (gridDim.y apart; as many blocks as fit on
//     the GPU at once, the channel blocks of a pixel tile side by side so X is read from L2);
//   - a two-stage ring: tile i + 1's X rows and residual arrive by cp.async while tile i is
//     multiplied (mma.sync m16n8k32 s8 over the whole reduction from shared memory), quantized in
//     place and stored in 16-byte coalesced rows;
//   - the epilogue is reassociated as TensorRT and the INT8 libraries do it (pw_epilogue_fused:
//     the channel scale and bias divided by Y's scale, fused multiply-adds, ReLU as the clamp's
//     bound), half the instructions of the reference's arithmetic, within one code of it;
//   - a stride-1 layer's pixel rows are contiguous, so no index arithmetic per row.
#include <algorithm>

#include "device_util_host.h"
#include "kernels/fast_div.cuh"
#include "layers/conv_int8_pw.cuh"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 256;  // 8 warps: TM / 32 along the pixels x the rest along the channels

// Shared memory: W [N][C + 16], X [2][TM][C + 16], the residual/output ring [2][TM][N + 16]
// (rows padded by 16 bytes, 20, 36 or 68 words: the 8 rows a fragment or pair access touches
// fall in distinct banks), then scale and bias [N][2]. TM, the pixels per tile, is 128, or 64
// (variants ...m64): half the shared memory and registers, so twice the blocks per SM keep loads in
// flight (C = 256, N = 128: 141 KiB hold one block per SM, 88 KiB two).
template <int N, int C, int TM>
constexpr int smem_bytes() {
  return N * (C + 16) + 2 * TM * (C + 16) + 2 * TM * (N + 16) + N * 8;
}

template <int N, int C, int Act, int TM>
__global__ void __launch_bounds__(kThreads)
    int8_pointwise(const int8_t* __restrict__ x, const int8_t* __restrict__ w,
                   int8_t* __restrict__ y, Int8Geom g, Int8Epilogue e, int tiles, FastDiv by_q,
                   FastDiv by_pq) {
  constexpr int kTileM = TM;
  constexpr int kXRow = C + 16, kZRow = N + 16;
  constexpr int kXChunks = C / 16, kZChunks = N / 16;  // 16-byte chunks per row
  constexpr int WM = TM / 32, WN = 8 / WM;  // warps along the pixels and along the channels
  constexpr int NW = N / WN;                // channels per warp
  constexpr int NI = NW / 8;                // 8-channel mma columns per warp
  extern __shared__ __align__(16) unsigned char smem[];
  int8_t* ws = reinterpret_cast<int8_t*>(smem);
  int8_t* xs = ws + N * kXRow;
  int8_t* zy = xs + 2 * kTileM * kXRow;
  float* sb = reinterpret_cast<float*>(zy + 2 * kTileM * kZRow);
  static_assert((N * kXRow + 2 * kTileM * (kXRow + kZRow)) % 16 == 0, "sb must stay aligned");
  static_assert(TM == 128 || TM == 64, "tiles of 128 or 64 pixels");
  const int M = g.M, K = g.K;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int k0 = blockIdx.x * N;
  const auto* z = static_cast<const int8_t*>(e.z);
  const bool contiguous = g.sh == 1 && g.sw == 1;  // and no padding: pixel m reads X row m

  for (int i = tid; i < N * kXChunks; i += kThreads)
    cp_async16(ws + (i / kXChunks) * kXRow + (i % kXChunks) * 16,
               w + static_cast<int64_t>(k0 + i / kXChunks) * C + (i % kXChunks) * 16, true);
  for (int i = tid; i < N; i += kThreads) {  // divided by Y's scale: the reassociated epilogue
    sb[2 * i] = __fdiv_rn(e.scale[k0 + i], e.sy);
    sb[2 * i + 1] = e.bias ? __fdiv_rn(e.bias[k0 + i], e.sy) : 0.f;
  }
  const float szy = __fdiv_rn(e.sz, e.sy);
  auto load_tile = [&](int stage, int tile) {
    const int m0 = tile * kTileM;
    int8_t* xt = xs + stage * kTileM * kXRow;
#pragma unroll
    for (int j = 0; j < kTileM * kXChunks / kThreads; ++j) {
      const int i = tid + j * kThreads, r = i / kXChunks, c = i % kXChunks, m = m0 + r;
      const bool ok = m < M;
      int64_t row = ok ? m : 0;
      if (!contiguous && ok) {
        // m / Q and m / (P * Q) by multiply-high (FastDiv): no integer division per chunk.
        const int nq = static_cast<int>(by_q.div(m)), n = static_cast<int>(by_pq.div(m));
        const int q = m - nq * g.Q, p = nq - n * g.P;
        row = (static_cast<int64_t>(n) * g.H + p * g.sh) * g.W + q * g.sw;
      }
      cp_async16(xt + r * kXRow + c * 16, x + row * C + c * 16, ok);
    }
    if (z) {
      int8_t* zt = zy + stage * kTileM * kZRow;
#pragma unroll
      for (int j = 0; j < kTileM * kZChunks / kThreads; ++j) {
        const int i = tid + j * kThreads, r = i / kZChunks, c = i % kZChunks, m = m0 + r;
        const bool ok = m < M;
        cp_async16(zt + r * kZRow + c * 16, z + static_cast<int64_t>(ok ? m : 0) * K + k0 + c * 16,
                   ok);
      }
    }
  };

  const int wm = (warp % WM) * 32, wn = (warp / WM) * NW;
  const PwLaneAddrs la = pw_lane_addrs(ws, kXRow, wm, wn, lane);
  pw_tile_ring(
      tiles, load_tile,
      [&](int st, int) {
        int32_t acc[2][NI][4] = {};
        pw_mma_steps<0, C / 32>(acc, smem_u32(xs + st * kTileM * kXRow), la, kXRow);
        pw_epilogue_fused<Act == kPwRelu>(acc, zy + st * kTileM * kZRow, kZRow, sb, wm, wn, lane,
                                          szy, z != nullptr);
      },
      [&](int st, int tile) {
        const int m0 = tile * kTileM;
        pw_store_rows<N, kThreads, TM>(y, m0, M - m0, K, k0, zy + st * kTileM * kZRow, kZRow, tid);
      });
}

// Blocks of one instantiation that fit on an SM (occupancy), found once per process at configure.
template <int N, int C, int Act, int TM>
int& resident_blocks() {
  static int blocks = 0;
  return blocks;
}

template <int N, int C, int Act, int TM = 128>
cudaError_t prepare_one() {
  constexpr int bytes = smem_bytes<N, C, TM>();
  return prepare_persistent(int8_pointwise<N, C, Act, TM>, kThreads, bytes, bytes,
                            &resident_blocks<N, C, Act, TM>());
}

template <int N>
cudaError_t prepare_n() {
  for (cudaError_t e : {prepare_one<N, 64, kPwNone>(), prepare_one<N, 64, kPwRelu>(),
                        prepare_one<N, 128, kPwNone>(), prepare_one<N, 128, kPwRelu>(),
                        prepare_one<N, 256, kPwNone>(), prepare_one<N, 256, kPwRelu>(),
                        prepare_one<N, 64, kPwNone, 64>(), prepare_one<N, 64, kPwRelu, 64>(),
                        prepare_one<N, 128, kPwNone, 64>(), prepare_one<N, 128, kPwRelu, 64>(),
                        prepare_one<N, 256, kPwNone, 64>(), prepare_one<N, 256, kPwRelu, 64>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

template <int N, int C, int Act, int TM>
const char* launch(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                   const Int8Epilogue& e, cudaStream_t stream) {
  const int per_sm = resident_blocks<N, C, Act, TM>();
  if (per_sm <= 0) return "not prepared (prepare_int8_pointwise), or no block fits on an SM";
  const int tiles = (g.M + TM - 1) / TM, cblocks = g.K / N;
  const int rows = std::max(1, std::min(tiles, per_sm * sm_count() / cblocks));
  int8_pointwise<N, C, Act, TM><<<dim3(cblocks, rows), kThreads, smem_bytes<N, C, TM>(), stream>>>(
      x, w, y, g, e, tiles, FastDiv(g.Q), FastDiv(g.P * g.Q));
  return "";
}

template <int N, int Act, int TM>
const char* launch_c(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                     const Int8Epilogue& e, cudaStream_t stream) {
  switch (g.C4 * 4) {
    case 64: return launch<N, 64, Act, TM>(x, w, y, g, e, stream);
    case 128: return launch<N, 128, Act, TM>(x, w, y, g, e, stream);
    default: return launch<N, 256, Act, TM>(x, w, y, g, e, stream);
  }
}
template <int N, int Act>
const char* launch_m(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                     const Int8Epilogue& e, int tile_m, cudaStream_t stream) {
  return tile_m == 64 ? launch_c<N, Act, 64>(x, w, y, g, e, stream)
                      : launch_c<N, Act, 128>(x, w, y, g, e, stream);
}

}  // namespace

cudaError_t prepare_int8_pointwise() {
  const cudaError_t e = prepare_n<128>();
  return e != cudaSuccess ? e : prepare_n<64>();
}

const char* int8_pointwise_unfit(const Int8Geom& g, int tile_n, int tile_m) {
  const int C = g.C4 * 4;
  if (g.R != 1 || g.S != 1 || g.ph != 0 || g.pw != 0) return "not a 1x1 convolution without padding";
  if (C != 64 && C != 128 && C != 256) return "C must be 64, 128 or 256";
  if (tile_m != 128 && tile_m != 64) return "tiles of 128 or 64 pixels only";
  if ((tile_n != 64 && tile_n != 128) || g.K % tile_n != 0)
    return "K must be a multiple of the tile's channels (64 or 128)";
  if (g.P != (g.H - 1) / g.sh + 1 || g.Q != (g.W - 1) / g.sw + 1) return "unexpected output size";
  return "";
}

const char* launch_int8_pointwise(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                  const Int8Epilogue& e, int tile_n, int tile_m,
                                  cudaStream_t stream) {
  if (const char* why = int8_pointwise_unfit(g, tile_n, tile_m); *why) return why;
  if (e.z && e.z_type != DataType::kInt8) return "the residual is not int8";
  if (e.alpha != 1.f) return "Gemm's alpha (convolutions only)";
  if (e.act.act != Act::kNone && e.act.act != Act::kRelu) return "activations other than ReLU";
  if (!aligned16(x) || !aligned16(w) || !aligned16(y) || (e.z && !aligned16(e.z)))
    return "a tensor is not 16-byte aligned";
  const bool relu = e.act.act == Act::kRelu;
  if (tile_n == 128)
    return relu ? launch_m<128, kPwRelu>(x, w, y, g, e, tile_m, stream)
                : launch_m<128, kPwNone>(x, w, y, g, e, tile_m, stream);
  return relu ? launch_m<64, kPwRelu>(x, w, y, g, e, tile_m, stream)
              : launch_m<64, kPwNone>(x, w, y, g, e, tile_m, stream);
}

}  // namespace kiln::gpu
