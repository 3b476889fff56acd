// Device helpers shared by kiln's INT8 kernels that write int8 tiles through shared memory
// (conv_int8_pipelined.cu, conv_int8_pointwise.cu, conv_int8_3x3.cu): cp.async, and the epilogues of a 128-pixel x
// N-channel tile held in mma.sync m16n8k32 accumulator fragments: the reference's arithmetic
// (pw_epilogue: the CPU reference's codes), or reassociated as TensorRT and the INT8 libraries do
// it (pw_epilogue_fused: within one code of them).
#pragma once

#include "device_util_host.h"  // aligned16
#include "layers/conv_int8.cuh"

namespace kiln::gpu {


// epilogue_value's arithmetic (conv_int8.cuh) for one element up to its activation, with the
// channel's scale and bias given (bias 0 when the layer has none: adding +0 changes no code) and z
// its residual's float value (0 without one: adding +0 changes no code either). SmallAcc: |acc| <=
// 2^22 by the layer's reduction length, so it converts without the conversion unit
// (small_int_to_float). Convolutions only: Gemm's alpha is 1 here.
template <bool SmallAcc>
__device__ __forceinline__ float pw_preact(int32_t acc, float scale, float bias, float z) {
  const float v = __fmul_rn(SmallAcc ? small_int_to_float(acc) : static_cast<float>(acc), scale);
  return __fadd_rn(__fadd_rn(v, bias), z);
}

// Two adjacent channels' codes (low byte first): the activation (ReLU folded into the quantizing
// clamp; any other applied first) and quantize_code's codes by quantize_pair_inv.
template <int Act>
__device__ __forceinline__ uint32_t pw_codes(float v0, float v1, const Int8Epilogue& e, float inv_sy) {
  if constexpr (Act == kPwAny) {
    v0 = apply_act(v0, e.act);
    v1 = apply_act(v1, e.act);
  }
  return quantize_pair_inv<Act == kPwRelu>(v0, v1, e.sy, inv_sy);
}

// The two residual codes packed in zz (low byte first) as floats, exactly: each code c becomes the
// float 2^23 + (c + 128) by placing c ^ 0x80 under the exponent bits of 2^23 (one byte permute),
// then 2^23 + 128 is subtracted (exact), with no conversion instruction.
__device__ __forceinline__ float2 residual_codes(unsigned zz) {
  const unsigned u = zz ^ 0x8080u;
  return make_float2(__fsub_rn(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540)), 8388736.f),
                     __fsub_rn(__uint_as_float(__byte_perm(u, 0x4B000000u, 0x7541)), 8388736.f));
}

// Their dequantized values, exactly dequantize_code's.
__device__ __forceinline__ float2 residual_pair(unsigned zz, float sz) {
  const float2 c = residual_codes(zz);
  return make_float2(__fmul_rn(c.x, sz), __fmul_rn(c.y, sz));
}

// The reassociated epilogues' code of t (the value already divided by Y's scale), in the low
// byte of the result: saturated, rounded half to even by the magic-number add, ReLU as the
// clamp's lower bound (which maps NaN to 0 already); NaN gives 0 as the reference.
template <bool Relu>
__device__ __forceinline__ uint32_t fused_code(float t) {
  float c = fminf(fmaxf(t, Relu ? 0.f : -128.f), 127.f);
  if constexpr (!Relu) c = t != t ? 0.f : c;
  return __float_as_uint(__fadd_rn(c, kMagicRound));
}

// SmallAcc: |acc| <= 2^22 (a reduction of at most 256 int8 products), converted without the
// conversion unit (small_int_to_float); else by it.
template <bool SmallAcc>
__device__ __forceinline__ float acc_to_float(int32_t a) {
  return SmallAcc ? small_int_to_float(a) : __int2float_rn(a);
}

// One k32 step (word offset o) of a warp's 32-pixel x N / 2-channel share of a 128-pixel tile
// (mma.sync m16n8k32 s8): A from the tile's pixel rows xb (x_words words per row), B from the
// weight rows wb (w_words per row); rows padded by 16 bytes read without bank conflicts.
template <int NI>
__device__ __forceinline__ void pw_mma_k32(int32_t (&acc)[2][NI][4], const uint32_t* xb,
                                           int x_words, const uint32_t* wb, int w_words, int o,
                                           int wm, int wn, int lane) {
  const int gq = lane / 4, tq = lane % 4;
  uint32_t a[2][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    const int row = wm + mi * 16 + gq;
    a[mi][0] = xb[row * x_words + o + tq];
    a[mi][1] = xb[(row + 8) * x_words + o + tq];
    a[mi][2] = xb[row * x_words + o + tq + 4];
    a[mi][3] = xb[(row + 8) * x_words + o + tq + 4];
  }
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = wn + ni * 8 + gq;
    const uint32_t b0 = wb[col * w_words + o + tq], b1 = wb[col * w_words + o + tq + 4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) mma_s8(acc[mi][ni], a[mi], b0, b1);
  }
}

// The ldmatrix lanes of a k32 step (ldm_mma_k32). A: the lane gives the address of row
// ldm_a_row(lane) of its warp's 16-row fragment, at byte ldm_a_k(lane) of the step (matrices
// j = lane / 8: rows 0-7 | 8-15, then k 0-15 | 16-31). B: the row (output channel) ldm_b_row(lane)
// of 16, at byte ldm_b_k(lane) (matrices: channels 0-7 k 0-15, 0-7 k 16-31, 8-15 k 0-15, 8-15 k
// 16-31).
__device__ __forceinline__ int ldm_a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int ldm_a_k(int lane) { return (lane >> 4) * 16; }
__device__ __forceinline__ int ldm_b_row(int lane) { return (lane & 7) + ((lane >> 4) & 1) * 8; }
__device__ __forceinline__ int ldm_b_k(int lane) { return ((lane >> 3) & 1) * 16; }

// One k32 step of a warp's 32-pixel x 8 * NI-channel share of a tile (mma.sync m16n8k32 s8) with
// its fragments read by ldmatrix: a[mi] the shared address this lane gives for A rows mi * 16..
// (its row ldm_a_row(lane), byte ldm_a_k(lane) of the step: any row order, so an implicit GEMM
// gathers its rows here), b the address it gives for the first 16 channels' B rows, the next 16
// being w_row bytes * 16 further. Rows padded by 16 bytes past a multiple of 128 (or any stride
// that is an odd multiple of 16) put the 8 rows of a matrix in distinct banks.
template <int NI>
__device__ __forceinline__ void ldm_mma_k32(int32_t (&acc)[2][NI][4], const uint32_t (&a)[2],
                                            uint32_t b, int w_row) {
  uint32_t af[2][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(af[mi], a[mi]);
#pragma unroll
  for (int nb = 0; nb < NI / 2; ++nb) {
    uint32_t bf[4];
    ldmatrix_x4(bf, b + nb * 16 * w_row);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      mma_s8(acc[mi][2 * nb], af[mi], bf[0], bf[1]);
      mma_s8(acc[mi][2 * nb + 1], af[mi], bf[2], bf[3]);
    }
  }
}

// A persistent kernel's configure-time preparation: the opt-in to `opt_in` bytes of dynamic
// shared memory (over the default 48 KiB), then how many blocks of `threads` threads using
// `bytes` fit on an SM (*per_sm; the grid is sized by it).
template <typename Kernel>
cudaError_t prepare_persistent(Kernel kernel, int threads, size_t opt_in, size_t bytes,
                               int* per_sm) {
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(opt_in));
  if (e != cudaSuccess) return e;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(per_sm, kernel, threads, bytes);
}

// A lane's ldmatrix addresses in the persistent 1x1 kernels (pointwise, pair), whose tiles and
// weight slice have rows of `row` bytes: a[] its A rows' offsets within a tile stage (add the
// stage's shared address), b its B row's shared address in the weights ws.
struct PwLaneAddrs {
  uint32_t a[2];
  uint32_t b;
};
__device__ __forceinline__ PwLaneAddrs pw_lane_addrs(const int8_t* ws, int row, int wm, int wn,
                                                    int lane) {
  return {{static_cast<uint32_t>((wm + ldm_a_row(lane)) * row + ldm_a_k(lane)),
           static_cast<uint32_t>((wm + 16 + ldm_a_row(lane)) * row + ldm_a_k(lane))},
          smem_u32(ws) + (wn + ldm_b_row(lane)) * row + ldm_b_k(lane)};
}

// The k32 steps From..To - 1 of a tile stage at shared address xb into acc (ldm_mma_k32).
template <int From, int To, int NI>
__device__ __forceinline__ void pw_mma_steps(int32_t (&acc)[2][NI][4], uint32_t xb,
                                             const PwLaneAddrs& l, int row) {
#pragma unroll
  for (int kk = From; kk < To; ++kk) {
    const uint32_t a[2] = {xb + l.a[0] + kk * 32, xb + l.a[1] + kk * 32};
    ldm_mma_k32<NI>(acc, a, l.b + kk * 32, row);
  }
}

// The persistent kernels' tile loop (conv_int8_pointwise.cu, conv_int8_3x3.cu): a block walks
// tiles blockIdx.y, + gridDim.y, ... through a two-stage cp.async ring. load(stage, tile) issues
// a tile's copies into a stage (the first group also holds whatever the block issued before: its
// weights); compute(stage, tile) multiplies a landed stage and leaves the tile's output codes in
// shared memory; store(stage, tile) writes them out. Tile i + 1 loads while tile i is computed;
// tile i + 2 starts loading into tile i's stage once every thread is done with it.
template <typename Load, typename Compute, typename Store>
__device__ __forceinline__ void pw_tile_ring(int tiles, Load&& load, Compute&& compute,
                                             Store&& store) {
  const int step = gridDim.y;
  int tile = blockIdx.y;
  load(0, tile);
  cp_async_commit();
  if (tile + step < tiles) load(1, tile + step);
  cp_async_commit();
  for (int it = 0; tile < tiles; ++it, tile += step) {
    const int st = it & 1;
    cp_async_wait<1>();  // every group but the newest (the next tile's) has landed
    __syncthreads();
    compute(st, tile);
    __syncthreads();
    store(st, tile);
    __syncthreads();  // this stage's input and output rows are free again
    if (tile + 2 * step < tiles) load(st, tile + 2 * step);
    cp_async_commit();  // possibly empty: one group per iteration keeps the wait count right
  }
  cp_async_wait<0>();
}

// Writes a tile's first `count` output rows of its Rows (N int8 channels each, from zt rows of zt_row bytes)
// to Y rows row0.. of K channels, at channel k0, in coalesced 16-byte stores.
template <int N, int Threads, int Rows = 128>
__device__ __forceinline__ void pw_store_rows(int8_t* y, int64_t row0, int count, int K, int k0,
                                              const int8_t* zt, int zt_row, int tid) {
  constexpr int kChunks = N / 16;
#pragma unroll
  for (int j = 0; j < Rows * kChunks / Threads; ++j) {
    const int i = tid + j * Threads, r = i / kChunks, c = i % kChunks;
    if (r < count)
      *reinterpret_cast<int4*>(y + (row0 + r) * K + k0 + c * 16) =
          *reinterpret_cast<const int4*>(zt + r * zt_row + c * 16);
  }
}

// The m16n8k32 accumulator fragment layout of a warp at pixel rows wm.. wm + 16 * MI - 1 and
// channels wn.. wn + 8 * NI - 1 (also wgmma's, one 16-row block per warp): calls
// f(mi, ni, row, col) for each of this thread's fragments acc[mi][ni], whose elements 2h, 2h + 1
// (h = 0, 1) are channels col, col + 1 of tile row row + 8h.
template <int NI, int MI = 2, typename F>
__device__ __forceinline__ void pw_fragments(int wm, int wn, int lane, F&& f) {
  const int gq = lane / 4, tq = lane % 4;
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) f(mi, ni, wm + mi * 16 + gq, wn + ni * 8 + tq * 2);
}

// Calls f(a0, a1, sb2, p) for each pair of adjacent channels of a row that this thread holds in a
// tile's accumulators acc[MI][NI][4] (pw_fragments; MI and NI are deduced from acc): a0 and a1
// the two
// accumulators, sb2 the channels' (scale, bias, scale, bias) from sb, p the pair's 16-bit slot in
// the tile zy (rows of zy_row bytes), which holds the residual codes and receives the output
// codes. The 16-bit shared accesses are conflict-free with rows padded by 16 bytes (N + 16 bytes
// is 20 or 36 words, so the 8 rows of an access fall in distinct banks).
template <int MI, int NI, typename F>
__device__ __forceinline__ void pw_for_each_pair(const int32_t (&acc)[MI][NI][4], int8_t* zy,
                                                 int zy_row, const float* sb, int wm, int wn,
                                                 int lane, F&& f) {
  pw_fragments<NI, MI>(wm, wn, lane, [&](int mi, int ni, int row, int col) {
    const float4 sb2 = *reinterpret_cast<const float4*>(sb + 2 * col);  // s0 b0 s1 b1
#pragma unroll
    for (int h = 0; h < 2; ++h)
      f(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], sb2,
        reinterpret_cast<uint16_t*>(zy + (row + 8 * h) * zy_row + col));
  });
}

// The epilogue of a tile whose accumulators acc[MI][NI][4] belong to a warp at pixel rows wm..
// wm + 16 * MI - 1 and channels wn.. wn + 8 * NI - 1 (the fragment layout of mma.sync
// m16n8k32): zy holds
// the tile's residual codes (rows of zy_row bytes; ignored when !has_z) and receives its output
// codes in their place; sb holds each channel's scale and bias. Each pair of adjacent channels of
// a row belongs to one thread, which reads its two residual codes and writes its two output codes
// in their place (pw_for_each_pair). The arithmetic is epilogue_value's, written for the
// instruction count, since the epilogue, not memory, bounds these kernels' 1x1 layers on the H100
// (docs/perf.md): the
// accumulator and the residual codes become floats without the conversion unit, the activation
// is resolved at compile time (ReLU folded into the quantizing clamp), and the quantizing
// division is a multiply that divides only near a rounding boundary (quantize_pair_inv).
template <int Act, bool SmallAcc, int MI, int NI>
__device__ __forceinline__ void pw_epilogue(const int32_t (&acc)[MI][NI][4], int8_t* zy,
                                            int zy_row, const float* sb, int wm, int wn, int lane,
                                            const Int8Epilogue& e, bool has_z) {
  const float inv_sy = 1.f / e.sy;
  pw_for_each_pair(acc, zy, zy_row, sb, wm, wn, lane,
                      [&](int32_t a0, int32_t a1, const float4& sb2, uint16_t* p) {
                        const float2 zf = has_z ? residual_pair(*p, e.sz) : make_float2(0.f, 0.f);
                        *p = static_cast<uint16_t>(
                            pw_codes<Act>(pw_preact<SmallAcc>(a0, sb2.x, sb2.y, zf.x),
                                          pw_preact<SmallAcc>(a1, sb2.z, sb2.w, zf.y), e, inv_sy));
                      });
}

// The reassociated epilogue (conv_int8.pointwise): with the channel's scale and bias already
// divided by Y's scale (sb: scale / sy, bias / sy) and szy = sz / sy, the code is
// sat(rne(fma(z, szy, fma(acc, scale / sy, bias / sy)))), ReLU being the clamp's lower bound:
// what TensorRT and the INT8 libraries compute. It differs from the reference's arithmetic
// (float products and sums, then a division by sy: pw_epilogue) only in rounding, so a code may
// move by one where the value lies within a few float32 ulps of a half-integer (test-backend-ops
// holds it to the libraries' bound). About 9 instructions per element with a residual against
// the reference's 20: these layers are bound by instruction issue on the H100. SmallAcc: |acc| <=
// 2^22 (R * S * C <= 256), converted without the conversion unit; else by it (the 3x3 kernel).
// NaN (from a NaN bias) gives 0, as the reference.
template <bool Relu, bool SmallAcc = true, int MI, int NI>
__device__ __forceinline__ void pw_epilogue_fused(const int32_t (&acc)[MI][NI][4], int8_t* zy,
                                                  int zy_row, const float* sb, int wm, int wn,
                                                  int lane, float szy, bool has_z) {
  pw_for_each_pair(acc, zy, zy_row, sb, wm, wn, lane,
                      [&](int32_t a0, int32_t a1, const float4& sb2, uint16_t* p) {
                        float t0 = __fmaf_rn(acc_to_float<SmallAcc>(a0), sb2.x, sb2.y);
                        float t1 = __fmaf_rn(acc_to_float<SmallAcc>(a1), sb2.z, sb2.w);
                        if (has_z) {
                          const float2 zc = residual_codes(*p);
                          t0 = __fmaf_rn(zc.x, szy, t0);
                          t1 = __fmaf_rn(zc.y, szy, t1);
                        }
                        *p = static_cast<uint16_t>(
                            __byte_perm(fused_code<Relu>(t0), fused_code<Relu>(t1), 0x0040));
                      });
}

}  // namespace kiln::gpu
