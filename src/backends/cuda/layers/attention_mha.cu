// kiln.MultiHeadAttention (ops/fused.h): Q [B, Sq, H*D], K [B, Sk, H*D], V [B, Sk, H*Dv] (or
// packed: Q, K and V side by side in one [B, S, 3*H*D] tensor), an additive mask broadcast to
// [B, H, Sq, Sk], Y [B, Sq, H*Dv]. Two tactics:
//   mha.flash    FP16, head size 32, 64 or 128: FlashAttention-2's forward pass on mma.sync
//                m16n8k16 with float accumulation. A block takes 64 query rows of one (batch,
//                head), 16 per warp (16 rows in one warp where 64-row blocks would leave SMs
//                idle: batch 1; 32 per warp in the w32 variant), and walks the keys in tiles of
//                64 through a double-buffered cp.async ring (K and V tiles with 16-byte chunks
//                XOR-swizzled by row, so that ldmatrix reads them without bank conflicts), 32
//                keys per softmax step. Scores stay in registers (16 per thread and 16-row tile,
//                Q's fragments reread from shared memory, so that five 4-warp blocks fit an SM):
//                a row's running maximum and sum rescale the output as keys arrive (the online
//                softmax), the probabilities are rounded to float16 for P.V, which reuses the
//                score fragments as its A operand. Q, K, V and Y are read and written in the
//                projections' own layout through row strides: the head split and merge cost
//                nothing. The mask is read as MaskRead says (below). With the rotary (inputs
//                4 to 6), Q's tile and each K tile are rotated in shared memory once their
//                copies land (rotate_tile: the same float16 roundings as rotary_half8_kernel),
//                before any warp reads them; K is rotated again by every query block.
//   mha.unfused  any float type and head size, no rotary: the heads are copied out into
//                [B, H, S, D] tensors (K as [B, H, D, S]), kiln.Attention's batched-GEMM
//                layer runs on them (layers/gemm_attention.cu), and the result is copied back.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "kernels/pdl.cuh"
#include "layers/attention_mha.h"
#include "layers/gemm_common.h"
#include "layers/movement_copy.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

Expected<std::unique_ptr<Layer>> create_attention(const LayerDesc& d);  // gemm_attention.cu

Expected<MhaShape> mha_shape(const Node& n, std::span<const DeviceTensor> in,
                             const DeviceTensor& y) {
  MhaShape s;
  s.packed = n.attrs.get_int("packed", 0) != 0;
  s.seq_first = n.attrs.get_int("seq_first", 0) != 0;
  const int bx = s.seq_first ? 1 : 0, sx = 1 - bx;  // the batch's and the sequence's axes
  s.H = n.attrs.get_int("num_heads", 0);
  s.Hkv = n.attrs.get_int("kv_heads", s.H);
  const DeviceTensor& q = in[0];
  if (q.rank() != 3 || s.H <= 0 || s.Hkv <= 0 || s.H % s.Hkv != 0)
    return KILN_ERROR("{}: Q must be 3-D, num_heads positive and a multiple of kv_heads",
                      n.label());
  s.B = q.shape[bx];
  s.Sq = q.shape[sx];
  if (s.packed) {  // Q | K | V: H + 2 Hkv heads of one size
    if (q.shape[2] % (s.H + 2 * s.Hkv) != 0)
      return KILN_ERROR("{}: packed Q's last dim {} is not {} + 2 x {} heads", n.label(),
                        q.shape[2], s.H, s.Hkv);
    s.D = s.Dv = q.shape[2] / (s.H + 2 * s.Hkv);
    s.Sk = s.Sq;
    s.q_row = s.k_row = s.v_row = q.shape[2];
    s.k_off = s.H * s.D;
    s.v_off = (s.H + s.Hkv) * s.D;
  } else {
    const DeviceTensor &k = in[1], &v = in[2];
    if (k.rank() != 3 || v.rank() != 3 || k.shape[bx] != s.B || v.shape[bx] != s.B ||
        k.shape[sx] != v.shape[sx] || q.shape[2] % s.H || k.shape[2] * s.H != q.shape[2] * s.Hkv ||
        v.shape[2] % s.Hkv)
      return KILN_ERROR("{}: Q {}, K {} and V {} do not fit {} heads ({} for K and V)", n.label(),
                        shape_str(q.shape), shape_str(k.shape), shape_str(v.shape), s.H, s.Hkv);
    s.Sk = k.shape[sx];
    s.D = q.shape[2] / s.H;
    s.Dv = v.shape[2] / s.Hkv;
    s.q_row = q.shape[2];
    s.k_row = k.shape[2];
    s.v_row = v.shape[2];
  }
  std::vector<int64_t> want = {s.B, s.Sq, s.H * s.Dv};
  if (s.seq_first) std::swap(want[0], want[1]);
  if (y.shape != want)
    return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                      shape_str(want));
  return s;
}

Expected<std::array<int64_t, 4>> mask_strides(const Node& n, const DeviceTensor& m,
                                              const MhaShape& s) {
  const std::vector<int64_t> full = {s.B, s.H, s.Sq, s.Sk};
  if (m.rank() > 4) return KILN_ERROR("{}: the mask has rank {} (at most 4)", n.label(), m.rank());
  std::array<int64_t, 4> st{};
  const auto rs = row_major_strides(m.shape);
  const int64_t off = 4 - m.rank();
  for (int64_t i = 0; i < m.rank(); ++i) {
    const int64_t d = m.shape[i], want = full[off + i];
    if (d != 1 && d != want)
      return KILN_ERROR("{}: mask {} does not broadcast to the scores [{}, {}, {}, {}]", n.label(),
                        shape_str(m.shape), s.B, s.H, s.Sq, s.Sk);
    st[off + i] = d == 1 ? 0 : rs[i];
  }
  return st;
}

bool mha_f16_head_sizes(const LayerDesc& d, int64_t* dq, int64_t* dv, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kFP16 || d.in.empty() || d.in[0].dtype != DataType::kFloat16)
    return *why = "float16 only", false;
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  for (size_t i = 1; i < 3 && !packed; ++i)
    if (d.in.size() <= i || d.in[i].dtype != DataType::kFloat16)
      return *why = "float16 only", false;
  const TensorType& q = d.in_type(0);
  const int64_t h = n.attrs.get_int("num_heads", 0), hkv = n.attrs.get_int("kv_heads", h);
  if (q.rank() != 3 || !q.dims->back().is_static() || h <= 0 || hkv <= 0 || h % hkv)
    return *why = "Q's head size is unknown", false;
  *dq = *dv = q.dims->back().value / (packed ? h + 2 * hkv : h);
  if (!packed) {
    const TensorType& v = d.in_type(2);
    if (v.rank() != 3 || !v.dims->back().is_static())
      return *why = "V's head size is unknown", false;
    *dv = v.dims->back().value / hkv;
  }
  if (d.in.size() > 3 && d.in[3].present() && d.in[3].dtype != DataType::kFloat16 &&
      d.in[3].dtype != DataType::kFloat32)
    return *why = "a float16 or float32 mask only", false;
  return true;
}

namespace {

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
  int sq, sk;
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

// Element (row, col) of a [rows][D] half tile: 16-byte chunks XOR-swizzled by row % 8. Rows of
// four chunks (head size 32) by (row / 2) % 4: the eight rows an ldmatrix reads, two to 128
// bytes, then fall on distinct banks.
template <int D>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(D == 32 || D == 64 || D == 128, "head sizes 32, 64 and 128");
  if constexpr (D >= 64)
    return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
  else
    return row * D + ((((col >> 3) ^ ((row >> 1) & 3))) << 3) + (col & 7);
}

// Rows [0, valid) of a `rows`-row tile from global rows of `stride` elements; the rest zero.
template <int D, int kThreads>
__device__ __forceinline__ void load_tile(__half* s, const __half* g, int64_t stride, int rows,
                                          int valid, int tid) {
  for (int i = tid; i < rows * D / 8; i += kThreads) {
    const int row = i / (D / 8), c = i % (D / 8);
    const bool ok = row < valid;
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
    load_tile<D, kThreads>(sk + nb * keys * D, k + static_cast<int64_t>(k1) * a.k_s, a.k_s, keys,
                           min(keys, a.sk - k1), tid);
    load_tile<D, kThreads>(sv + nb * keys * D, v + static_cast<int64_t>(k1) * a.v_s, a.v_s, keys,
                           min(keys, a.sk - k1), tid);
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
  __half* y = a.y + b * a.y_b + h * D;
  for (int i = tid; i < kRows * D / 8; i += kThreads) {
    const int row = i / (D / 8), c = i % (D / 8);
    if (q0 + row < a.sq)
      *reinterpret_cast<uint4*>(y + static_cast<int64_t>(q0 + row) * a.y_s + c * 8) =
          *reinterpret_cast<const uint4*>(sq + swz<D>(row, c * 8));
  }
}

// Occupancy: the registers a thread may use (65536 per SM over kThreads x blocks).
template <int D, int WARPS, int MT>
constexpr int min_blocks() {
  if (MT == 2) return 3;  // 32 rows a warp (head size 64 only): 170 registers
  if (WARPS == 8) return D <= 64 ? 2 : 1;
  return D <= 64 ? (WARPS == 4 ? 5 : 16) : (WARPS == 4 ? 2 : 8);
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
  __half* sk = sq + kRows * D;      // two K tiles
  __half* sv = sk + 2 * kKeys * D;  // two V tiles
  float* smask = reinterpret_cast<float*>(sv + 2 * kKeys * D);  // two tiles' mask values
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * kRows, h = blockIdx.y, b = blockIdx.z;
  // The same mask for every query row: staged with K and V.
  constexpr bool staged = !std::is_void_v<MaskT> && kRead == kMaskStaged;
  if (staged) stage_mask<MaskT, kThreads>(a, b, h, smask, 0, kKeys, tid);
  const __half* q = a.q + b * a.q_b + h * D + static_cast<int64_t>(q0) * a.q_s;
  const __half* k = a.k + b * a.k_b + (h / a.group) * D;
  const __half* v = a.v + b * a.v_b + (h / a.group) * D;
  const int tiles = (a.sk + kKeys - 1) / kKeys;
  load_tile<D, kThreads>(sq, q, a.q_s, kRows, min(kRows, a.sq - q0), tid);
  load_tile<D, kThreads>(sk, k, a.k_s, kKeys, min(kKeys, a.sk), tid);
  load_tile<D, kThreads>(sv, v, a.v_s, kKeys, min(kKeys, a.sk), tid);
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
      rotate_tile<D, kThreads>(a, sk + (t & 1) * kKeys * D, min(kKeys, a.sk - t * kKeys), t * kKeys,
                               b, tid);
      __syncthreads();
    }
    const __half* kt = sk + (t & 1) * kKeys * D;
    const __half* vt = sv + (t & 1) * kKeys * D;
#pragma unroll 1
    for (int c = 0; c < kKeys / kChunk; ++c)
      flash_step<D, MT, MaskT, kRead>(a, sq, kt + c * kChunk * D, vt + c * kChunk * D,
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
  __half* sk = sq + 16 * D;         // two K tiles
  __half* sv = sk + 2 * kTile * D;  // two V tiles
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int q0 = blockIdx.x * 16, h = blockIdx.y, b = blockIdx.z;
  const __half* q = a.q + b * a.q_b + h * D + static_cast<int64_t>(q0) * a.q_s;
  const __half* k = a.k + b * a.k_b + (h / a.group) * D;
  const __half* v = a.v + b * a.v_b + (h / a.group) * D;
  const int tiles = (a.sk + kTile - 1) / kTile;
  load_tile<D, kThreads>(sq, q, a.q_s, 16, min(16, a.sq - q0), tid);
  load_tile<D, kThreads>(sk, k, a.k_s, kTile, min(kTile, a.sk), tid);
  load_tile<D, kThreads>(sv, v, a.v_s, kTile, min(kTile, a.sk), tid);
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
      rotate_tile<D, kThreads>(a, sk + (t & 1) * kTile * D, min(kTile, a.sk - t * kTile), t * kTile,
                               b, tid);
      __syncthreads();
    }
    const int kbase = t * kTile + warp * kChunk;
    if (kbase < a.sk)
      flash_step<D, 1, MaskT, kMaskElems>(a, sq, sk + ((t & 1) * kTile + warp * kChunk) * D,
                                          sv + ((t & 1) * kTile + warp * kChunk) * D, kbase, 0,
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
  __half* y = a.y + b * a.y_b + h * D;
  for (int i = tid; i < 16 * D / 8; i += kThreads) {
    const int row = i / (D / 8), c8 = (i % (D / 8)) * 8;
    if (q0 + row >= a.sq) continue;
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
  return static_cast<size_t>(16 + 4 * kChunk * kSplitWarps) * d * sizeof(__half);
}
static_assert(kSplitWarps * 16 * (64 + 2) * sizeof(float) <=
              4 * kChunk * kSplitWarps * 64 * sizeof(__half), "partials fit the K and V tiles");

// Q's tile of `rows` rows, two K and two V tiles, two tiles' mask values.
constexpr size_t flash_smem(int d, int rows) {
  return static_cast<size_t>(rows + 4 * kKeys) * d * sizeof(__half) + 2 * kKeys * sizeof(float);
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

template <bool kRot>
FlashKernel pick_flash(int d, int warps, DataType mask, int read) {
  if (d == 32)
    return warps == 8   ? flash_kernel<32, 8, 1, kRot>(mask, read)
           : warps == 4 ? flash_kernel<32, 4, 1, kRot>(mask, read)
                        : flash_kernel<32, 1, 1, kRot>(mask, read);
  if (d == 64)
    return warps == 8   ? flash_kernel<64, 8, 1, kRot>(mask, read)
           : warps == 4 ? flash_kernel<64, 4, 1, kRot>(mask, read)
                        : flash_kernel<64, 1, 1, kRot>(mask, read);
  return warps == 8   ? flash_kernel<128, 8, 1, kRot>(mask, read)
         : warps == 4 ? flash_kernel<128, 4, 1, kRot>(mask, read)
                      : flash_kernel<128, 1, 1, kRot>(mask, read);
}

// Variants: "" sizes blocks by the grid (below); "rows128": 128 query rows a block (8 warps), so
// a head's K and V are read once per 128 rows instead of per 64, where that still fills the SMs;
// "split": 16 query rows a block, the keys split over its 4 warps (mha_flash_split_kernel), for
// grids that do not fill the SMs; "w32" (head size 64): 128 query rows a block as four warps of
// 32 rows, two 16-row tiles that share each K and V fragment read from shared memory. Where
// every warp takes 16 rows, BERT's batch 32 (384 heads of 128 rows) needs 3072 warps, more than
// the 20 a multiprocessor's registers hold (2640): 1.16 waves; at 32 rows a warp, three blocks
// an SM hold them all.
std::vector<std::string> flash_variants(const LayerDesc& d) {
  int64_t dq = 0, dv = 0;
  std::string why;
  if (mha_f16_head_sizes(d, &dq, &dv, &why) && dq == 64) return {"", "rows128", "split", "w32"};
  if (dq == 32) return {"", "rows128"};  // (the split kernel: 64 and 128)
  return {"", "rows128", "split"};
}

bool flash_supports(const LayerDesc& d, std::string* why) {
  int64_t dq = 0, dv = 0;
  if (!mha_f16_head_sizes(d, &dq, &dv, why)) return false;
  if ((dq != 32 && dq != 64 && dq != 128) || dv != dq)
    return *why = "head sizes 32, 64 and 128 only", false;
  if (mha_has_rotary(*d.node)) {  // the rotary's caches float16, its position ids int64
    if (d.node->attrs.get_int("seq_first", 0) != 0)
      return *why = "the rotary is not applied with seq_first", false;
    if (d.in.size() < 6 || d.in[4].dtype != DataType::kFloat16 ||
        d.in[5].dtype != DataType::kFloat16)
      return *why = "the rotary's caches in float16 only", false;
    if (d.in.size() > 6 && d.in[6].present() && d.in[6].dtype != DataType::kInt64)
      return *why = "int64 position ids only", false;
    for (size_t i = 4; i < d.in.size(); ++i)
      if (d.in[i].present() && d.in[i].layout != Layout::kLinear)
        return *why = "the rotary's inputs in linear layout only", false;
  }
  return true;
}

class MhaFlashLayer final : public Layer {
 public:
  explicit MhaFlashLayer(const LayerDesc& d)
      : node_(d.node),
        rows128_(d.variant == "rows128"),
        split_(d.variant == "split"),
        w32_(d.variant == "w32") {
    scale_ = d.node->attrs.get_float("scale", 1.f);
    nan_to_zero_ = d.node->attrs.get_int("nan_to_zero", 0) != 0;
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    KILN_ASSIGN_OR_RETURN(s_, mha_shape(n, in, out[0]));
    if ((s_.D != 32 && s_.D != 64 && s_.D != 128) || s_.Dv != s_.D)
      return KILN_ERROR("{}: mha.flash takes head sizes 32, 64 and 128, got {}", n.label(), s_.D);
    for (int64_t st : {s_.q_row, s_.k_row, s_.v_row})
      if (st % 8 != 0)
        return KILN_ERROR("{}: rows of {} elements are not 16-byte aligned", n.label(), st);
    if (s_.B > 65535 || s_.H > 65535 || s_.Sq > INT32_MAX || s_.Sk > INT32_MAX)
      return KILN_ERROR("{}: batch {} or heads {} beyond the grid", n.label(), s_.B, s_.H);
    mask_ = in.size() > 3 && in[3].present() ? in[3].dtype : DataType::kUndefined;
    if (mask_ != DataType::kUndefined) {
      KILN_ASSIGN_OR_RETURN(mstride_, mask_strides(n, in[3], s_));
      if ((s_.Sq - 1) * mstride_[2] + (s_.Sk - 1) * mstride_[3] > INT32_MAX)
        return KILN_ERROR("{}: the mask's rows span more than 2^31 elements", n.label());
    }
    // 64 query rows a block (4 warps) where that gives the GPU two blocks per SM at least; else
    // 16 (one warp): short sequences at batch 1 spread over more SMs.
    int device = 0, sms = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    warps_ = s_.B * s_.H * ((s_.Sq + 63) / 64) >= 2 * sms ? 4 : 1;
    if (rows128_ && s_.Sq > 64 && s_.B * s_.H * ((s_.Sq + 127) / 128) >= sms) warps_ = 8;
    rows_ = 16 * warps_;
    smem_ = flash_smem(static_cast<int>(s_.D), rows_);
    // A mask the same for every query row (a key-padding mask) is staged in shared memory; one
    // with contiguous keys, rows of even length and even offsets is read two keys a load (w32).
    int read = kMaskElems;
    if (mask_ != DataType::kUndefined) {
      const bool even = mstride_[0] % 2 == 0 && mstride_[1] % 2 == 0 && mstride_[2] % 2 == 0;
      if (mstride_[2] == 0) read = kMaskStaged;
      else if (mstride_[3] == 1 && s_.Sk % 2 == 0 && even) read = kMaskPairs;
    }
    KILN_RETURN_IF_ERROR(configure_rotary(in));
    const int d = static_cast<int>(s_.D);
    kernel_ =
        rot_ ? pick_flash<true>(d, warps_, mask_, read) : pick_flash<false>(d, warps_, mask_, read);
    if (w32_) {
      if (s_.D != 64)
        return KILN_ERROR("{}: mha.flash/w32 takes head size 64, got {}", n.label(), s_.D);
      warps_ = 4;
      rows_ = 128;
      smem_ = flash_smem(64, rows_);
      kernel_ =
          rot_ ? flash_kernel<64, 4, 2, true>(mask_, read) : flash_kernel<64, 4, 2>(mask_, read);
    }
    if (split_) {
      if (s_.D == 32)
        return KILN_ERROR("{}: mha.flash/split takes head sizes 64 and 128, got 32", n.label());
      warps_ = kSplitWarps;
      rows_ = 16;
      smem_ = flash_split_smem(static_cast<int>(s_.D));
      if (rot_)
        kernel_ =
            s_.D == 64 ? flash_split_kernel<64, true>(mask_) : flash_split_kernel<128, true>(mask_);
      else
        kernel_ = s_.D == 64 ? flash_split_kernel<64, false>(mask_)
                             : flash_split_kernel<128, false>(mask_);
    }
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel_, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_)));
    return size_t{0};
  }

  // The rotary's geometry (rot_, rot_b_, rot_max_) from its caches' and position ids' shapes,
  // which RotaryEmbedding's rules bound (ops/rotary.cpp); Sq = Sk.
  Status configure_rotary(std::span<const DeviceTensor> in) {
    const Node& n = *node_;
    rot_ = 0;
    if (!mha_has_rotary(n)) return Status::Ok();
    if (in.size() < 6 || !in[4].present() || !in[5].present())
      return KILN_ERROR("{}: the rotary needs cos_cache and sin_cache", n.label());
    if (s_.seq_first || s_.Sq != s_.Sk)
      return KILN_ERROR("{}: the rotary needs batch-first Q and K of one length", n.label());
    const DeviceTensor &c = in[4], &sn = in[5];
    const int64_t half = s_.D / 2, S = s_.Sq;
    if (c.shape != sn.shape || c.rank() < 2 || c.shape.back() != half)
      return KILN_ERROR("{}: the rotary's caches {} and {} must end in D/2 = {}", n.label(),
                        shape_str(c.shape), shape_str(sn.shape), half);
    if (in.size() > 6 && in[6].present()) {
      const DeviceTensor& p = in[6];
      if (p.rank() != 2 || (p.shape[0] != s_.B && p.shape[0] != 1) || p.shape[1] != S ||
          c.rank() != 2)
        return KILN_ERROR("{}: position_ids {} needs caches [max_pos, {}] and shape [{},{}]",
                          n.label(), shape_str(p.shape), half, s_.B, S);
      rot_b_ = p.shape[0] == 1 ? 0 : S;
      rot_max_ = c.shape[0];
    } else {
      const bool ok = (c.rank() == 2 && c.shape[0] == S) ||
                      (c.rank() == 3 && (c.shape[0] == s_.B || c.shape[0] == 1) && c.shape[1] == S);
      if (!ok)
        return KILN_ERROR(
            "{}: without position_ids the rotary's caches must be [{},{},{}] or [{},{}], got {}",
            n.label(), s_.B, S, half, S, half, shape_str(c.shape));
      rot_b_ = c.rank() == 2 || c.shape[0] == 1 ? 0 : S;
      rot_max_ = c.shape[c.rank() - 2] * (rot_b_ ? s_.B : 1);
    }
    rot_ = n.attrs.get_int("rotary_interleaved", 0) != 0 ? 2 : 1;
    return Status::Ok();
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (s_.B == 0 || s_.Sq == 0) return Status::Ok();
    FlashArgs a{};
    const auto* base = static_cast<const __half*>(in[0].data);
    a.q = base + s_.q_off;
    a.k = (s_.packed ? base : static_cast<const __half*>(in[1].data)) + s_.k_off;
    a.v = (s_.packed ? base : static_cast<const __half*>(in[2].data)) + s_.v_off;
    a.y = static_cast<__half*>(out[0].data);
    a.q_s = s_.seq_stride(s_.q_row), a.k_s = s_.seq_stride(s_.k_row);
    a.v_s = s_.seq_stride(s_.v_row), a.y_s = s_.seq_stride(s_.H * s_.Dv);
    a.q_b = s_.batch_stride(s_.Sq, s_.q_row), a.k_b = s_.batch_stride(s_.Sk, s_.k_row);
    a.v_b = s_.batch_stride(s_.Sk, s_.v_row), a.y_b = s_.batch_stride(s_.Sq, s_.H * s_.Dv);
    a.sq = static_cast<int>(s_.Sq);
    a.sk = static_cast<int>(s_.Sk);
    a.scale_log2 = scale_ * kLog2e;
    a.nan_to_zero = nan_to_zero_;
    a.group = static_cast<int>(s_.H / s_.Hkv);
    if (mask_ != DataType::kUndefined) {
      a.mask = in[3].data;
      a.m_b = mstride_[0], a.m_h = mstride_[1], a.m_q = mstride_[2];
      a.m_k = static_cast<int>(mstride_[3]);
    }
    if (rot_) {
      a.rot = rot_;
      a.cosc = static_cast<const __half*>(in[4].data);
      a.sinc = static_cast<const __half*>(in[5].data);
      a.pos = in.size() > 6 && in[6].present() ? static_cast<const int64_t*>(in[6].data) : nullptr;
      a.r_b = rot_b_;
      a.r_max = rot_max_;
    }
    for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k),
                          static_cast<const void*>(a.v), static_cast<const void*>(a.y),
                          static_cast<const void*>(a.cosc), static_cast<const void*>(a.sinc)})
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        return KILN_ERROR("{}: an operand is not 16-byte aligned", node_->label());
    const int rows = rows_;
    const dim3 grid(static_cast<unsigned>((s_.Sq + rows - 1) / rows), static_cast<unsigned>(s_.H),
                    static_cast<unsigned>(s_.B));
    if (s_.Sk == 0) return KILN_ERROR("{}: no keys (sequence length 0)", node_->label());
    KILN_CUDA_CHECK(launch_kernel(rc, kernel_, grid, dim3(32 * warps_), smem_, a));
    return Status::Ok();
  }

 private:
  const Node* node_;
  float scale_ = 1.f;
  bool nan_to_zero_ = false;
  bool rows128_ = false, split_ = false, w32_ = false;
  MhaShape s_;
  DataType mask_ = DataType::kUndefined;
  std::array<int64_t, 4> mstride_{};
  int rot_ = 0;  // FlashArgs::rot
  int64_t rot_b_ = 0, rot_max_ = 0;
  int warps_ = 4;
  int rows_ = 64;  // query rows a block
  size_t smem_ = 0;
  FlashKernel kernel_ = nullptr;
};

// --- mha.unfused ----------------------------------------------------------------------------

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

bool unfused_supports(const LayerDesc& d, std::string* why) {
  if (mha_has_rotary(*d.node)) return *why = "the rotary is applied only by mha.flash", false;
  const bool packed = d.node->attrs.get_int("packed", 0) != 0;
  for (size_t i = 0; i < (packed ? 1u : 3u); ++i)
    if (d.in.size() <= i || !dtype_is_float(d.in[i].dtype) || d.in[i].dtype != d.in[0].dtype)
      return *why = "float Q, K and V of one type only", false;
  if (d.in.size() > 3 && d.in[3].present() && d.in[3].dtype != d.in[0].dtype)
    return *why = "the mask differs in type", false;
  return true;
}

// The heads of Q, K and V copied into [B, H, S, D] (K: [B, H, D, S]) workspace tensors, the
// batched-GEMM attention over them, and its [B, H, Sq, Dv] result merged into Y.
class MhaUnfusedLayer final : public Layer {
 public:
  explicit MhaUnfusedLayer(const LayerDesc& d) : desc_(d) {}

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *desc_.node;
    KILN_ASSIGN_OR_RETURN(s_, mha_shape(n, in, out[0]));
    dtype_ = in[0].dtype;
    const size_t es = dtype_size(dtype_);
    // [B, H, S, D] of rows with stride `row`, as dims (b, head group, head in group, s, d):
    // Q's groups are of one head; K's and V's of H / Hkv, each reading its group's head.
    auto split = [&](int64_t S, int64_t D, int64_t row, int64_t off, bool kt, int64_t g) {
      const std::vector<int64_t> src = {s_.batch_stride(S, row), D, g == 1 ? D : 0,
                                        s_.seq_stride(row), 1};
      const std::vector<int64_t> dst =
          kt ? std::vector<int64_t>{s_.H * D * S, g * D * S, D * S, 1, S}
             : std::vector<int64_t>{s_.H * S * D, g * S * D, S * D, D, 1};
      return movement_detail::plan_copy({s_.B, s_.H / g, g, S, D}, src, dst, off, 0, es);
    };
    const int64_t group = s_.H / s_.Hkv;
    KILN_ASSIGN_OR_RETURN(cq_, split(s_.Sq, s_.D, s_.q_row, s_.q_off, false, 1));
    KILN_ASSIGN_OR_RETURN(ck_, split(s_.Sk, s_.D, s_.k_row, s_.k_off, true, group));
    KILN_ASSIGN_OR_RETURN(cv_, split(s_.Sk, s_.Dv, s_.v_row, s_.v_off, false, group));
    KILN_ASSIGN_OR_RETURN(
        cy_, movement_detail::plan_copy({s_.B, s_.H, s_.Sq, s_.Dv},
                                        {s_.H * s_.Sq * s_.Dv, s_.Sq * s_.Dv, s_.Dv, 1},
                                        {s_.batch_stride(s_.Sq, s_.H * s_.Dv), s_.Dv,
                                         s_.seq_stride(s_.H * s_.Dv), 1},
                                        0, 0, es));
    q4_ = tensor({s_.B, s_.H, s_.Sq, s_.D});
    kt4_ = tensor({s_.B, s_.H, s_.D, s_.Sk});
    v4_ = tensor({s_.B, s_.H, s_.Sk, s_.Dv});
    y4_ = tensor({s_.B, s_.H, s_.Sq, s_.Dv});
    mask_ = in.size() > 3 && in[3].present() ? in[3] : DeviceTensor{};
    if (mask_.present()) {  // as [B, H, Sq, Sk] scores see it (rank 4, leading 1s)
      KILN_RETURN_IF_ERROR(mask_strides(n, mask_, s_).status());
      while (mask_.rank() < 4) mask_.shape.insert(mask_.shape.begin(), 1);
    }
    if (!attention_) {
      LayerDesc d = desc_;
      d.in = {desc_.in[0], desc_.in[0], desc_.in[0],
              mask_.present() ? desc_.in[3] : TensorFormat{}};
      d.out = {desc_.out[0]};
      KILN_ASSIGN_OR_RETURN(attention_, create_attention(d));
    }
    bytes_ = 0;
    for (const DeviceTensor* t : {&q4_, &kt4_, &v4_, &y4_}) bytes_ += align256(t->nbytes());
    if (bytes_ > rc.workspace_limit)
      return KILN_ERROR(
          "{}: the heads copied out for mha.unfused need {} bytes of workspace, "
          "over the limit of {} bytes",
          n.label(), bytes_, rc.workspace_limit);
    // The attention's scores share the limit with the copies: it chunks them to fit the rest.
    RunContext arc = rc;
    arc.workspace_limit = rc.workspace_limit - bytes_;
    std::vector<DeviceTensor> ain = {q4_, kt4_, v4_, mask_};
    KILN_ASSIGN_OR_RETURN(attention_ws_, attention_->configure(arc, ain, std::span(&y4_, 1)));
    return bytes_ + attention_ws_;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    auto* ws = static_cast<uint8_t*>(rc.workspace);
    for (DeviceTensor* t : {&q4_, &kt4_, &v4_, &y4_}) {
      t->data = ws;
      ws += align256(t->nbytes());
    }
    const void* base = in[0].data;
    KILN_RETURN_IF_ERROR(movement_detail::run_copy(cq_, base, q4_.data, rc.stream));
    KILN_RETURN_IF_ERROR(
        movement_detail::run_copy(ck_, s_.packed ? base : in[1].data, kt4_.data, rc.stream));
    KILN_RETURN_IF_ERROR(
        movement_detail::run_copy(cv_, s_.packed ? base : in[2].data, v4_.data, rc.stream));
    if (mask_.present()) mask_.data = in[3].data;
    RunContext arc = rc;
    arc.pdl = false;  // after the copies above, which do not trigger
    arc.workspace = ws;
    arc.workspace_bytes = attention_ws_;
    std::vector<DeviceTensor> ain = {q4_, kt4_, v4_, mask_};
    KILN_RETURN_IF_ERROR(attention_->run(arc, ain, std::span(&y4_, 1)));
    return movement_detail::run_copy(cy_, y4_.data, out[0].data, rc.stream);
  }

 private:
  DeviceTensor tensor(std::vector<int64_t> shape) const {
    DeviceTensor t;
    t.dtype = dtype_;
    t.shape = std::move(shape);
    return t;
  }

  LayerDesc desc_;
  MhaShape s_;
  DataType dtype_ = DataType::kUndefined;
  movement_detail::CopyPlan cq_, ck_, cv_, cy_;
  DeviceTensor q4_, kt4_, v4_, y4_, mask_;
  std::unique_ptr<Layer> attention_;
  size_t attention_ws_ = 0, bytes_ = 0;
};

}  // namespace

bool mha_flash_supports(const LayerDesc& d, std::string* why) { return flash_supports(d, why); }
std::vector<std::string> mha_flash_variants(const LayerDesc& d) { return flash_variants(d); }
Expected<std::unique_ptr<Layer>> create_mha_flash(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new MhaFlashLayer(d));
}
bool mha_unfused_supports(const LayerDesc& d, std::string* why) { return unfused_supports(d, why); }
Expected<std::unique_ptr<Layer>> create_mha_unfused(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new MhaUnfusedLayer(d));
}

}  // namespace kiln::gpu
