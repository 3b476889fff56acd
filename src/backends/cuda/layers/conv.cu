// Convolution tactics: Conv, kiln.FusedConv and ConvTranspose.
//   cudnn.conv        cuDNN's convolution API: any rank (1-3 spatial axes), groups, dilations,
//                     float/half/double, NCHW or NHWC; the tuner times cuDNN's algorithms
//                     (variants); bias, residual and activation follow in one epilogue pass.
//   cudnn.convt       ConvTranspose through cuDNN's backward-data convolution.
// conv_fused.cu adds the kernel study's fused tactics (cuDNN graph API, cuBLASLt 1x1).
#include <cudnn.h>

#include <algorithm>

#include "kernels/activation.cuh"
#include "kernels/device_util.cuh"
#include "layers/conv_common.h"
#include "ops/conv.h"
#include "tactics.h"

namespace kiln::gpu {

Status cudnn_check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return Status::Ok();
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return KILN_ERROR("{}: {}{}{}", what, cudnnGetErrorString(s), last[0] ? " — " : "", last);
}

namespace {

template <typename T>
__global__ void conv_epilogue_kernel(T* y, const T* bias, const T* z, int64_t n, int64_t C,
                                     int64_t spatial, bool nhwc, ActParams act) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  KILN_GRID_STRIDE(i, n) {
    A v = static_cast<A>(load(y, i));
    if (bias) v += static_cast<A>(load(bias, nhwc ? i % C : (i / spatial) % C));
    if (z) v += static_cast<A>(load(z, i));
    store(y, i, apply_act<A>(v, act));
  }
}

// Copies x into a zero-padded buffer of the same layout: `m` iterates the padded tensor in
// storage order; sp[d] is the spatial axis of storage dim d (-1 for N and C).
struct PadMap {
  int rank = 0;
  int64_t dims[5] = {};
  int64_t in_strides[5] = {};
  int sp[5] = {};
};
template <typename T>
__global__ void pad_input_kernel(const T* x, T* out, int64_t n_out, PadMap m, ConvGeom g) {
  KILN_GRID_STRIDE(i, n_out) {
    int64_t rem = i, in_off = 0;
    bool inside = true;
    for (int d = m.rank - 1; d >= 0; --d) {
      const int64_t c = rem % m.dims[d];
      rem /= m.dims[d];
      int64_t src = c;
      if (m.sp[d] >= 0) {
        src = c - g.pad_begin[m.sp[d]];
        if (src < 0 || src >= g.in[m.sp[d]]) inside = false;
      }
      in_off += src * m.in_strides[d];
    }
    out[i] = inside ? x[in_off] : T(0);
  }
}

}  // namespace

Status launch_conv_epilogue(const DeviceTensor& y, const DeviceTensor* bias, const DeviceTensor* z,
                            const ActParams& act, cudaStream_t s) {
  const int64_t n = y.numel();
  if (n == 0 || (!bias && !z && act.act == Act::kNone)) return Status::Ok();
  const int64_t C = y.shape[1];
  int64_t spatial = 1;
  for (size_t d = 2; d < y.shape.size(); ++d) spatial *= y.shape[d];
  const bool nhwc = y.layout == Layout::kNHWC;
  const bool ok = dispatch_float(y.dtype, [&](auto t) {
    using T = decltype(t);
    conv_epilogue_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<T*>(y.data), bias ? static_cast<const T*>(bias->data) : nullptr,
        z ? static_cast<const T*>(z->data) : nullptr, n, C, spatial, nhwc, act);
  });
  if (!ok) return KILN_ERROR("conv epilogue: unsupported type {}", dtype_name(y.dtype));
  KILN_CUDA_LAUNCH_CHECK("conv epilogue");
  return Status::Ok();
}

cudnnDataType_t cudnn_type(DataType t) {
  switch (t) {
    case DataType::kFloat16: return CUDNN_DATA_HALF;
    case DataType::kFloat64: return CUDNN_DATA_DOUBLE;
    default: return CUDNN_DATA_FLOAT;
  }
}

Expected<ConvGeom> conv_geometry(const Node& n, const std::vector<int64_t>& x,
                                 const std::vector<int64_t>& w, bool transpose) {
  auto p = transpose ? conv_transpose_params(n, x, w) : conv_params(n, x, w);
  if (!p.ok()) return p.status();
  ConvGeom g;
  g.nsp = static_cast<int>(p->in.size());
  if (g.nsp < 1 || g.nsp > 3) return KILN_ERROR("{} spatial axes (cuDNN takes 1 to 3)", g.nsp);
  g.N = p->N;
  g.C = p->C;
  g.M = p->M;
  g.group = p->group;
  for (int d = 0; d < g.nsp; ++d) {
    g.in[d] = p->in[d];
    g.kernel[d] = p->kernel[d];
    g.out[d] = p->out[d];
    g.stride[d] = p->strides[d];
    g.dilation[d] = p->dilations[d];
    g.pad_begin[d] = p->pads_begin[d];
    if (transpose) {
      // Full (unpadded) transposed output, then the window [pad_begin, pad_begin + out).
      g.pad_end[d] = 0;
    } else {
      g.pad_end[d] = (g.out[d] - 1) * g.stride[d] + g.dilation[d] * (g.kernel[d] - 1) + 1 -
                     g.in[d] - g.pad_begin[d];
      if (g.pad_end[d] < 0) g.pad_end[d] = 0;  // the last window ends before the input does
    }
  }
  return g;
}

// --- descriptors --------------------------------------------------------------------------------
CudnnConvDescs::~CudnnConvDescs() {
  if (x) cudnnDestroyTensorDescriptor(x);
  if (y) cudnnDestroyTensorDescriptor(y);
  if (w) cudnnDestroyFilterDescriptor(w);
  if (conv) cudnnDestroyConvolutionDescriptor(conv);
}

namespace {

// Tensor descriptor of [N, C, sp...] (1-D gets a unit H axis: cuDNN needs 4-D or 5-D).
Status set_tensor(cudnnTensorDescriptor_t d, cudnnDataType_t t, int64_t N, int64_t C,
                  const int64_t* sp, int nsp, bool nhwc) {
  int dims[5], strides[5];
  int nd = 0;
  dims[nd++] = static_cast<int>(N);
  dims[nd++] = static_cast<int>(C);
  if (nsp == 1) dims[nd++] = 1;
  for (int i = 0; i < nsp; ++i) dims[nd++] = static_cast<int>(sp[i]);
  if (nhwc) {  // 2-D only
    strides[1] = 1;
    strides[3] = dims[1];
    strides[2] = dims[3] * dims[1];
    strides[0] = dims[2] * strides[2];
  } else {
    strides[nd - 1] = 1;
    for (int i = nd - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  }
  return cudnn_check(cudnnSetTensorNdDescriptor(d, t, nd, dims, strides),
                     "cudnnSetTensorNdDescriptor");
}

}  // namespace

Status CudnnConvDescs::set(const ConvGeom& g, DataType dt, Precision prec, bool nhwc,
                           bool transpose, bool padded_input) {
  if (!x) {
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor"));
    KILN_RETURN_IF_ERROR(cudnn_check(cudnnCreateConvolutionDescriptor(&conv),
                                     "cudnnCreateConvolutionDescriptor"));
  }
  const cudnnDataType_t t = cudnn_type(dt);
  int64_t xin[3], yout[3];
  for (int d = 0; d < g.nsp; ++d) {
    xin[d] = padded_input ? g.in[d] + g.pad_begin[d] + g.pad_end[d] : g.in[d];
    yout[d] = transpose ? full_transpose_out(g, d) : g.out[d];
  }
  // Forward: x -> y. Transposed (backward data): "y" is the small input, "x" the large output.
  KILN_RETURN_IF_ERROR(set_tensor(x, t, g.N, transpose ? g.M : g.C, transpose ? yout : xin, g.nsp, nhwc));
  KILN_RETURN_IF_ERROR(set_tensor(y, t, g.N, transpose ? g.C : g.M, transpose ? g.in : yout, g.nsp, nhwc));
  int fd[5], nfd = 0;
  fd[nfd++] = static_cast<int>(transpose ? g.C : g.M);
  fd[nfd++] = static_cast<int>(transpose ? g.M / g.group : g.C / g.group);
  if (g.nsp == 1) fd[nfd++] = 1;
  for (int d = 0; d < g.nsp; ++d) fd[nfd++] = static_cast<int>(g.kernel[d]);
  KILN_RETURN_IF_ERROR(cudnn_check(
      cudnnSetFilterNdDescriptor(w, t, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, nfd, fd),
      "cudnnSetFilterNdDescriptor"));
  int pads[3], strides[3], dil[3], nc = 0;
  if (g.nsp == 1) {
    pads[nc] = 0;
    strides[nc] = 1;
    dil[nc++] = 1;
  }
  for (int d = 0; d < g.nsp; ++d) {
    pads[nc] = (padded_input || transpose) ? 0 : static_cast<int>(g.pad_begin[d]);
    strides[nc] = static_cast<int>(g.stride[d]);
    dil[nc++] = static_cast<int>(g.dilation[d]);
  }
  const cudnnDataType_t comp = dt == DataType::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  KILN_RETURN_IF_ERROR(cudnn_check(cudnnSetConvolutionNdDescriptor(conv, nc, pads, strides, dil,
                                                                   CUDNN_CROSS_CORRELATION, comp),
                                   "cudnnSetConvolutionNdDescriptor"));
  KILN_RETURN_IF_ERROR(cudnn_check(cudnnSetConvolutionGroupCount(conv, static_cast<int>(g.group)),
                                   "cudnnSetConvolutionGroupCount"));
  // FP32: no tensor cores. TF32 (float32 storage): tensor cores, which on Ampere and later
  // round float32 to TF32, but never ALLOW_CONVERSION: that lets cuDNN convert float32 inputs to
  // float16, which overflows on large activations (a ResNet-50 TF32 engine gave 7% error). FP16
  // storage may convert freely.
  const cudnnMathType_t math = prec == Precision::kFP32 || dt == DataType::kFloat64
                                   ? CUDNN_FMA_MATH
                               : dt == DataType::kFloat16 ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                                                          : CUDNN_TENSOR_OP_MATH;
  return cudnn_check(cudnnSetConvolutionMathType(conv, math), "cudnnSetConvolutionMathType");
}

int64_t full_transpose_out(const ConvGeom& g, int d) {
  return (g.in[d] - 1) * g.stride[d] + g.dilation[d] * (g.kernel[d] - 1) + 1;
}

Status launch_pad_input(const DeviceTensor& x, void* out, const ConvGeom& g, cudaStream_t s) {
  PadMap m;
  const int rank = static_cast<int>(x.shape.size());
  m.rank = rank;
  const bool nhwc = x.layout == Layout::kNHWC && rank == 4;
  // Logical axis of each storage dim, and the input's strides per logical axis.
  int axis[5];
  for (int d = 0; d < rank; ++d) axis[d] = d;
  if (nhwc) { axis[1] = 2; axis[2] = 3; axis[3] = 1; }
  std::vector<int64_t> logical_strides = row_major_strides(x.shape);
  if (nhwc) {
    const int64_t C = x.shape[1], W = x.shape[3];
    logical_strides = {x.shape[2] * W * C, 1, W * C, C};
  }
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    const int a = axis[d];
    m.sp[d] = a >= 2 ? a - 2 : -1;
    m.dims[d] = a >= 2 ? g.in[a - 2] + g.pad_begin[a - 2] + g.pad_end[a - 2] : x.shape[a];
    m.in_strides[d] = logical_strides[a];
    n *= m.dims[d];
  }
  const bool ok = dispatch_bytes(dtype_size(x.dtype), [&](auto t) {
    using T = decltype(t);
    pad_input_kernel<T><<<grid_for(n), kBlock, 0, s>>>(static_cast<const T*>(x.data),
                                                       static_cast<T*>(out), n, m, g);
  });
  if (!ok) return KILN_ERROR("pad: bad element size");
  KILN_CUDA_LAUNCH_CHECK("conv input padding");
  return Status::Ok();
}

bool symmetric_pads(const ConvGeom& g) {
  for (int d = 0; d < g.nsp; ++d)
    if (g.pad_begin[d] != g.pad_end[d]) return false;
  return true;
}

size_t padded_input_bytes(const ConvGeom& g, DataType t) {
  int64_t n = g.N * g.C;
  for (int d = 0; d < g.nsp; ++d) n *= g.in[d] + g.pad_begin[d] + g.pad_end[d];
  return (static_cast<size_t>(n) * dtype_size(t) + 255) / 256 * 256;
}

}  // namespace kiln::gpu

namespace kiln::gpu {
namespace {

template <typename T>
__global__ void crop_bias_kernel(const T* full, T* y, const T* bias, int64_t n, int rank,
                                 StridedIndex y_ix, StridedIndex full_ix, ConvGeom g) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  KILN_GRID_STRIDE(i, n) {
    int64_t rem = i, off = 0;
    bool inside = true;
    int64_t channel = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t c = rem % y_ix.dims[d];
      rem /= y_ix.dims[d];
      int64_t src = c;
      if (d >= 2) {
        src = c + g.pad_begin[d - 2];
        if (src < 0 || src >= full_ix.dims[d]) inside = false;
      }
      if (d == 1) channel = c;
      off += src * full_ix.strides[d];
    }
    A v = inside ? static_cast<A>(load(full, off)) : A(0);
    if (bias) v += static_cast<A>(load(bias, channel));
    store(y, i, v);
  }
}

}  // namespace

// y [N, M, out...] = full[..., pad_begin + o] (0 outside) + bias[m]; both linear.
Status launch_crop_bias(const void* full, const std::vector<int64_t>& full_shape,
                        const DeviceTensor& y, const DeviceTensor* bias, const ConvGeom& g,
                        cudaStream_t s) {
  const int64_t n = y.numel();
  if (n == 0) return Status::Ok();
  StridedIndex yi, fi;
  yi.rank = fi.rank = static_cast<int>(y.shape.size());
  const auto fs = row_major_strides(full_shape);
  for (int d = 0; d < yi.rank; ++d) {
    yi.dims[d] = y.shape[d];
    fi.dims[d] = full_shape[d];
    fi.strides[d] = fs[d];
  }
  const bool ok = dispatch_float(y.dtype, [&](auto t) {
    using T = decltype(t);
    crop_bias_kernel<T><<<grid_for(n), kBlock, 0, s>>>(
        static_cast<const T*>(full), static_cast<T*>(y.data),
        bias ? static_cast<const T*>(bias->data) : nullptr, n, yi.rank, yi, fi, g);
  });
  if (!ok) return KILN_ERROR("conv transpose: unsupported type {}", dtype_name(y.dtype));
  KILN_CUDA_LAUNCH_CHECK("conv transpose crop");
  return Status::Ok();
}

}  // namespace kiln::gpu
