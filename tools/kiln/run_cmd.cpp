// kiln run: run an engine (or an ONNX model built on the fly) on given or random inputs.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

#include "cli.h"
#include "core/npy.h"
#include "inputs.h"

namespace kiln::cli {
namespace {

std::string preview(const Tensor& t) {
  std::vector<std::string> v;
  const int64_t n = std::min<int64_t>(t.numel(), 6);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype_is_float(t.dtype())) v.push_back(fmt::format("{:.6g}", t.at_double(i)));
    else v.push_back(std::to_string(t.at_int(i)));
  }
  return fmt::format("[{}{}]", fmt::join(v, ", "), t.numel() > n ? ", ..." : "");
}

}  // namespace

Runner add_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run an engine or ONNX model on inputs and show the outputs");
  struct Opts {
    std::string onnx, engine, save_dir;
    BuildFlags flags;
    InputFlags in;
    unsigned seed = 1;
    int iterations = 1, warmup = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* g = cmd->add_option_group("model", "what to run");
  g->add_option("--onnx", o->onnx, "ONNX model (built for the chosen backend before running)");
  g->add_option("--engine", o->engine, "Engine file from `kiln build`");
  g->require_option(1);
  add_input_flags(cmd, o->in);
  cmd->add_option("--save-outputs", o->save_dir, "Save each output as DIR/NAME.npy");
  // with --onnx; --shapes also sizes random inputs; the image options also serve --calib images
  add_build_flags(cmd, o->flags, /*with_dump=*/false, /*with_images=*/false);
  o->flags.images = &o->in;
  cmd->add_option("--seed", o->seed, "Seed of the random inputs (default 1)");
  cmd->add_option("--iterations", o->iterations, "Timed runs (default 1)")->check(CLI::Range(1, 1000000));
  cmd->add_option("--warmup", o->warmup, "Untimed runs first (default 0)")->check(CLI::Range(0, 1000000));
  return [o]() -> Status {
    KILN_ASSIGN_OR_RETURN(ShapeMap shapes, parse_shapes(o->flags.shapes, "--shapes"));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, engine_from_flags(o->onnx, o->engine, o->flags));
    std::mt19937 rng(o->seed);
    KILN_ASSIGN_OR_RETURN(auto inputs, load_inputs(engine->inputs(), o->in, shapes, rng,
                                                   /*images_elsewhere=*/!o->flags.calib.empty()));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> ctx, engine->create_context());
    std::vector<Tensor> outputs;
    for (int i = 0; i < o->warmup; ++i) {
      KILN_ASSIGN_OR_RETURN(outputs, ctx->execute(inputs));
    }
    std::vector<double> ms;
    for (int i = 0; i < o->iterations; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      KILN_ASSIGN_OR_RETURN(outputs, ctx->execute(inputs));
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    if (!o->save_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o->save_dir, ec);
      if (ec) return KILN_ERROR("--save-outputs: cannot create folder '{}': {}", o->save_dir, ec.message());
    }
    for (const auto& [name, t] : inputs)
      std::cout << fmt::format("input  {} {}", name, t.desc()) << "\n";
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string& name = engine->outputs()[i].name;
      std::cout << fmt::format("output {} {} {}", name, outputs[i].desc(), preview(outputs[i])) << "\n";
      if (!o->save_dir.empty())
        KILN_RETURN_IF_ERROR(write_npy(o->save_dir + "/" + safe_file_name(name) + ".npy", outputs[i]));
    }
    std::sort(ms.begin(), ms.end());
    double mean = 0;
    for (double m : ms) mean += m;
    mean /= static_cast<double>(ms.size());
    std::cout << fmt::format("time   {} backend: {:.3f} ms mean, {:.3f} ms median over {} run{}",
                             engine->backend(), mean, ms[ms.size() / 2], ms.size(),
                             ms.size() > 1 ? "s" : "")
              << "\n";
    return Status::Ok();
  };
}

}  // namespace kiln::cli
