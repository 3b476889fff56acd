// Elementwise family cases: every unary op and activation (float32/float16, a float64 subset,
// integer variants of Abs/Neg/Sign/Relu/Erf/Shrink), binary arithmetic with every broadcast
// corner (scalar, size-1 dims on both sides, rank mismatch, legacy axis), integer Div/Mod sign
// rules and wrap-around, Pow with mixed types, comparisons, logic, BitShift (unsigned and
// signed), BitwiseAnd/Or/Xor/Not, variadic Max/Min/Sum/Mean (NaN propagation), Where, Clip (absent/runtime bounds,
// min > max), Cast between all storage types (NaN, saturation, wrap), CastLike, empty tensors,
// NHWC per-channel broadcasts and kiln.ElementwiseChain programs.
#include <cctype>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <string_view>

#include "backend_ops.h"

namespace kiln::gpu::test {

namespace {

using Modes = std::vector<std::string>;
const Modes kF = {"fp32", "fp16"};
const Modes kNhwc = {"fp32", "fp16", "nhwc16"};
const Modes kExact = {"fp32"};
constexpr DataType kF32 = DataType::kFloat32, kF16 = DataType::kFloat16,
                   kF64 = DataType::kFloat64, kBF16 = DataType::kBFloat16,
                   kI8 = DataType::kInt8, kU8 = DataType::kUInt8, kI16 = DataType::kInt16,
                   kI32 = DataType::kInt32, kI64 = DataType::kInt64, kU32 = DataType::kUInt32,
                   kU64 = DataType::kUInt64, kU16 = DataType::kUInt16, kBool = DataType::kBool;



// Pseudo-random multiples of 0.25 in [-4, 4] (exact in float16, with ties for comparisons), with
// a NaN every `nan_every` elements (0: none).
std::vector<double> quarters(int64_t n, uint32_t seed, int64_t nan_every = 0) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    v[i] = static_cast<double>(static_cast<int>((seed >> 10) % 33) - 16) / 4.0;
    if (nan_every > 0 && i % nan_every == nan_every - 1) v[i] = std::nan("");
  }
  return v;
}

CaseInput scalar_const(double value, DataType t = kF32) {
  return konst(Tensor::from<double>({}, {value}).cast(t));
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

Attribute F(float v) { return Attribute::Float(v); }
Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute S(const char* v) { return Attribute::String(v); }

void unary_cases(std::vector<OpCase>& v) {
  struct U {
    const char* op;
    double lo, hi;
    bool f64;
  };
  const U ops[] = {
      {"Abs", -2, 2, true},        {"Neg", -2, 2, true},       {"Exp", -3, 3, true},
      {"Log", 0.05, 10, true},     {"Sqrt", 0.01, 10, true},   {"Reciprocal", 0.5, 3, false},
      {"Sign", -1, 1, false},      {"Sin", -3, 3, false},      {"Cos", -3, 3, false},
      {"Tan", -1.2, 1.2, false},   {"Asin", -0.95, 0.95, false}, {"Acos", -0.95, 0.95, false},
      {"Atan", -3, 3, false},      {"Sinh", -3, 3, false},     {"Cosh", -3, 3, false},
      {"Asinh", -3, 3, false},     {"Acosh", 1.05, 5, false},  {"Atanh", -0.9, 0.9, false},
      {"Erf", -2, 2, true},        {"Relu", -1, 1, true},      {"Sigmoid", -6, 6, true},
      {"Tanh", -3, 3, true},       {"Elu", -3, 3, false},      {"Selu", -3, 3, false},
      {"Celu", -3, 3, false},      {"HardSigmoid", -4, 4, false}, {"HardSwish", -5, 5, false},
      {"Softplus", -10, 10, false}, {"Softsign", -3, 3, false}, {"Gelu", -3, 3, false},
      {"ThresholdedRelu", -2, 3, false}, {"Shrink", -2, 2, false}, {"Mish", -4, 4, false},
      {"LeakyRelu", -2, 2, false}, {"Swish", -8, 8, false},
  };
  for (const U& u : ops) {
    const std::string n = lower(u.op);
    // ThresholdedRelu and Shrink jump at their threshold: rounding a float32 input to float16
    // there moves the result by the jump (the float16 tensors of _half_input test them exactly).
    const bool jumps = std::string_view(u.op) == "ThresholdedRelu" || std::string_view(u.op) == "Shrink";
    v.push_back(make_case(n, u.op, {}, {in({3, 5, 7}, kF32, u.lo, u.hi)}, jumps ? kExact : kF));
    if (u.f64) v.push_back(make_case(n + "_f64", u.op, {}, {in({4, 9}, kF64, u.lo, u.hi)}, kExact));
    // Float16 tensors: the CPU computes in float too; its libm may differ by an ulp.
    v.push_back(make_case(n + "_half_input", u.op, {}, {in({37}, kF16, u.lo, u.hi)}, kExact));
    v.back().tolerance = 2e-3;
  }
  // Floor/Ceil/Round jump at integers: float16 rounding of the input would move results.
  for (const char* op : {"Floor", "Ceil", "Round"}) {
    v.push_back(make_case(lower(op), op, {}, {in({4, 33}, kF32, -5, 5)}, kExact));
    v.push_back(make_case(lower(op) + "_quarters", op, {}, {fixed({66}, quarters(66, 7))}, kF));
    v.push_back(make_case(lower(op) + "_f64", op, {}, {in({20}, kF64, -5, 5)}, kExact));
  }
  v.push_back(make_case("round_half_even", "Round", {},
                   {fixed({10}, {0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49999997, -7.5, 8.5})}, kF));
  v.push_back(make_case("sign_nan_zero", "Sign", {}, {fixed({5}, {0.0, -0.0, std::nan(""), 3, -2})}, kF));
  // Attributes.
  v.push_back(make_case("leaky_relu_alpha", "LeakyRelu", attrs({{"alpha", F(0.3f)}}), {in({40})}, kF));
  v.push_back(make_case("elu_alpha", "Elu", attrs({{"alpha", F(0.5f)}}), {in({40}, kF32, -3, 3)}, kF));
  v.push_back(make_case("selu_attrs", "Selu", attrs({{"alpha", F(2.f)}, {"gamma", F(0.7f)}}),
                   {in({40}, kF32, -3, 3)}, kF));
  v.push_back(make_case("celu_alpha", "Celu", attrs({{"alpha", F(2.f)}}), {in({40}, kF32, -3, 3)}, kF));
  v.push_back(make_case("hard_sigmoid_attrs", "HardSigmoid", attrs({{"alpha", F(0.5f)}, {"beta", F(0.25f)}}),
                   {in({40}, kF32, -3, 3)}, kF));
  v.push_back(make_case("thresholded_relu_alpha", "ThresholdedRelu", attrs({{"alpha", F(0.5f)}}),
                   {in({40}, kF32, -2, 2)}, kExact));
  v.push_back(make_case("shrink_attrs", "Shrink", attrs({{"lambd", F(0.8f)}, {"bias", F(0.3f)}}),
                   {in({40}, kF32, -2, 2)}, kExact));
  v.push_back(make_case("gelu_tanh", "Gelu", attrs({{"approximate", S("tanh")}}), {in({3, 50}, kF32, -4, 4)}, kF));
  v.push_back(make_case("gelu_f64", "Gelu", {}, {in({50}, kF64, -4, 4)}, kExact));
  v.push_back(make_case("gelu_tanh_f64", "Gelu", attrs({{"approximate", S("tanh")}}), {in({50}, kF64, -4, 4)}, kExact));
  v.push_back(make_case("sigmoid_bf16", "Sigmoid", {}, {in({64}, kBF16, -4, 4)}, kExact));
  v.back().tolerance = 1e-2;
  v.push_back(make_case("relu_nan", "Relu", {}, {fixed({6}, {1, -1, std::nan(""), 0, -0.5, 2})}, kF));
  v.push_back(make_case("relu_empty", "Relu", {}, {in({2, 0, 4})}, kF));
  v.push_back(make_case("exp_large_odd", "Exp", {}, {in({3, 5, 97, 131}, kF32, -2, 2)}, kF));
  // Integer variants (exact).
  for (DataType t : {kI32, kI64, kI8}) {
    std::string s = "_";  // (operator+ here trips a false -Wrestrict in GCC 12)
    s += dtype_name(t);
    v.push_back(make_case("abs" + s, "Abs", {}, {in({30}, t, -100, 100)}, kExact));
    v.push_back(make_case("neg" + s, "Neg", {}, {in({30}, t, -100, 100)}, kExact));
    v.push_back(make_case("sign" + s, "Sign", {}, {in({30}, t, -3, 3)}, kExact));
    v.push_back(make_case("relu" + s, "Relu", {}, {in({30}, t, -50, 50)}, kExact));
    v.push_back(make_case("erf" + s, "Erf", {}, {fixed({9}, {-9, -8, -5, -1, 0, 1, 5, 8, 9}, t)}, kExact));
    v.push_back(make_case("shrink" + s, "Shrink", attrs({{"lambd", F(2.f)}, {"bias", F(1.5f)}}),
                     {in({30}, t, -6, 6)}, kExact));
  }
  v.push_back(make_case("abs_int8_min", "Abs", {}, {fixed({3}, {-128, 127, -1}, kI8)}, kExact));
  v.push_back(make_case("abs_uint16", "Abs", {}, {in({30}, kU16, 0, 1000)}, kExact));
  v.push_back(make_case("sign_uint32", "Sign", {}, {in({30}, kU32, 0, 2)}, kExact));
  // Bool out / bool in.
  v.push_back(make_case("not", "Not", {}, {in({3, 17}, kBool)}, kExact));
  v.push_back(make_case("not_empty", "Not", {}, {in({0}, kBool)}, kExact));
  const std::vector<double> special = {1.0, -INFINITY, INFINITY, std::nan(""), 0.0, -3.5,
                                       INFINITY, -INFINITY};
  v.push_back(make_case("isnan", "IsNaN", {}, {fixed({8}, special)}, kF));
  v.push_back(make_case("isnan_f64", "IsNaN", {}, {fixed({8}, special, kF64)}, kExact));
  v.push_back(make_case("isinf", "IsInf", {}, {fixed({8}, special)}, kF));
  v.push_back(make_case("isinf_pos_only", "IsInf", attrs({{"detect_negative", I(0)}}),
                   {fixed({8}, special)}, kF));
  v.push_back(make_case("isinf_neg_only_f16", "IsInf", attrs({{"detect_positive", I(0)}}),
                   {fixed({8}, special, kF16)}, kExact));
}

void activation_cases(std::vector<OpCase>& v) {
  // PRelu: slope broadcast unidirectionally.
  v.push_back(make_case("prelu_channel", "PRelu", {}, {in({2, 6, 5, 7}, kF32, -2, 2), in({6, 1, 1})}, kNhwc));
  v.push_back(make_case("prelu_channel_4d", "PRelu", {}, {in({2, 6, 5, 7}, kF32, -2, 2), in({1, 6, 1, 1})},
                   kNhwc));
  v.push_back(make_case("prelu_scalar", "PRelu", {}, {in({3, 11}), in({1})}, kF));
  v.push_back(make_case("prelu_last_axis", "PRelu", {}, {in({3, 4, 11}), konst_random({11}, 1)}, kF));
  v.push_back(make_case("prelu_same", "PRelu", {}, {in({5, 9}), in({5, 9})}, kF));
  v.push_back(make_case("prelu_f64", "PRelu", {}, {in({2, 3, 4}, kF64), in({3, 1}, kF64)}, kExact));
  v.push_back(make_case("prelu_int32", "PRelu", {}, {in({4, 9}, kI32, -20, 20), in({9}, kI32, -3, 3)}, kExact));
  v.push_back(make_case("prelu_int64", "PRelu", {}, {in({4, 9}, kI64, -20, 20), in({4, 1}, kI64, -3, 3)},
                   kExact));
}

// A binary op over two inputs of the given shapes and range.
OpCase bin(std::string name, const char* op, std::vector<int64_t> a, std::vector<int64_t> b,
           DataType t = kF32, double lo = -1, double hi = 1, double blo = -1, double bhi = 1,
           Modes m = kF) {
  return make_case(std::move(name), op, {}, {in(std::move(a), t, lo, hi), in(std::move(b), t, blo, bhi)},
              std::move(m));
}

void binary_cases(std::vector<OpCase>& v) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    const std::string n = lower(op);
    const double blo = std::string(op) == "Div" ? 0.5 : -1, bhi = std::string(op) == "Div" ? 2 : 1;
    v.push_back(bin(n + "_same", op, {2, 3, 4, 5}, {2, 3, 4, 5}, kF32, -1, 1, blo, bhi, kNhwc));
    v.push_back(bin(n + "_scalar", op, {3, 7}, {}, kF32, -1, 1, blo, bhi));
    v.push_back(bin(n + "_scalar_lhs", op, {}, {3, 7}, kF32, 0.5, 2, blo, bhi));
    v.push_back(bin(n + "_both_sides", op, {3, 1, 5}, {1, 4, 1}, kF32, -1, 1, blo, bhi));
    v.push_back(bin(n + "_rank_mismatch", op, {2, 3, 4, 5}, {5}, kF32, -1, 1, blo, bhi));
    v.push_back(bin(n + "_rank_mismatch_lhs", op, {4, 1}, {2, 3, 4, 5}, kF32, 0.5, 2, blo, bhi));
    v.push_back(bin(n + "_channel", op, {2, 8, 6, 5}, {8, 1, 1}, kF32, -1, 1, blo, bhi, kNhwc));
    v.push_back(bin(n + "_channel_4d", op, {2, 8, 6, 5}, {1, 8, 1, 1}, kF32, -1, 1, blo, bhi, kNhwc));
    v.push_back(bin(n + "_se_gate", op, {2, 16, 7, 7}, {2, 16, 1, 1}, kF32, -1, 1, blo, bhi, kNhwc));
    v.push_back(bin(n + "_f64", op, {3, 4, 5}, {4, 1}, kF64, -1, 1, blo, bhi, kExact));
    v.push_back(bin(n + "_f16_input", op, {3, 9}, {9}, kF16, -1, 1, blo, bhi, kExact));
    v.back().tolerance = 2e-3;
    v.push_back(bin(n + "_empty", op, {0, 3}, {3}, kF32, -1, 1, blo, bhi, kExact));
    v.push_back(bin(n + "_int32", op, {4, 6}, {6}, kI32, -1000, 1000, 1, 50, kExact));
    v.push_back(bin(n + "_int64_neg", op, {4, 6}, {4, 1}, kI64, -1000, 1000, -50, -1, kExact));
    v.push_back(bin(n + "_int8_wrap", op, {64}, {64}, kI8, -128, 127, 1, 127, kExact));
    v.push_back(bin(n + "_uint8", op, {64}, {1}, kU8, 0, 255, 1, 255, kExact));
  }
  v.push_back(bin("add_large", "Add", {4, 32, 61, 67}, {4, 32, 61, 67}));
  v.push_back(bin("mul_large_channel", "Mul", {2, 96, 41, 43}, {96, 1, 1}, kF32, -1, 1, -1, 1, kNhwc));
  v.push_back(bin("add_bf16", "Add", {5, 13}, {13}, kBF16, -1, 1, -1, 1, kExact));
  v.back().tolerance = 1e-2;
  v.push_back(bin("add_uint64", "Add", {20}, {20}, kU64, 0, 1e6, 0, 1e6, kExact));
  v.push_back(bin("mul_int16", "Mul", {20}, {20}, kI16, -300, 300, -300, 300, kExact));
  v.push_back(make_case("div_int_min_by_minus_one", "Div", {},
                   {fixed({3}, {-2147483648.0, 7, -7}, kI32), fixed({3}, {-1, -2, 2}, kI32)}, kExact));
  v.push_back(make_case("div_by_zero_float", "Div", {}, {fixed({4}, {1, -1, 0, 2}), fixed({4}, {0, 0, 0, 4})}, kF));
  // Legacy (opset < 7) broadcast with an axis: B aligns with A from axis 1.
  v.push_back(make_case("add_legacy_axis", "Add", attrs({{"kiln_broadcast_axis", I(1)}}),
                   {in({2, 3, 4, 5}), in({3, 4})}, kF));
  // Mod: both sign rules, floats and integers.
  for (int fmod : {0, 1}) {
    const std::string s = fmod ? "_fmod" : "";
    const Attributes a = attrs({{"fmod", I(fmod)}});
    v.push_back(make_case("mod_float_pos" + s, "Mod", a, {in({40}, kF32, -10, 10), in({40}, kF32, 0.5, 3)}, kExact));
    v.push_back(make_case("mod_float_neg" + s, "Mod", a, {in({40}, kF32, -10, 10), in({1}, kF32, -3, -0.5)}, kExact));
    v.push_back(make_case("mod_f64" + s, "Mod", a, {in({40}, kF64, -10, 10), in({40}, kF64, 0.5, 3)}, kExact));
    v.push_back(make_case("mod_quarters" + s, "Mod", a,
                     {fixed({30}, quarters(30, 3)), fixed({30}, {1.5, -1.5, 0.75, -2.25, 1, -1, 2.5, 3, -0.5, 1.25,
                                                              1.5, -1.5, 0.75, -2.25, 1, -1, 2.5, 3, -0.5, 1.25,
                                                              1.5, -1.5, 0.75, -2.25, 1, -1, 2.5, 3, -0.5, 1.25})},
                     kF));
    for (DataType t : {kI32, kI64, kI8}) {
      const std::string n = "mod_" + std::string(dtype_name(t)) + s;
      v.push_back(make_case(n + "_pos", "Mod", a, {in({40}, t, -50, 50), in({40}, t, 1, 9)}, kExact));
      v.push_back(make_case(n + "_neg", "Mod", a, {in({40}, t, -50, 50), in({40}, t, -9, -1)}, kExact));
    }
    v.push_back(make_case("mod_uint32" + s, "Mod", a, {in({40}, kU32, 0, 500), in({1}, kU32, 1, 9)}, kExact));
  }
  // Pow: float, mixed base/exponent types, integer bases.
  v.push_back(bin("pow", "Pow", {3, 11}, {3, 11}, kF32, 0.5, 2, -2, 2));
  v.push_back(bin("pow_scalar_exp", "Pow", {3, 11}, {}, kF32, 0.1, 3, 2, 2));
  v.push_back(bin("pow_f64", "Pow", {30}, {30}, kF64, 0.5, 2, -3, 3, kExact));
  v.push_back(make_case("pow_int64_exponent", "Pow", {}, {in({4, 8}, kF32, 0.5, 2), in({8}, kI64, -3, 4)}, kF));
  v.push_back(make_case("pow_negative_base", "Pow", {},
                   {fixed({5}, {-2, -1.5, -0.5, 3, -3}), fixed({5}, {3, 2, -3, 0, 1}, kI32)}, kF));
  v.push_back(make_case("pow_int32_exponent_f16", "Pow", {}, {in({4, 8}, kF16, -2, 2), in({8}, kI32, 0, 4)}, kExact));
  v.back().tolerance = 2e-3;
  v.push_back(make_case("pow_int32", "Pow", {}, {in({40}, kI32, -5, 5), in({40}, kI32, 0, 6)}, kExact));
  v.push_back(make_case("pow_int64_negative_exp", "Pow", {},
                   {fixed({6}, {1, -1, -1, 2, -2, 0}, kI64), fixed({6}, {-3, -3, -2, -1, 3, 5}, kI64)}, kExact));
  v.push_back(make_case("pow_int32_float_exp", "Pow", {}, {in({40}, kI32, 1, 9), in({40}, kF32, 0.0, 2.5)}, kExact));
  v.push_back(make_case("pow_uint8_wrap", "Pow", {}, {in({40}, kU8, 0, 9), in({1}, kI64, 3, 5)}, kExact));
  v.push_back(make_case("pow_float_uint8_exp", "Pow", {}, {in({20}), in({20}, kU8, 0, 3)}, kF));
}

void compare_logic_cases(std::vector<OpCase>& v) {
  for (const char* op : {"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"}) {
    const std::string n = lower(op);
    // Quarter values: exact in float16, with ties.
    v.push_back(make_case(n, op, {}, {fixed({4, 9}, quarters(36, 11)), fixed({9}, quarters(9, 5))}, kF));
    v.push_back(make_case(n + "_nan", op, {}, {fixed({12}, quarters(12, 2, 4)), fixed({12}, quarters(12, 2, 5))}, kF));
    v.push_back(make_case(n + "_f64", op, {}, {fixed({10}, quarters(10, 3), kF64), fixed({}, {0.5}, kF64)}, kExact));
    v.push_back(bin(n + "_int32", op, {5, 6}, {5, 1}, kI32, -3, 3, -3, 3, kExact));
    v.push_back(bin(n + "_int64", op, {5, 6}, {6}, kI64, -3, 3, -3, 3, kExact));
    v.push_back(bin(n + "_uint8", op, {30}, {}, kU8, 0, 4, 0, 4, kExact));
    v.push_back(bin(n + "_empty", op, {2, 0}, {1}, kI32, -3, 3, -3, 3, kExact));
  }
  v.push_back(bin("equal_bool", "Equal", {3, 8}, {8}, kBool, 0, 1, 0, 1, kExact));
  for (const char* op : {"And", "Or", "Xor"}) {
    v.push_back(bin(lower(op), op, {4, 9}, {4, 9}, kBool, 0, 1, 0, 1, kExact));
    v.push_back(bin(lower(op) + "_broadcast", op, {3, 1, 5}, {4, 1}, kBool, 0, 1, 0, 1, kExact));
  }
  for (DataType t : {kU8, kU16, kU32, kU64}) {
    const double bits = static_cast<double>(dtype_size(t) * 8);
    for (const char* dir : {"LEFT", "RIGHT"}) {
      v.push_back(make_case("bitshift_" + lower(dir) + "_" + std::string(dtype_name(t)), "BitShift",
                       attrs({{"direction", S(dir)}}),
                       {in({40}, t, 0, 200), in({40}, t, 0, bits + 2)}, kExact));
    }
  }
  v.push_back(make_case("bitshift_broadcast", "BitShift", attrs({{"direction", S("LEFT")}}),
                   {in({3, 5}, kU32, 0, 1000), in({3, 1}, kU32, 0, 8)}, kExact));
  // Signed (BitShift-28): left wraps, right is arithmetic, out-of-range amounts give 0 or -1.
  for (DataType t : {kI8, kI32, kI64}) {
    const double bits = static_cast<double>(dtype_size(t) * 8);
    for (const char* dir : {"LEFT", "RIGHT"}) {
      v.push_back(make_case("bitshift_" + lower(dir) + "_" + std::string(dtype_name(t)), "BitShift",
                       attrs({{"direction", S(dir)}}),
                       {in({40}, t, -100, 100), in({40}, t, -2, bits + 2)}, kExact));
    }
  }
  // BitwiseAnd/Or/Xor/Not: every integer type, negative values (all high bits set), broadcasting.
  for (DataType t : {kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64}) {
    const bool is_signed = t == kI8 || t == kI16 || t == kI32 || t == kI64;
    const double lo = is_signed ? -100 : 0, hi = is_signed ? 100 : 200;
    const std::string ts(dtype_name(t));
    for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"})
      v.push_back(bin(lower(op) + "_" + ts, op, {3, 8}, {8}, t, lo, hi, lo, hi, kExact));
    v.push_back(make_case("bitwisenot_" + ts, "BitwiseNot", {}, {in({5, 7}, t, lo, hi)}, kExact));
  }
  v.push_back(bin("bitwiseand_broadcast_both", "BitwiseAnd", {3, 1, 5}, {4, 1}, kI32, -1000, 1000,
                  -1000, 1000, kExact));
  v.push_back(bin("bitwisexor_empty", "BitwiseXor", {2, 0}, {1}, kI64, -5, 5, -5, 5, kExact));
}

void variadic_cases(std::vector<OpCase>& v) {
  for (const char* op : {"Max", "Min", "Sum", "Mean"}) {
    const std::string n = lower(op);
    v.push_back(make_case(n + "_one", op, {}, {in({3, 5})}, kF));
    v.push_back(make_case(n + "_two", op, {}, {in({3, 5}), in({3, 5})}, kF));
    v.push_back(make_case(n + "_three_broadcast", op, {}, {in({3, 1}), in({4, 1, 5}), in({})}, kF));
    v.push_back(make_case(n + "_f64", op, {}, {in({2, 6}, kF64), in({6}, kF64), in({2, 1}, kF64)}, kExact));
    v.push_back(make_case(n + "_nine", op, {}, std::vector<CaseInput>(9, in({2, 7})), kF));
  }
  for (const char* op : {"Max", "Min"}) {
    const std::string n = lower(op);
    v.push_back(make_case(n + "_nan", op, {},
                     {fixed({12}, quarters(12, 4, 3)), fixed({12}, quarters(12, 9, 5))}, kF));
    v.push_back(make_case(n + "_int32_three", op, {},
                     {in({4, 5}, kI32, -50, 50), in({5}, kI32, -50, 50), in({4, 1}, kI32, -50, 50)}, kExact));
    v.push_back(make_case(n + "_int64_two", op, {}, {in({4, 5}, kI64, -50, 50), in({4, 5}, kI64, -50, 50)}, kExact));
    v.push_back(make_case(n + "_uint8_one", op, {}, {in({9}, kU8, 0, 200)}, kExact));
    v.push_back(make_case(n + "_empty", op, {}, {in({0, 5}), in({5})}, kExact));
  }
}

void where_clip_cases(std::vector<OpCase>& v) {
  v.push_back(make_case("where", "Where", {}, {in({3, 4}, kBool), in({3, 4}), in({3, 4})}, kF));
  v.push_back(make_case("where_broadcast3", "Where", {}, {in({3, 1}, kBool), in({1, 4}), in({})}, kF));
  v.push_back(make_case("where_rank_mismatch", "Where", {}, {in({5}, kBool), in({2, 3, 1}), in({3, 5})}, kF));
  v.push_back(make_case("where_4d", "Where", {}, {in({2, 3, 4, 5}, kBool), in({2, 3, 4, 5}), in({2, 3, 4, 5})},
                   kNhwc));
  v.push_back(make_case("where_f64", "Where", {}, {in({6}, kBool), in({2, 6}, kF64), in({2, 1}, kF64)}, kExact));
  v.push_back(make_case("where_int64", "Where", {}, {in({4, 1}, kBool), in({4, 3}, kI64, -9, 9), in({3}, kI64, -9, 9)},
                   kExact));
  v.push_back(make_case("where_int8", "Where", {}, {in({7}, kBool), in({7}, kI8, -9, 9), in({1}, kI8, -9, 9)}, kExact));
  v.push_back(make_case("where_bool", "Where", {}, {in({5, 3}, kBool), in({5, 3}, kBool), in({3}, kBool)}, kExact));
  v.push_back(make_case("where_empty", "Where", {}, {in({0, 3}, kBool), in({3}), in({1})}, kExact));
  // Clip: constant, runtime, absent and crossed bounds.
  v.push_back(make_case("clip", "Clip", {}, {in({4, 9}, kF32, -2, 2), scalar_const(-0.5), scalar_const(0.7)}, kF));
  v.push_back(make_case("clip_min_only", "Clip", {}, {in({4, 9}, kF32, -2, 2), scalar_const(0.1)}, kF));
  v.push_back(make_case("clip_max_only", "Clip", {}, {in({4, 9}, kF32, -2, 2), absent(), scalar_const(0.3)}, kF));
  v.push_back(make_case("clip_none", "Clip", {}, {in({4, 9})}, kF));
  v.push_back(make_case("clip_crossed", "Clip", {}, {in({4, 9}), scalar_const(0.5), scalar_const(-0.5)}, kF));
  v.push_back(make_case("clip_runtime_bounds", "Clip", {}, {in({4, 9}, kF32, -2, 2), in({}, kF32, -1, -0.2),
                                                       in({1}, kF32, 0.2, 1)}, kF));
  v.push_back(make_case("clip_nan", "Clip", {}, {fixed({5}, {std::nan(""), -3, 3, 0, 0.5}), scalar_const(-1),
                                            scalar_const(1)}, kF));
  v.push_back(make_case("clip_relu6_4d", "Clip", {}, {in({2, 8, 5, 5}, kF32, -3, 9), scalar_const(0), scalar_const(6)},
                   kNhwc));
  v.push_back(make_case("clip_f64", "Clip", {}, {in({30}, kF64, -2, 2), scalar_const(-1, kF64), scalar_const(1.5, kF64)},
                   kExact));
  v.push_back(make_case("clip_int32", "Clip", {}, {in({30}, kI32, -20, 20), scalar_const(-5, kI32), scalar_const(7, kI32)},
                   kExact));
  v.push_back(make_case("clip_int64_runtime_max", "Clip", {}, {in({30}, kI64, -20, 20), absent(), in({}, kI64, 0, 5)},
                   kExact));
  v.push_back(make_case("clip_uint8_min", "Clip", {}, {in({30}, kU8, 0, 255), scalar_const(100, kU8)}, kExact));
  v.push_back(make_case("clip_empty", "Clip", {}, {in({0, 4}), scalar_const(0), scalar_const(1)}, kExact));
}

void cast_cases(std::vector<OpCase>& v) {
  auto cast = [&](std::string name, CaseInput x, DataType to, Modes m = kExact) {
    v.push_back(make_case(std::move(name), "Cast", attrs({{"to", I(static_cast<int64_t>(to))}}), {std::move(x)},
                     std::move(m)));
  };
  const DataType ints[] = {kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64};
  // Float -> every integer type: truncation, wrap-around, NaN -> 0, saturation of +-inf.
  const std::vector<double> specials = {-1.5, 1.5, 300.7, -300.7, 70000.2, -2.9, 0.0, std::nan(""),
                                        INFINITY, -INFINITY, 3e9, -3e9, 1e20, -1e20, 4294967296.5, 255.99};
  for (DataType t : ints) {
    const std::string n = std::string(dtype_name(t));
    cast("cast_float_to_" + n, in({40}, kF32, -1000, 1000), t);
    cast("cast_specials_to_" + n, fixed({16}, specials), t);
    cast("cast_f64_specials_to_" + n, fixed({16}, specials, kF64), t);
    cast("cast_" + n + "_to_float", in({40}, t, t == kU8 || t == kU16 || t == kU32 || t == kU64 ? 0 : -100, 100),
         kF32, kF);
    cast("cast_" + n + "_to_bool", in({20}, t, 0, 2), kBool);
    cast("cast_bool_to_" + n, in({20}, kBool), t);
    cast("cast_quarters_to_" + n, fixed({40}, quarters(40, 17)), t, kF);
  }
  cast("cast_int64_to_int8_wrap", in({40}, kI64, -100000, 100000), kI8);
  cast("cast_int32_to_uint16_wrap", in({40}, kI32, -100000, 100000), kU16);
  cast("cast_uint64_to_int64", in({40}, kU64, 0, 1e15), kI64);
  cast("cast_int64_big_to_float", fixed({4}, {9007199254740993.0, -9007199254740993.0, 16777217, 3}, kI64), kF32);
  cast("cast_int64_to_f16", in({40}, kI64, -70000, 70000), kF16);
  cast("cast_int32_to_f64", in({40}, kI32, -1e6, 1e6), kF64);
  cast("cast_float_to_f16", in({40}, kF32, -70000, 70000), kF16);
  cast("cast_f16_to_float", in({40}, kF16, -100, 100), kF32);
  cast("cast_f64_to_float", in({40}, kF64, -1e5, 1e5), kF32);
  cast("cast_float_to_f64", in({40}, kF32, -1e5, 1e5), kF64);
  cast("cast_f64_to_f16", in({40}, kF64, -1e5, 1e5), kF16);
  cast("cast_float_to_bf16", in({40}, kF32, -100, 100), kBF16);
  cast("cast_bf16_to_float", in({40}, kBF16, -100, 100), kF32);
  cast("cast_bf16_to_int32", in({40}, kBF16, -100, 100), kI32);
  cast("cast_f16_to_bf16", in({40}, kF16, -100, 100), kBF16);
  cast("cast_float_to_bool", fixed({6}, {0.0, -0.0, 0.5, std::nan(""), -INFINITY, 1e-30}), kBool);
  cast("cast_float_same", in({3, 7}), kF32, kF);
  cast("cast_int64_same", in({3, 7}, kI64, -9, 9), kI64);
  cast("cast_empty", in({0, 7}), kI32);
  cast("cast_4d_float_to_half", in({2, 3, 4, 5}), kF16, kNhwc);
  v.push_back(make_case("castlike_float_to_int32", "CastLike", {}, {in({30}, kF32, -50, 50), in({1}, kI32)}, kExact));
  v.push_back(make_case("castlike_int64_to_float", "CastLike", {}, {in({30}, kI64, -50, 50), in({2}, kF32)}, kF));
  v.push_back(make_case("castlike_bool_to_f64", "CastLike", {}, {in({30}, kBool), in({2}, kF64)}, kExact));
}

// kiln.ElementwiseChain: ops/arity/operands (k >= 0: input k, -1: previous step, -2: absent),
// step attributes prefixed "s<i>_".
OpCase chain(std::string name, std::vector<std::string> ops, std::vector<int64_t> arity,
             std::vector<int64_t> operands, std::vector<CaseInput> ins, Modes m = kF,
             Attributes a = {}) {
  a.set("ops", Attribute::Strings(std::move(ops)));
  a.set("arity", Attribute::Ints(std::move(arity)));
  a.set("operands", Attribute::Ints(std::move(operands)));
  return make_case(std::move(name), "ElementwiseChain", std::move(a), std::move(ins), std::move(m), "kiln");
}

void chain_cases(std::vector<OpCase>& v) {
  // SiLU: x * sigmoid(x), 4-D.
  v.push_back(chain("chain_silu", {"Sigmoid", "Mul"}, {1, 2}, {0, 0, -1}, {in({2, 8, 9, 7}, kF32, -4, 4)}, kNhwc));
  // Per-channel affine + activation: Relu(x * s + b), as BatchNorm decomposes.
  v.push_back(chain("chain_affine_relu", {"Mul", "Add", "Relu"}, {2, 2, 1}, {0, 1, -1, 2, -1},
                    {in({2, 8, 5, 6}), in({8, 1, 1}), in({8, 1, 1})}, kNhwc));
  // The running value as the second operand, scalars, Clip with constant and absent bounds.
  v.push_back(chain("chain_operand_order", {"Mul", "Sub", "Div", "Clip", "Clip"}, {2, 2, 2, 3, 3},
                    {0, 1, 2, -1, -1, 3, -1, 4, 5, -1, -2, 5},
                    {in({3, 4, 5}), in({4, 1}), in({5}), in({}, kF32, 0.5, 2), scalar_const(-0.8),
                     scalar_const(0.9)}));
  // Every float step kind with non-default attributes, values kept in range.
  {
    Attributes a;
    a.set("s1_alpha", F(0.2f));          // LeakyRelu
    a.set("s3_alpha", F(0.7f));          // Elu
    a.set("s4_alpha", F(1.5f));          // Selu
    a.set("s4_gamma", F(0.9f));
    a.set("s5_alpha", F(1.3f));          // Celu
    a.set("s6_alpha", F(0.3f));          // HardSigmoid
    a.set("s6_beta", F(0.4f));
    a.set("s8_approximate", S("tanh"));  // Gelu
    a.set("s10_alpha", F(0.05f));        // ThresholdedRelu
    v.push_back(chain("chain_activations",
                      {"Tanh", "LeakyRelu", "Mul", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
                       "Gelu", "Softplus", "ThresholdedRelu", "Mish", "Softsign", "Sigmoid", "Sin", "Cos"},
                      {1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                      {0, -1, -1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1},
                      {in({4, 33}, kF32, -3, 3), scalar_const(2.5)}, kF, a));
  }
  v.push_back(chain("chain_math", {"Abs", "Add", "Sqrt", "Log", "Exp", "Reciprocal", "Neg", "Erf", "Pow", "Max",
                                   "Min", "PRelu"},
                    {1, 2, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2},
                    {0, -1, 1, -1, -1, -1, -1, -1, -1, -1, 2, -1, 3, 4, -1, -1, 5},
                    {in({3, 20}, kF32, -2, 2), scalar_const(0.5), konst(Tensor::from<int64_t>({}, {3})),
                     in({20}, kF32, -0.6, 0), in({3, 1}, kF32, -0.1, 0.4), in({20}, kF32, 0, 1)}));
  v.push_back(chain("chain_rounding", {"Mul", "Floor", "Add", "Ceil", "Sub", "Round", "Sign", "Relu"},
                    {2, 1, 2, 1, 2, 1, 1, 1}, {0, 1, -1, -1, 2, -1, -1, 2, -1, -1, -1},
                    {in({5, 8}, kF32, -3, 3), scalar_const(3.3), in({8}, kF32, -0.5, 0.5)}, kExact));
  v.push_back(chain("chain_pow_base_scalar", {"Mul", "Pow", "Div"}, {2, 2, 2}, {0, 1, 2, -1, -1, 3},
                    {in({30}, kF32, -5, 5), scalar_const(0.3), scalar_const(2), in({30}, kF32, 1, 2)}));
  v.push_back(chain("chain_f64", {"Sub", "Mul", "Tanh", "Add", "Sigmoid"}, {2, 2, 1, 2, 1},
                    {0, 1, -1, 2, -1, -1, 1, -1},
                    {in({4, 7}, kF64), in({7}, kF64), in({4, 1}, kF64)}, kExact));
  v.push_back(chain("chain_f16_inputs", {"Add", "Gelu"}, {2, 1}, {0, 1, -1},
                    {in({6, 16}, kF16), in({16}, kF16)}, kExact));
  v.back().tolerance = 2e-3;  // the CPU rounds the Add to float16 before Gelu
  v.push_back(chain("chain_first_broadcasts", {"Add", "Mul"}, {2, 2}, {0, 1, -1, 2},
                    {in({4, 1}), in({1, 6}), in({4, 6})}));
  v.push_back(chain("chain_empty", {"Add", "Relu"}, {2, 1}, {0, 1, -1}, {in({0, 6}), in({6})}, kExact));
  v.push_back(chain("chain_large", {"Mul", "Add", "Sigmoid", "Mul"}, {2, 2, 1, 2}, {0, 1, -1, 2, -1, 0, -1},
                    {in({2, 64, 57, 59}), in({64, 1, 1}), in({64, 1, 1})}, kNhwc));
  v.push_back(chain("chain_hard_swish_decomposed", {"Add", "Clip", "Mul", "Div"}, {2, 3, 2, 2},
                    {0, 1, -1, 2, 3, 0, -1, -1, 4},
                    {in({2, 4, 6, 6}, kF32, -5, 5), scalar_const(3), scalar_const(0), scalar_const(6),
                     scalar_const(6)}, kNhwc));
}

// Chains that read an absorbed concatenation (concat_parts): DenseNet's Concat -> affine -> ReLU
// in NHWC (parts of 8 and 16 channels: the vector kernel) and row-major, a last-axis concatenation
// of odd widths (the element kernel), one along axis 0, and many parts.
void concat_chain_cases(std::vector<OpCase>& v) {
  auto with_parts = [](int64_t parts, int64_t axis) {
    Attributes a;
    a.set("concat_parts", Attribute::Int(parts));
    a.set("concat_axis", Attribute::Int(axis));
    return a;
  };
  v.push_back(
      chain("chain_concat_affine_relu", {"Mul", "Add", "Relu"}, {2, 2, 1}, {0, 3, -1, 4, -1},
            {in({2, 8, 5, 6}), in({2, 16, 5, 6}), in({2, 8, 5, 6}), in({32, 1, 1}), in({32, 1, 1})},
            kNhwc, with_parts(3, 1)));
  v.push_back(chain("chain_concat_odd_last_axis", {"Sigmoid", "Mul"}, {1, 2}, {0, -1, 2},
                    {in({3, 5}), in({3, 7}), in({3, 12})}, kF, with_parts(2, -1)));
  v.push_back(chain("chain_concat_axis0", {"Add", "Tanh"}, {2, 1}, {3, 0, -1},
                    {in({1, 4, 8}), in({3, 4, 8}), in({2, 4, 8}), in({8})}, kF, with_parts(3, 0)));
  std::vector<CaseInput> many;
  for (int i = 0; i < 40; ++i) many.push_back(in({2, 8, 3, 3}));
  many.push_back(in({320, 1, 1}));
  v.push_back(chain("chain_concat_40_parts", {"Mul", "Relu"}, {2, 1}, {0, 40, -1}, std::move(many),
                    kNhwc, with_parts(40, 1)));
}

// Chains that read column ranges of wider tensors (col_slices: two per input, start and width;
// width 0 the whole input): SwiGLU's silu(gate) * up on the halves of one packed [B, S, 2N] GEMM
// result, N a multiple of 8 (the vector kernel, 16-byte aligned halves) and odd (the element
// kernel), a slice beside a whole input and a broadcast one, and one-step chains.
void col_slice_chain_cases(std::vector<OpCase>& v) {
  auto slices = [](std::vector<int64_t> s) {
    Attributes a;
    a.set("col_slices", Attribute::Ints(std::move(s)));
    return a;
  };
  for (int64_t n : {64, 37}) {
    const std::string w = std::to_string(n);
    CaseInput packed = in({2, 5, 2 * n}, kF32, -3, 3);
    v.push_back(chain("chain_col_slices_swiglu_" + w, {"Swish", "Mul"}, {1, 2}, {0, -1, 1},
                      {packed, packed}, kF, slices({0, n, n, n})));
  }
  v.push_back(chain("chain_col_slices_middle_and_whole", {"Add", "Mul", "Tanh"}, {2, 2, 1},
                    {0, 1, -1, 2, -1},
                    {in({3, 4, 40}), in({3, 4, 16}), in({16})}, kF, slices({8, 16, 0, 0, 0, 0})));
  v.push_back(chain("chain_col_slices_one_step", {"Relu"}, {1}, {0}, {in({4, 6, 24})}, kF,
                    slices({16, 8})));
  v.push_back(chain("chain_col_slices_one_step_odd", {"Sigmoid"}, {1}, {0}, {in({7, 29})}, kF,
                    slices({3, 11})));
}

// Random chains: op sequences, shapes, broadcasts and operand orders drawn from a fixed seed (the
// structure is the same in every run, so a failing case's name stays meaningful; the harness
// draws the values). Every op is defined and bounded on the values the chain can reach, so float16
// stays in range. Rank 4 cases also run NHWC.
void random_chain_cases(std::vector<OpCase>& v) {
  const char* kUnaryOps[] = {"Abs", "Neg",      "Relu",      "Sigmoid", "Tanh",      "Gelu",
                             "Erf", "Softsign", "HardSwish", "Swish",   "LeakyRelu", "HardSigmoid"};
  const char* kBinaryOps[] = {"Add", "Sub", "Mul", "Max", "Min"};
  std::mt19937 rng(20261126);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  for (int c = 0; c < 16; ++c) {
    const int rank = 1 + pick(4);
    std::vector<int64_t> out(static_cast<size_t>(rank));
    for (auto& d : out) d = 1 + pick(7);
    if (pick(2)) out.back() = 8 * (1 + pick(3));  // vector-friendly innermost dims half the time
    std::vector<CaseInput> ins = {in(out, kF32, -2, 2)};
    std::vector<std::string> ops;
    std::vector<int64_t> arity, operands;
    const int steps = 2 + pick(7);
    for (int s = 0; s < steps; ++s) {
      if (pick(5) < 2) {
        ops.push_back(kUnaryOps[pick(static_cast<int>(std::size(kUnaryOps)))]);
        arity.push_back(1);
        operands.push_back(s == 0 ? 0 : -1);
        continue;
      }
      ops.push_back(kBinaryOps[pick(static_cast<int>(std::size(kBinaryOps)))]);
      arity.push_back(2);
      // The other operand: a new input broadcasting into the chain (any dim 1 or full, leading
      // dims dropped), an input already used, or (after step 0) the chain's own input 0.
      int64_t other;
      if (ins.size() > 1 && pick(4) == 0) {
        other = 1 + pick(static_cast<int>(ins.size()) - 1);
      } else if (s > 0 && pick(6) == 0) {
        other = 0;
      } else {
        const int r = pick(rank + 1);
        std::vector<int64_t> shape(out.end() - r, out.end());
        for (auto& d : shape)
          if (pick(2)) d = 1;
        other = static_cast<int64_t>(ins.size());
        ins.push_back(in(shape, kF32, -1.5, 1.5));
      }
      const int64_t cur = s == 0 ? 0 : -1;
      if (pick(2)) {
        operands.push_back(cur);
        operands.push_back(other);
      } else {
        operands.push_back(other);
        operands.push_back(cur);
      }
    }
    v.push_back(chain("chain_random_" + std::to_string(c), std::move(ops), std::move(arity),
                      std::move(operands), std::move(ins), rank == 4 ? kNhwc : kF));
  }
}

}  // namespace

std::vector<OpCase> elementwise_cases() {
  std::vector<OpCase> v;
  unary_cases(v);
  activation_cases(v);
  binary_cases(v);
  compare_logic_cases(v);
  variadic_cases(v);
  where_clip_cases(v);
  cast_cases(v);
  chain_cases(v);
  random_chain_cases(v);
  concat_chain_cases(v);
  col_slice_chain_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
