#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>

#include "conv_kernels.h"

namespace kiln::cuda {
namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_random_kernel(T* out, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    const float u = float(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    const float v = lo + (hi - lo) * u;
    if constexpr (sizeof(T) == 1) {
      out[i] = T(fminf(fmaxf(floorf(v + 0.5f), lo), hi));
    } else {
      out[i] = T(v);
    }
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}

// Output element i = (n, p, q, k) of the direct convolution: sets *k and returns the sum over
// the filter window of mul(x, w), accumulated in Acc (float: fma order; int: exact).
template <typename Acc, typename T, typename Mul>
__device__ Acc conv_dot(const ConvShape& sh, const T* x, const T* w, int64_t i, int* k_out,
                        Mul mul) {
  const int P = sh.p(), Q = sh.q();
  const int k = int(i % sh.k);
  int64_t t = i / sh.k;
  const int q = int(t % Q);
  t /= Q;
  const int p = int(t % P);
  const int n = int(t / P);
  Acc acc = 0;
  for (int r = 0; r < sh.r; ++r) {
    const int hi = p * sh.stride - sh.pad + r;
    if (hi < 0 || hi >= sh.h) continue;
    for (int s = 0; s < sh.s; ++s) {
      const int wi = q * sh.stride - sh.pad + s;
      if (wi < 0 || wi >= sh.w) continue;
      const T* xp = x + ((int64_t(n) * sh.h + hi) * sh.w + wi) * sh.c;
      const T* wp = w + ((int64_t(k) * sh.r + r) * sh.s + s) * sh.c;
      for (int c = 0; c < sh.c; ++c) acc = mul(xp[c], wp[c], acc);
    }
  }
  *k_out = k;
  return acc;
}

// FP reference: one thread per output (n, p, q, k); k is fastest so a warp shares input pixels.
template <typename T>
__global__ void reference_conv_fp(ConvShape sh, Epilogue ep, const T* x, const T* w, const T* bias,
                                  const T* residual, float* y) {
  const int64_t total = sh.y_elems();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int k = 0;
    float acc = conv_dot<float>(sh, x, w, i, &k, [](T a, T b, float s) {
      return fmaf(to_float(a), to_float(b), s);
    });
    if (ep != Epilogue::kNone) acc += to_float(bias[k]);
    if (epilogue_has_residual(ep)) acc += to_float(residual[i]);
    if (epilogue_has_relu(ep)) acc = fmaxf(acc, 0.f);
    y[i] = acc;
  }
}

__global__ void reference_conv_int8(ConvShape sh, float scale, const int8_t* x, const int8_t* w,
                                    int8_t* y) {
  const int64_t total = sh.y_elems();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int k = 0;
    const int acc = conv_dot<int>(sh, x, w, i, &k,
                                  [](int8_t a, int8_t b, int s) { return s + int(a) * int(b); });
    const double v = rint(double(acc) * double(scale));  // round half to even
    y[i] = int8_t(fmin(fmax(v, -128.0), 127.0));
  }
}

struct CheckAccum {
  double diff2, ref2;
  unsigned long long nonfinite, mismatches, max_abs;
};

template <typename T>
__global__ void check_fp_kernel(const T* y, const float* ref, int64_t n, CheckAccum* acc) {
  double d2 = 0, r2 = 0;
  unsigned long long bad = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(y[i]);
    if (!isfinite(v)) {
      ++bad;
      continue;
    }
    const double d = double(v) - double(ref[i]);
    d2 += d * d;
    r2 += double(ref[i]) * double(ref[i]);
  }
  for (int o = 16; o > 0; o /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, o);
    r2 += __shfl_down_sync(0xffffffffu, r2, o);
    bad += __shfl_down_sync(0xffffffffu, bad, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&acc->diff2, d2);
    atomicAdd(&acc->ref2, r2);
    atomicAdd(&acc->nonfinite, bad);
  }
}

__global__ void check_int8_kernel(const int8_t* y, const int8_t* ref, int64_t n, CheckAccum* acc) {
  unsigned long long mism = 0;
  unsigned int maxd = 0;
  double r2 = 0, d2 = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(y[i]) - int(ref[i]);
    if (d != 0) ++mism;
    maxd = max(maxd, unsigned(abs(d)));
    d2 += double(d) * d;
    r2 += double(ref[i]) * double(ref[i]);
  }
  for (int o = 16; o > 0; o /= 2) {
    mism += __shfl_down_sync(0xffffffffu, mism, o);
    maxd = max(maxd, __shfl_down_sync(0xffffffffu, maxd, o));
    d2 += __shfl_down_sync(0xffffffffu, d2, o);
    r2 += __shfl_down_sync(0xffffffffu, r2, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&acc->mismatches, mism);
    atomicMax(&acc->max_abs, (unsigned long long)maxd);
    atomicAdd(&acc->diff2, d2);
    atomicAdd(&acc->ref2, r2);
  }
}

template <typename T>
__global__ void epilogue_kernel(T* y, const T* bias, const T* residual, int64_t n, int k,
                                Epilogue ep) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = to_float(y[i]) + to_float(bias[i % k]);
    if (epilogue_has_residual(ep)) v += to_float(residual[i]);
    if (epilogue_has_relu(ep)) v = fmaxf(v, 0.f);
    y[i] = T(v);
  }
}

int grid_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return int(blocks < 132 * 64 ? (blocks < 1 ? 1 : blocks) : 132 * 64);
}

}  // namespace

void fill_random(void* data, int64_t count, Precision p, uint64_t seed, float lo, float hi,
                 cudaStream_t stream) {
  const int g = grid_for(count);
  switch (p) {
    case Precision::kFP16:
      fill_random_kernel<<<g, 256, 0, stream>>>(static_cast<__half*>(data), count, seed, lo, hi);
      break;
    case Precision::kTF32:
      fill_random_kernel<<<g, 256, 0, stream>>>(static_cast<float*>(data), count, seed, lo, hi);
      break;
    case Precision::kINT8:
      fill_random_kernel<<<g, 256, 0, stream>>>(static_cast<int8_t*>(data), count, seed, lo, hi);
      break;
  }
}

void fill_poison(void* data, int64_t count, Precision p, cudaStream_t stream) {
  // 0xFF bytes are NaN in half and float; INT8 gets 0x5A.
  cudaMemsetAsync(data, p == Precision::kINT8 ? 0x5A : 0xFF, count * element_size(p), stream);
}

void reference_conv(const ConvProblem& p, const void* x, const void* w, const void* bias,
                    const void* residual, void* y_ref, cudaStream_t stream) {
  const int g = grid_for(p.shape.y_elems());
  float* yf = static_cast<float*>(y_ref);
  switch (p.precision) {
    case Precision::kFP16:
      reference_conv_fp<<<g, 256, 0, stream>>>(
          p.shape, p.epilogue, static_cast<const __half*>(x), static_cast<const __half*>(w),
          static_cast<const __half*>(bias), static_cast<const __half*>(residual), yf);
      break;
    case Precision::kTF32:
      reference_conv_fp<<<g, 256, 0, stream>>>(
          p.shape, p.epilogue, static_cast<const float*>(x), static_cast<const float*>(w),
          static_cast<const float*>(bias), static_cast<const float*>(residual), yf);
      break;
    case Precision::kINT8:
      reference_conv_int8<<<g, 256, 0, stream>>>(
          p.shape, p.int8_scale, static_cast<const int8_t*>(x), static_cast<const int8_t*>(w),
          static_cast<int8_t*>(y_ref));
      break;
  }
}

CheckResult check_output(const ConvProblem& p, const void* y, const void* ref,
                         cudaStream_t stream) {
  static CheckAccum* acc = nullptr;
  if (!acc && cudaMalloc(&acc, sizeof(CheckAccum)) != cudaSuccess) {
    CheckResult bad;
    bad.rel_l2 = INFINITY;
    return bad;
  }
  cudaMemsetAsync(acc, 0, sizeof(CheckAccum), stream);
  const int64_t n = p.shape.y_elems();
  const int g = grid_for(n);
  const float* rf = static_cast<const float*>(ref);
  switch (p.precision) {
    case Precision::kFP16:
      check_fp_kernel<<<g, 256, 0, stream>>>(static_cast<const __half*>(y), rf, n, acc);
      break;
    case Precision::kTF32:
      check_fp_kernel<<<g, 256, 0, stream>>>(static_cast<const float*>(y), rf, n, acc);
      break;
    case Precision::kINT8:
      check_int8_kernel<<<g, 256, 0, stream>>>(static_cast<const int8_t*>(y),
                                               static_cast<const int8_t*>(ref), n, acc);
      break;
  }
  CheckAccum h{};
  cudaMemcpyAsync(&h, acc, sizeof(h), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  CheckResult r;
  r.rel_l2 = h.ref2 > 0 ? std::sqrt(h.diff2 / h.ref2) : (h.diff2 > 0 ? INFINITY : 0.0);
  r.nonfinite = int64_t(h.nonfinite);
  r.mismatches = int64_t(h.mismatches);
  r.max_abs_diff = int64_t(h.max_abs);
  return r;
}

void apply_epilogue(const ConvProblem& p, void* y, const void* bias, const void* residual,
                    cudaStream_t stream) {
  if (p.epilogue == Epilogue::kNone) return;
  const int64_t n = p.shape.y_elems();
  const int g = grid_for(n);
  if (p.precision == Precision::kFP16) {
    epilogue_kernel<<<g, 256, 0, stream>>>(
        static_cast<__half*>(y), static_cast<const __half*>(bias),
        static_cast<const __half*>(residual), n, p.shape.k, p.epilogue);
  } else if (p.precision == Precision::kTF32) {
    epilogue_kernel<<<g, 256, 0, stream>>>(static_cast<float*>(y), static_cast<const float*>(bias),
                                           static_cast<const float*>(residual), n, p.shape.k,
                                           p.epilogue);
  }
}

namespace {
__global__ void scale_floats_kernel(const float* src, float* dst, int n, float s) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] * s;
}
}  // namespace

void scale_floats(const float* src, float* dst, int n, float s, cudaStream_t stream) {
  if (n > 0) scale_floats_kernel<<<(n + 255) / 256, 256, 0, stream>>>(src, dst, n, s);
}

}  // namespace kiln::cuda
