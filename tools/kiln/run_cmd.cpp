// kiln run: run an engine (or an ONNX model built on the fly) on given or random inputs.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>

#include "cli.h"
#include "core/npy.h"
#include "onnx/tensor_proto.h"

namespace kiln::cli {
namespace {

std::string safe_file_name(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

Expected<Tensor> load_input_file(const std::string& path) {
  if (path.size() >= 4 && path.substr(path.size() - 4) == ".npy") return read_npy(path);
  if (path.size() >= 3 && path.substr(path.size() - 3) == ".pb") return read_tensor_pb_file(path);
  return KILN_ERROR("{}: input files must be .npy or ONNX TensorProto .pb", path);
}

Expected<Tensor> random_input(const TensorInfo& info, const ShapeMap& shapes, std::mt19937& rng) {
  std::vector<int64_t> shape;
  auto it = shapes.find(info.name);
  if (it != shapes.end()) {
    shape = it->second;
  } else {
    for (int64_t d : info.dims) shape.push_back(d >= 0 ? d : 1);  // dynamic dims default to 1
  }
  Tensor t(info.dtype == DataType::kUndefined ? DataType::kFloat32 : info.dtype, shape);
  if (!dtype_is_supported(t.dtype()))
    return KILN_ERROR("input '{}': cannot make random data of type {}", info.name,
                      dtype_name(t.dtype()));
  Tensor f(DataType::kFloat32, shape);
  std::uniform_real_distribution<float> uf(-1.f, 1.f);
  std::uniform_int_distribution<int> ui(0, 9);
  const bool is_float = dtype_is_float(t.dtype());
  for (int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] = is_float ? uf(rng) : static_cast<float>(ui(rng) % (t.dtype() == DataType::kBool ? 2 : 10));
  return f.cast(t.dtype());
}

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
    std::vector<std::string> inputs;
    unsigned seed = 1;
    int iterations = 1, warmup = 0;
  };
  auto o = std::make_shared<Opts>();
  auto* g = cmd->add_option_group("model", "what to run");
  g->add_option("--onnx", o->onnx, "ONNX model (built for the chosen backend before running)");
  g->add_option("--engine", o->engine, "Engine file from `kiln build`");
  g->require_option(1);
  cmd->add_option("--input", o->inputs, "NAME=FILE (.npy or .pb); repeat per input. Inputs not given get seeded random data");
  cmd->add_option("--save-outputs", o->save_dir, "Save each output as DIR/NAME.npy");
  add_build_flags(cmd, o->flags, /*with_dump=*/false);  // with --onnx; --shapes also sizes random inputs
  cmd->add_option("--seed", o->seed, "Seed of the random inputs (default 1)");
  cmd->add_option("--iterations", o->iterations, "Timed runs (default 1)")->check(CLI::Range(1, 1000000));
  cmd->add_option("--warmup", o->warmup, "Untimed runs first (default 0)")->check(CLI::Range(0, 1000000));
  return [o]() -> Status {
    KILN_ASSIGN_OR_RETURN(ShapeMap shapes, parse_shapes(o->flags.shapes, "--shapes"));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, engine_from_flags(o->onnx, o->engine, o->flags));
    std::map<std::string, Tensor> inputs;
    for (const std::string& spec : o->inputs) {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos || eq == 0)
        return KILN_ERROR("--input '{}' must look like NAME=FILE", spec);
      const std::string name = spec.substr(0, eq);
      bool known = false;
      for (const auto& i : engine->inputs()) known |= i.name == name;
      if (!known) return KILN_ERROR("--input: the model has no input named '{}'", name);
      KILN_ASSIGN_OR_RETURN(Tensor t, load_input_file(spec.substr(eq + 1)));
      for (const auto& i : engine->inputs()) {
        // NumPy has no bfloat16: such inputs come as uint16 bit patterns.
        if (i.name == name && i.dtype == DataType::kBFloat16 && t.dtype() == DataType::kUInt16)
          t = Tensor::view(DataType::kBFloat16, t.shape(), t.raw(), std::make_shared<Tensor>(t));
      }
      inputs[name] = std::move(t);
    }
    std::mt19937 rng(o->seed);
    for (const auto& info : engine->inputs()) {
      if (inputs.count(info.name)) continue;
      KILN_ASSIGN_OR_RETURN(Tensor t, random_input(info, shapes, rng));
      inputs[info.name] = std::move(t);
    }
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
