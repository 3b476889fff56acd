// kiln inspect: inputs, outputs, layers, weights and build options of an engine or ONNX model.
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "backends/backend_info.h"
#include "cli.h"
#include "engine/describe.h"
#include "engine/plan_format.h"
#include "kiln/engine.h"
#include "onnx/importer.h"

namespace kiln::cli {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void print_text(const nlohmann::json& j) {
  std::cout << j["kind"].get<std::string>() << (j.contains("backend") ? " (" + j["backend"].get<std::string>() + " backend, target " + j["target"].get<std::string>() + ", kiln " + j["kiln_version"].get<std::string>() + ")" : "") << "\n";
  if (j.contains("build_options")) std::cout << "build options: " << j["build_options"].dump() << "\n";
  std::cout << "opset " << j["opset"] << "\n";
  for (const auto& v : j["inputs"]) std::cout << "input  " << v["name"].get<std::string>() << ": " << v["type"].get<std::string>() << "\n";
  for (const auto& v : j["outputs"])
    std::cout << "output " << v["name"].get<std::string>() << ": " << v["type"].get<std::string>()
              << (v.value("data_dependent", false) ? " (shape decided by the data)" : "") << "\n";
  if (j.contains("dynamic_region"))
    std::cout << fmt::format("dynamic region: {} layers marked '(dynamic)'; {}\n",
                             j["dynamic_region"]["layers"].get<size_t>(),
                             j["dynamic_region"]["why"].get<std::string>());
  std::cout << fmt::format("weights: {} tensors, {} bytes", j["weights"]["count"].get<size_t>(), j["weights"]["bytes"].get<size_t>()) << "\n";
  if (j.contains("tuning_points")) {
    // "point0 input_ids:32x128,attention_mask:32x128; point1 ..." in input order.
    std::vector<std::string> pts;
    for (size_t p = 0; p < j["tuning_points"].size(); ++p) {
      std::vector<std::string> s;
      for (size_t i = 0; i < j["tuning_points"][p].size() && i < j["inputs"].size(); ++i)
        s.push_back(
            j["inputs"][i]["name"].get<std::string>() + ":" +
            fmt::format("{}",
                        fmt::join(j["tuning_points"][p][i].get<std::vector<int64_t>>(), "x")));
      pts.push_back(fmt::format("point{} {}", p, fmt::join(s, ",")));
    }
    std::cout << "tuned at: " << fmt::format("{}", fmt::join(pts, "; "))
              << " (a layer's 'pointN=' tactic runs at shapes nearer point N)\n";
  }
  std::cout << "layers (" << j["layers"].size();
  if (j.contains("kernel_layers"))
    std::cout << ", " << j["kernel_layers"].get<int>() << " launch kernels; '(no launch)' marks the others";
  std::cout << "):\n";
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
      if (l.contains("launches") && !l["launches"].get<bool>()) std::cout << " (no launch)";
      if (l.value("dynamic", false)) std::cout << " (dynamic)";
      if (l.value("prefix", false)) std::cout << " (prefix)";
      if (l.contains("alternates"))
        for (const auto& a : l["alternates"]) {
          std::cout << fmt::format(" point{}={}", a.value("point", size_t{0}),
                                   a.value("tactic", std::string()));
          if (const std::string v = a.value("variant", std::string()); !v.empty())
            std::cout << "/" << v;
          if (const double ms = a.value("time_ms", -1.0); ms >= 0)
            std::cout << fmt::format(" ({:.4f}ms)", ms);
        }
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
    if (l["onnx_nodes"].size() > 1 || l["origin"] != "import") {
      const auto covers = l["onnx_nodes"].get<std::vector<std::string>>();
      if (covers.empty())  // made by a pass in place of nodes other layers cover
        std::cout << fmt::format(" [{}]", l["origin"].get<std::string>());
      else
        std::cout << fmt::format(" [{}; covers {}]", l["origin"].get<std::string>(),
                                 fmt::join(covers, ", "));
    }
    std::cout << "\n";
  }
}

// Needs a GPU; without one (or for an engine this GPU cannot run) says why.
nlohmann::json device_memory(const std::string& path) {
  std::string why;
  if (cuda_device_count(&why) <= 0) return {{"note", "planned on a GPU; none here (" + why + ")"}};
  auto engine = Engine::load(path);
  if (!engine.ok()) return {{"note", engine.status().message()}};
  return describe_device_memory(**engine);
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
      j = describe_graph(*g, "onnx model", nlohmann::json::object());
    } else {
      KILN_ASSIGN_OR_RETURN(LoadedPlan plan, read_plan_file(o->path));
      nlohmann::json meta = {{"backend", plan.meta.backend}, {"target", plan.meta.target},
                             {"kiln_version", plan.meta.kiln_version},
                             {"build_options", plan.meta.build_options}};
      j = describe_graph(*plan.graph, "kiln engine", meta, plan.meta.backend_plan);
      if (plan.meta.backend == "cuda") {
        j["device_memory"] = device_memory(o->path);
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
