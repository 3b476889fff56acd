// float16's finite range, written once for the FP16 range report (engine/fp16_range.cpp) and the
// CUDA backend's FP16 storage of constants (device_util_host.cpp, an elementwise chain's
// immediates in layers/elementwise.cu).
#pragma once

#include <algorithm>
#include <cmath>

namespace kiln {

inline constexpr double kFloat16Max = 65504.0;

// A constant stored as float16: a finite value past float16's range becomes its largest,
// +-65504, not inf (TensorRT clamps weights likewise). A model's float32-max sentinel
// (torch.finfo(float32).max filling invalid anchors or masked scores) then stays the largest
// value, as in the same model run by PyTorch at FP16, where inf would turn into NaN in the
// arithmetic after it. NaN and inf pass through. An explicit Cast keeps ONNX's overflow to inf.
inline double saturate_to_half_range(double v) {
  return std::isfinite(v) ? std::clamp(v, -kFloat16Max, kFloat16Max) : v;
}

}  // namespace kiln
