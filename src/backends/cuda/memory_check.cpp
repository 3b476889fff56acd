#include "memory_check.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <unordered_set>

namespace kiln::gpu {

std::optional<GpuMemory> query_gpu_memory(bool* no_room) {
  GpuMemory m;
  const cudaError_t e = cudaMemGetInfo(&m.free, &m.total);
  if (no_room) *no_room = e == cudaErrorMemoryAllocation;
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return m;
}

BuildMemoryEstimate estimate_build_memory(const Graph& g, const std::vector<bool>& host_nodes,
                                          const ShapeResult& shapes, size_t min_float_bytes) {
  auto bytes = [&](const Value* v) -> size_t {
    auto s = shapes.shapes.find(v);
    if (s == shapes.shapes.end()) return 0;
    size_t n = 1;
    for (int64_t d : s->second) n *= static_cast<size_t>(std::max<int64_t>(d, 0));
    size_t e = dtype_size(v->type.dtype);
    const bool io = g.is_graph_input(v) || g.is_graph_output(v);  // in their declared type
    if (!io && (v->type.dtype == DataType::kFloat32 || v->type.dtype == DataType::kFloat16))
      e = std::min(e, v->quant_scales.empty() ? min_float_bytes : size_t(1));  // INT8 storage
    return n * e;
  };
  BuildMemoryEstimate est;
  std::unordered_set<const Value*> weights;
  const std::vector<Node*> nodes = g.nodes();
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (k < host_nodes.size() && host_nodes[k]) continue;
    const Node* n = nodes[k];
    std::unordered_set<const Value*> seen;
    size_t layer = 0;
    for (const Value* v : n->inputs()) {
      if (!v || !seen.insert(v).second) continue;
      if (v->is_constant()) {
        if (weights.insert(v).second) est.weight_bytes += bytes(v);
      } else if (!shapes.host.count(v)) {
        layer += bytes(v);
      }
    }
    for (const Value* v : n->outputs())
      if (v && seen.insert(v).second) layer += bytes(v);
    if (layer > est.layer_bytes) {
      est.layer_bytes = layer;
      est.layer = n->label();
    }
  }
  return est;
}

Status check_build_memory(const BuildMemoryEstimate& need, const GpuMemory& m,
                          const std::string& shapes_text) {
  if (need.total() <= m.free) return Status::Ok();
  auto size = [](size_t b) {
    if (b >= (size_t(1) << 30)) return fmt::format("{:.2f} GiB", b / 1073741824.0);
    if (b >= (size_t(1) << 20)) return fmt::format("{:.1f} MiB", b / 1048576.0);
    return fmt::format("{:.0f} KiB", b / 1024.0);
  };
  // Another process holds most of the GPU: say so, as the shapes may be fine on an idle one.
  const bool crowded = m.total > 0 && m.free < m.total / 2 && need.total() <= m.total;
  return KILN_ERROR(
      "out of GPU memory: building at {} needs at least {} ({} of weights and {} of inputs and "
      "outputs for {}), but the GPU has {} free of {}{}",
      shapes_text, size(need.total()), size(need.weight_bytes), size(need.layer_bytes),
      need.layer, size(m.free), size(m.total),
      crowded ? " (other processes hold the rest)"
              : "; build with smaller --shapes or --max-shapes");
}

bool is_out_of_memory(const std::string& message) {
  std::string s = message;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s.find("out of memory") != std::string::npos ||
         s.find("out of gpu memory") != std::string::npos ||
         s.find("alloc_failed") != std::string::npos ||
         s.find("allocation failed") != std::string::npos;
}

}  // namespace kiln::gpu
