// kiln_gemm_f16_bench: the FP16 GEMMs of a transformer block alone, per kernel: each CUTLASS tile
// of fused_gemm.cutlass_sm90 with no activation, erf GELU and tanh GELU, and cuBLASLt's best of
// its first eight heuristic algorithms with the BIAS and GELU_BIAS epilogues, at BERT-base's
// shapes (hidden 768, FFN 3072) for 128 and 4096 tokens (batch 1 and 32 at sequence 128).
// CUDA-event medians of single launches (at 128 tokens the launch is much of it); TFLOP/s counts
// 2 M N K. Usage: kiln_gemm_f16_bench [runs]   (a GPU machine; built with CUTLASS)
#include <cublasLt.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#if KILN_HAVE_CUTLASS
#include "event_median.h"
#include "tactics/cutlass_gemm_f16.h"

namespace {

#define GB_CHECK(call)                                                                          \
  do {                                                                                          \
    auto e_ = (call);                                                                           \
    if (e_ != decltype(e_)(0)) {                                                                \
      std::fprintf(stderr, "kiln_gemm_f16_bench: %s failed (%d)\n", #call, int(e_));          \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

void* random_half(size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<__half> h(n);
  for (auto& v : h) v = __float2half(u(rng));
  void* d = nullptr;
  GB_CHECK(cudaMalloc(&d, n * 2));
  GB_CHECK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

float median_ms(const std::function<void()>& f, int runs) {
  return kiln::bench::event_median_ms(f, runs);
}

void report(const char* what, int m, int n, int k, float ms) {
  std::printf("    %-34s %8.2f us %6.0f TFLOP/s\n", what, ms * 1e3,
              2.0 * m * n * k / (ms * 1e-3) / 1e12);
}

// cuBLASLt's best of its first 8 algorithms: row-major Y [M, N] = A [M, K] W [K, N] (+ bias,
// GELU) as column-major D [N, M] = W' A'.
void lt_best(cublasLtHandle_t lt, int m, int n, int k, cublasLtEpilogue_t ep, const void* a,
             const void* w, const void* bias, void* y, void* ws, size_t ws_bytes, int runs,
             const char* what) {
  cublasLtMatmulDesc_t desc;
  GB_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  GB_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  const cudaDataType_t h = CUDA_R_16F;
  GB_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &h, sizeof(h)));
  GB_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  cublasLtMatrixLayout_t la, lb, ld;
  GB_CHECK(cublasLtMatrixLayoutCreate(&la, h, n, k, n));
  GB_CHECK(cublasLtMatrixLayoutCreate(&lb, h, k, m, k));
  GB_CHECK(cublasLtMatrixLayoutCreate(&ld, h, n, m, n));
  cublasLtMatmulPreference_t pref;
  GB_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  GB_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws_bytes, sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t res[8];
  int got = 0;
  GB_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &got));
  float best = 1e30f;
  int best_i = -1;
  const float alpha = 1.f, beta = 0.f;
  for (int i = 0; i < got; ++i) {
    const float ms = median_ms(
        [&] {
          GB_CHECK(cublasLtMatmul(lt, desc, &alpha, w, la, a, lb, &beta, y, ld, y, ld,
                                  &res[i].algo, ws, ws_bytes, nullptr));
        },
        runs);
    if (ms < best) best = ms, best_i = i;
  }
  char label[64];
  std::snprintf(label, sizeof(label), "%s (h%d of %d)", what, best_i, got);
  report(label, m, n, k, best);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("kiln_gemm_f16_bench: no CUDA GPU here: nothing to time\n");
    return 0;
  }
  const int runs = argc > 1 ? std::max(5, std::atoi(argv[1])) : 50;
  cublasLtHandle_t lt;
  GB_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = size_t(64) << 20;
  void* ws = nullptr;
  GB_CHECK(cudaMalloc(&ws, ws_bytes));
  struct Shape {
    const char* name;
    int n, k;
  };
  const Shape shapes[] = {{"QKV", 2304, 768}, {"out proj", 768, 768}, {"FFN1", 3072, 768},
                          {"FFN2", 768, 3072}};
  using kiln::cuda::F16GemmAct;
  const std::pair<F16GemmAct, const char*> acts[] = {
      {F16GemmAct::kNone, "none"}, {F16GemmAct::kGelu, "erf"}, {F16GemmAct::kGeluTanh, "tanh"}};
  for (int m : {128, 4096}) {
    for (const Shape& s : shapes) {
      std::printf("%s M %d N %d K %d\n", s.name, m, s.n, s.k);
      void* a = random_half(size_t(m) * s.k, 1.f, 1);
      void* w = random_half(size_t(s.k) * s.n, 0.05f, 2);
      void* bias = random_half(s.n, 0.5f, 3);
      void* y = nullptr;
      GB_CHECK(cudaMalloc(&y, size_t(m) * s.n * 2));
      for (const auto& [act, an] : acts) {
        for (const std::string& tile : kiln::cuda::f16_gemm_tiles()) {
          auto g = kiln::cuda::make_f16_gemm(act, tile);
          size_t need = 0;
          if (!g || !g->configure(m, s.n, s.k, &need).ok() || need > ws_bytes) continue;
          const float ms = median_ms(
              [&] {
                if (auto st = g->run(a, w, bias, nullptr, y, ws, nullptr); !st.ok()) {
                  std::fprintf(stderr, "kiln_gemm_f16_bench: %s\n", st.message().c_str());
                  std::exit(1);
                }
              },
              runs);
          report(("cutlass " + tile + " " + an).c_str(), m, s.n, s.k, ms);
        }
      }
      lt_best(lt, m, s.n, s.k, CUBLASLT_EPILOGUE_BIAS, a, w, bias, y, ws, ws_bytes, runs,
              "cublaslt bias");
      lt_best(lt, m, s.n, s.k, CUBLASLT_EPILOGUE_GELU_BIAS, a, w, bias, y, ws, ws_bytes, runs,
              "cublaslt tanh gelu+bias");
      for (void* p : {a, w, bias, y}) cudaFree(p);
    }
  }
  cudaFree(ws);
  cublasLtDestroy(lt);
  return 0;
}
#else
int main() {
  std::printf("kiln_gemm_f16_bench: built without CUTLASS: nothing to time\n");
  return 0;
}
#endif
