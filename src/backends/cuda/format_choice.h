// The format choice: after the tuner has timed every layer's candidates, pick one candidate per
// layer so that layer times plus the reformats between neighbours' formats are small. A greedy
// pick in node order cannot do this: the first INT8 layer of a chain pays the quantizing reformat
// and loses to FP16, and so does every layer after it. Local search can: starting from each
// layer's fastest candidate, move one layer at a time to the candidate with the least time plus
// the reformats at its inputs and outputs (its neighbours' formats fixed), until no move saves
// time. Every move lowers the total, so the search ends. Host code, no GPU: tested with made-up
// times.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "layer.h"

namespace kiln::gpu {

// One layer's candidates, as the format choice sees them.
struct FormatLayer {
  std::vector<double> time_ms;                     // per candidate; < 0: failed, never picked
  std::vector<std::vector<TensorFormat>> in, out;  // per candidate, per slot (kUndefined: none)
  std::vector<int> inputs, outputs;                // value id per slot; -1: not a device value
};

// A device value without a producer layer (a graph input) has a fixed format; graph outputs
// leave in `wanted` (their declared type, row-major).
struct FormatValue {
  std::optional<TensorFormat> fixed;
  std::vector<TensorFormat> wanted;
};

// ms of a reformat of value `id` between two formats.
using ReformatCost = std::function<double(int id, const TensorFormat& from, const TensorFormat& to)>;

struct FormatMove {
  size_t layer = 0, from = 0, to = 0;
  double saved_ms = 0;  // layer time plus reformats, before minus after
};

class FormatChoice {
 public:
  FormatChoice(std::vector<FormatLayer> layers, std::vector<FormatValue> values, ReformatCost cost);
  // Layer times plus reformats of a pick (one candidate index per layer).
  double total_ms(const std::vector<size_t>& pick) const;
  // Improves `pick` in place (at most `max_sweeps` passes over the layers); returns the moves.
  std::vector<FormatMove> refine(std::vector<size_t>& pick, int max_sweeps = 16) const;

 private:
  // The reformats value `v` needs under `pick`: from its producer's format to each other format
  // its consumers want (one reformat per format, shared by the consumers that want it).
  double value_ms(int v, const std::vector<size_t>& pick) const;
  // Layer `l`'s time plus the reformats of the values it reads and writes.
  double local_ms(size_t l, const std::vector<size_t>& pick) const;
  std::vector<FormatLayer> layers_;
  std::vector<FormatValue> values_;
  ReformatCost cost_;
  std::vector<std::pair<int, int>> producer_;                   // per value: layer, slot (-1: none)
  std::vector<std::vector<std::pair<size_t, size_t>>> readers_;  // per value: layer, slot
};

}  // namespace kiln::gpu
