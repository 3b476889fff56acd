// Latency statistics of a measurement: percentiles by nearest rank (the smallest latency that
// at least p% of the requests did not exceed), as perf_analyzer reports them.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::perf {

struct LatencySummary {
  uint64_t count = 0;
  double avg_us = 0, stddev_us = 0, min_us = 0, max_us = 0;
  double p50_us = 0, p90_us = 0, p95_us = 0, p99_us = 0;
};

// The nearest-rank percentile `p` (0 < p <= 100) of `sorted` (ascending, not empty).
int64_t percentile(const std::vector<int64_t>& sorted, double p);

// Summarizes latencies in nanoseconds (sorted in place); all zero when there are none.
LatencySummary summarize(std::vector<int64_t>& latencies_ns);

}  // namespace kiln::perf
