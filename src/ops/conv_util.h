// Spatial geometry shared by Conv, ConvTranspose and the pooling ops: attribute parsing
// (kernel_shape, strides, dilations, pads, auto_pad, ceil_mode) and per-axis resolution of
// padding and output size, as the ONNX specification defines them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"
#include "kiln/status.h"

namespace kiln {

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// The window attributes of a node, normalised to `nsp` spatial axes (defaults filled in).
struct WindowAttrs {
  std::vector<int64_t> kernel;     // nsp
  std::vector<int64_t> strides;    // nsp, default 1
  std::vector<int64_t> dilations;  // nsp, default 1
  std::vector<int64_t> pads;       // 2*nsp: begins then ends, default 0
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;          // pooling only
};

// Reads the window attributes of `n`. `kernel` is the kernel shape to use when the node has no
// kernel_shape attribute (Conv infers it from W); pass an empty vector when unknown — then
// entries of -1 are used and only the other attributes are validated.
Expected<WindowAttrs> read_window_attrs(const Node& n, size_t nsp, std::vector<int64_t> kernel);

// Padding and output size along one axis.
struct AxisGeometry {
  int64_t pad_begin = 0;
  int64_t pad_end = 0;
  int64_t out = 0;
};

// Conv / pooling: resolves one axis for input size `in` (>= 0). Pooling applies ceil_mode (with
// explicit pads only: SAME and VALID sizes are the same either way, per the spec's formulas) with
// the rule that the last window must start inside the input or the left padding. Errors when the
// (dilated) kernel does not fit in the padded input.
Expected<AxisGeometry> resolve_window_axis(const WindowAttrs& a, size_t axis, int64_t in,
                                           bool pooling, const Node& n);

// ConvTranspose: resolves one axis from the input size, output_padding and (when > 0) the
// requested output size. The returned pads may be negative when output_shape asks for a larger
// output than the plain formula gives.
Expected<AxisGeometry> resolve_transpose_axis(const WindowAttrs& a, size_t axis, int64_t in,
                                              int64_t output_padding, int64_t output_size,
                                              const Node& n);

// Product of a shape's entries (1 for an empty shape).
int64_t shape_product(const std::vector<int64_t>& s);

// Refuses (instead of failing to allocate) a scratch buffer of more than 2^30 elements.
Status check_workspace(const Node& n, int64_t elements);

// Internal to the conv family (conv.cpp / conv_transpose.cpp).
// Validates dtypes (float types, all equal) and the bias shape [bias_len].
Status check_conv_inputs(const Node& n, const Tensor* x, const Tensor* w, const Tensor* b,
                         int64_t bias_len);
Status infer_conv_transpose(InferContext& ctx);
Status conv_transpose_cpu(KernelContext& ctx);

}  // namespace kiln
