#include "perf/model_io.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <random>

#include "perf/input_data.h"

namespace kiln::perf {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ","));
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
  KILN_ASSIGN_OR_RETURN(InputSource source, InputSource::open(input_data));
  std::map<std::string, std::vector<int64_t>> all_shapes = shapes;
  all_shapes.insert(source.shapes().begin(), source.shapes().end());  // --shape comes first
  std::mt19937_64 rng(seed);
  for (const TensorMeta& t : meta.inputs) {
    const size_t item = datatype_size(t.datatype);
    if (item == 0)
      return KILN_ERROR("input '{}' is {}, a datatype kiln perf does not generate", t.name,
                        t.datatype);
    InputPlan in;
    in.tensor = t;
    KILN_ASSIGN_OR_RETURN(in.tensor.shape, resolve_shape(t, batch, all_shapes));
    uint64_t count = 1;
    for (int64_t d : in.tensor.shape) count *= static_cast<uint64_t>(d);
    if (count * item > (uint64_t{1} << 32))
      return KILN_ERROR("input '{}' of shape {} is over 4 GiB a request", t.name,
                        shape_text(in.tensor.shape));
    in.data.assign(count * item, '\0');
    const bool batching = !t.shape.empty() && t.shape[0] == -1;
    KILN_RETURN_IF_ERROR(source.fill(t, batching ? static_cast<uint64_t>(batch) : 1, in.data, rng));
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
