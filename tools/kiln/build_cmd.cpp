// kiln build: ONNX -> optimized engine file.
#include <chrono>
#include <iostream>

#include "cli.h"

namespace kiln::cli {

Runner add_build_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("build", "Build an engine file from an ONNX model");
  struct Opts {
    std::string onnx, engine, backend, shapes, min_shapes, opt_shapes, max_shapes, dump;
    bool fp16 = false, int8 = false, verbose = false;
    int opt_level = 2;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--onnx", o->onnx, "ONNX model to build")->required();
  cmd->add_option("--save-engine", o->engine, "Where to write the engine (.kiln)")->required();
  cmd->add_option("--backend", o->backend, "cpu or cuda (default: cuda if a GPU is usable, else cpu)");
  cmd->add_flag("--fp16", o->fp16, "Allow FP16 kernels");
  cmd->add_flag("--int8", o->int8, "Allow INT8 kernels");
  cmd->add_option("--opt-level", o->opt_level, "0 = import as is, 1 = fold and clean up, 2 = also fuse (default 2)");
  cmd->add_option("--shapes", o->shapes, "Fixed input shapes: name:1x3x224x224,...");
  cmd->add_option("--min-shapes", o->min_shapes, "Profile minimum shapes: name:1x3x224x224,...");
  cmd->add_option("--opt-shapes", o->opt_shapes, "Profile optimum shapes");
  cmd->add_option("--max-shapes", o->max_shapes, "Profile maximum shapes");
  cmd->add_option("--dump-graph", o->dump, "Write the graph after each pass (text + dot) to this folder");
  cmd->add_flag("--verbose", o->verbose, "Explain optimizer decisions");
  return [o]() -> Status {
    BuildConfig c;
    c.backend = o->backend;
    c.fp16 = o->fp16;
    c.int8 = o->int8;
    c.opt_level = o->opt_level;
    c.dump_graph_dir = o->dump;
    c.verbose = o->verbose;
    KILN_ASSIGN_OR_RETURN(c.shapes, parse_shapes(o->shapes, "--shapes"));
    KILN_ASSIGN_OR_RETURN(c.min_shapes, parse_shapes(o->min_shapes, "--min-shapes"));
    KILN_ASSIGN_OR_RETURN(c.opt_shapes, parse_shapes(o->opt_shapes, "--opt-shapes"));
    KILN_ASSIGN_OR_RETURN(c.max_shapes, parse_shapes(o->max_shapes, "--max-shapes"));
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
