#include "perf/input_data.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/types.h"

namespace kiln::perf {
namespace {

using json = nlohmann::json;

template <typename T>
void put(std::string& out, size_t i, T v) {
  std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
}

// Stores number `v` as element i of datatype `dt`.
void put_value(const std::string& dt, std::string& out, size_t i, double v) {
  if (dt == "FP32")
    put(out, i, static_cast<float>(v));
  else if (dt == "FP64")
    put(out, i, v);
  else if (dt == "FP16")
    put(out, i, float_to_half(static_cast<float>(v)));
  else if (dt == "BF16")
    put(out, i, float_to_bfloat16(static_cast<float>(v)));
  else if (dt == "BOOL")
    put(out, i, static_cast<uint8_t>(v != 0));
  else if (dt == "INT8")
    put(out, i, static_cast<int8_t>(v));
  else if (dt == "UINT8")
    put(out, i, static_cast<uint8_t>(v));
  else if (dt == "INT16")
    put(out, i, static_cast<int16_t>(v));
  else if (dt == "UINT16")
    put(out, i, static_cast<uint16_t>(v));
  else if (dt == "INT32")
    put(out, i, static_cast<int32_t>(v));
  else if (dt == "UINT32")
    put(out, i, static_cast<uint32_t>(v));
  else if (dt == "INT64")
    put(out, i, static_cast<int64_t>(v));
  else
    put(out, i, static_cast<uint64_t>(v));  // UINT64
}

bool flatten(const json& v, std::vector<double>& out, int depth) {
  if (v.is_number() || v.is_boolean()) {
    out.push_back(v.is_boolean() ? double(v.get<bool>()) : v.get<double>());
    return true;
  }
  if (!v.is_array() || depth > 32) return false;
  for (const json& e : v)
    if (!flatten(e, out, depth + 1)) return false;
  return true;
}

// `data` (the bytes of one sample or of the whole request) into `out`, repeated over `rows`.
Status place(const std::string& data, uint64_t rows, std::string& out, const std::string& what) {
  if (data.size() == out.size()) {
    out = data;
    return Status::Ok();
  }
  if (rows > 1 && data.size() * rows == out.size()) {
    for (uint64_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + r * data.size(), data.data(), data.size());
    return Status::Ok();
  }
  return KILN_ERROR("--input-data: {} holds {} bytes; the request takes {}{}", what, data.size(),
                    out.size(), rows > 1 ? fmt::format(" ({} a sample)", out.size() / rows) : "");
}

}  // namespace

void fill_random(const std::string& dt, std::string& out, std::mt19937_64& rng) {
  const size_t n = out.size() / datatype_size(dt);
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int> small(0, 63);
  const bool floating = dt == "FP32" || dt == "FP64" || dt == "FP16" || dt == "BF16";
  for (size_t i = 0; i < n; ++i)
    put_value(dt, out, i, floating ? real(rng) : dt == "BOOL" ? small(rng) & 1 : small(rng));
}

Expected<InputSource> InputSource::open(const std::string& spec) {
  InputSource s;
  if (spec == "random") return s;
  if (spec == "zero") {
    s.kind_ = Kind::kZero;
    return s;
  }
  s.path_ = spec;
  if (std::filesystem::is_directory(spec)) {
    s.kind_ = Kind::kFolder;
    return s;
  }
  if (!std::filesystem::is_regular_file(spec))
    return KILN_ERROR(
        "--input-data takes random, zero, a folder of raw files named after the "
        "inputs or a JSON file; '{}' is none of them",
        spec);
  s.kind_ = Kind::kJson;
  std::ifstream f(spec);
  json doc = json::parse(f, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("data") || !doc["data"].is_array() ||
      doc["data"].empty() || !doc["data"][0].is_object())
    return KILN_ERROR(
        "--input-data {}: not JSON of perf_analyzer's form {{\"data\": [{{\"INPUT\": "
        "[values...]}}]}}",
        spec);
  s.entry_ = doc["data"][0];
  for (const auto& [name, v] : s.entry_.items()) {
    if (!v.is_object() || !v.contains("shape")) continue;
    std::vector<int64_t> dims;
    for (const json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1)
        return KILN_ERROR("--input-data {}: input '{}' has shape {}, not a list of sizes", spec,
                          name, v["shape"].dump());
      dims.push_back(d.get<int64_t>());
    }
    s.shapes_[name] = dims;
  }
  return s;
}

Status InputSource::fill(const TensorMeta& t, uint64_t rows, std::string& out,
                         std::mt19937_64& rng) const {
  switch (kind_) {
    case Kind::kRandom:
      fill_random(t.datatype, out, rng);
      return Status::Ok();
    case Kind::kZero:
      return Status::Ok();
    case Kind::kFolder: {
      const auto path = std::filesystem::path(path_) / t.name;
      std::ifstream f(path, std::ios::binary);
      if (!f) return KILN_ERROR("--input-data: no file '{}' for input '{}'", path.string(), t.name);
      const std::string bytes((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
      return place(bytes, rows, out, fmt::format("'{}'", path.string()));
    }
    case Kind::kJson:
      break;
  }
  if (!entry_.contains(t.name))
    return KILN_ERROR("--input-data {}: no data for input '{}'", path_, t.name);
  const json& v = entry_[t.name];
  const json& content = v.is_object() ? (v.contains("content") ? v["content"] : json()) : v;
  std::vector<double> values;
  if (!flatten(content, values, 0))
    return KILN_ERROR(
        "--input-data {}: input '{}' is not a list of numbers (or {{\"content\": "
        "[...]}})",
        path_, t.name);
  const size_t item = datatype_size(t.datatype);
  std::string data(values.size() * item, '\0');
  for (size_t i = 0; i < values.size(); ++i) put_value(t.datatype, data, i, values[i]);
  return place(data, rows, out, fmt::format("input '{}' of {}", t.name, path_));
}

}  // namespace kiln::perf
