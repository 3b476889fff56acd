// The optimizer's pass pipeline (see pipeline.cpp for the order and why).
#pragma once

#include <string>

#include "ir/graph.h"
#include "kiln/status.h"

namespace kiln {

class Backend;

struct OptimizeOptions {
  int opt_level = 2;            // 0 = nothing, 1 = folding and cleanup, 2 = also fusion
  std::string dump_dir;         // graph after each pass as text + dot ("" = off)
  bool verbose = false;         // explain passes that did not apply (stderr)
  std::string backend = "cpu";  // fusion asks this backend what it can run as one layer
  std::string precision = "fp32";
};

Status optimize_graph(Graph& g, const OptimizeOptions& options);

}  // namespace kiln
