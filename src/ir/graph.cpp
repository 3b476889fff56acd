#include "ir/graph.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include <fmt/format.h>

namespace kiln {

std::string Dim::str() const {
  if (value >= 0) return std::to_string(value);
  return symbol.empty() ? "?" : symbol;
}

TensorType TensorType::of(const Tensor& t) {
  std::vector<Dim> d(t.shape().begin(), t.shape().end());
  return TensorType(t.dtype(), std::move(d));
}

bool TensorType::is_static() const {
  if (!dims) return false;
  return std::all_of(dims->begin(), dims->end(), [](const Dim& d) { return d.is_static(); });
}

std::optional<std::vector<int64_t>> TensorType::static_shape() const {
  if (!is_static()) return std::nullopt;
  std::vector<int64_t> s;
  for (const auto& d : *dims) s.push_back(d.value);
  return s;
}

std::string TensorType::str() const {
  std::string s(dtype_name(dtype));
  if (!dims) return s + "[?...]";
  std::vector<std::string> parts;
  for (const auto& d : *dims) parts.push_back(d.str());
  return s + "[" + fmt::format("{}", fmt::join(parts, ",")) + "]";
}

std::string Attribute::str() const {
  switch (kind) {
    case Kind::kFloat: return fmt::format("{}", f);
    case Kind::kInt: return fmt::format("{}", i);
    case Kind::kString: return fmt::format("\"{}\"", s);
    case Kind::kTensor: return t ? "tensor " + t->desc() : "tensor";
    case Kind::kFloats: return fmt::format("[{}]", fmt::join(floats, ","));
    case Kind::kInts: return fmt::format("[{}]", fmt::join(ints, ","));
    case Kind::kStrings: return fmt::format("[{}]", fmt::join(strings, ","));
    case Kind::kGraph:
      return g ? fmt::format("graph '{}' ({} nodes)", g->name, g->nodes().size()) : "graph";
  }
  return "";
}

const Attribute* Attributes::find(const std::string& name) const {
  auto it = map_.find(name);
  return it == map_.end() ? nullptr : &it->second;
}
int64_t Attributes::get_int(const std::string& name, int64_t def) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kInt ? a->i : def;
}
float Attributes::get_float(const std::string& name, float def) const {
  const Attribute* a = find(name);
  if (a && a->kind == Attribute::Kind::kFloat) return a->f;
  if (a && a->kind == Attribute::Kind::kInt) return static_cast<float>(a->i);
  return def;
}
std::string Attributes::get_string(const std::string& name, const std::string& def) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kString ? a->s : def;
}
std::vector<int64_t> Attributes::get_ints(const std::string& name, std::vector<int64_t> def) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kInts ? a->ints : def;
}
std::vector<float> Attributes::get_floats(const std::string& name, std::vector<float> def) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kFloats ? a->floats : def;
}
std::vector<std::string> Attributes::get_strings(const std::string& name) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kStrings ? a->strings : std::vector<std::string>{};
}
const Tensor* Attributes::get_tensor(const std::string& name) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kTensor ? a->t.get() : nullptr;
}

std::string Node::label() const {
  return fmt::format("node '{}' ({}, #{})", name, op_type, index);
}

Value* Graph::add_value(const std::string& name, TensorType type) {
  auto v = std::make_unique<Value>();
  v->name = name.empty() ? unique_name("v") : name;
  v->type = std::move(type);
  Value* raw = v.get();
  values_.push_back(std::move(v));
  value_by_name_[raw->name] = raw;
  return raw;
}

Value* Graph::add_constant(const std::string& name, Tensor t) {
  Value* v = add_value(name, TensorType::of(t));
  v->constant = std::make_shared<const Tensor>(std::move(t));
  return v;
}

Value* Graph::find_value(const std::string& name) const {
  auto it = value_by_name_.find(name);
  return it == value_by_name_.end() ? nullptr : it->second;
}

std::string Graph::unique_name(const std::string& base) {
  for (;;) {
    std::string n = fmt::format("{}_k{}", base, name_counter_++);
    if (!value_by_name_.count(n) && !find_node(n)) return n;
  }
}

bool Graph::is_graph_output(const Value* v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}
bool Graph::is_graph_input(const Value* v) const {
  return std::find(inputs_.begin(), inputs_.end(), v) != inputs_.end();
}

std::vector<Value*> Graph::values() const {
  std::vector<Value*> out;
  for (const auto& v : values_) out.push_back(v.get());
  return out;
}

Node* Graph::create_node(const std::string& op_type, const std::string& name,
                         const std::vector<Value*>& inputs,
                         const std::vector<std::string>& output_names, const std::string& domain) {
  auto n = std::make_unique<Node>();
  n->op_type = op_type;
  n->domain = domain;
  n->name = name.empty() ? unique_name(op_type) : name;
  Node* raw = n.get();
  nodes_storage_.push_back(std::move(n));
  for (size_t i = 0; i < inputs.size(); ++i) set_input(raw, i, inputs[i]);
  for (size_t i = 0; i < output_names.size(); ++i) {
    Value* out = output_names[i].empty() ? nullptr : add_value(output_names[i]);
    raw->outputs_.push_back(out);
    if (out) { out->producer = raw; out->producer_index = static_cast<int>(i); }
  }
  return raw;
}

Node* Graph::add_node(const std::string& op_type, const std::string& name,
                      const std::vector<Value*>& inputs,
                      const std::vector<std::string>& output_names, const std::string& domain) {
  Node* n = create_node(op_type, name, inputs, output_names, domain);
  n->index = static_cast<int>(order_.size());
  order_.push_back(n);
  return n;
}

Node* Graph::insert_node_before(Node* pos, const std::string& op_type, const std::string& name,
                                const std::vector<Value*>& inputs,
                                const std::vector<std::string>& output_names,
                                const std::string& domain) {
  Node* n = create_node(op_type, name, inputs, output_names, domain);
  auto it = std::find(order_.begin(), order_.end(), pos);
  order_.insert(it, n);
  renumber();
  return n;
}

Node* Graph::find_node(const std::string& name) const {
  for (Node* n : order_)
    if (n->name == name) return n;
  return nullptr;
}

static void erase_use(Value* v, Node* n, int i) {
  if (!v) return;
  auto& u = const_cast<std::vector<std::pair<Node*, int>>&>(v->uses());
  auto it = std::find(u.begin(), u.end(), std::make_pair(n, i));
  if (it != u.end()) u.erase(it);
}

void Graph::set_input(Node* n, size_t i, Value* v) {
  if (n->inputs_.size() <= i) n->inputs_.resize(i + 1, nullptr);
  if (n->inputs_[i]) erase_use(n->inputs_[i], n, static_cast<int>(i));
  n->inputs_[i] = v;
  if (v) v->uses_.push_back({n, static_cast<int>(i)});
}

void Graph::remove_node_input(Node* n, size_t i) {
  if (i >= n->inputs_.size()) return;
  for (size_t k = i; k < n->inputs_.size(); ++k) erase_use(n->inputs_[k], n, static_cast<int>(k));
  n->inputs_.erase(n->inputs_.begin() + static_cast<long>(i));
  for (size_t k = i; k < n->inputs_.size(); ++k)
    if (n->inputs_[k]) n->inputs_[k]->uses_.push_back({n, static_cast<int>(k)});
}

void Graph::set_node_output(Node* n, size_t i, Value* v) {
  if (n->outputs_.size() <= i) n->outputs_.resize(i + 1, nullptr);
  if (n->outputs_[i] && n->outputs_[i]->producer == n) {
    n->outputs_[i]->producer = nullptr;
    n->outputs_[i]->producer_index = -1;
  }
  n->outputs_[i] = v;
  if (v) { v->producer = n; v->producer_index = static_cast<int>(i); }
}

void Graph::replace_all_uses(Value* from, Value* to) {
  if (from == to) return;
  auto uses = from->uses_;
  for (auto [n, i] : uses) set_input(n, static_cast<size_t>(i), to);
  for (auto& o : outputs_)
    if (o == from) o = to;
}

Status Graph::remove_node(Node* n, bool force) {
  if (!force)  // check everything before changing anything
    for (Value* o : n->outputs_)
      if (o && (!o->uses_.empty() || is_graph_output(o)))
        return KILN_ERROR("cannot remove {}: its output '{}' is still used", n->label(), o->name);
  for (Value* o : n->outputs_)
    if (o && o->producer == n) o->producer = nullptr;
  for (size_t i = 0; i < n->inputs_.size(); ++i) erase_use(n->inputs_[i], n, static_cast<int>(i));
  n->inputs_.clear();
  order_.erase(std::remove(order_.begin(), order_.end(), n), order_.end());
  auto it = std::find_if(nodes_storage_.begin(), nodes_storage_.end(),
                         [n](const auto& p) { return p.get() == n; });
  if (it != nodes_storage_.end()) nodes_storage_.erase(it);
  renumber();
  return Status::Ok();
}

void Graph::remove_dead_values() {
  std::set<const Value*> live(inputs_.begin(), inputs_.end());
  live.insert(outputs_.begin(), outputs_.end());
  for (Node* n : order_) {
    for (Value* v : n->inputs_) live.insert(v);
    for (Value* v : n->outputs_) live.insert(v);
  }
  std::vector<std::unique_ptr<Value>> kept;
  for (auto& v : values_) {
    if (live.count(v.get())) {
      kept.push_back(std::move(v));
    } else {
      auto it = value_by_name_.find(v->name);
      if (it != value_by_name_.end() && it->second == v.get()) value_by_name_.erase(it);
    }
  }
  values_ = std::move(kept);
}

Status Graph::topo_sort() {
  std::unordered_map<const Node*, int> pending;
  std::unordered_map<const Node*, size_t> position;
  for (size_t i = 0; i < order_.size(); ++i) position[order_[i]] = i;
  for (Node* n : order_) {
    int count = 0;
    for (Value* v : n->inputs_)
      if (v && v->producer && position.count(v->producer)) ++count;
    pending[n] = count;
  }
  // Stable Kahn: always emit the ready node that came first in the old order.
  std::set<std::pair<size_t, Node*>> ready;
  for (Node* n : order_)
    if (pending[n] == 0) ready.insert({position[n], n});
  std::vector<Node*> sorted;
  while (!ready.empty()) {
    Node* n = ready.begin()->second;
    ready.erase(ready.begin());
    sorted.push_back(n);
    for (Value* o : n->outputs_) {
      if (!o) continue;
      for (auto [user, idx] : o->uses_)
        if (--pending[user] == 0) ready.insert({position[user], user});
    }
  }
  if (sorted.size() != order_.size())
    return KILN_ERROR("graph '{}' has a cycle ({} of {} nodes could be ordered)", name,
                      sorted.size(), order_.size());
  order_ = std::move(sorted);
  renumber();
  return Status::Ok();
}

Status Graph::rename_value(Value* v, const std::string& new_name) {
  if (v->name == new_name) return Status::Ok();
  if (value_by_name_.count(new_name))
    return KILN_ERROR("cannot rename value '{}' to '{}': the name is taken", v->name, new_name);
  value_by_name_.erase(v->name);
  v->name = new_name;
  value_by_name_[new_name] = v;
  return Status::Ok();
}

void Graph::renumber() {
  for (size_t i = 0; i < order_.size(); ++i) order_[i]->index = static_cast<int>(i);
}

Graph* Attributes::get_graph(const std::string& name) const {
  const Attribute* a = find(name);
  return a && a->kind == Attribute::Kind::kGraph ? a->g.get() : nullptr;
}

std::vector<Graph*> Attributes::subgraphs() const {
  std::vector<Graph*> out;
  for (const auto& [name, a] : map_)
    if (a.kind == Attribute::Kind::kGraph && a.g) out.push_back(a.g.get());
  return out;
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  g->name = name;
  g->opset = opset;
  g->name_counter_ = name_counter_;
  std::unordered_map<const Value*, Value*> vmap;
  for (const auto& v : values_) {
    Value* c = g->add_value(v->name, v->type);
    c->constant = v->constant;
    c->quant_scales = v->quant_scales;
    c->quant_axis = v->quant_axis;
    c->shape_value = v->shape_value;
    vmap[v.get()] = c;
  }
  auto map_v = [&](Value* v) -> Value* {
    if (!v) return nullptr;
    auto it = vmap.find(v);
    return it == vmap.end() ? nullptr : it->second;  // a foreign value: the verifier reports it
  };
  for (Node* n : order_) {
    std::vector<Value*> ins;
    for (Value* v : n->inputs_) ins.push_back(map_v(v));
    Node* c = g->create_node(n->op_type, n->name, ins, {}, n->domain);
    c->attrs = n->attrs;
    // A subgraph is part of its node: the copy gets its own (inference retypes its values).
    for (const auto& [an, a] : n->attrs.all())
      if (a.kind == Attribute::Kind::kGraph && a.g)
        c->attrs.set(an, Attribute::Subgraph(std::shared_ptr<Graph>(a.g->clone())));
    c->onnx_nodes = n->onnx_nodes;
    c->origin = n->origin;
    for (size_t i = 0; i < n->outputs_.size(); ++i) g->set_node_output(c, i, map_v(n->outputs_[i]));
    c->index = static_cast<int>(g->order_.size());
    g->order_.push_back(c);
  }
  for (Value* v : inputs_) g->inputs_.push_back(map_v(v));
  for (Value* v : outputs_) g->outputs_.push_back(map_v(v));
  return g;
}

}  // namespace kiln
