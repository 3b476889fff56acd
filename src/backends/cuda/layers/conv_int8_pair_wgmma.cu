// conv_int8.pair.wgmma: kiln.FusedConvPair (int8 = 1) on Hopper's warpgroup MMA, for the first
// bottleneck block of ResNet's stages, where the block's expand (1x1, C1 -> K) and its
// downsample (1x1, stride 2 past stage 1, C2 -> K) join in the residual Add and ReLU:
// (C1, C2) = (64, 64), (128, 256), (256, 512), (512, 1024) with K = 4 C1. At (64, 64) a chunk
// holds both inputs' codes; the tuner times it against the mma.sync pair kernel there.
//
// Run as two layers, the expand writes its K-channel output and the downsample reads it back as
// its residual; the pair reads X and X2 and writes Y once. The mma.sync pair kernel
// (conv_int8_pair.cu) keeps a tile's whole reduction (C1 + C2 codes per pixel) in shared memory
// beside its weights, so at these widths one block of 8 warps fits per SM and it is no faster
// than the two layers (docs/perf.md, eleventh session). Here (X read at stride 1, X2 at any):
//   - a block keeps its BN output channels' weights (W's then W2's, 16-byte chunk planes
//     [(C1 + C2) / 16][BN][16]: wgmma's unswizzled K-major layout) and their PairChannel
//     constants in shared memory for its life;
//   - its warpgroups (3) work independently (their own barriers, warpgroup_barrier): each walks
//     tiles of 64 output pixels, streaming a tile's reduction through its own ring of 128-code
//     chunks (64 pixel rows of 128 bytes in wgmma's 128-byte swizzled layout, so that the 8 lanes
//     copying a row write one line), S - 2 chunks ahead of its MMAs, across tile boundaries; a
//     stage's mbarrier completes when its copies have landed (cp.async.mbarrier.arrive);
//   - a chunk is 4 k steps of wgmma m64nBNk32, each into X's accumulators (the first C1 / 32
//     steps of a tile) or X2's (their scales differ per channel, so the two GEMMs accumulate
//     apart), issued without waiting for the chunk before;
//   - at a tile's end the warpgroup waits for its MMAs and runs the pair epilogue,
//     fma(acc2, s2, fma(acc1, s1, b)) -> code (the mma.sync pair kernel's arithmetic), into its
//     output rows in shared memory, then stores them coalesced. While one warpgroup is in its
//     epilogue the others' MMAs keep the tensor cores busy, and its next chunks keep loading.
// On the H100 at batch 256 (docs/perf.md, sixteenth session): stage 2's pair 0.118 ms against
// 0.22 for its two layers, stage 3's 0.096 against 0.14, stage 4's 0.105 against 0.097.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "device_util_host.h"
#include "kernels/wgmma.cuh"
#include "layers/conv_int8_pair.cuh"
#include "layers/conv_int8_pw.cuh"

namespace kiln::gpu {
namespace {

constexpr int kTileM = 64;                     // output pixels per warpgroup tile
constexpr int kChunk = 128;                    // reduction codes per ring stage
constexpr int kStageBytes = kTileM * kChunk;   // 64 pixel rows of 128 bytes, 128-byte swizzled
constexpr int kSmemLimit = 227 * 1024;         // the H100's opt-in shared memory per block

// Calls f(std::integral_constant<int, i>) for i = 0 .. N - 1 (a loop unrolled with i a constant).
template <int N, typename F, int... I>
__device__ __forceinline__ void constexpr_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>()), ...);
}
template <int N, typename F>
__device__ __forceinline__ void constexpr_for(F&& f) {
  constexpr_for_impl<N>(f, std::make_integer_sequence<int, N>());
}

// A shape's kernel: BN output channels per block (128, or 64 where the weights of 128 would
// not fit: stage 4), WG warpgroups per block (each with its own tiles: while one is in its
// epilogue the others' MMAs run) and a ring of S chunk stages per warpgroup (a chunk's MMAs, the
// one before, S - 2 loading), as many as fit in shared memory.
constexpr int pair_tile_n(int c1, int c2) { return (c1 + c2) * 128 <= 128 * 1024 ? 128 : 64; }

template <int C1, int C2>
struct Config {
  static constexpr int BN = pair_tile_n(C1, C2);
  static constexpr int WG = 3;
  static constexpr int S = C1 + C2 <= 384 ? 5 : 4;
};

// Shared memory (from its first 1024-byte boundary: a swizzled stage is whole 1024-byte atoms):
// per warpgroup its ring [S][64][128], then per warpgroup its output rows [64][BN + 16], the
// weights [C / 16][BN][16], the channels' PairChannel [BN], and the stages' mbarriers [WG][S].
constexpr int smem_bytes(int bn, int c, int wgs, int stages) {
  return 1024 + wgs * (stages * kStageBytes + kTileM * (bn + 16)) + bn * c + bn * 16 +
         wgs * stages * 8;
}

template <int BN, int C1, int C2, bool Relu, int WG, int S>
__global__ void __launch_bounds__(128 * WG, 1)
    int8_pair_wgmma(PairInput a, PairInput b, const int8_t* __restrict__ w,
                    const PairChannel* __restrict__ ch, int8_t* __restrict__ y, int M, int K,
                    int P, int Q, int tiles, FastDiv by_q, FastDiv by_pq) {
  constexpr int C = C1 + C2, kNC = C / kChunk, kZRow = BN + 16;
  constexpr int kP1 = C1 / 16, kS1 = C1 / 32;  // X's 16-byte pieces, its k steps
  constexpr int kThreads = 128 * WG, kStages = S, kAhead = S - 2;  // chunks loaded ahead
  constexpr bool kSmall1 = C1 <= 256, kSmall2 = C2 <= 256;  // |acc| <= 2^22: acc_to_float
  static_assert(C % kChunk == 0 && C1 % 32 == 0, "whole chunks; a k step reads one input");
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, t = tid % 128, lane = tid % 32, warp = t / 32;
  // The warpgroup, warp-uniform to the compiler (its descriptors then live in uniform registers).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  int8_t* base = reinterpret_cast<int8_t*>(smem) + ((1024 - (smem_u32(smem) & 1023)) & 1023);
  int8_t* ring = base + wg * kStages * kStageBytes;
  int8_t* zt = base + WG * kStages * kStageBytes + wg * kTileM * kZRow;
  int8_t* ws = base + WG * (kStages * kStageBytes + kTileM * kZRow);
  auto* sc = reinterpret_cast<PairChannel*>(ws + BN * C);
  auto* full = reinterpret_cast<uint64_t*>(sc + BN) + wg * kStages;  // a stage's chunk landed
  const int k0 = blockIdx.x * BN;
  if (t < kStages) mbarrier_init(full + t, 128);

  // The weights, each 8 lanes copying piece j of 8 channels (one 128-byte line of a plane) and
  // each 4 lanes of a channel 64 contiguous bytes of its row.
  static_assert((C / 16) % 4 == 0, "whole groups of 4 pieces");
  for (int i = tid; i < BN * (C / 16); i += kThreads) {
    const int n = (i / 32) % (BN / 8) * 8 + i % 8, j = i / (4 * BN) * 4 + (i / 8) % 4;
    cp_async16(ws + (j * BN + n) * 16, w + static_cast<int64_t>(k0 + n) * C + j * 16, true);
  }
  for (int i = tid; i < BN; i += kThreads) cp_async16(sc + i, ch + k0 + i, true);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();

  // This warpgroup's tiles: first, first + step, ...; its chunks g = tile index * kNC + chunk.
  const int step = gridDim.y * WG, first = blockIdx.y * WG + wg;
  const int my_tiles = first < tiles ? (tiles - 1 - first) / step + 1 : 0;
  const int bar = 1 + wg;
  // Thread t copies 16-byte piece t % 8 of pixels t / 8 + 16 i of a chunk. A tile's first pixel
  // and where those pixels' rows start in X2 (elements; -1: past the last pixel, zero-filled);
  // X is read at stride 1 (launch checks it): pixel m's row is m.
  struct Rows {
    int m0, x2[4];
  };
  auto tile_rows = [&](int lt, Rows& rw) {
    rw.m0 = (first + lt * step) * kTileM;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = rw.m0 + t / 8 + 16 * i;
      const bool ok = lt < my_tiles && m < M;
      rw.x2[i] = ok ? static_cast<int>(pair_input_row(b, m, P, Q, by_q, by_pq)) * C2 : -1;
    }
  };
  // Chunk J of a tile (rows rw) into chunk g's stage: the tile's pieces 8 J.. of the reduction
  // (X's C1 / 16 pieces, then X2's), 128-byte swizzled (piece c of pixel r at byte 16 (c ^ r % 8)
  // of its 128-byte row: the 8 lanes copying a pixel's 128 contiguous bytes write one 128-byte
  // line, and wgmma's reads of 8 rows' piece fall in distinct banks); the stage's barrier counts
  // this thread's arrival once its copies have landed.
  auto load = [&](const Rows& rw, auto chunk, int g) {
    constexpr int J = decltype(chunk)::value;
    int8_t* st = ring + (g % kStages) * kStageBytes + (t / 8) * kChunk +
                 (((t % 8) ^ ((t / 8) % 8)) * 16);  // pixels t / 8 + 16 i: the same r % 8
    const int p = J * 8 + t % 8;
    const bool from_x = C1 % kChunk == 0 ? J * 8 < kP1 : p < kP1;  // whole chunks: J decides
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = rw.m0 + t / 8 + 16 * i;
      const bool ok = from_x ? m < M : rw.x2[i] >= 0;
      const int8_t* src = from_x ? a.x + m * C1 + p * 16 : b.x + rw.x2[i] + (p - kP1) * 16;
      cp_async16(st + 16 * i * kChunk, ok ? src : a.x, ok);
    }
    cp_async_mbarrier_arrive(full + g % kStages);
  };
  // Chunk g (chunk J of its tile) as 4 k steps of wgmma, each into X's accumulators or X2's (k
  // step s of the tile reads X when s < C1 / 32), issued without waiting; a tile's first k step
  // of each input overwrites its accumulators.
  auto mma = [&](int32_t(&acc1)[1][BN / 8][4], int32_t(&acc2)[1][BN / 8][4], int g, auto chunk) {
    constexpr int J = decltype(chunk)::value, s0 = J * (kChunk / 32), s1 = s0 + kChunk / 32;
    const uint64_t ad =
        wgmma_desc_opaque(wgmma_desc_sw128(smem_u32(ring + (g % kStages) * kStageBytes)));
    const uint64_t bd =
        wgmma_desc_opaque(wgmma_desc(smem_u32(ws) + J * (kChunk / 16) * BN * 16, BN * 16, 128));
    if constexpr (s0 < kS1) wgmma_fence_operand(acc1[0]);
    if constexpr (s1 > kS1) wgmma_fence_operand(acc2[0]);
    wgmma_fence();
    constexpr_for<kChunk / 32>([&](auto kc) {
      constexpr int kk = decltype(kc)::value, s = s0 + kk;
      const uint64_t da = wgmma_desc_add(ad, 32 * kk), db = wgmma_desc_add(bd, 2 * kk * BN * 16);
      if constexpr (s < kS1)
        wgmma_s8_k32<BN>(acc1[0], da, db, s != 0);
      else
        wgmma_s8_k32<BN>(acc2[0], da, db, s != kS1);
    });
    wgmma_commit();
  };

  // The tiles' rows: found once per tile (this tile's and the next's) where a tile has at least
  // kAhead chunks, else for each load.
  Rows cur, next;
  tile_rows(0, cur);
  tile_rows(1, next);
  constexpr_for<kAhead>([&](auto sc_) {
    constexpr int s = decltype(sc_)::value;
    if constexpr (kNC >= kAhead) {
      if (my_tiles > 0) load(cur, std::integral_constant<int, s>(), s);
    } else if (s / kNC < my_tiles) {
      Rows rw;
      tile_rows(s / kNC, rw);
      load(rw, std::integral_constant<int, s % kNC>(), s);
    }
  });
  int g = 0;
  for (int lt = 0; lt < my_tiles; ++lt) {
    int32_t acc1[1][BN / 8][4], acc2[1][BN / 8][4];
    constexpr_for<kNC>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      mbarrier_wait(full + g % kStages, (g / kStages) & 1);  // chunk g has landed
      // Every warp is past its wait for chunk g - 2's MMAs (below, last iteration): that chunk's
      // stage takes chunk g + kAhead (chunk j + kAhead of this tile, or of the next).
      warpgroup_barrier(bar);
      // The chunk kAhead on: chunk J of tile lt + dt.
      constexpr int dt = (j + kAhead) / kNC, J = (j + kAhead) % kNC;
      if constexpr (kNC >= kAhead) {
        if constexpr (dt == 0)
          load(cur, std::integral_constant<int, J>(), g + kAhead);
        else if (lt + 1 < my_tiles)
          load(next, std::integral_constant<int, J>(), g + kAhead);
      } else if (lt + dt < my_tiles) {
        Rows rw;
        tile_rows(lt + dt, rw);
        load(rw, std::integral_constant<int, J>(), g + kAhead);
      }
      mma(acc1, acc2, g, jc);
      wgmma_wait<1>();  // chunk g - 1's MMAs are done
      ++g;
    });
    if constexpr (kNC >= kAhead) {
      cur = next;
      tile_rows(lt + 2, next);
    }
    wgmma_wait<0>();
    wgmma_fence_operand(acc1[0]);
    wgmma_fence_operand(acc2[0]);
    // The epilogue into this warpgroup's output rows (free: its last stores were before the
    // barriers above), then the rows stored.
    pw_fragments<BN / 8, 1>(warp * 16, 0, lane, [&](int, int ni, int row, int col) {
      const float4 e0 = *reinterpret_cast<const float4*>(sc + col);  // s1, s2, b, -
      const float4 e1 = *reinterpret_cast<const float4*>(sc + col + 1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float t0 =
            __fmaf_rn(acc_to_float<kSmall2>(acc2[0][ni][2 * h]), e0.y,
                      __fmaf_rn(acc_to_float<kSmall1>(acc1[0][ni][2 * h]), e0.x, e0.z));
        const float t1 =
            __fmaf_rn(acc_to_float<kSmall2>(acc2[0][ni][2 * h + 1]), e1.y,
                      __fmaf_rn(acc_to_float<kSmall1>(acc1[0][ni][2 * h + 1]), e1.x, e1.z));
        *reinterpret_cast<uint16_t*>(zt + (row + 8 * h) * kZRow + col) = static_cast<uint16_t>(
            __byte_perm(fused_code<Relu>(t0), fused_code<Relu>(t1), 0x0040));
      }
    });
    warpgroup_barrier(bar);
    const int m0 = (first + lt * step) * kTileM;
    pw_store_rows<BN, 128, kTileM>(y, m0, M - m0, K, k0, zt, kZRow, t);
  }
}

// Blocks of one instantiation that fit on an SM, found at configure (prepare).
template <int C1, int C2, bool Relu>
int& resident_blocks() {
  static int blocks = 0;
  return blocks;
}

template <int C1, int C2, bool Relu>
const char* launch(const PairLaunch& l, bool prepare, cudaStream_t stream) {
  using Cfg = Config<C1, C2>;
  constexpr int BN = Cfg::BN, WG = Cfg::WG, threads = 128 * WG;
  constexpr int bytes = smem_bytes(BN, C1 + C2, WG, Cfg::S);
  static_assert(bytes <= kSmemLimit, "the block's shared memory");
  const auto kernel = int8_pair_wgmma<BN, C1, C2, Relu, WG, Cfg::S>;
  int& per_sm = resident_blocks<C1, C2, Relu>();
  if (prepare) {
    const cudaError_t e = prepare_persistent(kernel, threads, bytes, bytes, &per_sm);
    return e == cudaSuccess ? "" : cudaGetErrorString(e);
  }
  if (per_sm <= 0) return "not prepared, or no block fits on an SM";
  if (!l.a.contiguous) return "X must be read at stride 1";
  const int tiles = (l.M + kTileM - 1) / kTileM, cblocks = l.K / BN;
  const int rows = std::max(1, std::min((tiles + WG - 1) / WG, per_sm * sm_count() / cblocks));
  kernel<<<dim3(cblocks, rows), threads, bytes, stream>>>(l.a, l.b, l.w, l.ch, l.y, l.M, l.K, l.P,
                                                          l.Q, tiles, FastDiv(l.Q),
                                                          FastDiv(l.P * l.Q));
  return "";
}

template <bool Relu>
const char* dispatch(int c1, int c2, const PairLaunch& l, bool prepare, cudaStream_t s) {
  if (c1 == 64 && c2 == 64) return launch<64, 64, Relu>(l, prepare, s);
  if (c1 == 128 && c2 == 256) return launch<128, 256, Relu>(l, prepare, s);
  if (c1 == 256 && c2 == 512) return launch<256, 512, Relu>(l, prepare, s);
  if (c1 == 512 && c2 == 1024) return launch<512, 1024, Relu>(l, prepare, s);
  return int8_pair_wgmma_unfit(c1, c2, l.K);
}

}  // namespace

const char* int8_pair_wgmma_unfit(int c1, int c2, int K) {
  const bool known = (c1 == 64 && c2 == 64) || (c1 == 128 && c2 == 256) ||
                     (c1 == 256 && c2 == 512) || (c1 == 512 && c2 == 1024);
  if (!known) return "(C1, C2) must be (64, 64), (128, 256), (256, 512) or (512, 1024)";
  if (const int bn = pair_tile_n(c1, c2); K % bn != 0)
    return bn == 64 ? "K must be a multiple of 64" : "K must be a multiple of 128";
  return "";
}

const char* launch_int8_pair_wgmma(bool relu, int c1, int c2, const PairLaunch& l, bool prepare,
                                   cudaStream_t stream) {
  if (const char* why = int8_pair_wgmma_unfit(c1, c2, l.K); *why) return why;
  return relu ? dispatch<true>(c1, c2, l, prepare, stream)
              : dispatch<false>(c1, c2, l, prepare, stream);
}

}  // namespace kiln::gpu
