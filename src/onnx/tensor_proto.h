// ONNX TensorProto <-> kiln Tensor, including external data files.
#pragma once

#include <string>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace onnx {
class TensorProto;
}

namespace kiln {

// Converts a TensorProto. `base_dir` resolves external data locations; `where` names the
// tensor in error messages (e.g. "initializer 'conv1.weight'").
Expected<Tensor> tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir,
                                   const std::string& where);
// Reads a serialized TensorProto file (.pb), as in the ONNX test data.
Expected<Tensor> read_tensor_pb_file(const std::string& path);
// Reads the name stored in a serialized TensorProto file ("" when unnamed).
Expected<std::string> read_tensor_pb_name(const std::string& path);

}  // namespace kiln
