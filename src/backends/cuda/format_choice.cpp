#include "format_choice.h"

#include <algorithm>

namespace kiln::gpu {

FormatChoice::FormatChoice(std::vector<FormatLayer> layers, std::vector<FormatValue> values,
                           ReformatCost cost)
    : layers_(std::move(layers)), values_(std::move(values)), cost_(std::move(cost)),
      producer_(values_.size(), {-1, -1}), readers_(values_.size()) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (size_t s = 0; s < layers_[l].outputs.size(); ++s)
      if (int v = layers_[l].outputs[s]; v >= 0) producer_[v] = {static_cast<int>(l), static_cast<int>(s)};
    for (size_t s = 0; s < layers_[l].inputs.size(); ++s)
      if (int v = layers_[l].inputs[s]; v >= 0) readers_[v].emplace_back(l, s);
  }
}

double FormatChoice::value_ms(int v, const std::vector<size_t>& pick) const {
  TensorFormat from;
  if (auto [l, s] = producer_[v]; l >= 0) from = layers_[l].out[pick[l]][s];
  else if (values_[v].fixed) from = *values_[v].fixed;
  if (from.dtype == DataType::kUndefined) return 0;
  std::vector<TensorFormat> wanted = values_[v].wanted;
  for (auto [l, s] : readers_[v]) wanted.push_back(layers_[l].in[pick[l]][s]);
  double ms = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const TensorFormat& to = wanted[i];
    if (to.dtype == DataType::kUndefined || to == from ||
        std::find(wanted.begin(), wanted.begin() + i, to) != wanted.begin() + i)
      continue;
    ms += cost_(v, from, to);
  }
  return ms;
}

double FormatChoice::local_ms(size_t l, const std::vector<size_t>& pick) const {
  const FormatLayer& L = layers_[l];
  std::vector<int> touched;
  for (int v : L.inputs) touched.push_back(v);
  for (int v : L.outputs) touched.push_back(v);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  double ms = L.time_ms[pick[l]];
  for (int v : touched)
    if (v >= 0) ms += value_ms(v, pick);
  return ms;
}

double FormatChoice::total_ms(const std::vector<size_t>& pick) const {
  double ms = 0;
  for (size_t l = 0; l < layers_.size(); ++l) ms += std::max(0.0, layers_[l].time_ms[pick[l]]);
  for (size_t v = 0; v < values_.size(); ++v) ms += value_ms(static_cast<int>(v), pick);
  return ms;
}

std::vector<FormatMove> FormatChoice::refine(std::vector<size_t>& pick, int max_sweeps) const {
  std::vector<FormatMove> moves;
  constexpr double kMinSaving = 1e-6;  // ms; ties keep the current pick
  for (int sweep = 0; sweep < max_sweeps; ++sweep) {
    bool moved = false;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const size_t was = pick[l];
      const double before = local_ms(l, pick);
      size_t best = was;
      double best_ms = before;
      for (size_t c = 0; c < layers_[l].time_ms.size(); ++c) {
        if (c == was || layers_[l].time_ms[c] < 0) continue;
        pick[l] = c;
        if (const double ms = local_ms(l, pick); ms < best_ms - kMinSaving) best = c, best_ms = ms;
      }
      pick[l] = best;
      if (best != was) {
        moves.push_back({l, was, best, before - best_ms});
        moved = true;
      }
    }
    if (!moved) break;
  }
  return moves;
}

}  // namespace kiln::gpu
