// Calibration input and output: .npy folders as calibration data, and the calibration cache
// (a text file: docs/quantization.md describes it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "ir/graph.h"
#include "kiln/engine.h"
#include "kiln/status.h"
#include "quant/calibrator.h"

namespace kiln::quant {

// Calibration batches from folders of .npy files, one folder per graph input (`dirs`: input
// name -> folder; the name "" stands for the graph's only input). Files are taken in name
// order; file i of every folder makes batch i. A file holds one batch (the input's rank) or
// one sample (rank - 1; a batch dimension of 1 is added). Its element type and every
// non-batch dimension must match the input's. At most `max_batches` batches (0: all).
// Files that do not hold whole batches of a fixed-batch engine are one stream of samples cut
// into batches of its size. A folder of images (JPEG/PNG/..., also in class subfolders, taken
// in path order) gives one sample per image, preprocessed by `images` as `kiln run` does an
// image input (channels and size from the input), batched as the input's fixed batch, else one
// image per batch.
Expected<std::unique_ptr<CalibData>> open_npy_calib_data(
    const std::map<std::string, std::string>& dirs, const Graph& g, size_t max_batches,
    const BuildConfig::CalibImages& images = {});

struct CalibCache {
  std::string algorithm;                // entropy | minmax | percentile
  std::string kiln_version;             // of the kiln that wrote it (informational)
  uint64_t fingerprint = 0;             // graph_fingerprint() of the model it was made for
  std::map<std::string, float> scales;  // tensor name -> scale
};

// XXH64 over the optimized FP32 graph's structure (inputs, outputs, nodes with their op,
// attributes and value names) and weights (type, shape and bytes of every constant). Value
// shapes are left out, so one cache serves engines built for other batch sizes.
uint64_t graph_fingerprint(const Graph& g);

Status write_calib_cache(const std::string& path, const CalibCache& c);
Expected<CalibCache> read_calib_cache(const std::string& path);

// Whether cache `c` (read from `path`) fits this model: same fingerprint, the requested
// algorithm ("" accepts any) and a scale for every tensor in `needed`. The error names the
// first difference.
Status check_calib_cache(const CalibCache& c, const std::string& path, uint64_t fingerprint,
                         const std::string& algorithm, const std::vector<std::string>& needed);

}  // namespace kiln::quant
