// The activations kiln's fused layers apply (ops/fused.h: fused_activation_names()), as one
// device function selected by a small code, with their parameters. Shared by the conv and gemm
// epilogues.
#pragma once

#include <cmath>
#include <string>

#include "ir/graph.h"

namespace kiln::gpu {

enum class Act : int {
  kNone, kRelu, kClip, kSigmoid, kTanh, kLeakyRelu, kHardSwish, kGelu, kGeluTanh, kSwish
};

struct ActParams {
  Act act = Act::kNone;
  float alpha = 0.01f;              // LeakyRelu; Swish's (1 unless given)
  float lo = -INFINITY, hi = INFINITY;  // Clip
};

// From a fused node's `activation` attribute (and its act_* parameters). False when unknown.
inline bool read_activation(const Attributes& a, ActParams* p) {
  const std::string op = a.get_string("activation", "");
  if (op.empty()) p->act = Act::kNone;
  else if (op == "Relu") p->act = Act::kRelu;
  else if (op == "Clip") {
    p->act = Act::kClip;
    p->lo = a.get_float("act_min", -INFINITY);
    p->hi = a.get_float("act_max", INFINITY);
  } else if (op == "Sigmoid") p->act = Act::kSigmoid;
  else if (op == "Tanh") p->act = Act::kTanh;
  else if (op == "LeakyRelu") {
    p->act = Act::kLeakyRelu;
    p->alpha = a.get_float("act_alpha", 0.01f);
  } else if (op == "HardSwish") p->act = Act::kHardSwish;
  else if (op == "Swish") {
    p->act = Act::kSwish;
    p->alpha = a.get_float("act_alpha", 1.0f);
  }
  else if (op == "Gelu")
    p->act = a.get_string("act_approximate", "none") == "tanh" ? Act::kGeluTanh : Act::kGelu;
  else return false;
  return true;
}

// Activation modes compiled into a kernel whose epilogue would otherwise pay apply_act's switch
// per element (kiln's INT8 tile kernels, the pooled stem): none, ReLU, or any other through
// apply_act.
enum PwAct { kPwNone = 0, kPwRelu = 1, kPwAny = 2 };

#ifdef __CUDACC__
template <typename T>
__device__ __forceinline__ T apply_act(T x, const ActParams& p) {
  switch (p.act) {
    case Act::kNone: return x;
    case Act::kRelu: return x > T(0) ? x : T(0);
    case Act::kClip: return x < T(p.lo) ? T(p.lo) : (x > T(p.hi) ? T(p.hi) : x);
    case Act::kSigmoid: return T(1) / (T(1) + exp(-x));
    case Act::kTanh: return tanh(x);
    case Act::kLeakyRelu: return x >= T(0) ? x : T(p.alpha) * x;
    case Act::kHardSwish: {
      const T h = x / T(6) + T(0.5);
      return x * (h < T(0) ? T(0) : (h > T(1) ? T(1) : h));
    }
    case Act::kSwish: return x / (T(1) + exp(-T(p.alpha) * x));
    case Act::kGelu: return T(0.5) * x * (T(1) + erf(x * T(0.70710678118654752440)));
    case Act::kGeluTanh: {
      const T c = T(0.79788456080286535588);  // sqrt(2/pi)
      return T(0.5) * x * (T(1) + tanh(c * (x + T(0.044715) * x * x * x)));
    }
  }
  return x;
}
#endif

}  // namespace kiln::gpu
