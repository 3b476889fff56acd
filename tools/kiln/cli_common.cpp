#include "cli.h"

#include <unistd.h>

#include <cctype>
#include <iostream>

namespace kiln::cli {

// A tensor name as a file name: characters other than letters, digits, '.', '_' and '-'
// become '_' (outputs saved as DIR/NAME.npy).
std::string safe_file_name(const std::string& name) {
  std::string s = name;
  for (char& ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')) ch = '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

Expected<ShapeMap> parse_shapes(const std::string& spec, const std::string& flag) {
  ShapeMap out;
  for (const std::string& item : split_list(spec)) {
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return KILN_ERROR("{}: '{}' must look like name:1x3x224x224", flag, item);
    const std::string name = item.substr(0, colon);
    const std::string dims = item.substr(colon + 1);
    std::vector<int64_t> shape;
    if (!dims.empty() && dims != "scalar") {
      size_t p = 0;
      while (p <= dims.size()) {
        size_t x = dims.find('x', p);
        if (x == std::string::npos) x = dims.size();
        const std::string d = dims.substr(p, x - p);
        if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || d.size() > 12)
          return KILN_ERROR("{}: '{}' has a bad dimension '{}'", flag, item, d);
        shape.push_back(std::stoll(d));
        p = x + 1;
        if (x == dims.size()) break;
      }
    }
    if (out.count(name)) return KILN_ERROR("{}: input '{}' given twice", flag, name);
    out[name] = shape;
  }
  return out;
}

void add_build_flags(CLI::App* cmd, BuildFlags& f, bool with_dump, bool with_images) {
  cmd->add_option("--backend", f.backend, "cpu or cuda (default: cuda if a GPU is usable, else cpu)");
  cmd->add_flag("--fp16", f.fp16, "Allow FP16 storage and tensor cores (float32 accumulation)");
  cmd->add_flag("--int8", f.int8,
                "Allow INT8 kernels (calibrated: --calib or --calib-cache; or the model's Q/DQ "
                "nodes). Layers without an INT8 kernel stay FP32/TF32: add --fp16, or use "
                "--best, to let them run FP16");
  cmd->add_flag("--best", f.best,
                "Allow every precision (--fp16 --int8, trtexec's --best): the tuner picks the "
                "fastest per layer");
  cmd->add_flag("--no-tf32", f.no_tf32, "Strict FP32: no TF32 tensor cores for FP32 layers");
  cmd->add_option("--layer-precisions", f.layer_precisions,
                  "Pin layers: NAME:fp32,NAME:fp16,NAME:int8 (layer names as `kiln inspect` shows "
                  "them; * for every other layer). int8: INT8 kernels wherever one takes the "
                  "layer, even where float is faster (needs --int8)");
  cmd->add_option("--timing-cache", f.timing_cache,
                  "Read and update tactic timings in this file (rebuilds skip timing)");
  cmd->add_option("--mem-pool-size", f.mem_pool,
                  "workspace:N (MiB; or with a K/M/G suffix): scratch any one layer may use");
  cmd->add_option("--input-io-formats", f.input_io_formats,
                  "Input types (trtexec's --inputIOFormats): fp16 or fp32 for every float input, "
                  "or one per input in order (fp16:chw,int64,...); default: the model's");
  cmd->add_option("--output-io-formats", f.output_io_formats,
                  "Output types (trtexec's --outputIOFormats): fp16 or fp32 for every float "
                  "output, or one per output in order; fp16 with --fp16 saves the float32 "
                  "conversion of the last layers' results");
  cmd->add_option("--layout", f.layout, "auto (NHWC for FP16/TF32 CNN layers), linear or nhwc")
      ->check(CLI::IsMember({"auto", "linear", "nhwc"}));
  f.opt_level_flag = cmd->add_option("--opt-level", f.opt_level,
                                     "0 = import as is, 1 = fold and clean up, 2 = also fuse (default 2)")
                         ->check(CLI::Range(0, 2));
  cmd->add_option("--shapes", f.shapes, "Fixed input shapes: name:1x3x224x224,...");
  cmd->add_option("--min-shapes", f.min_shapes, "Profile minimum shapes: name:1x3x224x224,...");
  cmd->add_option("--opt-shapes", f.opt_shapes, "Profile optimum shapes (where tactics are timed)");
  cmd->add_option("--max-shapes", f.max_shapes, "Profile maximum shapes");
  if (with_dump)
    cmd->add_option("--dump-graph", f.dump, "Write the graph after each pass (text + dot) to this folder");
  cmd->add_flag("--verbose", f.verbose, "Explain optimizer decisions and each layer's tactic choice");
  cmd->add_option("--calib", f.calib,
                  "INT8 calibration data: a folder of .npy files (one batch or one sample each) "
                  "or of images (also in class subfolders; --resize/--mean/--std/--image-layout "
                  "as for image inputs), or NAME=DIR per input");
  if (with_images) {
    add_image_flags(cmd, f.own_images);
    f.images = &f.own_images;
  }
  cmd->add_option("--calib-algo", f.calib_algo, "entropy (default), minmax or percentile (99.99)")
      ->check(CLI::IsMember({"entropy", "minmax", "percentile"}));
  cmd->add_option("--calib-batches", f.calib_batches, "Calibrate on at most N batches (default: all)");
  cmd->add_option("--calib-cache", f.calib_cache,
                  "Calibration cache: reused when it matches the model, written after calibrating");
  cmd->add_option("--accuracy-budget", f.accuracy_budget,
                  "INT8: move the most sensitive layers back to float until the relative L2 "
                  "error against FP32 on held-out calibration batches is at most P");
}

void print_progress(const std::string& line) {
  // Only on a terminal: a failed build must still print one line (`kiln: error: ...`) to a log.
  static const bool tty = isatty(STDERR_FILENO) != 0;
  static bool pending = false;  // a per-batch line waits to be overwritten
  if (!tty) return;
  if (line.find(": batch ") != std::string::npos) {
    std::cerr << "\r" << line << "\033[K" << std::flush;
    pending = true;
    return;
  }
  if (pending) std::cerr << "\n";
  pending = false;
  std::cerr << line << std::endl;
}

namespace {

Expected<size_t> parse_mem_pool(const std::string& spec) {
  const std::string prefix = "workspace:";
  if (spec.rfind(prefix, 0) != 0)
    return KILN_ERROR("--mem-pool-size '{}' must look like workspace:N (N in MiB, or with K/M/G)", spec);
  std::string n = spec.substr(prefix.size());
  size_t mult = size_t(1) << 20;
  if (!n.empty() && (n.back() == 'K' || n.back() == 'M' || n.back() == 'G')) {
    mult = n.back() == 'K' ? size_t(1) << 10 : n.back() == 'M' ? size_t(1) << 20 : size_t(1) << 30;
    n.pop_back();
  }
  if (n.empty() || n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos)
    return KILN_ERROR("--mem-pool-size '{}': N must be a whole number", spec);
  return static_cast<size_t>(std::stoull(n)) * mult;
}

}  // namespace

Expected<std::map<std::string, std::string>> parse_calib(const std::vector<std::string>& specs) {
  std::map<std::string, std::string> out;
  for (const std::string& spec : specs) {
    for (const std::string& item : split_list(spec)) {
      const size_t eq = item.find('=');
      const std::string name = eq == std::string::npos ? "" : item.substr(0, eq);
      if (out.count(name))
        return KILN_ERROR("--calib: data for {} given twice", name.empty() ? "the input" : "'" + name + "'");
      out[name] = eq == std::string::npos ? item : item.substr(eq + 1);
    }
  }
  if (out.count("") && out.size() > 1)
    return Status::Error("--calib: give either one DIR or NAME=DIR for every input");
  return out;
}

Expected<BuildConfig> to_build_config(const BuildFlags& f) {
  BuildConfig c;
  c.backend = f.backend;
  // --best: every precision the backend has (the cpu backend has no FP16).
  const std::string backend = f.backend.empty() ? default_backend() : f.backend;
  c.fp16 = f.fp16 || (f.best && backend != "cpu");
  c.int8 = f.int8 || f.best;
  c.tf32 = !f.no_tf32;
  c.opt_level = f.opt_level;
  c.dump_graph_dir = f.dump;
  c.verbose = f.verbose;
  c.timing_cache = f.timing_cache;
  c.layout = f.layout;
  c.input_io_formats = split_list(f.input_io_formats);  // checked by the build
  c.output_io_formats = split_list(f.output_io_formats);
  KILN_ASSIGN_OR_RETURN(c.calib_data, parse_calib(f.calib));
  if (f.images) {
    KILN_ASSIGN_OR_RETURN(c.calib_images, calib_image_options(*f.images));
    c.calib_images.error_if_unused = f.images == &f.own_images;  // else kiln run's inputs too
    if (f.images == &f.own_images && c.calib_images.any() && f.calib.empty())
      return Status::Error(
          "--resize, --mean, --std and --image-layout apply to calibration images (--int8 "
          "--calib DIR of images)");
  }
  c.calib_algo = f.calib_algo;
  c.calib_batches = f.calib_batches;
  c.calib_cache = f.calib_cache;
  c.accuracy_budget = f.accuracy_budget;
  if (!c.int8 && (!f.calib.empty() || !f.calib_cache.empty() || !f.calib_algo.empty() ||
                  f.calib_batches || f.accuracy_budget))
    return Status::Error("--calib, --calib-algo, --calib-batches, --calib-cache and "
                         "--accuracy-budget apply to --int8 (or --best) builds");
  c.progress = print_progress;
  KILN_ASSIGN_OR_RETURN(c.shapes, parse_shapes(f.shapes, "--shapes"));
  KILN_ASSIGN_OR_RETURN(c.min_shapes, parse_shapes(f.min_shapes, "--min-shapes"));
  KILN_ASSIGN_OR_RETURN(c.opt_shapes, parse_shapes(f.opt_shapes, "--opt-shapes"));
  KILN_ASSIGN_OR_RETURN(c.max_shapes, parse_shapes(f.max_shapes, "--max-shapes"));
  if (!f.mem_pool.empty()) {
    KILN_ASSIGN_OR_RETURN(c.workspace_limit, parse_mem_pool(f.mem_pool));
  }
  for (const std::string& item : split_list(f.layer_precisions)) {
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return KILN_ERROR("--layer-precisions: '{}' must look like NAME:fp32, NAME:fp16 or NAME:int8", item);
    const std::string prec = item.substr(colon + 1);
    if (prec != "fp32" && prec != "fp16" && prec != "int8")
      return KILN_ERROR("--layer-precisions: '{}': precision must be fp32, fp16 or int8", item);
    if (prec == "int8" && !c.int8)
      return KILN_ERROR("--layer-precisions: '{}': int8 needs --int8 or --best", item);
    c.layer_precisions[item.substr(0, colon)] = prec;
  }
  return c;
}

Expected<std::unique_ptr<Engine>> engine_from_flags(const std::string& onnx,
                                                    const std::string& engine,
                                                    const BuildFlags& f) {
  if (!onnx.empty()) {
    KILN_ASSIGN_OR_RETURN(BuildConfig c, to_build_config(f));
    return Engine::build_from_onnx(onnx, c);
  }
  if (!f.backend.empty())
    return Status::Error("--backend applies to --onnx; an engine runs on the backend it was built for");
  if (f.opt_level_flag && f.opt_level_flag->count() > 0)
    return Status::Error("--opt-level applies to --onnx; an engine keeps the level it was built with");
  if (f.fp16 || f.int8 || f.best || f.no_tf32 || !f.layer_precisions.empty() || !f.timing_cache.empty() ||
      !f.input_io_formats.empty() || !f.output_io_formats.empty() ||
      !f.calib.empty() || !f.calib_cache.empty() || f.accuracy_budget ||
      !f.mem_pool.empty() || !f.min_shapes.empty() || !f.max_shapes.empty() || !f.opt_shapes.empty())
    return Status::Error("build options (--fp16, --int8, --best, --no-tf32, --timing-cache, "
                         "profiles, ...) apply to --onnx; an engine keeps the options it was "
                         "built with");
  return Engine::load(engine);
}

}  // namespace kiln::cli
