#include "kiln/tensor.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/dispatch.h"
#include "core/low_bit.h"

namespace kiln {
namespace {

std::shared_ptr<void> allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

Tensor::Tensor(DataType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  storage_ = allocate(nbytes());
  data_ = storage_.get();
}

Tensor Tensor::view(DataType dtype, std::vector<int64_t> shape, const void* data,
                    std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.storage_ = std::const_pointer_cast<void>(owner);
  t.data_ = const_cast<void*>(data);
  t.read_only_ = true;
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

void* Tensor::raw() {
  if (read_only_) {
    auto fresh = allocate(nbytes());
    if (nbytes()) std::memcpy(fresh.get(), data_, nbytes());
    storage_ = fresh;
    data_ = storage_.get();
    read_only_ = false;
  }
  return data_;
}

Expected<Tensor> Tensor::reshaped(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n != numel())
    return KILN_ERROR("cannot reshape {} to {}: element counts differ", desc(), shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

double Tensor::at_double(int64_t i) const {
  if (dtype_is_low_bit(dtype_))
    return low_bit_to_float(dtype_, static_cast<const uint8_t*>(data_)[i]);
  return visit_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    return to_double(static_cast<const T*>(data_)[i]);
  });
}

int64_t Tensor::at_int(int64_t i) const {
  if (dtype_is_low_bit(dtype_)) return static_cast<int64_t>(at_double(i));
  return visit_dtype(dtype_, [&](auto tag) -> int64_t {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) return static_cast<int64_t>(static_cast<const T*>(data_)[i]);
    else return static_cast<int64_t>(to_double(static_cast<const T*>(data_)[i]));
  });
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[i] = at_int(i);
  return v;
}

// Low-bit types (no C++ type for visit_dtype) go through float: exact for every value they
// hold; casting to float8 saturates (ONNX's default), to int4/uint4 wraps like other integers.
static Tensor cast_low_bit(const Tensor& x, DataType to) {
  Tensor out(to, x.shape());
  auto* dst = static_cast<uint8_t*>(out.raw());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.at_double(i);
    if (dtype_is_float8(to)) {
      dst[i] = float_to_float8(to, static_cast<float>(v), /*saturate=*/true);
    } else if (to == DataType::kInt4 || to == DataType::kUInt4) {
      dst[i] = low_bit::wrap4(to, convert<int64_t>(v));
    } else {
      visit_dtype(to, [&](auto tag) {
        using To = decltype(tag);
        static_cast<To*>(out.raw())[i] = convert<To>(v);
        return 0;
      });
    }
  }
  return out;
}

Tensor Tensor::cast(DataType to) const {
  if (dtype_is_low_bit(dtype_) || dtype_is_low_bit(to)) return cast_low_bit(*this, to);
  Tensor out(to, shape_);
  const int64_t n = numel();
  visit_dtype(dtype_, [&](auto from_tag) {
    using From = decltype(from_tag);
    const From* src = static_cast<const From*>(data_);
    visit_dtype(to, [&](auto to_tag) {
      using To = decltype(to_tag);
      To* dst = static_cast<To*>(out.data_);
      for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
      return 0;
    });
    return 0;
  });
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

std::string Tensor::desc() const { return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_)); }

}  // namespace kiln
