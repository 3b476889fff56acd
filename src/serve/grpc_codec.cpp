#include "serve/grpc_codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace kiln::serve {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;
using ParamMap = google::protobuf::Map<std::string, InferParameter>;

// Triton's shared memory parameters of a tensor, or none; 400 for one of the wrong kind.
Result<std::optional<ShmRef>> shm_params(const ParamMap& params, const std::string& what) {
  auto region = params.find("shared_memory_region");
  if (region == params.end()) return std::optional<ShmRef>();
  if (region->second.parameter_choice_case() != InferParameter::kStringParam)
    return api_error(400, "{}: parameter shared_memory_region must be a string_param", what);
  auto size = params.find("shared_memory_byte_size");
  if (size == params.end())
    return api_error(400, "shared_memory_region given without shared_memory_byte_size");
  ShmRef ref{region->second.string_param(), 0, 0};
  auto whole = [&](const InferParameter& p, const char* key, uint64_t* v) -> Check {
    if (p.parameter_choice_case() == InferParameter::kUint64Param) {
      *v = p.uint64_param();
      return std::nullopt;
    }
    if (p.parameter_choice_case() != InferParameter::kInt64Param)
      return api_error(400, "{}: parameter {} must be an int64_param", what, key);
    if (p.int64_param() < 0)
      return api_error(400, "{}: {} {} is not a whole number of bytes", what, key, p.int64_param());
    *v = static_cast<uint64_t>(p.int64_param());
    return std::nullopt;
  };
  KILN_SERVE_CHECK(whole(size->second, "shared_memory_byte_size", &ref.byte_size));
  auto offset = params.find("shared_memory_offset");
  if (offset != params.end())
    KILN_SERVE_CHECK(whole(offset->second, "shared_memory_offset", &ref.offset));
  return std::optional<ShmRef>(std::move(ref));
}

template <typename T, typename Field>
Check copy_values(const Field& values, T* out, const std::string& what, std::string_view dt) {
  for (int i = 0; i < values.size(); ++i) {
    const auto v = values.Get(i);
    using V = std::remove_cv_t<decltype(v)>;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> && !std::is_same_v<V, T>) {
      if (!std::in_range<T>(v))
        return api_error(400, "{}: value {} is out of range for {}", what, v, dt);
    }
    out[i] = static_cast<T>(v);
  }
  return std::nullopt;
}

// Converts the typed contents of `dtype` into `out` (count elements); 400 when the field the
// datatype uses holds another number of values.
// The tensor of `dims` made from the contents field of its type; the field's count is checked
// first, so a shape larger than the values sent allocates nothing.
Check typed_contents(const InferTensorContents& c, DataType dtype, const std::vector<int64_t>& dims,
                     int64_t count, std::shared_ptr<Tensor>* tensor, const std::string& what,
                     std::string_view dt, const std::string& shape) {
  auto check = [&](int n, const char* field) -> Check {
    if (n != count)
      return api_error(400, "{}: {} values in contents.{}, shape {} takes {}", what, n, field,
                       shape, count);
    return std::nullopt;
  };
#define KILN_CONTENTS(T, FIELD)                      \
  KILN_SERVE_CHECK(check(c.FIELD().size(), #FIELD)); \
  *tensor = std::make_shared<Tensor>(dtype, dims);   \
  return copy_values(c.FIELD(), static_cast<T*>((*tensor)->raw()), what, dt)
  switch (dtype) {
    case DataType::kBool:
      KILN_CONTENTS(bool, bool_contents);
    case DataType::kUInt8:
      KILN_CONTENTS(uint8_t, uint_contents);
    case DataType::kUInt16:
      KILN_CONTENTS(uint16_t, uint_contents);
    case DataType::kUInt32:
      KILN_CONTENTS(uint32_t, uint_contents);
    case DataType::kUInt64:
      KILN_CONTENTS(uint64_t, uint64_contents);
    case DataType::kInt8:
      KILN_CONTENTS(int8_t, int_contents);
    case DataType::kInt16:
      KILN_CONTENTS(int16_t, int_contents);
    case DataType::kInt32:
      KILN_CONTENTS(int32_t, int_contents);
    case DataType::kInt64:
      KILN_CONTENTS(int64_t, int64_contents);
    case DataType::kFloat32:
      KILN_CONTENTS(float, fp32_contents);
    case DataType::kFloat64:
      KILN_CONTENTS(double, fp64_contents);
    default:
      return api_error(400, "{}: {} data must come in raw_input_contents", what, dt);
  }
#undef KILN_CONTENTS
}

}  // namespace

std::string why_not_a_message(const uint8_t* p, size_t n) {
  size_t pos = 0;
  auto varint = [&](uint64_t* v) -> const char* {
    *v = 0;
    for (int shift = 0;; shift += 7) {
      if (shift > 63) return "a protobuf varint is over 10 bytes";
      if (pos >= n) return "the protobuf message is truncated";
      const uint8_t b = p[pos++];
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return nullptr;
    }
  };
  while (pos < n) {
    uint64_t key = 0, len = 0;
    if (const char* e = varint(&key)) return e;
    switch (key & 7) {
      case 0:
        if (const char* e = varint(&len)) return e;
        break;
      case 1:
        pos += 8;
        break;
      case 5:
        pos += 4;
        break;
      case 2:
        if (const char* e = varint(&len)) return e;
        if (len > n - pos) return "the protobuf message is truncated";
        pos += len;
        break;
      default:
        return fmt::format("protobuf wire type {} is not one a ModelInferRequest has", key & 7);
    }
    if (pos > n) return "the protobuf message is truncated";
  }
  return "the message is not a ModelInferRequest (a field holds what its type cannot)";
}

Result<InferRequest> decode_grpc_infer(std::shared_ptr<const inference::ModelInferRequest> msg,
                                       const ShmRegistry& shm) {
  const inference::ModelInferRequest& m = *msg;
  InferRequest req;
  req.model = m.model_name();
  req.version = m.model_version();
  req.id = m.id();
  std::optional<int64_t> sched[2];  // Triton's request parameters: priority, timeout
  const char* sched_names[2] = {"priority", "timeout"};
  for (int k = 0; k < 2; ++k) {
    auto it = m.parameters().find(sched_names[k]);
    if (it == m.parameters().end()) continue;
    const inference::InferParameter& p = it->second;
    if (p.has_int64_param())
      sched[k] = p.int64_param();
    else if (p.has_uint64_param())
      sched[k] = static_cast<int64_t>(
          std::min<uint64_t>(p.uint64_param(), std::numeric_limits<int64_t>::max()));
    else
      return api_error(400, "parameter '{}' must be an int64_param or uint64_param",
                       sched_names[k]);
  }
  KILN_SERVE_CHECK(set_scheduling(req, sched[0], sched[1]));
  const int n_inputs = m.inputs_size(), n_raw = m.raw_input_contents_size();
  // Inputs in shared memory take no raw_input_contents: those are the other inputs', in order.
  std::vector<std::optional<ShmRef>> regions(static_cast<size_t>(n_inputs));
  int n_shm = 0;
  for (int i = 0; i < n_inputs; ++i) {
    const auto& t = m.inputs(i);
    auto r = shm_params(t.parameters(), fmt::format("input '{}'", t.name()));
    if (!r.ok()) return r.error();
    regions[static_cast<size_t>(i)] = *r;
    n_shm += r->has_value();
  }
  if (n_raw && n_raw != n_inputs - n_shm) {
    if (n_shm && n_raw > n_inputs - n_shm) {
      for (int i = 0; i < n_inputs; ++i)
        if (regions[static_cast<size_t>(i)])
          return api_error(400,
                           "input '{}': both raw_input_contents and shared_memory_region "
                           "given ({} inputs, {} in shared memory, and {} raw_input_contents)",
                           m.inputs(i).name(), n_inputs, n_shm, n_raw);
    }
    return api_error(400,
                     "{} inputs and {} raw_input_contents: with raw contents there must be "
                     "one per input, in the inputs' order",
                     n_inputs, n_raw);
  }
  int next_raw = 0;
  for (int i = 0; i < n_inputs; ++i) {
    const auto& t = m.inputs(i);
    InputTensor in;
    in.name = t.name();
    const std::string what = fmt::format("input '{}'", in.name);
    auto dtype = dtype_of_v2(t.datatype());
    if (!dtype) return api_error(400, "{}: datatype {} is not one kiln takes", what, t.datatype());
    in.dtype = *dtype;
    for (const InputTensor& other : req.inputs)
      if (other.name == in.name) return api_error(400, "input '{}' given twice", in.name);
    in.shape.assign(t.shape().begin(), t.shape().end());
    for (int64_t d : in.shape)
      if (d < 0)
        return api_error(400, "{}: shape {} is not a list of sizes", what, shape_text(in.shape));
    auto count = element_count(what, in.shape, dtype_size(in.dtype));
    if (!count.ok()) return count.error();
    const size_t need = static_cast<size_t>(*count) * dtype_size(in.dtype);
    const std::string shape = shape_text(in.shape);
    if (const auto& region = regions[static_cast<size_t>(i)]) {
      if (t.has_contents())
        return api_error(400, "{}: both contents and shared_memory_region given", what);
      KILN_SERVE_CHECK(shm.input(what, *region, need, shape, t.datatype(), in));
    } else if (n_raw) {
      if (t.has_contents())
        return api_error(400, "{}: both contents and raw_input_contents given", what);
      const std::string& data = m.raw_input_contents(next_raw++);
      if (data.size() != need)
        return api_error(400, "{}: {} bytes of raw_input_contents, shape {} of {} takes {}", what,
                         data.size(), shape, t.datatype(), need);
      in.data = reinterpret_cast<const uint8_t*>(data.data());
      in.bytes = need;
      in.owner = msg;
    } else {
      std::shared_ptr<Tensor> tensor;
      KILN_SERVE_CHECK(typed_contents(t.contents(), in.dtype, in.shape, *count, &tensor, what,
                                      t.datatype(), shape));
      in.data = static_cast<const uint8_t*>(tensor->raw());
      in.bytes = need;
      in.owner = tensor;
    }
    req.inputs.push_back(std::move(in));
  }
  for (const auto& o : m.outputs()) {
    OutputRequest out;
    out.name = o.name();
    auto r = shm_params(o.parameters(), fmt::format("output '{}'", o.name()));
    if (!r.ok()) return r.error();
    out.shm = *r;
    req.outputs.push_back(std::move(out));
  }
  return req;
}

Check encode_grpc_infer(const InferRequest& req, const ServedModel& model, const Outputs& outputs,
                        const ShmRegistry& shm, inference::ModelInferResponse* out,
                        std::vector<Tensor>* raw_out) {
  out->set_model_name(model.name());
  out->set_model_version(model.version());
  out->set_id(req.id);
  for (const OutputRequest& o : req.outputs) {
    const int idx = model.output_index(o.name);
    if (idx < 0) return api_error(500, "output '{}' is not the model's", o.name);
    const Tensor& t = outputs[static_cast<size_t>(idx)];
    auto* ot = out->add_outputs();
    ot->set_name(o.name);
    ot->set_datatype(std::string(v2_datatype(t.dtype())));
    for (int64_t d : t.shape()) ot->add_shape(d);
    std::string* raw = raw_out ? nullptr : out->add_raw_output_contents();
    if (o.shm) {
      // Triton's clients index raw_output_contents by the output's place: empty contents.
      KILN_SERVE_CHECK(shm.write_output(fmt::format("output '{}'", o.name), *o.shm, t.raw(),
                                        t.nbytes(), shape_text(t.shape()), v2_datatype(t.dtype())));
      if (raw_out) raw_out->emplace_back();
    } else if (raw_out) {
      raw_out->push_back(t);  // a view: it keeps the batch's outputs alive
    } else {
      raw->assign(static_cast<const char*>(t.raw()), t.nbytes());
    }
  }
  return std::nullopt;
}

grpc::ByteBuffer infer_response_buffer(const inference::ModelInferResponse& head,
                                       std::vector<Tensor> raw) {
  constexpr size_t kInPlace = size_t{64} << 10;
  constexpr uint8_t kRawTag = (6 << 3) | 2;  // raw_output_contents: field 6, length-delimited
  std::vector<grpc::Slice> slices;
  std::string pending = head.SerializeAsString();
  for (Tensor& t : raw) {
    const size_t n = t.nbytes();
    pending.push_back(static_cast<char>(kRawTag));
    for (uint64_t v = n;; v >>= 7) {  // the length as a varint
      pending.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
      if (v <= 0x7f) break;
    }
    if (n < kInPlace) {
      if (n) pending.append(static_cast<const char*>(t.raw()), n);
      continue;
    }
    slices.emplace_back(pending);
    pending.clear();
    auto* keep = new Tensor(std::move(t));
    slices.emplace_back(
        const_cast<void*>(keep->raw()), n, [](void* p) { delete static_cast<Tensor*>(p); }, keep);
  }
  if (!pending.empty() || slices.empty()) slices.emplace_back(pending);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace kiln::serve
