// kiln inspect: inputs, outputs, layers, weights and build options of an engine or ONNX model.
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "backends/backend_info.h"
#include "cli.h"
#include "engine/plan_format.h"
#include "kiln/engine.h"
#include "ir/graph.h"
#include "onnx/importer.h"
#include "quant/int8.h"

namespace kiln::cli {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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
  auto scale = [](const Value* v) { return v && v->has_quant_scale() ? nlohmann::json(v->quant_scales[0]) : nlohmann::json(); };
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

nlohmann::json describe(const Graph& g, const std::string& kind, const nlohmann::json& meta,
                        const nlohmann::json& plan = nlohmann::json()) {
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
    nlohmann::json l = {{"name", n->name}, {"type", n->domain.empty() ? n->op_type : n->domain + "." + n->op_type},
                        {"precision", layer_precision(*n)}, {"origin", n->origin},
                        {"onnx_nodes", n->onnx_nodes}};
    l["inputs"] = nlohmann::json::array();
    for (const Value* v : n->inputs())
      l["inputs"].push_back(v ? nlohmann::json(v->is_constant() ? "(const) " + v->name : v->name) : nlohmann::json(""));
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
      for (const char* key : {"variant", "in", "out", "time_ms", "timed"})
        if (r.contains(key)) l[key] = r[key];
    }
    j["layers"].push_back(l);
  }
  size_t weight_bytes = 0, weight_count = 0;
  for (const Value* v : g.values())
    if (v->is_constant()) { weight_bytes += v->constant->nbytes(); ++weight_count; }
  j["weights"] = {{"count", weight_count}, {"bytes", weight_bytes}};
  return j;
}

void print_text(const nlohmann::json& j) {
  std::cout << j["kind"].get<std::string>() << (j.contains("backend") ? " (" + j["backend"].get<std::string>() + " backend, target " + j["target"].get<std::string>() + ", kiln " + j["kiln_version"].get<std::string>() + ")" : "") << "\n";
  if (j.contains("build_options")) std::cout << "build options: " << j["build_options"].dump() << "\n";
  std::cout << "opset " << j["opset"] << "\n";
  for (const auto& v : j["inputs"]) std::cout << "input  " << v["name"].get<std::string>() << ": " << v["type"].get<std::string>() << "\n";
  for (const auto& v : j["outputs"]) std::cout << "output " << v["name"].get<std::string>() << ": " << v["type"].get<std::string>() << "\n";
  std::cout << fmt::format("weights: {} tensors, {} bytes", j["weights"]["count"].get<size_t>(), j["weights"]["bytes"].get<size_t>()) << "\n";
  std::cout << "layers (" << j["layers"].size() << "):\n";
  int i = 0;
  for (const auto& l : j["layers"]) {
    std::vector<std::string> ins, outs;
    for (const auto& v : l["inputs"]) ins.push_back(v.get<std::string>());
    for (const auto& v : l["outputs"]) outs.push_back(v.is_null() ? "" : v["name"].get<std::string>() + ":" + v["type"].get<std::string>());
    std::cout << fmt::format("  #{:<3} {:<22} {:<28} {:<8} ({}) -> ({})", i++, l["type"].get<std::string>(),
                             l["name"].get<std::string>(), l["precision"].get<std::string>(),
                             fmt::join(ins, ", "), fmt::join(outs, ", "));
    if (l.contains("tactic")) {
      std::cout << " tactic=" << l["tactic"].get<std::string>();
      if (l.contains("variant") && !l["variant"].get<std::string>().empty())
        std::cout << "/" << l["variant"].get<std::string>();
      if (l.contains("out") && !l["out"].empty()) std::cout << " format=" << l["out"][0].get<std::string>();
      if (l.contains("time_ms") && l["time_ms"].get<double>() >= 0)
        std::cout << fmt::format(" tuned={:.4f}ms", l["time_ms"].get<double>());
    }
    if (l.contains("int8_scales")) {
      const auto& q = l["int8_scales"];
      auto f = [](const nlohmann::json& v) { return v.is_null() ? std::string("float") : fmt::format("{:.6g}", v.get<double>()); };
      auto w = [](const nlohmann::json& v) {
        return fmt::format("[{} per channel, {:.4g}..{:.4g}]", v["count"].get<size_t>(),
                           v["min"].get<double>(), v["max"].get<double>());
      };
      std::cout << " scales: in=" << f(q["input"]);
      if (q.contains("weights")) std::cout << " w=" << w(q["weights"]);
      if (q.contains("residual")) std::cout << " residual=" << f(q["residual"]);
      if (q.contains("input2")) std::cout << " in2=" << f(q["input2"]);
      if (q.contains("weights2")) std::cout << " w2=" << w(q["weights2"]);
      std::cout << " out=" << f(q["output"]);
    }
    if (l["onnx_nodes"].size() > 1 || l["origin"] != "import")
      std::cout << fmt::format(" [{}; covers {}]", l["origin"].get<std::string>(),
                               fmt::join(l["onnx_nodes"].get<std::vector<std::string>>(), ", "));
    std::cout << "\n";
  }
}

// Device memory of a cuda engine per profile point (min/opt/max shapes): the weights on the
// device and, for each point, the activation arena and the largest layer workspace, as a context
// plans them. Needs a GPU; without one (or for an engine this GPU cannot run) says why.
nlohmann::json device_memory(const std::string& path, const nlohmann::json& options) {
  std::string why;
  if (cuda_device_count(&why) <= 0) return {{"note", "planned on a GPU; none here (" + why + ")"}};
  auto engine = Engine::load(path);
  if (!engine.ok()) return {{"note", engine.status().message()}};
  auto ctx = (*engine)->create_context();
  if (!ctx.ok()) return {{"note", ctx.status().message()}};
  nlohmann::json j = nlohmann::json::object();
  for (const char* point : {"min", "opt", "max"}) {
    nlohmann::json shapes = nlohmann::json::object();
    Status st = Status::Ok();
    for (const TensorInfo& info : (*engine)->inputs()) {
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

void print_memory(const nlohmann::json& m) {
  if (m.contains("note")) {
    std::cout << "device memory: " << m["note"].get<std::string>() << "\n";
    return;
  }
  std::cout << fmt::format("device memory: weights {:.2f} MiB\n", m["weights"].get<size_t>() / 1048576.0);
  for (const char* point : {"min", "opt", "max"}) {
    std::vector<std::string> s;
    for (const auto& [name, dims] : m[point]["shapes"].items())
      s.push_back(name + ":" + fmt::format("{}", fmt::join(dims.get<std::vector<int64_t>>(), "x")));
    std::cout << fmt::format("  {} ({}): activations {:.2f} MiB, workspace {:.2f} MiB\n", point,
                             fmt::join(s, ","), m[point]["activations"].get<size_t>() / 1048576.0,
                             m[point]["workspace"].get<size_t>() / 1048576.0);
  }
}

}  // namespace

Runner add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show the inputs, outputs, layers and weights of an engine or ONNX model");
  struct Opts {
    std::string path;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("file", o->path, "Engine (.kiln) or ONNX model (.onnx)")->required();
  cmd->add_flag("--json", o->json, "Print one JSON object");
  return [o]() -> Status {
    nlohmann::json j;
    if (ends_with(o->path, ".onnx")) {
      KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(o->path));
      j = describe(*g, "onnx model", nlohmann::json::object());
    } else {
      KILN_ASSIGN_OR_RETURN(LoadedPlan plan, read_plan_file(o->path));
      nlohmann::json meta = {{"backend", plan.meta.backend}, {"target", plan.meta.target},
                             {"kiln_version", plan.meta.kiln_version},
                             {"build_options", plan.meta.build_options}};
      j = describe(*plan.graph, "kiln engine", meta, plan.meta.backend_plan);
      if (plan.meta.backend == "cuda") {
        const nlohmann::json& opts = plan.meta.build_options;
        j["device_memory"] = device_memory(o->path, opts.is_object() ? opts : nlohmann::json::object());
      }
    }
    if (o->json) {
      std::cout << j.dump(2) << "\n";
    } else {
      print_text(j);
      if (j.contains("device_memory")) print_memory(j["device_memory"]);
    }
    return Status::Ok();
  };
}

}  // namespace kiln::cli
