#include "onnx/sequences.h"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "onnx/onnx.pb.h"
#include "onnx/tensor_proto.h"

namespace kiln {
namespace {

bool onnx_domain(const onnx::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }

struct IntConst {
  std::vector<int64_t> values;
  int rank = 1;
};

// The int64/int32 constants of the graph: initializers and Constant nodes.
std::map<std::string, IntConst> int_constants(const onnx::GraphProto& g, const std::string& dir) {
  std::map<std::string, IntConst> out;
  auto add = [&](const std::string& name, const onnx::TensorProto& t) {
    if (t.data_type() != onnx::TensorProto::INT64 && t.data_type() != onnx::TensorProto::INT32)
      return;
    auto v = tensor_from_proto(t, dir, name);
    if (v.ok()) out[name] = {v->to_int64_vector(), static_cast<int>(v->rank())};
  };
  for (const auto& t : g.initializer()) add(t.name(), t);
  for (const auto& n : g.node()) {
    if (n.op_type() != "Constant" || !onnx_domain(n) || n.output_size() != 1) continue;
    for (const auto& a : n.attribute()) {
      if (a.name() == "value" && a.has_t()) add(n.output(0), a.t());
      if (a.name() == "value_int") out[n.output(0)] = {{a.i()}, 0};
      if (a.name() == "value_ints") out[n.output(0)] = {{a.ints().begin(), a.ints().end()}, 1};
    }
  }
  return out;
}

void add_ints(onnx::GraphProto& g, const std::string& name, const std::vector<int64_t>& v) {
  auto* t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
}

// [begin, end) of x's axis that part p is; nullopt where the position needs x's
// size (a negative one without a split list).
std::optional<std::pair<int64_t, int64_t>> part_range(const std::optional<IntConst>& split,
                                                      int64_t p) {
  if (!split) return p < 0 ? std::nullopt : std::make_optional(std::make_pair(p, p + 1));
  const auto& s = split->values;
  if (split->rank == 0) {  // equal chunks of s[0]; the last may be shorter (Slice clamps)
    if (s.size() != 1 || s[0] <= 0 || p < 0) return std::nullopt;
    return std::make_pair(p * s[0], (p + 1) * s[0]);
  }
  const int64_t n = static_cast<int64_t>(s.size());
  if (p < 0) p += n;
  if (p < 0 || p >= n) return std::nullopt;
  int64_t begin = 0;
  for (int64_t i = 0; i < p; ++i) begin += s[static_cast<size_t>(i)];
  return std::make_pair(begin, begin + s[static_cast<size_t>(p)]);
}

}  // namespace

Status lower_split_to_sequence(onnx::GraphProto& g, const std::string& base_dir) {
  for (auto& n : *g.mutable_node())
    for (auto& a : *n.mutable_attribute())
      if (a.has_g()) KILN_RETURN_IF_ERROR(lower_split_to_sequence(*a.mutable_g(), base_dir));
  const auto consts = int_constants(g, base_dir);
  std::map<std::string, std::vector<int>> readers;  // value -> indices of the nodes reading it
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto& in : g.node(i).input()) readers[in].push_back(i);
  std::set<std::string> outputs;
  for (const auto& o : g.output()) outputs.insert(o.name());
  std::set<int> drop;
  std::vector<onnx::NodeProto> squeezes;
  for (int i = 0; i < g.node_size(); ++i) {
    const onnx::NodeProto& s = g.node(i);
    if (s.op_type() != "SplitToSequence" || !onnx_domain(s) || s.output_size() != 1 ||
        s.input_size() < 1)
      continue;  // malformed ones are the importer's to refuse
    const std::string& seq = s.output(0);
    int64_t axis = 0, keepdims = 1;
    for (const auto& a : s.attribute()) {
      if (a.name() == "axis") axis = a.i();
      if (a.name() == "keepdims") keepdims = a.i();
    }
    std::optional<IntConst> split;
    if (s.input_size() > 1 && !s.input(1).empty()) {
      auto it = consts.find(s.input(1));
      if (it == consts.end()) continue;
      split = it->second;
    }
    // Every reader a SequenceAt at a constant position whose part is known.
    std::vector<std::pair<int, std::pair<int64_t, int64_t>>> parts;
    bool ok = !outputs.count(seq) && readers.count(seq);
    for (int r : ok ? readers[seq] : std::vector<int>{}) {
      const onnx::NodeProto& at = g.node(r);
      auto pos = at.input_size() == 2 ? consts.find(at.input(1)) : consts.end();
      if (at.op_type() != "SequenceAt" || !onnx_domain(at) || at.input(0) != seq ||
          at.output_size() != 1 || pos == consts.end() || pos->second.values.size() != 1) {
        ok = false;
        break;
      }
      auto range = part_range(split, pos->second.values[0]);
      if (!range) {
        ok = false;
        break;
      }
      parts.push_back({r, *range});
    }
    if (!ok) continue;
    const bool squeeze = !split && keepdims == 0;
    for (const auto& [r, range] : parts) {
      onnx::NodeProto& at = *g.mutable_node(r);
      const std::string base = fmt::format("{}_part{}", seq, r);
      add_ints(g, base + "_starts", {range.first});
      add_ints(g, base + "_ends", {range.second});
      add_ints(g, base + "_axes", {axis});
      const std::string out = at.output(0);
      at.set_op_type("Slice");
      at.clear_input();
      at.clear_attribute();
      for (const std::string& in : {s.input(0), base + "_starts", base + "_ends", base + "_axes"})
        at.add_input(in);
      if (squeeze) {
        at.set_output(0, base + "_slice");
        onnx::NodeProto q;
        q.set_op_type("Squeeze");
        q.set_name(at.name() + "_squeeze");
        q.add_input(base + "_slice");
        q.add_input(base + "_axes");
        q.add_output(out);
        squeezes.push_back(std::move(q));
      }
    }
    drop.insert(i);
  }
  if (drop.empty()) return Status::Ok();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < g.node_size(); ++i)
    if (!drop.count(i)) *kept.Add() = g.node(i);
  for (auto& q : squeezes) *kept.Add() = std::move(q);
  g.mutable_node()->Swap(&kept);
  return Status::Ok();
}

}  // namespace kiln
