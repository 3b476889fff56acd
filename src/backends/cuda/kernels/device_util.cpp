#include <cuda_runtime.h>

#include "kernels/device_util.cuh"

namespace kiln::gpu {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

StridedIndex broadcast_index(const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& out_shape) {
  StridedIndex ix;
  ix.rank = static_cast<int>(out_shape.size());
  const auto in_strides = row_major_strides(in_shape);
  const size_t lead = out_shape.size() - in_shape.size();
  for (size_t d = 0; d < out_shape.size(); ++d) {
    ix.dims[d] = out_shape[d];
    if (d < lead) continue;
    const size_t k = d - lead;
    ix.strides[d] = in_shape[k] == 1 && out_shape[d] != 1 ? 0 : in_strides[k];
  }
  return ix;
}

void coalesce_dims(std::vector<int64_t>& dims, std::vector<std::vector<int64_t>>& strides) {
  if (dims.empty()) return;
  std::vector<int64_t> nd{dims[0]};
  std::vector<std::vector<int64_t>> ns(strides.size());
  for (size_t k = 0; k < strides.size(); ++k) ns[k] = {strides[k][0]};
  for (size_t d = 1; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;  // a size-1 dimension never moves the offset
    bool merge = true;
    for (size_t k = 0; k < strides.size(); ++k)
      merge &= ns[k].back() == strides[k][d] * dims[d];
    if (nd.back() == 1) {  // a leading size-1 dimension: replace it
      nd.back() = dims[d];
      for (size_t k = 0; k < strides.size(); ++k) ns[k].back() = strides[k][d];
      continue;
    }
    if (merge) {
      nd.back() *= dims[d];
      for (size_t k = 0; k < strides.size(); ++k) ns[k].back() = strides[k][d];
    } else {
      nd.push_back(dims[d]);
      for (size_t k = 0; k < strides.size(); ++k) ns[k].push_back(strides[k][d]);
    }
  }
  dims = std::move(nd);
  strides = std::move(ns);
}

}  // namespace kiln::gpu
