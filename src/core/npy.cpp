#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <regex>

namespace kiln {
namespace {

std::string descr_of(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "<f4";
    case DataType::kFloat64: return "<f8";
    case DataType::kFloat16: return "<f2";
    case DataType::kInt8: return "|i1";
    case DataType::kUInt8: return "|u1";
    case DataType::kInt16: return "<i2";
    case DataType::kUInt16: return "<u2";
    case DataType::kInt32: return "<i4";
    case DataType::kUInt32: return "<u4";
    case DataType::kInt64: return "<i8";
    case DataType::kUInt64: return "<u8";
    case DataType::kBool: return "|b1";
    default: return "";
  }
}

}  // namespace

namespace {

// Reads the header; leaves `in` at the first data byte and `*data_bytes` the bytes after it.
Expected<NpyInfo> read_header(std::ifstream& in, const std::string& path, uint64_t* data_bytes) {
  if (!in) return KILN_ERROR("{}: cannot open file", path);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    return KILN_ERROR("{}: not a .npy file (bad magic)", path);
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2)) return KILN_ERROR("{}: truncated header", path);
    header_len = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4)) return KILN_ERROR("{}: truncated header", path);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    return KILN_ERROR("{}: unsupported .npy version {}", path, major);
  }
  if (header_len > (1u << 20)) return KILN_ERROR("{}: header too large", path);
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) return KILN_ERROR("{}: truncated header", path);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")))
    return KILN_ERROR("{}: header has no descr", path);
  const std::string descr = m[1];
  if (descr.size() > 1 && descr[0] == '>' && descr.substr(1) != "i1" && descr.substr(1) != "u1")
    return KILN_ERROR("{}: big-endian data ({}) is not supported", path, descr);
  auto dtype = dtype_from_name(descr);
  if (!dtype) return KILN_ERROR("{}: element type '{}' is not supported", path, descr);
  if (std::regex_search(header, m, std::regex("'fortran_order':\\s*True")))
    return KILN_ERROR("{}: Fortran-order arrays are not supported (save with C order)", path);
  if (!std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    return KILN_ERROR("{}: header has no shape", path);
  NpyInfo info;
  info.dtype = *dtype;
  const std::string dims = m[1];
  std::regex num("\\d+");
  int64_t numel = 1;
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    const int64_t d = std::stoll(it->str());
    if (d > 0 && numel > std::numeric_limits<int64_t>::max() / 16 / d)
      return KILN_ERROR("{}: shape too large", path);
    numel *= d;
    info.shape.push_back(d);
  }
  const auto data_start = in.tellg();
  in.seekg(0, std::ios::end);
  const auto avail = static_cast<uint64_t>(in.tellg() - data_start);
  const uint64_t need = static_cast<uint64_t>(numel) * dtype_size(*dtype);
  if (avail < need)
    return KILN_ERROR("{}: truncated: shape {} needs {} bytes, file has {}", path,
                      shape_str(info.shape), need, avail);
  in.seekg(data_start);
  *data_bytes = need;
  return info;
}

}  // namespace

Expected<NpyInfo> read_npy_info(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t bytes = 0;
  return read_header(in, path, &bytes);
}

Expected<Tensor> read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t need = 0;
  KILN_ASSIGN_OR_RETURN(NpyInfo info, read_header(in, path, &need));
  Tensor t(info.dtype, info.shape);
  if (need && !in.read(static_cast<char*>(t.raw()), static_cast<std::streamsize>(need)))
    return KILN_ERROR("{}: read failed", path);
  return t;
}

Status write_npy(const std::string& path, const Tensor& tensor) {
  // numpy has no bfloat16, float8 or 4-bit types: save them widened, every value exact.
  const DataType wide = tensor.dtype() == DataType::kInt4    ? DataType::kInt8
                        : tensor.dtype() == DataType::kUInt4 ? DataType::kUInt8
                        : tensor.dtype() == DataType::kBFloat16 || dtype_is_float8(tensor.dtype())
                            ? DataType::kFloat32
                            : tensor.dtype();
  const Tensor t = wide != tensor.dtype() ? tensor.cast(wide) : tensor;
  const std::string descr = descr_of(t.dtype());
  if (descr.empty()) return KILN_ERROR("{}: cannot save element type {}", path, dtype_name(t.dtype()));
  std::string shape = fmt::format("{}", fmt::join(t.shape(), ", "));
  if (t.rank() == 1) shape += ",";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return KILN_ERROR("{}: cannot create file", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char lb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(lb, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  if (!out) return KILN_ERROR("{}: write failed", path);
  return Status::Ok();
}

}  // namespace kiln
