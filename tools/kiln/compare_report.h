// kiln compare's results: what is kept per engine, the printed tables, the JSON record
// (schema in docs/report.md) and the --tolerance check.
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "compare/compare.h"
#include "kiln/engine.h"

namespace kiln::cli {

struct CompareEngine {
  std::string label, file, precision;  // file: "" when built on the fly
  std::unique_ptr<Engine> engine;
  std::vector<std::pair<std::string, TensorMetrics>> outputs = {};
  PerLayerReport per_layer = {};
  nlohmann::json dataset = nullptr;  // {path, samples, top1, top5} with --dataset
};

void print_compare(std::ostream& os, const std::string& model,
                   const std::map<std::string, Tensor>& inputs,
                   const std::vector<CompareEngine>& engines, bool per_layer);
nlohmann::json compare_json(const std::string& model, const std::map<std::string, Tensor>& inputs,
                            const std::vector<CompareEngine>& engines, bool per_layer,
                            double tolerance);
// An error naming the worst output when any output's relative L2 error exceeds `tolerance`
// (< 0: no check).
Status tolerance_check(const std::vector<CompareEngine>& engines, double tolerance);

}  // namespace kiln::cli
