// The optimizer's pass pipeline (see pipeline.cpp for the order and why).
#pragma once

#include <string>
#include <vector>

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
  std::vector<std::string> only_passes;  // tests: run just these passes (empty = by level)
};

Status optimize_graph(Graph& g, const OptimizeOptions& options);

// The INT8 stage (pipeline.cpp's kInt8Pipeline: fuse_conv_pair, eliminate_dead_code), run on
// an optimized graph after quant::quantize_for_build has marked its INT8 layers, with
// precision "int8" (the capability query's). Runs at opt level 2 (or the passes only_passes
// names); re-infers and verifies like optimize_graph; --dump-graph steps continue the
// numbering in dump_dir and end with NN_int8_final.
Status optimize_int8_graph(Graph& g, const OptimizeOptions& options);

// The pipeline's pass names in order for an opt level (for docs, tests and --verbose).
std::vector<std::string> pipeline_passes(int opt_level);
// The same for the INT8 stage.
std::vector<std::string> int8_pipeline_passes(int opt_level);

// Runs one pass by name once (tests; either list's); returns whether it changed the graph.
Expected<bool> run_pass(Graph& g, const std::string& pass, const OptimizeOptions& options);

}  // namespace kiln
