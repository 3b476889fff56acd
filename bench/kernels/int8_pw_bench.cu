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

#include "event_median.h"
#include "layers/conv_int8.cuh"
#include "layers/conv_int8_pair.cuh"

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
  return kiln::bench::event_median_ms(f, runs);
}

// The first block of ResNet-50's stages 2-4 at batch 256: the wgmma pair kernel (expand and
// strided downsample as one layer) against the same work as two pointwise layers (the expand
// writing Y0, the downsample reading it back as its residual; each the fastest of its tiles).
void pair_bench(int runs) {
  struct PairShape {
    const char* name;
    int p, c1, c2, k, s;  // X: 256 x p x p x c1, X2: 256 x sp x sp x c2 (read at stride s)
  };
  const PairShape shapes[] = {{"s1 pair 64+64->256", 56, 64, 64, 256, 1},
                              {"s2 pair 128+256->512", 28, 128, 256, 512, 2},
                              {"s3 pair 256+512->1024", 14, 256, 512, 1024, 2},
                              {"s4 pair 512+1024->2048", 7, 512, 1024, 2048, 2}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(-128, 127), wcode(-127, 127);
  for (const PairShape& s : shapes) {
    const int n = 256, M = n * s.p * s.p;
    const size_t x1n = size_t(M) * s.c1, x2n = size_t(M) * s.s * s.s * s.c2, yn = size_t(M) * s.k;
    std::vector<int8_t> hx1(x1n), hx2(x2n), hw(size_t(s.k) * (s.c1 + s.c2));
    for (auto& v : hx1) v = static_cast<int8_t>(code(rng));
    for (auto& v : hx2) v = static_cast<int8_t>(code(rng));
    for (auto& v : hw) v = static_cast<int8_t>(wcode(rng));
    std::vector<int8_t> hw1(size_t(s.k) * s.c1), hw2(size_t(s.k) * s.c2);
    for (int k = 0; k < s.k; ++k) {
      std::copy_n(hw.begin() + size_t(k) * (s.c1 + s.c2), s.c1, hw1.begin() + size_t(k) * s.c1);
      std::copy_n(hw.begin() + size_t(k) * (s.c1 + s.c2) + s.c1, s.c2,
                  hw2.begin() + size_t(k) * s.c2);
    }
    const float u1 = 20.f / (std::sqrt(float(s.c1)) * 74.f * 73.f);
    const float u2 = 20.f / (std::sqrt(float(s.c2)) * 74.f * 73.f);
    std::vector<kiln::gpu::PairChannel> hch(s.k);
    std::vector<float> hsb(2 * s.k);
    for (int i = 0; i < s.k; ++i) {
      hch[i] = {u1 * (1 + i % 5) / 3, u2 * (1 + i % 3) / 2, 0.1f * (i % 5 - 2), 0.f};
      hsb[i] = u1 * 0.04f, hsb[s.k + i] = 0.f;
    }
    int8_t *x1 = upload(hx1), *x2 = upload(hx2), *w = upload(hw), *w1 = upload(hw1),
           *w2 = upload(hw2);
    auto* ch = upload(hch);
    float* sb = upload(hsb);
    int8_t *y = nullptr, *y0 = nullptr;
    PW_CHECK(cudaMalloc(&y, yn));
    PW_CHECK(cudaMalloc(&y0, yn));
    const double bytes = double(x1n) + double(x2n) / (s.s * s.s) + double(hw.size()) + double(yn);
    std::printf("%-28s M %d K %d: %.1f MB moved at least (as one layer)\n", s.name, M, s.k,
                bytes / 1e6);
    kiln::gpu::PairLaunch l{};
    l.a = {x1, s.p, s.p, 1, 1, true};
    l.b = {x2, s.s * s.p, s.s * s.p, s.s, s.s, s.s == 1};
    l.w = w, l.ch = ch, l.y = y, l.M = M, l.K = s.k, l.P = s.p, l.Q = s.p;
    if (const char* e = kiln::gpu::launch_int8_pair_wgmma(true, s.c1, s.c2, l, true, 0); *e) {
      std::printf("    pair wgmma: prepare: %s\n", e);
    } else {
      const float ms = median_ms(
          [&] {
            if (const char* e2 = kiln::gpu::launch_int8_pair_wgmma(true, s.c1, s.c2, l, false, 0);
                *e2) {
              std::fprintf(stderr, "kiln_int8_pw_bench: pair: %s\n", e2);
              std::exit(1);
            }
          },
          runs);
      PW_CHECK(cudaGetLastError());
      std::printf("    %-22s %8.4f ms %7.0f GB/s %6.0f TOPS\n", "pair wgmma", ms,
                  bytes / ms / 1e6, 2.0 * M * s.k * (s.c1 + s.c2) / ms / 1e9);
    }
    // The two layers, each at its fastest pointwise tile.
    Int8Geom g1{}, g2{};
    g1.N = g2.N = n, g1.H = g1.W = s.p, g2.H = g2.W = s.s * s.p;
    g1.C4 = s.c1 / 4, g2.C4 = s.c2 / 4, g1.K = g2.K = s.k, g1.R = g1.S = g2.R = g2.S = 1;
    g1.P = g1.Q = g2.P = g2.Q = s.p, g1.sh = g1.sw = 1, g2.sh = g2.sw = s.s;
    g1.dh = g1.dw = g2.dh = g2.dw = 1, g1.M = g2.M = M, g1.KW = g1.C4, g2.KW = g2.C4;
    Int8Epilogue e1, e2;
    e1.scale = e2.scale = sb, e1.bias = e2.bias = sb + s.k, e1.sy = e2.sy = 0.04f;
    e2.z = y0, e2.z_type = kiln::DataType::kInt8, e2.sz = 0.05f;
    e2.act.act = kiln::gpu::Act::kRelu;
    auto best = [&](const int8_t* x, const int8_t* wt, int8_t* out, const Int8Geom& g,
                    const Int8Epilogue& e) {
      float b = 1e9f;
      for (int tn : {128, 64})
        for (int tm : {128, 64}) {
          if (*kiln::gpu::int8_pointwise_unfit(g, tn, tm)) continue;
          b = std::min(b, median_ms([&] {
                         kiln::gpu::launch_int8_pointwise(x, wt, out, g, e, tn, tm, 0);
                       }, runs));
        }
      return b;
    };
    const float ex = best(x1, w1, y0, g1, e1), ds = best(x2, w2, y, g2, e2);
    PW_CHECK(cudaGetLastError());
    if (ex < 1e9f && ds < 1e9f)
      std::printf("    %-22s %8.4f ms (expand %.4f + downsample %.4f)\n", "two pointwise layers",
                  ex + ds, ex, ds);
    else  // C over 256: the engine runs these layers on CUTLASS (kiln bench --dump-profile)
      std::printf("    %-22s not applicable (C1 or C2 over 256)\n", "two pointwise layers");
    for (void* p : {(void*)x1, (void*)x2, (void*)w, (void*)w1, (void*)w2, (void*)ch, (void*)sb,
                    (void*)y, (void*)y0})
      PW_CHECK(cudaFree(p));
  }
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
  if (const char* only = std::getenv("KILN_PW_BENCH"); only && std::string(only) == "pair") {
    pair_bench(runs);  // KILN_PW_BENCH=pair: the pair rows only
    return 0;
  }
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
  pair_bench(runs);
  return 0;
}
