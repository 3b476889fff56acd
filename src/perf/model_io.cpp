#include "perf/model_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/types.h"

namespace kiln::perf {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ","));
}

// Random values of the datatype: floats in [-1, 1), integers in [0, 64) (valid as indices
// and token ids of small vocabularies), booleans 0 or 1.
void fill_random(const std::string& dt, std::string& out, std::mt19937_64& rng) {
  const size_t n = out.size() / datatype_size(dt);
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int> small(0, 63);
  auto put = [&](auto value, size_t i) {
    std::memcpy(out.data() + i * sizeof(value), &value, sizeof(value));
  };
  for (size_t i = 0; i < n; ++i) {
    if (dt == "FP32")
      put(real(rng), i);
    else if (dt == "FP64")
      put(static_cast<double>(real(rng)), i);
    else if (dt == "FP16")
      put(float_to_half(real(rng)), i);
    else if (dt == "BF16")
      put(float_to_bfloat16(real(rng)), i);
    else if (dt == "BOOL")
      put(static_cast<uint8_t>(small(rng) & 1), i);
    else if (dt == "INT8" || dt == "UINT8")
      put(static_cast<uint8_t>(small(rng)), i);
    else if (dt == "INT16" || dt == "UINT16")
      put(static_cast<uint16_t>(small(rng)), i);
    else if (dt == "INT32" || dt == "UINT32")
      put(static_cast<uint32_t>(small(rng)), i);
    else
      put(static_cast<uint64_t>(small(rng)), i);  // INT64, UINT64
  }
}

}  // namespace

size_t datatype_size(const std::string& dt) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1},   {"UINT8", 1}, {"INT8", 1},   {"UINT16", 2}, {"INT16", 2},
      {"FP16", 2},   {"BF16", 2},  {"UINT32", 4}, {"INT32", 4},  {"FP32", 4},
      {"UINT64", 8}, {"INT64", 8}, {"FP64", 8}};
  auto it = kSizes.find(dt);
  return it == kSizes.end() ? 0 : it->second;
}

Expected<std::vector<int64_t>> resolve_shape(
    const TensorMeta& t, int batch, const std::map<std::string, std::vector<int64_t>>& shapes) {
  const bool batching = !t.shape.empty() && t.shape[0] == -1;
  if (!batching && batch != 1)
    return KILN_ERROR(
        "-b {}: input '{}' of shape {} has no dynamic batch dimension, so the model "
        "takes -b 1 only",
        batch, t.name, shape_text(t.shape));
  std::vector<int64_t> rest(t.shape.begin() + (batching ? 1 : 0), t.shape.end());
  auto given = shapes.find(t.name);
  const char* past = batching ? " past the batch" : "";
  if (given != shapes.end()) {
    if (given->second.size() != rest.size())
      return KILN_ERROR("--shape {}: {} dims given, input '{}' of shape {} has {}{}", t.name,
                        given->second.size(), t.name, shape_text(t.shape), rest.size(), past);
    for (size_t i = 0; i < rest.size(); ++i) {
      if (rest[i] >= 0 && rest[i] != given->second[i])
        return KILN_ERROR("--shape {}:{}: input '{}' of shape {} has {} there, not {}", t.name,
                          fmt::join(given->second, ","), t.name, shape_text(t.shape), rest[i],
                          given->second[i]);
      rest[i] = given->second[i];
    }
  }
  for (int64_t d : rest)
    if (d < 0)
      return KILN_ERROR(
          "input '{}' of shape {} has dynamic dims: give its {} dim{}{} with --shape {}:D1,...",
          t.name, shape_text(t.shape), rest.size(), rest.size() == 1 ? "" : "s", past, t.name);
  if (batching) rest.insert(rest.begin(), batch);
  return rest;
}

Expected<RequestPlan> make_plan(const ModelMeta& meta, const std::string& version, int batch,
                                const std::map<std::string, std::vector<int64_t>>& shapes,
                                const std::string& input_data, uint64_t output_shm_size,
                                uint64_t seed) {
  RequestPlan plan;
  plan.model = meta.name;
  plan.version = version;
  if (meta.inputs.empty()) return KILN_ERROR("model '{}' declares no inputs", meta.name);
  for (const auto& [name, dims] : shapes) {
    bool known = false;
    for (const TensorMeta& t : meta.inputs) known = known || t.name == name;
    if (!known) {
      std::vector<std::string> names;
      for (const TensorMeta& t : meta.inputs) names.push_back(t.name);
      return KILN_ERROR("--shape {}: model '{}' has no such input (its inputs: {})", name,
                        meta.name, fmt::join(names, ", "));
    }
  }
  const bool random = input_data == "random", zero = input_data == "zero";
  if (!random && !zero && !std::filesystem::is_directory(input_data))
    return KILN_ERROR(
        "--input-data takes random, zero or a folder of raw files named after the "
        "inputs; '{}' is none of them",
        input_data);
  std::mt19937_64 rng(seed);
  for (const TensorMeta& t : meta.inputs) {
    const size_t item = datatype_size(t.datatype);
    if (item == 0)
      return KILN_ERROR("input '{}' is {}, a datatype kiln perf does not generate", t.name,
                        t.datatype);
    InputPlan in;
    in.tensor = t;
    KILN_ASSIGN_OR_RETURN(in.tensor.shape, resolve_shape(t, batch, shapes));
    uint64_t count = 1;
    for (int64_t d : in.tensor.shape) count *= static_cast<uint64_t>(d);
    if (count * item > (uint64_t{1} << 32))
      return KILN_ERROR("input '{}' of shape {} is over 4 GiB a request", t.name,
                        shape_text(in.tensor.shape));
    in.data.assign(count * item, '\0');
    if (random) {
      fill_random(t.datatype, in.data, rng);
    } else if (!zero) {
      const auto path = std::filesystem::path(input_data) / t.name;
      std::ifstream f(path, std::ios::binary);
      if (!f) return KILN_ERROR("--input-data: no file '{}' for input '{}'", path.string(), t.name);
      const std::string bytes((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
      if (bytes.size() != in.data.size())
        return KILN_ERROR("--input-data: '{}' holds {} bytes, input '{}' of shape {} {} takes {}",
                          path.string(), bytes.size(), t.name, shape_text(in.tensor.shape),
                          t.datatype, in.data.size());
      in.data = bytes;
    }
    plan.inputs.push_back(std::move(in));
  }
  for (const TensorMeta& t : meta.outputs) {
    OutputPlan out;
    out.name = t.name;
    out.bytes = output_shm_size;
    const size_t item = datatype_size(t.datatype);
    bool known = item > 0;
    uint64_t count = 1;
    for (size_t i = 0; i < t.shape.size() && known; ++i) {
      if (t.shape[i] >= 0)
        count *= static_cast<uint64_t>(t.shape[i]);
      else if (i == 0)
        count *= static_cast<uint64_t>(batch);
      else
        known = false;
    }
    if (known) {
      // The larger of the two: a leading -1 that is not the batch (a detector's boxes) fits
      // in --output-shared-memory-size as it would without the metadata.
      out.bytes = std::max(count * item, output_shm_size);
      out.known = true;
    }
    plan.outputs.push_back(std::move(out));
  }
  return plan;
}

}  // namespace kiln::perf
