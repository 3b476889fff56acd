#include "compare/compare.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "onnx/importer.h"

namespace kiln {

Expected<TensorMetrics> compare_tensors(const Tensor& got, const Tensor& ref,
                                        const std::string& what) {
  if (got.numel() != ref.numel())
    return KILN_ERROR("{}: {} elements here but {} in the reference ({} vs {})", what, got.numel(),
                      ref.numel(), got.desc(), ref.desc());
  const Tensor g = got.dtype() == DataType::kFloat64 ? got : got.cast(DataType::kFloat64);
  const Tensor r = ref.dtype() == DataType::kFloat64 ? ref : ref.cast(DataType::kFloat64);
  const double* a = g.data<double>();
  const double* b = r.data<double>();
  TensorMetrics m;
  double diff2 = 0, ref2 = 0, got2 = 0, dot = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (!std::isfinite(a[i])) m.finite = false;
    const double d = a[i] - b[i];
    m.max_abs = std::max(m.max_abs, std::abs(d));
    diff2 += d * d;
    ref2 += b[i] * b[i];
    got2 += a[i] * a[i];
    dot += a[i] * b[i];
  }
  if (!m.finite)
    m.max_abs = m.rel_l2 = INFINITY;
  else
    m.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  m.cosine = got2 == 0 && ref2 == 0 ? 1.0 : dot / std::sqrt(std::max(got2 * ref2, 1e-300));
  const int64_t last = ref.rank() > 0 ? ref.dim(-1) : 1;
  if (last >= 2 && got.rank() > 0 && got.dim(-1) == last) {
    const int64_t rows = g.numel() / last;
    int64_t agree = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const double* ar = a + row * last;
      const double* br = b + row * last;
      agree += std::max_element(ar, ar + last) - ar == std::max_element(br, br + last) - br;
    }
    m.top1 = rows ? static_cast<double>(agree) / static_cast<double>(rows) : 1.0;
  }
  return m;
}

Expected<std::unique_ptr<Reference>> Reference::create(const std::string& onnx_path) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(onnx_path));
  return from_graph(std::move(g));
}

Expected<std::unique_ptr<Reference>> Reference::from_graph(std::unique_ptr<Graph> g) {
  std::unique_ptr<Reference> r(new Reference());
  r->graph_ = std::move(g);
  KILN_ASSIGN_OR_RETURN(r->ex_, CpuExecutor::create(*r->graph_, /*float64=*/true));
  return r;
}

Expected<std::vector<Tensor>> Reference::run(const std::map<std::string, Tensor>& inputs,
                                             const std::vector<std::string>& keep,
                                             std::map<std::string, Tensor>* kept) const {
  std::vector<Tensor> ordered;
  for (const Value* v : graph_->inputs()) {
    auto it = inputs.find(v->name);
    if (it == inputs.end()) return KILN_ERROR("reference: input '{}' was not given", v->name);
    ordered.push_back(it->second);
  }
  std::vector<std::string> names = keep;
  for (const Value* v : graph_->outputs()) names.push_back(v->name);
  CpuExecutor::Debug debug;
  KILN_ASSIGN_OR_RETURN(debug.slots, ex_->debug_slots(names));
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, ex_->run(ordered, nullptr, &debug));
  for (size_t i = 0; i < outs.size(); ++i) {
    auto it = debug.values.find(graph_->outputs()[i]->name);
    if (it != debug.values.end()) outs[i] = it->second;  // the float64 value, not rounded
  }
  if (kept)
    for (const std::string& n : keep)
      if (auto it = debug.values.find(n); it != debug.values.end()) (*kept)[n] = it->second;
  return outs;
}

std::vector<std::string> common_tensors(const Graph& engine_graph, const Graph& reference) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const Node* n : engine_graph.nodes())
    for (const Value* v : n->outputs()) {
      if (!v || v->is_constant() || seen.count(v->name)) continue;
      const Value* r = reference.find_value(v->name);
      if (!r || r->is_constant() || !r->producer) continue;
      if (!dtype_is_float(v->type.dtype) || !dtype_is_float(r->type.dtype)) continue;
      // A tensor that one of the layer's own ONNX nodes reads is inside the fused layer, which
      // may write another value under its name (a product with the scale after it folded in).
      const auto covered = [&](const std::pair<Node*, int>& u) {
        return std::find(n->onnx_nodes.begin(), n->onnx_nodes.end(), u.first->name) !=
               n->onnx_nodes.end();
      };
      if (std::any_of(r->uses().begin(), r->uses().end(), covered)) continue;
      seen.insert(v->name);
      out.push_back(v->name);
    }
  return out;
}

Expected<PerLayerReport> localise_error(const Graph& engine_graph,
                                        const std::map<std::string, Tensor>& got,
                                        const std::map<std::string, Tensor>& ref, double floor) {
  PerLayerReport rep;
  rep.floor = floor;
  std::unordered_map<const Value*, double> err;  // error reaching each value (0 if unknown)
  auto err_of = [&](const Value* v) {
    auto it = err.find(v);
    return it == err.end() ? 0.0 : it->second;
  };
  for (const Node* n : engine_graph.nodes()) {
    double upstream = 0;
    for (const Value* v : n->inputs())
      if (v) upstream = std::max(upstream, err_of(v));
    for (const Value* v : n->outputs()) {
      if (!v) continue;
      auto g = got.find(v->name);
      auto r = ref.find(v->name);
      if (g == got.end() || r == ref.end() || g->second.numel() != r->second.numel()) {
        err[v] = upstream;  // not compared: passes on what reached it
        continue;
      }
      LayerError le;
      le.layer = n->name;
      le.op_type = n->domain.empty() ? n->op_type : n->domain + "." + n->op_type;
      le.tensor = v->name;
      le.onnx_nodes = n->onnx_nodes;
      KILN_ASSIGN_OR_RETURN(le.m,
                            compare_tensors(g->second, r->second, "tensor '" + v->name + "'"));
      le.upstream = upstream;
      const double e = le.m.rel_l2;
      le.jump = (std::isnan(e) || e > floor) && !(e <= 10 * upstream);
      if (le.jump && rep.first_jump < 0) rep.first_jump = static_cast<int>(rep.layers.size());
      err[v] = std::isnan(e) ? INFINITY : e;
      rep.layers.push_back(std::move(le));
    }
  }
  return rep;
}

std::string engine_precision(const Engine& e) {
  nlohmann::json o = nlohmann::json::parse(e.build_options_json(), nullptr, false);
  const std::string p = o.is_object() ? o.value("precision", "fp32") : "fp32";
  if (p == "fp32" && e.backend() == "cuda" && o.value("tf32", true)) return "tf32";
  return p;
}

double default_jump_floor(const Engine& e) {
  const std::string p = engine_precision(e);
  return p == "int8" ? 0.1 : p == "fp32" ? 1e-4 : 1e-2;
}

}  // namespace kiln
