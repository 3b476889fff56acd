// Lowers ONNX models for the cuda backend without running anything on a GPU: the build step of
// `kiln build --backend cuda` (import, optimize for cuda, choose a tactic and formats for every
// layer, place reformats) with tuning off, so it needs no GPU. Prints one line per model:
//   ok<TAB>MODEL                 every layer has a GPU tactic
//   fail<TAB>MODEL<TAB>ERROR      the one-line build error a GPU build would give
// scripts/gpu_lower_check.py runs it over the conformance tests the CPU backend passes, so a test
// that would fail to build on the GPU is caught on any machine (CI has no GPU). It says nothing
// about the numbers a GPU computes: that is the GPU conformance run's job.
//
//   kiln_lower_check [--no-tf32] [--fp16] [--opt-level N] [--shapes S | --min-shapes S
//                    --opt-shapes S --max-shapes S] [--gpu-memory FREE,TOTAL] [--print] [--verbose]
//                    MODEL.onnx...
// S as kiln build takes it (input_ids:1x128,attention_mask:1x128); --print lists each layer's
// op, tactic, precision and formats (untuned: the first candidate), and the count of kernel
// layers.
// --gpu-memory (MiB) checks the build's memory against a GPU with that much free and in all
// (without it, against the GPU here, if any).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/layer.h"
#include "engine/profile.h"
#include "kiln/engine.h"
#include "onnx/importer.h"
#include "passes/pipeline.h"

namespace {

bool print_plan = false;

// "name:1x3x224x224,other:4" as a ShapeMap.
bool parse(const char* spec, kiln::ShapeMap* out) {
  std::string s = spec;
  size_t start = 0;
  while (start < s.size()) {
    const size_t end = s.find(',', start);
    const std::string item = s.substr(start, end == std::string::npos ? end : end - start);
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos) return false;
    std::vector<int64_t> dims;
    for (size_t p = colon + 1; p < item.size();) {
      const size_t x = item.find('x', p);
      dims.push_back(std::atoll(item.substr(p, x == std::string::npos ? x : x - p).c_str()));
      p = x == std::string::npos ? item.size() : x + 1;
    }
    (*out)[item.substr(0, colon)] = dims;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return true;
}

kiln::Status lower(const std::string& path, const kiln::BuildConfig& c) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::Graph> g, kiln::import_onnx_file(path));
  KILN_ASSIGN_OR_RETURN(kiln::Profile profile, kiln::Profile::from_config(*g, c));
  KILN_RETURN_IF_ERROR(profile.apply_static_shapes(*g));
  kiln::OptimizeOptions opt;
  opt.opt_level = c.opt_level;
  opt.backend = "cuda";
  opt.precision = c.fp16 ? "fp16" : "fp32";
  opt.verbose = c.verbose;
  KILN_RETURN_IF_ERROR(kiln::optimize_graph(*g, opt));
  KILN_ASSIGN_OR_RETURN(nlohmann::json plan, kiln::gpu::build_cuda_plan(*g, c, profile));
  if (!plan.is_object() && !plan.is_array()) return kiln::Status::Error("empty plan");
  if (print_plan && plan.contains("layers")) {
    const auto& nodes = g->nodes();
    for (size_t k = 0; k < nodes.size() && k < plan["layers"].size(); ++k) {
      const auto& l = plan["layers"][k];
      const std::string tactic = l.value("tactic", "");
      const kiln::gpu::TacticDef* t = kiln::gpu::find_tactic(tactic);
      // What the layer costs at run time: a kernel, nothing (an alias of its input), or host work.
      const char* kind = tactic == "host" ? "host" : t && t->alias_input >= 0 ? "alias" : "kernel";
      const std::string op =
          (nodes[k]->domain.empty() ? "" : nodes[k]->domain + ".") + nodes[k]->op_type;
      // Then its formats, inputs -> outputs (float16/nhwc; host: read on the host).
      auto formats = [&](const char* key) {
        std::string f;
        if (l.contains(key))
          for (const auto& v : l[key]) f += (f.empty() ? "" : ",") + v.get<std::string>();
        return f;
      };
      std::printf("  %-6s %-28s %-32s %-5s %s -> %s\n", kind, op.c_str(), tactic.c_str(),
                  l.value("precision", "").c_str(), formats("in").c_str(), formats("out").c_str());
    }
  }
  return kiln::Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  kiln::BuildConfig c;
  c.backend = "cuda";
  c.tune = false;  // no GPU: each layer takes its first supported tactic
  std::vector<std::string> models;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-tf32")) {
      c.tf32 = false;
    } else if (!std::strcmp(argv[i], "--fp16")) {
      c.fp16 = true;
    } else if (!std::strcmp(argv[i], "--opt-level") && i + 1 < argc) {
      c.opt_level = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--gpu-memory") && i + 1 < argc) {
      // FREE,TOTAL in MiB: the build's memory check against a GPU that has this much.
      unsigned long long free_mib = 0, total_mib = 0;
      if (std::sscanf(argv[++i], "%llu,%llu", &free_mib, &total_mib) != 2 || total_mib == 0) {
        std::fprintf(stderr, "kiln_lower_check: --gpu-memory takes FREE,TOTAL in MiB\n");
        return 1;
      }
      c.gpu_memory_free = static_cast<size_t>(free_mib) << 20;
      c.gpu_memory_total = static_cast<size_t>(total_mib) << 20;
    } else if (!std::strcmp(argv[i], "--print")) {
      print_plan = true;
    } else if (!std::strcmp(argv[i], "--verbose")) {
      c.verbose = true;  // the optimizer's and the tactics' explanations, on stderr
    } else if ((!std::strcmp(argv[i], "--shapes") || !std::strcmp(argv[i], "--min-shapes") ||
                !std::strcmp(argv[i], "--opt-shapes") || !std::strcmp(argv[i], "--max-shapes")) &&
               i + 1 < argc) {
      kiln::ShapeMap* m = !std::strcmp(argv[i], "--shapes")       ? &c.shapes
                          : !std::strcmp(argv[i], "--min-shapes") ? &c.min_shapes
                          : !std::strcmp(argv[i], "--opt-shapes") ? &c.opt_shapes
                                                                  : &c.max_shapes;
      if (!parse(argv[++i], m)) {
        std::fprintf(stderr, "kiln_lower_check: bad shapes '%s'\n", argv[i]);
        return 1;
      }
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "kiln_lower_check: unknown option '%s'\n", argv[i]);
      return 1;
    } else {
      models.emplace_back(argv[i]);
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "usage: kiln_lower_check [--no-tf32] [--fp16] [--opt-level N] MODEL.onnx...\n");
    return 1;
  }
  for (const std::string& m : models) {
    const kiln::Status s = lower(m, c);
    if (s.ok()) {
      std::printf("ok\t%s\n", m.c_str());
    } else {
      std::string msg = s.message();
      for (char& ch : msg)
        if (ch == '\n' || ch == '\t') ch = ' ';
      std::printf("fail\t%s\t%s\n", m.c_str(), msg.c_str());
    }
  }
  return 0;
}
