#include "onnx/tensor_proto.h"

#include <filesystem>
#include <fstream>
#include <limits>

#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

// The values of a typed field, checked against the shape before the tensor is allocated (a
// shape of 2^40 elements with no data must be an error, not a 4 TB allocation).
template <typename T, typename Field>
Expected<Tensor> copy_field(const Field& field, DataType dtype, const std::vector<int64_t>& shape,
                            int64_t numel, const std::string& where) {
  if (static_cast<int64_t>(field.size()) != numel)
    return KILN_ERROR("{}: holds {} values but its shape {} needs {}", where, field.size(),
                      shape_str(shape), numel);
  Tensor t(dtype, shape);
  T* dst = t.data<T>();
  for (int64_t i = 0; i < numel; ++i) dst[i] = static_cast<T>(field.Get(static_cast<int>(i)));
  return t;
}

Expected<std::string> read_external(const onnx::TensorProto& p, const std::string& base_dir,
                                    const std::string& where, size_t expected) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (...) {
      return KILN_ERROR("{}: external data field '{}' has a bad value '{}'", where, kv.key(),
                        kv.value());
    }
  }
  if (location.empty()) return KILN_ERROR("{}: external data without a location", where);
  namespace fs = std::filesystem;
  const fs::path rel(location);
  if (rel.is_absolute() || location.find("..") != std::string::npos)
    return KILN_ERROR("{}: external data location '{}' must be a relative path inside the model's "
                      "folder", where, location);
  const fs::path file = fs::path(base_dir) / rel;
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (ec) return KILN_ERROR("{}: cannot open external data file '{}'", where, file.string());
  if (length < 0) length = static_cast<int64_t>(expected);
  if (offset < 0 || static_cast<uint64_t>(offset) > size ||
      static_cast<uint64_t>(length) > size - static_cast<uint64_t>(offset))
    return KILN_ERROR("{}: external data range [{}, +{}) is outside '{}' ({} bytes)", where, offset,
                      length, file.string(), size);
  if (static_cast<size_t>(length) != expected)
    return KILN_ERROR("{}: external data length {} does not match the tensor size {} bytes", where,
                      length, expected);
  std::ifstream in(file, std::ios::binary);
  in.seekg(offset);
  std::string buf(static_cast<size_t>(length), '\0');
  in.read(buf.data(), length);
  if (!in) return KILN_ERROR("{}: failed to read external data from '{}'", where, file.string());
  return buf;
}

// ONNX packs int4/uint4 two to a byte, the first element in the low nibble; kiln holds one
// per byte (int4 sign-extended).
Expected<Tensor> unpack_4bit(const std::string& packed, DataType dtype,
                             const std::vector<int64_t>& shape, int64_t numel,
                             const std::string& where) {
  if (packed.size() != static_cast<size_t>((numel + 1) / 2))
    return KILN_ERROR("{}: {} data has {} bytes but shape {} needs {}", where, dtype_name(dtype),
                      packed.size(), shape_str(shape), (numel + 1) / 2);
  Tensor t(dtype, shape);
  auto* dst = static_cast<uint8_t*>(t.raw());
  for (int64_t i = 0; i < numel; ++i) {
    const auto byte = static_cast<uint8_t>(packed[static_cast<size_t>(i / 2)]);
    uint8_t v = (i % 2 == 0) ? (byte & 0xf) : (byte >> 4);
    if (dtype == DataType::kInt4 && (v & 0x8)) v |= 0xf0;
    dst[i] = v;
  }
  return t;
}

}  // namespace

Expected<Tensor> tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir,
                                   const std::string& where) {
  const auto dtype = static_cast<DataType>(p.data_type());
  if (!dtype_is_supported(dtype)) {
    if (dtype == DataType::kString)
      return KILN_ERROR("{}: string tensors are not supported", where);
    return KILN_ERROR("{}: element type {} is not supported", where, p.data_type());
  }
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (int64_t d : p.dims()) {
    if (d < 0) return KILN_ERROR("{}: negative dimension {}", where, d);
    if (d > 0 && numel > std::numeric_limits<int64_t>::max() / 8 / d)
      return KILN_ERROR("{}: shape is too large", where);
    numel *= d;
    shape.push_back(d);
  }
  const size_t nbytes = static_cast<size_t>(numel) * dtype_size(dtype);
  const bool external = p.data_location() == onnx::TensorProto::EXTERNAL;
  if (external || p.has_raw_data()) {
    std::string ext;
    const std::string* raw = &p.raw_data();
    if (external) {
      KILN_ASSIGN_OR_RETURN(ext, read_external(p, base_dir, where, nbytes));
      raw = &ext;
    }
    if (dtype == DataType::kInt4 || dtype == DataType::kUInt4)
      return unpack_4bit(*raw, dtype, shape, numel, where);
    if (raw->size() != nbytes)
      return KILN_ERROR("{}: raw data has {} bytes but shape {} of {} needs {}", where, raw->size(),
                        shape_str(shape), dtype_name(dtype), nbytes);
    Tensor t(dtype, shape);
    if (nbytes) std::memcpy(t.raw(), raw->data(), nbytes);  // ONNX raw data is little-endian
    return t;
  }
  if (dtype == DataType::kInt4 || dtype == DataType::kUInt4) {
    std::string packed(p.int32_data().begin(), p.int32_data().end());  // one packed byte each
    return unpack_4bit(packed, dtype, shape, numel, where);
  }
  switch (dtype) {
    case DataType::kFloat32: return copy_field<float>(p.float_data(), dtype, shape, numel, where);
    case DataType::kFloat64: return copy_field<double>(p.double_data(), dtype, shape, numel, where);
    case DataType::kInt64: return copy_field<int64_t>(p.int64_data(), dtype, shape, numel, where);
    case DataType::kUInt32:
      return copy_field<uint32_t>(p.uint64_data(), dtype, shape, numel, where);
    case DataType::kUInt64:
      return copy_field<uint64_t>(p.uint64_data(), dtype, shape, numel, where);
    case DataType::kInt32: return copy_field<int32_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kInt16: return copy_field<int16_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kUInt16: return copy_field<uint16_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kInt8: return copy_field<int8_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kUInt8: return copy_field<uint8_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kBool: return copy_field<bool>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kFloat16: case DataType::kBFloat16:  // bit patterns stored in int32_data
      return copy_field<uint16_t>(p.int32_data(), dtype, shape, numel, where);
    case DataType::kFloat8E4M3FN: case DataType::kFloat8E4M3FNUZ: case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:  // bit patterns, one per int32
      return copy_field<uint8_t>(p.int32_data(), dtype, shape, numel, where);
    default: return KILN_ERROR("{}: element type {} is not supported", where, dtype_name(dtype));
  }
}

static Expected<onnx::TensorProto> parse_pb(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return KILN_ERROR("{}: cannot open file", path);
  onnx::TensorProto p;
  if (!p.ParseFromIstream(&in)) return KILN_ERROR("{}: not a valid ONNX TensorProto file", path);
  return p;
}

Expected<Tensor> read_tensor_pb_file(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(onnx::TensorProto p, parse_pb(path));
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return tensor_from_proto(p, dir, path);
}

Expected<std::string> read_tensor_pb_name(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(onnx::TensorProto p, parse_pb(path));
  return p.name();
}

}  // namespace kiln
