// --accuracy-budget: the search for the INT8 layers to move back to float
// (docs/quantization.md). Everything goes through Engine::build_from_onnx and
// ExecutionContext::execute, so it runs on the CPU reference today and on the GPU once INT8
// tactics exist.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "onnx/importer.h"
#include "quant/calib_io.h"
#include "quant/int8.h"
#include "quant/int8_build.h"

namespace kiln::quant {
namespace {

// Relative L2 error of each output (over all feeds), worst output.
struct Evaluator {
  std::vector<Feed> feeds;
  std::vector<std::vector<Tensor>> reference;  // FP32 outputs per feed

  Expected<std::vector<std::vector<Tensor>>> run(const Engine& e) const {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> ctx, e.create_context());
    std::vector<std::vector<Tensor>> out;
    for (const Feed& f : feeds) {
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> o, ctx->execute(f));
      out.push_back(std::move(o));
    }
    return out;
  }

  Expected<double> error(const Engine& e) const {
    KILN_ASSIGN_OR_RETURN(auto got, run(e));
    double worst = 0;
    for (size_t o = 0; o < reference[0].size(); ++o) {
      double diff = 0, norm = 0;
      for (size_t f = 0; f < feeds.size(); ++f) {
        const Tensor a = got[f][o].cast(DataType::kFloat64),
                     b = reference[f][o].cast(DataType::kFloat64);
        for (int64_t i = 0; i < b.numel(); ++i) {
          const double d = a.data<double>()[i] - b.data<double>()[i];
          diff += d * d;
          norm += b.data<double>()[i] * b.data<double>()[i];
        }
      }
      worst = std::max(worst, norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff));
    }
    return worst;
  }
};

// Sum of the tuned layer times in a cuda engine's plan (ms); -1 when there are none (cpu).
double tuned_ms(const Engine& e) {
  const auto plan = nlohmann::json::parse(e.backend_plan_json(), nullptr, false);
  if (!plan.is_object() || !plan.contains("layers")) return -1;
  double sum = 0;
  for (const auto& l : plan["layers"])
    if (l.contains("time_ms") && l["time_ms"].is_number() && l["time_ms"].get<double>() > 0)
      sum += l["time_ms"].get<double>();
  return sum;
}

}  // namespace

std::vector<std::vector<std::string>> int8_layer_groups(const Graph& int8_graph,
                                                        const Graph& float_graph) {
  std::vector<std::vector<std::string>> out;
  for (const Node* n : int8_graph.nodes()) {
    if (!runs_int8(*n)) continue;
    std::vector<std::string> group = {n->name};
    for (const Node* f : float_graph.nodes())
      if (f->name != n->name &&
          std::find(n->onnx_nodes.begin(), n->onnx_nodes.end(), f->name) != n->onnx_nodes.end())
        group.push_back(f->name);
    out.push_back(std::move(group));
  }
  return out;
}

Expected<BudgetResult> fit_accuracy_budget(const std::string& onnx_path, const BuildConfig& c) {
  const double budget = c.accuracy_budget;
  auto say = [&](const std::string& s) {
    if (c.progress) c.progress(s);
  };
  if (c.calib_data.empty())
    return Status::Error(
        "--accuracy-budget measures the error on held-out calibration batches: "
        "give --calib DATA");
  BuildConfig base = c;
  base.accuracy_budget = 0;
  base.int8 = false;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> fp32, Engine::build_from_onnx(onnx_path, base));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CalibData> data,
                        open_npy_calib_data(c.calib_data, fp32->graph(), c.calib_batches,
                                            c.calib_images));
  const size_t n = data->size(), held = heldout_batches(n);
  Evaluator ev;
  for (size_t b = held ? n - held : 0; b < n; ++b) {
    KILN_ASSIGN_OR_RETURN(std::vector<Feed> feeds, data->batch(b));
    for (Feed& f : feeds) ev.feeds.push_back(std::move(f));
  }
  KILN_ASSIGN_OR_RETURN(ev.reference, ev.run(*fp32));
  say(fmt::format("accuracy budget {}: {} held-out batch{} ({} runs){}", budget, held ? held : n,
                  (held ? held : n) == 1 ? "" : "es", ev.feeds.size(),
                  held ? "" : " (only one batch: the calibration batch is reused)"));

  // INT8 builds: calibrate once (on the batches not held out), then reuse the scales.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> model, import_onnx_file(onnx_path));
  bool explicit_q = false;
  for (const Node* node : model->nodes())
    explicit_q |= node->op_type == "QuantizeLinear" || node->op_type == "DequantizeLinear";
  BuildConfig q = c;
  q.accuracy_budget = 0;
  q.calib_batches = n - held;
  std::string temp_cache;
  if (explicit_q) {
    q.calib_data.clear();
    q.calib_cache.clear();
  } else if (q.calib_cache.empty()) {
    temp_cache = (std::filesystem::temp_directory_path() /
                  fmt::format("kiln-budget-{}.cache", static_cast<const void*>(&q)))
                     .string();
    q.calib_cache = temp_cache;
  }
  struct RemoveTemp {
    std::string path;
    ~RemoveTemp() {
      if (!path.empty()) std::filesystem::remove(path);
    }
  } cleanup{temp_cache};
  const std::string back = c.fp16 ? "fp16" : "fp32";
  auto build = [&](const std::vector<std::string>& moved) -> Expected<std::unique_ptr<Engine>> {
    BuildConfig b = q;
    for (const std::string& l : moved) b.layer_precisions[l] = back;
    return Engine::build_from_onnx(onnx_path, b);
  };
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> all, build({}));
  KILN_ASSIGN_OR_RETURN(const double err_all, ev.error(*all));
  // One unit per INT8 layer of the engine; a pair's unit names both of its layers.
  const std::vector<std::vector<std::string>> layers =
      int8_layer_groups(all->graph(), fp32->graph());
  nlohmann::json report = {{"budget", budget},
                           {"metric", "relative L2, worst output"},
                           {"heldout_runs", ev.feeds.size()},
                           {"error_all_int8", err_all},
                           {"int8_layers", layers.size()}};
  say(fmt::format("all {} INT8 layers: error {:.6g}", layers.size(), err_all));
  BudgetResult r;
  if (err_all <= budget) {
    report["error"] = err_all;
    report["moved"] = nlohmann::json::array();
    r.engine = std::move(all);
    r.report = std::move(report);
    return r;
  }
  // Sensitivity of a layer: how much the error drops when only it moves back.
  std::vector<std::pair<double, size_t>> gain;  // error drop, index into layers
  nlohmann::json sens = nlohmann::json::object();
  for (size_t i = 0; i < layers.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, build(layers[i]));
    KILN_ASSIGN_OR_RETURN(const double err, ev.error(*e));
    const std::string unit = fmt::format("{}", fmt::join(layers[i], " + "));
    say(fmt::format("sensitivity {}/{}: {} back to {}: error {:.6g}", i + 1, layers.size(), unit,
                    back, err));
    gain.emplace_back(err_all - err, i);
    sens[unit] = err;
  }
  std::stable_sort(gain.begin(), gain.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<std::string> moved;
  double err = err_all;
  std::unique_ptr<Engine> last;
  for (const auto& [g, i] : gain) {
    moved.insert(moved.end(), layers[i].begin(), layers[i].end());
    KILN_ASSIGN_OR_RETURN(last, build(moved));
    KILN_ASSIGN_OR_RETURN(err, ev.error(*last));
    say(fmt::format("moved {} layer{} back to {} (last {}): error {:.6g}", moved.size(),
                    moved.size() == 1 ? "" : "s", back, fmt::join(layers[i], " + "), err));
    if (err <= budget) break;
  }
  if (err > budget)
    say(fmt::format("warning: error {:.6g} is above the budget {} even with every INT8 layer in {}",
                    err, budget, back));
  report["sensitivity_error_when_alone_in_float"] = sens;
  report["moved"] = moved;
  report["moved_to"] = back;
  report["error"] = err;
  report["met"] = err <= budget;
  if (const double before = tuned_ms(*all), after = tuned_ms(*last); before >= 0) {
    report["tuned_ms_all_int8"] = before;
    report["tuned_ms"] = after;
  } else {
    report["speed_cost"] =
        "not measured on the cpu backend (tuned layer times come from the GPU tuner)";
  }
  r.engine = std::move(last);
  r.report = std::move(report);
  return r;
}

}  // namespace kiln::quant
