#include "ir/printer.h"

#include <fmt/format.h>

#include <unordered_map>

namespace kiln {
namespace {

constexpr int64_t kShowAllUpTo = 8;  // constants this small are printed in full
constexpr int64_t kShowFirst = 4;    // otherwise this many values, then "..."

std::string format_element(const Tensor& t, int64_t i) {
  // Shortest round-trip text at the tensor's own precision (no float32 noise digits).
  if (t.dtype() == DataType::kFloat64) return fmt::format("{}", t.at_double(i));
  if (dtype_is_float(t.dtype())) return fmt::format("{}", static_cast<float>(t.at_double(i)));
  if (t.dtype() == DataType::kBool) return t.at_int(i) ? "true" : "false";
  if (t.dtype() == DataType::kUInt64) return fmt::format("{}", static_cast<uint64_t>(t.at_int(i)));
  return fmt::format("{}", t.at_int(i));
}

std::string op_name(const Node& n) {
  return n.domain.empty() ? n.op_type : n.domain + "." + n.op_type;
}

std::string value_ref(const Value* v) { return v ? "%" + v->name : "_"; }

// A shape tensor's symbolic elements (Value::shape_value), as " {N,S,12,64}".
std::string shape_value_str(const Value& v) {
  if (!v.shape_value) return "";
  std::vector<std::string> parts;
  for (const SymInt& e : *v.shape_value)
    parts.push_back(e.value ? std::to_string(*e.value) : e.dim().str());
  return fmt::format(" {{{}}}", fmt::join(parts, ","));
}

std::string node_line(const Node& n) {
  std::vector<std::string> outs, ins, attrs;
  for (const Value* o : n.outputs())
    outs.push_back(o ? fmt::format("%{}: {}{}", o->name, o->type.str(), shape_value_str(*o)) : "_");
  for (const Value* v : n.inputs()) ins.push_back(value_ref(v));
  for (const auto& [name, a] : n.attrs.all()) attrs.push_back(name + "=" + a.str());
  std::string s = fmt::format("{} = {}", fmt::join(outs, ", "), op_name(n));
  if (!attrs.empty()) s += fmt::format("[{}]", fmt::join(attrs, ", "));
  s += fmt::format("({})  # {}, {}", fmt::join(ins, ", "), n.name, n.origin);
  if (!n.onnx_nodes.empty()) s += fmt::format(", covers: {}", fmt::join(n.onnx_nodes, ", "));
  return s;
}

// Escapes a string for a double-quoted dot label; "\n" in `s` becomes a dot line break.
std::string dot_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string constant_summary(const Value& v) {
  std::string s = v.type.str();
  if (!v.constant) return s;
  const Tensor& t = *v.constant;
  const int64_t n = t.numel();
  std::vector<std::string> vals;
  const int64_t shown = n <= kShowAllUpTo ? n : kShowFirst;
  for (int64_t i = 0; i < shown; ++i) vals.push_back(format_element(t, i));
  if (n > shown) vals.push_back("...");
  s += fmt::format(" = [{}]", fmt::join(vals, ", "));
  if (n > shown) s += fmt::format(" ({} values)", n);
  return s;
}

std::string graph_to_text(const Graph& g) {
  std::string s = fmt::format("graph '{}' (opset {})\n", g.name, g.opset);
  s += "inputs:\n";
  for (const Value* v : g.inputs())
    if (v) s += fmt::format("  %{}: {}\n", v->name, v->type.str());
  s += "constants:\n";
  for (const Value* v : g.values())
    if (v->is_constant()) s += fmt::format("  %{}: {}\n", v->name, constant_summary(*v));
  s += "nodes:\n";
  for (const Node* n : g.nodes()) {
    s += "  " + node_line(*n) + "\n";
    // A subgraph is listed under its node, indented.
    for (const auto& [name, a] : n->attrs.all()) {
      if (a.kind != Attribute::Kind::kGraph || !a.g) continue;
      s += fmt::format("    {}:\n", name);
      const std::string sub = graph_to_text(*a.g);
      for (size_t b = 0, e; b < sub.size(); b = e + 1) {
        e = sub.find('\n', b);
        if (e == std::string::npos) e = sub.size();
        s += "      " + sub.substr(b, e - b) + "\n";
      }
    }
  }
  s += "outputs:\n";
  for (const Value* v : g.outputs())
    if (v) s += fmt::format("  %{}: {}\n", v->name, v->type.str());
  return s;
}

std::string graph_to_dot(const Graph& g) {
  std::string s = fmt::format("digraph \"{}\" {{\n", dot_escape(g.name));
  s += "  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n"
       "  edge [fontname=\"Helvetica\", fontsize=8];\n";
  // Where each non-constant value comes from: a node or a graph-input ellipse.
  std::unordered_map<const Value*, std::string> source;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    const Value* v = g.inputs()[i];
    if (!v) continue;
    const std::string id = fmt::format("in{}", i);
    source[v] = id;
    s += fmt::format("  {} [shape=ellipse, label=\"{}\\n{}\"];\n", id, dot_escape(v->name),
                     dot_escape(v->type.str()));
  }
  for (const Node* n : g.nodes()) {
    const std::string id = fmt::format("n{}", n->index);
    std::string label = op_name(*n) + "\n" + n->name;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      if (v && v->is_constant() && !source.count(v))
        label += fmt::format("\n{}: {}", v->name, v->type.str());
    }
    s += fmt::format("  {} [shape=box, label=\"{}\"];\n", id, dot_escape(label));
    for (const Value* o : n->outputs())
      if (o) source[o] = id;
  }
  for (const Node* n : g.nodes()) {
    for (const Value* v : n->inputs()) {
      if (!v) continue;
      auto it = source.find(v);
      if (it == source.end()) continue;  // constants are folded into the label
      s += fmt::format("  {} -> n{} [label=\"{}\"];\n", it->second, n->index,
                       dot_escape(v->type.str()));
    }
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* v = g.outputs()[i];
    if (!v) continue;
    const std::string id = fmt::format("out{}", i);
    s += fmt::format("  {} [shape=ellipse, label=\"{}\\n{}\"];\n", id, dot_escape(v->name),
                     dot_escape(v->type.str()));
    auto it = source.find(v);
    if (it != source.end())
      s += fmt::format("  {} -> {} [label=\"{}\"];\n", it->second, id, dot_escape(v->type.str()));
  }
  s += "}\n";
  return s;
}

}  // namespace kiln
