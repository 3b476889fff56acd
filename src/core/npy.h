// NumPy .npy files (format versions 1.0-3.0, little-endian, C order).
#pragma once

#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

Expected<Tensor> read_npy(const std::string& path);
// The element type and shape of a .npy file, from its header only (the data is not read; its
// size is checked against the shape).
struct NpyInfo {
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> shape;
};
Expected<NpyInfo> read_npy_info(const std::string& path);
// bfloat16 has no NumPy type: such tensors are written as float32.
Status write_npy(const std::string& path, const Tensor& t);

}  // namespace kiln
