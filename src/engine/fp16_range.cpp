#include "engine/fp16_range.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "quant/calibrator.h"

namespace kiln {
namespace {

Expected<quant::Feed> random_feed(const Graph& g, const Profile& profile) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  quant::Feed feed;
  for (const Value* v : g.inputs()) {
    std::vector<int64_t> shape;
    if (auto r = profile.ranges().find(v->name); r != profile.ranges().end()) {
      // The opt shapes at the smallest batch (dimension 0, as tuning_points takes it): a batch's
      // samples do not change each other's ranges, and a VAE decoder's activations at batch 8
      // are tens of GB to read back.
      shape = r->second.opt;
      if (!shape.empty() && r->second.min.size() == shape.size() && r->second.min[0] >= 1)
        shape[0] = std::min(shape[0], r->second.min[0]);
    } else if (auto s = v->type.static_shape()) shape = *s;
    else return KILN_ERROR("input '{}' has no shape to try", v->name);
    Tensor t(v->type.dtype, shape);
    if (v->type.dtype == DataType::kFloat32)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
    else
      std::memset(t.raw(), 0, t.nbytes());
    feed[v->name] = std::move(t);
  }
  return feed;
}

}  // namespace

void report_fp16_range(const Graph& g, const Profile& profile, const std::string& backend,
                       std::ostream& log) {
  std::vector<std::string> names;
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs())
      if (v && v->type.dtype == DataType::kFloat32) names.push_back(v->name);
  auto feed = random_feed(g, profile);
  auto src = backend == "cuda" ? quant::engine_activation_source(g, names)
                               : quant::cpu_activation_source(g);
  if (!feed.ok() || !src.ok()) {
    log << "fp16 range check skipped: "
        << (feed.ok() ? src.status().message() : feed.status().message()) << "\n";
    return;
  }
  std::string at;  // the shapes tried, for the log
  for (const auto& [name, t] : *feed) {
    at += fmt::format("{}{}:", at.empty() ? "" : ",", name);
    for (size_t i = 0; i < t.shape().size(); ++i) at += fmt::format("{}{}", i ? "x" : "", t.shape()[i]);
  }
  std::map<std::string, double> amax;
  const Status s = (*src)->run(*feed, [&](const std::string& name, const Tensor& t) {
    if (t.dtype() != DataType::kFloat32) return;
    double& a = amax[name];
    for (int64_t i = 0; i < t.numel(); ++i)
      if (std::isfinite(t.data<float>()[i])) a = std::max(a, double(std::fabs(t.data<float>()[i])));
  });
  if (!s.ok()) {
    log << "fp16 range check skipped: " << s.message() << "\n";
    return;
  }
  int beyond = 0;
  for (const Node* n : g.nodes())
    for (const Value* v : n->outputs()) {
      auto it = v ? amax.find(v->name) : amax.end();
      if (it == amax.end() || it->second <= kFloat16Max) continue;
      ++beyond;
      log << fmt::format("fp16 range: {} writes '{}' reaching {:.3g} on random normal inputs "
                         "({}), beyond float16's {:.0f} (stored as inf in FP16): keep it in FP32 "
                         "with --layer-precisions {}:fp32\n",
                         n->label(), v->name, it->second, at, kFloat16Max, n->name);
    }
  if (!beyond)
    log << "fp16 range: every layer's output stays within float16's range on random normal "
           "inputs (" << at << ")\n";
}

}  // namespace kiln
