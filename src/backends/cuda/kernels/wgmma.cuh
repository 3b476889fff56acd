// Hopper's warpgroup MMA (wgmma, sm_90a) for kiln's own kernels: shared-memory matrix
// descriptors for the unswizzled K-major layout, the fences around it, and the int8 shape the
// INT8 3x3 kernel uses (conv_int8_3x3_wgmma.cu). CUTLASS wraps the same instructions for its own
// kernels (cute/arch/mma_sm90_gmma.hpp); these are the few a hand-written kernel needs.
//
// The unswizzled K-major layout ("interleave"): a core matrix is 8 rows x 16 bytes stored as 128
// contiguous bytes (row i at byte 16 i); the descriptor gives the start address, the stride
// between the 8-row groups along M or N (SBO) and between the two 16-byte halves of a 32-byte k
// step (LBO). Any 16-byte-aligned start is valid, which lets an implicit GEMM start a tap's A
// operand at any pixel.
#pragma once

#include <cstdint>

#include "kernels/mma.cuh"  // smem_u32

namespace kiln::gpu {

// The 64-bit descriptor of an unswizzled K-major operand at shared address addr (16-byte
// aligned, below 256 KiB), lbo and sbo bytes (multiples of 16, below 256 KiB).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  const uint32_t lo = ((addr >> 4) & 0x3FFFu) | (((lbo >> 4) & 0x3FFFu) << 16);
  const uint32_t hi = (sbo >> 4) & 0x3FFFu;  // base offset 0, layout type 0 (no swizzle)
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The descriptor of a K-major operand in the 128-byte swizzled layout at shared address addr (a
// 1024-byte boundary): rows of 128 bytes (128 int8 codes of the reduction), 16-byte piece c of
// row r stored at piece c ^ (r % 8), 8 rows making a 1024-byte atom (SBO). A k step further
// along the row is the start address moved by its bytes (wgmma_desc_add), within the atom.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  const uint32_t lo = ((addr >> 4) & 0x3FFFu) | (1u << 16);  // LBO unused (one atom along K)
  const uint32_t hi = (1024u >> 4) | (1u << 30);             // SBO 1024, layout type 1: 128B
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The same descriptor moved by `bytes` (a multiple of 16; the address field must not overflow).
__device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t desc, uint32_t bytes) {
  return desc + (bytes >> 4);
}

// The descriptor as a value the compiler cannot see through: descriptors derived from it are
// computed where they are used instead of being hoisted out of a loop into registers.
__device__ __forceinline__ uint64_t wgmma_desc_opaque(uint64_t desc) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(desc));
  return desc;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WGMMA 1
#endif

// Orders the warpgroup's register accesses before the wgmma that follows (required before the
// first wgmma of a sequence and after the accumulators were touched by other instructions).
__device__ __forceinline__ void wgmma_fence() {
#ifdef KILN_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef KILN_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
#ifdef KILN_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
#endif
}

// Pins a wgmma accumulator's registers at this point of the program (an empty asm that reads and
// writes each): after wgmma_wait, so that no read of them moves above the wait; before and after
// the wgmmas that write them, so that no other access moves into their flight. Without it the
// compiler may schedule the reads of a finished tile's accumulators before the wait, and ptxas
// then serializes the wgmmas (C7514).
template <int N>
__device__ __forceinline__ void wgmma_fence_operand(int32_t (&d)[N][4]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int k = 0; k < 4; ++k) asm volatile("" : "+r"(d[j][k])::"memory");
}

// Shared memory written by the generic proxy (stores, cp.async) made visible to the async proxy
// that wgmma reads it through; each writing thread runs it before the barrier the readers wait at.
__device__ __forceinline__ void fence_proxy_async_shared() {
#ifdef KILN_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d (+)= A * B over one 32-deep k step: A 64 x 32 int8 and B 64 x 32 int8 (N x K), both K-major in
// shared memory (descriptors), d 64 x 64 int32 across the warpgroup: warp w holds rows 16 w..,
// d[j][0..1] = row (lane / 4), channels 8 j + 2 (lane % 4) + 0..1, d[j][2..3] = the row 8 below
// (mma.sync m16n8's accumulator layout, for each 8-channel block j). accumulate = false
// overwrites d.
__device__ __forceinline__ void wgmma_s8_m64n64k32(int32_t (&d)[8][4], uint64_t a, uint64_t b,
                                                   bool accumulate) {
#ifdef KILN_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p;\n"
      "}\n"
      : "+r"(d[0][0]), "+r"(d[0][1]), "+r"(d[0][2]), "+r"(d[0][3]), "+r"(d[1][0]),
        "+r"(d[1][1]), "+r"(d[1][2]), "+r"(d[1][3]), "+r"(d[2][0]), "+r"(d[2][1]),
        "+r"(d[2][2]), "+r"(d[2][3]), "+r"(d[3][0]), "+r"(d[3][1]), "+r"(d[3][2]),
        "+r"(d[3][3]), "+r"(d[4][0]), "+r"(d[4][1]), "+r"(d[4][2]), "+r"(d[4][3]),
        "+r"(d[5][0]), "+r"(d[5][1]), "+r"(d[5][2]), "+r"(d[5][3]), "+r"(d[6][0]),
        "+r"(d[6][1]), "+r"(d[6][2]), "+r"(d[6][3]), "+r"(d[7][0]), "+r"(d[7][1]),
        "+r"(d[7][2]), "+r"(d[7][3])
      : "l"(a), "l"(b), "r"(static_cast<int32_t>(accumulate)));
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();
#endif
}

// The same over 128 output channels (m64n128k32): d 64 x 128 int32, d[j] the 8-channel block j
// (j < 16) in the layout above.
__device__ __forceinline__ void wgmma_s8_m64n128k32(int32_t (&d)[16][4], uint64_t a, uint64_t b,
                                                    bool accumulate) {
#ifdef KILN_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p;\n"
      "}\n"
      : "+r"(d[0][0]), "+r"(d[0][1]), "+r"(d[0][2]), "+r"(d[0][3]),
        "+r"(d[1][0]), "+r"(d[1][1]), "+r"(d[1][2]), "+r"(d[1][3]),
        "+r"(d[2][0]), "+r"(d[2][1]), "+r"(d[2][2]), "+r"(d[2][3]),
        "+r"(d[3][0]), "+r"(d[3][1]), "+r"(d[3][2]), "+r"(d[3][3]),
        "+r"(d[4][0]), "+r"(d[4][1]), "+r"(d[4][2]), "+r"(d[4][3]),
        "+r"(d[5][0]), "+r"(d[5][1]), "+r"(d[5][2]), "+r"(d[5][3]),
        "+r"(d[6][0]), "+r"(d[6][1]), "+r"(d[6][2]), "+r"(d[6][3]),
        "+r"(d[7][0]), "+r"(d[7][1]), "+r"(d[7][2]), "+r"(d[7][3]),
        "+r"(d[8][0]), "+r"(d[8][1]), "+r"(d[8][2]), "+r"(d[8][3]),
        "+r"(d[9][0]), "+r"(d[9][1]), "+r"(d[9][2]), "+r"(d[9][3]),
        "+r"(d[10][0]), "+r"(d[10][1]), "+r"(d[10][2]), "+r"(d[10][3]),
        "+r"(d[11][0]), "+r"(d[11][1]), "+r"(d[11][2]), "+r"(d[11][3]),
        "+r"(d[12][0]), "+r"(d[12][1]), "+r"(d[12][2]), "+r"(d[12][3]),
        "+r"(d[13][0]), "+r"(d[13][1]), "+r"(d[13][2]), "+r"(d[13][3]),
        "+r"(d[14][0]), "+r"(d[14][1]), "+r"(d[14][2]), "+r"(d[14][3]),
        "+r"(d[15][0]), "+r"(d[15][1]), "+r"(d[15][2]), "+r"(d[15][3])
      : "l"(a), "l"(b), "r"(static_cast<int32_t>(accumulate)));
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();
#endif
}

// The m64nNk32 wgmma for N of 64 or 128 (d: N / 8 blocks of 8 channels).
template <int N>
__device__ __forceinline__ void wgmma_s8_k32(int32_t (&d)[N / 8][4], uint64_t a, uint64_t b,
                                             bool accumulate) {
  static_assert(N == 64 || N == 128, "instantiated for 64 and 128 output channels");
  if constexpr (N == 64)
    wgmma_s8_m64n64k32(d, a, b, accumulate);
  else
    wgmma_s8_m64n128k32(d, a, b, accumulate);
}

// A barrier of the 128 threads of one warpgroup (named barrier `id`, 1..15; 0 is
// __syncthreads'): warpgroups that run their own pipelines synchronize without the others.
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// mbarriers for cp.async pipelines (CUTLASS's cp.async GMMA mainloop does the same): a stage's
// barrier, initialized for `count` arrivals, completes a phase once each producing thread's
// cp.async copies issued before its cp_async_mbarrier_arrive have landed. Waiting on it (with the
// phase's parity) makes them visible to the waiting threads and their wgmmas, without the
// fence.proxy.async that would also wait for every later copy still in flight (its MEMBAR).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "KILN_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KILN_MBAR_WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace kiln::gpu
