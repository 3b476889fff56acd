#include "compare_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace kiln::cli {
namespace {

std::string pct(double v) { return v < 0 ? "n/a" : fmt::format("{:.1f}%", 100 * v); }

nlohmann::json metrics_json(const TensorMetrics& m) {
  auto num = [](double v) -> nlohmann::json {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  return {{"max_abs", num(m.max_abs)},
          {"rel_l2", num(m.rel_l2)},
          {"cosine", num(m.cosine)},
          {"top1_agreement", m.top1 < 0 ? nlohmann::json(nullptr) : nlohmann::json(m.top1)},
          {"finite", m.finite}};
}

std::string jump_line(const LayerError& l) {
  return fmt::format(
      "layer '{}' ({}{}) at tensor '{}': relative L2 {:.3g}, {:.3g} reaching its inputs", l.layer,
      l.op_type,
      l.onnx_nodes.empty() ? "" : fmt::format("; ONNX nodes {}", fmt::join(l.onnx_nodes, ", ")),
      l.tensor, l.m.rel_l2, l.upstream);
}

}  // namespace

void print_compare(std::ostream& os, const std::string& model,
                   const std::map<std::string, Tensor>& inputs,
                   const std::vector<CompareEngine>& engines, bool per_layer) {
  os << "reference " << model << " on the cpu backend in float64\n";
  for (const auto& [name, t] : inputs) os << "input     " << name << " " << t.desc() << "\n";
  os << fmt::format("{:<24} {:<6} {:<24} {:>10} {:>10} {:>10} {:>7}\n", "engine", "prec", "output",
                    "max_abs", "rel_l2", "cosine", "top1");
  for (const auto& ce : engines)
    for (const auto& [name, m] : ce.outputs)
      os << fmt::format("{:<24} {:<6} {:<24} {:>10.3g} {:>10.3g} {:>10.6f} {:>7}\n", ce.label,
                        ce.precision, name, m.max_abs, m.rel_l2, m.cosine, pct(m.top1));
  for (const auto& ce : engines) {
    if (!ce.dataset.is_null())
      os << fmt::format("dataset   {}: top-1 {:.2f}%  top-5 {:.2f}% over {} samples\n", ce.label,
                        100 * ce.dataset["top1"].get<double>(),
                        100 * ce.dataset["top5"].get<double>(),
                        ce.dataset["samples"].get<size_t>());
    if (!per_layer) continue;
    const PerLayerReport& r = ce.per_layer;
    os << fmt::format(
        "per-layer {}: {} tensors compared; a jump is relative L2 > {:.3g} and > 10x "
        "the error reaching the layer\n",
        ce.label, r.layers.size(), r.floor);
    for (const auto& l : r.layers)
      os << fmt::format("  {} {:<28} {:<22} {:>10.3g} {:>10.3g}  {}\n", l.jump ? "!" : " ", l.layer,
                        l.op_type, l.m.rel_l2, l.upstream, l.tensor);
    if (r.first_jump >= 0)
      os << "first jump: " << jump_line(r.layers[r.first_jump]) << "\n";
    else
      os << "first jump: none (no layer adds error above the floor)\n";
  }
}

nlohmann::json compare_json(const std::string& model, const std::map<std::string, Tensor>& inputs,
                            const std::vector<CompareEngine>& engines, bool per_layer,
                            double tolerance) {
  nlohmann::json j = {{"schema", "kiln.compare/1"},
                      {"model", model},
                      {"reference", "onnx model on the cpu backend in float64"}};
  nlohmann::json in = nlohmann::json::object();
  for (const auto& [name, t] : inputs) in[name] = t.desc();
  j["inputs"] = in;
  j["tolerance"] = tolerance < 0 ? nlohmann::json(nullptr) : nlohmann::json(tolerance);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& ce : engines) {
    nlohmann::json e = {
        {"label", ce.label},
        {"precision", ce.precision},
        {"backend", ce.engine->backend()},
        {"target", ce.engine->target()},
        {"file", ce.file.empty() ? nlohmann::json(nullptr) : nlohmann::json(ce.file)}};
    nlohmann::json outs = nlohmann::json::array();
    for (const auto& [name, m] : ce.outputs) {
      nlohmann::json o = metrics_json(m);
      o["name"] = name;
      outs.push_back(o);
    }
    e["outputs"] = outs;
    if (!ce.dataset.is_null()) e["dataset"] = ce.dataset;
    if (per_layer) {
      nlohmann::json layers = nlohmann::json::array();
      for (const auto& l : ce.per_layer.layers) {
        nlohmann::json x = metrics_json(l.m);
        x.update({{"layer", l.layer},
                  {"type", l.op_type},
                  {"tensor", l.tensor},
                  {"onnx_nodes", l.onnx_nodes},
                  {"upstream_rel_l2", l.upstream},
                  {"jump", l.jump}});
        layers.push_back(x);
      }
      const int f = ce.per_layer.first_jump;
      e["per_layer"] = {{"floor", ce.per_layer.floor},
                        {"layers", layers},
                        {"first_jump", f < 0 ? nlohmann::json(nullptr)
                                             : nlohmann::json(ce.per_layer.layers[f].layer)}};
    }
    list.push_back(e);
  }
  j["engines"] = list;
  j["passed"] = tolerance_check(engines, tolerance).ok();
  return j;
}

Status tolerance_check(const std::vector<CompareEngine>& engines, double tolerance) {
  if (tolerance < 0) return Status::Ok();
  const CompareEngine* worst_e = nullptr;
  const std::pair<std::string, TensorMetrics>* worst = nullptr;
  for (const auto& ce : engines)
    for (const auto& o : ce.outputs)
      if (!(o.second.rel_l2 <= tolerance) &&
          (!worst || !(o.second.rel_l2 <= worst->second.rel_l2))) {
        worst = &o;
        worst_e = &ce;
      }
  if (!worst) return Status::Ok();
  return KILN_ERROR("tolerance exceeded: {} output '{}' has relative L2 error {:.3g} > {:.3g}",
                    worst_e->label, worst->first, worst->second.rel_l2, tolerance);
}

}  // namespace kiln::cli
