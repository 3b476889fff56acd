// Warp-level tensor-core steps (mma.sync, sm_80+) kiln's own GEMM-shaped kernels use. Fragment
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

}  // namespace kiln::gpu
