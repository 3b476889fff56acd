// Optimization profiles: the range of input shapes an engine accepts.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

class Profile {
 public:
  struct Range {
    std::vector<int64_t> min, opt, max;
  };
  // Validates --shapes / --min/opt/max-shapes against the graph inputs.
  static Expected<Profile> from_config(const Graph& g, const BuildConfig& config);
  static Expected<Profile> from_json(const Graph& g, const std::string& options_json);
  // Every input dim whose profile has min == max becomes static, and so does every other dim
  // of the same symbol (a dynamic batch with a fixed image size: a UNet's height and width), so
  // that shape-dependent subgraphs fold and the passes see static sizes where the profile
  // allows only one.
  Status apply_static_shapes(Graph& g) const;
  // Checks a runtime input shape against the profile (inputs without a profile: any shape the
  // graph's declared dims allow).
  Status check(const std::string& input, const std::vector<int64_t>& shape) const;
  nlohmann::json to_json() const;
  const std::map<std::string, Range>& ranges() const { return ranges_; }

 private:
  std::map<std::string, Range> ranges_;
};

}  // namespace kiln
