// What the convolution tactics share: geometry, cuDNN descriptors, the epilogue and padding
// kernels (layers/conv.cu) used by conv_layers.cpp and conv_fused.cpp.
#pragma once

#include <cudnn.h>

#include "kernels/activation.cuh"
#include "layer.h"

namespace kiln::gpu {

// A convolution's geometry with concrete shapes (by value into kernels).
struct ConvGeom {
  int nsp = 0;
  int64_t N = 0, C = 0, M = 0, group = 1;
  int64_t in[3] = {}, kernel[3] = {}, out[3] = {}, stride[3] = {}, dilation[3] = {};
  int64_t pad_begin[3] = {}, pad_end[3] = {};
};

// Conv: from the node's attributes and X/W shapes. ConvTranspose (transpose = true): pad_begin
// is where the output window starts in the full, unpadded transposed result.
Expected<ConvGeom> conv_geometry(const Node& n, const std::vector<int64_t>& x,
                                 const std::vector<int64_t>& w, bool transpose);
int64_t full_transpose_out(const ConvGeom& g, int axis);
bool symmetric_pads(const ConvGeom& g);
size_t padded_input_bytes(const ConvGeom& g, DataType t);

// kiln.FusedConvPool's max-pool (its "pool_" attributes, layers/conv_stem.cu): 2-D, one output,
// no dilation, no ceil mode, explicit pads.
struct PoolAttrs {
  int kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0, pb = 0, pr = 0;
};
bool read_pool(const Node& n, PoolAttrs* p, std::string* why);
bool is_conv_pool(const Node& n);
// What kiln's stem kernels need of the layer: a 2-D, ungrouped convolution with constant weights
// and bias, no residual, an activation they know. Returns the weights (nullptr and why if not).
const Tensor* plain_conv(const LayerDesc& d, std::string* why);
class DeviceMemory;
// A stem kernel's device copy: its weights (w_bytes from w), then its float bias 256-byte aligned
// after them, in one allocation `mem` reserves; returns the bias's device address.
Expected<float*> upload_weights_and_bias(DeviceMemory& mem, const void* w, size_t w_bytes,
                                         const std::vector<float>& bias, const std::string& what);

Status cudnn_check(cudnnStatus_t s, const char* what);
cudnnDataType_t cudnn_type(DataType t);

struct CudnnConvDescs {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  CudnnConvDescs() = default;
  CudnnConvDescs(const CudnnConvDescs&) = delete;
  CudnnConvDescs& operator=(const CudnnConvDescs&) = delete;
  ~CudnnConvDescs();
  // padded_input: x is the explicitly padded copy (pads 0 in the descriptor).
  Status set(const ConvGeom& g, DataType dt, Precision prec, bool nhwc, bool transpose,
             bool padded_input);
};

// y = act(y + bias[c] + z) in place (bias [C] and z of y's shape and layout, either optional).
Status launch_conv_epilogue(const DeviceTensor& y, const DeviceTensor* bias, const DeviceTensor* z,
                            const ActParams& act, cudaStream_t s);
// x [N, C, in...] (linear or NHWC) -> a zero-padded copy of the same layout.
Status launch_pad_input(const DeviceTensor& x, void* out, const ConvGeom& g, cudaStream_t s);

}  // namespace kiln::gpu

namespace kiln::gpu {
// ConvTranspose's last step: the output window of the full result, plus bias (linear layout).
Status launch_crop_bias(const void* full, const std::vector<int64_t>& full_shape,
                        const DeviceTensor& y, const DeviceTensor* bias, const ConvGeom& g,
                        cudaStream_t s);
}  // namespace kiln::gpu
