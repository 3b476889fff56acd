// The math of kiln.ElementwiseChain's steps, in one place for both of its GPU kernels: the
// interpreter in layers/elementwise.cu includes this file, and the generated kernels
// (generate_source in the same file) hand its text to NVRTC, so a step computes the same expression
// either way. No includes and no namespace: it is included inside kiln::gpu::ew, and NVRTC
// compiles it without headers. C is the compute type (float, or double for float64).
//
// KILN_EW_STEP_LIST(X) lists every step as X(code, expression of x, y, z), where x, y and z are
// the step's operands, p0 and p1 its float parameters, has_lo / has_hi whether Clip's bounds
// are present, and Fast whether the result is stored as a 16-bit float (exp may then use the
// hardware approximation: a few float ulps, far below a float16 ulp).
#pragma once

template <typename C>
__device__ __forceinline__ C softplus(C x) {
  return x > C(0) ? x + log1p(exp(-x)) : log1p(exp(x));
}
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }
__device__ __forceinline__ double fast_exp(double x) { return exp(x); }
template <typename C>
__device__ __forceinline__ C sigmoid(C x) {
  if (x >= C(0)) return C(1) / (C(1) + exp(-x));
  const C e = exp(x);  // no overflow for very negative x
  return e / (C(1) + e);
}
template <typename C>
__device__ __forceinline__ C clamp01(C y) {
  return y < C(0) ? C(0) : (y > C(1) ? C(1) : y);
}
template <typename C>
__device__ __forceinline__ C celu(C x, C alpha) {
  const C neg = alpha * expm1(x / alpha);
  return (x > C(0) ? x : C(0)) + (neg < C(0) ? neg : C(0));
}
template <typename C>
__device__ __forceinline__ C mod(C a, C b, bool c_fmod) {
  C r = fmod(a, b);
  if (!c_fmod && r != C(0) && ((r < C(0)) != (b < C(0)))) r += b;  // Python's sign rule
  return r;
}
template <typename C>
__device__ __forceinline__ C clip(C x, C lo, C hi, bool has_lo, bool has_hi) {
  if (has_lo && x < lo) x = lo;  // NaN passes both comparisons; min > max gives max
  if (has_hi && x > hi) x = hi;
  return x;
}

#define KILN_EW_STEP_LIST(X) \
  X(kIdentity, x) \
  X(kAbs, fabs(x)) \
  X(kNeg, -x) \
  X(kExp, Fast ? fast_exp(x) : exp(x)) \
  X(kLog, log(x)) \
  X(kSqrt, sqrt(x)) \
  X(kRecip, C(1) / x) \
  X(kFloor, floor(x)) \
  X(kCeil, ceil(x)) \
  X(kRound, rint(x)) /* half to even */ \
  X(kSign, isnan(x) ? x : (x > C(0) ? C(1) : (x < C(0) ? C(-1) : C(0)))) \
  X(kSin, sin(x)) \
  X(kCos, cos(x)) \
  X(kTan, tan(x)) \
  X(kAsin, asin(x)) \
  X(kAcos, acos(x)) \
  X(kAtan, atan(x)) \
  X(kSinh, sinh(x)) \
  X(kCosh, cosh(x)) \
  X(kAsinh, asinh(x)) \
  X(kAcosh, acosh(x)) \
  X(kAtanh, atanh(x)) \
  X(kErf, erf(x)) \
  X(kRelu, x < C(0) ? C(0) : x) \
  X(kLeakyRelu, x < C(0) ? p0 * x : x) \
  X(kSigmoid, Fast ? C(1) / (C(1) + fast_exp(-x)) : sigmoid(x)) \
  X(kTanh, tanh(x)) \
  X(kElu, x < C(0) ? p0 * expm1(x) : x) \
  X(kSelu, x > C(0) ? p1 * x : p1 * (p0 * exp(x) - p0)) \
  X(kCelu, celu(x, p0)) \
  X(kHardSigmoid, clamp01(p0 * x + p1)) \
  X(kHardSwish, x * clamp01(x / C(6) + C(0.5))) \
  X(kSoftplus, softplus(x)) \
  X(kSoftsign, x / (C(1) + fabs(x))) \
  X(kGelu, C(0.5) * x * (C(1) + erf(x * C(0.7071067811865476)))) \
  X(kGeluTanh, C(0.5) * x * (C(1) + tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x)))) \
  X(kThresholdedRelu, x > p0 ? x : C(0)) \
  X(kShrink, x < -p0 ? x + p1 : (x > p0 ? x - p1 : C(0))) \
  X(kMish, x * tanh(softplus(x))) \
  X(kSwish, Fast ? x / (C(1) + fast_exp(-p0 * x)) : x * sigmoid(p0 * x)) \
  X(kAdd, x + y) \
  X(kSub, x - y) \
  X(kMul, x * y) \
  X(kDiv, x / y) \
  X(kMod, mod(x, y, p0 != C(0))) \
  X(kPow, pow(x, y)) \
  X(kMax, isnan(x) || isnan(y) ? x + y /* NaN */ : (x < y ? y : x)) \
  X(kMin, isnan(x) || isnan(y) ? x + y /* NaN */ : (y < x ? y : x)) \
  X(kPRelu, x < C(0) ? y * x : x) \
  X(kClip, clip(x, y, z, has_lo, has_hi)) \
  X(kDivN, x / p0)
