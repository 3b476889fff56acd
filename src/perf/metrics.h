// The server's own view of a measurement: kiln serve's Prometheus counters (/metrics) for one
// model, read before and after a level; their difference splits a request's time into queue
// and compute and says which batches the dynamic batcher formed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::perf {

struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// The samples of Prometheus' text format (comments and blank lines skipped); an error naming
// the first line that is not a sample.
Expected<std::vector<MetricSample>> parse_prometheus(const std::string& text);

// kiln serve's counters of one model (every version, or `version` alone when it is not "").
struct ServerCounters {
  double requests = 0, inferences = 0, samples = 0, padded_samples = 0;
  double failed = 0, rejected = 0;
  double queue_us = 0, compute_us = 0, request_us = 0;  // summed microseconds
  std::map<int64_t, double> batches;                    // batch size run (padded) -> inferences
  bool found = false;                                   // the model has counters at all
};

ServerCounters model_counters(const std::vector<MetricSample>& samples, const std::string& model,
                              const std::string& version);

// after - before, field by field.
ServerCounters delta(const ServerCounters& after, const ServerCounters& before);

}  // namespace kiln::perf
