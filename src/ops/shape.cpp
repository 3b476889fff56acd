// The shape op family table (the ops themselves live in src/ops/shape_*.cpp) and the helpers
// shared with the index family.
#include <vector>

#include "ops/shape_util.h"
#include "ops/shape_values.h"

namespace kiln {
namespace shape_detail {

namespace {
template <size_t E>
void copy_rows(const uint8_t* src, int64_t offset, const std::vector<int64_t>& strides,
               uint8_t* dst, const std::vector<int64_t>& shape) {
  const size_t rank = shape.size();
  const int64_t n = product(shape);
  if (n == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src + offset * static_cast<int64_t>(E), E);
    return;
  }
  const int64_t inner = shape[rank - 1];
  const int64_t inner_stride = strides[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  int64_t base = offset;  // source element offset of idx (with idx[rank-1] == 0)
  for (int64_t o = 0; o < n; o += inner) {
    for (int64_t i = 0; i < inner; ++i)
      std::memcpy(dst + (o + i) * static_cast<int64_t>(E),
                  src + (base + i * inner_stride) * static_cast<int64_t>(E), E);
    for (int64_t k = static_cast<int64_t>(rank) - 2; k >= 0; --k) {
      ++idx[k];
      base += strides[k];
      if (idx[k] < shape[k]) break;
      base -= idx[k] * strides[k];
      idx[k] = 0;
    }
  }
}
}  // namespace

void strided_copy(const void* src, int64_t offset, const std::vector<int64_t>& strides, void* dst,
                  const std::vector<int64_t>& out_shape, size_t esize) {
  auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  switch (esize) {
    case 1: return copy_rows<1>(s, offset, strides, d, out_shape);
    case 2: return copy_rows<2>(s, offset, strides, d, out_shape);
    case 4: return copy_rows<4>(s, offset, strides, d, out_shape);
    default: return copy_rows<8>(s, offset, strides, d, out_shape);
  }
}

std::optional<int64_t> static_product(std::span<const Dim> dims) {
  int64_t p = 1;
  bool unknown = false, overflow = false;
  for (const Dim& d : dims) {
    if (d.is_static()) {
      if (d.value == 0) return 0;
      overflow = overflow || __builtin_mul_overflow(p, d.value, &p);
    } else {
      unknown = true;
    }
  }
  if (unknown || overflow) return std::nullopt;  // a product past int64 is no size (fuzzing)
  return p;
}

Dim dim_product(std::span<const Dim> dims) {
  Dim p(1);
  for (const Dim& d : dims) p = mul_dims(p, d);
  return p;
}

int64_t product(std::span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

Expected<std::vector<int64_t>> int_values(const Tensor& t, const Node& n, const char* what) {
  if (!dtype_is_integer(t.dtype()))
    return KILN_ERROR("{}: {} must be an integer tensor, got {}", n.label(), what, t.desc());
  return t.to_int64_vector();
}

}  // namespace shape_detail

std::span<const OpDef> shape_ops() {
  static const std::vector<OpDef> table = [] {
    std::vector<OpDef> t;
    for (auto f : {shape_detail::reshape_like_ops, shape_detail::concat_like_ops,
                   shape_detail::slice_ops, shape_detail::constant_ops})
      for (const OpDef& d : f()) t.push_back(d);
    return t;
  }();
  return table;
}

}  // namespace kiln
