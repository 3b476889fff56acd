// kiln's engine file (`.kiln`): a built graph plus its weights, metadata and a checksum.
// The byte layout is documented in docs/engine-format.md; keep the two in step.
//
// Reading validates everything before use: the checksum first, then every offset, size, count,
// type code and value reference (so a file whose checksum was forged still cannot make the reader
// crash, allocate without bound or return a malformed graph). Constant tensors of a loaded plan
// are zero-copy views into the loaded, 64-byte aligned buffer, which they keep alive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

struct EngineMetadata {
  std::string kiln_version;      // left empty, serialize_plan() stamps KILN_VERSION_STRING
  std::string backend;           // "cpu" or "cuda"
  std::string target;            // e.g. "cpu-x86_64" or "cuda sm_90 cuda13.0 cudnn9.14"
  nlohmann::json build_options;  // precision, opt level, profiles (shapes), ...
  // The backend's plan (format 2): one record per graph node, in node order, saying how the
  // backend runs it (tactic, variant, precision, tensor formats, tuned time). Empty for cpu.
  nlohmann::json backend_plan;
};

struct LoadedPlan {
  std::unique_ptr<Graph> graph;
  EngineMetadata meta;
};

inline constexpr uint32_t kPlanFormatVersion = 4;

// Encodes a graph and its metadata as an engine image. Refuses graphs that the reader would
// refuse (unnamed or duplicate value names, tensors of unsupported types, inconsistent producers).
Expected<std::vector<uint8_t>> serialize_plan(const Graph& g, const EngineMetadata& meta);
// Decodes an engine image; `source_name` (usually the file path) prefixes every error message.
// Copies the bytes once only if they are not 64-byte aligned in memory.
Expected<LoadedPlan> deserialize_plan(std::shared_ptr<const std::vector<uint8_t>> bytes,
                                      const std::string& source_name);
// Writes atomically (a temporary file next to `path`, then rename).
Status write_plan_file(const std::string& path, const Graph& g, const EngineMetadata& meta);
// Reads the whole file into a 64-byte aligned buffer and decodes it (no further copy).
Expected<LoadedPlan> read_plan_file(const std::string& path);

// Internals shared by the plan_*.cpp files, exposed for tests (which build corrupted files).
namespace plan_internal {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'E', 'N', 'G', '\0'};
inline constexpr size_t kHeaderSize = 80;
inline constexpr size_t kTrailerSize = 8;          // XXH64 checksum of all preceding bytes
inline constexpr size_t kAlign = 64;               // weights section and every tensor in it
inline constexpr uint32_t kNoValue = 0xFFFFFFFFu;  // "absent" value / tensor reference

// Offsets of the header fields.
inline constexpr size_t kOffVersion = 8;
inline constexpr size_t kOffFlags = 12;
inline constexpr size_t kOffFileSize = 16;
inline constexpr size_t kOffMeta = 24;  // u64 offset, then u64 size
inline constexpr size_t kOffGraph = 40;
inline constexpr size_t kOffWeights = 56;
inline constexpr size_t kOffReserved = 72;

// Attribute kind codes as stored in the file (independent of Attribute::Kind's order).
enum class AttrCode : uint8_t {
  kFloat = 0,
  kInt = 1,
  kString = 2,
  kTensor = 3,
  kFloats = 4,
  kInts = 5,
  kStrings = 6,
  kGraph = 7  // format 4: a subgraph (If, Loop, Scan), its own values over the file's tensors
};
// Subgraphs nest at most this deep in an engine file (ONNX sets no limit; models use a few).
inline constexpr int kMaxSubgraphDepth = 32;

// The rules a value's INT8 scales follow (writer and reader): every scale finite and > 0; one
// scale (per tensor, axis -1) or one per channel of `quant_axis`, which must be a dimension of
// the value (its size, when static, equal to the number of scales).
Status check_quant_params(const Value& v);

// XXH64 (xxHash, 64-bit variant) of `size` bytes.
uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);
// Recomputes the trailing checksum of an engine image in place (no-op if too short).
void reseal(std::vector<uint8_t>& image);

// A name read from a file, safe to quote in a one-line message: bytes outside printable ASCII
// become \xNN, and long names are cut to 60 characters with "...".
std::string printable(const std::string& s);

// Little-endian field access on a byte vector (tests patch files with these).
uint64_t load_u64(const uint8_t* p);
uint32_t load_u32(const uint8_t* p);
void store_u64(uint8_t* p, uint64_t v);
void store_u32(uint8_t* p, uint32_t v);

// Appends little-endian fields to a byte vector.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f32(float v);
  void str(const std::string& s);  // u32 length, then the bytes (no terminator)

 private:
  std::vector<uint8_t>& out_;
};

// Reads little-endian fields from a byte range, refusing to read past its end. Errors say which
// section and field, and where: "graph section: truncated reading node name at byte 120".
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const char* section)
      : data_(data), size_(size), section_(section) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  Status u8(uint8_t& v, const char* what);
  Status u32(uint32_t& v, const char* what);
  Status u64(uint64_t& v, const char* what);
  Status i64(int64_t& v, const char* what);
  Status f32(float& v, const char* what);
  Status str(std::string& s, const char* what);
  // Reads a u32 count of items that take at least `min_item_bytes` each, and refuses it when
  // they could not fit in the remaining bytes (so no corrupted count drives an allocation).
  Status count(uint32_t& n, size_t min_item_bytes, const char* what);
  // Refuses unread trailing bytes.
  Status finish() const;
  // "graph section: <message> (at byte N)"
  Status error(const std::string& message) const;

 private:
  Status need(size_t n, const char* what) const;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const char* section_;
};

// A tensor placed in the weights section, at `offset` bytes from the section's start.
struct WeightEntry {
  const Tensor* tensor = nullptr;
  uint64_t offset = 0;
};

// Appends the graph section encoding of `g` to `out`; lists the tensors to place in the weights
// section (offsets relative to the section, 64-byte aligned) and returns the section's size.
Expected<uint64_t> encode_graph(const Graph& g, std::vector<uint8_t>& out,
                                std::vector<WeightEntry>& weights);

// Decodes a graph section. `weights` points at the weights section inside the loaded image,
// which `owner` keeps alive; it must be 64-byte aligned. Errors name the problem (no file).
Expected<std::unique_ptr<Graph>> decode_graph(const uint8_t* data, size_t size,
                                              const uint8_t* weights, size_t weights_size,
                                              std::shared_ptr<const void> owner);

// Decodes a whole image that lies at a 64-byte aligned address and is kept alive by `owner`.
Expected<LoadedPlan> parse_image(const uint8_t* data, size_t size,
                                 std::shared_ptr<const void> owner, const std::string& source);

}  // namespace plan_internal
}  // namespace kiln
