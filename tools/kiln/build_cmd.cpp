// kiln build: ONNX -> optimized engine file.
#include <chrono>
#include <iostream>

#include "cli.h"

namespace kiln::cli {

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
    return Status::Ok();
  };
}

}  // namespace kiln::cli
