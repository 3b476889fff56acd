// Owning device allocation (cudaMalloc; no managed memory).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace kiln::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    swap(o);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  // Returns false (and holds nothing) when the allocation fails.
  bool allocate(size_t bytes) {
    if (bytes <= bytes_ && ptr_) return true;
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    if (bytes == 0) return true;
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    bytes_ = bytes;
    return true;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void swap(DeviceBuffer& o) {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln::cuda
