#include "kiln/engine.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/backend_info.h"
#include "backends/cpu/cpu_executor.h"
#include "engine/fp16_range.h"
#include "engine/io_formats.h"
#include "engine/plan_format.h"
#include "engine/profile.h"
#include "ir/verifier.h"
#include "onnx/importer.h"
#include "ops/op.h"
#include "passes/pipeline.h"
#include "quant/int8_build.h"

namespace kiln {

std::string TensorInfo::str() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < dims.size(); ++i)
    parts.push_back(dims[i] >= 0 ? std::to_string(dims[i])
                                 : (dim_names[i].empty() ? "?" : dim_names[i]));
  return fmt::format("{}: {}[{}]", name, dtype_name(dtype), fmt::join(parts, ","));
}

namespace {

TensorInfo info_of(const Value& v) {
  TensorInfo t;
  t.name = v.name;
  t.dtype = v.type.dtype;
  if (v.type.dims) {
    for (const Dim& d : *v.type.dims) {
      t.dims.push_back(d.is_static() ? d.value : -1);
      t.dim_names.push_back(d.is_static() ? "" : d.symbol);
    }
  }
  return t;
}

class CpuContext final : public ExecutionContext {
 public:
  CpuContext(const Engine& e, std::unique_ptr<CpuExecutor> ex, Profile profile)
      : engine_(e), ex_(std::move(ex)), profile_(std::move(profile)) {}
  Expected<std::vector<Tensor>> execute(const std::map<std::string, Tensor>& inputs,
                                        std::vector<LayerTiming>* timings) override {
    std::vector<Tensor> ordered;
    for (const auto& info : engine_.inputs()) {
      auto it = inputs.find(info.name);
      if (it == inputs.end()) return KILN_ERROR("input '{}' was not given", info.name);
      KILN_RETURN_IF_ERROR(profile_.check(info.name, it->second.shape()));
      ordered.push_back(it->second);
    }
    for (const auto& [name, t] : inputs) {
      bool known = false;
      for (const auto& info : engine_.inputs()) known |= info.name == name;
      if (!known) return KILN_ERROR("the engine has no input named '{}'", name);
    }
    if (debug_.slots.empty()) return ex_->run(ordered, timings);
    return ex_->run(ordered, timings, &debug_);
  }
  Status set_debug_tensors(const std::vector<std::string>& names) override {
    KILN_ASSIGN_OR_RETURN(debug_.slots, ex_->debug_slots(names));
    debug_.values.clear();
    return Status::Ok();
  }
  std::map<std::string, Tensor> debug_tensors() const override { return debug_.values; }

 private:
  const Engine& engine_;
  std::unique_ptr<CpuExecutor> ex_;
  CpuExecutor::Debug debug_;
  Profile profile_;
};

}  // namespace

Engine::~Engine() = default;

// The device path belongs to the cuda backend; the cpu backend answers with one clear line.
namespace {
Status no_device_path(const char* what) {
  return KILN_ERROR("{} needs an engine built for the cuda backend (this one runs on the cpu "
                    "backend: use execute())", what);
}
}  // namespace
Status ExecutionContext::set_input_shape(const std::string&, const std::vector<int64_t>&) {
  return no_device_path("set_input_shape");
}
Expected<std::vector<int64_t>> ExecutionContext::tensor_shape(const std::string&) {
  return no_device_path("tensor_shape");
}
Status ExecutionContext::set_tensor_address(const std::string&, void*) {
  return no_device_path("set_tensor_address");
}
Status ExecutionContext::enqueue(CUstream_st*, std::vector<LayerTiming>*) {
  return no_device_path("enqueue");
}
Status ExecutionContext::set_use_cuda_graph(bool) { return no_device_path("CUDA graphs"); }
Status ExecutionContext::set_output_allocator(const std::string&, OutputAllocator*) {
  return no_device_path("set_output_allocator");
}
Expected<MemoryInfo> ExecutionContext::plan_device_memory() { return no_device_path("plan_device_memory"); }
Status ExecutionContext::set_debug_tensors(const std::vector<std::string>&) {
  return Status::Error("this execution context cannot keep debug tensors");
}

Expected<std::unique_ptr<Engine>> Engine::from_graph(std::unique_ptr<Graph> g, std::string backend,
                                                     std::string target, std::string options_json,
                                                     std::string kiln_version,
                                                     std::string plan_json) {
  std::unique_ptr<Engine> e(new Engine());
  e->graph_ = std::move(g);
  e->backend_ = std::move(backend);
  e->target_ = std::move(target);
  e->options_json_ = std::move(options_json);
  e->kiln_version_ = std::move(kiln_version);
  e->plan_json_ = std::move(plan_json);
  if (e->backend_ == "cuda") {
    KILN_ASSIGN_OR_RETURN(Profile profile, Profile::from_json(*e->graph_, e->options_json_));
    nlohmann::json plan = nlohmann::json::parse(e->plan_json_, nullptr, false);
    KILN_ASSIGN_OR_RETURN(e->backend_engine_, gpu::load_cuda_engine(*e->graph_, plan, profile));
  }
  for (const Value* v : e->graph_->inputs()) e->inputs_.push_back(info_of(*v));
  for (const Value* v : e->graph_->outputs()) e->outputs_.push_back(info_of(*v));
  return e;
}

Expected<std::unique_ptr<Engine>> Engine::build_from_onnx(const std::string& onnx_path,
                                                          const BuildConfig& config) {
  // Refuse an unusable backend before reading the model.
  const std::string backend = config.backend.empty() ? default_backend() : config.backend;
  if (backend != "cpu" && backend != "cuda")
    return KILN_ERROR("unknown backend '{}' (choose cpu or cuda)", backend);
  if (std::string why = backend_unavailable_reason(backend); !why.empty()) return Status::Error(why);
  if (config.int8 && config.accuracy_budget > 0) {
    KILN_ASSIGN_OR_RETURN(quant::BudgetResult r, quant::fit_accuracy_budget(onnx_path, config));
    nlohmann::json options = nlohmann::json::parse(r.engine->options_json_);
    options["accuracy_budget"] = std::move(r.report);
    r.engine->options_json_ = options.dump();
    return std::move(r.engine);
  }
  if (config.accuracy_budget < 0 || (config.accuracy_budget > 0 && !config.int8))
    return Status::Error("--accuracy-budget takes a positive relative error and applies to --int8");
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, import_onnx_file(onnx_path));
  return build_from_graph(std::move(g), config, onnx_path);
}

Expected<std::unique_ptr<Engine>> Engine::build_from_graph(std::unique_ptr<Graph> g,
                                                           const BuildConfig& config,
                                                           const std::string& source) {
  const std::string backend = config.backend.empty() ? default_backend() : config.backend;
  if (backend != "cpu" && backend != "cuda")
    return KILN_ERROR("unknown backend '{}' (choose cpu or cuda)", backend);
  if (std::string why = backend_unavailable_reason(backend); !why.empty()) return Status::Error(why);
  if (config.accuracy_budget != 0)
    return Status::Error("--accuracy-budget rebuilds the model: use Engine::build_from_onnx");
  // The cpu backend is FP32 (FP64 for checking); its --int8 is the INT8 reference
  // (docs/quantization.md), which simulates a GPU INT8 kernel's arithmetic exactly.
  if (backend == "cpu" && config.fp16)
    return KILN_ERROR("--fp16 is not supported by the cpu backend, which computes in FP32 (and "
                      "FP64 for checking); use --backend cuda on a machine with a GPU");
  KILN_ASSIGN_OR_RETURN(Profile profile, Profile::from_config(*g, config));
  KILN_RETURN_IF_ERROR(profile.apply_static_shapes(*g));
  KILN_RETURN_IF_ERROR(apply_io_formats(*g, {config.input_io_formats, config.output_io_formats}));
  // Q/DQ nodes in a build without --int8 run as float ops; the build summary says so. So do
  // products exported in float16 (a `model.half()` export), which the fusion passes leave alone.
  size_t qdq_nodes = 0, float16_products = 0;
  for (const Node* n : g->nodes()) {
    if (n->domain.empty() && (n->op_type == "QuantizeLinear" || n->op_type == "DequantizeLinear"))
      ++qdq_nodes;
    if (n->domain.empty() &&
        (n->op_type == "MatMul" || n->op_type == "Gemm" || n->op_type == "Conv") &&
        n->output(0) && n->output(0)->type.dtype == DataType::kFloat16)
      ++float16_products;
  }
  quant::QdqMapping qdq;  // Q/DQ nodes carry the scales; mapped before they fold away
  if (config.int8) {
    // ONNX Runtime's QOperator ops (QLinearConv, QLinearMatMul) become their QDQ form first, so
    // that a symmetric int8 one maps onto INT8 layers (passes/qoperator_to_qdq.cpp).
    if (config.opt_level >= 1) {
      OptimizeOptions pre;
      pre.opt_level = config.opt_level;
      pre.backend = backend;
      KILN_RETURN_IF_ERROR(infer_shapes(*g));
      KILN_RETURN_IF_ERROR(run_pass(*g, "qoperator_to_qdq", pre).status());
    }
    KILN_ASSIGN_OR_RETURN(qdq, quant::map_qdq(*g));
  }
  const bool explicit_int8 = qdq.any;
  OptimizeOptions opt;
  opt.opt_level = config.opt_level;
  opt.dump_dir = config.dump_graph_dir;
  opt.verbose = config.verbose;
  opt.backend = backend;
  // Fusion is decided at the float precision; INT8 layers are marked on the fused graph.
  opt.precision = config.fp16 ? "fp16" : "fp32";
  // Calibrated scales are those of the model optimized at FP32 (quant/int8_build.h): an FP16
  // build fuses at FP16, so it calibrates on a copy optimized at FP32.
  std::unique_ptr<Graph> fp32_graph;
  if (config.int8 && !explicit_int8 && opt.precision != "fp32") {
    fp32_graph = g->clone();
    OptimizeOptions fp32_opt = opt;
    fp32_opt.precision = "fp32";
    fp32_opt.dump_dir.clear();
    fp32_opt.verbose = false;
    KILN_RETURN_IF_ERROR(optimize_graph(*fp32_graph, fp32_opt));
  }
  KILN_RETURN_IF_ERROR(optimize_graph(*g, opt));
  // Pins name layers of the optimized graph (fused layers keep their first node's name), on
  // every backend: a misspelt name is an error, not a pin that silently does nothing.
  for (const auto& [name, p] : config.layer_precisions) {
    if (p != "fp32" && p != "fp16" && p != "int8")
      return KILN_ERROR("--layer-precisions: '{}' for layer '{}' (choose fp32, fp16 or int8)", p, name);
    if (p == "int8" && !config.int8)
      return KILN_ERROR("--layer-precisions: layer '{}' pinned to int8 needs --int8", name);
    if (name != "*" && !g->find_node(name))
      return KILN_ERROR("--layer-precisions: the optimized graph has no layer named '{}' (see "
                        "`kiln inspect`)", name);
  }
  if (backend == "cuda" && config.fp16 && config.verbose)
    report_fp16_range(*g, profile, backend, std::cerr);
  nlohmann::json int8_info;
  if (config.int8) {
    KILN_ASSIGN_OR_RETURN(int8_info,
                          quant::quantize_for_build(*g, config, explicit_int8, fp32_graph.get()));
    if (qdq.kept) {  // what kiln's INT8 cannot express runs as the model's own float ops
      int8_info["qdq_kept_as_ops"] = qdq.kept;
      int8_info["qdq_kept_why"] = qdq.why;
    }
    // Fusions of INT8 layers (fuse_conv_pair), now that they are marked; the capability query
    // at precision int8 says where the backend has a kernel. The pins above named the layers
    // before pairing: a pinned layer is not INT8 and stays unpaired.
    OptimizeOptions int8_opt = opt;
    int8_opt.precision = "int8";
    KILN_RETURN_IF_ERROR(optimize_int8_graph(*g, int8_opt));
  }
  std::string plan_json = "{}";
  if (backend == "cuda") {
    KILN_ASSIGN_OR_RETURN(nlohmann::json plan, gpu::build_cuda_plan(*g, config, profile));
    plan_json = plan.dump();
  }
  nlohmann::json options = {
      {"precision", config.int8 ? "int8" : opt.precision},
      {"fp16", config.fp16},
      {"tf32", config.tf32},
      {"opt_level", config.opt_level},
      {"source", source},
      {"profile", profile.to_json()},
  };
  if (!config.layer_precisions.empty()) options["layer_precisions"] = config.layer_precisions;
  if (!config.input_io_formats.empty()) options["input_io_formats"] = config.input_io_formats;
  if (!config.output_io_formats.empty()) options["output_io_formats"] = config.output_io_formats;
  if (config.int8) options["int8"] = std::move(int8_info);
  if (!config.int8 && qdq_nodes) options["qdq_nodes_as_float"] = qdq_nodes;
  if (float16_products) options["float16_products"] = float16_products;
  return from_graph(std::move(g), backend, current_target(backend), options.dump(),
                    KILN_VERSION_STRING, std::move(plan_json));
}

Status Engine::save(const std::string& path) const {
  EngineMetadata meta;
  meta.kiln_version = kiln_version_;
  meta.backend = backend_;
  meta.target = target_;
  meta.build_options = nlohmann::json::parse(options_json_);
  meta.backend_plan = nlohmann::json::parse(plan_json_, nullptr, false);
  return write_plan_file(path, *graph_, meta);
}

Expected<std::unique_ptr<Engine>> Engine::load(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(LoadedPlan plan, read_plan_file(path));
  KILN_RETURN_IF_ERROR(verify_graph(*plan.graph).with_context(path));
  const std::string& backend = plan.meta.backend;
  if (backend != "cpu" && backend != "cuda")
    return KILN_ERROR("{}: unknown backend '{}' in engine", path, backend);
  if (std::string why = backend_unavailable_reason(backend); !why.empty())
    return KILN_ERROR("{}: engine was built for the {} backend, which is not usable here: {}", path,
                      backend, why);
  const std::string here = current_target(backend);
  if (plan.meta.target != here)
    return KILN_ERROR("{}: engine was built for target '{}' but this machine is '{}'; rebuild it "
                      "with `kiln build` here", path, plan.meta.target, here);
  auto e = from_graph(std::move(plan.graph), backend, plan.meta.target,
                      plan.meta.build_options.dump(), plan.meta.kiln_version,
                      plan.meta.backend_plan.dump());
  if (!e.ok()) return e.status().with_context(path);
  return e;
}

Expected<std::unique_ptr<ExecutionContext>> Engine::create_context() const {
  if (backend_engine_) return backend_engine_->create_context();
  if (backend_ != "cpu")
    return KILN_ERROR("backend '{}' cannot execute engines in this build", backend_);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CpuExecutor> ex, CpuExecutor::create(*graph_));
  KILN_ASSIGN_OR_RETURN(Profile profile, Profile::from_json(*graph_, options_json_));
  return std::unique_ptr<ExecutionContext>(new CpuContext(*this, std::move(ex), std::move(profile)));
}

}  // namespace kiln
