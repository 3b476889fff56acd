// The kernels of the recurrent layers (layers/rnn.cu): the step of one unit (Cell), the
// per-step gate kernels of <op>.cublas and the persistent kernel of <op>.persistent, with the
// host-side rules of which persistent kernel exists. Included by rnn.cu only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/device_util.cuh"
#include "ops/rnn.h"

namespace kiln::gpu::rnn {

struct RnnParams {
  RnnCell cell = RnnCell::kLstm;
  int D = 1, G = 4;
  int64_t S = 0, B = 0, H = 0;  // B: the whole batch
  int64_t b0 = 0, nb = 0;       // the entries this pass runs: [b0, b0 + nb)
  bool batch_first = false, reverse = false, has_clip = false, input_forget = false, lbr = false;
  float clip = 0.f;
  RnnActivation acts[kRnnMaxActivations];
  const void* bias = nullptr;  // [D, 2 G H] of the storage type, or nullptr
  const void* peep = nullptr;  // [D, 3 H]
  const void* h0 = nullptr;    // initial states, in X's layout
  const void* c0 = nullptr;
  const void* lens = nullptr;  // int32 or int64 [B]
  bool lens64 = false;
  void* y = nullptr;  // outputs (nullptr: absent)
  void* yh = nullptr;
  void* yc = nullptr;
  const float* proj = nullptr;  // [rows, D G H]: X W^T for this pass's entries
  int64_t pt = 0, pb = 0;       // the projection row of (t, local entry b) is t pt + b pb
};

template <typename T>
__device__ __forceinline__ float ld(const void* p, int64_t i) {
  return static_cast<float>(load(static_cast<const T*>(p), i));
}

__device__ __forceinline__ int64_t seq_len(const RnnParams& p, int64_t b) {
  if (!p.lens) return p.S;
  const int64_t v =
      p.lens64 ? static_cast<const int64_t*>(p.lens)[b] : static_cast<const int32_t*>(p.lens)[b];
  return v < 0 ? 0 : (v > p.S ? p.S : v);
}

// The time step that direction d of an entry of length L takes at step j: a reverse direction
// walks its valid steps backwards; a step j >= L is past the sequence (Y's zero at t = j).
__device__ __forceinline__ int64_t time_of(const RnnParams& p, int d, int64_t L, int64_t j) {
  return (p.reverse || d == 1) && j < L ? L - 1 - j : j;
}
__device__ __forceinline__ int64_t y_index(const RnnParams& p, int64_t t, int d, int64_t b) {
  return (p.batch_first ? (b * p.S + t) * p.D + d : (t * p.D + d) * p.B + b) * p.H;
}
__device__ __forceinline__ int64_t state_index(const RnnParams& p, int d, int64_t b) {
  return (p.batch_first ? b * p.D + d : d * p.B + b) * p.H;
}
// Direction d's projection (G H floats) of time step t, local entry bl.
__device__ __forceinline__ const float* proj_row(const RnnParams& p, int d, int64_t t, int64_t bl) {
  return p.proj + (t * p.pt + bl * p.pb) * (p.D * p.G * p.H) + d * p.G * p.H;
}

template <typename T>
struct Cell {
  const RnnParams& p;
  int d;
  int64_t u;

  __device__ float act(int k, float v) const {
    if (p.has_clip) v = fminf(fmaxf(v, -p.clip), p.clip);
    return rnn_activate<float>(p.acts[d * acts_per_dir_dev() + k], v);
  }
  __device__ int acts_per_dir_dev() const {
    return p.cell == RnnCell::kLstm ? 3 : p.cell == RnnCell::kGru ? 2 : 1;
  }
  // Wb (rec = false) or Rb of gate g.
  __device__ float bias(int g, bool rec) const {
    const int64_t GH = p.G * p.H;
    return p.bias ? ld<T>(p.bias, d * 2 * GH + (rec ? GH : 0) + g * p.H + u) : 0.f;
  }
  // x: the projection row; hr: the recurrent products H R^T (index g H + u).
  __device__ float pre(int g, const float* x, const float* hr) const {
    const int64_t k = g * p.H + u;
    return x[k] + hr[k] + bias(g, false) + bias(g, true);
  }
  __device__ float gru_reset(const float* x, const float* hr) const {
    return act(0, pre(1, x, hr));
  }

  // One step of unit u: hh is GRU's h-gate product (index u): H Rh^T with linear_before_reset,
  // else (r * H) Rh^T.
  __device__ void step(const float* x, const float* hr, const float* hh, float& h, float& c) const {
    const int64_t H = p.H;
    if (p.cell == RnnCell::kRnn) {
      h = act(0, pre(0, x, hr));
    } else if (p.cell == RnnCell::kGru) {
      const float z = act(0, pre(0, x, hr)), r = gru_reset(x, hr);
      const float in = p.lbr ? x[2 * H + u] + r * (hh[u] + bias(2, true)) + bias(2, false)
                             : x[2 * H + u] + hh[u] + bias(2, true) + bias(2, false);
      const float ht = act(1, in);
      h = (1.f - z) * ht + z * h;
    } else {
      auto peep = [&](int k) { return p.peep ? ld<T>(p.peep, d * 3 * H + k * H + u) : 0.f; };
      const float i = act(0, pre(0, x, hr) + peep(0) * c);
      const float f = p.input_forget ? 1.f - i : act(0, pre(2, x, hr) + peep(2) * c);
      const float g = act(1, pre(3, x, hr));
      c = f * c + i * g;
      const float o = act(0, pre(1, x, hr) + peep(1) * c);
      h = o * rnn_activate<float>(p.acts[d * 3 + 2], c);
    }
  }
};

// --- <op>.cublas: a GEMM and a gate kernel per step ------------------------------------------
// The state buffers are [D, nb, H]: h and c in float, ht (and rh, GRU's r * h) in the storage
// type, as the per-step GEMM reads them.

template <typename T>
__global__ void rnn_init_kernel(RnnParams p, float* h, float* c, T* ht) {
  const int64_t n = p.D * p.nb * p.H;
  KILN_GRID_STRIDE(i, n) {
    const int64_t u = i % p.H, bl = (i / p.H) % p.nb;
    const int d = static_cast<int>(i / (p.H * p.nb));
    const int64_t s = state_index(p, d, p.b0 + bl) + u;
    const float hv = p.h0 ? ld<T>(p.h0, s) : 0.f;
    h[i] = hv;
    store(ht, i, hv);
    if (c) c[i] = p.c0 ? ld<T>(p.c0, s) : 0.f;
  }
}

// phase 0 (GRU, linear_before_reset 0): rh = r * h, the second product's input. phase 1: the
// cell, from hr ([D, nb, hr_ld]) and, for that GRU, hh ([D, nb, H]).
template <typename T>
__global__ void rnn_step_kernel(RnnParams p, int64_t j, int phase, const float* hr, int64_t hr_ld,
                                const float* hh, float* h, float* c, T* ht, T* rh) {
  const int64_t n = p.D * p.nb * p.H;
  KILN_GRID_STRIDE(i, n) {
    const int64_t u = i % p.H, bl = (i / p.H) % p.nb;
    const int d = static_cast<int>(i / (p.H * p.nb));
    const int64_t b = p.b0 + bl, L = seq_len(p, b), t = time_of(p, d, L, j);
    if (j >= L) {
      if (phase == 0)
        store(rh, i, 0.f);
      else if (p.y)
        store(static_cast<T*>(p.y), y_index(p, t, d, b) + u, 0.f);
      continue;
    }
    const Cell<T> cell{p, d, u};
    const float* x = proj_row(p, d, t, bl);
    const float* zr = hr + (d * p.nb + bl) * hr_ld;
    if (phase == 0) {
      store(rh, i, cell.gru_reset(x, zr) * h[i]);
      continue;
    }
    const float* hhp = hh ? hh + (d * p.nb + bl) * p.H : zr + 2 * p.H;
    float hv = h[i], cv = c ? c[i] : 0.f;
    cell.step(x, zr, hhp, hv, cv);
    h[i] = hv;
    if (c) c[i] = cv;
    store(ht, i, hv);
    if (p.y) store(static_cast<T*>(p.y), y_index(p, t, d, b) + u, hv);
  }
}

// Y_h and Y_c: the state after the last valid step, zeros for a sequence of length 0.
template <typename T>
__global__ void rnn_final_kernel(RnnParams p, const float* h, const float* c) {
  const int64_t n = p.D * p.nb * p.H;
  KILN_GRID_STRIDE(i, n) {
    const int64_t u = i % p.H, bl = (i / p.H) % p.nb;
    const int d = static_cast<int>(i / (p.H * p.nb));
    const int64_t b = p.b0 + bl, s = state_index(p, d, b) + u;
    const bool any = seq_len(p, b) > 0;
    if (p.yh) store(static_cast<T*>(p.yh), s, any ? h[i] : 0.f);
    if (p.yc && c) store(static_cast<T*>(p.yc), s, any ? c[i] : 0.f);
  }
}

// --- <op>.persistent: every step in one kernel ------------------------------------------------
constexpr int kPersistThreads = 256;
constexpr int kRowsPerWarp = 4;  // R rows a warp loads at once (loads in flight)

// Byte offsets of the persistent kernel's shared memory.
struct PersistSmem {
  uint32_t r = 0, h = 0, rh = 0, g = 0, c = 0, total = 0;
  bool resident = false;  // R's rows in shared memory (at r), else read from global memory
};

// 16 bytes of T as floats.
template <typename T>
__device__ __forceinline__ void unpack(const uint4& raw, float* out) {
  if constexpr (std::is_same_v<T, float>) {
    out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z), out[3] = __uint_as_float(raw.w);
  } else {
    const __half2* h2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h2[k]);
      out[2 * k] = f.x, out[2 * k + 1] = f.y;
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// gs[bb * gld + n] = src[bb, :] . R[n, :] for rows n in [n0, n1) and NB entries: a warp per
// kRowsPerWarp rows, lane l holding src's 16-byte slices l, l + 32, ... (KPL of them) in
// registers. R's rows are hp elements (hp a multiple of 16 bytes, zero-padded past H), src's
// rows hp floats, zero past H.
template <typename T, int NB, int KPL>
__device__ __forceinline__ void dots(const T* R, int64_t hp, const float* src, int64_t n0,
                                     int64_t n1, float* gs, int64_t gld) {
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float hv[NB][KPL * V];
#pragma unroll
  for (int i = 0; i < KPL; ++i) {
    const int64_t k0 = (lane + 32 * i) * int64_t(V);
#pragma unroll
    for (int bb = 0; bb < NB; ++bb)
#pragma unroll
      for (int q = 0; q < V / 4; ++q) {
        const float4 f = k0 < hp ? *reinterpret_cast<const float4*>(src + bb * hp + k0 + 4 * q)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
        hv[bb][i * V + 4 * q] = f.x, hv[bb][i * V + 4 * q + 1] = f.y;
        hv[bb][i * V + 4 * q + 2] = f.z, hv[bb][i * V + 4 * q + 3] = f.w;
      }
  }
  for (int64_t n = n0 + warp * kRowsPerWarp; n < n1; n += nwarps * kRowsPerWarp) {
    float acc[kRowsPerWarp][NB];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int bb = 0; bb < NB; ++bb) acc[r][bb] = 0.f;
#pragma unroll
    for (int i = 0; i < KPL; ++i) {
      const int64_t k0 = (lane + 32 * i) * int64_t(V);
      uint4 raw[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        raw[r] = n + r < n1 && k0 < hp ? *reinterpret_cast<const uint4*>(R + (n + r) * hp + k0)
                                       : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        float rv[V];
        unpack<T>(raw[r], rv);
#pragma unroll
        for (int bb = 0; bb < NB; ++bb)
#pragma unroll
          for (int v = 0; v < V; ++v) acc[r][bb] = fmaf(rv[v], hv[bb][i * V + v], acc[r][bb]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int bb = 0; bb < NB; ++bb) {
        const float s = warp_sum(acc[r][bb]);
        if (lane == 0 && n + r < n1) gs[bb * gld + n + r] = s;
      }
  }
}

// Block (x, d): direction d of local entries [x NB, x NB + NB). R: [D, G H, hp].
template <typename T, int NB, int KPL>
__global__ void __launch_bounds__(kPersistThreads)
    rnn_persistent_kernel(RnnParams p, const T* __restrict__ R, int64_t hp, PersistSmem sm) {
  constexpr int V = 16 / sizeof(T);
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int64_t lens[NB];
  const int d = static_cast<int>(blockIdx.y);
  const int64_t bl0 = int64_t(blockIdx.x) * NB, H = p.H, GH = p.G * H;
  const int tid = threadIdx.x, nt = blockDim.x;
  const bool gru0 = p.cell == RnnCell::kGru && !p.lbr;
  const T* Rd = R + d * GH * hp;
  float* hs = reinterpret_cast<float*>(smem + sm.h);    // [NB, hp]
  float* rhs = reinterpret_cast<float*>(smem + sm.rh);  // [NB, hp] (GRU's r * h)
  float* gs = reinterpret_cast<float*>(smem + sm.g);    // [NB, G H]
  float* cs = reinterpret_cast<float*>(smem + sm.c);    // [NB, H] (LSTM)
  if (sm.resident) {
    T* rs = reinterpret_cast<T*>(smem + sm.r);
    const int64_t chunks = GH * hp / V;
    for (int64_t k = tid; k < chunks; k += nt)
      reinterpret_cast<uint4*>(rs)[k] = reinterpret_cast<const uint4*>(Rd)[k];
    Rd = rs;
  }
  for (int64_t k = tid; k < NB * hp; k += nt) {
    const int64_t bb = k / hp, u = k % hp, bl = bl0 + bb;
    float hv = 0.f, cv = 0.f;
    if (bl < p.nb && u < H) {
      const int64_t s = state_index(p, d, p.b0 + bl) + u;
      if (p.h0) hv = ld<T>(p.h0, s);
      if (p.c0) cv = ld<T>(p.c0, s);
    }
    hs[k] = hv;
    if (gru0) rhs[k] = 0.f;
    if (p.cell == RnnCell::kLstm && u < H) cs[bb * H + u] = cv;
  }
  if (tid < NB) lens[tid] = bl0 + tid < p.nb ? seq_len(p, p.b0 + bl0 + tid) : 0;
  __syncthreads();
  for (int64_t j = 0; j < p.S; ++j) {
    dots<T, NB, KPL>(Rd, hp, hs, 0, gru0 ? 2 * H : GH, gs, GH);
    __syncthreads();
    if (gru0) {  // r first, then (r * h) Rh^T into the h gate's products
      for (int64_t k = tid; k < NB * H; k += nt) {
        const int64_t bb = k / H, u = k % H, L = lens[bb];
        float v = 0.f;
        if (j < L) {
          const Cell<T> cell{p, d, u};
          v = cell.gru_reset(proj_row(p, d, time_of(p, d, L, j), bl0 + bb), gs + bb * GH) *
              hs[bb * hp + u];
        }
        rhs[bb * hp + u] = v;
      }
      __syncthreads();
      dots<T, NB, KPL>(Rd, hp, rhs, 2 * H, 3 * H, gs, GH);
      __syncthreads();
    }
    for (int64_t k = tid; k < NB * H; k += nt) {
      const int64_t bb = k / H, u = k % H, bl = bl0 + bb;
      if (bl >= p.nb) continue;
      const int64_t b = p.b0 + bl, L = lens[bb], t = time_of(p, d, L, j);
      if (j >= L) {
        if (p.y) store(static_cast<T*>(p.y), y_index(p, t, d, b) + u, 0.f);
        continue;
      }
      const Cell<T> cell{p, d, u};
      const float* zr = gs + bb * GH;
      float hv = hs[bb * hp + u], cv = p.cell == RnnCell::kLstm ? cs[bb * H + u] : 0.f;
      cell.step(proj_row(p, d, t, bl), zr, zr + 2 * H, hv, cv);
      hs[bb * hp + u] = hv;
      if (p.cell == RnnCell::kLstm) cs[bb * H + u] = cv;
      if (p.y) store(static_cast<T*>(p.y), y_index(p, t, d, b) + u, hv);
    }
    __syncthreads();
  }
  for (int64_t k = tid; k < NB * H; k += nt) {
    const int64_t bb = k / H, u = k % H, bl = bl0 + bb;
    if (bl >= p.nb) continue;
    const int64_t s = state_index(p, d, p.b0 + bl) + u;
    const bool any = lens[bb] > 0;
    if (p.yh) store(static_cast<T*>(p.yh), s, any ? hs[bb * hp + u] : 0.f);
    if (p.yc) store(static_cast<T*>(p.yc), s, any ? cs[bb * H + u] : 0.f);
  }
}

// R's rows copied into [D, G H, hp], zero past H (16-byte rows for the persistent kernel).
template <typename T>
__global__ void rnn_pack_kernel(const T* R, T* out, int64_t rows, int64_t H, int64_t hp) {
  KILN_GRID_STRIDE(i, rows * hp) {
    const int64_t r = i / hp, k = i % hp;
    out[i] = k < H ? R[r * H + k] : T(0.f);
  }
}

template <typename T>
using PersistFn = void (*)(RnnParams, const T*, int64_t, PersistSmem);

// NB entries, KPL 16-byte slices a lane: at most 32 registers of H a thread.
template <typename T, int NB, int KPL>
constexpr bool kPersistValid = (NB * KPL * int(16 / sizeof(T))) <= 32;

template <typename T, int NB, int KPL>
PersistFn<T> persist_fn() {
  if constexpr (kPersistValid<T, NB, KPL>)
    return rnn_persistent_kernel<T, NB, KPL>;
  else
    return nullptr;
}

template <typename T, int NB>
PersistFn<T> persist_fn_kpl(int kpl) {
  switch (kpl) {
    case 1:
      return persist_fn<T, NB, 1>();
    case 2:
      return persist_fn<T, NB, 2>();
    case 4:
      return persist_fn<T, NB, 4>();
    case 8:
      return persist_fn<T, NB, 8>();
    default:
      return nullptr;
  }
}

template <typename T>
PersistFn<T> persist_kernel(int nb, int kpl) {
  switch (nb) {
    case 1:
      return persist_fn_kpl<T, 1>(kpl);
    case 2:
      return persist_fn_kpl<T, 2>(kpl);
    case 4:
      return persist_fn_kpl<T, 4>(kpl);
    default:
      return nullptr;
  }
}

// 16-byte slices a lane needs for rows of hp elements of `elem` bytes: 1, 2, 4 or 8 (0: more).
inline int slices_per_lane(int64_t hp, size_t elem) {
  const int64_t per_lane = (hp * static_cast<int64_t>(elem) + 32 * 16 - 1) / (32 * 16);
  for (int k : {1, 2, 4, 8})
    if (per_lane <= k) return k;
  return 0;
}

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Whether a persistent kernel exists for NB entries at hidden size H of storage `elem` bytes.
inline bool persist_fits(int nb, int64_t H, size_t elem) {
  const int64_t V = 16 / static_cast<int64_t>(elem);
  const int kpl = slices_per_lane(round_up(H, V), elem);
  return kpl > 0 && nb * kpl * V <= 32;
}

}  // namespace kiln::gpu::rnn
