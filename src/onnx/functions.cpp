#include "onnx/functions.h"

#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>

#include "onnx/onnx.pb.h"

namespace kiln {
namespace {

using FunctionKey = std::pair<std::string, std::string>;  // domain, name

bool has_graph_attribute(const onnx::FunctionProto& f) {
  for (const auto& n : f.node())
    for (const auto& a : n.attribute())
      if (a.has_g() || a.graphs_size() > 0) return true;
  return false;
}

// The body of `f` for the call `call` (the call's name makes its values unique), appended to out.
void expand(const onnx::FunctionProto& f, const onnx::NodeProto& call, const std::string& prefix,
            google::protobuf::RepeatedPtrField<onnx::NodeProto>& out) {
  std::map<std::string, std::string> rename;  // body value -> graph value
  for (int i = 0; i < f.input_size(); ++i)
    rename[f.input(i)] = i < call.input_size() ? call.input(i) : "";
  for (int i = 0; i < f.output_size(); ++i)
    rename[f.output(i)] = i < call.output_size() ? call.output(i) : "";
  auto name_of = [&](const std::string& v) {
    if (v.empty()) return v;
    auto it = rename.find(v);
    return it != rename.end() ? it->second : prefix + "/" + v;
  };
  std::map<std::string, const onnx::AttributeProto*> given;
  for (const auto& a : call.attribute()) given[a.name()] = &a;
  for (const auto& n : f.node()) {
    onnx::NodeProto* c = out.Add();
    *c = n;
    c->set_name(prefix + "/" + (n.name().empty() ? n.op_type() : n.name()));
    for (int i = 0; i < c->input_size(); ++i) c->set_input(i, name_of(n.input(i)));
    for (int i = 0; i < c->output_size(); ++i) c->set_output(i, name_of(n.output(i)));
    c->clear_attribute();
    for (const auto& a : n.attribute()) {
      if (a.ref_attr_name().empty()) {
        *c->add_attribute() = a;
        continue;
      }
      auto it = given.find(a.ref_attr_name());
      if (it == given.end()) continue;  // not given by the call: unset in the body
      onnx::AttributeProto* v = c->add_attribute();
      *v = *it->second;
      v->set_name(a.name());
    }
  }
}

}  // namespace

Status inline_local_functions(onnx::ModelProto& m) {
  if (m.functions_size() == 0 || !m.has_graph()) return Status::Ok();
  std::map<FunctionKey, const onnx::FunctionProto*> functions;
  for (const auto& f : m.functions())
    if (!has_graph_attribute(f)) functions[{f.domain(), f.name()}] = &f;
  onnx::GraphProto& g = *m.mutable_graph();
  for (int depth = 0; depth < 16; ++depth) {
    bool any = false;
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    for (int i = 0; i < g.node_size(); ++i) {
      const onnx::NodeProto& n = g.node(i);
      auto it = functions.find({n.domain(), n.op_type()});
      if (it == functions.end()) {
        *nodes.Add() = n;
        continue;
      }
      const std::string prefix = n.name().empty() ? fmt::format("{}_{}", n.op_type(), i) : n.name();
      expand(*it->second, n, prefix, nodes);
      any = true;
    }
    if (!any) return Status::Ok();
    g.mutable_node()->Swap(&nodes);
  }
  return KILN_ERROR("model-local functions call each other more than 16 levels deep");
}

}  // namespace kiln
