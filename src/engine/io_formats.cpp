#include "engine/io_formats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace kiln {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A spec's type, or an error naming the option and the spec (spaces around it are ignored).
Expected<DataType> spec_type(std::string spec, const std::string& what) {
  spec.erase(0, spec.find_first_not_of(" \t"));
  spec.erase(spec.find_last_not_of(" \t") + 1);
  const size_t colon = spec.find(':');
  const std::string type = lower(spec.substr(0, colon));
  if (colon != std::string::npos) {
    const std::string layout = lower(spec.substr(colon + 1));
    if (layout != "chw" && layout != "linear")
      return KILN_ERROR("{}: '{}': kiln's inputs and outputs are row-major: the format must be "
                        "chw or linear (or left out)", what, spec);
  }
  if (type == "fp32") return DataType::kFloat32;
  if (type == "fp16") return DataType::kFloat16;
  if (auto t = dtype_from_name(type); t && dtype_is_supported(*t) && !dtype_is_low_bit(*t))
    return *t;
  return KILN_ERROR("{}: '{}' is not a type (fp32, fp16, or a tensor's own type such as int64)",
                    what, spec);
}

bool float_io(DataType t) { return t == DataType::kFloat32 || t == DataType::kFloat16; }

// The type each tensor of `vals` gets: its own where `specs` is empty.
Expected<std::vector<DataType>> wanted(const std::vector<Value*>& vals,
                                       const std::vector<std::string>& specs,
                                       const std::string& what, const char* kind) {
  std::vector<DataType> out;
  for (const Value* v : vals) out.push_back(v->type.dtype);
  if (specs.empty()) return out;
  if (specs.size() != 1 && specs.size() != vals.size())
    return KILN_ERROR("{}: {} specs for {} {}{}: give one for all, or one per {} in order", what,
                      specs.size(), vals.size(), kind, vals.size() == 1 ? "" : "s", kind);
  for (size_t i = 0; i < vals.size(); ++i) {
    const Value* v = vals[i];
    const std::string& spec = specs.size() == 1 ? specs[0] : specs[i];
    KILN_ASSIGN_OR_RETURN(DataType t, spec_type(spec, what));
    if (float_io(v->type.dtype) && float_io(t)) {
      out[i] = t;
    } else if (t != v->type.dtype && !(specs.size() == 1 && !float_io(v->type.dtype))) {
      const std::string can = float_io(v->type.dtype) ? std::string("fp32 or fp16")
                                                      : std::string(dtype_name(v->type.dtype));
      return KILN_ERROR("{}: {} '{}' is {}: its spec can only be {} (fp32 and fp16 apply to float "
                        "{}s)", what, kind, v->name, dtype_name(v->type.dtype), can, kind);
    }
  }
  return out;
}

// Cast(in) to `to` before node `before` (null: at the end), its output named `out` (a name no
// value has).
Node* cast_node(Graph& g, Node* before, const std::string& out, Value* in, DataType to) {
  const std::string name = g.unique_name(out + "_cast");
  Node* n = before ? g.insert_node_before(before, "Cast", name, {in}, {out})
                   : g.add_node("Cast", name, {in}, {out});
  n->attrs.set("to", Attribute::Int(static_cast<int64_t>(to)));
  n->origin = "io_formats";
  n->output(0)->type = TensorType(to, {});
  n->output(0)->type.dims = in->type.dims;
  return n;
}

}  // namespace

Status apply_io_formats(Graph& g, const IoFormats& f) {
  KILN_ASSIGN_OR_RETURN(std::vector<DataType> in_types,
                        wanted(g.inputs(), f.inputs, "--input-io-formats", "input"));
  KILN_ASSIGN_OR_RETURN(std::vector<DataType> out_types,
                        wanted(g.outputs(), f.outputs, "--output-io-formats", "output"));
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    Value* x = g.inputs()[i];
    const DataType model = x->type.dtype;
    if (in_types[i] == model) continue;
    // x takes the chosen type; what read it reads its cast to the model's type instead.
    const auto uses = x->uses();
    const std::string name = g.unique_name(x->name + "_" + std::string(dtype_name(model)));
    x->type.dtype = in_types[i];
    Node* c = cast_node(g, g.nodes().empty() ? nullptr : g.nodes().front(), name, x, model);
    for (auto [n, slot] : uses) g.set_input(n, static_cast<size_t>(slot), c->output(0));
  }
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    Value* y = g.outputs()[i];
    if (out_types[i] == y->type.dtype) continue;
    if (g.is_graph_input(y))
      return KILN_ERROR("--output-io-formats: output '{}' is the model's input '{}' itself, whose "
                        "type is the input's ({})", y->name, y->name, dtype_name(y->type.dtype));
    const std::string name = y->name;
    KILN_RETURN_IF_ERROR(
        g.rename_value(y, g.unique_name(name + "_" + std::string(dtype_name(y->type.dtype)))));
    Node* c = cast_node(g, nullptr, name, y, out_types[i]);  // y's name is free now
    for (size_t j = 0; j < g.outputs().size(); ++j)
      if (g.outputs()[j] == y) g.set_output(j, c->output(0));
  }
  return Status::Ok();
}

}  // namespace kiln
