// kiln bench: latency and throughput of an engine (trtexec's job). On the cuda backend every
// time comes from CUDA events: per inference the host-to-device copies, the compute and the
// device-to-host copies; throughput from back-to-back inferences without host synchronization.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "cli.h"
#include "compare/compare.h"
#include "inputs.h"

#ifdef KILN_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kiln::cli {
namespace {

struct Stats {
  double min = 0, mean = 0, median = 0, p90 = 0, p99 = 0, max = 0;
};

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    const size_t i = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  s.min = v.front();
  s.max = v.back();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  return s;
}

nlohmann::json stats_json(const Stats& s) {
  return {{"min", s.min}, {"mean", s.mean}, {"median", s.median},
          {"p90", s.p90}, {"p99", s.p99},   {"max", s.max}};
}

std::string stats_line(const char* what, const Stats& s) {
  return fmt::format(
      "{:<9} min {:.4f}  mean {:.4f}  median {:.4f}  p90 {:.4f}  p99 {:.4f}  max {:.4f} ms", what,
      s.min, s.mean, s.median, s.p90, s.p99, s.max);
}

// The shapes to run: --shapes, else the profile's opt shape, else the declared shape (dynamic
// dimensions 1).
Expected<std::vector<std::vector<int64_t>>> run_shapes(const Engine& e, const ShapeMap& given) {
  nlohmann::json opts = nlohmann::json::parse(e.build_options_json(), nullptr, false);
  std::vector<std::vector<int64_t>> out;
  for (const auto& info : e.inputs()) {
    if (auto it = given.find(info.name); it != given.end()) {
      out.push_back(it->second);
    } else if (opts.is_object() && opts.contains("profile") &&
               opts["profile"].contains(info.name)) {
      out.push_back(opts["profile"][info.name]["opt"].get<std::vector<int64_t>>());
    } else {
      std::vector<int64_t> s;
      for (int64_t d : info.dims) s.push_back(d >= 0 ? d : 1);
      out.push_back(s);
    }
  }
  return out;
}

Tensor random_tensor(DataType t, const std::vector<int64_t>& shape, std::mt19937& rng) {
  Tensor f(DataType::kFloat32, shape);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int64_t i = 0; i < f.numel(); ++i)
    f.data<float>()[i] =
        dtype_is_float(t) ? u(rng) : static_cast<float>(static_cast<int>(u(rng) * 4.f + 4.f));
  return f.cast(t);
}

#ifdef KILN_WITH_CUDA
std::string gpu_clocks() {  // the GPU path of run_bench only
  std::string out;
  if (FILE* p = popen("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version "
                      "--format=csv,noheader 2>/dev/null",
                      "r")) {
    char buf[256];
    while (fgets(buf, sizeof(buf), p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
#endif

struct BenchOpts {
  std::string onnx, engine, json;
  BuildFlags flags;
  int warmup = 20, iterations = 200;
  double duration = 2.0;
  // CUDA graphs: on unless --no-cuda-graph (the context's default; --use-cuda-graph says so).
  bool graph_flag = false, no_graph = false, no_transfers = false, profile = false;
  bool graph(const Engine& e) const { return !no_graph && e.backend() == "cuda"; }
  std::string batches;  // --batch 1,8,32: a sweep over the first dimension
  std::vector<std::string> load;  // --load-inputs NAME:FILE (trtexec's --loadInputs)
  std::map<std::string, Tensor> loaded;  // their tensors, read once
};

// Parses --batch 1,8,32; the engine's inputs must have a dynamic first dimension.
Expected<std::vector<int64_t>> parse_batches(const std::string& spec, const Engine& e) {
  std::vector<int64_t> out;
  if (spec.empty()) return out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    if (item.empty() || item.size() > 7 ||
        item.find_first_not_of("0123456789") != std::string::npos || std::stoll(item) == 0)
      return KILN_ERROR("--batch '{}': '{}' is not a positive whole number", spec, item);
    out.push_back(std::stoll(item));
    start = end + 1;
  }
  for (const auto& in : e.inputs())
    if (in.dims.empty() || in.dims[0] >= 0)
      return KILN_ERROR(
          "--batch needs an engine whose inputs have a dynamic first dimension "
          "(input {}); build it with --min-shapes/--opt-shapes/--max-shapes",
          in.str());
  return out;
}

// trtexec-like warnings: an unstable run (coefficient of variation of the latency over 10%)
// and throttled clocks (SM clock under 90% of its maximum while measuring).
void add_stability_warnings(const std::vector<double>& lat, nlohmann::json& report) {
  std::vector<std::string> warn;
  if (lat.size() > 1) {
    double mean = 0, var = 0;
    for (double v : lat) mean += v / static_cast<double>(lat.size());
    for (double v : lat) var += (v - mean) * (v - mean) / static_cast<double>(lat.size() - 1);
    const double cv = mean > 0 ? std::sqrt(var) / mean : 0;
    report["latency_cv"] = cv;
    if (cv > 0.10)
      warn.push_back(
          fmt::format("unstable run: the latency's coefficient of variation is {:.1f}% "
                      "(over 10%); other work on the GPU or CPU, or too few iterations",
                      100 * cv));
  }
  if (report.contains("gpu_clocks_sm_max_mem_driver")) {
    int sm = 0, max = 0;
    if (std::sscanf(report["gpu_clocks_sm_max_mem_driver"].get<std::string>().c_str(),
                    "%d MHz, %d MHz", &sm, &max) == 2 &&
        max > 0 && sm < 0.9 * max)
      warn.push_back(
          fmt::format("GPU clocks throttled: SM clock {} MHz of {} MHz maximum "
                      "(power or thermal limit; numbers are low)",
                      sm, max));
  }
  for (const auto& w : warn) std::cerr << "kiln: warning: " << w << "\n";
  if (!warn.empty()) report["warnings"] = warn;
}

// A progress bar on a terminal (nothing when stdout is a file or a pipe).
void progress_bar(size_t done, size_t total, int64_t batch) {
  if (total == 0 || !isatty(STDOUT_FILENO)) return;
  const int width = 30, filled = static_cast<int>(width * done / total);
  std::cerr << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] "
            << (done < total ? fmt::format("batch {} ({}/{})   ", batch, done + 1, total)
                             : std::string("done            "))
            << (done == total ? "\n" : "") << std::flush;
}

// The model's name for reports: the ONNX file the engine was built from, without folder and
// extension (resnet50), else the engine file's.
std::string model_name(const Engine& e, const std::string& fallback) {
  nlohmann::json o = nlohmann::json::parse(e.build_options_json(), nullptr, false);
  std::string src =
      o.is_object() && o.contains("source") ? o["source"].get<std::string>() : fallback;
  return std::filesystem::path(src).stem().string();
}

// Each layer's time, the mean of 10 profiled runs of `run_once` (which fills its argument).
template <typename RunOnce>
Status mean_profile(RunOnce run_once, std::vector<LayerTiming>& profile) {
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> sum;  // ms, host ms
  const int reps = 10;
  for (int r = 0; r < reps; ++r) {
    std::vector<LayerTiming> t;
    KILN_RETURN_IF_ERROR(run_once(&t));
    for (const auto& l : t) {
      auto& [ms, host] = sum[{l.name, l.op_type}];
      ms += l.ms / reps;
      host = l.host_ms < 0 || host < 0 ? -1 : host + l.host_ms / reps;
    }
  }
  for (const auto& [k, v] : sum) profile.push_back({k.first, k.second, v.first, v.second});
  return Status::Ok();
}

#ifdef KILN_WITH_CUDA
// The outputs of an engine whose sizes the data decides, on the device path: a buffer per output,
// grown when an inference needs more (TensorRT's IOutputAllocator, as trtexec uses it).
class GrowingOutputs : public OutputAllocator {
 public:
  GrowingOutputs() = default;
  GrowingOutputs(const GrowingOutputs&) = delete;
  GrowingOutputs& operator=(const GrowingOutputs&) = delete;
  ~GrowingOutputs() override {
    for (auto& [name, b] : bufs_) cudaFree(b.first);
  }
  void* reallocate_output(const std::string& name, void*, size_t bytes) override {
    auto& [p, size] = bufs_[name];
    if (p && size >= bytes) return p;
    if (p) cudaFree(p);  // waits for the device: what read it is done
    p = nullptr;
    size = std::max<size_t>(bytes, 256);
    if (cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
      size = 0;
    }
    return p;
  }
  void notify_shape(const std::string&, const std::vector<int64_t>&) override {}

 private:
  std::map<std::string, std::pair<void*, size_t>> bufs_;
};

// An engine with a dynamic region on the device path (--no-data-transfers): its inputs copied to
// the device once, its outputs left there, each inference enqueue() and a wait for the stream.
// `run` is set to one inference (its layer times, when asked for).
Status dynamic_on_device(const Engine& e, ExecutionContext& ctx,
                         const std::vector<std::vector<int64_t>>& shapes,
                         const std::vector<Tensor>& host_in, std::shared_ptr<void>& keep,
                         std::function<Status(std::vector<LayerTiming>*)>& run) {
  struct Held {
    ExecutionContext* ctx = nullptr;
    std::vector<std::string> outputs;  // given `outs` as their allocator
    cudaStream_t s = nullptr;
    std::vector<void*> dev;
    GrowingOutputs outs;
    ~Held() {
      for (const auto& name : outputs) ctx->set_output_allocator(name, nullptr);
      if (s) cudaStreamSynchronize(s);
      for (void* p : dev) cudaFree(p);
      if (s) cudaStreamDestroy(s);
    }
  };
  auto h = std::make_shared<Held>();
  h->ctx = &ctx;
  if (cudaStreamCreateWithFlags(&h->s, cudaStreamNonBlocking) != cudaSuccess)
    return Status::Error("cudaStreamCreate failed");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& name = e.inputs()[i].name;
    KILN_RETURN_IF_ERROR(ctx.set_input_shape(name, shapes[i]));
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(host_in[i].nbytes(), 256)) != cudaSuccess)
      return KILN_ERROR("out of GPU memory for input '{}'", name);
    h->dev.push_back(p);
    if (cudaMemcpy(p, host_in[i].raw(), host_in[i].nbytes(), cudaMemcpyHostToDevice) != cudaSuccess)
      return KILN_ERROR("input '{}': copy to the device failed", name);
    KILN_RETURN_IF_ERROR(ctx.set_tensor_address(name, p));
  }
  for (const auto& info : e.outputs()) {
    KILN_RETURN_IF_ERROR(ctx.set_output_allocator(info.name, &h->outs));
    h->outputs.push_back(info.name);
  }
  ExecutionContext* c = &ctx;
  run = [c, s = h->s](std::vector<LayerTiming>* t) -> Status {
    KILN_RETURN_IF_ERROR(c->enqueue(s, t));
    return cudaStreamSynchronize(s) == cudaSuccess ? Status::Ok()
                                                   : Status::Error("the inference failed on the GPU");
  };
  keep = h;
  return Status::Ok();
}
#endif

// One measurement at `shapes`: prints the numbers (one line when `brief`) and fills `report`.
Status bench_shapes(const BenchOpts& o, Engine& e, ExecutionContext& ctx,
                    const std::vector<std::vector<int64_t>>& shapes, bool brief,
                    nlohmann::json& report) {
  std::mt19937 rng(1);
  std::vector<Tensor> host_in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    auto it = o.loaded.find(e.inputs()[i].name);
    host_in.push_back(it != o.loaded.end() ? it->second
                                           : random_tensor(e.inputs()[i].dtype, shapes[i], rng));
  }
  const int64_t batch = shapes.empty() || shapes[0].empty() ? 1 : shapes[0][0];
  report = {{"engine", o.engine.empty() ? o.onnx : o.engine},
            {"backend", e.backend()},
            {"build_options", nlohmann::json::parse(e.build_options_json())},
            {"batch", batch},
            {"cuda_graph", o.graph(e)},
            {"data_transfers", !o.no_transfers}};
  nlohmann::json shp = nlohmann::json::object();
  for (size_t i = 0; i < shapes.size(); ++i) shp[e.inputs()[i].name] = shapes[i];
  report["shapes"] = shp;
  std::vector<double> lat, h2d, comp, d2h;
  double throughput = 0;
  std::vector<LayerTiming> profile;
  // A cuda engine whose sizes the data decides runs layer by layer past its prefix: through
  // execute() (outputs come back to the host at their real shapes), or with --no-data-transfers
  // through enqueue() with output allocators (inputs and outputs stay on the device).
  const nlohmann::json plan = nlohmann::json::parse(e.backend_plan_json(), nullptr, false);
  const bool dynamic = plan.is_object() && plan.value("dynamic_region", false);
  if (e.backend() != "cuda" || dynamic) {
    if (o.graph_flag && !dynamic)
      return Status::Error("--use-cuda-graph needs an engine for the cuda backend");
    if (dynamic) {  // the prefix replays as a CUDA graph unless --no-cuda-graph
      report["cuda_graph"] = false;
      KILN_RETURN_IF_ERROR(ctx.set_use_cuda_graph(o.graph(e)));
    }
    std::map<std::string, Tensor> inputs;
    for (size_t i = 0; i < shapes.size(); ++i) inputs[e.inputs()[i].name] = host_in[i];
    std::function<Status(std::vector<LayerTiming>*)> run = [&](std::vector<LayerTiming>* t) {
      return ctx.execute(inputs, t).status();
    };
    std::shared_ptr<void> device_io;
    const bool on_device = dynamic && o.no_transfers;
#ifdef KILN_WITH_CUDA
    if (on_device) KILN_RETURN_IF_ERROR(dynamic_on_device(e, ctx, shapes, host_in, device_io, run));
#endif
    for (int i = 0; i < o.warmup; ++i) KILN_RETURN_IF_ERROR(run(nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    while (static_cast<int>(lat.size()) < o.iterations ||
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
               o.duration) {
      const auto a = std::chrono::steady_clock::now();
      KILN_RETURN_IF_ERROR(run(nullptr));
      lat.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    comp = lat;
    throughput = 1000.0 * static_cast<double>(batch) / stats_of(lat).median;
    if (o.profile)  // kernels and host work, each layer between two synchronisations
      KILN_RETURN_IF_ERROR(mean_profile(run, profile));
    report["gpu"] = !dynamic ? "none (cpu backend; wall-clock times)"
                    : on_device
                        ? "cuda (data-dependent shapes: enqueue() with output allocators, "
                          "wall-clock times; inputs and outputs on the device)"
                        : "cuda (data-dependent shapes: execute() wall-clock times, inputs and "
                          "outputs through the host)";
    // The layers before the first size the data decides, replayed as a graph per input shape.
    if (dynamic) report["prefix_cuda_graphs"] = ctx.cuda_graph_count();
  } else {
#ifdef KILN_WITH_CUDA
    auto check = [](cudaError_t e, const char* what) {
      return e == cudaSuccess ? Status::Ok() : KILN_ERROR("{}: {}", what, cudaGetErrorString(e));
    };
    cudaStream_t s = nullptr;
    KILN_RETURN_IF_ERROR(
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"));
    std::shared_ptr<void> stream_guard(nullptr, [s](void*) { cudaStreamDestroy(s); });
    std::vector<void*> dev;  // freed at the end
    std::shared_ptr<void> dev_guard(nullptr, [&dev](void*) {
      for (void* p : dev) cudaFree(p);
    });
    std::vector<void*> pinned;
    std::shared_ptr<void> pin_guard(nullptr, [&pinned](void*) {
      for (void* p : pinned) cudaFreeHost(p);
    });
    struct Io {
      void* dev;
      void* host;
      size_t bytes;
    };
    std::vector<Io> ins, outs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& name = e.inputs()[i].name;
      KILN_RETURN_IF_ERROR(ctx.set_input_shape(name, shapes[i]));
      Io io{nullptr, nullptr, host_in[i].nbytes()};
      const size_t alloc = std::max<size_t>(io.bytes, 256);
      if (cudaMalloc(&io.dev, alloc) != cudaSuccess)
        return Status::Error("out of GPU memory for the inputs");
      dev.push_back(io.dev);
      KILN_RETURN_IF_ERROR(check(cudaMallocHost(&io.host, alloc), "cudaMallocHost"));
      pinned.push_back(io.host);
      std::memcpy(io.host, host_in[i].raw(), io.bytes);
      KILN_RETURN_IF_ERROR(
          check(cudaMemcpy(io.dev, io.host, io.bytes, cudaMemcpyHostToDevice), "cudaMemcpy"));
      KILN_RETURN_IF_ERROR(ctx.set_tensor_address(name, io.dev));
      ins.push_back(io);
    }
    for (const auto& info : e.outputs()) {
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> os, ctx.tensor_shape(info.name));
      Io io{nullptr, nullptr, Tensor::view(info.dtype, os, nullptr, nullptr).nbytes()};
      const size_t alloc = std::max<size_t>(io.bytes, 256);
      if (cudaMalloc(&io.dev, alloc) != cudaSuccess)
        return Status::Error("out of GPU memory for the outputs");
      dev.push_back(io.dev);
      KILN_RETURN_IF_ERROR(check(cudaMallocHost(&io.host, alloc), "cudaMallocHost"));
      pinned.push_back(io.host);
      KILN_RETURN_IF_ERROR(ctx.set_tensor_address(info.name, io.dev));
      outs.push_back(io);
    }
    KILN_RETURN_IF_ERROR(ctx.set_use_cuda_graph(o.graph(e)));
    cudaEvent_t ev[4];
    for (auto& e : ev) KILN_RETURN_IF_ERROR(check(cudaEventCreate(&e), "cudaEventCreate"));
    std::shared_ptr<void> ev_guard(nullptr, [&ev](void*) {
      for (auto& e : ev) cudaEventDestroy(e);
    });
    auto one = [&](bool record) -> Status {
      if (record) cudaEventRecord(ev[0], s);
      if (!o.no_transfers)
        for (const auto& io : ins)
          KILN_RETURN_IF_ERROR(check(
              cudaMemcpyAsync(io.dev, io.host, io.bytes, cudaMemcpyHostToDevice, s), "copy in"));
      if (record) cudaEventRecord(ev[1], s);
      KILN_RETURN_IF_ERROR(ctx.enqueue(s));
      if (record) cudaEventRecord(ev[2], s);
      if (!o.no_transfers)
        for (const auto& io : outs)
          KILN_RETURN_IF_ERROR(check(
              cudaMemcpyAsync(io.host, io.dev, io.bytes, cudaMemcpyDeviceToHost, s), "copy out"));
      if (record) cudaEventRecord(ev[3], s);
      return Status::Ok();
    };
    for (int i = 0; i < o.warmup; ++i) KILN_RETURN_IF_ERROR(one(false));
    KILN_RETURN_IF_ERROR(check(cudaStreamSynchronize(s), "warm-up"));
    const auto t0 = std::chrono::steady_clock::now();
    while (static_cast<int>(lat.size()) < o.iterations ||
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
               o.duration) {
      KILN_RETURN_IF_ERROR(one(true));
      KILN_RETURN_IF_ERROR(check(cudaEventSynchronize(ev[3]), "inference"));
      float a = 0, b = 0, c = 0;
      cudaEventElapsedTime(&a, ev[0], ev[1]);
      cudaEventElapsedTime(&b, ev[1], ev[2]);
      cudaEventElapsedTime(&c, ev[2], ev[3]);
      h2d.push_back(a);
      comp.push_back(b);
      d2h.push_back(c);
      lat.push_back(a + b + c);
    }
    // Throughput: inferences queued back to back, as a serving loop would.
    const int n = std::max<int>(20, std::min<int>(static_cast<int>(lat.size()), 500));
    cudaEventRecord(ev[0], s);
    for (int i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(one(false));
    cudaEventRecord(ev[3], s);
    KILN_RETURN_IF_ERROR(check(cudaEventSynchronize(ev[3]), "throughput run"));
    float total = 0;
    cudaEventElapsedTime(&total, ev[0], ev[3]);
    throughput = 1000.0 * static_cast<double>(batch) * n / total;
    if (o.profile)
      KILN_RETURN_IF_ERROR(
          mean_profile([&](std::vector<LayerTiming>* t) { return ctx.enqueue(s, t); }, profile));
    int dev_id = 0;
    cudaDeviceProp p{};
    cudaGetDevice(&dev_id);
    cudaGetDeviceProperties(&p, dev_id);
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    report["gpu"] = p.name;
#ifdef KILN_DEVICE_CODE_NOTE
    report["device_code"] = KILN_DEVICE_CODE_NOTE;
    std::cerr << "kiln bench: note: this kiln's kernels were assembled with " KILN_DEVICE_CODE_NOTE
                 " (KILN_CUDA_PTXAS_OPT, a build for checks without a GPU): not kiln's speed\n";
#endif
    report["gpu_clocks_sm_max_mem_driver"] = gpu_clocks();
    report["cuda_runtime"] = rt;
    report["cuda_driver"] = drv;
    const MemoryInfo m = ctx.memory_info();
    report["memory"] = {
        {"weights", m.weights}, {"activations", m.activations}, {"workspace", m.workspace}};
#else
    return Status::Error("this kiln was built without CUDA");
#endif
  }
  const Stats ls = stats_of(lat), cs = stats_of(comp);
  report["latency_ms"] = stats_json(ls);
  report["compute_ms"] = stats_json(cs);
  if (!h2d.empty()) {
    report["h2d_ms"] = stats_json(stats_of(h2d));
    report["d2h_ms"] = stats_json(stats_of(d2h));
  }
  report["iterations"] = lat.size();
  report["throughput_per_s"] = throughput;
  if (brief)
    std::cout << fmt::format("batch {:>5}  median {:.4f} ms  p99 {:.4f} ms  {:.1f} samples/s",
                             batch, ls.median, ls.p99, throughput)
              << "\n";
  else {
    std::cout << fmt::format("kiln bench: {} ({} backend), batch {}, {} timed inferences{}{}",
                             report["engine"].get<std::string>(), e.backend(), batch, lat.size(),
                             report["cuda_graph"].get<bool>() ? ", CUDA graphs"
                             : report.value("prefix_cuda_graphs", 0) > 0
                                 ? ", the layers before the data decides a size as a CUDA graph"
                             : e.backend() == "cuda" ? ", no CUDA graph"
                                                     : "",
                             o.no_transfers ? ", no data transfers" : "")
              << "\n";
    if (report.contains("gpu"))
      std::cout << "gpu       " << report["gpu"].get<std::string>()
                << (report.contains("gpu_clocks_sm_max_mem_driver")
                        ? " (" + report["gpu_clocks_sm_max_mem_driver"].get<std::string>() + ")"
                        : "")
                << "\n";
    std::cout << stats_line("latency", ls) << "\n";
    if (!h2d.empty()) {
      std::cout << stats_line("h2d", stats_of(h2d)) << "\n";
      std::cout << stats_line("compute", cs) << "\n";
      std::cout << stats_line("d2h", stats_of(d2h)) << "\n";
    }
    std::cout << fmt::format("throughput {:.1f} inferences/s x batch {} = {:.1f} samples/s",
                             throughput / static_cast<double>(batch), batch, throughput)
              << "\n";
  }
  if (o.profile) {
    std::sort(profile.begin(), profile.end(), [](auto& a, auto& b) { return a.ms > b.ms; });
    double total = 0, host = 0;
    bool split = false;  // a dynamic region's layers say how much of their time the host took
    for (const auto& l : profile) {
      total += l.ms;
      if (l.host_ms >= 0) host += l.host_ms, split = true;
    }
    nlohmann::json pj = nlohmann::json::array();
    std::cout << fmt::format("per-layer profile (mean of 10 runs, {:.4f} ms in layers{}):", total,
                             split ? fmt::format(", {:.4f} ms of it on the host", host) : "")
              << "\n";
    for (const auto& l : profile) {
      std::cout << fmt::format("  {:8.4f} ms {:5.1f}%  {}{:<24} {}", l.ms,
                               100.0 * l.ms / std::max(total, 1e-12),
                               !split ? "" : l.host_ms < 0 ? "             " :
                                             fmt::format("host {:6.3f}  ", l.host_ms),
                               l.op_type, l.name)
                << "\n";
      nlohmann::json entry = {{"name", l.name}, {"type", l.op_type}, {"ms", l.ms}};
      if (l.host_ms >= 0) entry["host_ms"] = l.host_ms;
      pj.push_back(std::move(entry));
    }
    report["profile"] = pj;
    if (split) report["profile_host_ms"] = host;
  }
  add_stability_warnings(lat, report);
  return Status::Ok();
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "Measure an engine's latency and throughput (GPU events)");

  auto o = std::make_shared<BenchOpts>();
  auto* g = cmd->add_option_group("model", "what to measure");
  g->add_option("--onnx", o->onnx, "ONNX model (built with the build options first)");
  g->add_option("--engine", o->engine, "Engine file from `kiln build`");
  g->require_option(1);
  add_build_flags(cmd, o->flags, /*with_dump=*/false);
  cmd->add_option("--warmup", o->warmup, "Untimed inferences first (default 20)")
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--iterations", o->iterations,
                  "At least this many timed inferences (default 200)")
      ->check(CLI::Range(1, 10000000));
  cmd->add_option("--duration", o->duration, "And at least this many seconds (default 2)")
      ->check(CLI::Range(0.0, 3600.0));
  auto* on = cmd->add_flag("--use-cuda-graph", o->graph_flag,
                           "Replay each inference as a CUDA graph, captured once per shape and "
                           "addresses (the default on the cuda backend)");
  cmd->add_flag("--no-cuda-graph", o->no_graph,
                "Launch every layer at every inference, without CUDA graphs (host-bound at "
                "small batches)")
      ->excludes(on);
  cmd->add_flag("--no-data-transfers", o->no_transfers, "Leave out the host<->device copies");
  cmd->add_option("--export-json", o->json,
                  "Write every number to this JSON file (schema kiln.bench/1, docs/report.md)");
  cmd->add_option("--batch", o->batches,
                  "Sweep these batch sizes (1,8,32,256) over one engine with a dynamic batch "
                  "profile; --export-json writes one record per batch");
  cmd->add_flag("--dump-profile", o->profile,
                "Per-layer times, sorted, with their share (and, where sizes depend on the data, "
                "the host's part)");
  cmd->add_option("--load-inputs", o->load,
                  "Inputs from files (trtexec's --loadInputs): NAME:FILE (.npy or ONNX .pb), "
                  "comma-separated or repeated; their shapes are the run's, the other inputs get "
                  "random data")
      ->delimiter(',');
  return [o]() -> Status {
    KILN_ASSIGN_OR_RETURN(ShapeMap given, parse_shapes(o->flags.shapes, "--shapes"));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          engine_from_flags(o->onnx, o->engine, o->flags));
    if (!o->load.empty()) {
      if (!o->batches.empty())
        return Status::Error("--load-inputs fixes the batch: it cannot be used with --batch");
      InputFlags f;
      for (const auto& spec : o->load) {
        const size_t colon = spec.find(':');
        if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
          return KILN_ERROR("--load-inputs '{}' is not NAME:FILE", spec);
        f.inputs.push_back(spec.substr(0, colon) + "=" + spec.substr(colon + 1));
      }
      std::mt19937 rng(1);
      KILN_ASSIGN_OR_RETURN(auto all, load_inputs(engine->inputs(), f, given, rng));
      for (const auto& spec : f.inputs) {  // the loaded ones; their shapes size the run
        const std::string name = spec.substr(0, spec.find('='));
        o->loaded[name] = all.at(name);
        given[name] = all.at(name).shape();
      }
    }
    KILN_ASSIGN_OR_RETURN(auto shapes, run_shapes(*engine, given));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> batches, parse_batches(o->batches, *engine));
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ExecutionContext> ctx, engine->create_context());
    nlohmann::json records = nlohmann::json::array();
    if (batches.empty()) {
      nlohmann::json r;
      KILN_RETURN_IF_ERROR(bench_shapes(*o, *engine, *ctx, shapes, false, r));
      records.push_back(r);
    }
    for (size_t k = 0; k < batches.size(); ++k) {
      for (auto& s : shapes)
        if (!s.empty()) s[0] = batches[k];
      progress_bar(k, batches.size(), batches[k]);
      nlohmann::json r;
      KILN_RETURN_IF_ERROR(bench_shapes(*o, *engine, *ctx, shapes, true, r));
      records.push_back(r);
    }
    progress_bar(batches.size(), batches.size(), 0);
    for (auto& r : records) {
      r["schema"] = "kiln.bench/1";
      r["framework"] = "kiln";
      r["model"] = model_name(*engine, o->engine.empty() ? o->onnx : o->engine);
      r["precision"] = engine_precision(*engine);
    }
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      f << (batches.empty() ? records[0]
                            : nlohmann::json{{"schema", "kiln.bench/1"}, {"records", records}})
               .dump(2)
        << "\n";
      if (!f) return KILN_ERROR("--export-json: cannot write '{}'", o->json);
    }
    return Status::Ok();
  };
}

}  // namespace kiln::cli
