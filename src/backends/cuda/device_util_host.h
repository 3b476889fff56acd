// Host-side helpers of the CUDA backend's runtime: converting host tensors into a device
// format, random fills for tuning, library handles.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "layer.h"

namespace kiln::gpu {

// `t` converted to the storage format `f` (element type; NHWC order for a 4-D tensor).
Expected<Tensor> to_device_format(const Tensor& t, const TensorFormat& f);
// The inverse: a host tensor in format `f` back to a logical tensor of type `to`.
Expected<Tensor> from_device_format(const Tensor& t, const TensorFormat& f, DataType to);

// A device tensor copied to the host (synchronously: the stream is synchronized first) and
// converted to a logical tensor of type `to` (NCHW order, FP16 storage widened).
Expected<Tensor> copy_to_host(const DeviceTensor& t, DataType to, cudaStream_t s);

// Uniform random values in [-1, 1] (integers in [-4, 4], bools random) of `dtype` on the device.
Status fill_random(void* data, DataType dtype, int64_t count, uint64_t seed, cudaStream_t s);

// One stream's library handles (cuDNN, cuBLAS, cuBLASLt), created together, destroyed together.
class LibraryHandles {
 public:
  static Expected<std::unique_ptr<LibraryHandles>> create(cudaStream_t stream);
  ~LibraryHandles();
  void bind(RunContext& rc) const;

 private:
  LibraryHandles() = default;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublaslt_ = nullptr;
};

// "NVIDIA H100 80GB HBM3 sm_90 cudnn 91400 cublas 130000": what tuned times depend on.
std::string device_signature();

// Host: whether a device address allows 16-byte vector accesses.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The current device's SM count (looked up once per device; 0 when CUDA cannot say): persistent
// kernels size their grids by it. No stream work, so callable during a CUDA-graph capture.
int sm_count();

// A device allocation that reports failure as "out of GPU memory" naming what it was for.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  Status reserve(size_t bytes, const std::string& what);
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln::gpu
