// kiln's own simple CUDA kernels used by the tactics and the tuner: a naive reference convolution,
// a result checker, random fill and the bias/residual/ReLU epilogue for unfused library paths.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../tactics/conv_tactic.h"

namespace kiln::cuda {

// Uniform random values in [lo, hi] (rounded to integers for INT8) from a counter-based hash.
void fill_random(void* data, int64_t count, Precision p, uint64_t seed, float lo, float hi,
                 cudaStream_t stream);
// Writes a poison pattern (NaN for FP16/TF32, 0x5A for INT8) so unwritten outputs fail the check.
void fill_poison(void* data, int64_t count, Precision p, cudaStream_t stream);

// Direct convolution, one thread per output element. FP16/TF32: fp32 accumulation over the
// stored (half/float) inputs, epilogue in fp32, result as float. INT8: exact int32 accumulation,
// then sat(rne(acc * scale)) in double, result as int8.
void reference_conv(const ConvProblem& p, const void* x, const void* w, const void* bias,
                    const void* residual, void* y_ref, cudaStream_t stream);

struct CheckResult {
  double rel_l2 = 0;         // ||y - ref|| / ||ref||
  int64_t nonfinite = 0;     // NaN/Inf in y (includes unwritten poison)
  int64_t mismatches = 0;    // INT8: elements not bit-exact
  int64_t max_abs_diff = 0;  // INT8
};
// y: the tactic's output in the problem's element type; ref: float (FP) or int8 (INT8).
CheckResult check_output(const ConvProblem& p, const void* y, const void* ref, cudaStream_t stream);

// In place on y (half or float): y = act(y + bias [+ residual]) per the problem's epilogue.
void apply_epilogue(const ConvProblem& p, void* y, const void* bias, const void* residual,
                    cudaStream_t stream);

// dst[i] = src[i] * s for i < n (the INT8 tactics' bias divided by the output scale).
void scale_floats(const float* src, float* dst, int n, float s, cudaStream_t stream);

}  // namespace kiln::cuda
