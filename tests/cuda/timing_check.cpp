// An independent check of `kiln bench`'s numbers (issue 9's acceptance): times the same engine
// with its own CUDA events through the public API only, and compares its median with the median
// `kiln bench --export-json` wrote. Exit status 1 when they differ by more than the tolerance.
//
//   kiln_timing_check ENGINE BENCH_JSON [--tolerance 0.05] [--iterations 300]
//
// Inputs are zero-free random data of the shapes the JSON records; a CUDA graph is used when
// kiln bench used one. Only the inference is timed: compare with a kiln bench run made with
// --no-data-transfers (its compute_ms).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/engine.h"

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "kiln_timing_check: error: %s\n", msg.c_str());
  return 1;
}

bool ok(cudaError_t e, const char* what, std::string* err) {
  if (e == cudaSuccess) return true;
  *err = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return fail("usage: kiln_timing_check ENGINE BENCH_JSON [--tolerance F] [--iterations N]");
  double tolerance = 0.05;
  int iterations = 300;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tolerance" && i + 1 < argc) tolerance = std::stod(argv[++i]);
    else if (a == "--iterations" && i + 1 < argc) iterations = std::max(10, std::stoi(argv[++i]));
    else return fail("unknown argument '" + a + "'");
  }
  nlohmann::json bench;
  try {
    std::ifstream f(argv[2]);
    if (!f) return fail(std::string(argv[2]) + ": cannot open");
    bench = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    return fail(std::string(argv[2]) + ": " + e.what());
  }
  if (!bench.contains("compute_ms") || !bench["compute_ms"].contains("median"))
    return fail(std::string(argv[2]) + ": no compute_ms.median (a kiln bench --export-json file?)");
  const double bench_median = bench["compute_ms"]["median"].get<double>();
  const bool graph = bench.value("cuda_graph", false);

  auto engine = kiln::Engine::load(argv[1]);
  if (!engine.ok()) return fail(engine.status().message());
  auto ctx = engine.value()->create_context();
  if (!ctx.ok()) return fail(ctx.status().message());
  kiln::ExecutionContext& c = *ctx.value();

  std::string err;
  std::vector<void*> buffers;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.1f, 1.f);
  const nlohmann::json shapes = bench.value("shapes", nlohmann::json::object());
  for (const auto& in : engine.value()->inputs()) {
    std::vector<int64_t> dims = in.dims;
    if (shapes.contains(in.name)) dims = shapes[in.name].get<std::vector<int64_t>>();
    for (auto& d : dims) d = d < 0 ? 1 : d;
    if (auto st = c.set_input_shape(in.name, dims); !st.ok()) return fail(st.message());
    kiln::Tensor t(kiln::DataType::kFloat32, dims);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    kiln::Tensor typed = t.cast(in.dtype);
    void* p = nullptr;
    if (!ok(cudaMalloc(&p, std::max<size_t>(typed.nbytes(), 256)), "cudaMalloc", &err)) return fail(err);
    buffers.push_back(p);
    if (!ok(cudaMemcpy(p, typed.raw(), typed.nbytes(), cudaMemcpyHostToDevice), "cudaMemcpy", &err))
      return fail(err);
    if (auto st = c.set_tensor_address(in.name, p); !st.ok()) return fail(st.message());
  }
  for (const auto& out : engine.value()->outputs()) {
    auto shape = c.tensor_shape(out.name);
    if (!shape.ok()) return fail(shape.status().message());
    int64_t n = 1;
    for (int64_t d : shape.value()) n *= d;
    void* p = nullptr;
    if (!ok(cudaMalloc(&p, std::max<size_t>(n * kiln::dtype_size(out.dtype), 256)), "cudaMalloc", &err))
      return fail(err);
    buffers.push_back(p);
    if (auto st = c.set_tensor_address(out.name, p); !st.ok()) return fail(st.message());
  }
  if (auto st = c.set_use_cuda_graph(graph); !st.ok()) return fail(st.message());

  cudaStream_t s;
  cudaEvent_t a, b;
  if (!ok(cudaStreamCreate(&s), "cudaStreamCreate", &err) || !ok(cudaEventCreate(&a), "event", &err) ||
      !ok(cudaEventCreate(&b), "event", &err))
    return fail(err);
  for (int i = 0; i < 20; ++i)
    if (auto st = c.enqueue(s); !st.ok()) return fail(st.message());
  if (!ok(cudaStreamSynchronize(s), "warm-up", &err)) return fail(err);
  std::vector<float> ms;
  for (int i = 0; i < iterations; ++i) {
    cudaEventRecord(a, s);
    if (auto st = c.enqueue(s); !st.ok()) return fail(st.message());
    cudaEventRecord(b, s);
    if (!ok(cudaEventSynchronize(b), "inference", &err)) return fail(err);
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  const double diff = std::abs(median - bench_median) / median;
  std::printf("timing check: independent median %.4f ms, kiln bench median %.4f ms, difference %.1f%% (tolerance %.0f%%): %s\n",
              median, bench_median, 100 * diff, 100 * tolerance, diff <= tolerance ? "agree" : "DISAGREE");
  for (void* p : buffers) cudaFree(p);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(s);
  return diff <= tolerance ? 0 : 1;
}
