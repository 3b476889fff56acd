// kiln's graph IR: Values (typed tensors, possibly constant) connected by Nodes (ONNX ops in
// their newest-opset form, or kiln's fused layers). All mutation goes through Graph so that
// producer/use lists stay consistent.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "kiln/tensor.h"

namespace kiln {

// One dimension: a known size (value >= 0), or unknown (value == -1) with an optional symbol.
struct Dim {
  int64_t value = -1;
  std::string symbol;
  Dim() = default;
  Dim(int64_t v) : value(v) {}  // NOLINT(implicit)
  static Dim sym(std::string s) { Dim d; d.symbol = std::move(s); return d; }
  bool is_static() const { return value >= 0; }
  bool operator==(const Dim& o) const { return value == o.value && symbol == o.symbol; }
  std::string str() const;  // "3", "N" or "?"
};

// One element of a small integer tensor computed from shapes (Value::shape_value): a known
// integer of any sign (a Reshape's -1 too), a symbolic size ("N", "2*N*S"), or unknown.
struct SymInt {
  std::optional<int64_t> value;
  std::string symbol;  // when value is unset; empty: unknown
  static SymInt of(const Dim& d) {
    SymInt s;
    if (d.is_static())
      s.value = d.value;
    else
      s.symbol = d.symbol;
    return s;
  }
  static SymInt known(int64_t v) {
    SymInt s;
    s.value = v;
    return s;
  }
  // As a dim: a non-negative value or a symbol; negative values and unknowns are unknown dims.
  Dim dim() const { return value ? (*value >= 0 ? Dim(*value) : Dim()) : Dim::sym(symbol); }
  bool operator==(const SymInt& o) const = default;
};

// Element type plus shape; `dims` is nullopt when even the rank is unknown.
struct TensorType {
  DataType dtype = DataType::kUndefined;
  std::optional<std::vector<Dim>> dims;

  TensorType() = default;
  TensorType(DataType t, std::vector<Dim> d) : dtype(t), dims(std::move(d)) {}
  static TensorType of(const Tensor& t);
  static TensorType unknown_rank(DataType t) { TensorType r; r.dtype = t; return r; }

  bool has_rank() const { return dims.has_value(); }
  int64_t rank() const { return dims ? static_cast<int64_t>(dims->size()) : -1; }
  bool is_static() const;                        // rank and all dims known
  std::optional<std::vector<int64_t>> static_shape() const;
  std::string str() const;                       // "float32[N,3,224,224]"
};

class Node;

struct Value {
  std::string name;
  TensorType type;
  Node* producer = nullptr;          // nullptr for graph inputs and constants
  int producer_index = -1;
  std::shared_ptr<const Tensor> constant;  // set for initializers and folded constants
  // INT8 quantization (docs/quantization.md): symmetric, real value = int8 * scale, zero point
  // 0. Empty: not quantized. One scale: per tensor (activations). More: per channel along
  // quant_axis (weights: the output-channel axis of the layer that reads them).
  std::vector<float> quant_scales;
  int64_t quant_axis = -1;
  bool has_quant_scale() const { return quant_scales.size() == 1; }
  // The elements of a small integer tensor computed from shapes (Shape(x) and the shape
  // arithmetic after it), each a static size or a symbol of the model's dims: what infer_shapes
  // knows of a non-constant shape tensor (ops/shape_values.h). nullopt: not known.
  std::optional<std::vector<SymInt>> shape_value;
  bool is_constant() const { return constant != nullptr; }
  // (node, input index) pairs that read this value; maintained by Graph.
  const std::vector<std::pair<Node*, int>>& uses() const { return uses_; }

 private:
  friend class Graph;
  std::vector<std::pair<Node*, int>> uses_;
};

class Graph;

// An attribute value, as in ONNX. A graph-valued attribute (If's branches, Loop's and Scan's
// body) holds a subgraph that reads no value of an enclosing graph: the importer turns every
// outer-scope name it reads into an input of its own, fed by an input of the node (captures,
// ops/control_flow.h).
struct Attribute {
  enum class Kind { kFloat, kInt, kString, kTensor, kFloats, kInts, kStrings, kGraph };
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<const Tensor> t;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::shared_ptr<Graph> g;  // kGraph; owned by the attribute (a cloned node clones it)

  static Attribute Float(float v) { Attribute a; a.kind = Kind::kFloat; a.f = v; return a; }
  static Attribute Int(int64_t v) { Attribute a; a.kind = Kind::kInt; a.i = v; return a; }
  static Attribute String(std::string v) { Attribute a; a.kind = Kind::kString; a.s = std::move(v); return a; }
  static Attribute Ints(std::vector<int64_t> v) { Attribute a; a.kind = Kind::kInts; a.ints = std::move(v); return a; }
  static Attribute Floats(std::vector<float> v) { Attribute a; a.kind = Kind::kFloats; a.floats = std::move(v); return a; }
  static Attribute Strings(std::vector<std::string> v) { Attribute a; a.kind = Kind::kStrings; a.strings = std::move(v); return a; }
  static Attribute TensorValue(Tensor v) { Attribute a; a.kind = Kind::kTensor; a.t = std::make_shared<const Tensor>(std::move(v)); return a; }
  static Attribute Subgraph(std::shared_ptr<Graph> v) { Attribute a; a.kind = Kind::kGraph; a.g = std::move(v); return a; }
  std::string str() const;
};

class Attributes {
 public:
  bool has(const std::string& name) const { return map_.count(name) != 0; }
  const Attribute* find(const std::string& name) const;
  void set(const std::string& name, Attribute a) { map_[name] = std::move(a); }
  void erase(const std::string& name) { map_.erase(name); }
  const std::map<std::string, Attribute>& all() const { return map_; }

  // Typed getters return the default when absent. A present attribute of the wrong kind is
  // reported by the verifier; getters then return the default too.
  int64_t get_int(const std::string& name, int64_t def) const;
  float get_float(const std::string& name, float def) const;
  std::string get_string(const std::string& name, const std::string& def) const;
  std::vector<int64_t> get_ints(const std::string& name, std::vector<int64_t> def = {}) const;
  std::vector<float> get_floats(const std::string& name, std::vector<float> def = {}) const;
  std::vector<std::string> get_strings(const std::string& name) const;
  const Tensor* get_tensor(const std::string& name) const;
  // A graph attribute's subgraph, or nullptr. Not const: inference types a subgraph's values.
  Graph* get_graph(const std::string& name) const;
  // Every graph attribute's subgraph, in attribute-name order.
  std::vector<Graph*> subgraphs() const;

 private:
  std::map<std::string, Attribute> map_;
};

class Node {
 public:
  std::string name;
  std::string op_type;
  std::string domain;                    // "" for ai.onnx; "kiln" for fused layers
  Attributes attrs;
  std::vector<std::string> onnx_nodes;   // ONNX node names this layer covers
  std::string origin = "import";         // the pass that produced this node

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // Input i, or nullptr when absent/omitted (optional inputs are "" in ONNX).
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  int index = -1;                        // position in the graph's node order
  std::string label() const;             // "node 'conv1' (Conv, #3)"

 private:
  friend class Graph;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // A deep copy (constant tensors are shared: they are immutable).
  std::unique_ptr<Graph> clone() const;

  std::string name;
  int opset = 21;  // ai.onnx opset of the source model (nodes are always in newest form)
  std::vector<std::string> warnings;  // import warnings (e.g. an opset newer than kiln knows)

  // --- values
  Value* add_value(const std::string& name, TensorType type = {});
  Value* add_constant(const std::string& name, Tensor t);
  Value* find_value(const std::string& name) const;
  std::string unique_name(const std::string& base);  // not yet used by any value or node
  // Gives `v` a name no other value has (fails if one does).
  Status rename_value(Value* v, const std::string& new_name);
  void add_input(Value* v) { inputs_.push_back(v); }
  // Replaces the input list (values of this graph without producers: a subgraph's inputs are
  // put in the order its node feeds them).
  void set_inputs(std::vector<Value*> vs) { inputs_ = std::move(vs); }
  void add_output(Value* v) { outputs_.push_back(v); }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  void set_output(size_t i, Value* v) { outputs_[i] = v; }
  bool is_graph_output(const Value* v) const;
  bool is_graph_input(const Value* v) const;
  std::vector<Value*> values() const;

  // --- nodes (kept in topological order by construction or by topo_sort())
  // Appends a node; outputs are created as new values named after `output_names`.
  Node* add_node(const std::string& op_type, const std::string& name,
                 const std::vector<Value*>& inputs, const std::vector<std::string>& output_names,
                 const std::string& domain = "");
  // Like add_node but positions the new node right before `pos` in the node order.
  Node* insert_node_before(Node* pos, const std::string& op_type, const std::string& name,
                           const std::vector<Value*>& inputs,
                           const std::vector<std::string>& output_names,
                           const std::string& domain = "");
  const std::vector<Node*>& nodes() const { return order_; }
  Node* find_node(const std::string& name) const;
  void set_input(Node* n, size_t i, Value* v);  // grows the input list when needed
  void add_node_input(Node* n, Value* v) { set_input(n, n->num_inputs(), v); }
  void remove_node_input(Node* n, size_t i);  // erases slot i (shifts later inputs)
  // Makes `v` the output `i` of `n` (v must have no producer).
  void set_node_output(Node* n, size_t i, Value* v);
  // Redirects every use of `from` (nodes and graph outputs) to `to`.
  void replace_all_uses(Value* from, Value* to);
  // Removes a node; its outputs must be unused (or `force`, leaving them producer-less).
  Status remove_node(Node* n, bool force = false);
  // Drops values no node, input or output references.
  void remove_dead_values();
  // Reorders nodes topologically (stable); fails on a cycle.
  Status topo_sort();
  // Renumbers Node::index after edits.
  void renumber();

 private:
  Node* create_node(const std::string& op_type, const std::string& name,
                    const std::vector<Value*>& inputs,
                    const std::vector<std::string>& output_names, const std::string& domain);
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_storage_;
  std::vector<Node*> order_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  std::map<std::string, Value*> value_by_name_;
  uint64_t name_counter_ = 0;
};

}  // namespace kiln
