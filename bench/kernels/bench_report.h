// Results of kiln_conv_bench: per-tactic lines (stdout + optional CSV), per-layer best-tactic
// tables and the network-level prediction (count-weighted conv sum + pooling/FC estimate).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/conv_kernels.h"
#include "resnet50_convs.h"

namespace kiln::bench {

struct TacticResult {
  std::string name, family, error, note;
  double init_ms = 0, median_us = 0, host_us = 0;
  cuda::CheckResult check;
  bool correct = false;
  bool pruned = false;  // screened (3 runs) at over 3x the best: not timed in full, never best
};

struct LayerResult {
  const ResNetConv* layer = nullptr;
  int batch = 0;
  cuda::Precision precision = cuda::Precision::kFP16;
  cuda::ConvProblem problem;
  std::vector<TacticResult> tactics;
  const TacticResult* best() const;  // fastest correct one, or null
  const TacticResult* best_of(const std::string& family) const;
};

// Dense tensor-core peaks of the H100 SXM used for "% of peak" (TFLOP/s; TOPS for INT8).
double peak_tflops(cuda::Precision p);

class Report {
 public:
  explicit Report(const std::string& csv_path);
  ~Report();
  void note(const ResNetConv& l, int batch, cuda::Precision p, const std::string& text);
  void add(LayerResult r);
  void print_last() const;
  void print_summary(const std::vector<int>& batches,
                     const std::vector<cuda::Precision>& precisions) const;

 private:
  const LayerResult* find(const ResNetConv& l, int batch, cuda::Precision p) const;
  // Count-weighted sum of the best times. fallback: FP16 where p has no correct tactic;
  // best_of_both: per layer the faster of p and FP16 (what a mixed-precision build would pick).
  double network_conv_us(int batch, cuda::Precision p, bool fallback, bool best_of_both,
                         int* missing) const;
  std::vector<LayerResult> results_;
  std::FILE* csv_ = nullptr;
};

// Fewest bytes a layer must move: input, weights and output once (+ residual), per precision.
double roofline_bytes(const cuda::ConvProblem& p);

// Pooling (max 3x3/2 after conv1, global average) and the FC layer, estimated from their bytes at
// 3.0 TB/s plus a fixed 2.5 us per kernel (see docs/kernel-study.md).
double pool_fc_estimate_us(int batch, cuda::Precision p);

}  // namespace kiln::bench
