// A kiln.FusedConv's post steps (ops/fused.h; cuda::PostStep) as a pass over its output, in
// place: for the tactics whose library epilogue stops at the activation (cuBLASLt's 1x1). Each
// element goes through the steps in float32 and is stored once; 16-byte vectors where the
// output is aligned and a whole number of them, one element a thread otherwise. The steps are a
// kernel parameter (at most kMaxPostSteps), interpreted: the pass is memory-bound.
#include <algorithm>
#include <vector>

#include "kernels/device_util.cuh"
#include "layer.h"
#include "tactics/conv_tactic.h"

namespace kiln::gpu {
namespace {

struct PostProgram {
  int n = 0;
  cuda::PostOp op[cuda::kMaxPostSteps];
  float value[cuda::kMaxPostSteps];
};

__device__ __forceinline__ float post_apply(const PostProgram& p, float y) {
  using cuda::PostOp;
#pragma unroll 1
  for (int i = 0; i < p.n; ++i) {
    const float c = p.value[i];
    switch (p.op[i]) {
      case PostOp::kAdd: y += c; break;
      case PostOp::kSub: y -= c; break;
      case PostOp::kMul: y *= c; break;
      case PostOp::kDiv: y /= c; break;
      case PostOp::kPow: y = c == 2.f ? y * y : powf(y, c); break;
      case PostOp::kMax: y = fmaxf(y, c); break;
      case PostOp::kMin: y = fminf(y, c); break;
      case PostOp::kRelu: y = fmaxf(y, 0.f); break;
      case PostOp::kSigmoid: y = 1.f / (1.f + __expf(-y)); break;
      case PostOp::kTanh: y = tanhf(y); break;
      case PostOp::kNeg: y = -y; break;
      case PostOp::kAbs: y = fabsf(y); break;
      case PostOp::kExp: y = expf(y); break;
      case PostOp::kSqrt: y = sqrtf(y); break;
      case PostOp::kErf: y = erff(y); break;
    }
  }
  return y;
}

template <typename T>
__global__ void post_vec_kernel(T* y, int64_t vectors, const __grid_constant__ PostProgram p) {
  auto* v = reinterpret_cast<Vec16<T>*>(y);
  KILN_GRID_STRIDE(i, vectors) {
    Vec16<T> x = v[i];
#pragma unroll
    for (int j = 0; j < Vec16<T>::kN; ++j) x.v[j] = T(post_apply(p, float(x.v[j])));
    v[i] = x;
  }
}

template <typename T>
__global__ void post_kernel(T* y, int64_t n, const __grid_constant__ PostProgram p) {
  KILN_GRID_STRIDE(i, n) y[i] = T(post_apply(p, float(y[i])));
}

}  // namespace

Status launch_post_steps(void* y, int64_t n, DataType dtype,
                         const std::vector<cuda::PostStep>& steps, cudaStream_t stream) {
  if (steps.size() > size_t(cuda::kMaxPostSteps))
    return KILN_ERROR("{} post steps, at most {}", steps.size(), cuda::kMaxPostSteps);
  PostProgram p;
  p.n = static_cast<int>(steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    p.op[i] = steps[i].op;
    p.value[i] = steps[i].value;
  }
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    T* t = static_cast<T*>(y);
    constexpr int kN = Vec16<T>::kN;
    if (reinterpret_cast<uintptr_t>(y) % 16 == 0 && n % kN == 0)
      post_vec_kernel<T><<<grid_for(n / kN), kBlock, 0, stream>>>(t, n / kN, p);
    else
      post_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(t, n, p);
  };
  if (dtype == DataType::kFloat16)
    launch(__half{});
  else if (dtype == DataType::kFloat32)
    launch(float{});
  else
    return KILN_ERROR("post steps on {} output", dtype_name(dtype));
  return cuda_check(cudaGetLastError(), "post steps");
}

}  // namespace kiln::gpu
