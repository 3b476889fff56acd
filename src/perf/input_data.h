// Where kiln perf's input data comes from (--input-data): random values, zeros, a folder of raw
// files named after the inputs, or a JSON file in perf_analyzer's format (its first entry:
// {"data": [{"NAME": [values...] or {"content": [values...], "shape": [dims past the batch]}}]}).
// Data of one sample is repeated over the batch.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "perf/model_io.h"

namespace kiln::perf {

class InputSource {
 public:
  static Expected<InputSource> open(const std::string& spec);
  // The dims past the batch that a JSON file gives with its "shape"s.
  const std::map<std::string, std::vector<int64_t>>& shapes() const { return shapes_; }
  // Fills `out` (already the request's size) with input `t`'s data; `rows`: the samples of the
  // request (the batch), over which one sample's data is repeated.
  Status fill(const TensorMeta& t, uint64_t rows, std::string& out, std::mt19937_64& rng) const;

 private:
  enum class Kind { kRandom, kZero, kFolder, kJson } kind_ = Kind::kRandom;
  std::string path_;
  nlohmann::json entry_;  // the JSON file's first entry
  std::map<std::string, std::vector<int64_t>> shapes_;
};

// Random values of a datatype into `out`: floats in [-1, 1), integers in [0, 64) (valid as
// indices and token ids of small vocabularies), booleans 0 or 1.
void fill_random(const std::string& datatype, std::string& out, std::mt19937_64& rng);

}  // namespace kiln::perf
