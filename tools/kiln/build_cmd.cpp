// kiln build: ONNX -> optimized engine file.
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli.h"

namespace kiln::cli {
namespace {

// The INT8 part of the build options: layers in INT8, where the scales came from, and what
// --accuracy-budget moved. On cuda, also how many of them the tuner gave an INT8 tactic (the
// others run float: no INT8 tactic takes them, or a float one was faster).
void print_int8_summary(const std::string& options_json, const std::string& backend,
                        const std::string& plan_json) {
  const auto o = nlohmann::json::parse(options_json, nullptr, false);
  if (!o.is_object() || !o.contains("int8")) return;
  const auto& q = o["int8"];
  std::cout << fmt::format("  int8   {} layers in INT8, {} conv/gemm layers in float; scales: {}{}\n",
                           q.value("int8_layers", 0), q.contains("float_layers") ? q["float_layers"].size() : 0,
                           q.value("scales", ""),
                           q.contains("algorithm") ? " (" + q["algorithm"].get<std::string>() + ")" : "");
  if (q.contains("qdq_kept_as_ops"))
    std::cout << fmt::format("  qdq    {} Q/DQ nodes kept as ops, computed in float (kiln's INT8 "
                             "is symmetric int8; the first: {})\n",
                             q["qdq_kept_as_ops"].get<size_t>(), q.value("qdq_kept_why", ""));
  if (backend == "cuda") {
    const auto plan = nlohmann::json::parse(plan_json, nullptr, false);
    int on_int8 = 0;
    if (plan.is_object() && plan.contains("layers") && plan["layers"].is_array())
      for (const auto& r : plan["layers"])
        if (r.is_object() && r.value("precision", "") == "int8") ++on_int8;
    std::cout << fmt::format("  gpu    {} of them run INT8 tactics, the rest float (no INT8 "
                             "tactic takes them, or float was faster; kiln inspect shows each)\n",
                             on_int8);
  }
  if (!o.contains("accuracy_budget")) return;
  const auto& b = o["accuracy_budget"];
  std::cout << fmt::format("  budget {} (relative L2 vs FP32 on {} held-out runs): all INT8 {:.6g}, final {:.6g}{}\n",
                           b.value("budget", 0.0), b.value("heldout_runs", 0), b.value("error_all_int8", 0.0),
                           b.value("error", 0.0), b.value("met", true) ? "" : " (NOT met)");
  if (b.contains("moved") && !b["moved"].empty()) {
    std::cout << fmt::format("  moved to {}: {}\n", b.value("moved_to", ""),
                             fmt::join(b["moved"].get<std::vector<std::string>>(), ", "));
    if (b.contains("tuned_ms"))
      std::cout << fmt::format("  speed  tuned layer time {:.4f} ms with all INT8, {:.4f} ms after\n",
                               b["tuned_ms_all_int8"].get<double>(), b["tuned_ms"].get<double>());
  }
}

// What the engine's layers may run in, and (trtexec users expect --int8 to mean INT8 with FP16
// elsewhere) what --int8 alone leaves in FP32. A model's Q/DQ nodes built without --int8 are
// float ops: the flag that makes them INT8 layers is named.
void print_precision_summary(const std::string& options_json, const std::string& backend) {
  const auto o = nlohmann::json::parse(options_json, nullptr, false);
  if (!o.is_object()) return;
  const bool int8 = o.value("precision", "") == "int8", fp16 = o.value("fp16", false);
  const bool tf32 = o.value("tf32", true) && backend == "cuda";
  const std::string fp32 = tf32 ? "FP32 (TF32 tensor cores)" : "FP32";
  std::string line;
  if (int8 && fp16)
    line = "INT8, FP16 and FP32 allowed (--best): the tuner picks per layer";
  else if (int8)
    line = fmt::format("INT8 where a layer has an INT8 kernel, {} elsewhere{}", fp32,
                       backend == "cuda" ? " (--fp16 or --best would allow FP16 there)" : "");
  else if (fp16)
    line = fmt::format("FP16 with float32 accumulation, {} where no FP16 kernel takes a layer", fp32);
  else
    line = fp32;
  std::cout << "  precision " << line << "\n";
  if (const size_t q = o.value("qdq_nodes_as_float", size_t(0)))
    std::cout << fmt::format("  note   the model's {} QuantizeLinear/DequantizeLinear nodes run as "
                             "float ops: build with --int8 (or --best) to make them INT8 layers\n",
                             q);
  if (const size_t h = o.value("float16_products", size_t(0)))
    std::cout << fmt::format("  note   {} of the model's matrix products and convolutions compute in "
                             "float16 as exported, and kiln fuses float32 models only (epilogues, "
                             "attention, LayerNorm): export in float32 and build with --fp16 "
                             "(--input-io-formats/--output-io-formats fp16 for float16 tensors at "
                             "the edges)\n",
                             h);
}

}  // namespace

Runner add_build_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("build", "Build an engine file from an ONNX model");
  struct Opts {
    std::string onnx, engine;
    BuildFlags flags;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--onnx", o->onnx, "ONNX model to build")->required();
  cmd->add_option("--save-engine", o->engine, "Where to write the engine (.kiln)")->required();
  add_build_flags(cmd, o->flags, /*with_dump=*/true);
  return [o]() -> Status {
    KILN_ASSIGN_OR_RETURN(BuildConfig c, to_build_config(o->flags));
    const auto t0 = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::build_from_onnx(o->onnx, c));
    KILN_RETURN_IF_ERROR(e->save(o->engine));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << fmt::format("built {} ({} backend, target {}) in {:.2f} s", o->engine,
                             e->backend(), e->target(), s)
              << "\n";
    for (const auto& i : e->inputs()) std::cout << "  input  " << i.str() << "\n";
    for (const auto& i : e->outputs()) std::cout << "  output " << i.str() << "\n";
    print_precision_summary(e->build_options_json(), e->backend());
    print_int8_summary(e->build_options_json(), e->backend(), e->backend_plan_json());
    return Status::Ok();
  };
}

}  // namespace kiln::cli
