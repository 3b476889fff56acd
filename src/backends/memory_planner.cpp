#include "backends/memory_planner.h"

#include <algorithm>
#include <numeric>

namespace kiln {

MemoryPlan plan_memory(const std::vector<BufferRequest>& requests, size_t alignment) {
  MemoryPlan plan;
  plan.offsets.assign(requests.size(), 0);
  auto round_up = [&](size_t b) { return (b + alignment - 1) / alignment * alignment; };
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return requests[a].bytes > requests[b].bytes;
  });
  struct Placed {
    size_t offset, bytes;
    int first, last;
  };
  std::vector<Placed> placed;
  for (size_t idx : order) {
    const BufferRequest& r = requests[idx];
    const size_t bytes = round_up(std::max<size_t>(r.bytes, 1));
    // Bytes already taken by tensors alive at the same time, sorted by offset.
    std::vector<const Placed*> live;
    for (const Placed& p : placed)
      if (p.first <= r.last && r.first <= p.last) live.push_back(&p);
    std::sort(live.begin(), live.end(),
              [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    size_t offset = 0;
    for (const Placed* p : live) {
      if (offset + bytes <= p->offset) break;  // fits in the gap before p
      offset = std::max(offset, p->offset + p->bytes);
    }
    placed.push_back({offset, bytes, r.first, r.last});
    plan.offsets[idx] = offset;
    plan.total = std::max(plan.total, offset + bytes);
  }
  return plan;
}

}  // namespace kiln
