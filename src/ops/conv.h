// Reference N-d convolution (Conv) and transposed convolution (ConvTranspose), reusable by
// kiln's fused layers: resolve the geometry from a node's attributes and the concrete shapes,
// then run the float kernels (im2col / col2im + the shared GEMM of gemm.h).
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

struct ConvParams {
  int64_t N = 0;      // batch
  int64_t C = 0;      // input channels
  int64_t M = 0;      // output channels
  int64_t group = 1;
  // Per spatial axis.
  std::vector<int64_t> in, kernel, out, strides, dilations, pads_begin;
};

// Conv: X [N, C, in...], W [M, C/group, k...]. Reads kernel_shape/strides/dilations/pads/
// auto_pad/group from `n` (which may be any node carrying Conv's attributes) and validates.
Expected<ConvParams> conv_params(const Node& n, const std::vector<int64_t>& x_shape,
                                 const std::vector<int64_t>& w_shape);
// y [N, M, out...] = conv(x, w) + b (b [M] or null). T is float or double.
template <typename T>
void conv_forward(const ConvParams& p, const T* x, const T* w, const T* b, T* y);

inline void conv_f32(const ConvParams& p, const float* x, const float* w, const float* b,
                     float* y) {
  conv_forward<float>(p, x, w, b, y);
}

// ConvTranspose: X [N, C, in...], W [C, M/group, k...]; also reads output_padding and
// output_shape. pads_begin may be negative (output_shape larger than the natural size).
Expected<ConvParams> conv_transpose_params(const Node& n, const std::vector<int64_t>& x_shape,
                                           const std::vector<int64_t>& w_shape);
template <typename T>
void conv_transpose_forward(const ConvParams& p, const T* x, const T* w, const T* b, T* y);

}  // namespace kiln
