#include <gtest/gtest.h>

#include <random>

#include "backends/memory_planner.h"

namespace kiln {
namespace {

// No two tensors alive at the same step may share a byte.
void expect_valid(const std::vector<BufferRequest>& r, const MemoryPlan& p, size_t align) {
  ASSERT_EQ(p.offsets.size(), r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(p.offsets[i] % align, 0u);
    EXPECT_LE(p.offsets[i] + r[i].bytes, p.total);
    for (size_t j = i + 1; j < r.size(); ++j) {
      const bool alive_together = r[i].first <= r[j].last && r[j].first <= r[i].last;
      const bool overlap = p.offsets[i] < p.offsets[j] + r[j].bytes &&
                           p.offsets[j] < p.offsets[i] + r[i].bytes;
      EXPECT_FALSE(alive_together && overlap && r[i].bytes && r[j].bytes)
          << "tensors " << i << " and " << j << " overlap";
    }
  }
}

TEST(MemoryPlanner, ChainReusesTwoBuffers) {
  // A straight chain: each tensor is read only by the next layer, so two buffers suffice.
  std::vector<BufferRequest> r;
  for (int i = 0; i < 10; ++i) r.push_back({1000, i, i + 1});
  const MemoryPlan p = plan_memory(r, 256);
  expect_valid(r, p, 256);
  EXPECT_EQ(p.total, 2048u);
}

TEST(MemoryPlanner, ResidualKeepsSkipAlive) {
  // t0 is read at step 3 (a residual add), so it cannot share with t1 or t2.
  std::vector<BufferRequest> r = {{512, 0, 3}, {512, 1, 2}, {512, 2, 3}, {512, 3, 4}};
  const MemoryPlan p = plan_memory(r, 256);
  expect_valid(r, p, 256);
  EXPECT_EQ(p.total, 3 * 512u);
}

TEST(MemoryPlanner, RandomLifetimesNeverOverlap) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BufferRequest> r;
    const int n = 1 + static_cast<int>(rng() % 60);
    size_t sum = 0;
    for (int i = 0; i < n; ++i) {
      const int first = static_cast<int>(rng() % 40);
      r.push_back({rng() % 5000, first, first + static_cast<int>(rng() % 10)});
      sum += (r.back().bytes + 63) / 64 * 64 + 64;
    }
    const MemoryPlan p = plan_memory(r, 64);
    expect_valid(r, p, 64);
    EXPECT_LE(p.total, sum);
  }
}

}  // namespace
}  // namespace kiln
