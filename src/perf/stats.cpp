#include "perf/stats.h"

#include <algorithm>
#include <cmath>

namespace kiln::perf {

int64_t percentile(const std::vector<int64_t>& sorted, double p) {
  const double n = static_cast<double>(sorted.size());
  auto rank = static_cast<size_t>(std::ceil(p / 100.0 * n - 1e-9));
  rank = std::clamp<size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

LatencySummary summarize(std::vector<int64_t>& latencies_ns) {
  LatencySummary s;
  if (latencies_ns.empty()) return s;
  std::sort(latencies_ns.begin(), latencies_ns.end());
  s.count = latencies_ns.size();
  double sum = 0;
  for (int64_t v : latencies_ns) sum += static_cast<double>(v);
  const double mean = sum / static_cast<double>(s.count);
  double var = 0;
  for (int64_t v : latencies_ns)
    var += (static_cast<double>(v) - mean) * (static_cast<double>(v) - mean);
  var /= static_cast<double>(s.count);
  s.avg_us = mean / 1e3;
  s.stddev_us = std::sqrt(var) / 1e3;
  s.min_us = static_cast<double>(latencies_ns.front()) / 1e3;
  s.max_us = static_cast<double>(latencies_ns.back()) / 1e3;
  s.p50_us = static_cast<double>(percentile(latencies_ns, 50)) / 1e3;
  s.p90_us = static_cast<double>(percentile(latencies_ns, 90)) / 1e3;
  s.p95_us = static_cast<double>(percentile(latencies_ns, 95)) / 1e3;
  s.p99_us = static_cast<double>(percentile(latencies_ns, 99)) / 1e3;
  return s;
}

}  // namespace kiln::perf
