// The median of `runs` CUDA-event timings of f() on the legacy stream, after 3 untimed calls,
// for the kernel benches (int8_pw_bench.cu, gemm_f16_bench.cpp); a failing CUDA call ends the
// program with its name.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kiln::bench {

inline void event_check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

template <typename F>
float event_median_ms(F&& f, int runs) {
  cudaEvent_t a, b;
  event_check(cudaEventCreate(&a), "cudaEventCreate");
  event_check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < runs; ++i) {
    event_check(cudaEventRecord(a), "cudaEventRecord");
    f();
    event_check(cudaEventRecord(b), "cudaEventRecord");
    event_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    event_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  event_check(cudaEventDestroy(a), "cudaEventDestroy");
  event_check(cudaEventDestroy(b), "cudaEventDestroy");
  return t[t.size() / 2];
}

}  // namespace kiln::bench
