// kiln.FusedConvPair's INT8 kernels (conv_int8_pair.cu: mma.sync, conv_int8_pair_wgmma.cu:
// wgmma): what their launches share. The layer (conv_int8_pair.cu) prepares the operands once
// and calls one kernel family through this interface.
//
//   y = act(conv(X, W) * s1 + conv(X2, W2) * s2 + b1 + b2)   ->   int8 codes of Y
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/fast_div.cuh"

namespace kiln::gpu {

// One input of the pair: int8 NHWC [n][H][W][C], read at stride (sh, sw) (1x1, no padding).
struct PairInput {
  const int8_t* x;
  int H, W, sh, sw;
  bool contiguous;  // stride 1 (so H, W are the output's): output pixel m reads row m
};

// The epilogue's constants of an output channel, divided by Y's scale: X's and X2's dequantizing
// scales (sx * sw[k] / sy, sx2 * sw2[k] / sy) and the two biases' sum (b[k] + b2[k]) / sy.
struct PairChannel {
  float s1, s2, b, pad;
};

// A launch: the inputs, the int8 weights [K][C1 + C2] (W's row, then W2's), the channels'
// constants [K], Y [M][K], M = N * P * Q output pixels.
struct PairLaunch {
  PairInput a, b;
  const int8_t* w;
  const PairChannel* ch;
  int8_t* y;
  int M, K, P, Q;
};

// The input row output pixel m reads (n, p, q from m; by_q divides by Q, by_pq by P * Q).
__device__ __forceinline__ int64_t pair_input_row(const PairInput& in, int m, int P, int Q,
                                                  const FastDiv& by_q, const FastDiv& by_pq) {
  if (in.contiguous) return m;
  const int nq = static_cast<int>(by_q.div(m)), n = static_cast<int>(by_pq.div(m));
  const int q = m - nq * Q, p = nq - n * P;
  return (static_cast<int64_t>(n) * in.H + p * in.sh) * in.W + q * in.sw;
}

// The wgmma pair kernel (conv_int8_pair_wgmma.cu): why (C1, C2, K) does not fit ("" when it
// does), and its launch (prepare: at configure, the shared-memory opt-in and the blocks per SM;
// "" when launched or prepared, else why not).
const char* int8_pair_wgmma_unfit(int c1, int c2, int K);
const char* launch_int8_pair_wgmma(bool relu, int c1, int c2, const PairLaunch& l, bool prepare,
                                   cudaStream_t stream);

}  // namespace kiln::gpu
