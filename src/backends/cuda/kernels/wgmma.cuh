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

namespace kiln::gpu {

// The 64-bit descriptor of an unswizzled K-major operand at shared address addr (16-byte
// aligned, below 256 KiB), lbo and sbo bytes (multiples of 16, below 256 KiB).
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  const uint32_t lo = ((addr >> 4) & 0x3FFFu) | (((lbo >> 4) & 0x3FFFu) << 16);
  const uint32_t hi = (sbo >> 4) & 0x3FFFu;  // base offset 0, layout type 0 (no swizzle)
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

}  // namespace kiln::gpu
