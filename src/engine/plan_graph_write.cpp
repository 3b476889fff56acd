// Encodes a Graph as the engine file's graph section (layout: docs/engine-format.md).
// The writer refuses every graph the reader would refuse, so a written engine always loads.
#include <fmt/format.h>

#include <limits>
#include <set>
#include <unordered_map>

#include "engine/plan_format.h"

namespace kiln::plan_internal {
namespace {

constexpr uint64_t kMaxCount = std::numeric_limits<uint32_t>::max() - 1;  // kNoValue is reserved

AttrCode attr_code(Attribute::Kind k) {
  switch (k) {
    case Attribute::Kind::kFloat:
      return AttrCode::kFloat;
    case Attribute::Kind::kInt:
      return AttrCode::kInt;
    case Attribute::Kind::kString:
      return AttrCode::kString;
    case Attribute::Kind::kTensor:
      return AttrCode::kTensor;
    case Attribute::Kind::kFloats:
      return AttrCode::kFloats;
    case Attribute::Kind::kInts:
      return AttrCode::kInts;
    case Attribute::Kind::kStrings:
      return AttrCode::kStrings;
    case Attribute::Kind::kGraph:
      return AttrCode::kGraph;
  }
  return AttrCode::kInt;
}

class GraphEncoder {
 public:
  GraphEncoder(const Graph& g, std::vector<uint8_t>& out, std::vector<WeightEntry>& weights)
      : g_(&g), out_(out), w_(out), weights_(weights) {}

  Expected<uint64_t> run() {
    KILN_RETURN_IF_ERROR(collect_tensors(*g_, 0));
    KILN_RETURN_IF_ERROR(str(g_->name, "graph name"));
    w_.i64(g_->opset);
    w_.u32(static_cast<uint32_t>(weights_.size()));
    for (const WeightEntry& e : weights_) {
      w_.u32(static_cast<uint32_t>(e.tensor->dtype()));
      w_.u32(static_cast<uint32_t>(e.tensor->shape().size()));
      for (int64_t d : e.tensor->shape()) w_.i64(d);
      w_.u64(e.offset);
      w_.u64(e.tensor->nbytes());
    }
    KILN_RETURN_IF_ERROR(body());
    return weights_size_;
  }

 private:
  Status count(size_t n, const char* what) {
    if (n > kMaxCount) return KILN_ERROR("too many {} ({}) for the engine format", what, n);
    w_.u32(static_cast<uint32_t>(n));
    return Status::Ok();
  }
  Status str(const std::string& s, const char* what) {
    if (s.size() > kMaxCount) return KILN_ERROR("{} is too long ({} bytes)", what, s.size());
    w_.str(s);
    return Status::Ok();
  }

  // The values, inputs, outputs and nodes of the current graph (the main graph, or a subgraph
  // with its own value table over the file's one tensor table).
  Status body() {
    KILN_RETURN_IF_ERROR(index_values());
    w_.u32(static_cast<uint32_t>(values_.size()));
    for (const Value* v : values_) KILN_RETURN_IF_ERROR(value(*v));
    KILN_RETURN_IF_ERROR(refs(g_->inputs(), "graph inputs"));
    KILN_RETURN_IF_ERROR(refs(g_->outputs(), "graph outputs"));
    KILN_RETURN_IF_ERROR(count(g_->nodes().size(), "nodes"));
    for (const Node* n : g_->nodes()) KILN_RETURN_IF_ERROR(node(*n));
    return Status::Ok();
  }

  Status subgraph(const Graph& sub) {
    const Graph* saved_g = g_;
    std::vector<Value*> saved_values = std::move(values_);
    std::unordered_map<const Value*, uint32_t> saved_index = std::move(index_);
    g_ = &sub;
    values_.clear();
    index_.clear();
    KILN_RETURN_IF_ERROR(str(sub.name, "subgraph name"));
    Status st = body();
    g_ = saved_g;
    values_ = std::move(saved_values);
    index_ = std::move(saved_index);
    return st;
  }

  Status index_values() {
    values_ = g_->values();
    if (values_.size() > kMaxCount) return KILN_ERROR("too many values ({})", values_.size());
    std::set<std::string> names;
    for (size_t i = 0; i < values_.size(); ++i) {
      const Value* v = values_[i];
      if (v->name.empty()) return KILN_ERROR("value #{} has no name", i);
      if (!names.insert(v->name).second)
        return KILN_ERROR("two values are named '{}' (value names must be unique)", v->name);
      if (!dtype_code_is_valid(static_cast<int64_t>(v->type.dtype)))
        return KILN_ERROR("value '{}' has an invalid element type code {}", v->name,
                          static_cast<int>(v->type.dtype));
      if (v->type.dims)
        for (const Dim& d : *v->type.dims)
          if (d.value < -1) return KILN_ERROR("value '{}' has an invalid dim {}", v->name, d.value);
      index_[v] = static_cast<uint32_t>(i);
    }
    // Producers are rebuilt from node outputs on load, so they must agree with them.
    for (const Node* n : g_->nodes())
      for (size_t i = 0; i < n->num_outputs(); ++i) {
        const Value* o = n->output(i);
        if (o && (o->producer != n || o->producer_index != static_cast<int>(i)))
          return KILN_ERROR("{}: output {} '{}' does not name this node as its producer",
                            n->label(), i, o->name);
      }
    for (const Value* v : values_)
      if (v->producer && (v->producer->output(v->producer_index) != v))
        return KILN_ERROR("value '{}' names a producer that does not output it", v->name);
    return Status::Ok();
  }

  // Adds a tensor (once, even when shared by several values/attributes) to the weights list.
  Status add_tensor(const Tensor* t, const std::string& owner) {
    if (tensor_index_.count(t)) return Status::Ok();
    if (!dtype_is_supported(t->dtype()))
      return KILN_ERROR("{}: tensor element type {} cannot be stored", owner,
                        static_cast<int>(t->dtype()));
    uint64_t numel = 1;
    for (int64_t d : t->shape()) {
      if (d < 0) return KILN_ERROR("{}: tensor has a negative dim {}", owner, d);
      numel *= static_cast<uint64_t>(d);
    }
    if (numel != 0 && !t->raw()) return KILN_ERROR("{}: tensor has no data", owner);
    if (weights_.size() >= kMaxCount) return KILN_ERROR("too many tensors");
    weights_size_ = (weights_size_ + kAlign - 1) / kAlign * kAlign;
    tensor_index_[t] = static_cast<uint32_t>(weights_.size());
    weights_.push_back({t, weights_size_});
    weights_size_ += t->nbytes();
    return Status::Ok();
  }

  // The tensors of `g` and of its subgraphs, in one table.
  Status collect_tensors(const Graph& g, int depth) {
    if (depth > kMaxSubgraphDepth)
      return KILN_ERROR("subgraphs nest deeper than {} levels", kMaxSubgraphDepth);
    for (const Value* v : g.values())
      if (v->constant)
        KILN_RETURN_IF_ERROR(add_tensor(v->constant.get(), "value '" + v->name + "'"));
    for (const Node* n : g.nodes())
      for (const auto& [name, a] : n->attrs.all()) {
        if (a.kind == Attribute::Kind::kTensor && a.t)
          KILN_RETURN_IF_ERROR(
              add_tensor(a.t.get(), fmt::format("{} attribute '{}'", n->label(), name)));
        if (a.kind == Attribute::Kind::kGraph) {
          if (!a.g) return KILN_ERROR("{}: graph attribute '{}' holds no graph", n->label(), name);
          KILN_RETURN_IF_ERROR(collect_tensors(*a.g, depth + 1));
        }
      }
    return Status::Ok();
  }

  Status value(const Value& v) {
    KILN_RETURN_IF_ERROR(str(v.name, "value name"));
    w_.u32(static_cast<uint32_t>(v.type.dtype));
    w_.u8(v.type.dims ? 1 : 0);
    if (v.type.dims) {
      KILN_RETURN_IF_ERROR(count(v.type.dims->size(), "dims"));
      for (const Dim& d : *v.type.dims) {
        w_.i64(d.value);
        KILN_RETURN_IF_ERROR(str(d.symbol, "dim symbol"));
      }
    }
    w_.u32(v.constant ? tensor_index_.at(v.constant.get()) : kNoValue);
    return quant(v);
  }

  // Format 3: the value's INT8 scales (count, scales, then the axis when per channel).
  Status quant(const Value& v) {
    KILN_RETURN_IF_ERROR(check_quant_params(v));
    KILN_RETURN_IF_ERROR(count(v.quant_scales.size(), "quantization scales"));
    for (float s : v.quant_scales) w_.f32(s);
    if (v.quant_scales.size() > 1) w_.i64(v.quant_axis);
    return Status::Ok();
  }

  Status ref(const Value* v, const std::string& where) {
    if (!v) {
      w_.u32(kNoValue);
      return Status::Ok();
    }
    auto it = index_.find(v);
    if (it == index_.end())
      return KILN_ERROR("{} references value '{}' that the graph does not own", where, v->name);
    w_.u32(it->second);
    return Status::Ok();
  }
  Status refs(const std::vector<Value*>& vs, const std::string& where) {
    KILN_RETURN_IF_ERROR(count(vs.size(), "references"));
    for (const Value* v : vs) KILN_RETURN_IF_ERROR(ref(v, where));
    return Status::Ok();
  }

  Status node(const Node& n) {
    KILN_RETURN_IF_ERROR(str(n.name, "node name"));
    KILN_RETURN_IF_ERROR(str(n.op_type, "op type"));
    KILN_RETURN_IF_ERROR(str(n.domain, "domain"));
    KILN_RETURN_IF_ERROR(str(n.origin, "origin"));
    KILN_RETURN_IF_ERROR(count(n.onnx_nodes.size(), "onnx node names"));
    for (const std::string& s : n.onnx_nodes) KILN_RETURN_IF_ERROR(str(s, "onnx node name"));
    KILN_RETURN_IF_ERROR(refs(n.inputs(), n.label()));
    KILN_RETURN_IF_ERROR(refs(n.outputs(), n.label()));
    KILN_RETURN_IF_ERROR(count(n.attrs.all().size(), "attributes"));
    for (const auto& [name, a] : n.attrs.all()) KILN_RETURN_IF_ERROR(attribute(name, a));
    return Status::Ok();
  }

  Status attribute(const std::string& name, const Attribute& a) {
    KILN_RETURN_IF_ERROR(str(name, "attribute name"));
    const AttrCode code = attr_code(a.kind);
    w_.u8(static_cast<uint8_t>(code));
    switch (code) {
      case AttrCode::kFloat:
        w_.f32(a.f);
        break;
      case AttrCode::kInt:
        w_.i64(a.i);
        break;
      case AttrCode::kString:
        KILN_RETURN_IF_ERROR(str(a.s, "attribute string"));
        break;
      case AttrCode::kTensor:
        w_.u32(a.t ? tensor_index_.at(a.t.get()) : kNoValue);
        break;
      case AttrCode::kFloats:
        KILN_RETURN_IF_ERROR(count(a.floats.size(), "floats"));
        for (float f : a.floats) w_.f32(f);
        break;
      case AttrCode::kInts:
        KILN_RETURN_IF_ERROR(count(a.ints.size(), "ints"));
        for (int64_t i : a.ints) w_.i64(i);
        break;
      case AttrCode::kStrings:
        KILN_RETURN_IF_ERROR(count(a.strings.size(), "strings"));
        for (const std::string& s : a.strings) KILN_RETURN_IF_ERROR(str(s, "attribute string"));
        break;
      case AttrCode::kGraph:
        KILN_RETURN_IF_ERROR(subgraph(*a.g));
        break;
    }
    return Status::Ok();
  }

  const Graph* g_;  // the graph being written (a subgraph while one is)
  std::vector<uint8_t>& out_;
  ByteWriter w_;
  std::vector<WeightEntry>& weights_;
  uint64_t weights_size_ = 0;
  std::vector<Value*> values_;
  std::unordered_map<const Value*, uint32_t> index_;
  std::unordered_map<const Tensor*, uint32_t> tensor_index_;
};

}  // namespace

Expected<uint64_t> encode_graph(const Graph& g, std::vector<uint8_t>& out,
                                std::vector<WeightEntry>& weights) {
  return GraphEncoder(g, out, weights).run();
}

}  // namespace kiln::plan_internal
