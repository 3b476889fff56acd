// Elementwise family, float part, and the family table. Every float op of the family (unary math,
// activations, Add Sub Mul Div Mod Pow, variadic Max Min Sum Mean, Clip, PRelu) and
// kiln.ElementwiseChain runs as a small program of steps over its inputs, evaluated per element
// by one kernel in float (double for float64). Bool outputs, integer math, Where and Cast are in
// elementwise_ops.cu. The spec is the CPU's: src/ops/elementwise*.cpp, activation.cpp,
// fused_chain.cpp (same NaN rules, same expression forms).
//
// Speed: a step is dispatched once per V elements (16 bytes of output); operands that move along
// the innermost dim are read with vector loads, per-channel and scalar operands once per vector.
// A chain's absorbed concatenation (concat_parts) is input 0, read from its parts in place: each
// element finds its part by a binary search over the parts' starts along the axis. An input the
// chain reads as a column range (col_slices: a part of a packed GEMM's result) is addressed from
// its first column with its rows' stored length as the outer stride.
// Tactics are kAnyLayout; the ".nhwc" variants also take NHWC per-channel broadcasts and Clip.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "core/half_range.h"
#include "kernels/device_util.cuh"
#include "kernels/fast_div.cuh"
#include "kernels/pdl.cuh"
#include "rtc.h"
#include "tactics.h"

namespace kiln::gpu {
namespace ew {

// elementwise_ops.cu: everything that is not a float program.
bool typed_supports(const LayerDesc& d, std::string* why);
Expected<std::unique_ptr<Layer>> create_typed(const LayerDesc& d);
bool cast_low_bit_supports(const LayerDesc& d, std::string* why);  // cast_low_bit.cu
Expected<std::unique_ptr<Layer>> create_cast_low_bit(const LayerDesc& d);
bool rotary_supports(const LayerDesc& d, std::string* why);  // rotary.cu
Expected<std::unique_ptr<Layer>> create_rotary(const LayerDesc& d);

// elementwise_ops.cu: operand strides over an output (numpy broadcasting, layouts, merged dims).
void broadcast_plan(const std::vector<std::vector<int64_t>>& shapes, const std::vector<bool>& nhwc,
                    const std::vector<int64_t>& out, bool out_nhwc, std::vector<int64_t>* dims,
                    std::vector<std::vector<int64_t>>* strides,
                    const std::vector<int64_t>* row_len = nullptr);
// row_len: per operand, 0 or the stored length of its rows when it is a column range of wider
// rows (a chain's col_slices; the operand's address is then its first column's).

namespace {

// --- the program ------------------------------------------------------------------------------
enum Op : uint8_t {
  kIdentity, kAbs, kNeg, kExp, kLog, kSqrt, kRecip, kFloor, kCeil, kRound, kSign, kSin, kCos,
  kTan, kAsin, kAcos, kAtan, kSinh, kCosh, kAsinh, kAcosh, kAtanh, kErf, kRelu, kLeakyRelu,
  kSigmoid, kTanh, kElu, kSelu, kCelu, kHardSigmoid, kHardSwish, kSoftplus, kSoftsign, kGelu,
  kGeluTanh, kThresholdedRelu, kShrink, kMish, kSwish,
  kAdd, kSub, kMul, kDiv, kMod, kPow, kMax, kMin, kPRelu,  // binary
  kClip,                                                   // x, lo?, hi?
  kDivN,                                                   // x / p0 (Mean)
};

constexpr int kMaxIn = 16, kMaxSteps = 32, kMaxParts = 64;
// Operand codes besides input indices: the running value, an absent optional input, and an
// immediate (a scalar constant held in the step, Step::imm: it costs no load and no input slot).
constexpr int8_t kCur = -1, kAbsent = -2, kImm = -3;

struct Step {
  uint8_t op = kIdentity;
  int8_t opd[3] = {kCur, kCur, kCur};
  float p0 = 0, p1 = 0;
  float imm[3] = {};  // operand i's value where opd[i] == kImm
};

// Everything a launch needs, by value (about 1.7 KB of kernel parameters; kernels take it as
// __grid_constant__ so that indexing it does not copy it to local memory).
struct Program {
  int nsteps = 0, nin = 0, rank = 1;
  bool small = true;  // every index fits 32 bits
  Step steps[kMaxSteps];
  const void* in[kMaxIn] = {};
  uint8_t dt[kMaxIn] = {};     // DataType of each input
  bool same[kMaxIn] = {};      // input has the output's type (direct load)
  int64_t dims[kMaxDims] = {};
  FastDiv divs[kMaxDims];  // dims as divisors (the 32-bit index path)
  int64_t strides[kMaxIn][kMaxDims] = {};
  // A concatenation as input 0 (a chain's concat_parts; cparts 0: none): the output seen as
  // [outer, A, cinner] around the concat axis (physical order), part s holding the axis range
  // [cstart[s], cstart[s + 1]) as its own dense [outer, width, cinner] tensor at cptr[s].
  int cparts = 0;
  int64_t cinner = 1;
  int32_t cstart[kMaxParts + 1] = {};
  FastDiv cinner_div, cwidth_div;  // cinner and the concatenated width A as divisors
  const void* cptr[kMaxParts] = {};
};

struct UnaryName {
  const char* name;
  Op op;
};
const UnaryName kUnary[] = {
    {"Abs", kAbs},   {"Neg", kNeg},     {"Exp", kExp},     {"Log", kLog},
    {"Sqrt", kSqrt}, {"Reciprocal", kRecip}, {"Floor", kFloor}, {"Ceil", kCeil},
    {"Round", kRound}, {"Sign", kSign}, {"Sin", kSin},     {"Cos", kCos},
    {"Tan", kTan},   {"Asin", kAsin},   {"Acos", kAcos},   {"Atan", kAtan},
    {"Sinh", kSinh}, {"Cosh", kCosh},   {"Asinh", kAsinh}, {"Acosh", kAcosh},
    {"Atanh", kAtanh}, {"Erf", kErf},   {"Relu", kRelu},   {"LeakyRelu", kLeakyRelu},
    {"Sigmoid", kSigmoid}, {"Tanh", kTanh}, {"Elu", kElu}, {"Selu", kSelu},
    {"Celu", kCelu}, {"HardSigmoid", kHardSigmoid}, {"HardSwish", kHardSwish},
    {"Softplus", kSoftplus}, {"Softsign", kSoftsign}, {"Gelu", kGelu},
    {"ThresholdedRelu", kThresholdedRelu}, {"Shrink", kShrink}, {"Mish", kMish},
    {"Swish", kSwish},
};
const UnaryName kBinary[] = {
    {"Add", kAdd}, {"Sub", kSub}, {"Mul", kMul}, {"Div", kDiv}, {"Mod", kMod},
    {"Pow", kPow}, {"Max", kMax}, {"Min", kMin}, {"PRelu", kPRelu},
};
constexpr const char* kLegacyAxisAttr = "kiln_broadcast_axis";
constexpr const char* kChannelSlopeAttr = "kiln_prelu_channel_slope";

// The step of `op` with its attributes (named `prefix` + ONNX name). False for an op that is
// not a float step.
bool make_step(const std::string& op, const Attributes& a, const std::string& pre, Step* st) {
  auto f = [&](const char* name, float def) { return a.get_float(pre + name, def); };
  st->op = 255;
  for (const auto& u : kUnary)
    if (op == u.name) st->op = u.op;
  for (const auto& b : kBinary)
    if (op == b.name) st->op = b.op;
  if (op == "Clip") st->op = kClip;
  switch (st->op) {
    case 255: return false;
    case kLeakyRelu: st->p0 = f("alpha", 0.01f); break;
    case kElu: case kCelu: case kThresholdedRelu: st->p0 = f("alpha", 1.0f); break;
    case kSelu:
      st->p0 = f("alpha", 1.67326319217681884765625f);
      st->p1 = f("gamma", 1.05070102214813232421875f);
      break;
    case kHardSigmoid: st->p0 = f("alpha", 0.2f); st->p1 = f("beta", 0.5f); break;
    case kShrink: st->p0 = f("lambd", 0.5f); st->p1 = f("bias", 0.0f); break;
    case kSwish: st->p0 = f("alpha", 1.0f); break;
    case kGelu:
      if (a.get_string(pre + "approximate", "none") == "tanh") st->op = kGeluTanh;
      break;
    case kMod: st->p0 = a.get_int(pre + "fmod", 0) != 0 ? 1.f : 0.f; break;
    default: break;
  }
  return true;
}

bool is_unary_op(const std::string& op) {
  for (const auto& u : kUnary)
    if (op == u.name) return true;
  return false;
}

// --- device side ------------------------------------------------------------------------------
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename C>
__device__ __forceinline__ C load_any(const void* p, uint8_t dt, int64_t i) {
  switch (static_cast<DataType>(dt)) {
    case DataType::kFloat32: return C(static_cast<const float*>(p)[i]);
    case DataType::kFloat64: return C(static_cast<const double*>(p)[i]);
    case DataType::kFloat16: return C(__half2float(static_cast<const __half*>(p)[i]));
    case DataType::kBFloat16: return C(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DataType::kInt8: return C(static_cast<const int8_t*>(p)[i]);
    case DataType::kUInt8: return C(static_cast<const uint8_t*>(p)[i]);
    case DataType::kInt16: return C(static_cast<const int16_t*>(p)[i]);
    case DataType::kUInt16: return C(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt32: return C(static_cast<const int32_t*>(p)[i]);
    case DataType::kUInt32: return C(static_cast<const uint32_t*>(p)[i]);
    case DataType::kInt64: return C(static_cast<const int64_t*>(p)[i]);
    case DataType::kUInt64: return C(static_cast<const uint64_t*>(p)[i]);
    case DataType::kBool: return C(static_cast<const bool*>(p)[i] ? 1 : 0);
    default: return C(0);
  }
}

// Operand `o` of a step for element e: an input's value (selected without indexing a register
// array), an immediate, or the running value.
template <typename C, int NIN, int V>
__device__ __forceinline__ C pick(const C (&v)[NIN][V], const C (&cur)[V], int o, int e,
                                  float imm) {
  if (o == kImm) return C(imm);
  if (o < 0) return cur[e];
  C r = v[0][e];
#pragma unroll
  for (int k = 1; k < NIN; ++k)
    if (o == k) r = v[k][e];
  return r;
}

#include "kernels/ew_math.cuh"  // the steps' math, shared with the generated kernels

// One step over V elements: cur = op(x, y, z), the operands picked per element (element e
// reads only cur[e], so it is updated in place). One dispatch per step serves all V elements.
#define KILN_CASE(code, expr)                       \
  case code:                                        \
    _Pragma("unroll") for (int e = 0; e < V; ++e) { \
      const C x = pick(v, cur, o0, e, s.imm[0]);    \
      const C y = pick(v, cur, o1, e, s.imm[1]);    \
      const C z = pick(v, cur, o2, e, s.imm[2]);    \
      (void)y;                                      \
      (void)z;                                      \
      cur[e] = (expr);                              \
    }                                               \
    break;

// Fast: the result is stored as a 16-bit float, so exp may use the hardware approximation (a few
// float ulps, far below a float16 ulp).
template <bool Fast, typename C, int NIN, int V>
__device__ __forceinline__ void apply(const Step& s, const C (&v)[NIN][V], C (&cur)[V]) {
  const C p0 = C(s.p0), p1 = C(s.p1);
  const int o0 = s.opd[0], o1 = s.opd[1], o2 = s.opd[2];
  const bool has_lo = o1 != kAbsent, has_hi = o2 != kAbsent;
  switch (s.op) {
    KILN_EW_STEP_LIST(KILN_CASE)
  }
}
#undef KILN_CASE

// Runs the program on V elements; v[k][e] is input k's value for element e.
template <bool Fast, typename C, int NIN, int V>
__device__ __forceinline__ void eval(const Program& p, const C (&v)[NIN][V], C (&cur)[V]) {
#pragma unroll
  for (int e = 0; e < V; ++e) cur[e] = v[0][e];
  for (int s = 0; s < p.nsteps; ++s) apply<Fast>(p.steps[s], v, cur);
}

// Element offsets of every input for output element i.
template <int NIN>
__device__ __forceinline__ void offsets(const Program& p, int64_t i, int64_t (&off)[NIN]) {
  if (p.rank == 1) {
#pragma unroll
    for (int k = 0; k < NIN; ++k) off[k] = i * p.strides[k][0];
    return;
  }
#pragma unroll
  for (int k = 0; k < NIN; ++k) off[k] = 0;
  if (p.small) {  // 32-bit indices: a multiply-high per division (kernels/fast_div.cuh)
    uint32_t r = static_cast<uint32_t>(i);
    for (int d = p.rank - 1; d > 0; --d) {
      const uint32_t q = p.divs[d].div(r);
      const uint32_t c = r - q * static_cast<uint32_t>(p.dims[d]);
      r = q;
#pragma unroll
      for (int k = 0; k < NIN; ++k) off[k] += int64_t(c) * p.strides[k][d];
    }
#pragma unroll
    for (int k = 0; k < NIN; ++k) off[k] += int64_t(r) * p.strides[k][0];
    return;
  }
  for (int d = p.rank - 1; d > 0; --d) {
    const int64_t c = i % p.dims[d];
    i /= p.dims[d];
#pragma unroll
    for (int k = 0; k < NIN; ++k) off[k] += c * p.strides[k][d];
  }
#pragma unroll
  for (int k = 0; k < NIN; ++k) off[k] += i * p.strides[k][0];
}

// The address of output element i's value in the concatenation's part that holds it.
template <typename T>
__device__ __forceinline__ const T* concat_at(const Program& p, int64_t i) {
  const int64_t A = p.cstart[p.cparts];
  int64_t o, a, in;
  if (p.small) {  // 32-bit indices: a multiply-high per division (kernels/fast_div.cuh)
    const uint32_t t = p.cinner_div.div(static_cast<uint32_t>(i));
    in = static_cast<uint32_t>(i) - t * static_cast<uint32_t>(p.cinner);
    o = p.cwidth_div.div(t);
    a = t - static_cast<uint32_t>(o) * static_cast<uint32_t>(A);
  } else {
    const int64_t t = i / p.cinner;
    in = i - t * p.cinner;
    o = t / A;
    a = t - o * A;
  }
  int lo = 0, hi = p.cparts - 1;  // the last part starting at or before a
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.cstart[mid] <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int64_t width = p.cstart[lo + 1] - p.cstart[lo];
  return static_cast<const T*>(p.cptr[lo]) + (o * width + (a - p.cstart[lo])) * p.cinner + in;
}

template <typename T, int NIN>
__device__ __forceinline__ Compute<T> load_in(const Program& p, int k, int64_t off) {
  if (p.same[k]) return load(static_cast<const T*>(p.in[k]), off);
  return load_any<Compute<T>>(p.in[k], p.dt[k], off);
}

// General case: broadcasting, mixed input types, unaligned data.
template <typename T, int NIN>
__global__ void program_kernel(const __grid_constant__ Program p, T* y, int64_t n) {
  using C = Compute<T>;
  pdl_wait();  // kernels/pdl.cuh
  pdl_launch_dependents();
  KILN_GRID_STRIDE(i, n) {
    int64_t off[NIN];
    offsets(p, i, off);
    C v[NIN][1], r[1];
#pragma unroll
    for (int k = 0; k < NIN; ++k)
      v[k][0] = k < p.nin && !(k == 0 && p.cparts) ? load_in<T, NIN>(p, k, off[k]) : C(0);
    if (p.cparts) v[0][0] = load(concat_at<T>(p, i), 0);  // parts have the output's type
    eval<sizeof(T) == 2>(p, v, r);
    store(y, i, r[0]);
  }
}

// Fast case (see ProgramLayer::vec_ok_): a thread handles V consecutive output elements, which
// share their outer coordinates. Inputs that move along the innermost dim are read with one
// vector load; inputs that do not (per-channel, scalars) with one load broadcast to all V.
template <typename T, int NIN, int V>
__global__ void __launch_bounds__(kBlock, 4) program_vec_kernel(const __grid_constant__ Program p, T* y, int64_t n) {
  using C = Compute<T>;
  using P = Pack<T, V>;
  const int64_t nv = n / V;
  pdl_wait();  // kernels/pdl.cuh
  pdl_launch_dependents();
  KILN_GRID_STRIDE(j, nv) {
    int64_t off[NIN];
    offsets(p, j * V, off);
    C v[NIN][V], r[V];
#pragma unroll
    for (int k = 0; k < NIN; ++k) {
      const T* src = static_cast<const T*>(p.in[k]);
      if (k == 0 && p.cparts) {  // a V-run lies in one part (ProgramLayer::configure)
        const P x = *reinterpret_cast<const P*>(concat_at<T>(p, j * V));
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = load(x.v, e);
      } else if (k < p.nin && p.strides[k][p.rank - 1] != 0) {
        const P x = *reinterpret_cast<const P*>(src + off[k]);
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = load(x.v, e);
      } else {
        const C b = k < p.nin ? load(src, off[k]) : C(0);
#pragma unroll
        for (int e = 0; e < V; ++e) v[k][e] = b;
      }
    }
    eval<sizeof(T) == 2>(p, v, r);
    P out;
#pragma unroll
    for (int e = 0; e < V; ++e) store(out.v, e, r[e]);
    reinterpret_cast<P*>(y)[j] = out;
  }
  KILN_GRID_STRIDE(t, n - nv * V) {  // the tail of a 1-D walk
    const int64_t i = nv * V + t;
    int64_t off[NIN];
    offsets(p, i, off);
    C v[NIN][1], r[1];
#pragma unroll
    for (int k = 0; k < NIN; ++k)
      v[k][0] =
          k < p.nin && !(k == 0 && p.cparts) ? load(static_cast<const T*>(p.in[k]), off[k]) : C(0);
    if (p.cparts) v[0][0] = load(concat_at<T>(p, i), 0);
    eval<sizeof(T) == 2>(p, v, r);
    store(y, i, r[0]);
  }
}

// --- host side --------------------------------------------------------------------------------
bool is_float_storage(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kFloat64 ||
         t == DataType::kBFloat16;
}

// --- generated kernels (NVRTC, rtc.h) -----------------------------------------------------------
// The tactics "ew.*.gen" write one kernel per layer (a chain, or a lone Add/Sub/Mul/Div): its
// steps as straight-line code (the expressions of kernels/ew_math.cuh with the operands,
// parameters and immediates in place), its inputs' loads unrolled, the vector path and a scalar
// tail only. Shapes stay run-time values, so one kernel serves every shape of a dynamic profile.
// Its parameters are one array of 64-bit words laid out as GenWords says, filled by
// ProgramLayer::run_generated. Where the vector path does not apply (odd inner sizes, mixed
// input types, unaligned data, indices beyond 32 bits) the layer runs the interpreter kernels.
const char* const kEwMathText =
#include "ew_math_text.inc"
    ;

struct StepExpr {
  Op op;
  const char* expr;
};
#define KILN_EXPR(code, expr) {code, #expr},
const StepExpr kStepExprs[] = {KILN_EW_STEP_LIST(KILN_EXPR)};
#undef KILN_EXPR

// Where each value sits in the generated kernel's parameter words.
struct GenWords {
  int nin = 1, parts = 0;
  static constexpr int kN = 0, kRank = 1, kY = 2, kDims = 3, kDivs = kDims + kMaxDims;
  // Input k: its address, whether it moves along the innermost dim (vector loads), its strides.
  constexpr int input(int k) const { return kDivs + kMaxDims + k * (2 + kMaxDims); }
  // A concatenation: cinner, cinner_div, cwidth_div, its width A, the parts' starts and addresses.
  constexpr int concat() const { return input(nin); }
  constexpr int count() const { return concat() + (parts ? 4 + 2 * parts + 1 : 0); }
};

int64_t pack_div(const FastDiv& f) { return int64_t(f.m) | int64_t(f.s) << 32; }

std::string float_literal(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return fmt::format("__int_as_float(0x{:08x})", bits);
}

// The kernel source of program `p` (after inline_scalar_constants) storing type `t`.
std::string generate_source(const Program& p, DataType t) {
  const bool f32 = t == DataType::kFloat32;
  const int V = f32 ? 4 : 8;
  const GenWords w{p.nin, p.cparts};
  std::string s;
  s += "// kiln generated elementwise chain (layers/elementwise.cu, generate_source)\n";
  s += "typedef long long i64;\ntypedef unsigned int u32;\ntypedef unsigned short u16;\n";
  s += "typedef float C;\n";
  s += fmt::format("constexpr bool Fast = {};\n", f32 ? "false" : "true");
  s += kEwMathText;
  s += fmt::format("\nstruct Args {{ i64 w[{}]; }};\n", w.count());
  s += "__device__ __forceinline__ u32 fdiv(u32 n, i64 w) { return (__umulhi(n, u32(w)) + n) >> "
       "u32(w >> 32); }\n";
  if (f32) {
    s += "typedef float S;\n__device__ __forceinline__ float ld(float x) { return x; }\n"
         "__device__ __forceinline__ float st(float x) { return x; }\n";
  } else if (t == DataType::kFloat16) {
    s += "typedef u16 S;\n__device__ __forceinline__ float ld(u16 h) { float f; "
         "asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n"
         "__device__ __forceinline__ u16 st(float f) { u16 h; "
         "asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
  } else {
    s += "typedef u16 S;\n__device__ __forceinline__ float ld(u16 h) { "
         "return __uint_as_float(u32(h) << 16); }\n"
         "__device__ __forceinline__ u16 st(float f) { u16 h; "
         "asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
  }
  s += fmt::format("constexpr int V = {};\nunion Vec {{ uint4 u; S s[V]; }};\n", V);
  // The chain on one element: v0..v(nin-1) are its inputs' values.
  auto operand = [&](const Step& st, int i) -> std::string {
    const int o = st.opd[i];
    if (o == kImm) return float_literal(st.imm[i]);
    if (o == kAbsent) return "C(0)";
    if (o < 0) return "cur";
    return fmt::format("v{}", o);
  };
  s += "__device__ __forceinline__ C eval_chain(";
  for (int k = 0; k < p.nin; ++k) s += fmt::format("{}const C v{}", k ? ", " : "", k);
  s += ") {\n  C cur = v0;\n";
  for (int i = 0; i < p.nsteps; ++i) {
    const Step& st = p.steps[i];
    const char* expr = nullptr;
    for (const auto& se : kStepExprs)
      if (se.op == st.op) expr = se.expr;
    s += fmt::format(
        "  {{\n    const C x = {}, y = {}, z = {};\n"
        "    const C p0 = {}, p1 = {};\n"
        "    const bool has_lo = {}, has_hi = {};\n"
        "    (void)y; (void)z; (void)p0; (void)p1; (void)has_lo; (void)has_hi;\n"
        "    cur = ({});\n  }}\n",
        operand(st, 0), operand(st, 1), operand(st, 2), float_literal(st.p0), float_literal(st.p1),
        st.opd[1] != kAbsent, st.opd[2] != kAbsent, expr ? expr : "x");
  }
  s += "  return cur;\n}\n";
  auto call = [&](const char* pattern) {
    std::string c = "eval_chain(";
    for (int k = 0; k < p.nin; ++k)
      c += (k ? ", " : "") + fmt::format(fmt::runtime(pattern), k);
    return c + ")";
  };
  s += "extern \"C\" __global__ void __launch_bounds__(256)\n"
       "kiln_ew(const __grid_constant__ Args a) {\n"
       "  asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
       "  asm volatile(\"griddepcontrol.launch_dependents;\" :::);\n";
  s += fmt::format("  const i64 n = a.w[{}], nv = n / V;\n  const int rank = int(a.w[{}]);\n", w.kN,
                   w.kRank);
  s += "  for (i64 j = i64(blockIdx.x) * 256 + threadIdx.x; j < nv; j += i64(gridDim.x) * 256) {\n";
  s += "    const u32 i = u32(j) * V;\n";
  const int first = p.cparts ? 1 : 0;  // input 0 of a concatenation is read from its parts
  for (int k = first; k < p.nin; ++k) s += fmt::format("    i64 o{} = 0;\n", k);
  s += "    u32 r = i;\n#pragma unroll\n";
  s += fmt::format("    for (int d = {}; d > 0; --d) {{\n      if (d < rank) {{\n", kMaxDims - 1);
  s += fmt::format("        const u32 q = fdiv(r, a.w[{} + d]);\n", w.kDivs);
  s += fmt::format("        const i64 c = i64(r - q * u32(a.w[{} + d]));\n", w.kDims);
  s += "        r = q;\n";
  for (int k = first; k < p.nin; ++k)
    s += fmt::format("        o{} += c * a.w[{} + d];\n", k, w.input(k) + 2);
  s += "      }\n    }\n";
  for (int k = first; k < p.nin; ++k)
    s += fmt::format("    o{} += i64(r) * a.w[{}];\n", k, w.input(k) + 2);
  for (int k = 0; k < p.nin; ++k) {
    s += fmt::format("    float v{}[V];\n    {{\n      Vec t;\n", k);
    if (k == 0 && p.cparts) {
      const int c = w.concat(), P = p.cparts;
      s += fmt::format(
          "      const u32 t0 = fdiv(i, a.w[{c1}]);\n"
          "      const u32 in = i - t0 * u32(a.w[{c0}]);\n"
          "      const u32 o = fdiv(t0, a.w[{c2}]);\n"
          "      const u32 x = t0 - o * u32(a.w[{c3}]);\n"
          "      int s = 0;\n#pragma unroll\n"
          "      for (int q = 1; q < {P}; ++q) s += x >= u32(a.w[{st} + q]);\n"
          "      const i64 s0 = a.w[{st} + s], width = a.w[{st} + 1 + s] - s0;\n"
          "      const S* src = (const S*)a.w[{pt} + s] + (i64(o) * width + (i64(x) - s0)) * "
          "a.w[{c0}] + in;\n"
          "      t.u = *(const uint4*)src;\n",
          fmt::arg("c0", c), fmt::arg("c1", c + 1), fmt::arg("c2", c + 2), fmt::arg("c3", c + 3),
          fmt::arg("P", P), fmt::arg("st", c + 4), fmt::arg("pt", c + 5 + P));
    } else {
      s += fmt::format(
          "      const S* src = (const S*)a.w[{0}] + o{1};\n"
          "      if (a.w[{2}]) t.u = *(const uint4*)src;\n"
          "      else {{\n        const S b = *src;\n#pragma unroll\n"
          "        for (int e = 0; e < V; ++e) t.s[e] = b;\n      }}\n",
          w.input(k), k, w.input(k) + 1);
    }
    s += fmt::format("#pragma unroll\n      for (int e = 0; e < V; ++e) v{}[e] = ld(t.s[e]);\n", k);
    s += "    }\n";
  }
  s += "    Vec out;\n#pragma unroll\n";
  s += "    for (int e = 0; e < V; ++e) out.s[e] = st(" + call("v{}[e]") + ");\n";
  s += fmt::format("    *(uint4*)((S*)a.w[{}] + i) = out.u;\n  }}\n", w.kY);
  // The last n % V elements of a 1-D walk (only a 1-D walk has them; never a concatenation's):
  // one element per thread of block 0, each input at i times its stride.
  if (!p.cparts) {
    s += "  if (blockIdx.x == 0 && threadIdx.x < n - nv * V) {\n"
         "    const i64 i = nv * V + threadIdx.x;\n";
    for (int k = 0; k < p.nin; ++k)
      s += fmt::format("    const C t{} = ld(((const S*)a.w[{}])[i * a.w[{}]]);\n", k, w.input(k),
                       w.input(k) + 2);
    s += fmt::format("    ((S*)a.w[{}])[i] = st({});\n  }}\n", w.kY, call("t{}"));
  }
  s += "}\n";
  return s;
}

// The program of a node, and which node input each program input is. False (with a reason)
// when the node is not a float program.
bool build_program(const Node& n, Program* p, std::vector<int>* slots, std::string* why) {
  const std::string& op = n.op_type;
  slots->clear();
  if (n.domain == "kiln") {
    if (op != "ElementwiseChain") return *why = "not an elementwise op", false;
    const auto ops = n.attrs.get_strings("ops");
    const auto arity = n.attrs.get_ints("arity");
    const auto operands = n.attrs.get_ints("operands");
    if (ops.empty() || ops.size() != arity.size())
      return *why = "malformed chain (ops/arity)", false;
    if (ops.size() > kMaxSteps) return *why = fmt::format("more than {} steps", kMaxSteps), false;
    // An absorbed concatenation (concat_parts m): program input 0 reads inputs 0..m-1 as one;
    // node input i >= m is program input i - m + 1.
    const int64_t parts = n.attrs.get_int("concat_parts", 0);
    if (parts != 0 && (parts < 2 || parts > kMaxParts || parts > int64_t(n.num_inputs())))
      return *why = fmt::format("concat_parts {} (2 to {})", parts, kMaxParts), false;
    const int64_t skipped = parts > 0 ? parts - 1 : 0;
    if (int64_t(n.num_inputs()) - skipped > kMaxIn)
      return *why = fmt::format("more than {} inputs", kMaxIn), false;
    size_t k = 0;
    for (size_t s = 0; s < ops.size(); ++s) {
      const std::string pre = "s" + std::to_string(s) + "_";
      Step& st = p->steps[s];
      if (!make_step(ops[s], n.attrs, pre, &st))
        return *why = fmt::format("step {} ({}) has no GPU kernel", s, ops[s]), false;
      if (n.attrs.has(pre + kLegacyAxisAttr) || n.attrs.has(pre + kChannelSlopeAttr))
        return *why = fmt::format("step {} ({}) uses legacy broadcasting", s, ops[s]), false;
      if (arity[s] < 1 || arity[s] > 3) return *why = "a step has more than 3 operands", false;
      for (int64_t i = 0; i < 3; ++i) {
        int64_t o = i < arity[s] ? operands.at(k + i) : kAbsent;
        if (o >= static_cast<int64_t>(n.num_inputs()) || o < kAbsent || (o >= 1 && o < parts))
          return *why = "malformed chain (operands)", false;
        st.opd[i] = static_cast<int8_t>(o >= parts ? o - skipped : o);
      }
      if (st.opd[0] == kAbsent) return *why = "a step lacks its first operand", false;
      k += static_cast<size_t>(arity[s]);
    }
    if (k != operands.size()) return *why = "malformed chain (operands)", false;
    p->nsteps = static_cast<int>(ops.size());
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      if (!n.input(i)) return *why = "a chain input is absent", false;
      if (i == 0 || int64_t(i) >= parts) slots->push_back(static_cast<int>(i));
    }
    p->nin = static_cast<int>(slots->size());
    p->cparts = static_cast<int>(parts);
    const auto cs = n.attrs.get_ints("col_slices");
    if (!cs.empty()) {
      if (cs.size() != 2 * n.num_inputs()) return *why = "malformed chain (col_slices)", false;
      for (size_t i = 0; i < n.num_inputs(); ++i)
        if (cs[2 * i + 1] > 0 && (int64_t(i) < parts || cs[2 * i] < 0))
          return *why = "malformed chain (col_slices)", false;
    }
    return true;
  }
  if (!n.domain.empty()) return *why = "not an elementwise op", false;
  // Program inputs are the present node inputs; absent ones become kAbsent operands.
  std::vector<int8_t> index(n.num_inputs(), kAbsent);
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    if (!n.input(i)) continue;
    index[i] = static_cast<int8_t>(slots->size());
    slots->push_back(static_cast<int>(i));
  }
  if (slots->empty() || index[0] == kAbsent) return *why = "input 0 is absent", false;
  if (slots->size() > kMaxIn) return *why = fmt::format("more than {} inputs", kMaxIn), false;
  p->nin = static_cast<int>(slots->size());
  const bool variadic = op == "Max" || op == "Min" || op == "Sum" || op == "Mean";
  if (variadic) {
    const Op code = op == "Max" ? kMax : op == "Min" ? kMin : kAdd;
    if (slots->size() != n.num_inputs()) return *why = "an input is absent", false;
    p->steps[0] = Step{kIdentity, {0, kCur, kCur}};
    int s = 1;
    for (int i = 1; i < p->nin; ++i)
      p->steps[s++] = Step{code, {kCur, static_cast<int8_t>(i), kCur}};
    if (op == "Mean") p->steps[s++] = Step{kDivN, {kCur, kCur, kCur}, static_cast<float>(p->nin)};
    p->nsteps = s;
    return true;
  }
  Step st;
  if (!make_step(op, n.attrs, "", &st)) return *why = "not a float elementwise op", false;
  st.opd[0] = index[0];
  if (op == "Clip") {
    st.opd[1] = n.num_inputs() > 1 ? index[1] : kAbsent;
    st.opd[2] = n.num_inputs() > 2 ? index[2] : kAbsent;
  } else if (!is_unary_op(op)) {
    if (n.num_inputs() != 2 || index[1] == kAbsent) return *why = "needs two inputs", false;
    st.opd[1] = index[1];
  }
  p->steps[0] = st;
  p->nsteps = 1;
  return true;
}

// Does this node run as a float program at these formats?
bool is_float_program(const LayerDesc& d, std::string* why) {
  if (d.out.empty() || !is_float_storage(d.out[0].dtype))
    return *why = "output is not float", false;
  Program p;
  std::vector<int> slots;
  return build_program(*d.node, &p, &slots, why);
}

class ProgramLayer final : public Layer {
 public:
  // gen: the program's generated kernel (rtc.h), or nullptr to run the interpreter only.
  ProgramLayer(const Node* n, const Program& p, std::vector<int> slots, cudaKernel_t gen = nullptr)
      : node_(n), prog_(p), slots_(std::move(slots)), gen_(gen) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& y = out[0];
    const int64_t V = 16 / static_cast<int64_t>(dtype_size(y.dtype));
    bool concat_vec = true;
    if (prog_.cparts) {
      KILN_ASSIGN_OR_RETURN(concat_vec, plan_concat(in, y, V));
    }
    std::vector<std::vector<int64_t>> shapes;
    std::vector<bool> nhwc;
    const auto cs = node_->attrs.get_ints("col_slices");
    std::vector<int64_t> row_len(slots_.size(), 0);
    col_offset_.assign(slots_.size(), 0);
    for (size_t k = 0; k < slots_.size(); ++k) {
      const int slot = slots_[k];
      const DeviceTensor& t = prog_.cparts && slot == 0 ? y : in[slot];  // the concatenation
      shapes.push_back(operand_shape(slot, t, in[0]));
      nhwc.push_back(t.layout == Layout::kNHWC && t.rank() == 4);
      if (!cs.empty() && cs[2 * slot + 1] > 0) {  // columns [start, start + width) of t's rows
        const int64_t start = cs[2 * slot], width = cs[2 * slot + 1];
        if (t.rank() < 1 || nhwc.back() || start + width > t.shape.back())
          return KILN_ERROR("{}: input {} {} has no columns [{}, {})", node_->label(), slot,
                            shape_str(t.shape), start, start + width);
        row_len[k] = t.shape.back();
        col_offset_[k] = start;
        shapes.back().back() = width;
      }
      if (shapes.back().size() > y.shape.size())
        return KILN_ERROR("{}: input {} has a higher rank than the output", node_->label(), slot);
    }
    std::vector<int64_t> dims;
    std::vector<std::vector<int64_t>> strides;
    broadcast_plan(shapes, nhwc, y.shape, y.layout == Layout::kNHWC && y.rank() == 4, &dims,
                   &strides, &row_len);
    if (dims.size() > static_cast<size_t>(kMaxDims))
      return KILN_ERROR("{}: broadcast needs {} dims, at most {} are supported", node_->label(),
                        dims.size(), kMaxDims);
    n_ = y.numel();
    const int r = static_cast<int>(dims.size());
    prog_.rank = r;
    prog_.small = n_ < (int64_t(1) << 31);
    for (int d = 0; d < r; ++d) {
      prog_.dims[d] = dims[d];
      prog_.divs[d] = FastDiv(dims[d]);
    }
    // The vector path needs V-element runs along the innermost dim (or a 1-D walk, whose tail
    // runs per element), inputs of the output's type, and inner strides of 0 or 1 whose outer
    // strides keep vector loads aligned.
    vec_ok_ = (r == 1 || dims[r - 1] % V == 0) && concat_vec;
    for (size_t k = 0; k < slots_.size(); ++k) {
      const DeviceTensor& t = in[slots_[k]];
      prog_.dt[k] = static_cast<uint8_t>(t.dtype);
      prog_.same[k] = t.dtype == y.dtype;
      vec_ok_ &= prog_.same[k] && (strides[k][r - 1] == 0 || strides[k][r - 1] == 1);
      for (int d = 0; d < r; ++d) {
        prog_.strides[k][d] = strides[k][d];
        if (d < r - 1 && strides[k][r - 1] == 1) vec_ok_ &= strides[k][d] % V == 0;
      }
    }
    return size_t{0};
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (n_ == 0) return Status::Ok();
    Program p = prog_;
    for (size_t k = 0; k < slots_.size(); ++k)
      p.in[k] = static_cast<const char*>(in[slots_[k]].data) +
                col_offset_[k] * static_cast<int64_t>(dtype_size(in[slots_[k]].dtype));
    for (int s = 0; s < p.cparts; ++s) p.cptr[s] = in[static_cast<size_t>(s)].data;
    const int64_t V = 16 / static_cast<int64_t>(dtype_size(out[0].dtype));
    if (gen_ && vec_ok_ && p.small && (!p.cparts || n_ % V == 0) && aligned(p, out[0].data)) {
      KILN_CUDA_CHECK(run_generated(rc, p, out[0].data, V));
      return Status::Ok();
    }
    const bool ok = dispatch_float(out[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      T* y = static_cast<T*>(out[0].data);
      if (p.nin <= 1) launch<T, 1>(rc, p, y);
      else if (p.nin == 2) launch<T, 2>(rc, p, y);
      else if (p.nin <= 4) launch<T, 4>(rc, p, y);
      else if (p.nin <= 8) launch<T, 8>(rc, p, y);
      else launch<T, kMaxIn>(rc, p, y);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(out[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("elementwise program kernel");
    return Status::Ok();
  }

 private:
  // The concatenation's parts (inputs 0..cparts-1) around its axis in the output's physical
  // order: each must be stored as the output is, with its shape but along the axis. Returns
  // whether a V-element run of the output always lies in one part (the vector kernel's need).
  Expected<bool> plan_concat(std::span<const DeviceTensor> in, const DeviceTensor& y, int64_t V) {
    const int64_t r = y.rank();
    int64_t axis = node_->attrs.get_int("concat_axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return KILN_ERROR("{}: concat_axis out of range", node_->label());
    const bool nhwc = y.layout == Layout::kNHWC && r == 4;
    std::vector<int64_t> order(static_cast<size_t>(r));  // logical dim of each physical one
    for (int64_t d = 0; d < r; ++d) order[d] = d;
    if (nhwc) order = {0, 2, 3, 1};
    int64_t inner = 1, pa = 0;
    for (int64_t d = 0; d < r; ++d) {
      if (order[d] == axis) pa = d;
    }
    for (int64_t d = pa + 1; d < r; ++d) inner *= y.shape[order[d]];
    prog_.cinner = std::max<int64_t>(inner, 1);
    int64_t start = 0;
    bool parts_vec = true;
    for (int s = 0; s < prog_.cparts; ++s) {
      const DeviceTensor& t = in[static_cast<size_t>(s)];
      bool same =
          t.rank() == r && t.dtype == y.dtype && (t.layout == Layout::kNHWC && r == 4) == nhwc;
      for (int64_t d = 0; same && d < r; ++d) same = d == axis || t.shape[d] == y.shape[d];
      if (!same)
        return KILN_ERROR("{}: concatenation part {} is not stored as the output is",
                          node_->label(), s);
      prog_.cstart[s] = static_cast<int32_t>(start);
      start += t.shape[axis];
      parts_vec &= t.shape[axis] % V == 0;
    }
    if (start != y.shape[axis] || start > INT32_MAX)
      return KILN_ERROR("{}: the parts do not make the output's axis", node_->label());
    prog_.cstart[prog_.cparts] = static_cast<int32_t>(start);
    prog_.cinner_div = FastDiv(prog_.cinner);
    prog_.cwidth_div = FastDiv(start);
    return inner % V == 0 || (inner == 1 && parts_vec);
  }

  // The shape input `slot` broadcasts with: legacy axis alignment (opset < 7 binary ops) and
  // old PRelu's per-channel slope are applied here, as the CPU op does.
  std::vector<int64_t> operand_shape(int slot, const DeviceTensor& t, const DeviceTensor& x) const {
    std::vector<int64_t> s = t.shape;
    if (slot != 1) return s;
    if (const Attribute* a = node_->attrs.find(kLegacyAxisAttr)) {
      const int64_t axis = a->i < 0 ? a->i + x.rank() : a->i;
      const int64_t trailing = x.rank() - axis - static_cast<int64_t>(s.size());
      if (trailing > 0) s.insert(s.end(), static_cast<size_t>(trailing), 1);
    }
    if (node_->attrs.get_int(kChannelSlopeAttr, 0) != 0 && s.size() == 1 && s[0] > 1 &&
        x.rank() > 2) {
      std::vector<int64_t> c(static_cast<size_t>(x.rank() - 1), 1);
      c[0] = s[0];
      s = c;
    }
    return s;
  }

  // Whether every vector the vector path loads or stores is 16-byte aligned.
  static bool aligned(const Program& p, const void* y) {
    bool a = reinterpret_cast<uintptr_t>(y) % 16 == 0;
    for (int k = 0; k < p.nin; ++k)
      a &= p.strides[k][p.rank - 1] == 0 || reinterpret_cast<uintptr_t>(p.in[k]) % 16 == 0;
    for (int s = 0; s < p.cparts; ++s) a &= reinterpret_cast<uintptr_t>(p.cptr[s]) % 16 == 0;
    return a;
  }

  // The generated kernel's launch: its parameter words (GenWords) from the configured program.
  // V: the output elements in 16 bytes.
  cudaError_t run_generated(const RunContext& rc, const Program& p, void* y, int64_t V) const {
    const GenWords w{p.nin, p.cparts};
    int64_t words[GenWords{kMaxIn, kMaxParts}.count()] = {};
    words[w.kN] = n_;
    words[w.kRank] = p.rank;
    words[w.kY] = reinterpret_cast<int64_t>(y);
    for (int d = 0; d < p.rank; ++d) {
      words[w.kDims + d] = p.dims[d];
      words[w.kDivs + d] = pack_div(p.divs[d]);
    }
    for (int k = 0; k < p.nin; ++k) {
      words[w.input(k)] = reinterpret_cast<int64_t>(p.in[k]);
      words[w.input(k) + 1] = p.strides[k][p.rank - 1] != 0;
      for (int d = 0; d < p.rank; ++d) words[w.input(k) + 2 + d] = p.strides[k][d];
    }
    if (p.cparts) {
      const int c = w.concat();
      words[c] = p.cinner;
      words[c + 1] = pack_div(p.cinner_div);
      words[c + 2] = pack_div(p.cwidth_div);
      words[c + 3] = p.cstart[p.cparts];
      for (int s = 0; s <= p.cparts; ++s) words[c + 4 + s] = p.cstart[s];
      for (int s = 0; s < p.cparts; ++s)
        words[c + 5 + p.cparts + s] = reinterpret_cast<int64_t>(p.cptr[s]);
    }
    void* args[] = {words};
    return launch_kernel(rc, gen_, dim3(grid_for(n_ / V)), dim3(kBlock), 0, args);
  }

  template <typename T, int NIN>
  void launch(const RunContext& rc, const Program& p, T* y) const {
    if constexpr (NIN <= 4) {  // with more inputs the vectors would spill registers
      constexpr int V = 16 / sizeof(T);
      if (vec_ok_ && aligned(p, y)) {
        (void)launch_kernel(rc, program_vec_kernel<T, NIN, V>, dim3(grid_for(n_ / V)),
                            dim3(kBlock), 0, p, y, n_);  // an error stays for the caller's check
        return;
      }
    }
    (void)launch_kernel(rc, program_kernel<T, NIN>, dim3(grid_for(n_)), dim3(kBlock), 0, p, y, n_);
  }

  const Node* node_;
  Program prog_;
  std::vector<int> slots_;  // node input of each program input
  std::vector<int64_t> col_offset_;  // per program input: its first column (col_slices)
  cudaKernel_t gen_ = nullptr;  // the generated kernel, if any (run_generated)
  int64_t n_ = 0;
  bool vec_ok_ = false;     // the vector kernel applies (configure)
};

// --- the tactics ------------------------------------------------------------------------------
bool ew_supports(const LayerDesc& d, std::string* why) {
  std::string not_program;
  if (is_float_program(d, &not_program)) {
    const auto cs = d.node->attrs.get_ints("col_slices");
    for (size_t i = 0; i < d.in.size(); ++i) {
      const DataType t = d.in[i].dtype;
      if (t != DataType::kUndefined && !dispatch_dtype(t, [](auto) {}))
        return *why = fmt::format("input {} has type {}", i, dtype_name(t)), false;
      if (!cs.empty() && cs[2 * i + 1] > 0 && d.in[i].layout == Layout::kNHWC)
        return *why = fmt::format("input {} is a column range, read row-major only", i), false;
    }
    return true;
  }
  if (d.node->domain == "kiln") return *why = not_program, false;
  return typed_supports(d, why);
}

// Scalar constants (one value, stored as float32, float16 or bfloat16) become immediates of the
// steps that read them, rounded as the layer's input would store them, and leave the program's
// inputs: NFNet's gains and a decomposed HardSwish's 3 and 6 cost no load, and a chain keeps to
// the 4 inputs the vector kernel takes. Input 0 (the initial running value, or a concatenation)
// stays.
void inline_scalar_constants(const LayerDesc& d, Program* p, std::vector<int>* slots) {
  std::vector<int> keep = {0};
  std::vector<int8_t> renumber(slots->size(), 0);
  for (size_t k = 1; k < slots->size(); ++k) {
    const int slot = (*slots)[k];
    const Tensor* c = d.in_const(static_cast<size_t>(slot));
    const DataType t =
        static_cast<size_t>(slot) < d.in.size() ? d.in[slot].dtype : DataType::kUndefined;
    const bool scalar =
        c && c->numel() == 1 && dtype_is_float(c->dtype()) &&
        (t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16);
    if (!scalar) {
      renumber[k] = static_cast<int8_t>(keep.size());
      keep.push_back(slot);
      continue;
    }
    // Stored as to_device_format stores a constant (core/half_range.h).
    double v = c->cast(DataType::kFloat64).at_double(0);
    if (t == DataType::kFloat16) v = saturate_to_half_range(v);
    const float value = static_cast<float>(
        Tensor::from<double>({}, {v}).cast(t).cast(DataType::kFloat32).at_double(0));
    renumber[k] = kImm;
    for (int s = 0; s < p->nsteps; ++s)
      for (int i = 0; i < 3; ++i)
        if (p->steps[s].opd[i] == static_cast<int8_t>(k)) p->steps[s].imm[i] = value;
  }
  if (keep.size() == slots->size()) return;
  for (int s = 0; s < p->nsteps; ++s)
    for (int8_t& o : p->steps[s].opd)
      if (o > 0) o = renumber[static_cast<size_t>(o)];
  *slots = std::move(keep);
  p->nin = static_cast<int>(slots->size());
}

Expected<std::unique_ptr<Layer>> ew_create(const LayerDesc& d) {
  std::string why;
  if (d.out.empty() || !is_float_storage(d.out[0].dtype)) return create_typed(d);
  Program p;
  std::vector<int> slots;
  if (!build_program(*d.node, &p, &slots, &why)) {
    if (d.node->domain == "kiln") return KILN_ERROR("{}: {}", d.node->label(), why);
    return create_typed(d);
  }
  inline_scalar_constants(d, &p, &slots);
  return std::unique_ptr<Layer>(new ProgramLayer(d.node, p, std::move(slots)));
}

// The generated tactics: chains, and the binary ops that stand alone between other layers (a
// squeeze-excitation's scale, a residual add), whose inputs all have the output's float type
// (the vector path's need; otherwise the interpreter is all the layer would run). The variant is
// the kernel's key.
bool gen_applies(const LayerDesc& d, std::string* why) {
  const DataType t = d.out.empty() ? DataType::kUndefined : d.out[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16)
    return *why = "generated kernels store float32, float16 or bfloat16", false;
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in[i].present() && d.in[i].dtype != t)
      return *why = fmt::format("input {} is not stored as the output is", i), false;
  if (!rtc::compiler_available(why)) return false;
  return true;
}

// The program and the source of its generated kernel.
Expected<std::pair<Program, std::vector<int>>> gen_program(const LayerDesc& d, std::string* key) {
  std::string why;
  std::pair<Program, std::vector<int>> r;
  if (!build_program(*d.node, &r.first, &r.second, &why))
    return KILN_ERROR("{}: {}", d.node->label(), why);
  inline_scalar_constants(d, &r.first, &r.second);
  *key = rtc::add_source(generate_source(r.first, d.out[0].dtype));
  return r;
}

std::vector<std::string> gen_variants(const LayerDesc& d) {
  std::string key;
  return gen_program(d, &key).ok() ? std::vector<std::string>{key} : std::vector<std::string>{};
}

bool nhwc_supports(const LayerDesc& d, std::string* why);  // below

bool gen_supports(const LayerDesc& d, std::string* why) {
  return gen_applies(d, why) && ew_supports(d, why);
}
bool gen_nhwc_supports(const LayerDesc& d, std::string* why) {
  return gen_applies(d, why) && nhwc_supports(d, why);
}

Expected<std::unique_ptr<Layer>> gen_create(const LayerDesc& d) {
  std::string key;
  KILN_ASSIGN_OR_RETURN(auto prog, gen_program(d, &key));
  // The engine's kernel is the one this kiln generates for the layer (its cubin may come from
  // the engine, compiled where the engine was built).
  if (!d.variant.empty() && d.variant != key)
    return KILN_ERROR("{}: the engine's generated kernel {} is not this kiln's ({})",
                      d.node->label(), d.variant, key);
  KILN_ASSIGN_OR_RETURN(cudaKernel_t k, rtc::kernel(key, "kiln_ew"));
  return std::unique_ptr<Layer>(new ProgramLayer(d.node, prog.first, std::move(prog.second), k));
}

// The NHWC variants take a broadcast that kAnyLayout cannot (per-channel scale/bias, SE gates,
// Clip's scalar bounds): only when the output is NHWC and some input is a [.., C, 1, 1]
// per-channel operand, so that scalar broadcasts (attention scores / sqrt(d)) do not pull
// row-major tensors into NHWC.
bool nhwc_supports(const LayerDesc& d, std::string* why) {
  if (d.out.empty() || d.out[0].layout != Layout::kNHWC)
    return *why = "used only for NHWC outputs", false;
  const TensorType& y = d.out_type(0);
  if (!y.has_rank() || y.rank() != 4 || !(*y.dims)[1].is_static())
    return *why = "needs a 4-D output with a known channel count", false;
  const int64_t C = (*y.dims)[1].value;
  bool per_channel = false;
  for (size_t i = 0; i < d.node->num_inputs(); ++i) {
    const Value* v = d.node->input(i);
    if (!v || !v->type.has_rank() || v->type.dims == y.dims) continue;
    const auto& s = *v->type.dims;
    const size_t r = s.size();
    auto is = [&](size_t back, int64_t want) {  // dim `back` from the right
      return r < back || (s[r - back].is_static() && s[r - back].value == want);
    };
    if (r >= 3 && is(1, 1) && is(2, 1) && is(3, C) && C > 1) per_channel = true;
  }
  // Clip (Relu6) has scalar bounds, which kAnyLayout does not take either.
  bool clip_scalars = d.node->op_type == "Clip" && d.node->input(0) &&
                      d.node->input(0)->type.dims == y.dims;
  for (size_t i = 1; i < d.node->num_inputs() && clip_scalars; ++i) {
    const Value* v = d.node->input(i);
    clip_scalars = !v || (v->type.is_static() && v->type.rank() <= 1 &&
                          (v->type.rank() == 0 || (*v->type.dims)[0].value == 1));
  }
  if (!per_channel && !clip_scalars) return *why = "no per-channel operand", false;
  return ew_supports(d, why);
}

constexpr uint32_t kCaps = kF32 | kF16 | kF64 | kAnyLayout;
constexpr uint32_t kNhwcCaps = kF32 | kF16 | kF64 | kNHWC;
constexpr uint32_t kGenCaps = kF32 | kF16 | kAnyLayout;
constexpr uint32_t kGenNhwcCaps = kF32 | kF16 | kNHWC;

#define KILN_EW(op, name) {"", op, name, kCaps, 0, ew_supports, ew_create}
#define KILN_GEN(op, name)                                                                   \
  {"", op, name, kGenCaps, 0, gen_supports, gen_create, gen_variants},                       \
      {"", op, name ".nhwc", kGenNhwcCaps, 0, gen_nhwc_supports, gen_create, gen_variants}
const TacticDef kTactics[] = {
    KILN_EW("Abs", "ew.abs"), KILN_EW("Neg", "ew.neg"), KILN_EW("Exp", "ew.exp"),
    KILN_EW("Log", "ew.log"), KILN_EW("Sqrt", "ew.sqrt"), KILN_EW("Reciprocal", "ew.reciprocal"),
    KILN_EW("Floor", "ew.floor"), KILN_EW("Ceil", "ew.ceil"), KILN_EW("Round", "ew.round"),
    KILN_EW("Sign", "ew.sign"), KILN_EW("Sin", "ew.sin"), KILN_EW("Cos", "ew.cos"),
    KILN_EW("Tan", "ew.tan"), KILN_EW("Asin", "ew.asin"), KILN_EW("Acos", "ew.acos"),
    KILN_EW("Atan", "ew.atan"), KILN_EW("Sinh", "ew.sinh"), KILN_EW("Cosh", "ew.cosh"),
    KILN_EW("Asinh", "ew.asinh"), KILN_EW("Acosh", "ew.acosh"), KILN_EW("Atanh", "ew.atanh"),
    KILN_EW("Erf", "ew.erf"), KILN_EW("Not", "ew.not"), KILN_EW("IsNaN", "ew.isnan"),
    KILN_EW("IsInf", "ew.isinf"),
    KILN_EW("Relu", "ew.relu"), KILN_EW("LeakyRelu", "ew.leaky_relu"),
    KILN_EW("Sigmoid", "ew.sigmoid"), KILN_EW("Tanh", "ew.tanh"), KILN_EW("Elu", "ew.elu"),
    KILN_EW("Selu", "ew.selu"), KILN_EW("Celu", "ew.celu"),
    KILN_EW("HardSigmoid", "ew.hard_sigmoid"), KILN_EW("HardSwish", "ew.hard_swish"),
    KILN_EW("Softplus", "ew.softplus"), KILN_EW("Softsign", "ew.softsign"),
    KILN_EW("Gelu", "ew.gelu"), KILN_EW("ThresholdedRelu", "ew.thresholded_relu"),
    KILN_EW("Shrink", "ew.shrink"), KILN_EW("Mish", "ew.mish"), KILN_EW("PRelu", "ew.prelu"),
    KILN_EW("Swish", "ew.swish"),
    KILN_EW("Add", "ew.add"), KILN_EW("Sub", "ew.sub"), KILN_EW("Mul", "ew.mul"),
    KILN_EW("Div", "ew.div"), KILN_EW("Mod", "ew.mod"), KILN_EW("Pow", "ew.pow"),
    KILN_EW("Equal", "ew.equal"), KILN_EW("Greater", "ew.greater"),
    KILN_EW("GreaterOrEqual", "ew.greater_or_equal"), KILN_EW("Less", "ew.less"),
    KILN_EW("LessOrEqual", "ew.less_or_equal"), KILN_EW("And", "ew.and"),
    KILN_EW("Or", "ew.or"), KILN_EW("Xor", "ew.xor"), KILN_EW("BitShift", "ew.bitshift"),
    KILN_EW("BitwiseAnd", "ew.bitwise_and"), KILN_EW("BitwiseOr", "ew.bitwise_or"),
    KILN_EW("BitwiseXor", "ew.bitwise_xor"), KILN_EW("BitwiseNot", "ew.bitwise_not"),
    KILN_EW("Max", "ew.max"), KILN_EW("Min", "ew.min"), KILN_EW("Sum", "ew.sum"),
    KILN_EW("Mean", "ew.mean"), KILN_EW("Where", "ew.where"), KILN_EW("Clip", "ew.clip"),
    KILN_EW("Cast", "ew.cast"), KILN_EW("CastLike", "ew.castlike"),
    {"", "Cast", "ew.cast.low_bit", kF32 | kF16 | kF64, 0, cast_low_bit_supports, create_cast_low_bit},
    {"", "CastLike", "ew.castlike.low_bit", kF32 | kF16 | kF64, 0, cast_low_bit_supports,
     create_cast_low_bit},
    {"", "RotaryEmbedding", "ew.rotary", kF32 | kF16, 0, rotary_supports, create_rotary},
    {"kiln", "ElementwiseChain", "ew.chain", kCaps, 0, ew_supports, ew_create},
    // NHWC per-channel broadcasts (see nhwc_supports); after the kAnyLayout ones, so that those
    // win where both apply.
    {"", "Add", "ew.add.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"", "Sub", "ew.sub.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"", "Mul", "ew.mul.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"", "Div", "ew.div.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"", "PRelu", "ew.prelu.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"", "Clip", "ew.clip.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"kiln", "ElementwiseChain", "ew.chain.nhwc", kNhwcCaps, 0, nhwc_supports, ew_create},
    {"kiln", "ElementwiseChain", "ew.chain.gen", kGenCaps, 0, gen_supports, gen_create,
     gen_variants},
    {"kiln", "ElementwiseChain", "ew.chain.gen.nhwc", kGenNhwcCaps, 0, gen_nhwc_supports,
     gen_create, gen_variants},
    KILN_GEN("Add", "ew.add.gen"), KILN_GEN("Sub", "ew.sub.gen"), KILN_GEN("Mul", "ew.mul.gen"),
    KILN_GEN("Div", "ew.div.gen"),
};
#undef KILN_GEN
#undef KILN_EW

}  // namespace
}  // namespace ew

std::span<const TacticDef> elementwise_tactics() { return ew::kTactics; }

}  // namespace kiln::gpu
