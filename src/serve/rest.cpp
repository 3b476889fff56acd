#include "serve/rest.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace kiln::serve {
namespace {

using json = nlohmann::json;

// How the Python server printed a JSON value in a message (its repr): 'text' or the JSON.
std::string repr(const json& v) {
  if (v.is_string()) return fmt::format("'{}'", v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size() && out.size() < 200; ++i) out += (i ? ", " : "") + repr(v[i]);
    return out + "]";
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool whole(const json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// Flattens `data` (a value, or lists nested up to 32 deep) into `out`.
Check flatten(const json& data, std::vector<const json*>& out, const std::string& what, int depth) {
  if (!data.is_array()) {
    out.push_back(&data);
    return std::nullopt;
  }
  if (depth > 32) return api_error(400, "{}: data is nested over 32 lists deep", what);
  for (const json& v : data) KILN_SERVE_CHECK(flatten(v, out, what, depth + 1));
  return std::nullopt;
}

template <typename T>
Check convert(const std::vector<const json*>& values, T* out, const std::string& what,
              std::string_view datatype) {
  for (size_t i = 0; i < values.size(); ++i) {
    const json& v = *values[i];
    if constexpr (std::is_floating_point_v<T>) {
      if (v.is_number() || v.is_boolean()) {
        out[i] = v.is_boolean() ? T(v.get<bool>()) : v.get<T>();
        continue;
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      if (v.is_boolean() || v.is_number()) {
        out[i] = v.is_boolean() ? v.get<bool>() : v.get<double>() != 0;
        continue;
      }
    } else {
      if (v.is_boolean()) {
        out[i] = T(v.get<bool>());
        continue;
      }
      if (v.is_number_integer()) {
        bool fits;
        if (v.is_number_unsigned())
          fits = v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
        else
          fits = v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                 (v.get<int64_t>() < 0 || static_cast<uint64_t>(v.get<int64_t>()) <=
                                              static_cast<uint64_t>(std::numeric_limits<T>::max()));
        if (!fits)
          return api_error(400, "{}: value {} is out of range for {}", what, v.dump(), datatype);
        out[i] = v.is_number_unsigned() ? T(v.get<uint64_t>()) : T(v.get<int64_t>());
        continue;
      }
      if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::trunc(d) != d)
          return api_error(400, "{}: value {} is not an integer, as {} needs", what, v.dump(),
                           datatype);
        if (d < static_cast<double>(std::numeric_limits<T>::min()) ||
            d > static_cast<double>(std::numeric_limits<T>::max()))
          return api_error(400, "{}: value {} is out of range for {}", what, v.dump(), datatype);
        out[i] = static_cast<T>(d);
        continue;
      }
    }
    return api_error(400, "{}: could not convert {} to {}", what, repr(v), datatype);
  }
  return std::nullopt;
}

Check convert_values(const std::vector<const json*>& values, DataType dt, void* out,
                     const std::string& what, std::string_view datatype) {
  switch (dt) {
    case DataType::kBool:
      return convert(values, static_cast<bool*>(out), what, datatype);
    case DataType::kUInt8:
      return convert(values, static_cast<uint8_t*>(out), what, datatype);
    case DataType::kUInt16:
      return convert(values, static_cast<uint16_t*>(out), what, datatype);
    case DataType::kUInt32:
      return convert(values, static_cast<uint32_t*>(out), what, datatype);
    case DataType::kUInt64:
      return convert(values, static_cast<uint64_t*>(out), what, datatype);
    case DataType::kInt8:
      return convert(values, static_cast<int8_t*>(out), what, datatype);
    case DataType::kInt16:
      return convert(values, static_cast<int16_t*>(out), what, datatype);
    case DataType::kInt32:
      return convert(values, static_cast<int32_t*>(out), what, datatype);
    case DataType::kInt64:
      return convert(values, static_cast<int64_t*>(out), what, datatype);
    case DataType::kFloat32:
      return convert(values, static_cast<float*>(out), what, datatype);
    case DataType::kFloat64:
      return convert(values, static_cast<double*>(out), what, datatype);
    case DataType::kFloat16: {
      std::vector<float> f(values.size());
      KILN_SERVE_CHECK(convert(values, f.data(), what, datatype));
      auto* h = static_cast<uint16_t*>(out);
      for (size_t i = 0; i < f.size(); ++i) h[i] = float_to_half(f[i]);
      return std::nullopt;
    }
    default:
      return api_error(400, "{}: datatype {} is not one kiln takes", what, datatype);
  }
}

// Triton's shared memory parameters of a tensor, or none; 400 for a malformed one.
Result<std::optional<ShmRef>> shm_params(const json& params, const std::string& what) {
  if (!params.is_object() || !params.contains("shared_memory_region"))
    return std::optional<ShmRef>();
  const json& region = params["shared_memory_region"];
  if (!region.is_string())
    return api_error(400, "{}: shared_memory_region {} is not a string", what, repr(region));
  if (!params.contains("shared_memory_byte_size"))
    return api_error(400, "shared_memory_region given without shared_memory_byte_size");
  const json& size = params["shared_memory_byte_size"];
  if (!whole(size))
    return api_error(400, "{}: shared_memory_byte_size {} is not a whole number of bytes", what,
                     repr(size));
  ShmRef ref{region.get<std::string>(), size.get<uint64_t>(), 0};
  if (params.contains("shared_memory_offset")) {
    const json& off = params["shared_memory_offset"];
    if (!whole(off))
      return api_error(400, "{}: shared_memory_offset {} is not a whole number of bytes", what,
                       repr(off));
    ref.offset = off.get<uint64_t>();
  }
  return std::optional<ShmRef>(std::move(ref));
}

Check decode_input(const json& t, const std::string& body, size_t& start, const ShmRegistry& shm,
                   InferRequest& req) {
  if (!t.is_object()) return api_error(400, "malformed request: each input must be a JSON object");
  const json* name = t.contains("name") ? &t["name"] : nullptr;
  const json* datatype = t.contains("datatype") ? &t["datatype"] : nullptr;
  if (!name || !name->is_string() || !datatype || !datatype->is_string())
    return api_error(400, "input {}: the name and datatype must be strings",
                     name ? repr(*name) : "None");
  InputTensor in;
  in.name = name->get<std::string>();
  const std::string dt = datatype->get<std::string>();
  const std::string what = fmt::format("input '{}'", in.name);
  auto dtype = dtype_of_v2(dt);
  if (!dtype) return api_error(400, "{}: datatype {} is not one kiln takes", what, dt);
  in.dtype = *dtype;
  for (const InputTensor& other : req.inputs)
    if (other.name == in.name) return api_error(400, "input '{}' given twice", in.name);
  const json& shape = t.contains("shape") ? t["shape"] : json();
  bool sizes = shape.is_array();
  for (size_t i = 0; sizes && i < shape.size(); ++i)
    sizes = whole(shape[i]) && shape[i] <= INT64_MAX;
  if (!sizes) return api_error(400, "{}: shape {} is not a list of sizes", what, repr(shape));
  for (const json& d : shape) in.shape.push_back(d.get<int64_t>());
  auto count = element_count(what, in.shape, dtype_size(in.dtype));
  if (!count.ok()) return count.error();
  const size_t need = static_cast<size_t>(*count) * dtype_size(in.dtype);
  const json params = t.contains("parameters") ? t["parameters"] : json();
  const json* size = params.is_object() && params.contains("binary_data_size")
                         ? &params["binary_data_size"]
                         : nullptr;
  const json* data = t.contains("data") && !t["data"].is_null() ? &t["data"] : nullptr;
  auto region = shm_params(params, what);
  if (!region.ok()) return region.error();
  if (*region) {
    if (data || size)
      return api_error(400, "{}: both {} and shared_memory_region given", what,
                       data ? "data" : "binary_data_size");
    KILN_SERVE_CHECK(shm.input(what, **region, need, shape_text(in.shape), dt, in));
  } else if (data) {
    if (size) return api_error(400, "{}: both data and binary_data_size given", what);
    std::vector<const json*> values;
    KILN_SERVE_CHECK(flatten(*data, values, what, 0));
    if (values.size() != static_cast<size_t>(*count))
      return api_error(400, "{}: {} values in data, shape {} takes {}", what, values.size(),
                       shape_text(in.shape), *count);
    auto tensor = std::make_shared<Tensor>(in.dtype, in.shape);
    KILN_SERVE_CHECK(convert_values(values, in.dtype, tensor->raw(), what, dt));
    in.data = static_cast<const uint8_t*>(tensor->raw());
    in.bytes = need;
    in.owner = tensor;
  } else if (size) {
    const size_t left = body.size() - start;
    if (!whole(*size) || size->get<uint64_t>() > left)
      return api_error(400, "{}: binary_data_size {} is not within the {} bytes left in the body",
                       what, repr(*size), left);
    if (size->get<uint64_t>() != need)
      return api_error(400, "{}: binary_data_size {}, shape {} of {} takes {}", what,
                       size->get<uint64_t>(), shape_text(in.shape), dt, need);
    in.data = reinterpret_cast<const uint8_t*>(body.data()) + start;
    in.bytes = need;
    start += need;
  } else {
    return api_error(400, "input '{}' has neither 'data' nor binary_data_size", in.name);
  }
  req.inputs.push_back(std::move(in));
  return std::nullopt;
}

}  // namespace

std::string error_json(const std::string& message) {
  return json{{"error", message}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<InferRequest> decode_rest_infer(std::shared_ptr<const std::string> body,
                                       const std::optional<std::string>& header_length,
                                       const ShmRegistry& shm) {
  const std::string& b = *body;
  size_t start = b.size();
  if (header_length) {
    const std::string& h = *header_length;
    const bool digits = !h.empty() && h.size() < 19 && std::all_of(h.begin(), h.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (!digits || std::stoull(h) > b.size())
      return api_error(400,
                       "inference-header-content-length {} is not within the body of {} "
                       "bytes",
                       h.substr(0, 40), b.size());
    start = std::stoull(h);
  }
  json header;
  try {
    header = json::parse(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(start));
  } catch (const json::exception& e) {
    return api_error(400, "malformed request: {}", e.what());
  }
  if (!header.is_object() || !header.contains("inputs") || !header["inputs"].is_array())
    return api_error(400,
                     "malformed request: the body must be a JSON object with an 'inputs' list");
  InferRequest req;
  if (header.contains("id") && header["id"].is_string()) req.id = header["id"].get<std::string>();
  const json& params = header.contains("parameters") ? header["parameters"] : json();
  if (params.is_object() && params.contains("binary_data_output"))
    req.binary_outputs = params["binary_data_output"].is_boolean()
                             ? params["binary_data_output"].get<bool>()
                             : !params["binary_data_output"].is_null();
  std::optional<int64_t> sched[2];  // priority, timeout
  const char* sched_names[2] = {"priority", "timeout"};
  for (int k = 0; k < 2 && params.is_object(); ++k) {
    if (!params.contains(sched_names[k])) continue;
    const json& v = params[sched_names[k]];
    if (!v.is_number_integer())
      return api_error(400, "parameter '{}' must be a whole number, not {}", sched_names[k],
                       repr(v));
    sched[k] =
        v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
            ? std::numeric_limits<int64_t>::max()
            : v.get<int64_t>();
  }
  KILN_SERVE_CHECK(set_scheduling(req, sched[0], sched[1]));
  for (const json& t : header["inputs"]) KILN_SERVE_CHECK(decode_input(t, b, start, shm, req));
  for (InputTensor& in : req.inputs)
    if (!in.owner) in.owner = body;  // binary inputs view the body
  if (header.contains("outputs") && !header["outputs"].is_null()) {
    const json& outs = header["outputs"];
    if (!outs.is_array())
      return api_error(400, "malformed request: 'outputs' must be a list of JSON objects");
    for (const json& o : outs) {
      if (!o.is_object())
        return api_error(400, "malformed request: 'outputs' must be a list of JSON objects");
      OutputRequest out;
      const json name = o.contains("name") ? o["name"] : json();
      out.name = name.is_string() ? name.get<std::string>() : repr(name);
      const std::string what = fmt::format("output '{}'", out.name);
      const json p = o.contains("parameters") ? o["parameters"] : json();
      if (p.is_object() && p.contains("binary_data") && p["binary_data"].is_boolean())
        out.binary = p["binary_data"].get<bool>();
      auto region = shm_params(p, what);
      if (!region.ok()) return region.error();
      if (*region && out.binary.value_or(false))
        return api_error(400, "{}: both binary_data and shared_memory_region given", what);
      out.shm = *region;
      req.outputs.push_back(std::move(out));
    }
  }
  return req;
}

Check check_output_regions(const InferRequest& req, const ShmRegistry& shm) {
  for (const OutputRequest& o : req.outputs)
    if (o.shm) KILN_SERVE_CHECK(shm.check_output(fmt::format("output '{}'", o.name), *o.shm));
  return std::nullopt;
}

namespace {

json values_json(const Tensor& t) {
  json a = json::array();
  const int64_t n = t.numel();
  auto put = [&](auto* p) {
    for (int64_t i = 0; i < n; ++i) a.push_back(p[i]);
  };
  switch (t.dtype()) {
    case DataType::kBool:
      put(t.data<bool>());
      break;
    case DataType::kUInt8:
      put(t.data<uint8_t>());
      break;
    case DataType::kUInt16:
      put(t.data<uint16_t>());
      break;
    case DataType::kUInt32:
      put(t.data<uint32_t>());
      break;
    case DataType::kUInt64:
      put(t.data<uint64_t>());
      break;
    case DataType::kInt8:
      put(t.data<int8_t>());
      break;
    case DataType::kInt16:
      put(t.data<int16_t>());
      break;
    case DataType::kInt32:
      put(t.data<int32_t>());
      break;
    case DataType::kInt64:
      put(t.data<int64_t>());
      break;
    case DataType::kFloat32:
      put(t.data<float>());
      break;
    case DataType::kFloat64:
      put(t.data<double>());
      break;
    default:
      for (int64_t i = 0; i < n; ++i) a.push_back(t.at_double(i));
  }
  return a;
}

}  // namespace

Result<RestBody> encode_rest_infer(const InferRequest& req, const ServedModel& model,
                                   const Outputs& outputs, const ShmRegistry& shm) {
  json outs = json::array();
  std::vector<const Tensor*> binary;
  for (const OutputRequest& o : req.outputs) {
    const int idx = model.output_index(o.name);
    if (idx < 0) return api_error(500, "output '{}' is not the model's", o.name);
    const Tensor& t = outputs[static_cast<size_t>(idx)];
    const std::string_view dt = v2_datatype(t.dtype());
    json entry = {{"name", o.name}, {"datatype", dt}, {"shape", t.shape()}};
    if (o.shm) {
      KILN_SERVE_CHECK(shm.write_output(fmt::format("output '{}'", o.name), *o.shm, t.raw(),
                                        t.nbytes(), shape_text(t.shape()), dt));
    } else if (o.binary.value_or(req.binary_outputs)) {
      entry["parameters"] = {{"binary_data_size", t.nbytes()}};
      binary.push_back(&t);
    } else {
      entry["data"] = values_json(t);
    }
    outs.push_back(std::move(entry));
  }
  json doc = {{"model_name", model.name()},
              {"model_version", model.version()},
              {"id", req.id},
              {"outputs", std::move(outs)}};
  RestBody r;
  r.body = doc.dump(-1, ' ', false, json::error_handler_t::replace);
  if (!binary.empty()) {
    r.json_length = r.body.size();
    size_t total = r.body.size();
    for (const Tensor* t : binary) total += t->nbytes();
    r.body.reserve(total);
    for (const Tensor* t : binary) r.body.append(static_cast<const char*>(t->raw()), t->nbytes());
  }
  return r;
}

}  // namespace kiln::serve
