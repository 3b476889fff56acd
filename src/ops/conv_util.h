// Spatial geometry shared by Conv, ConvTranspose and the pooling ops: attribute parsing
// (kernel_shape, strides, dilations, pads, auto_pad, ceil_mode) and per-axis resolution of
// padding and output size, as the ONNX specification defines them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/conv.h"
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

// Internal to the conv family (conv.cpp / conv_transpose.cpp): what Conv and ConvTranspose do
// alike. How W's first two dims relate to the channels, and how an axis resolves, stay with each
// op.

// Start of conv_params / conv_transpose_params: checks the ranks of X and W and reads N, C and
// group (M and the group/channel checks are the op's own).
Expected<ConvParams> read_conv_params_prologue(const Node& n, const std::vector<int64_t>& x,
                                               const std::vector<int64_t>& w);
// Reads the window attributes (kernel from W's spatial dims) and fills p.in, p.kernel, p.strides
// and p.dilations; the op resolves p.out and p.pads_begin per axis from the result.
Expected<WindowAttrs> read_conv_window(const Node& n, const std::vector<int64_t>& x,
                                       const std::vector<int64_t>& w, ConvParams& p);

// The dims of X and W during Conv / ConvTranspose shape inference. A side of unknown rank reads
// as unknown dims of the other side's rank.
struct ConvInferDims {
  bool ranked = false;  // false: neither X nor W has a rank (output 0 is already set)
  size_t nsp = 0;       // spatial axes
  std::vector<Dim> x, w;
  int64_t group = 1;
};
// Checks the ranks and group >= 1. When neither X nor W has a rank it sets output 0 to an
// unknown rank of X's dtype and returns ranked = false: the op has nothing more to infer.
// X and W are inputs `xi` and `wi` (QLinearConv's W is input 3).
Expected<ConvInferDims> read_conv_infer_dims(InferContext& ctx, size_t xi = 0, size_t wi = 1);
// Conv's output dims [N, M, out...] from read_conv_infer_dims' result (channels and group
// checked; an unknown spatial size or kernel gives an unknown dim).
Expected<std::vector<Dim>> conv_infer_out_dims(const Node& n, const ConvInferDims& d);
// Window attributes with the kernel from W's spatial dims (-1 where unknown).
Expected<WindowAttrs> read_conv_infer_window(const Node& n, const ConvInferDims& d);
// Sets output 0 to `out` with X's dtype, or W's when X's is undefined.
void set_conv_output_type(InferContext& ctx, std::vector<Dim> out);

// Validates dtypes (float types, all equal) and the bias shape [bias_len].
Status check_conv_inputs(const Node& n, const Tensor* x, const Tensor* w, const Tensor* b,
                         int64_t bias_len);

// The float/double instantiations of one conv-family reference kernel.
struct ConvForwardFns {
  void (*f32)(const ConvParams&, const float*, const float*, const float*, float*);
  void (*f64)(const ConvParams&, const double*, const double*, const double*, double*);
};
// Runs the kernel on inputs X, W and B? (checked by check_conv_inputs) and sets output 0 of
// shape [N, M, out...]: float64 computes in double, the other float types in float32.
Status run_conv_forward(KernelContext& ctx, const ConvParams& p, ConvForwardFns fwd);

Status infer_conv_transpose(InferContext& ctx);
Status conv_transpose_cpu(KernelContext& ctx);

}  // namespace kiln
