#include "onnx/importer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "ir/verifier.h"
#include "onnx/functions.h"
#include "onnx/onnx.pb.h"
#include "onnx/sequences.h"
#include "onnx/tensor_proto.h"
#include "ops/op.h"

namespace kiln {
namespace {

// The names one graph defines, and how it reads the names of enclosing graphs. A subgraph
// (If's branches, Loop's and Scan's body) may read any value of an enclosing graph by name; kiln
// makes each such read explicit: an enclosing graph's constant is shared into the subgraph as a
// constant of its own, and any other value becomes an input of the subgraph (a capture), fed by
// an extra input of the node that holds it (ops/control_flow.h). A name from two levels up is
// captured by the graph in between too, so every graph reads only its own values.
struct Scope {
  Graph& g;
  Scope* parent = nullptr;  // nullptr: the model's main graph
  std::map<std::string, Value*> values;
  std::vector<std::pair<Value*, Value*>> captures;  // (the parent's value, this graph's input)

  Value* lookup(const std::string& name) {
    if (auto it = values.find(name); it != values.end()) return it->second;
    Value* pv = parent ? parent->lookup(name) : nullptr;
    if (!pv) return nullptr;
    Value* v = g.add_value(g.find_value(name) ? g.unique_name(name) : name, pv->type);
    if (pv->is_constant())
      v->constant = pv->constant;
    else
      captures.emplace_back(pv, v);
    values[name] = v;
    return v;
  }
};

struct Importer {
  const onnx::ModelProto& model;
  std::string base_dir;
  std::string source;  // file name for messages
  std::unique_ptr<Graph> g = std::make_unique<Graph>();
  int opset = -1;

  // A dim_param is a name, even one made of digits (torch 2.6's dynamo exporter names a dynamic
  // dim after its example size: "16"); the symbol algebra reads digits as a number
  // (src/ops/shape_values.cpp), so such a name gets a prefix ("dim16"), the same for every use.
  static Dim symbolic_dim(const std::string& name) {
    const bool digits = std::all_of(name.begin(), name.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    return Dim::sym(digits ? "dim" + name : name);
  }

  TensorType type_from_value_info(const onnx::ValueInfoProto& vi) {
    TensorType t;
    if (!vi.type().has_tensor_type()) return t;
    const auto& tt = vi.type().tensor_type();
    t.dtype = static_cast<DataType>(tt.elem_type());
    if (!tt.has_shape()) return t;
    std::vector<Dim> dims;
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value() && d.dim_value() >= 0) dims.emplace_back(d.dim_value());
      else if (d.has_dim_param() && !d.dim_param().empty())
        dims.push_back(symbolic_dim(d.dim_param()));
      else dims.emplace_back();
    }
    t.dims = std::move(dims);
    return t;
  }

  // Every op of the graph and of its subgraphs that kiln does not know, in one message.
  void collect_unsupported(const onnx::GraphProto& gp,
                           std::map<std::string, std::vector<std::string>>& unsupported) {
    for (int i = 0; i < gp.node_size(); ++i) {
      const auto& n = gp.node(i);
      for (const auto& a : n.attribute())
        if (a.has_g()) collect_unsupported(a.g(), unsupported);
      if (n.op_type() == "Constant" && (n.domain().empty() || n.domain() == "ai.onnx")) continue;
      if (!find_op(n.domain(), n.op_type())) {
        std::string op = n.domain().empty() ? n.op_type() : n.domain() + "." + n.op_type();
        unsupported[op].push_back(n.name().empty() ? fmt::format("#{}", i) : n.name());
      }
    }
  }

  Status check_supported(const onnx::GraphProto& gp) {
    std::map<std::string, std::vector<std::string>> unsupported;  // op -> node names
    collect_unsupported(gp, unsupported);
    if (unsupported.empty()) return Status::Ok();
    std::string msg = fmt::format("unsupported operator{}: ", unsupported.size() > 1 ? "s" : "");
    bool first = true;
    for (const auto& [op, nodes] : unsupported) {
      std::vector<std::string> shown(nodes.begin(), nodes.begin() + std::min<size_t>(nodes.size(), 5));
      msg += fmt::format("{}{} (node{} {}{})", first ? "" : "; ", op, nodes.size() > 1 ? "s" : "",
                         fmt::join(shown, ", "),
                         nodes.size() > 5 ? fmt::format(" and {} more", nodes.size() - 5) : "");
      first = false;
    }
    return Status::Error(msg);
  }

  Expected<Attribute> convert_attribute(const onnx::AttributeProto& a, const std::string& where) {
    using AP = onnx::AttributeProto;
    switch (a.type()) {
      case AP::FLOAT: return Attribute::Float(a.f());
      case AP::INT: return Attribute::Int(a.i());
      case AP::STRING: return Attribute::String(a.s());
      case AP::FLOATS: return Attribute::Floats({a.floats().begin(), a.floats().end()});
      case AP::INTS: return Attribute::Ints({a.ints().begin(), a.ints().end()});
      case AP::STRINGS: return Attribute::Strings({a.strings().begin(), a.strings().end()});
      case AP::TENSOR: {
        KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(a.t(), base_dir, where));
        return Attribute::TensorValue(std::move(t));
      }
      default:
        return KILN_ERROR("{}: attribute '{}' has a type kiln does not support ({})", where,
                          a.name(), static_cast<int>(a.type()));
    }
  }

  // Constant nodes become constant values (they carry a literal, not a computation).
  Expected<Tensor> constant_node_value(const onnx::NodeProto& n, const std::string& where) {
    if (n.attribute_size() != 1)
      return KILN_ERROR("{}: Constant must have exactly one value attribute", where);
    const auto& a = n.attribute(0);
    const std::string& k = a.name();
    if (k == "value") return tensor_from_proto(a.t(), base_dir, where);
    if (k == "value_float") return Tensor::scalar<float>(a.f());
    if (k == "value_int") return Tensor::scalar<int64_t>(a.i());
    if (k == "value_floats")
      return Tensor::from<float>({a.floats_size()}, {a.floats().begin(), a.floats().end()});
    if (k == "value_ints")
      return Tensor::from<int64_t>({a.ints_size()}, {a.ints().begin(), a.ints().end()});
    return KILN_ERROR("{}: Constant attribute '{}' is not supported", where, k);
  }

  // The graph attributes of `np`, each imported as a subgraph of `scope`; the values of `scope`
  // they read become further inputs of `n` after its own, and inputs of every subgraph after its
  // own, in the same order (attribute kiln_captures: how many).
  Status import_subgraphs(const onnx::NodeProto& np, Node* n, Scope& scope) {
    struct Sub {
      std::string name;
      std::shared_ptr<Graph> g;
      std::vector<std::pair<Value*, Value*>> captures;
    };
    std::vector<Sub> subs;
    const bool control = (n->domain.empty() || n->domain == "ai.onnx") &&
                         (n->op_type == "If" || n->op_type == "Loop" || n->op_type == "Scan");
    for (const auto& a : np.attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      if (!control)
        return KILN_ERROR("{}: attribute '{}' is a graph, which op {} does not take", n->label(),
                          a.name(), n->op_type);
      auto sub = std::make_shared<Graph>();
      sub->opset = opset;
      Scope ss{*sub, &scope, {}, {}};
      KILN_RETURN_IF_ERROR(
          build(a.g(), ss).with_context(fmt::format("{}: attribute '{}'", n->label(), a.name())));
      subs.push_back({a.name(), sub, std::move(ss.captures)});
    }
    std::vector<Value*> outer;  // the captured values of `scope`, in first-use order
    for (const Sub& s : subs)
      for (auto [pv, v] : s.captures)
        if (std::find(outer.begin(), outer.end(), pv) == outer.end()) outer.push_back(pv);
    for (Sub& s : subs) {
      std::vector<Value*> ins = s.g->inputs();
      for (Value* pv : outer) {
        auto it = std::find_if(s.captures.begin(), s.captures.end(),
                               [&](const auto& c) { return c.first == pv; });
        ins.push_back(it != s.captures.end()
                          ? it->second
                          : s.g->add_value(s.g->find_value(pv->name) ? s.g->unique_name(pv->name)
                                                                     : pv->name,
                                           pv->type));
      }
      s.g->set_inputs(std::move(ins));
      n->attrs.set(s.name, Attribute::Subgraph(s.g));
    }
    if (!outer.empty()) {
      for (Value* pv : outer) scope.g.add_node_input(n, pv);
      n->attrs.set("kiln_captures", Attribute::Int(static_cast<int64_t>(outer.size())));
    }
    return Status::Ok();
  }

  // Imports the nodes, initializers, inputs and outputs of `gp` into `scope.g`. The main graph's
  // inputs must be tensors of supported types; a subgraph's are its formal inputs (a Loop body's
  // iteration number, condition and carried values), typed by inference where they are not
  // declared.
  Status build(const onnx::GraphProto& gp, Scope& scope) {
    Graph& gr = scope.g;
    const bool main = scope.parent == nullptr;
    gr.name = gp.name();
    for (const auto& init : gp.initializer()) {
      const std::string where = fmt::format("initializer '{}'", init.name());
      KILN_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(init, base_dir, where));
      scope.values[init.name()] = gr.add_constant(init.name(), std::move(t));
    }
    if (gp.sparse_initializer_size() > 0)
      return Status::Error("sparse initializers are not supported");
    for (const auto& in : gp.input()) {
      if (main && scope.values.count(in.name())) continue;  // an initializer listed as input
      if (in.has_type() && !in.type().has_tensor_type())
        return KILN_ERROR("{} input '{}' is a sequence, map or optional value, which is not "
                          "supported (kiln takes tensor inputs only)", main ? "graph" : "subgraph",
                          in.name());
      TensorType t = type_from_value_info(in);
      if (main && !dtype_is_supported(t.dtype))
        return KILN_ERROR("graph input '{}' has an unsupported type (elem_type {})", in.name(),
                          static_cast<int>(t.dtype));
      if (scope.values.count(in.name()))
        return KILN_ERROR("subgraph input '{}' is also an initializer", in.name());
      Value* v = gr.add_value(in.name(), t);
      gr.add_input(v);
      scope.values[in.name()] = v;
    }
    std::map<std::string, TensorType> declared;
    for (const auto& vi : gp.value_info()) declared[vi.name()] = type_from_value_info(vi);
    for (const auto& vi : gp.output()) declared[vi.name()] = type_from_value_info(vi);

    // First create every node with its outputs, then wire the inputs: tolerates models whose
    // nodes are not topologically sorted. Subgraphs are imported while wiring, when every name
    // of this graph is known.
    std::set<std::string> node_names;
    std::vector<std::pair<const onnx::NodeProto*, Node*>> created;
    for (int i = 0; i < gp.node_size(); ++i) {
      const auto& np = gp.node(i);
      std::string name = np.name().empty() ? fmt::format("{}_{}", np.op_type(), i) : np.name();
      while (node_names.count(name)) name += "_";
      node_names.insert(name);
      const std::string where = fmt::format("node '{}' ({}, #{})", name, np.op_type(), i);
      for (const auto& o : np.output())
        if (!o.empty() && scope.values.count(o))
          return KILN_ERROR("{}: output '{}' is already produced elsewhere", where, o);
      if (np.op_type() == "Constant" && (np.domain().empty() || np.domain() == "ai.onnx")) {
        if (np.output_size() != 1) return KILN_ERROR("{}: Constant needs one output", where);
        KILN_ASSIGN_OR_RETURN(Tensor t, constant_node_value(np, where));
        scope.values[np.output(0)] = gr.add_constant(np.output(0), std::move(t));
        continue;
      }
      Node* n = gr.add_node(np.op_type(), name, {}, {}, np.domain() == "ai.onnx" ? "" : np.domain());
      n->onnx_nodes = {name};
      for (int k = 0; k < np.output_size(); ++k) {
        const std::string& o = np.output(k);
        Value* v = o.empty() ? nullptr : gr.add_value(o);
        if (v && declared.count(o)) v->type = declared[o];
        gr.set_node_output(n, static_cast<size_t>(k), v);
        if (v) scope.values[o] = v;
      }
      for (const auto& a : np.attribute()) {
        if (a.type() == onnx::AttributeProto::GRAPH) continue;  // import_subgraphs
        KILN_ASSIGN_OR_RETURN(Attribute attr, convert_attribute(a, where));
        n->attrs.set(a.name(), std::move(attr));
      }
      created.push_back({&np, n});
    }
    for (auto [np, n] : created) {
      for (int k = 0; k < np->input_size(); ++k) {
        const std::string& in = np->input(k);
        if (in.empty()) { gr.set_input(n, static_cast<size_t>(k), nullptr); continue; }
        Value* v = scope.lookup(in);
        if (!v)
          return KILN_ERROR("{}: input '{}' is not a graph input, initializer or node output{}",
                            n->label(), in, main ? "" : " of this graph or an enclosing one");
        gr.set_input(n, static_cast<size_t>(k), v);
      }
      KILN_RETURN_IF_ERROR(import_subgraphs(*np, n, scope));
    }
    for (const auto& out : gp.output()) {
      Value* v = scope.lookup(out.name());
      if (!v)
        return KILN_ERROR("{} output '{}' is not produced by any node", main ? "graph" : "subgraph",
                          out.name());
      gr.add_output(v);
    }
    KILN_RETURN_IF_ERROR(gr.topo_sort());
    // Upgrade to canonical (newest-opset) form; an upgrade may add constants or rewrite op_type.
    for (Node* n : std::vector<Node*>(gr.nodes())) {
      KILN_RETURN_IF_ERROR(check_op_version(*n, opset));
      const OpDef* def = find_op(n->domain, n->op_type);
      if (def && def->upgrade) {
        ImportContext ctx(gr, *n, opset);
        Status st = def->upgrade(ctx);
        if (!st.ok()) return st.message().find(n->label()) != std::string::npos
                                 ? st : st.with_context(n->label());
      }
    }
    return gr.topo_sort();
  }

  Status run() {
    if (!model.has_graph()) return Status::Error("the model has no graph");
    KILN_RETURN_IF_ERROR(check_supported(model.graph()));
    // Newer IR versions only add features (new types, functions) that are refused where they
    // appear, so the IR version itself is not a reason to refuse a model.
    if (model.ir_version() < 1) return Status::Error("the model has no ONNX IR version");
    for (const auto& os : model.opset_import())
      if (os.domain().empty() || os.domain() == "ai.onnx") opset = static_cast<int>(os.version());
    if (opset < 0) opset = model.opset_import_size() == 0 ? 1 : -1;
    if (opset < 0) return Status::Error("the model imports no ai.onnx opset");
    // Past the newest opset kiln knows, an op could have changed without kiln knowing; such a
    // model is imported as if at kiln's newest opset, and says so.
    if (opset > kMaxOnnxOpset) {
      const std::string w = fmt::format(
          "ai.onnx opset {} is newer than the newest kiln knows ({}): importing it on the "
          "assumption that none of its ops changed after opset {}", opset, kMaxOnnxOpset,
          kMaxOnnxOpset);
      g->warnings.push_back(w);
      fmt::print(stderr, "kiln: warning: {}: {}\n", source, w);
    }
    g->opset = opset;
    Scope scope{*g, nullptr, {}, {}};
    KILN_RETURN_IF_ERROR(build(model.graph(), scope));
    KILN_RETURN_IF_ERROR(infer_shapes(*g));
    KILN_RETURN_IF_ERROR(verify_graph(*g));
    return Status::Ok();
  }
};

}  // namespace

Expected<std::unique_ptr<Graph>> import_onnx_bytes(const std::string& bytes,
                                                   const std::string& base_dir,
                                                   const std::string& source_name) {
  if (bytes.empty()) return KILN_ERROR("{}: empty file, not an ONNX model", source_name);
  onnx::ModelProto model;
  google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
  google::protobuf::io::CodedInputStream coded(&raw);
  coded.SetTotalBytesLimit(std::numeric_limits<int>::max());
  if (!model.ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage())
    return KILN_ERROR("{}: not a valid ONNX model (protobuf parse failed)", source_name);
  if (model.has_graph()) {
    Status st = inline_local_functions(model);
    if (st.ok()) st = lower_split_to_sequence(*model.mutable_graph(), base_dir);
    if (!st.ok()) return st.with_context(source_name);
  }
  Importer imp{model, base_dir, source_name, std::make_unique<Graph>()};
  Status st = imp.run();
  if (!st.ok()) return st.with_context(source_name);
  return std::move(imp.g);
}

Expected<std::unique_ptr<Graph>> import_onnx_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    return KILN_ERROR("{}: no such file", path);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > static_cast<uintmax_t>(std::numeric_limits<int>::max()))
    return KILN_ERROR("{}: file larger than 2 GB; store the weights as ONNX external data", path);
  std::ifstream in(path, std::ios::binary);
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!in) return KILN_ERROR("{}: cannot read file", path);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return import_onnx_bytes(bytes, dir.empty() ? "." : dir, path);
}

}  // namespace kiln
