// kiln's INT8 convolution kernels (conv_int8.cu, conv_int8_pipelined.cu): the problem geometry, the
// fused float epilogue's operands, and the epilogue arithmetic, in the CPU reference's order
// (src/ops/fused_int8.cpp) so that every kernel gives the reference's codes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/activation.cuh"
#include "kernels/int8.cuh"
#include "kernels/mma.cuh"
#include "kiln/types.h"

namespace kiln::gpu {

struct Int8Geom {
  int N, H, W, C4, K, R, S, P, Q, sh, sw, dh, dw, ph, pw;
  int M, KW;  // output pixels (N*P*Q), reduction words (R*S*C4)
};

struct Int8Epilogue {
  const float* scale = nullptr;  // [K] sx * sw[k], one float32 rounding
  const float* bias = nullptr;   // [K] conv/MatMul bias or Gemm's beta * C; nullptr: none
  float alpha = 1.f;             // Gemm's alpha (applied when != 1)
  const void* z = nullptr;       // residual, Y's layout; nullptr: none
  DataType z_type = DataType::kUndefined;
  float sz = 1.f;  // the residual's scale when z is int8
  ActParams act;
  float sy = 1.f;  // Y's scale when Y is int8
};

// y before its output conversion: float(acc) * scale[k] [* alpha] [+ bias[k]] [+ z] -> act, each
// step one float32 rounding. z is the residual's float value (its dequantized code) when has_z.
__device__ __forceinline__ float epilogue_value(int32_t acc, int k, const Int8Epilogue& e,
                                                bool has_z, float z) {
  float v = __fmul_rn(static_cast<float>(acc), e.scale[k]);
  if (e.alpha != 1.f) v = __fmul_rn(v, e.alpha);
  if (e.bias) v = __fadd_rn(v, e.bias[k]);
  if (has_z) v = __fadd_rn(v, z);
  return apply_act(v, e.act);
}


// The pipelined kernel (conv_int8_pipelined.cu): C % 64 == 0, K % 64 == 0, Y int8 and the
// residual int8 or absent; any filter size, stride, padding and dilation; tile_n output channels
// per block (128 or 64, dividing K). Launches it; returns why not when the problem or the
// buffers' alignment does not fit ("" when launched).
// Its shared-memory opt-in on the current device; call before the first launch (configure).
cudaError_t prepare_int8_pipelined();
const char* launch_int8_pipelined(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                  const Int8Epilogue& e, int tile_n, cudaStream_t stream);

// The persistent pointwise kernel (conv_int8_pointwise.cu): 1x1 without padding, any stride,
// C of 64, 128 or 256, K % tile_n == 0 (64 or 128), tiles of tile_m pixels (128 or 64), Y int8, the residual int8 or absent, no activation or ReLU. int8_pointwise_unfit says
// why a geometry does not fit ("" when it does); prepare (configure time) makes the shared-memory
// opt-in and finds how many blocks fit per SM.
cudaError_t prepare_int8_pointwise();
const char* int8_pointwise_unfit(const Int8Geom& g, int tile_n, int tile_m);
const char* launch_int8_pointwise(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                  const Int8Epilogue& e, int tile_n, int tile_m,
                                  cudaStream_t stream);

// The persistent 3x3 kernel (conv_int8_3x3.cu): 3x3, stride 1, padding 1, dilation 1, C of 64 or
// 128, K % 64 == 0, Y int8, the residual int8 or absent, no activation or ReLU, an input row narrow
// enough for the input patch in shared memory. prepare (configure time, for these shapes) makes
// the shared-memory opt-in and finds how many blocks fit per SM (0 when the geometry does not fit:
// launch then says why); launch takes that count.
const char* int8_conv3x3_unfit(const Int8Geom& g);
// The problem rules the two 3x3 kernels share (shape, C, K), and their launch-time checks of the
// epilogue and the buffers ("" when they fit).
const char* int8_conv3x3_problem_unfit(const Int8Geom& g);
const char* int8_conv3x3_launch_unfit(const int8_t* x, const int8_t* w, const int8_t* y,
                                      const Int8Epilogue& e);
cudaError_t prepare_int8_conv3x3(const Int8Geom& g, bool relu, int* per_sm);
const char* launch_int8_conv3x3(const int8_t* x, const int8_t* w, int8_t* y, const Int8Geom& g,
                                const Int8Epilogue& e, int per_sm, cudaStream_t stream);

// The same problems on Hopper's warpgroup MMA (conv_int8_3x3_wgmma.cu), the same interface.
const char* int8_conv3x3_wgmma_unfit(const Int8Geom& g);
cudaError_t prepare_int8_conv3x3_wgmma(const Int8Geom& g, bool relu, int* per_sm);
const char* launch_int8_conv3x3_wgmma(const int8_t* x, const int8_t* w, int8_t* y,
                                      const Int8Geom& g, const Int8Epilogue& e, int per_sm,
                                      cudaStream_t stream);

}  // namespace kiln::gpu
