// Engine file container: header, metadata section, checksum, file I/O. The graph section's
// encoding lives in plan_graph_write.cpp / plan_graph_read.cpp.
#include "engine/plan_format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln {
namespace plan_internal {

static_assert(std::endian::native == std::endian::little,
              "the engine format is little-endian; add byte swapping for this host");

// ---- checksum: XXH64, written from the published algorithm description.

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

uint64_t xxh_round(uint64_t acc, uint64_t input) {
  acc += input * kP2;
  acc = std::rotl(acc, 31);
  return acc * kP1;
}
uint64_t xxh_merge(uint64_t acc, uint64_t val) {
  acc ^= xxh_round(0, val);
  return acc * kP1 + kP4;
}
}  // namespace

uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

uint64_t xxh64(const void* data, size_t size, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* const end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
    const uint8_t* const limit = end - 32;
    do {
      v1 = xxh_round(v1, load_u64(p));
      v2 = xxh_round(v2, load_u64(p + 8));
      v3 = xxh_round(v3, load_u64(p + 16));
      v4 = xxh_round(v4, load_u64(p + 24));
      p += 32;
    } while (p <= limit);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = xxh_merge(h, v1);
    h = xxh_merge(h, v2);
    h = xxh_merge(h, v3);
    h = xxh_merge(h, v4);
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(size);
  for (; p + 8 <= end; p += 8) {
    h ^= xxh_round(0, load_u64(p));
    h = std::rotl(h, 27) * kP1 + kP4;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(load_u32(p)) * kP1;
    h = std::rotl(h, 23) * kP2 + kP3;
    p += 4;
  }
  for (; p < end; ++p) {
    h ^= (*p) * kP5;
    h = std::rotl(h, 11) * kP1;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

void reseal(std::vector<uint8_t>& image) {
  if (image.size() < kTrailerSize) return;
  const size_t body = image.size() - kTrailerSize;
  store_u64(image.data() + body, xxh64(image.data(), body));
}

std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= 60) return out + "...";
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

Status check_quant_params(const Value& v) {
  const auto& s = v.quant_scales;
  for (float f : s)
    if (!std::isfinite(f) || !(f > 0))
      return KILN_ERROR("value '{}' has an invalid INT8 scale {} (must be finite and > 0)",
                        printable(v.name), f);
  if (s.size() <= 1) {
    if (v.quant_axis != -1)
      return KILN_ERROR("value '{}' has a quantization axis {} without per-channel scales",
                        printable(v.name), v.quant_axis);
    return Status::Ok();
  }
  if (!v.type.dims)
    return KILN_ERROR("value '{}' has per-channel INT8 scales but no known rank",
                      printable(v.name));
  const auto& dims = *v.type.dims;
  if (v.quant_axis < 0 || v.quant_axis >= static_cast<int64_t>(dims.size()))
    return KILN_ERROR("value '{}': quantization axis {} is not a dimension of its rank-{} shape",
                      printable(v.name), v.quant_axis, dims.size());
  const Dim& d = dims[static_cast<size_t>(v.quant_axis)];
  if (d.is_static() && d.value != static_cast<int64_t>(s.size()))
    return KILN_ERROR("value '{}' has {} INT8 scales along axis {} of size {}", printable(v.name),
                      s.size(), v.quant_axis, d.value);
  return Status::Ok();
}

// ---- byte writer / reader

void ByteWriter::u32(uint32_t v) {
  uint8_t b[4];
  store_u32(b, v);
  out_.insert(out_.end(), b, b + 4);
}
void ByteWriter::u64(uint64_t v) {
  uint8_t b[8];
  store_u64(b, v);
  out_.insert(out_.end(), b, b + 8);
}
void ByteWriter::f32(float v) { u32(std::bit_cast<uint32_t>(v)); }
void ByteWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));  // callers check that lengths fit (encode_graph does)
  out_.insert(out_.end(), s.begin(), s.end());
}

Status ByteReader::error(const std::string& message) const {
  return KILN_ERROR("{} section: {} (at byte {})", section_, message, pos_);
}
Status ByteReader::need(size_t n, const char* what) const {
  if (n > remaining())
    return error(
        fmt::format("truncated reading {} ({} bytes needed, {} left)", what, n, remaining()));
  return Status::Ok();
}
Status ByteReader::u8(uint8_t& v, const char* what) {
  KILN_RETURN_IF_ERROR(need(1, what));
  v = data_[pos_++];
  return Status::Ok();
}
Status ByteReader::u32(uint32_t& v, const char* what) {
  KILN_RETURN_IF_ERROR(need(4, what));
  v = load_u32(data_ + pos_);
  pos_ += 4;
  return Status::Ok();
}
Status ByteReader::u64(uint64_t& v, const char* what) {
  KILN_RETURN_IF_ERROR(need(8, what));
  v = load_u64(data_ + pos_);
  pos_ += 8;
  return Status::Ok();
}
Status ByteReader::i64(int64_t& v, const char* what) {
  uint64_t u = 0;
  KILN_RETURN_IF_ERROR(u64(u, what));
  v = static_cast<int64_t>(u);
  return Status::Ok();
}
Status ByteReader::f32(float& v, const char* what) {
  uint32_t u = 0;
  KILN_RETURN_IF_ERROR(u32(u, what));
  v = std::bit_cast<float>(u);
  return Status::Ok();
}
Status ByteReader::str(std::string& s, const char* what) {
  uint32_t n = 0;
  KILN_RETURN_IF_ERROR(u32(n, what));
  if (n > remaining())
    return error(fmt::format("{} length {} exceeds the {} bytes left", what, n, remaining()));
  s.assign(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return Status::Ok();
}
Status ByteReader::count(uint32_t& n, size_t min_item_bytes, const char* what) {
  KILN_RETURN_IF_ERROR(u32(n, what));
  // n <= 2^32 and min_item_bytes is small, so the product cannot overflow 64 bits.
  if (static_cast<uint64_t>(n) * min_item_bytes > remaining())
    return error(fmt::format("{} {} cannot fit in the {} bytes left", what, n, remaining()));
  return Status::Ok();
}
Status ByteReader::finish() const {
  if (remaining() != 0) return error(fmt::format("{} unexpected trailing bytes", remaining()));
  return Status::Ok();
}

// ---- container

namespace {

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Deeper JSON is refused: nlohmann's dump() and comparisons recurse, so a forged, deeply nested
// options text would otherwise overflow the stack of whoever uses the loaded options.
constexpr int kMaxJsonDepth = 64;

Expected<nlohmann::json> parse_options(const std::string& text,
                                       const char* what = "build options") {
  bool too_deep = false;
  auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) too_deep = true;
    return !too_deep;  // discard, rather than build, anything deeper
  };
  nlohmann::json j = nlohmann::json::parse(text, limit_depth, /*allow_exceptions=*/false);
  if (too_deep)
    return KILN_ERROR("metadata section: {} nest deeper than {} levels", what, kMaxJsonDepth);
  if (j.is_discarded()) return KILN_ERROR("metadata section: {} are not valid JSON", what);
  return j;
}

Status encode_meta(const EngineMetadata& meta, std::vector<uint8_t>& out) {
  const std::string version =
      meta.kiln_version.empty() ? std::string(KILN_VERSION_STRING) : meta.kiln_version;
  // replace: invalid UTF-8 in a string option must not throw.
  const std::string options =
      meta.build_options.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  KILN_RETURN_IF_ERROR(parse_options(options).status());  // what the reader would refuse
  const std::string plan =
      meta.backend_plan.is_null()
          ? std::string("{}")
          : meta.backend_plan.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  KILN_RETURN_IF_ERROR(parse_options(plan, "backend plan").status());
  ByteWriter w(out);
  for (const std::string* s : {&version, &meta.backend, &meta.target, &options, &plan}) {
    if (s->size() >= kNoValue) return KILN_ERROR("metadata string too long ({} bytes)", s->size());
    w.str(*s);
  }
  return Status::Ok();
}

Expected<EngineMetadata> decode_meta(const uint8_t* data, size_t size) {
  ByteReader r(data, size, "metadata");
  EngineMetadata meta;
  std::string options;
  KILN_RETURN_IF_ERROR(r.str(meta.kiln_version, "kiln version"));
  KILN_RETURN_IF_ERROR(r.str(meta.backend, "backend"));
  KILN_RETURN_IF_ERROR(r.str(meta.target, "target"));
  KILN_RETURN_IF_ERROR(r.str(options, "build options"));
  std::string plan;
  KILN_RETURN_IF_ERROR(r.str(plan, "backend plan"));
  KILN_RETURN_IF_ERROR(r.finish());
  KILN_ASSIGN_OR_RETURN(meta.build_options, parse_options(options));
  KILN_ASSIGN_OR_RETURN(meta.backend_plan, parse_options(plan, "backend plan"));
  return meta;
}

// A section [offset, offset+size) must lie between the header and the trailer, after `floor`.
Status check_section(const char* name, uint64_t offset, uint64_t size, uint64_t floor,
                     uint64_t limit) {
  if (offset < floor || offset > limit || size > limit - offset)
    return KILN_ERROR("{} section [{}, +{}) lies outside bytes [{}, {}) of the file", name, offset,
                      size, floor, limit);
  return Status::Ok();
}

struct AlignedBuffer {
  static std::shared_ptr<uint8_t> allocate(size_t size) {
    void* p = std::aligned_alloc(kAlign, align_up(size == 0 ? 1 : size));
    if (!p) return nullptr;
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
  }
};

}  // namespace

Expected<LoadedPlan> parse_image(const uint8_t* data, size_t size,
                                 std::shared_ptr<const void> owner, const std::string& source) {
  auto fail = [&](const Status& s) { return s.with_context(source); };
  if (size == 0) return fail(KILN_ERROR("empty file"));
  if (std::memcmp(data, kMagic, std::min(size, sizeof(kMagic))) != 0)
    return fail(KILN_ERROR("not a kiln engine (bad magic)"));
  if (size < kOffFileSize + 8)
    return fail(KILN_ERROR("truncated: file has {} bytes, shorter than the {}-byte header", size,
                           kHeaderSize));
  const uint32_t version = load_u32(data + kOffVersion);
  if (version != kPlanFormatVersion)
    return fail(
        KILN_ERROR("engine format version {} is not supported by this kiln (supports {}); "
                   "rebuild the engine with `kiln build`",
                   version, kPlanFormatVersion));
  const uint64_t file_size = load_u64(data + kOffFileSize);
  if (file_size > size)
    return fail(KILN_ERROR("truncated: header says {} bytes, file has {}", file_size, size));
  if (file_size < size)
    return fail(KILN_ERROR("trailing data: header says {} bytes, file has {}", file_size, size));
  if (size < kHeaderSize + kTrailerSize)
    return fail(
        KILN_ERROR("truncated: file has {} bytes, less than a header and a checksum", size));
  const size_t body = size - kTrailerSize;
  if (xxh64(data, body) != load_u64(data + body))
    return fail(KILN_ERROR("checksum mismatch (file corrupted)"));

  // From here on the bytes are as written, unless someone forged the checksum: keep checking.
  if (load_u32(data + kOffFlags) != 0 || load_u64(data + kOffReserved) != 0)
    return fail(KILN_ERROR("header has unknown flags set"));
  const uint64_t meta_off = load_u64(data + kOffMeta), meta_size = load_u64(data + kOffMeta + 8);
  const uint64_t graph_off = load_u64(data + kOffGraph),
                 graph_size = load_u64(data + kOffGraph + 8);
  const uint64_t w_off = load_u64(data + kOffWeights), w_size = load_u64(data + kOffWeights + 8);
  KILN_RETURN_IF_ERROR(fail(check_section("metadata", meta_off, meta_size, kHeaderSize, body)));
  KILN_RETURN_IF_ERROR(
      fail(check_section("graph", graph_off, graph_size, meta_off + meta_size, body)));
  KILN_RETURN_IF_ERROR(fail(check_section("weights", w_off, w_size, graph_off + graph_size, body)));
  if (w_off % kAlign != 0)
    return fail(KILN_ERROR("weights section offset {} is not a multiple of {}", w_off, kAlign));
  if (reinterpret_cast<uintptr_t>(data) % kAlign != 0)
    return fail(
        KILN_ERROR("internal error: engine image is not {}-byte aligned in memory", kAlign));

  LoadedPlan plan;
  auto meta = decode_meta(data + meta_off, meta_size);
  if (!meta.ok()) return fail(meta.status());
  plan.meta = std::move(meta).value();
  auto graph = decode_graph(data + graph_off, graph_size, data + w_off, w_size, std::move(owner));
  if (!graph.ok()) return fail(graph.status());
  plan.graph = std::move(graph).value();
  return plan;
}

}  // namespace plan_internal

using namespace plan_internal;

Expected<std::vector<uint8_t>> serialize_plan(const Graph& g, const EngineMetadata& meta) {
  std::vector<uint8_t> meta_bytes, graph_bytes;
  KILN_RETURN_IF_ERROR(encode_meta(meta, meta_bytes));
  std::vector<WeightEntry> weights;
  auto w_size = encode_graph(g, graph_bytes, weights);
  if (!w_size.ok()) return w_size.status().with_context(fmt::format("graph '{}'", g.name));

  const uint64_t meta_off = kHeaderSize;
  const uint64_t graph_off = meta_off + meta_bytes.size();
  const uint64_t w_off = align_up(graph_off + graph_bytes.size());
  const uint64_t file_size = w_off + *w_size + kTrailerSize;
  std::vector<uint8_t> out(file_size, 0);
  uint8_t* p = out.data();
  std::memcpy(p, kMagic, sizeof(kMagic));
  store_u32(p + kOffVersion, kPlanFormatVersion);
  store_u32(p + kOffFlags, 0);
  store_u64(p + kOffFileSize, file_size);
  store_u64(p + kOffMeta, meta_off);
  store_u64(p + kOffMeta + 8, meta_bytes.size());
  store_u64(p + kOffGraph, graph_off);
  store_u64(p + kOffGraph + 8, graph_bytes.size());
  store_u64(p + kOffWeights, w_off);
  store_u64(p + kOffWeights + 8, *w_size);
  store_u64(p + kOffReserved, 0);
  std::memcpy(p + meta_off, meta_bytes.data(), meta_bytes.size());
  if (!graph_bytes.empty()) std::memcpy(p + graph_off, graph_bytes.data(), graph_bytes.size());
  for (const WeightEntry& e : weights)
    if (e.tensor->nbytes()) std::memcpy(p + w_off + e.offset, e.tensor->raw(), e.tensor->nbytes());
  reseal(out);
  return out;
}

Expected<LoadedPlan> deserialize_plan(std::shared_ptr<const std::vector<uint8_t>> bytes,
                                      const std::string& source_name) {
  if (!bytes) return KILN_ERROR("{}: empty file", source_name);
  const size_t size = bytes->size();
  if (size == 0 || reinterpret_cast<uintptr_t>(bytes->data()) % kAlign == 0)
    return parse_image(bytes->data(), size, bytes, source_name);
  // Tensor views need 64-byte aligned data: copy once into an aligned buffer.
  std::shared_ptr<uint8_t> copy = AlignedBuffer::allocate(size);
  if (!copy) return KILN_ERROR("{}: out of memory loading {} bytes", source_name, size);
  std::memcpy(copy.get(), bytes->data(), size);
  return parse_image(copy.get(), size, copy, source_name);
}

Status write_plan_file(const std::string& path, const Graph& g, const EngineMetadata& meta) {
  KILN_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, serialize_plan(g, meta));
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return KILN_ERROR("{}: cannot write: {}", path, std::strerror(errno));
  const bool wrote = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote) {
    std::remove(tmp.c_str());
    return KILN_ERROR("{}: cannot write: {}", path, std::strerror(wrote ? errno : err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    std::remove(tmp.c_str());
    return KILN_ERROR("{}: cannot write: {}", path, std::strerror(rerr));
  }
  return Status::Ok();
}

Expected<LoadedPlan> read_plan_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return KILN_ERROR("{}: cannot open: {}", path, std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return KILN_ERROR("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return KILN_ERROR("{}: not a regular file", path);
  const size_t expected = static_cast<size_t>(st.st_size);
  if (expected == 0) return KILN_ERROR("{}: empty file", path);
  std::shared_ptr<uint8_t> buf = AlignedBuffer::allocate(expected);
  if (!buf) return KILN_ERROR("{}: out of memory loading {} bytes", path, expected);
  size_t got = 0;
  while (got < expected) {
    const ssize_t n = ::read(fd, buf.get() + got, expected - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return KILN_ERROR("{}: cannot read: {}", path, std::strerror(errno));
    if (n == 0) break;  // the file shrank while we read it: parse what is there
    got += static_cast<size_t>(n);
  }
  return parse_image(buf.get(), got, buf, path);
}

}  // namespace kiln
