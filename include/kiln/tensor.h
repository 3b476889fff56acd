// A host tensor: element type, concrete shape and a shared, 64-byte aligned buffer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/types.h"

namespace kiln {

class Tensor {
 public:
  Tensor() = default;
  // Allocates a zero-filled tensor.
  Tensor(DataType dtype, std::vector<int64_t> shape);
  // Wraps external memory kept alive by `owner` (e.g. a mapped engine file). No copy.
  static Tensor view(DataType dtype, std::vector<int64_t> shape, const void* data,
                     std::shared_ptr<const void> owner);
  // A tensor from host values; shape {} is a scalar.
  template <typename T>
  static Tensor from(std::vector<int64_t> shape, const std::vector<T>& values) {
    Tensor t(DTypeOf<T>::value, std::move(shape));
    for (size_t i = 0; i < values.size() && i < static_cast<size_t>(t.numel()); ++i)
      t.data<T>()[i] = values[i];
    return t;
  }
  template <typename T>
  static Tensor scalar(T v) { return from<T>({}, {v}); }

  bool empty_storage() const { return dtype_ == DataType::kUndefined; }
  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const { return shape_[i < 0 ? i + rank() : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  template <typename T> T* data() { return static_cast<T*>(raw()); }
  template <typename T> const T* data() const { return static_cast<const T*>(raw()); }
  void* raw();  // copies first if the buffer is shared read-only (copy on write)
  const void* raw() const { return data_; }

  // A tensor sharing this buffer with another shape of the same element count.
  Expected<Tensor> reshaped(std::vector<int64_t> shape) const;
  // A deep copy with its own buffer.
  Tensor clone() const;
  // Element i converted to double / int64 (for tests, printing and small index tensors).
  double at_double(int64_t i) const;
  int64_t at_int(int64_t i) const;
  // All elements as int64 (for shape-like inputs: axes, pads, starts, ...).
  std::vector<int64_t> to_int64_vector() const;
  // Converts to another element type (float->int truncates toward zero, like a C cast).
  Tensor cast(DataType to) const;
  // "float32[1,3,224,224]"
  std::string desc() const;

 private:
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> shape_;
  std::shared_ptr<void> storage_;        // owned buffer, or the keep-alive of a view
  void* data_ = nullptr;
  bool read_only_ = false;               // true for views of external memory
};

std::string shape_str(const std::vector<int64_t>& shape);  // "[1,3,224,224]"

}  // namespace kiln
