// A served model: one engine file loaded once per device, the shapes it takes, and how its
// requests are checked. The model repository finds them in a folder.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/engine.h"
#include "serve/types.h"

namespace kiln::serve {

// One input as the engine declares it, with its optimization profile's range.
struct InputSpec {
  std::string name;
  DataType dtype = DataType::kUndefined;
  std::vector<int64_t> dims;           // -1: dynamic
  std::vector<int64_t> min, opt, max;  // empty without a profile
};

// An engine loaded on one device (-1: the cpu backend, or the current GPU).
struct DeviceEngine {
  int device = -1;
  std::string label;  // how /metrics names it: "cpu", "cuda:0"
  std::unique_ptr<Engine> engine;
};

class ServedModel {
 public:
  // Loads `path` once per device of `devices` (an engine for the cpu backend loads once;
  // `devices` empty: where the engine was built for). `max_batch_cap` 0: the profile's.
  static Expected<std::unique_ptr<ServedModel>> load(const std::string& name,
                                                     const std::string& version,
                                                     const std::string& path,
                                                     const std::vector<int>& devices,
                                                     int max_batch_cap);

  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  const std::string& path() const { return path_; }
  const Engine& engine() const { return *engines_.front().engine; }
  std::vector<DeviceEngine>& engines() { return engines_; }
  const std::vector<InputSpec>& inputs() const { return inputs_; }
  const std::vector<TensorInfo>& outputs() const { return engine().outputs(); }
  // The largest batch one inference takes; 1 when the engine's first dimensions are fixed
  // (then requests are not joined).
  int max_batch() const { return max_batch_; }

  // Checks `req`'s inputs against the engine (names, datatypes, shapes, the profile's range,
  // one batch across inputs) and puts them in the engine's input order. Returns the batch
  // (the first dimension; 1 when not batching).
  Result<int> check_request(InferRequest& req) const;
  // Checks the outputs a request names; fills in every output when it names none.
  Check check_outputs(InferRequest& req) const;
  // Index of output `name` in the engine's outputs, or -1.
  int output_index(const std::string& name) const;

 private:
  std::string name_, version_, path_;
  std::vector<DeviceEngine> engines_;
  std::vector<InputSpec> inputs_;
  int max_batch_ = 1;
};

// The largest batch for an engine's inputs and outputs (Python's batching.batch_limit): every
// input's and output's first dimension dynamic, the profile's max of it (at most `cap` when
// given), else `cap` (default 32); 1 otherwise.
int batch_limit(const Engine& e, const std::vector<InputSpec>& specs, int cap);
// The input specs of an engine, profile ranges from its build options.
std::vector<InputSpec> input_specs(const Engine& e);

// A model found in a repository folder: NAME.kiln, NAME/model.kiln, or Triton's layout
// NAME/<version>/model.kiln (several versions; the highest is the default).
struct RepositoryEntry {
  std::string name, version, path;
};
Expected<std::vector<RepositoryEntry>> find_models(const std::string& repository);

}  // namespace kiln::serve
