// What a kiln perf request holds: the model's inputs and outputs as its metadata declares them,
// the shapes a run sends (the batch from -b, dynamic dims from --shape) and the input data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::perf {

struct TensorMeta {
  std::string name, datatype;  // datatype: the protocol's ("FP32")
  std::vector<int64_t> shape;  // -1: a dynamic dimension
};

struct ModelMeta {
  std::string name;
  std::vector<TensorMeta> inputs, outputs;
};

// Bytes of one element of a v2 datatype; 0 for one kiln perf cannot send (BYTES, unknown).
size_t datatype_size(const std::string& datatype);

// An input as every request sends it.
struct InputPlan {
  TensorMeta tensor;  // the shape resolved: every dim known
  std::string data;   // its bytes
};
// An output the requests ask for; `bytes`: its size where the metadata fixes it, else the
// --output-shared-memory-size a shared memory region reserves for it.
struct OutputPlan {
  std::string name;
  uint64_t bytes = 0;
  bool known = false;
};
struct RequestPlan {
  std::string model, version;
  std::vector<InputPlan> inputs;
  std::vector<OutputPlan> outputs;
};

// A leading dimension of -1 is the batch (filled by `batch`); every other -1 must come from
// `shapes` (the dims past the batch, as perf_analyzer's --shape). A model without a dynamic
// leading dimension does not batch, so `batch` must be 1.
Expected<std::vector<int64_t>> resolve_shape(
    const TensorMeta& t, int batch, const std::map<std::string, std::vector<int64_t>>& shapes);

// The plan of a run: shapes resolved, input data made (`input_data`: random, zero, a folder of
// raw files named after the inputs, or a JSON file: input_data.h).
Expected<RequestPlan> make_plan(const ModelMeta& meta, const std::string& version, int batch,
                                const std::map<std::string, std::vector<int64_t>>& shapes,
                                const std::string& input_data, uint64_t output_shm_size,
                                uint64_t seed);

}  // namespace kiln::perf
