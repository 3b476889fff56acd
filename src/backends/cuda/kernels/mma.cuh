// Warp-level tensor-core steps (mma.sync, sm_80+) kiln's own GEMM-shaped kernels use, and the
// shared-memory loads that feed them (ldmatrix, cp.async). Fragment
// layouts (PTX ISA; lane = 4 * gq + tq) are described where the kernels fill them
// (layers/conv_int8.cu, layers/conv_stem.cu).
#pragma once

#include <cstdint>

namespace kiln::gpu {

// One tensor-core step: c += a (16 x 32 int8, row-major fragments) * b (32 x 8, column-major),
// int32 accumulation (mma.sync m16n8k32 s8, sm_80+; layers/conv_int8.cu).
__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // kiln is built for sm_90a (CMAKE_CUDA_ARCHITECTURES): not reached
#endif
}

// c += a (16 x 16 float16, row-major fragments) * b (16 x 8, column-major), float32 accumulation
// (mma.sync m16n8k16 f16).
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();  // kiln is built for sm_90a (CMAKE_CUDA_ARCHITECTURES): not reached
#endif
}

// The shared-memory address of a generic pointer into shared memory (ldmatrix, cp.async).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8 x 8 matrices of 16-bit elements from shared memory, one fragment register each: lanes
// 8j..8j+7 give the addresses of matrix j's rows (16 bytes each); lane 4 * gq + tq receives row gq,
// elements 2tq and 2tq + 1 of each (the mma.sync A/B fragment layout).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same four matrices transposed: lane 4 * gq + tq receives elements (2tq, gq) and
// (2tq + 1, gq) of each: the B fragment of a row-major (k-major) operand such as attention's V.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// cp.async: a global -> shared copy that bypasses registers; src-size 0 zero-fills the chunk
// without reading (rows past the last pixel, the convolution's padding).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
}

}  // namespace kiln::gpu
