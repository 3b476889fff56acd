// kiln_int8_pw_bench: kiln's INT8 convolution kernels (pipelined, persistent pointwise and 3x3
// on mma.sync and on wgmma)
// alone on ResNet-50's 1x1 and stride-1 3x3 shapes at batch 256 (issue 10's speed work), against
// the bytes they must move. For each shape: random int8
// X, W and residual, one run of each kernel compared code for code with the first kernel's
// output (the pipelined kernel: the reference's arithmetic; differing codes are counted), then CUDA-event medians; the bytes (X + W + residual + Y) over the median give the
// achieved bandwidth, beside a device-to-device copy of as many bytes (what the memory can do).
// Usage: kiln_int8_pw_bench [runs]   (a GPU machine; the layers' own tests are test-backend-ops)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "layers/conv_int8.cuh"

namespace {

using kiln::gpu::Int8Epilogue;
using kiln::gpu::Int8Geom;

#define PW_CHECK(call)                                                                          \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "kiln_int8_pw_bench: %s: %s\n", #call, cudaGetErrorString(e_));     \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct Shape {
  const char* name;
  int n, h, w, c, k, stride;
  bool residual;
  int r = 1;  // filter size (3: padding 1)
};

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  PW_CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  PW_CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename F>
float median_ms(F&& f, int runs) {
  cudaEvent_t a, b;
  PW_CHECK(cudaEventCreate(&a));
  PW_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < runs; ++i) {
    PW_CHECK(cudaEventRecord(a));
    f();
    PW_CHECK(cudaEventRecord(b));
    PW_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    PW_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  PW_CHECK(cudaEventDestroy(a));
  PW_CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 20;
  if (argc > 2) {
    std::fprintf(stderr, "kiln_int8_pw_bench: usage: kiln_int8_pw_bench [runs]\n");
    return 1;
  }
  if (argc == 2) {
    char* end = nullptr;
    const long v = std::strtol(argv[1], &end, 10);
    if (end == argv[1] || *end != '\0' || v < 1 || v > 100000) {
      std::fprintf(stderr, "kiln_int8_pw_bench: runs must be a whole number from 1 to 100000, not '%s'\n",
                   argv[1]);
      return 1;
    }
    runs = static_cast<int>(v);
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("kiln_int8_pw_bench: no CUDA device: skipped\n");
    return 0;
  }
  cudaDeviceProp prop{};
  PW_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gpu %s, %d SMs, runs %d (median)\n", prop.name, prop.multiProcessorCount, runs);
  PW_CHECK(kiln::gpu::prepare_int8_pipelined());
  PW_CHECK(kiln::gpu::prepare_int8_pointwise());
  const Shape shapes[] = {
      {"s1 expand 64->256 +res", 256, 56, 56, 64, 256, 1, true},
      {"s1 expand 64->256", 256, 56, 56, 64, 256, 1, false},
      {"s1 reduce 256->64", 256, 56, 56, 256, 64, 1, false},
      {"s2 reduce 256->128", 256, 56, 56, 256, 128, 1, false},
      {"s2 expand 128->512 +res", 256, 28, 28, 128, 512, 1, true},
      {"s3 expand 256->1024 +res", 256, 14, 14, 256, 1024, 1, true},
      {"s2 downsample 256->512 s2", 256, 56, 56, 256, 512, 2, false},
      {"s1 3x3 64->64", 256, 56, 56, 64, 64, 1, false, 3},
      {"s2 3x3 128->128", 256, 28, 28, 128, 128, 1, false, 3},
  };
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> code(-128, 127), wcode(-127, 127);
  for (const Shape& s : shapes) {
    Int8Geom g{};
    g.N = s.n, g.H = s.h, g.W = s.w, g.C4 = s.c / 4, g.K = s.k, g.R = g.S = s.r;
    g.P = (s.h - 1) / s.stride + 1, g.Q = (s.w - 1) / s.stride + 1;
    g.sh = g.sw = s.stride, g.dh = g.dw = 1, g.ph = g.pw = s.r / 2;
    g.M = g.N * g.P * g.Q, g.KW = g.R * g.S * g.C4;
    const size_t xn = static_cast<size_t>(s.n) * s.h * s.w * s.c,
                 wn = size_t(s.k) * s.c * s.r * s.r, yn = size_t(g.M) * s.k;
    std::vector<int8_t> hx(xn), hw(wn), hz(s.residual ? yn : 0);
    for (auto& v : hx) v = static_cast<int8_t>(code(rng));
    for (auto& v : hw) v = static_cast<int8_t>(wcode(rng));
    for (auto& v : hz) v = static_cast<int8_t>(code(rng));
    std::vector<float> hsb(2 * s.k);
    // Channel scales that put y / sy mostly inside the int8 range (the codes compared below are
    // not all saturated): the accumulator's spread is about sqrt(R * S * C) * 74 * 73.
    const float unit = 40.f * 0.04f / (std::sqrt(float(s.r * s.r * s.c)) * 74.f * 73.f);
    for (int i = 0; i < s.k; ++i) hsb[i] = unit * (1 + i % 7) / 4, hsb[s.k + i] = 0.01f * (i % 5 - 2);
    int8_t *x = upload(hx), *w = upload(hw), *z = s.residual ? upload(hz) : nullptr;
    float* sb = upload(hsb);
    int8_t *y = nullptr, *y_ref = nullptr;
    PW_CHECK(cudaMalloc(&y, yn));
    PW_CHECK(cudaMalloc(&y_ref, yn));
    Int8Epilogue e;
    e.scale = sb, e.bias = sb + s.k, e.z = z, e.sz = 0.05f, e.sy = 0.04f;
    e.z_type = s.residual ? kiln::DataType::kInt8 : kiln::DataType::kUndefined;
    e.act.act = kiln::gpu::Act::kRelu;
    const double bytes = double(s.n) * s.h * s.w * s.c / (s.stride * s.stride) + wn +
                         (s.residual ? 2.0 : 1.0) * double(yn);
    std::printf("%-28s M %d C %d K %d R %d: %.1f MB moved at least\n", s.name, g.M, s.c, s.k, s.r,
                bytes / 1e6);
    // The floor: a device-to-device copy of as many bytes (read + write counted, as above).
    int8_t *ca = nullptr, *cb = nullptr;
    PW_CHECK(cudaMalloc(&ca, size_t(bytes / 2)));
    PW_CHECK(cudaMalloc(&cb, size_t(bytes / 2)));
    const float copy_ms =
        median_ms([&] { PW_CHECK(cudaMemcpyAsync(cb, ca, size_t(bytes / 2), cudaMemcpyDeviceToDevice)); }, runs);
    std::printf("    %-22s %8.4f ms %7.0f GB/s\n", "copy (floor)", copy_ms, bytes / copy_ms / 1e6);
    PW_CHECK(cudaFree(ca));
    PW_CHECK(cudaFree(cb));
    int per_sm3 = 0, per_sm3w = 0;
    PW_CHECK(kiln::gpu::prepare_int8_conv3x3(g, true, &per_sm3));
    PW_CHECK(kiln::gpu::prepare_int8_conv3x3_wgmma(g, true, &per_sm3w));
    struct Kernel {
      std::string name;
      std::function<const char*()> launch;
    };
    std::vector<Kernel> kernels = {
        {"pipelined n64", [&] { return kiln::gpu::launch_int8_pipelined(x, w, y, g, e, 64, 0); }},
        {"pipelined n128", [&] { return kiln::gpu::launch_int8_pipelined(x, w, y, g, e, 128, 0); }},
        {"pointwise n64", [&] { return kiln::gpu::launch_int8_pointwise(x, w, y, g, e, 64, 128, 0); }},
        {"pointwise n128", [&] { return kiln::gpu::launch_int8_pointwise(x, w, y, g, e, 128, 128, 0); }},
        {"pointwise n64m64", [&] { return kiln::gpu::launch_int8_pointwise(x, w, y, g, e, 64, 64, 0); }},
        {"pointwise n128m64", [&] { return kiln::gpu::launch_int8_pointwise(x, w, y, g, e, 128, 64, 0); }},
        {"conv3x3", [&] { return kiln::gpu::launch_int8_conv3x3(x, w, y, g, e, per_sm3, 0); }},
        {"conv3x3 wgmma",
         [&] { return kiln::gpu::launch_int8_conv3x3_wgmma(x, w, y, g, e, per_sm3w, 0); }},
    };
    bool first = true;
    for (const Kernel& k : kernels) {
      PW_CHECK(cudaMemset(y, 0x55, yn));
      const char* why = k.launch();
      if (*why) {
        std::printf("    %-22s not applicable: %s\n", k.name.c_str(), why);
        continue;
      }
      PW_CHECK(cudaDeviceSynchronize());
      if (first) {
        PW_CHECK(cudaMemcpy(y_ref, y, yn, cudaMemcpyDeviceToDevice));
        first = false;
        std::vector<int8_t> b(yn);
        PW_CHECK(cudaMemcpy(b.data(), y_ref, yn, cudaMemcpyDeviceToHost));
        const auto sat = std::count(b.begin(), b.end(), int8_t{127});
        std::printf("    (%.1f%% of its codes are 127, %.1f%% are 0)\n", 100.0 * double(sat) / double(yn),
                    100.0 * double(std::count(b.begin(), b.end(), int8_t{0})) / double(yn));
      } else {
        std::vector<int8_t> a(yn), b(yn);
        PW_CHECK(cudaMemcpy(a.data(), y, yn, cudaMemcpyDeviceToHost));
        PW_CHECK(cudaMemcpy(b.data(), y_ref, yn, cudaMemcpyDeviceToHost));
        size_t diff = 0;
        int worst = 0;
        for (size_t i = 0; i < yn; ++i) {
          diff += a[i] != b[i];
          worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
        }
        // The pointwise and 3x3 kernels' epilogues are reassociated (within one code of the
        // reference's): more than one is a wrong kernel.
        if (diff)
          std::printf("    %-22s %zu codes (%.5f%%) differ from the first kernel's, by at most %d%s\n",
                      k.name.c_str(), diff, 100.0 * double(diff) / double(yn), worst,
                      worst > 1 ? "  WRONG" : "");
      }
      const float ms = median_ms([&] { k.launch(); }, runs);
      std::printf("    %-22s %8.4f ms %7.0f GB/s\n", k.name.c_str(), ms, bytes / ms / 1e6);
    }
    PW_CHECK(cudaGetLastError());
    for (void* p : {(void*)x, (void*)w, (void*)z, (void*)sb, (void*)y, (void*)y_ref})
      if (p) PW_CHECK(cudaFree(p));
  }
  return 0;
}
