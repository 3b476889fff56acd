// Elementwise family, typed part: what does not compute in float. Comparisons (bool out),
// And/Or/Xor/Not, BitShift (unsigned and signed), BitwiseAnd/Or/Xor/Not (gated: not yet run on
// a GPU), IsNaN/IsInf, integer arithmetic with wrap-around (Add Sub Mul, Div
// truncating, Mod with Python or C sign rules, Max/Min, PRelu, Abs Neg Sign Erf Relu Shrink Clip),
// Pow with an integer base, Where and Cast/CastLike. Float ops are programs in elementwise.cu.
// Conversions follow the CPU's cast_value (ops/elementwise_util.h): float -> integer truncates,
// NaN -> 0, saturates beyond 64 bits and otherwise wraps; anything -> bool is != 0.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>

#include "kernels/device_util.cuh"
#include "tactics.h"

namespace kiln::gpu::ew {

// The iteration space of an output and, per operand, its element strides over it: operands are
// numpy-broadcast (right-aligned) to `out`, each in its own layout (NHWC when flagged and 4-D);
// the output is walked in its storage order; contiguous dims are merged.
void broadcast_plan(const std::vector<std::vector<int64_t>>& shapes, const std::vector<bool>& nhwc,
                    const std::vector<int64_t>& out, bool out_nhwc, std::vector<int64_t>* dims,
                    std::vector<std::vector<int64_t>>* strides,
                    const std::vector<int64_t>* row_len = nullptr) {
  const size_t r = out.size();
  std::vector<size_t> order(r);
  for (size_t d = 0; d < r; ++d) order[d] = d;
  if (out_nhwc && r == 4) order = {0, 2, 3, 1};
  dims->assign(r, 1);
  for (size_t d = 0; d < r; ++d) (*dims)[d] = out[order[d]];
  strides->assign(shapes.size(), std::vector<int64_t>(r, 0));
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto& s = shapes[k];
    std::vector<int64_t> ls = row_major_strides(s);
    if (nhwc[k] && s.size() == 4) ls = {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
    if (row_len && (*row_len)[k] > 0 && !s.empty()) {  // a column range of wider rows
      std::vector<int64_t> phys = s;
      phys.back() = (*row_len)[k];
      ls = row_major_strides(phys);
    }
    const size_t lead = r - s.size();
    std::vector<int64_t> logical(r, 0);
    for (size_t d = lead; d < r; ++d) logical[d] = s[d - lead] == 1 ? 0 : ls[d - lead];
    for (size_t d = 0; d < r; ++d) (*strides)[k][d] = logical[order[d]];
  }
  coalesce_dims(*dims, *strides);
  if (dims->empty()) {  // a scalar output
    dims->assign(1, 1);
    for (auto& s : *strides) s.assign(1, 0);
  }
}

namespace {

// Up to three operands broadcast over an output walked in storage order.
struct Bcast {
  int rank = 1;
  bool small = true;
  int64_t dims[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};
  __device__ __forceinline__ void offsets(int64_t i, int64_t (&off)[3]) const {
    off[0] = off[1] = off[2] = 0;
    if (small) {
      uint32_t r = static_cast<uint32_t>(i);
      for (int d = rank - 1; d > 0; --d) {
        const uint32_t n = static_cast<uint32_t>(dims[d]), c = r % n;
        r /= n;
        for (int k = 0; k < 3; ++k) off[k] += int64_t(c) * strides[k][d];
      }
      for (int k = 0; k < 3; ++k) off[k] += int64_t(r) * strides[k][0];
      return;
    }
    for (int d = rank - 1; d > 0; --d) {
      const int64_t c = i % dims[d];
      i /= dims[d];
      for (int k = 0; k < 3; ++k) off[k] += c * strides[k][d];
    }
    for (int k = 0; k < 3; ++k) off[k] += i * strides[k][0];
  }
};

// --- conversions (the CPU's cast_value) ----------------------------------------------------------
template <typename To, typename V>
__device__ __forceinline__ To cast_one(V v) {
  if constexpr (std::is_same_v<To, bool>) {
    return v != V(0);  // NaN -> true
  } else if constexpr (std::is_same_v<V, double> && std::is_integral_v<To>) {
    if (isnan(v)) return To(0);
    const double t = trunc(v);
    constexpr double k2p63 = 9223372036854775808.0, k2p64 = 18446744073709551616.0;
    if constexpr (std::is_same_v<To, uint64_t>) {
      if (t >= k2p64) return std::numeric_limits<To>::max();
      if (t >= 0) return static_cast<uint64_t>(t);
    }
    if (t >= k2p63) return std::numeric_limits<To>::max();
    if (t < -k2p63) return std::numeric_limits<To>::lowest();
    return static_cast<To>(static_cast<int64_t>(t));  // wraps to the target width
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(static_cast<double>(v)));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(static_cast<double>(v)));
  } else {
    return static_cast<To>(v);
  }
}

// Element i of a tensor of type `dt`, converted to To.
template <typename To>
__device__ To cast_from(const void* p, DataType dt, int64_t i) {
  switch (dt) {
    case DataType::kFloat32: return cast_one<To>(double(static_cast<const float*>(p)[i]));
    case DataType::kFloat64: return cast_one<To>(static_cast<const double*>(p)[i]);
    case DataType::kFloat16:
      return cast_one<To>(double(__half2float(static_cast<const __half*>(p)[i])));
    case DataType::kBFloat16:
      return cast_one<To>(double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])));
    case DataType::kInt8: return cast_one<To>(int64_t(static_cast<const int8_t*>(p)[i]));
    case DataType::kInt16: return cast_one<To>(int64_t(static_cast<const int16_t*>(p)[i]));
    case DataType::kInt32: return cast_one<To>(int64_t(static_cast<const int32_t*>(p)[i]));
    case DataType::kInt64: return cast_one<To>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUInt8: return cast_one<To>(uint64_t(static_cast<const uint8_t*>(p)[i]));
    case DataType::kUInt16: return cast_one<To>(uint64_t(static_cast<const uint16_t*>(p)[i]));
    case DataType::kUInt32: return cast_one<To>(uint64_t(static_cast<const uint32_t*>(p)[i]));
    case DataType::kUInt64: return cast_one<To>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kBool: return cast_one<To>(int64_t(static_cast<const bool*>(p)[i] ? 1 : 0));
    default: return cast_one<To>(int64_t(0));
  }
}

template <typename To>
__global__ void cast_kernel(const void* x, DataType from, To* y, int64_t n) {
  KILN_GRID_STRIDE(i, n) { y[i] = cast_from<To>(x, from, i); }
}

// --- integer helpers ---------------------------------------------------------------------------
// Wrapping integer arithmetic (signed overflow would be undefined).
template <typename T>
__device__ __forceinline__ T wrap_add(T a, T b) { return T(uint64_t(a) + uint64_t(b)); }
template <typename T>
__device__ __forceinline__ T wrap_sub(T a, T b) { return T(uint64_t(a) - uint64_t(b)); }
template <typename T>
__device__ __forceinline__ T wrap_mul(T a, T b) { return T(uint64_t(a) * uint64_t(b)); }
template <typename T> constexpr bool is_int_v = std::is_integral_v<T> && !std::is_same_v<T, bool>;
// x < 0 without a pointless comparison for unsigned types.
template <typename T>
__device__ __forceinline__ bool is_neg(T x) {
  if constexpr (std::is_signed_v<T>) return x < T(0);
  else return false;
}

// --- binary ------------------------------------------------------------------------------------
enum BOp : int { bAdd, bSub, bMul, bDiv, bMod, bMax, bMin, bShl, bShr, bPRelu, bAnd, bOr, bXor,
                 bBitAnd, bBitOr, bBitXor, bEq, bGt, bGe, bLt, bLe };

template <typename T>
__device__ __forceinline__ T arith(int op, T a, T b, bool c_fmod) {
  if constexpr (std::is_same_v<T, bool>) {
    return op == bAnd ? (a && b) : op == bOr ? (a || b) : (a != b);
  } else if constexpr (is_int_v<T>) {
    switch (op) {
      case bAdd: return wrap_add(a, b);
      case bSub: return wrap_sub(a, b);
      case bMul: return wrap_mul(a, b);
      case bDiv:  // the CPU refuses a zero divisor; here it gives 0
        if (b == T(0)) return T(0);
        if constexpr (std::is_signed_v<T>) if (b == T(-1)) return wrap_sub(T(0), a);
        return T(a / b);
      case bMod: {
        if (b == T(0)) return T(0);
        if constexpr (std::is_signed_v<T>) {
          if (b == T(-1)) return T(0);
          T r = T(a % b);
          if (!c_fmod && r != 0 && ((r < 0) != (b < 0))) r = T(r + b);
          return r;
        } else {
          return T(a % b);
        }
      }
      case bMax: return a < b ? b : a;
      case bMin: return b < a ? b : a;
      case bShl: case bShr:  // signed: left wraps as unsigned, right is arithmetic
        if (uint64_t(b) >= sizeof(T) * 8) {  // a negative amount too
          if constexpr (std::is_signed_v<T>) if (op == bShr && a < T(0)) return T(-1);
          return T(0);
        }
        if (op == bShl) return T(uint64_t(std::make_unsigned_t<T>(a)) << uint64_t(b));
        return T(a >> b);
      case bPRelu:
        if constexpr (std::is_signed_v<T>) return a < T(0) ? wrap_mul(b, a) : a;
        return a;
      case bBitAnd: return T(a & b);
      case bBitOr: return T(a | b);
      case bBitXor: return T(a ^ b);
    }
    return a;
  } else {
    return a;  // float arithmetic runs in elementwise.cu
  }
}

template <typename C>
__device__ __forceinline__ bool compare(int op, C a, C b) {
  switch (op) {
    case bEq: return a == b;
    case bGt: return a > b;
    case bGe: return a >= b;
    case bLt: return a < b;
    default: return a <= b;
  }
}

template <typename T, bool BoolOut>
__global__ void binary_kernel(const T* a, const T* b, std::conditional_t<BoolOut, bool, T>* y,
                              int64_t n, const __grid_constant__ Bcast ix, int op,
                              bool c_fmod) {
  KILN_GRID_STRIDE(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    if constexpr (BoolOut) y[i] = compare(op, load(a, off[0]), load(b, off[1]));
    else y[i] = arith(op, a[off[0]], b[off[1]], c_fmod);
  }
}

// --- Pow with an integer base (exponent of any numeric type) -----------------------------------
template <typename T>
__device__ T int_pow(T a, int64_t e, bool e_signed) {
  if (e_signed && e < 0) {  // truncation of 1 / a^|e|
    if (a == T(1)) return T(1);
    if constexpr (std::is_signed_v<T>) if (a == T(-1)) return (e % 2 == 0) ? T(1) : T(-1);
    return T(0);
  }
  T result = 1, base = a;
  for (uint64_t u = uint64_t(e); u != 0; u >>= 1) {
    if (u & 1u) result = wrap_mul(result, base);
    base = wrap_mul(base, base);
  }
  return result;
}

template <typename T>
__global__ void pow_kernel(const T* a, const void* e, DataType et, T* y, int64_t n,
                           const __grid_constant__ Bcast ix) {
  const bool e_float = et == DataType::kFloat32 || et == DataType::kFloat64 ||
                       et == DataType::kFloat16 || et == DataType::kBFloat16;
  const bool e_signed = et == DataType::kInt8 || et == DataType::kInt16 ||
                        et == DataType::kInt32 || et == DataType::kInt64;
  KILN_GRID_STRIDE(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    const T x = a[off[0]];
    if (e_float) y[i] = cast_one<T>(pow(double(x), cast_from<double>(e, et, off[1])));
    else if (e_signed) y[i] = int_pow(x, cast_from<int64_t>(e, et, off[1]), true);
    else y[i] = int_pow(x, int64_t(cast_from<uint64_t>(e, et, off[1])), false);
  }
}

// --- Where ---------------------------------------------------------------------------------------
template <typename U>
__global__ void where_kernel(const bool* c, const U* x, const U* yv, U* out, int64_t n,
                             const __grid_constant__ Bcast ix) {
  KILN_GRID_STRIDE(i, n) {
    int64_t off[3];
    ix.offsets(i, off);
    out[i] = c[off[0]] ? x[off[1]] : yv[off[2]];
  }
}

// --- unary -------------------------------------------------------------------------------------
enum UOp : int { uAbs, uNeg, uSign, uErf, uRelu, uShrink, uClip, uNot, uIsNaN, uIsInf, uBitNot };

struct UnaryArgs {
  int op = uAbs;
  float p0 = 0, p1 = 0;       // Shrink: lambd, bias
  bool pos = true, neg = true;  // IsInf
  const void* lo = nullptr;   // Clip bounds (device scalars), nullptr when absent
  const void* hi = nullptr;
  DataType lo_t = DataType::kUndefined, hi_t = DataType::kUndefined;
};

template <typename T>
__device__ __forceinline__ T int_unary(const UnaryArgs& u, T x, T lo, T hi) {
  if constexpr (std::is_same_v<T, bool>) {
    return !x;  // Not
  } else if constexpr (is_int_v<T>) {
    switch (u.op) {
      case uAbs: return is_neg(x) ? wrap_sub(T(0), x) : x;  // |MIN| wraps to MIN
      case uNeg: return wrap_sub(T(0), x);
      case uSign: return x > T(0) ? T(1) : (is_neg(x) ? T(-1) : T(0));
      case uErf: return cast_one<T>(erf(double(x)));
      case uRelu: return is_neg(x) ? T(0) : x;
      case uShrink: {
        const double v = double(x), l = u.p0, b = u.p1;
        return cast_one<T>(v < -l ? v + b : (v > l ? v - b : 0.0));
      }
      case uClip:
        if (x < lo) x = lo;
        if (x > hi) x = hi;
        return x;
      case uBitNot: return T(~x);
    }
    return x;
  } else {
    return x;
  }
}

template <typename T, bool BoolOut>
__global__ void unary_kernel(const T* x, std::conditional_t<BoolOut, bool, T>* y, int64_t n,
                             const __grid_constant__ UnaryArgs u) {
  T lo{}, hi{};
  if constexpr (is_int_v<T>) {
    lo = u.lo ? cast_from<T>(u.lo, u.lo_t, 0) : std::numeric_limits<T>::lowest();
    hi = u.hi ? cast_from<T>(u.hi, u.hi_t, 0) : std::numeric_limits<T>::max();
  }
  KILN_GRID_STRIDE(i, n) {
    if constexpr (BoolOut) {
      const double v = double(load(x, i));
      y[i] = u.op == uIsNaN ? isnan(v) : (isinf(v) && ((v > 0 && u.pos) || (v < 0 && u.neg)));
    } else {
      y[i] = int_unary(u, x[i], lo, hi);
    }
  }
}

// --- host side ---------------------------------------------------------------------------------
enum class Kind { kUnary, kBinary, kVariadic, kPow, kWhere, kCast };

struct OpName {
  const char* name;
  int code;
};
const OpName kBinaryOps[] = {
    {"Add", bAdd}, {"Sub", bSub}, {"Mul", bMul}, {"Div", bDiv}, {"Mod", bMod},
    {"Max", bMax}, {"Min", bMin}, {"PRelu", bPRelu}, {"And", bAnd}, {"Or", bOr}, {"Xor", bXor},
    {"Equal", bEq}, {"Greater", bGt}, {"GreaterOrEqual", bGe}, {"Less", bLt},
    {"LessOrEqual", bLe}, {"BitShift", bShl}, {"BitwiseAnd", bBitAnd}, {"BitwiseOr", bBitOr},
    {"BitwiseXor", bBitXor}};
const OpName kUnaryOps[] = {
    {"Abs", uAbs}, {"Neg", uNeg}, {"Sign", uSign}, {"Erf", uErf}, {"Relu", uRelu},
    {"Shrink", uShrink}, {"Clip", uClip}, {"Not", uNot}, {"IsNaN", uIsNaN}, {"IsInf", uIsInf},
    {"BitwiseNot", uBitNot}};

int find_code(const OpName* b, const OpName* e, const std::string& op) {
  for (; b != e; ++b)
    if (op == b->name) return b->code;
  return -1;
}

bool known_type(DataType t) { return dispatch_dtype(t, [](auto) {}); }

// What a node is on this path; false (with a reason) when it has no typed kernel.
bool classify(const LayerDesc& d, Kind* kind, int* code, std::string* why) {
  const Node& n = *d.node;
  const std::string& op = n.op_type;
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in[i].dtype != DataType::kUndefined && !known_type(d.in[i].dtype))
      return *why = fmt::format("input {} type {} has no GPU kernel", i,
                                dtype_name(d.in[i].dtype)),
             false;
  if (d.out.empty() || !known_type(d.out[0].dtype))
    return *why = fmt::format("output type {} has no GPU kernel here (float8/int4 casts: ew.cast.low_bit)",
                              d.out.empty() ? "?" : std::string(dtype_name(d.out[0].dtype))), false;
  if (!d.in.empty() && d.in[0].dtype == DataType::kUndefined)
    return *why = "input 0 is absent", false;
  if (op.starts_with("Bitwise") &&
      (dtype_is_float(d.in[0].dtype) || d.in[0].dtype == DataType::kBool))
    return *why = "Bitwise ops take integers only", false;
  if (op == "Cast" || op == "CastLike") return *kind = Kind::kCast, true;
  if (op == "Where") return *kind = Kind::kWhere, true;
  if (op == "Pow") {
    if (dtype_is_float(d.in[0].dtype)) return *why = "float Pow runs as a program", false;
    return *kind = Kind::kPow, true;
  }
  if ((op == "Max" || op == "Min") && n.num_inputs() != 2) {
    if (dtype_is_float(d.out[0].dtype))
      return *why = "float Max/Min with more than 16 inputs", false;
    *code = op == "Max" ? bMax : bMin;
    return *kind = Kind::kVariadic, true;
  }
  if (op == "Sum" || op == "Mean") return *why = "float Sum/Mean with more than 16 inputs", false;
  if ((*code = find_code(std::begin(kUnaryOps), std::end(kUnaryOps), op)) >= 0) {
    if (dtype_is_float(d.out[0].dtype)) return *why = "float op runs as a program", false;
    return *kind = Kind::kUnary, true;
  }
  if ((*code = find_code(std::begin(kBinaryOps), std::end(kBinaryOps), op)) >= 0) {
    if (n.num_inputs() != 2 || d.in[1].dtype == DataType::kUndefined)
      return *why = "needs two inputs", false;
    if (op == "BitShift" && n.attrs.get_string("direction", "") == "RIGHT") *code = bShr;
    if (*code < bEq && *code != bAnd && *code != bOr && *code != bXor &&
        dtype_is_float(d.out[0].dtype))
      return *why = "float op runs as a program", false;
    return *kind = Kind::kBinary, true;
  }
  return *why = "not an elementwise op", false;
}

class TypedLayer final : public Layer {
 public:
  TypedLayer(const Node* n, Kind k, int code) : node_(n), kind_(k), code_(code) {
    u_.op = code;
    u_.p0 = n->attrs.get_float("lambd", 0.5f);
    u_.p1 = n->attrs.get_float("bias", 0.0f);
    u_.pos = n->attrs.get_int("detect_positive", 1) != 0;
    u_.neg = n->attrs.get_int("detect_negative", 1) != 0;
    c_fmod_ = n->attrs.get_int("fmod", 0) != 0;
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& y = out[0];
    n_ = y.numel();
    plans_.clear();
    if (kind_ == Kind::kBinary || kind_ == Kind::kPow) {
      KILN_ASSIGN_OR_RETURN(Bcast b, plan(y, {operand(in, 0), operand(in, 1)}));
      plans_.push_back(b);
    } else if (kind_ == Kind::kWhere) {
      KILN_ASSIGN_OR_RETURN(Bcast b, plan(y, {operand(in, 0), operand(in, 1), operand(in, 2)}));
      plans_.push_back(b);
    } else if (kind_ == Kind::kVariadic) {
      // out = op(in0, in1), then out = op(out, in_k): each launch walks the whole output.
      for (size_t k = 1; k < in.size(); ++k) {
        const Operand first = k == 1 ? operand(in, 0) : Operand{y.shape, is_nhwc(y)};
        KILN_ASSIGN_OR_RETURN(Bcast b, plan(y, {first, operand(in, k)}));
        plans_.push_back(b);
      }
    }
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (n_ == 0) return Status::Ok();
    const DeviceTensor& y = out[0];
    const unsigned grid = grid_for(n_);
    bool ok = true;
    switch (kind_) {
      case Kind::kCast:
        if (in[0].dtype == y.dtype && in[0].layout == y.layout) {
          KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, in[0].data, y.nbytes(), cudaMemcpyDeviceToDevice,
                                          rc.stream));
          return Status::Ok();
        }
        ok = dispatch_dtype(y.dtype, [&](auto tag) {
          using To = decltype(tag);
          cast_kernel<To><<<grid, kBlock, 0, rc.stream>>>(in[0].data, in[0].dtype,
                                                          static_cast<To*>(y.data), n_);
        });
        break;
      case Kind::kWhere:
        ok = dispatch_bytes(dtype_size(y.dtype), [&](auto tag) {
          using U = decltype(tag);
          where_kernel<U><<<grid, kBlock, 0, rc.stream>>>(
              static_cast<const bool*>(in[0].data), static_cast<const U*>(in[1].data),
              static_cast<const U*>(in[2].data), static_cast<U*>(y.data), n_, plans_[0]);
        });
        break;
      case Kind::kPow:
        ok = dispatch_dtype(y.dtype, [&](auto tag) {
          using T = decltype(tag);
          if constexpr (is_int_v<T>)
            pow_kernel<T><<<grid, kBlock, 0, rc.stream>>>(static_cast<const T*>(in[0].data),
                                                          in[1].data, in[1].dtype,
                                                          static_cast<T*>(y.data), n_, plans_[0]);
        });
        break;
      case Kind::kBinary:
        ok = launch_binary(rc, in[0], in[1].data, y, plans_[0]);
        break;
      case Kind::kVariadic:
        if (in.size() == 1) {
          KILN_CUDA_CHECK(cudaMemcpyAsync(y.data, in[0].data, y.nbytes(), cudaMemcpyDeviceToDevice,
                                          rc.stream));
          return Status::Ok();
        }
        for (size_t k = 1; k < in.size() && ok; ++k)
          ok = launch_binary(rc, k == 1 ? in[0] : y, in[k].data, y, plans_[k - 1]);
        break;
      case Kind::kUnary: {
        UnaryArgs u = u_;
        if (code_ == uClip) {
          if (in.size() > 1 && in[1].present()) u.lo = in[1].data, u.lo_t = in[1].dtype;
          if (in.size() > 2 && in[2].present()) u.hi = in[2].data, u.hi_t = in[2].dtype;
        }
        const bool bool_out = code_ == uIsNaN || code_ == uIsInf;
        ok = dispatch_dtype(in[0].dtype, [&](auto tag) {
          using T = decltype(tag);
          if (bool_out)
            unary_kernel<T, true><<<grid, kBlock, 0, rc.stream>>>(
                static_cast<const T*>(in[0].data), static_cast<bool*>(y.data), n_, u);
          else
            unary_kernel<T, false><<<grid, kBlock, 0, rc.stream>>>(
                static_cast<const T*>(in[0].data), static_cast<T*>(y.data), n_, u);
        });
        break;
      }
    }
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(y.dtype));
    KILN_CUDA_LAUNCH_CHECK("elementwise kernel");
    return Status::Ok();
  }

 private:
  struct Operand {
    std::vector<int64_t> shape;
    bool nhwc = false;
  };
  static bool is_nhwc(const DeviceTensor& t) { return t.layout == Layout::kNHWC && t.rank() == 4; }

  // Input k's shape for broadcasting, with legacy axis alignment and old PRelu's channel slope.
  Operand operand(std::span<const DeviceTensor> in, size_t k) const {
    Operand o{in[k].shape, is_nhwc(in[k])};
    if (k != 1 || kind_ == Kind::kWhere) return o;
    const int64_t r = in[0].rank();
    if (const Attribute* a = node_->attrs.find("kiln_broadcast_axis")) {
      const int64_t axis = a->i < 0 ? a->i + r : a->i;
      const int64_t trailing = r - axis - static_cast<int64_t>(o.shape.size());
      if (trailing > 0) o.shape.insert(o.shape.end(), static_cast<size_t>(trailing), 1);
    }
    if (node_->attrs.get_int("kiln_prelu_channel_slope", 0) != 0 && o.shape.size() == 1 &&
        o.shape[0] > 1 && r > 2) {
      std::vector<int64_t> c(static_cast<size_t>(r - 1), 1);
      c[0] = o.shape[0];
      o.shape = c;
    }
    return o;
  }

  Expected<Bcast> plan(const DeviceTensor& y, const std::vector<Operand>& ops) const {
    std::vector<std::vector<int64_t>> shapes;
    std::vector<bool> nhwc;
    for (const Operand& o : ops) {
      if (o.shape.size() > y.shape.size())
        return KILN_ERROR("{}: an input has a higher rank than the output", node_->label());
      shapes.push_back(o.shape);
      nhwc.push_back(o.nhwc);
    }
    std::vector<int64_t> dims;
    std::vector<std::vector<int64_t>> strides;
    broadcast_plan(shapes, nhwc, y.shape, is_nhwc(y), &dims, &strides);
    if (dims.size() > static_cast<size_t>(kMaxDims))
      return KILN_ERROR("{}: broadcast needs {} dims, at most {} are supported", node_->label(),
                        dims.size(), kMaxDims);
    Bcast b;
    b.rank = static_cast<int>(dims.size());
    b.small = n_ < (int64_t(1) << 31);
    for (size_t d = 0; d < dims.size(); ++d) {
      b.dims[d] = dims[d];
      for (size_t k = 0; k < strides.size(); ++k) b.strides[k][d] = strides[k][d];
    }
    return b;
  }

  bool launch_binary(const RunContext& rc, const DeviceTensor& a, const void* b,
                     const DeviceTensor& y, const Bcast& ix) const {
    const bool bool_out = code_ >= bEq;
    return dispatch_dtype(a.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* pa = static_cast<const T*>(a.data);
      const T* pb = static_cast<const T*>(b);
      if (bool_out)
        binary_kernel<T, true><<<grid_for(n_), kBlock, 0, rc.stream>>>(
            pa, pb, static_cast<bool*>(y.data), n_, ix, code_, c_fmod_);
      else
        binary_kernel<T, false><<<grid_for(n_), kBlock, 0, rc.stream>>>(
            pa, pb, static_cast<T*>(y.data), n_, ix, code_, c_fmod_);
    });
  }

  const Node* node_;
  Kind kind_;
  int code_;
  UnaryArgs u_;
  bool c_fmod_ = false;
  int64_t n_ = 0;
  std::vector<Bcast> plans_;
};

}  // namespace

bool typed_supports(const LayerDesc& d, std::string* why) {
  Kind kind;
  int code = 0;
  return classify(d, &kind, &code, why);
}

Expected<std::unique_ptr<Layer>> create_typed(const LayerDesc& d) {
  Kind kind;
  int code = 0;
  std::string why;
  if (!classify(d, &kind, &code, &why)) return KILN_ERROR("{}: {}", d.node->label(), why);
  return std::unique_ptr<Layer>(new TypedLayer(d.node, kind, code));
}

}  // namespace kiln::gpu::ew
