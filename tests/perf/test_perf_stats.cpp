// kiln perf's statistics: nearest-rank percentiles and the latency summary.
#include <gtest/gtest.h>

#include <random>

#include "perf/stats.h"

namespace kiln::perf {
namespace {

TEST(PerfStats, PercentileIsTheNearestRank) {
  std::vector<int64_t> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(percentile(v, 50), 50);
  EXPECT_EQ(percentile(v, 90), 90);
  EXPECT_EQ(percentile(v, 99), 99);
  EXPECT_EQ(percentile(v, 100), 100);
  EXPECT_EQ(percentile(v, 0.5), 1);
  // Ten values: p95 is the smallest value at least 95% do not exceed, the largest one.
  const std::vector<int64_t> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(percentile(ten, 50), 5);
  EXPECT_EQ(percentile(ten, 51), 6);
  EXPECT_EQ(percentile(ten, 95), 10);
  EXPECT_EQ(percentile(ten, 90), 9);
  EXPECT_EQ(percentile({7}, 50), 7);
  EXPECT_EQ(percentile({7}, 99), 7);
}

TEST(PerfStats, SummaryOfNanoseconds) {
  std::vector<int64_t> ns = {3000, 1000, 2000};
  const LatencySummary s = summarize(ns);
  EXPECT_EQ(s.count, 3u);
  EXPECT_DOUBLE_EQ(s.min_us, 1);
  EXPECT_DOUBLE_EQ(s.max_us, 3);
  EXPECT_DOUBLE_EQ(s.avg_us, 2);
  EXPECT_DOUBLE_EQ(s.p50_us, 2);
  EXPECT_DOUBLE_EQ(s.p99_us, 3);
  EXPECT_NEAR(s.stddev_us, std::sqrt(2.0 / 3.0), 1e-12);
  std::vector<int64_t> none;
  const LatencySummary z = summarize(none);
  EXPECT_EQ(z.count, 0u);
  EXPECT_EQ(z.p99_us, 0);
}

TEST(PerfStats, PercentilesAreOrderedOnRandomLatencies) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> lat(10, 1);
  for (int n : {1, 2, 3, 17, 1000}) {
    std::vector<int64_t> ns;
    for (int i = 0; i < n; ++i) ns.push_back(static_cast<int64_t>(lat(rng)));
    const LatencySummary s = summarize(ns);
    EXPECT_LE(s.min_us, s.p50_us);
    EXPECT_LE(s.p50_us, s.p90_us);
    EXPECT_LE(s.p90_us, s.p95_us);
    EXPECT_LE(s.p95_us, s.p99_us);
    EXPECT_LE(s.p99_us, s.max_us);
    EXPECT_LE(s.min_us, s.avg_us);
    EXPECT_LE(s.avg_us, s.max_us);
  }
}

}  // namespace
}  // namespace kiln::perf
