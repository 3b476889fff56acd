#include "engine/describe.h"

#include <algorithm>
#include <set>

#include "backends/backend_info.h"
#include "kiln/tools.h"
#include "quant/int8.h"

namespace kiln {
namespace {

nlohmann::json value_json(const Value* v) {
  if (!v) return nullptr;
  return {{"name", v->name}, {"type", v->type.str()}};
}

// The precision a layer computes in: its first float output's element type.
std::string layer_precision(const Node& n) {
  for (const Value* v : n.outputs())
    if (v && dtype_is_float(v->type.dtype)) return std::string(dtype_name(v->type.dtype));
  for (const Value* v : n.outputs())
    if (v) return std::string(dtype_name(v->type.dtype));
  return "";
}

// Per-channel weight scales as {count, axis, min, max}, or null when the weight has none.
nlohmann::json weight_scales_json(const Value* w) {
  if (!w || w->quant_scales.empty()) return nullptr;
  const auto [lo, hi] = std::minmax_element(w->quant_scales.begin(), w->quant_scales.end());
  return {{"count", w->quant_scales.size()}, {"axis", w->quant_axis}, {"min", *lo}, {"max", *hi}};
}

// The scales an INT8 layer uses (docs/quantization.md): input, weights per channel, residual,
// a FusedConvPair's second input and weights, output (absent: the output stays float).
nlohmann::json int8_scales(const Node& n) {
  nlohmann::json j = nlohmann::json::object();
  auto scale = [](const Value* v) {
    return v && v->has_quant_scale() ? nlohmann::json(v->quant_scales[0]) : nlohmann::json();
  };
  j["input"] = scale(n.input(0));
  if (auto w = weight_scales_json(n.input(1)); !w.is_null()) j["weights"] = std::move(w);
  if (n.op_type == "FusedConv" && n.input(3)) j["residual"] = scale(n.input(3));
  if (n.op_type == "FusedConvPair") {
    j["input2"] = scale(n.input(3));
    if (auto w = weight_scales_json(n.input(4)); !w.is_null()) j["weights2"] = std::move(w);
  }
  j["output"] = scale(n.output(0));
  return j;
}

}  // namespace

nlohmann::json describe_graph(const Graph& g, const std::string& kind, const nlohmann::json& meta,
                              const nlohmann::json& plan) {
  const bool has_plan = plan.is_object() && plan.contains("layers") && plan["layers"].is_array() &&
                        plan["layers"].size() == g.nodes().size();
  nlohmann::json j = meta;
  j["kind"] = kind;
  j["graph"] = g.name;
  j["opset"] = g.opset;
  j["inputs"] = nlohmann::json::array();
  for (const Value* v : g.inputs()) j["inputs"].push_back(value_json(v));
  j["outputs"] = nlohmann::json::array();
  for (const Value* v : g.outputs()) j["outputs"].push_back(value_json(v));
  j["layers"] = nlohmann::json::array();
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node* n = g.nodes()[k];
    nlohmann::json l = {{"name", n->name},
                        {"type", n->domain.empty() ? n->op_type : n->domain + "." + n->op_type},
                        {"precision", layer_precision(*n)},
                        {"origin", n->origin},
                        {"onnx_nodes", n->onnx_nodes}};
    l["inputs"] = nlohmann::json::array();
    for (const Value* v : n->inputs())
      l["inputs"].push_back(v ? nlohmann::json(v->is_constant() ? "(const) " + v->name : v->name)
                              : nlohmann::json(""));
    l["outputs"] = nlohmann::json::array();
    for (const Value* v : n->outputs()) l["outputs"].push_back(value_json(v));
    if (quant::runs_int8(*n)) {
      l["precision"] = "int8";
      l["int8_scales"] = int8_scales(*n);
    }
    if (has_plan) {  // the backend's choice for this layer
      const auto& r = plan["layers"][k];
      l["tactic"] = r.value("tactic", "");
      // cuda: what the layer runs in (int8 for an INT8 tactic; an INT8-marked layer that fell
      // back to a float tactic shows fp16/tf32 next to its scales).
      if (r.contains("precision")) l["precision"] = r["precision"];
      for (const char* key :
           {"variant", "in", "out", "time_ms", "timed", "launches", "alternates", "dynamic", "prefix"})
        if (r.contains(key)) l[key] = r[key];
    }
    j["layers"].push_back(l);
  }
  // How many layers launch a kernel (the rest relabel memory or run on the host).
  if (has_plan && plan.contains("kernel_layers")) j["kernel_layers"] = plan["kernel_layers"];
  // Sizes the data decides (cuda): the layers that read or write them, the outputs whose shape
  // is known only after an inference, and why the engine runs without a CUDA graph.
  if (has_plan && plan.value("dynamic_region", false)) {
    size_t count = 0;
    std::set<std::string> dynamic_values;
    for (size_t k = 0; k < g.nodes().size(); ++k)
      if (plan["layers"][k].value("dynamic", false)) {
        ++count;
        for (const Value* v : g.nodes()[k]->outputs())
          if (v) dynamic_values.insert(v->name);
      }
    for (auto& o : j["outputs"])
      if (dynamic_values.count(o["name"].get<std::string>())) o["data_dependent"] = true;
    // The prefix (engines that record it): the layers before the first size the data decides,
    // replayed as one CUDA graph per input shape.
    const size_t prefix = plan.value("prefix_layers", size_t{0});
    std::string why = "a layer's output size depends on the data (data-dependent ops, control "
                      "flow), so the engine as a whole has no CUDA graph: ";
    if (prefix > 0)
      why += fmt::format("the {} layers marked '(prefix)' replay as one CUDA graph per input "
                         "shape, the rest run layer by layer",
                         prefix);
    else if (plan.contains("prefix_layers"))
      why += "it runs layer by layer (no layer that launches a kernel precedes the first size "
             "the data decides)";
    else
      why += "it runs layer by layer";
    j["dynamic_region"] = {{"layers", count},
                           {"prefix_layers", prefix},
                           {"cuda_graph", false},
                           {"why", why + ", reading sizes back where the data decides them"}};
  }
  // The input shapes the layers were tuned at (cuda, dynamic profiles): the opt shapes first.
  if (has_plan && plan.contains("points")) j["tuning_points"] = plan["points"];
  size_t weight_bytes = 0, weight_count = 0;
  for (const Value* v : g.values())
    if (v->is_constant()) {
      weight_bytes += v->constant->nbytes();
      ++weight_count;
    }
  j["weights"] = {{"count", weight_count}, {"bytes", weight_bytes}};
  return j;
}

nlohmann::json describe_device_memory(const Engine& e) {
  std::string why;
  if (cuda_device_count(&why) <= 0) return {{"note", "planned on a GPU; none here (" + why + ")"}};
  auto ctx = e.create_context();
  if (!ctx.ok()) return {{"note", ctx.status().message()}};
  nlohmann::json options = nlohmann::json::parse(e.build_options_json(), nullptr, false);
  if (!options.is_object()) options = nlohmann::json::object();
  nlohmann::json j = nlohmann::json::object();
  for (const char* point : {"min", "opt", "max"}) {
    nlohmann::json shapes = nlohmann::json::object();
    Status st = Status::Ok();
    for (const TensorInfo& info : e.inputs()) {
      std::vector<int64_t> dims = info.dims;
      if (options.contains("profile") && options["profile"].contains(info.name))
        dims = options["profile"][info.name][point].get<std::vector<int64_t>>();
      shapes[info.name] = dims;
      if (st.ok()) st = (*ctx)->set_input_shape(info.name, dims);
    }
    auto m = st.ok() ? (*ctx)->plan_device_memory() : Expected<MemoryInfo>(st);
    if (!m.ok()) return {{"note", m.status().message()}};
    j["weights"] = m->weights;
    j[point] = {{"shapes", shapes}, {"activations", m->activations}, {"workspace", m->workspace}};
  }
  return j;
}

std::string inspect_json(const Engine& e) {
  const nlohmann::json meta = {
      {"backend", e.backend()},
      {"target", e.target()},
      {"kiln_version", e.kiln_version()},
      {"build_options", nlohmann::json::parse(e.build_options_json(), nullptr, false)}};
  nlohmann::json j = describe_graph(e.graph(), "kiln engine", meta,
                                    nlohmann::json::parse(e.backend_plan_json(), nullptr, false));
  if (e.backend() == "cuda") j["device_memory"] = describe_device_memory(e);
  return j.dump();
}

}  // namespace kiln
