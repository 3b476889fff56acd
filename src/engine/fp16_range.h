// FP16 builds and values beyond float16's range (issue 7: "FP16 never silently overflows").
#pragma once

#include <ostream>

#include "core/half_range.h"
#include "engine/profile.h"
#include "ir/graph.h"
#include "kiln/engine.h"

namespace kiln {

// With --fp16 --verbose: runs the optimized FP32 graph once on random normal inputs at the
// profile's opt shapes, dimension 0 (the batch) at its minimum (integer inputs zero), and names
// every layer whose output reaches beyond float16's range, with the flag that keeps it in FP32.
// A layer kept in FP16 stores such outputs as ±inf (kiln clamps constants, not activations):
// docs/architecture.md, "FP16". Data-free, so it is a warning about this network's typical ranges,
// not a guarantee for every input. Failures of the check itself are reported on `log` and never
// fail the build.
void report_fp16_range(const Graph& g, const Profile& profile, const std::string& backend,
                       std::ostream& log);

}  // namespace kiln
