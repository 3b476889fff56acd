// mha.flash's kernels (layers/attention_mha.cu describes the tactic): FlashAttention-2's forward
// pass on mma.sync m16n8k16, templated on the padded head size D. Shared by attention_mha.cu
// (head sizes 32, 64 and 128, whose tiles are XOR-swizzled) and attention_flash_wide.cu (the
// other multiples of 16 up to 256, whose tiles have padded rows): a head of d <= D columns (a
// multiple of 8) is read into D-wide tiles whose columns past d are zero, so Q K^T over D
// columns is Q K^T over d, and P V's columns past d are never stored.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "kernels/pdl.cuh"

namespace kiln::gpu::flash {

// --- mha.flash --------------------------------------------------------------------------------

constexpr int kKeys = 64;   // keys per shared-memory tile (a cp.async stage)
constexpr int kChunk = 32;  // keys per online-softmax step: 16 score registers per thread
constexpr float kLog2e = 1.4426950408889634f;

// How a kernel reads the mask (a compile-time choice, so that the reads keep their place in the
// schedule): element by element through the rows' offsets; staged, one row for every query row
// in shared memory per key tile (a key-padding mask); or as pairs of adjacent keys in one load
// (rows of even length and offset, keys contiguous: a causal mask per query row; w32 only).
enum MaskRead { kMaskElems = 0, kMaskStaged = 1, kMaskPairs = 2 };

struct FlashArgs {
  const __half* q;
  const __half* k;
  const __half* v;
  __half* y;
  int64_t q_b, k_b, v_b, y_b;  // batch strides (elements)
  int64_t q_s, k_s, v_s, y_s;  // row strides (elements)
  int64_t k_h, v_h;            // head strides of K and V (elements: d, or Sk * d head-major)
  int sq, sk;
  int d;             // the head size (a multiple of 8, at most the kernel's D)
  float scale_log2;  // scale * log2(e): the softmax runs in base 2
  const void* mask;  // additive; its element type is the kernel's MaskT
  int64_t m_b, m_h, m_q;
  int m_k;
  int group;  // query heads per key/value head (grouped-query attention; 1 without)
  bool nan_to_zero;
  // The rotary on Q and K (inputs 4 to 6, ops/fused.h), applied to their tiles in shared memory:
  // rot 0 none, 1 pairs (x[k], x[k + D/2]), 2 interleaved pairs (x[2k], x[2k + 1]). The caches'
  // row for position s of batch b is pos[b * r_b + s] (position ids; r_max rows, an id past
  // them gives NaN) or, without pos, b * r_b + s (r_b = S, or 0 for caches without a batch).
  const __half* cosc;
  const __half* sinc;
  const int64_t* pos;
  int64_t r_b;
  int64_t r_max;
  int rot;
};

// Tiles of D = 32, 64 or 128 columns are XOR-swizzled (swz); others, multiples of 16 up to 256,
// have rows of D + 8 halves: an odd number of 16-byte chunks, so the eight rows an ldmatrix reads
// fall on distinct banks too.
constexpr bool swizzled(int d) { return d == 32 || d == 64 || d == 128; }
// The halves a tile row takes in shared memory.
constexpr int row_stride(int d) { return swizzled(d) ? d : d + 8; }

// Element (row, col) of a [rows][D] half tile: 16-byte chunks XOR-swizzled by row % 8. Rows of
// four chunks (head size 32) by (row / 2) % 4: the eight rows an ldmatrix reads, two to 128
// bytes, then fall on distinct banks. Other D: padded rows (row_stride).
template <int D>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(D % 16 == 0 && D >= 32 && D <= 256, "head sizes: multiples of 16 up to 256");
  if constexpr (!swizzled(D))
    return row * row_stride(D) + col;
  else if constexpr (D >= 64)
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  else
    return row * D + ((((col >> 3) ^ ((row >> 1) & 3))) << 3) + (col & 7);
}

// Rows [0, valid) of a `rows`-row tile from global rows of `stride` elements, their first d
// columns (a multiple of 8); the rest zero.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile(__half* s, const __half* g, int64_t stride, int rows,
                                          int valid, int d, int tid) {
  for (int i = tid; i < rows * D / 8; i += kThreads) {
    const int row = i / (D / 8), c = i % (D / 8);
    const bool ok = row < valid && c * 8 < d;
    cp_async16(s + swz<D>(row, c * 8), ok ? g + row * stride + c * 8 : g, ok);
  }
}

// One rotary pair in place, as rotary_half8_kernel (layers/rotary.cu) computes it: each product
// rounded to float16, then the difference or sum (exact operands, rounded once in float) rounded
// to float16, so the two agree bit for bit.
__device__ __forceinline__ void rotate_pair(__half& x1, __half& x2, __half c, __half s) {
  const float u = __half2float(x1), w = __half2float(x2);
  const float cj = __half2float(c), sj = __half2float(s);
  auto h = [](float v) { return __half2float(__float2half_rn(v)); };
  x1 = __float2half_rn(h(cj * u) - h(sj * w));
  x2 = __float2half_rn(h(sj * u) + h(cj * w));
}

// The rotary on rows [0, valid) of a swizzled [rows][D] tile in shared memory whose row r holds
// sequence position p0 + r of batch b, in place (each row a whole head, so a pair's partner is
// in the same row). A thread takes a 16-byte chunk of the first half and its partner D/2 on
// (rot 1), or one chunk of four interleaved pairs (rot 2). The caller synchronises before the
// tile is read.
template <int D, int kThreads>
__device__ __forceinline__ void rotate_tile(const FlashArgs& a, __half* s, int valid, int p0, int b,
                                            int tid) {
  constexpr int kHalf = D / 2;
  const bool inter = a.rot == 2;
  const int per_row = inter ? D / 8 : D / 16;
  for (int i = tid; i < valid * per_row; i += kThreads) {
    const int row = i / per_row, c = i - row * per_row;
    int64_t cr = static_cast<int64_t>(b) * a.r_b + p0 + row;
    bool bad = false;
    if (a.pos) {
      cr = a.pos[cr];
      bad = cr < 0 || cr >= a.r_max;
    }
    uint4* p1 = reinterpret_cast<uint4*>(s + swz<D>(row, c * 8));
    uint4* p2 = reinterpret_cast<uint4*>(s + swz<D>(row, kHalf + c * 8));
    if (bad) {  // as rotary_half8_kernel: NaN for a position past the caches
      const __half nan = __float2half(__int_as_float(0x7fc00000));
      const __half2 nn = __halves2half2(nan, nan);
      const uint32_t w = *reinterpret_cast<const uint32_t*>(&nn);
      *p1 = make_uint4(w, w, w, w);
      if (!inter) *p2 = make_uint4(w, w, w, w);
      continue;
    }
    if (!inter) {
      const uint4 cv = *reinterpret_cast<const uint4*>(a.cosc + cr * kHalf + c * 8);
      const uint4 sv = *reinterpret_cast<const uint4*>(a.sinc + cr * kHalf + c * 8);
      uint4 x1 = *p1, x2 = *p2;
      __half* h1 = reinterpret_cast<__half*>(&x1);
      __half* h2 = reinterpret_cast<__half*>(&x2);
      const __half* cc = reinterpret_cast<const __half*>(&cv);
      const __half* ss = reinterpret_cast<const __half*>(&sv);
#pragma unroll
      for (int j = 0; j < 8; ++j) rotate_pair(h1[j], h2[j], cc[j], ss[j]);
      *p1 = x1, *p2 = x2;
    } else {
      const uint2 cv = *reinterpret_cast<const uint2*>(a.cosc + cr * kHalf + c * 4);
      const uint2 sv = *reinterpret_cast<const uint2*>(a.sinc + cr * kHalf + c * 4);
      uint4 x = *p1;
      __half* hx = reinterpret_cast<__half*>(&x);
      const __half* cc = reinterpret_cast<const __half*>(&cv);
      const __half* ss = reinterpret_cast<const __half*>(&sv);
#pragma unroll
      for (int j = 0; j < 4; ++j) rotate_pair(hx[2 * j], hx[2 * j + 1], cc[j], ss[j]);
      *p1 = x;
    }
  }
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(float x) { return x; }

// Two adjacent mask values from an even offset (4 or 8 bytes aligned).
__device__ __forceinline__ float2 load_pair(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ float2 load_pair(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}

// The block's mask (batch b, head h) and this thread's two query rows' offsets into it (rows
// row_lo and row_lo + 8; past the end: row 0, never read). Offsets are 32-bit (configure checks
// the mask's size), to spare registers.
template <typename MaskT>
__device__ __forceinline__ const MaskT* mask_rows(const FlashArgs& a, int b, int h, int row_lo,
                                                  int (&mrow)[2]) {
  if constexpr (!std::is_void_v<MaskT>) {
    for (int r = 0; r < 2; ++r) mrow[r] = min(row_lo + 8 * r, a.sq - 1) * static_cast<int>(a.m_q);
    return static_cast<const MaskT*>(a.mask) + static_cast<int64_t>(b) * a.m_b +
           static_cast<int64_t>(h) * a.m_h;
  }
  return nullptr;
}

// A mask that is the same for every query row (a key-padding mask, [B, 1, 1, Sk]): keys
// k0..k0+keys-1 of this block's row, times log2(e), into shared memory (0 past the end), so that
// the softmax steps read it there instead of from global memory at every score.
template <typename MaskT, int kThreads>
__device__ __forceinline__ void stage_mask(const FlashArgs& a, int b, int h, float* sm, int k0,
                                           int keys, int tid) {
  if constexpr (!std::is_void_v<MaskT>) {
    const MaskT* mb = static_cast<const MaskT*>(a.mask) + static_cast<int64_t>(b) * a.m_b +
                      static_cast<int64_t>(h) * a.m_h;
    for (int i = tid; i < keys; i += kThreads)
      sm[i] = k0 + i < a.sk ? to_f32(mb[static_cast<int64_t>(k0 + i) * a.m_k]) * kLog2e : 0.f;
  }
}

// Stage t of the double-buffered K and V tiles (`keys` rows each) in shared memory: stage t + 1's
// loads are issued first, then stage t is waited for.
template <int D, int kThreads>
__device__ __forceinline__ void kv_stage(const FlashArgs& a, __half* sk, __half* sv,
                                         const __half* k, const __half* v, int t, int tiles,
                                         int keys, int tid) {
  if (t + 1 < tiles) {
    const int k1 = (t + 1) * keys, nb = (t + 1) & 1;
    load_tile<D, kThreads>(sk + nb * keys * row_stride(D), k + static_cast<int64_t>(k1) * a.k_s,
                           a.k_s, keys, min(keys, a.sk - k1), a.d, tid);
    load_tile<D, kThreads>(sv + nb * keys * row_stride(D), v + static_cast<int64_t>(k1) * a.v_s,
                           a.v_s, keys, min(keys, a.sk - k1), a.d, tid);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// O += P V for keys 16kk..16kk+15 of the V tile `vt`, for each of the warp's MT 16-row tiles:
// the probabilities of its score fragments p[t][2kk] and p[t][2kk + 1] (n8 blocks), rounded to
// float16, are P's A fragment; V's fragments are read once for all MT tiles.
template <int D, int MT>
__device__ __forceinline__ void pv_group(const float (&p)[MT][kChunk / 8][4], const __half* vt,
                                         int kk, int lane, float (&o)[MT][D / 8][4]) {
  const int vrow = (lane % 8) + ((lane / 8) % 2) * 8, vcol = (lane / 16) * 8;
  uint32_t pa[MT][4];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const float(&p0)[4] = p[t][2 * kk];
    const float(&p1)[4] = p[t][2 * kk + 1];
    pa[t][0] = pack_half2(p0[0], p0[1]), pa[t][1] = pack_half2(p0[2], p0[3]);
    pa[t][2] = pack_half2(p1[0], p1[1]), pa[t][3] = pack_half2(p1[2], p1[3]);
  }
#pragma unroll
  for (int db = 0; db < D / 16; ++db) {
    uint32_t bf[4];
    ldmatrix_x4_trans(bf, smem_u32(vt + swz<D>(kk * 16 + vrow, db * 16 + vcol)));
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      mma_f16(o[t][2 * db], pa[t], bf[0], bf[1]);
      mma_f16(o[t][2 * db + 1], pa[t], bf[2], bf[3]);
    }
  }
}

// One online-softmax step of a warp: its MT tiles of 16 query rows (rows q16 + 16t.. of the Q
// tile `sq`) against the 32 keys of the K and V tiles' rows at `kt` and `vt` (keys
// kbase..kbase+31), updating each row's running maximum m (in base 2), sum l (this lane's part)
// and output fragments o. K's and V's fragments are read from shared memory once for the MT
// tiles, whose independent chains of MMAs interleave.
// kRead: how the mask is read (MaskRead): the chunk's values at `sm` (stage_mask) or the rows
// at mb + mrow.
template <int D, int MT, typename MaskT, int kRead>
__device__ __forceinline__ void flash_step(const FlashArgs& a, const __half* sq, const __half* kt,
                                           const __half* vt, int kbase, int q16,
                                           const MaskT* mb, const int (&mrow)[MT][2],
                                           const float* sm, int lane,
                                           float (&o)[MT][D / 8][4], float (&m)[MT][2],
                                           float (&l)[MT][2]) {
  // This lane's ldmatrix row offsets: Q's A fragments, K's B fragments (V's: pv_group).
  const int qrow = q16 + (lane % 8) + ((lane / 8) % 2) * 8, qcol = (lane / 16) * 8;
  const int krow = (lane % 8) + (lane / 16) * 8, kcol = ((lane / 8) % 2) * 8;
  // S = Q K^T for this warp's rows and 32 keys: four n8 blocks per 16-row tile.
  float s[MT][kChunk / 8][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < kChunk / 8; ++i) s[t][i][0] = s[t][i][1] = s[t][i][2] = s[t][i][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t qf[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
      ldmatrix_x4(qf[t], smem_u32(sq + swz<D>(qrow + 16 * t, kk * 16 + qcol)));
#pragma unroll
    for (int nb = 0; nb < kChunk / 16; ++nb) {
      uint32_t bf[4];
      ldmatrix_x4(bf, smem_u32(kt + swz<D>(nb * 16 + krow, kk * 16 + kcol)));
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        mma_f16(s[t][2 * nb], qf[t], bf[0], bf[1]);
        mma_f16(s[t][2 * nb + 1], qf[t], bf[2], bf[3]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    // Scale and mask (in base 2), keys past the end out; the rows' chunk maxima.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = kbase + nb * 8 + (lane % 4) * 2 + (e % 2);
        float x = s[t][nb][e] * a.scale_log2;
        if constexpr (!std::is_void_v<MaskT>) {
          if constexpr (kRead == kMaskStaged) {
            x += sm[nb * 8 + (lane % 4) * 2 + (e % 2)];
          } else if constexpr (kRead == kMaskPairs) {
            // Keys key and key + 1 (e even) in one load; the odd e takes the second.
            if (e % 2 == 0 && key < a.sk) {
              const float2 p = load_pair(mb + mrow[t][e / 2] + key);
              x = fmaf(p.x, kLog2e, x);
              s[t][nb][e + 1] = fmaf(p.y, kLog2e, s[t][nb][e + 1] * a.scale_log2);
            } else if (e % 2 == 1) {
              x = s[t][nb][e];  // scaled and masked with its pair
              if (key - 1 >= a.sk) x = -INFINITY;
            }
          } else if (key < a.sk) {
            x = fmaf(to_f32(mb[mrow[t][e / 2] + key * a.m_k]), kLog2e, x);
          }
        }
        if (key >= a.sk) x = -INFINITY;
        s[t][nb][e] = x;
        mx[e / 2] = fmaxf(mx[e / 2], x);
      }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float mnew = fmaxf(m[t][r], mx[r]);
      base[r] = mnew == -INFINITY ? 0.f : mnew;  // a row masked so far stays at 0
      alpha[r] = exp2f(m[t][r] - base[r]);
      m[t][r] = mnew;
    }
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int nb = 0; nb < kChunk / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[t][nb][e] - base[e / 2]);
        s[t][nb][e] = p;
        rs[e / 2] += p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[t][r] = l[t][r] * alpha[r] + rs[r];
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      o[t][db][0] *= alpha[0], o[t][db][1] *= alpha[0];
      o[t][db][2] *= alpha[1], o[t][db][3] *= alpha[1];
    }
  }
  // O += P V, a 16-key group at a time.
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) pv_group<D, MT>(s, vt, kk, lane, o);
}

// The end of a kernel whose warps each hold MT tiles of 16 query rows (the block's kRows rows
// from q0): the rows normalized by their sums (a row with no key left is NaN, or 0 with
// nan_to_zero, as the reference), staged in the warp's part of Q's tile (only this warp read
// it), then stored as 16-byte vectors.
template <int D, int MT, int kThreads, int kRows>
__device__ __forceinline__ void store_rows(const FlashArgs& a, __half* sq,
                                           const float (&o)[MT][D / 8][4], float (&l)[MT][2],
                                           int q0, int b, int h, int tid) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[t][r] += __shfl_xor_sync(0xffffffffu, l[t][r], 1);
      l[t][r] += __shfl_xor_sync(0xffffffffu, l[t][r], 2);
      inv[r] = l[t][r] > 0.f ? 1.f / l[t][r] : (a.nan_to_zero ? 0.f : NAN);
    }
    const int wr = (warp * MT + t) * 16 + lane / 4;
#pragma unroll
    for (int db = 0; db < D / 8; ++db) {
      const int col = db * 8 + (lane % 4) * 2;
      *reinterpret_cast<uint32_t*>(sq + swz<D>(wr, col)) =
          pack_half2(o[t][db][0] * inv[0], o[t][db][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(sq + swz<D>(wr + 8, col)) =
          pack_half2(o[t][db][2] * inv[1], o[t][db][3] * inv[1]);
    }
  }
  __syncthreads();
  __half* y = a.y + b * a.y_b + h * a.d;
  for (int i = tid; i < kRows * D / 8; i += kThreads) {
    const int row = i / (D / 8), c = i % (D / 8);
    if (q0 + row < a.sq && c * 8 < a.d)
      *reinterpret_cast<uint4*>(y + static_cast<int64_t>(q0 + row) * a.y_s + c * 8) =
          *reinterpret_cast<const uint4*>(sq + swz<D>(row, c * 8));
  }
}

// Occupancy: the registers a thread may use (65536 per SM over kThreads x blocks).
template <int D, int WARPS, int MT>
constexpr int min_blocks() {
  if (MT == 2) return 3;  // 32 rows a warp (head size 64 only): 170 registers
  if (WARPS == 8) return D <= 64 ? 2 : 1;
  if (D == 48) return WARPS == 4 ? 4 : 16;  // padded rows: a few more registers than 32 or 64
  return D <= 64 ? (WARPS == 4 ? 5 : 16) : D <= 96 ? (WARPS == 4 ? 3 : 12) : (WARPS == 4 ? 2 : 8);
}

// WARPS warps per block, 16 MT query rows each; MaskT: void (no mask), __half or float.
// kRead: how the mask is read (MaskRead). kRot: the rotary on Q and K (FlashArgs::rot), a
// kernel of its own so that the kernels without it keep their registers.
template <int D, int WARPS, int MT, typename MaskT, int kRead, bool kRot = false>
__global__ void __launch_bounds__(32 * WARPS, (min_blocks<D, WARPS, MT>()))
    mha_flash_kernel(FlashArgs a) {
  constexpr int kThreads = 32 * WARPS, kRows = 16 * MT * WARPS;
  pdl_wait();  // kernels/pdl.cuh
  pdl_launch_dependents();
  extern __shared__ __align__(16) unsigned char smem[];
  __half* sq = reinterpret_cast<__half*>(smem);
  constexpr int RS = row_stride(D);
  __half* sk = sq + kRows * RS;      // two K tiles
  __half* sv = sk + 2 * kKeys * RS;  // two V tiles
  float* smask = reinterpret_cast<float*>(sv + 2 * kKeys * RS);  // two tiles' mask values
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  // The same mask for every query row: staged with K and V.
  constexpr bool staged = !std::is_void_v<MaskT> && kRead == kMaskStaged;
  if (staged) stage_mask<MaskT, kThreads>(a, b, h, smask, 0, kKeys, tid);
  const __half* q = a.q + b * a.q_b + h * a.d + static_cast<int64_t>(q0) * a.q_s;
  const __half* k = a.k + b * a.k_b + (h / a.group) * a.k_h;
  const __half* v = a.v + b * a.v_b + (h / a.group) * a.v_h;
  const int tiles = (a.sk + kKeys - 1) / kKeys;
  load_tile<D, kThreads>(sq, q, a.q_s, kRows, min(kRows, a.sq - q0), a.d, tid);
  load_tile<D, kThreads>(sk, k, a.k_s, kKeys, min(kKeys, a.sk), a.d, tid);
  load_tile<D, kThreads>(sv, v, a.v_s, kKeys, min(kKeys, a.sk), a.d, tid);
  cp_async_commit();

  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
  int mrow[MT][2] = {};
  const MaskT* mb = nullptr;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[t][i][0] = o[t][i][1] = o[t][i][2] = o[t][i][3] = 0.f;
    m[t][0] = m[t][1] = -INFINITY;
    l[t][0] = l[t][1] = 0.f;
    mb = mask_rows<MaskT>(a, b, h, q0 + (warp * MT + t) * 16 + lane / 4, mrow[t]);
  }
  for (int t = 0; t < tiles; ++t) {
    if (staged && t + 1 < tiles)
      stage_mask<MaskT, kThreads>(a, b, h, smask + ((t + 1) & 1) * kKeys, (t + 1) * kKeys, kKeys,
                                  tid);
    kv_stage<D, kThreads>(a, sk, sv, k, v, t, tiles, kKeys, tid);
    if constexpr (kRot) {  // the rotary on Q's tile (once) and this K tile; every warp waits
      if (t == 0) rotate_tile<D, kThreads>(a, sq, min(kRows, a.sq - q0), q0, b, tid);
      rotate_tile<D, kThreads>(a, sk + (t & 1) * kKeys * RS, min(kKeys, a.sk - t * kKeys), t * kKeys,
                               b, tid);
      __syncthreads();
    }
    const __half* kt = sk + (t & 1) * kKeys * RS;
    const __half* vt = sv + (t & 1) * kKeys * RS;
#pragma unroll 1
    for (int c = 0; c < kKeys / kChunk; ++c)
      flash_step<D, MT, MaskT, kRead>(a, sq, kt + c * kChunk * RS, vt + c * kChunk * RS,
                                      t * kKeys + c * kChunk, warp * MT * 16, mb, mrow,
                                      staged ? smask + (t & 1) * kKeys + c * kChunk : nullptr,
                                      lane, o, m, l);
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }
  store_rows<D, MT, kThreads, kRows>(a, sq, o, l, q0, b, h, tid);
}

// Keys split over a block's warps, for grids too small to fill the GPU by query rows (batch 1,
// short sequences): a block takes 16 query rows, its WARPS warps each one 32-key chunk of every
// tile of 32 WARPS keys, and the warps' partial results (maximum, sum, output) are combined
// through shared memory at the end. The dependent chain of a warp is WARPS times shorter.
template <int D, int WARPS, typename MaskT, bool kRot = false>
__global__ void __launch_bounds__(32 * WARPS) mha_flash_split_kernel(FlashArgs a) {
  constexpr int kThreads = 32 * WARPS, kTile = kChunk * WARPS;
  pdl_wait();  // kernels/pdl.cuh
  pdl_launch_dependents();
  extern __shared__ __align__(16) unsigned char smem[];
  __half* sq = reinterpret_cast<__half*>(smem);
  constexpr int RS = row_stride(D);
  __half* sk = sq + 16 * RS;         // two K tiles
  __half* sv = sk + 2 * kTile * RS;  // two V tiles
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * 16, h = blockIdx.y, b = blockIdx.z;
  const __half* q = a.q + b * a.q_b + h * a.d + static_cast<int64_t>(q0) * a.q_s;
  const __half* k = a.k + b * a.k_b + (h / a.group) * a.k_h;
  const __half* v = a.v + b * a.v_b + (h / a.group) * a.v_h;
  const int tiles = (a.sk + kTile - 1) / kTile;
  load_tile<D, kThreads>(sq, q, a.q_s, 16, min(16, a.sq - q0), a.d, tid);
  load_tile<D, kThreads>(sk, k, a.k_s, kTile, min(kTile, a.sk), a.d, tid);
  load_tile<D, kThreads>(sv, v, a.v_s, kTile, min(kTile, a.sk), a.d, tid);
  cp_async_commit();

  float o[1][D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.f;
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  int mrow[1][2] = {};
  const MaskT* mb = mask_rows<MaskT>(a, b, h, q0 + lane / 4, mrow[0]);
  for (int t = 0; t < tiles; ++t) {
    kv_stage<D, kThreads>(a, sk, sv, k, v, t, tiles, kTile, tid);
    if constexpr (kRot) {  // the rotary on Q's tile (once) and this K tile; every warp waits
      if (t == 0) rotate_tile<D, kThreads>(a, sq, min(16, a.sq - q0), q0, b, tid);
      rotate_tile<D, kThreads>(a, sk + (t & 1) * kTile * RS, min(kTile, a.sk - t * kTile), t * kTile,
                               b, tid);
      __syncthreads();
    }
    const int kbase = t * kTile + warp * kChunk;
    if (kbase < a.sk)
      flash_step<D, 1, MaskT, kMaskElems>(a, sq, sk + ((t & 1) * kTile + warp * kChunk) * RS,
                                          sv + ((t & 1) * kTile + warp * kChunk) * RS, kbase, 0,
                                          mb, mrow, nullptr, lane, o, m, l);
    __syncthreads();
  }
  // Each warp's rows: maximum (base 2; -inf where it saw no key, its o and l then 0), sum and
  // output relative to it, into the K and V tiles' space (every warp is past them).
  float* po = reinterpret_cast<float*>(sk);  // [WARPS][16][D]
  float* pm = po + WARPS * 16 * D;           // [WARPS][16]
  float* pl = pm + WARPS * 16;               // [WARPS][16]
  const int r0 = lane / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[0][r] += __shfl_xor_sync(0xffffffffu, l[0][r], 1);
    l[0][r] += __shfl_xor_sync(0xffffffffu, l[0][r], 2);
    if (lane % 4 == 0)
      pm[warp * 16 + r0 + 8 * r] = m[0][r], pl[warp * 16 + r0 + 8 * r] = l[0][r];
  }
#pragma unroll
  for (int db = 0; db < D / 8; ++db) {
    const int col = db * 8 + (lane % 4) * 2;
    float* p0 = po + (warp * 16 + r0) * D + col;
    p0[0] = o[0][db][0], p0[1] = o[0][db][1];
    p0[8 * D] = o[0][db][2], p0[8 * D + 1] = o[0][db][3];
  }
  __syncthreads();
  __half* y = a.y + b * a.y_b + h * a.d;
  for (int i = tid; i < 16 * D / 8; i += kThreads) {
    const int row = i / (D / 8), c8 = (i % (D / 8)) * 8;
    if (q0 + row >= a.sq || c8 >= a.d) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, pm[w * 16 + row]);
    const float base = mx == -INFINITY ? 0.f : mx;
    float sum = 0.f, acc[8] = {};
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = exp2f(pm[w * 16 + row] - base);
      sum += pl[w * 16 + row] * f;
      const float* pw = po + (w * 16 + row) * D + c8;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += pw[j] * f;
    }
    const float inv = sum > 0.f ? 1.f / sum : (a.nan_to_zero ? 0.f : NAN);
    uint4 out;
    uint32_t* ow = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) ow[j] = pack_half2(acc[2 * j] * inv, acc[2 * j + 1] * inv);
    *reinterpret_cast<uint4*>(y + static_cast<int64_t>(q0 + row) * a.y_s + c8) = out;
  }
}

// The split kernel's warps; its shared memory: Q's 16 rows, two K and two V tiles (the partial
// results reuse them).
constexpr int kSplitWarps = 4;
constexpr size_t flash_split_smem(int d) {
  return static_cast<size_t>(16 + 4 * kChunk * kSplitWarps) * row_stride(d) * sizeof(__half);
}
static_assert(kSplitWarps * 16 * (64 + 2) * sizeof(float) <=
              4 * kChunk * kSplitWarps * 64 * sizeof(__half), "partials fit the K and V tiles");

// Q's tile of `rows` rows, two K and two V tiles, two tiles' mask values.
constexpr size_t flash_smem(int d, int rows) {
  return static_cast<size_t>(rows + 4 * kKeys) * row_stride(d) * sizeof(__half) +
         2 * kKeys * sizeof(float);
}

using FlashKernel = void (*)(FlashArgs);

// kRot: the kernels with the rotary read a staged mask element by element (no instances of
// their own for a key-padding mask alone: Llama's masks are causal).
template <int D, int WARPS, int MT, typename MaskT, bool kRot>
FlashKernel flash_kernel_read(int read) {
  if constexpr (!kRot)
    if (read == kMaskStaged) return mha_flash_kernel<D, WARPS, MT, MaskT, kMaskStaged>;
  // Pairs in the 32-row warps only: with 16-row warps they measured slower than single keys
  // (GPT-2's causal mask at batch 32 on the H100: 25.9 against 23.5 us).
  if constexpr (MT == 2)
    if (read == kMaskPairs) return mha_flash_kernel<D, WARPS, MT, MaskT, kMaskPairs, kRot>;
  return mha_flash_kernel<D, WARPS, MT, MaskT, kMaskElems, kRot>;
}

template <int D, int WARPS, int MT = 1, bool kRot = false>
FlashKernel flash_kernel(DataType mask, int read) {
  if (mask == DataType::kFloat16) return flash_kernel_read<D, WARPS, MT, __half, kRot>(read);
  if (mask == DataType::kFloat32) return flash_kernel_read<D, WARPS, MT, float, kRot>(read);
  return mha_flash_kernel<D, WARPS, MT, void, kMaskElems, kRot>;
}

template <int D, bool kRot>
FlashKernel flash_split_kernel(DataType mask) {
  if (mask == DataType::kFloat16) return mha_flash_split_kernel<D, kSplitWarps, __half, kRot>;
  if (mask == DataType::kFloat32) return mha_flash_split_kernel<D, kSplitWarps, float, kRot>;
  return mha_flash_split_kernel<D, kSplitWarps, void, kRot>;
}


// The tile width a head of d columns (a multiple of 8, at most 256) runs at: the compiled D just
// above it (the swizzled 32, 64 and 128, or a padded 48, 80, 96, 160, 192 or 256).
constexpr int padded_head(int d) {
  return d <= 32 ? 32 : d <= 48 ? 48 : d <= 64 ? 64 : d <= 80 ? 80 : d <= 96 ? 96 : d <= 128 ? 128
         : d <= 160 ? 160 : d <= 192 ? 192 : 256;
}
// The split kernel's tiles (flash_split_smem) fit shared memory up to D = 192.
constexpr int kMaxSplitHead = 192;

// attention_flash_wide.cu: the kernels of the padded D (not 32, 64, 128): 4 warps or 1 a block
// (no 8-warp instances), without the rotary; nullptr for another D.
FlashKernel pick_flash_wide(int dp, int warps, DataType mask, int read);
FlashKernel flash_split_wide(int dp, DataType mask);  // D <= kMaxSplitHead

}  // namespace kiln::gpu::flash
