// The cuda backend's two entry points (backends/backend.h): build a plan, load an engine state.
#include <iostream>

#include "backends/backend.h"
#include "dynamic.h"
#include "executor.h"
#include "lower.h"
#include "memory_check.h"
#include "rtc.h"

namespace kiln::gpu {

Expected<nlohmann::json> build_cuda_plan(Graph& g, const BuildConfig& c, const Profile& profile) {
  GpuBuildOptions o;
  o.fp16 = c.fp16;
  o.tf32 = c.tf32;
  o.layer_precisions = c.layer_precisions;
  o.layout = c.layout;
  o.timing_cache = c.timing_cache;
  if (c.workspace_limit) o.workspace_limit = c.workspace_limit;
  o.tune = c.tune;
  o.force_tactic = c.force_tactic;
  if (c.gpu_memory_total) o.gpu_memory = GpuMemory{c.gpu_memory_free, c.gpu_memory_total};
  o.log = c.verbose ? &std::cerr : nullptr;
  std::vector<std::vector<int64_t>> opt, min;
  for (const Value* v : g.inputs()) {
    auto r = profile.ranges().find(v->name);
    if (r != profile.ranges().end()) {
      opt.push_back(r->second.opt);
      min.push_back(r->second.min);
    } else if (auto s = v->type.static_shape()) {
      opt.push_back(*s);
      min.push_back(*s);
    } else {
      return KILN_ERROR("input '{}' ({}) has dynamic dimensions: give --shapes or "
                        "--min/--opt/--max-shapes for the cuda backend", v->name, v->type.str());
    }
  }
  // A profile reaching below its opt batch is tuned at its minimum batch too (lower.h).
  o.extra_points = tuning_points(min, opt);
  Expected<Plan> plan = lower_for_gpu(g, opt, o);
  // Whatever ran out of memory (the CUDA context, a stream, a library handle, a tactic), the
  // error says out of GPU memory first, with what the GPU has.
  if (!plan.ok() && is_out_of_memory(plan.status().message()) &&
      plan.status().message().rfind("out of GPU memory", 0) != 0 &&
      plan.status().message().find(": out of GPU memory") == std::string::npos) {
    const std::optional<GpuMemory> m = query_gpu_memory();
    return KILN_ERROR("out of GPU memory{}: {}",
                      m ? fmt::format(" ({:.0f} MiB free of {:.0f} MiB; other processes may hold "
                                      "the rest)", m->free / 1048576.0, m->total / 1048576.0)
                        : "",
                      plan.status().message());
  }
  if (!plan.ok()) return plan.status();
  nlohmann::json j = plan_to_json(*plan, g);
  if (j.value("dynamic_region", false)) {  // kiln inspect: which layers the prefix's graph holds
    const std::vector<bool> prefix = prefix_layers(g, *plan);
    size_t count = 0;
    for (size_t k = 0; k < prefix.size(); ++k)
      if (prefix[k]) j["layers"][k]["prefix"] = true, ++count;
    j["prefix_layers"] = count;
  }
  KILN_ASSIGN_OR_RETURN(nlohmann::json kernels, rtc::export_cubins(generated_kernels(*plan)));
  if (!kernels.empty()) j["kernels"] = std::move(kernels);
  return j;
}

Expected<std::shared_ptr<BackendEngine>> load_cuda_engine(const Graph& g, const nlohmann::json& j,
                                                          const Profile& profile) {
  KILN_ASSIGN_OR_RETURN(Plan plan, plan_from_json(g, j));
  return std::shared_ptr<BackendEngine>(std::make_shared<CudaEngineState>(g, std::move(plan), profile));
}

}  // namespace kiln::gpu
