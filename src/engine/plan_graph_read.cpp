// Decodes the engine file's graph section (layout: docs/engine-format.md). Every count, length,
// offset, type code and reference is checked before use; constant tensors become zero-copy views
// into the weights section.
#include <fmt/format.h>

#include <limits>
#include <set>

#include "engine/plan_format.h"

namespace kiln::plan_internal {
namespace {

// Smallest encodings, used to bound counts by the bytes left before allocating anything.
constexpr size_t kMinTensorBytes = 4 + 4 + 8 + 8;  // dtype, rank, offset, size
constexpr size_t kMinValueBytes = 4 + 4 + 1 + 4 + 4;  // name, dtype, has_dims, constant, scales
constexpr size_t kMinDimBytes = 8 + 4;             // value, symbol
constexpr size_t kMinNodeBytes = 4 * 4 + 4 * 4;    // 4 strings, 4 counts
constexpr size_t kMinAttrBytes = 4 + 1;            // name, kind

class GraphDecoder {
 public:
  GraphDecoder(const uint8_t* data, size_t size, const uint8_t* weights, size_t weights_size,
               std::shared_ptr<const void> owner)
      : r_(data, size, "graph"),
        weights_(weights),
        weights_size_(weights_size),
        owner_(std::move(owner)),
        g_(std::make_unique<Graph>()) {}

  Expected<std::unique_ptr<Graph>> run() {
    KILN_RETURN_IF_ERROR(r_.str(g_->name, "graph name"));
    int64_t opset = 0;
    KILN_RETURN_IF_ERROR(r_.i64(opset, "opset"));
    if (opset < std::numeric_limits<int>::min() || opset > std::numeric_limits<int>::max())
      return r_.error(fmt::format("opset {} is out of range", opset));
    g_->opset = static_cast<int>(opset);

    uint32_t n = 0;
    KILN_RETURN_IF_ERROR(r_.count(n, kMinTensorBytes, "tensor count"));
    tensors_.reserve(n);
    for (uint32_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(tensor(i));

    KILN_RETURN_IF_ERROR(body());
    KILN_RETURN_IF_ERROR(r_.finish());
    return std::move(g_);
  }

 private:
  // The values, inputs, outputs and nodes of the current graph (g_: the main graph or a
  // subgraph; value references index its own value table).
  Status body() {
    uint32_t n = 0;
    KILN_RETURN_IF_ERROR(r_.count(n, kMinValueBytes, "value count"));
    values_.reserve(n);
    for (uint32_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(value(i));

    std::vector<uint32_t> io;
    KILN_RETURN_IF_ERROR(refs(io, "graph input"));
    for (uint32_t v : io) g_->add_input(at(v));
    KILN_RETURN_IF_ERROR(refs(io, "graph output"));
    for (uint32_t v : io) g_->add_output(at(v));

    KILN_RETURN_IF_ERROR(r_.count(n, kMinNodeBytes, "node count"));
    produced_.assign(values_.size(), false);
    for (uint32_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(node());
    return Status::Ok();
  }

  // A graph attribute (format 4): a subgraph's name and body, nested at most kMaxSubgraphDepth.
  Status subgraph(Attribute& a) {
    if (depth_ >= kMaxSubgraphDepth)
      return r_.error(fmt::format("subgraphs nest deeper than {} levels", kMaxSubgraphDepth));
    std::string name;
    KILN_RETURN_IF_ERROR(r_.str(name, "subgraph name"));
    const int opset = g_->opset;
    std::unique_ptr<Graph> saved_g = std::move(g_);
    std::vector<Value*> saved_values = std::move(values_);
    std::set<std::string> saved_names = std::move(names_);
    std::vector<bool> saved_produced = std::move(produced_);
    // The decoder owns the graph it fills; the subgraph is handed to the attribute after.
    g_ = std::make_unique<Graph>();
    g_->name = std::move(name);
    g_->opset = opset;
    values_.clear();
    names_.clear();
    produced_.clear();
    ++depth_;
    Status st = body();
    --depth_;
    std::unique_ptr<Graph> done = std::move(g_);
    g_ = std::move(saved_g);
    values_ = std::move(saved_values);
    names_ = std::move(saved_names);
    produced_ = std::move(saved_produced);
    KILN_RETURN_IF_ERROR(st);
    a.kind = Attribute::Kind::kGraph;
    a.g = std::shared_ptr<Graph>(std::move(done));
    return Status::Ok();
  }

  Status tensor(uint32_t i) {
    uint32_t code = 0, rank = 0;
    KILN_RETURN_IF_ERROR(r_.u32(code, "tensor element type"));
    const DataType dtype = static_cast<DataType>(code);
    if (!dtype_code_is_valid(code) || !dtype_is_supported(dtype))
      return r_.error(fmt::format("tensor {} has an invalid element type code {}", i, code));
    KILN_RETURN_IF_ERROR(r_.count(rank, 8, "tensor rank"));
    std::vector<int64_t> shape(rank);
    // Element count, multiplied in Tensor::numel()'s order so that it cannot overflow there.
    int64_t numel = 1;
    for (uint32_t k = 0; k < rank; ++k) {
      KILN_RETURN_IF_ERROR(r_.i64(shape[k], "tensor dim"));
      const int64_t d = shape[k];
      if (d < 0) return r_.error(fmt::format("tensor {} has a negative dim {}", i, d));
      if (numel != 0 && d > std::numeric_limits<int64_t>::max() / numel)
        return r_.error(fmt::format("tensor {} has too many elements", i));
      numel *= d;
    }
    uint64_t offset = 0, nbytes = 0;
    KILN_RETURN_IF_ERROR(r_.u64(offset, "tensor offset"));
    KILN_RETURN_IF_ERROR(r_.u64(nbytes, "tensor size"));
    const uint64_t elem = dtype_size(dtype);
    if (static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / elem ||
        static_cast<uint64_t>(numel) * elem != nbytes)
      return r_.error(fmt::format("tensor {} ({}{}) does not take {} bytes", i, dtype_name(dtype),
                                  shape_str(shape), nbytes));
    if (offset % kAlign != 0)
      return r_.error(
          fmt::format("tensor {} offset {} is not a multiple of {}", i, offset, kAlign));
    if (offset > weights_size_ || nbytes > weights_size_ - offset)
      return r_.error(fmt::format("tensor {} [{}, +{}) lies outside the {}-byte weights section", i,
                                  offset, nbytes, weights_size_));
    tensors_.push_back(std::make_shared<const Tensor>(
        Tensor::view(dtype, std::move(shape), weights_ + offset, owner_)));
    return Status::Ok();
  }

  Status value(uint32_t i) {
    std::string name;
    KILN_RETURN_IF_ERROR(r_.str(name, "value name"));
    if (name.empty()) return r_.error(fmt::format("value {} has no name", i));
    if (!names_.insert(name).second)
      return r_.error(fmt::format("two values are named '{}'", printable(name)));
    TensorType type;
    uint32_t code = 0;
    KILN_RETURN_IF_ERROR(r_.u32(code, "value element type"));
    if (!dtype_code_is_valid(code))
      return r_.error(
          fmt::format("value '{}' has an invalid element type code {}", printable(name), code));
    type.dtype = static_cast<DataType>(code);
    uint8_t has_dims = 0;
    KILN_RETURN_IF_ERROR(r_.u8(has_dims, "value rank flag"));
    if (has_dims > 1)
      return r_.error(fmt::format("value '{}' has a bad rank flag", printable(name)));
    if (has_dims) {
      uint32_t rank = 0;
      KILN_RETURN_IF_ERROR(r_.count(rank, kMinDimBytes, "value rank"));
      std::vector<Dim> dims(rank);
      for (Dim& d : dims) {
        KILN_RETURN_IF_ERROR(r_.i64(d.value, "dim"));
        if (d.value < -1)
          return r_.error(fmt::format("value '{}' has a bad dim {}", printable(name), d.value));
        KILN_RETURN_IF_ERROR(r_.str(d.symbol, "dim symbol"));
      }
      type.dims = std::move(dims);
    }
    uint32_t t = 0;
    KILN_RETURN_IF_ERROR(r_.u32(t, "value constant"));
    if (t != kNoValue && t >= tensors_.size())
      return r_.error(
          fmt::format("value '{}' refers to tensor {} of {}", printable(name), t, tensors_.size()));
    Value* v = g_->add_value(name, std::move(type));
    if (t != kNoValue) v->constant = tensors_[t];
    KILN_RETURN_IF_ERROR(quant(*v));
    values_.push_back(v);
    return Status::Ok();
  }

  // Format 3: INT8 scales of a value (docs/engine-format.md), checked like everything else.
  Status quant(Value& v) {
    uint32_t n = 0;
    KILN_RETURN_IF_ERROR(r_.count(n, 4, "quantization scale count"));
    v.quant_scales.resize(n);
    for (float& s : v.quant_scales) KILN_RETURN_IF_ERROR(r_.f32(s, "quantization scale"));
    if (n > 1) KILN_RETURN_IF_ERROR(r_.i64(v.quant_axis, "quantization axis"));
    Status st = check_quant_params(v);
    if (!st.ok()) return r_.error(st.message());
    return Status::Ok();
  }

  // Reads a counted list of value references (kNoValue = absent), each checked to be in range.
  Status refs(std::vector<uint32_t>& out, const char* what) {
    uint32_t n = 0;
    KILN_RETURN_IF_ERROR(r_.count(n, 4, what));
    out.assign(n, kNoValue);
    for (uint32_t& idx : out) {
      KILN_RETURN_IF_ERROR(r_.u32(idx, what));
      if (idx != kNoValue && idx >= values_.size())
        return r_.error(fmt::format("{} refers to value {} of {}", what, idx, values_.size()));
    }
    return Status::Ok();
  }
  Value* at(uint32_t idx) const { return idx == kNoValue ? nullptr : values_[idx]; }

  Status node() {
    std::string name, op_type, domain, origin;
    KILN_RETURN_IF_ERROR(r_.str(name, "node name"));
    KILN_RETURN_IF_ERROR(r_.str(op_type, "op type"));
    KILN_RETURN_IF_ERROR(r_.str(domain, "node domain"));
    KILN_RETURN_IF_ERROR(r_.str(origin, "node origin"));
    uint32_t n = 0;
    KILN_RETURN_IF_ERROR(r_.count(n, 4, "onnx node count"));
    std::vector<std::string> onnx_nodes(n);
    for (std::string& s : onnx_nodes) KILN_RETURN_IF_ERROR(r_.str(s, "onnx node name"));
    std::vector<uint32_t> in_idx, out_idx;
    KILN_RETURN_IF_ERROR(refs(in_idx, "node input"));
    KILN_RETURN_IF_ERROR(refs(out_idx, "node output"));
    for (uint32_t o : out_idx) {
      if (o == kNoValue) continue;
      if (produced_[o])
        return r_.error(
            fmt::format("value '{}' is the output of two nodes", printable(values_[o]->name)));
      produced_[o] = true;
    }
    Attributes attrs;
    KILN_RETURN_IF_ERROR(r_.count(n, kMinAttrBytes, "attribute count"));
    for (uint32_t k = 0; k < n; ++k) KILN_RETURN_IF_ERROR(attribute(attrs));

    std::vector<Value*> inputs;
    for (uint32_t v : in_idx) inputs.push_back(at(v));
    // add_node would search for a fresh name for an empty one (slow for many): set it after.
    Node* node = g_->add_node(op_type, "_", inputs, {}, domain);
    node->name = std::move(name);
    node->origin = std::move(origin);
    node->onnx_nodes = std::move(onnx_nodes);
    node->attrs = std::move(attrs);
    for (size_t k = 0; k < out_idx.size(); ++k) g_->set_node_output(node, k, at(out_idx[k]));
    return Status::Ok();
  }

  Status attribute(Attributes& attrs) {
    std::string name;
    KILN_RETURN_IF_ERROR(r_.str(name, "attribute name"));
    if (attrs.has(name))
      return r_.error(fmt::format("attribute '{}' appears twice", printable(name)));
    uint8_t code = 0;
    KILN_RETURN_IF_ERROR(r_.u8(code, "attribute kind"));
    Attribute a;
    uint32_t n = 0;
    switch (static_cast<AttrCode>(code)) {
      case AttrCode::kFloat:
        a.kind = Attribute::Kind::kFloat;
        KILN_RETURN_IF_ERROR(r_.f32(a.f, "float attribute"));
        break;
      case AttrCode::kInt:
        a.kind = Attribute::Kind::kInt;
        KILN_RETURN_IF_ERROR(r_.i64(a.i, "int attribute"));
        break;
      case AttrCode::kString:
        a.kind = Attribute::Kind::kString;
        KILN_RETURN_IF_ERROR(r_.str(a.s, "string attribute"));
        break;
      case AttrCode::kTensor: {
        a.kind = Attribute::Kind::kTensor;
        uint32_t t = 0;
        KILN_RETURN_IF_ERROR(r_.u32(t, "tensor attribute"));
        if (t != kNoValue && t >= tensors_.size())
          return r_.error(fmt::format("attribute '{}' refers to tensor {} of {}", printable(name),
                                      t, tensors_.size()));
        if (t != kNoValue) a.t = tensors_[t];
        break;
      }
      case AttrCode::kFloats:
        a.kind = Attribute::Kind::kFloats;
        KILN_RETURN_IF_ERROR(r_.count(n, 4, "float count"));
        a.floats.resize(n);
        for (float& f : a.floats) KILN_RETURN_IF_ERROR(r_.f32(f, "float attribute"));
        break;
      case AttrCode::kInts:
        a.kind = Attribute::Kind::kInts;
        KILN_RETURN_IF_ERROR(r_.count(n, 8, "int count"));
        a.ints.resize(n);
        for (int64_t& v : a.ints) KILN_RETURN_IF_ERROR(r_.i64(v, "int attribute"));
        break;
      case AttrCode::kStrings:
        a.kind = Attribute::Kind::kStrings;
        KILN_RETURN_IF_ERROR(r_.count(n, 4, "string count"));
        a.strings.resize(n);
        for (std::string& s : a.strings) KILN_RETURN_IF_ERROR(r_.str(s, "string attribute"));
        break;
      case AttrCode::kGraph:
        KILN_RETURN_IF_ERROR(subgraph(a));
        break;
      default:
        return r_.error(
            fmt::format("attribute '{}' has an invalid kind code {}", printable(name), code));
    }
    attrs.set(name, std::move(a));
    return Status::Ok();
  }

  ByteReader r_;
  const uint8_t* weights_;
  size_t weights_size_;
  std::shared_ptr<const void> owner_;
  std::unique_ptr<Graph> g_;
  std::vector<std::shared_ptr<const Tensor>> tensors_;
  std::vector<Value*> values_;
  std::set<std::string> names_;
  std::vector<bool> produced_;
  int depth_ = 0;
};

}  // namespace

Expected<std::unique_ptr<Graph>> decode_graph(const uint8_t* data, size_t size,
                                              const uint8_t* weights, size_t weights_size,
                                              std::shared_ptr<const void> owner) {
  return GraphDecoder(data, size, weights, weights_size, std::move(owner)).run();
}

}  // namespace kiln::plan_internal
