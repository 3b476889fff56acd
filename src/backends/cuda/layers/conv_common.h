// What the convolution tactics share: geometry, cuDNN descriptors, the epilogue and padding
// kernels (layers/conv.cu) used by conv_layers.cpp and conv_fused.cpp.
#pragma once

#include <cuda_fp16.h>
#include <cudnn.h>

#include <string>
#include <vector>

#include "device_util_host.h"
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
// The persistent INT8 1x1 kernels' checks (conv_int8.cu): a 1x1 convolution without padding
// (weights w, attributes a), and an activation compiled in (none or ReLU); else why not.
bool unpadded_1x1(const Attributes& a, const Tensor* w, std::string* why);
bool none_or_relu(const Node& n, std::string* why);
// A stem kernel's float16 weights (in the kernel's own order, filled by its layer) and float
// bias (the layer's constant input 2, or zeros), built on the host when the layer is created and
// copied into one device allocation at its first configure, the bias 256-byte aligned after them.
struct StemWeights {
  std::vector<__half> w;
  std::vector<float> b;
  DeviceMemory mem;
  const float* bias = nullptr;  // device address, once uploaded

  void read_bias(const LayerDesc& d, int K);
  Status upload_once(const std::string& what);
  const __half* weights() const { return static_cast<const __half*>(mem.get()); }
};

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
