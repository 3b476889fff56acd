// NumPy .npy files (format versions 1.0-3.0, little-endian, C order).
#pragma once

#include <string>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

Expected<Tensor> read_npy(const std::string& path);
// bfloat16 has no NumPy type: such tensors are written as float32.
Status write_npy(const std::string& path, const Tensor& t);

}  // namespace kiln
