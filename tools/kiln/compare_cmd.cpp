// kiln compare: runs the same inputs through each engine (or each precision, built on the fly)
// and through the ONNX model on the CPU backend in float64, and reports per output max abs
// error, relative L2, cosine similarity and top-1 agreement; --per-layer localises the first
// layer where the error jumps; --dataset reports real top-1/top-5 per engine.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli.h"
#include "compare/compare.h"
#include "compare/dataset.h"
#include "compare_report.h"
#include "core/npy.h"
#include "inputs.h"

namespace kiln::cli {
namespace {

struct Opts {
  std::string model, engines, precisions = "", backend, shapes, json, dataset, timing_cache, save_dir;
  InputFlags in;
  unsigned seed = 1;
  bool per_layer = false;
  double tolerance = -1, jump_floor = -1;
  int dataset_limit = 1000, batch = 1;
  // --precisions int8: calibration as kiln build's
  std::vector<std::string> calib;
  std::string calib_algo, calib_cache;
  size_t calib_batches = 0;
};

Expected<BuildConfig> precision_config(const std::string& p, const Opts& o) {
  BuildConfig c;
  c.backend = o.backend.empty() ? default_backend() : o.backend;
  KILN_ASSIGN_OR_RETURN(c.shapes, parse_shapes(o.shapes, "--shapes"));
  c.timing_cache = o.timing_cache;
  if (p != "fp32" && p != "tf32" && p != "fp16" && p != "int8")
    return KILN_ERROR("--precisions: unknown precision '{}' (choose from fp32, tf32, fp16, int8)",
                      p);
  if ((p == "tf32" || p == "fp16") && c.backend != "cuda") {
    const std::string why = backend_unavailable_reason("cuda");
    return KILN_ERROR(
        "--precisions {}: tf32 and fp16 need the cuda backend ({}); fp32 and int8 (the INT8 "
        "reference) work on the cpu backend",
        p, why.empty() ? "use --backend cuda" : "not usable here: " + why);
  }
  c.tf32 = p == "tf32";
  c.fp16 = p == "fp16";
  if (p == "int8") {
    // As `kiln build --int8 --fp16` on the GPU (float layers in FP16), the INT8 reference on the
    // CPU; calibrated as kiln build calibrates.
    c.int8 = true;
    c.fp16 = c.backend == "cuda";
    c.tf32 = true;
    KILN_ASSIGN_OR_RETURN(c.calib_data, parse_calib(o.calib));
    KILN_ASSIGN_OR_RETURN(c.calib_images, calib_image_options(o.in));
    c.calib_images.error_if_unused = false;  // the image options serve image inputs too
    c.calib_algo = o.calib_algo;
    c.calib_cache = o.calib_cache;
    c.calib_batches = o.calib_batches;
  }
  return c;
}

Expected<std::vector<CompareEngine>> engines_to_compare(const Opts& o) {
  const auto ps = split_list(o.precisions);
  if ((!o.calib.empty() || !o.calib_cache.empty() || !o.calib_algo.empty() || o.calib_batches) &&
      std::find(ps.begin(), ps.end(), "int8") == ps.end())
    return Status::Error("--calib, --calib-algo, --calib-batches and --calib-cache apply to "
                         "--precisions int8");
  std::vector<CompareEngine> out;
  for (const std::string& path : split_list(o.engines)) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::load(path));
    out.push_back({path, path, engine_precision(*e), std::move(e)});
  }
  std::string precisions = o.precisions;
  if (precisions.empty() && out.empty()) precisions = "fp32";
  for (const std::string& p : split_list(precisions)) {
    KILN_ASSIGN_OR_RETURN(BuildConfig c, precision_config(p, o));
    auto e = Engine::build_from_onnx(o.model, c);
    if (!e.ok()) return e.status().with_context("--precisions " + p);
    out.push_back({p + " (" + c.backend + ")", "", p, std::move(e).value()});
  }
  return out;
}

// The top-k hits of one batch's output [N, classes] against the labels.
void count_topk(const Tensor& logits, const std::vector<int>& labels, int64_t& top1,
                int64_t& top5) {
  const int64_t k = logits.dim(-1);
  for (size_t r = 0; r < labels.size(); ++r) {
    const double want = logits.at_double(static_cast<int64_t>(r) * k + labels[r]);
    int64_t above = 0;
    for (int64_t j = 0; j < k; ++j)
      above += logits.at_double(static_cast<int64_t>(r) * k + j) > want;
    top1 += above < 1;
    top5 += above < 5;
  }
}

Status run_dataset(const Opts& o, std::vector<CompareEngine>& engines) {
  KILN_ASSIGN_OR_RETURN(Dataset ds, Dataset::open(o.dataset));
  const TensorInfo& in = engines[0].engine->inputs()[0];
  if (engines[0].engine->inputs().size() != 1)
    return Status::Error("--dataset needs a model with one input (the image)");
  KILN_ASSIGN_OR_RETURN(ImagePreprocess p, image_options(o.in, in));
  const size_t n = std::min<size_t>(ds.size(), static_cast<size_t>(o.dataset_limit));
  std::cout << "dataset   " << ds.description() << ", first " << n << " samples\n";
  for (auto& ce : engines) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> ctx, ce.engine->create_context());
    int64_t top1 = 0, top5 = 0;
    for (size_t start = 0; start < n; start += static_cast<size_t>(o.batch)) {
      std::vector<Tensor> xs;
      std::vector<int> labels;
      for (size_t i = start; i < std::min(n, start + o.batch); ++i) {
        KILN_ASSIGN_OR_RETURN(Tensor x, ds.sample(i, p));
        xs.push_back(std::move(x));
        labels.push_back(ds.label(i));
      }
      KILN_ASSIGN_OR_RETURN(Tensor batch, stack_batch(xs));
      KILN_ASSIGN_OR_RETURN(std::vector<Tensor> outs, ctx->execute({{in.name, batch}}));
      if (outs.empty() || outs[0].rank() != 2 ||
          outs[0].dim(0) != static_cast<int64_t>(labels.size()))
        return KILN_ERROR("--dataset: the model's first output must be [N, classes], got {}",
                          outs.empty() ? "nothing" : outs[0].desc());
      for (int l : labels)
        if (l >= outs[0].dim(1))
          return KILN_ERROR("--dataset: label {} but the model has {} classes", l, outs[0].dim(1));
      count_topk(outs[0], labels, top1, top5);
    }
    ce.dataset = {{"path", o.dataset},
                  {"samples", n},
                  {"top1", static_cast<double>(top1) / static_cast<double>(n)},
                  {"top5", static_cast<double>(top5) / static_cast<double>(n)}};
  }
  return Status::Ok();
}

// --save-outputs: DIR/reference/NAME.npy (float64) and DIR/<engine>/NAME.npy, <engine> the
// precision of a build made here or the engine file's name without .kiln.
Status save_outputs(const std::string& dir, const std::string& sub,
                    const std::vector<std::string>& names, const std::vector<Tensor>& outs) {
  const std::string folder = dir + "/" + safe_file_name(sub);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return KILN_ERROR("--save-outputs: cannot create folder '{}': {}", folder, ec.message());
  for (size_t i = 0; i < outs.size() && i < names.size(); ++i)
    KILN_RETURN_IF_ERROR(write_npy(folder + "/" + safe_file_name(names[i]) + ".npy", outs[i]));
  return Status::Ok();
}

Status run_compare(const Opts& o) {
  if (o.batch < 1 || o.dataset_limit < 1)
    return Status::Error("--batch and --dataset-limit must be at least 1");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Reference> ref, Reference::create(o.model));
  KILN_ASSIGN_OR_RETURN(std::vector<CompareEngine> engines, engines_to_compare(o));
  KILN_ASSIGN_OR_RETURN(ShapeMap shapes, parse_shapes(o.shapes, "--shapes"));
  std::mt19937 rng(o.seed);
  // The image options also serve --dataset's images and int8 calibration images.
  KILN_ASSIGN_OR_RETURN(auto inputs,
                        load_inputs(engines[0].engine->inputs(), o.in, shapes, rng,
                                    /*images_elsewhere=*/!o.calib.empty() || !o.dataset.empty()));
  std::vector<std::string> keep;
  if (o.per_layer) {
    std::set<std::string> all;
    for (const auto& ce : engines)
      for (const auto& n : common_tensors(ce.engine->graph(), ref->graph())) all.insert(n);
    keep.assign(all.begin(), all.end());
  }
  std::map<std::string, Tensor> ref_kept;
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> ref_out, ref->run(inputs, keep, &ref_kept));
  if (!o.save_dir.empty()) {
    std::vector<std::string> names;
    for (const Value* v : ref->graph().outputs()) names.push_back(v->name);
    KILN_RETURN_IF_ERROR(save_outputs(o.save_dir, "reference", names, ref_out));
  }
  for (auto& ce : engines) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> ctx, ce.engine->create_context());
    std::vector<std::string> names;
    if (o.per_layer) names = common_tensors(ce.engine->graph(), ref->graph());
    if (!names.empty()) KILN_RETURN_IF_ERROR(ctx->set_debug_tensors(names));
    auto outs = ctx->execute(inputs);
    if (!outs.ok()) return outs.status().with_context(ce.label);
    if (!o.save_dir.empty()) {
      std::vector<std::string> names;
      for (const auto& t : ce.engine->outputs()) names.push_back(t.name);
      const std::string sub = ce.file.empty()
                                  ? ce.precision
                                  : std::filesystem::path(ce.file).stem().string();
      KILN_RETURN_IF_ERROR(save_outputs(o.save_dir, sub, names, *outs));
    }
    for (size_t i = 0; i < outs->size(); ++i) {
      const std::string& name = ce.engine->outputs()[i].name;
      KILN_ASSIGN_OR_RETURN(TensorMetrics m,
                            compare_tensors((*outs)[i], ref_out.at(i), "output '" + name + "'"));
      ce.outputs.push_back({name, m});
    }
    if (o.per_layer) {
      const double floor = o.jump_floor > 0 ? o.jump_floor : default_jump_floor(*ce.engine);
      KILN_ASSIGN_OR_RETURN(
          ce.per_layer, localise_error(ce.engine->graph(), ctx->debug_tensors(), ref_kept, floor));
    }
  }
  if (!o.dataset.empty()) KILN_RETURN_IF_ERROR(run_dataset(o, engines));
  print_compare(std::cout, o.model, inputs, engines, o.per_layer);
  const nlohmann::json report = compare_json(o.model, inputs, engines, o.per_layer, o.tolerance);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << report.dump(2) << "\n";
    if (!f) return KILN_ERROR("--export-json: cannot write '{}'", o.json);
  }
  return tolerance_check(engines, o.tolerance);
}

}  // namespace

Runner add_compare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare", "Accuracy of engines/precisions against the ONNX model in float64 on the CPU");
  auto o = std::make_shared<Opts>();
  cmd->add_option("model", o->model, "The ONNX model (the reference)")->required();
  cmd->add_option("--engines", o->engines, "Engine files to compare: A.kiln,B.kiln");
  cmd->add_option("--precisions", o->precisions,
                  "Build and compare these: fp32,tf32,fp16,int8 (tf32/fp16 need the cuda backend; "
                  "int8 is --int8 --fp16 there, the INT8 reference on the cpu). Default fp32 when "
                  "no --engines");
  cmd->add_option("--calib", o->calib,
                  "--precisions int8: calibration data as for kiln build (.npy files or images, "
                  "or NAME=DIR per input)");
  cmd->add_option("--calib-algo", o->calib_algo, "--precisions int8: entropy, minmax or percentile")
      ->check(CLI::IsMember({"entropy", "minmax", "percentile"}));
  cmd->add_option("--calib-batches", o->calib_batches, "--precisions int8: at most N batches");
  cmd->add_option("--calib-cache", o->calib_cache, "--precisions int8: calibration cache");
  cmd->add_option("--backend", o->backend,
                  "Backend for --precisions builds (default: cuda if usable, else cpu)");
  cmd->add_option("--shapes", o->shapes,
                  "Input shapes for --precisions builds and random inputs: name:1x3x224x224");
  cmd->add_option("--timing-cache", o->timing_cache, "Timing cache for --precisions builds");
  add_input_flags(cmd, o->in);
  cmd->add_option("--seed", o->seed, "Seed of the random inputs (default 1)");
  cmd->add_flag("--per-layer", o->per_layer,
                "Compare every intermediate tensor both sides have; name the first layer where the "
                "error jumps");
  cmd->add_option("--jump-floor", o->jump_floor,
                  "--per-layer: relative L2 error a layer may add before it counts as a jump "
                  "(default by precision: fp32 1e-4, tf32/fp16 1e-2, int8 0.1)");
  cmd->add_option("--tolerance", o->tolerance,
                  "Exit status 1 when any output's relative L2 error exceeds this");
  cmd->add_option("--save-outputs", o->save_dir,
                  "Save the outputs as DIR/reference/NAME.npy (float64) and DIR/ENGINE/NAME.npy "
                  "(ENGINE: the precision built here, or the engine file's name)");
  cmd->add_option("--export-json", o->json,
                  "Write every number to this JSON file (docs/report.md)");
  cmd->add_option("--dataset", o->dataset,
                  "Fashion-MNIST/MNIST IDX files (folder or images file) or an image folder (one "
                  "subfolder per class): top-1/top-5 per engine");
  cmd->add_option("--dataset-limit", o->dataset_limit, "Use the first N samples (default 1000)");
  cmd->add_option("--batch", o->batch, "Samples per inference with --dataset (default 1)");
  return [o]() { return run_compare(*o); };
}

}  // namespace kiln::cli
