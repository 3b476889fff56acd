// Shared pieces of the kiln command-line tool.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "inputs.h"
#include "kiln/engine.h"
#include "kiln/status.h"

namespace kiln::cli {

// Parses "name:1x3x224x224,other:4x8" into a ShapeMap. Names may contain ':' (the last ':'
// separates the dims).
// The non-empty items of a comma-separated flag value ("a,,b" -> a, b).
std::vector<std::string> split_list(const std::string& s);
// Characters other than letters, digits, '.', '_' and '-' as '_' (DIR/NAME.npy).
std::string safe_file_name(const std::string& name);
Expected<ShapeMap> parse_shapes(const std::string& spec, const std::string& flag);

// The build options `build`, `run --onnx` and `bench --onnx` share (trtexec's names).
struct BuildFlags {
  std::string backend, shapes, min_shapes, opt_shapes, max_shapes, dump, layer_precisions;
  std::string timing_cache, mem_pool, layout = "auto";
  std::string input_io_formats, output_io_formats;
  bool fp16 = false, int8 = false, best = false, no_tf32 = false, verbose = false;
  int opt_level = 2;
  // INT8 (docs/quantization.md)
  std::vector<std::string> calib;  // DIR, or NAME=DIR per input (repeat or comma-separate)
  std::string calib_algo, calib_cache;
  size_t calib_batches = 0;
  double accuracy_budget = 0;
  CLI::Option* opt_level_flag = nullptr;
  // Preprocessing of calibration images: the command's own image options (kiln run's, which
  // also serve its image inputs), or these, registered by add_build_flags(with_images).
  InputFlags own_images;
  const InputFlags* images = nullptr;
};
// with_images: also register --resize/--mean/--std/--image-layout (for calibration images);
// a command that has them already (kiln run) sets BuildFlags::images to its own.
void add_build_flags(CLI::App* cmd, BuildFlags& f, bool with_dump, bool with_images = true);
Expected<BuildConfig> to_build_config(const BuildFlags& f);
// --calib specs (DIR, or NAME=DIR per input; repeated or comma-separated) as input -> folder.
Expected<std::map<std::string, std::string>> parse_calib(const std::vector<std::string>& specs);
// `--onnx M` builds with the flags; `--engine E` loads (build flags are then an error).
Expected<std::unique_ptr<Engine>> engine_from_flags(const std::string& onnx,
                                                    const std::string& engine,
                                                    const BuildFlags& f);

// Prints build progress (calibration, accuracy search) on stderr when it is a terminal; a line
// of per-batch progress overwrites the previous one.
void print_progress(const std::string& line);

// Each subcommand registers its options on `app` and returns the function that runs it.
using Runner = std::function<Status()>;
Runner add_build_command(CLI::App& app);
Runner add_run_command(CLI::App& app);
Runner add_inspect_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_compare_command(CLI::App& app);
Runner add_report_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_perf_command(CLI::App& app);

}  // namespace kiln::cli
