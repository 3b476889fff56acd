// Low-bit types and the ops that came to the GPU with them: Cast/CastLike from and to float8
// (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz; saturate 0/1; NaN, +-Inf, ties, out-of-range, subnormal
// inputs) and int4/uint4 (wrap-around), QuantizeLinear/DequantizeLinear with float8 and
// int4/uint4 (per tensor, per axis, zero points), Einsum (matmul, transpose, sums, diagonals,
// "...", three inputs, integers, float64, empty) and RotaryEmbedding (4-D, 3-D packed,
// interleaved, partial rotary_embedding_dim, with and without position_ids). Float8 and 4-bit
// outputs are compared bit for bit with the CPU reference.
#include <cmath>
#include <limits>

#include "backend_ops.h"

namespace kiln::gpu::test {

namespace {

using Modes = std::vector<std::string>;
const Modes kF = {"fp32", "fp16"};
const Modes kExact = {"fp32"};
constexpr DataType kF32 = DataType::kFloat32, kF16 = DataType::kFloat16,
                   kF64 = DataType::kFloat64, kI8 = DataType::kInt8, kU8 = DataType::kUInt8,
                   kI32 = DataType::kInt32, kI64 = DataType::kInt64,
                   kE4 = DataType::kFloat8E4M3FN, kE4U = DataType::kFloat8E4M3FNUZ,
                   kE5 = DataType::kFloat8E5M2, kE5U = DataType::kFloat8E5M2FNUZ,
                   kI4 = DataType::kInt4, kU4 = DataType::kUInt4;
const DataType kFloat8[] = {kE4, kE4U, kE5, kE5U};



Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute Sa(const char* v) { return Attribute::String(v); }
std::string tname(DataType t) { return std::string(dtype_name(t)); }

// Values that exercise every corner of the float8 formats: NaN, infinities, the largest
// finite values and beyond (448, 57344, 240), ties between codes, subnormals, negative zero.
std::vector<double> float8_corners() {
  const double inf = std::numeric_limits<double>::infinity();
  return {std::nan(""), inf,      -inf,     0.0,     -0.0,     1.0,      -1.0,   1.0625,
          1.125,        1.1875,   448.0,    464.0,   480.0,    1e6,      -1e6,   240.0,
          248.0,        57344.0,  61440.0,  -61440., 0.001953125, 0.0009765625, 1e-9, 3.14159,
          -2.71828,     0.3,      0.0146484375, 100.5, -7.5,   65504.0,  0.5,    -0.25};
}

void cast_cases(std::vector<OpCase>& v) {
  const std::vector<double> corners = float8_corners();
  const int64_t nc = static_cast<int64_t>(corners.size());
  for (DataType t : kFloat8) {
    for (int sat = 0; sat < 2; ++sat) {
      const Attributes a = attrs({{"to", I(static_cast<int64_t>(t))}, {"saturate", I(sat)}});
      const std::string s = sat ? "" : "_nosat";
      v.push_back(make_case("cast_f32_to_" + tname(t) + s, "Cast", a, {fixed({nc}, corners)}, kExact));
      v.push_back(make_case("cast_f32r_to_" + tname(t) + s, "Cast", a, {in({4, 33}, kF32, -600, 600)},
                       kExact));
      v.push_back(make_case("cast_f16_to_" + tname(t) + s, "Cast", a,
                       {fixed({nc}, corners, kF16)}, kExact));
      v.push_back(make_case("castlike_f32_to_" + tname(t) + s, "CastLike",
                       attrs({{"saturate", I(sat)}}), {fixed({nc}, corners), in({1}, t)}, kExact));
    }
    const Attributes to_f32 = attrs({{"to", I(static_cast<int64_t>(kF32))}});
    v.push_back(make_case("cast_" + tname(t) + "_to_f32", "Cast", to_f32,
                     {fixed({nc}, corners, t)}, kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_f16", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(kF16))}}), {in({50}, t, -300, 300)},
                     kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_int8", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(kI8))}}), {fixed({nc}, corners, t)},
                     kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_e5m2", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(kE5))}}), {fixed({nc}, corners, t)},
                     kExact));
    v.push_back(make_case("cast_" + tname(t) + "_empty", "Cast", to_f32, {in({0, 3}, t)}, kExact));
  }
  for (DataType t : {kI4, kU4}) {
    const Attributes to4 = attrs({{"to", I(static_cast<int64_t>(t))}});
    v.push_back(make_case("cast_f32_to_" + tname(t), "Cast", to4,
                     {fixed({12}, {0, 1.9, -1.9, 7, 8, -8, -9, 15, 16, 100.7, std::nan(""), -1e30})},
                     kExact));
    v.push_back(make_case("cast_i32_to_" + tname(t), "Cast", to4, {in({40}, kI32, -40, 40)}, kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_f32", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(kF32))}}), {in({30}, t, -8, 15)}, kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_int8", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(t == kI4 ? kI8 : kU8))}}),
                     {in({30}, t, -8, 15)}, kExact));
    v.push_back(make_case("cast_" + tname(t) + "_to_e4m3fn", "Cast",
                     attrs({{"to", I(static_cast<int64_t>(kE4))}}), {in({30}, t, -8, 15)}, kExact));
    v.push_back(make_case("castlike_f16_to_" + tname(t), "CastLike", {},
                     {in({30}, kF16, -20, 20), in({2}, t)}, kExact));
    v.push_back(make_case("cast_" + tname(t) + "_empty", "Cast", to4, {in({3, 0}, kF32)}, kExact));
  }
}

void quant_cases(std::vector<OpCase>& v) {
  const std::string q = "QuantizeLinear", dq = "DequantizeLinear";
  const std::vector<double> corners = float8_corners();
  const int64_t nc = static_cast<int64_t>(corners.size());
  for (DataType t : kFloat8) {
    for (int sat = 0; sat < 2; ++sat) {
      const std::string s = sat ? "" : "_nosat";
      v.push_back(make_case("quantize_" + tname(t) + s, q, attrs({{"saturate", I(sat)}}),
                       {fixed({nc}, corners), konst(Tensor::scalar<float>(0.5f)),
                        konst(Tensor::from<double>({}, {0.0}).cast(t))},
                       kExact));
    }
    v.push_back(make_case("quantize_" + tname(t) + "_axis_zp", q, attrs({{"axis", I(1)}}),
                     {in({2, 3, 5}, kF32, -500, 500),
                      konst(Tensor::from<double>({3}, {0.5, 2.0, 0.125}).cast(kF32)),
                      konst(Tensor::from<double>({3}, {1.0, -2.0, 0.0}).cast(t))},
                     kExact));
    v.push_back(make_case("dequantize_" + tname(t), dq, {},
                     {fixed({nc}, corners, t), konst(Tensor::scalar<float>(0.25f))}, kExact));
    v.push_back(make_case("dequantize_" + tname(t) + "_axis_zp_f16", dq, attrs({{"axis", I(0)}}),
                     {in({3, 7}, t, -100, 100),
                      konst(Tensor::from<double>({3}, {0.5, 2.0, 0.125}).cast(kF16)),
                      konst(Tensor::from<double>({3}, {1.0, -2.0, 0.0}).cast(t))},
                     kExact));
    v.push_back(make_case("quantize_" + tname(t) + "_empty", q, {},
                     {in({0, 4}, kF32), konst(Tensor::scalar<float>(0.5f)),
                      konst(Tensor::from<double>({}, {0.0}).cast(t))},
                     kExact));
  }
  for (DataType t : {kI4, kU4}) {
    const double zp = t == kI4 ? -1 : 3;
    v.push_back(make_case("quantize_" + tname(t), q, {},
                     {fixed({10}, {0, 0.49, 0.5, 1.5, 2.5, -2.5, 100, -100, std::nan(""), 3.7}),
                      konst(Tensor::scalar<float>(0.5f)),
                      konst(Tensor::from<double>({}, {zp}).cast(t))},
                     kExact));
    v.push_back(make_case("quantize_" + tname(t) + "_axis", q, attrs({{"axis", I(0)}}),
                     {in({4, 6}, kF32, -10, 10),
                      konst(Tensor::from<double>({4}, {0.5, 1.0, 2.0, 0.25}).cast(kF32)),
                      konst(Tensor::from<double>({4}, {0, 1, 2, 3}).cast(t))},
                     kExact));
    v.push_back(make_case("quantize_" + tname(t) + "_blocked", q,
                     attrs({{"axis", I(1)}, {"block_size", I(2)}}),
                     {in({2, 5}, kF32, -6, 6), konst_random({2, 3}, 1.0)}, kExact));
    v.back().inputs[1] = konst(Tensor::from<double>({2, 3}, {0.5, 1, 2, 0.25, 0.75, 1.5}).cast(kF32));
    v.back().inputs.push_back(konst(Tensor::from<double>({2, 3}, {0, 1, 2, 3, 1, 0}).cast(t)));
    v.push_back(make_case("dequantize_" + tname(t), dq, {},
                     {in({20}, t, -8, 15), konst(Tensor::scalar<float>(0.5f)),
                      konst(Tensor::from<double>({}, {zp}).cast(t))},
                     kExact));
    v.push_back(make_case("dequantize_" + tname(t) + "_axis", dq, attrs({{"axis", I(1)}}),
                     {in({2, 3}, t, -8, 15),
                      konst(Tensor::from<double>({3}, {0.5, 1.0, 2.0}).cast(kF32))},
                     kExact));
  }
}

void einsum_cases(std::vector<OpCase>& v) {
  struct E {
    const char* name;
    const char* eq;
    std::vector<std::vector<int64_t>> shapes;
  };
  const E es[] = {
      {"batch_matmul", "bij,bjk->bik", {{3, 2, 5}, {3, 5, 4}}},
      {"matmul_implicit", "ij,jk", {{4, 6}, {6, 3}}},
      {"transpose", "ij->ji", {{3, 7}}},
      {"sum_rows", "ij->i", {{5, 9}}},
      {"sum_all", "ij->", {{4, 5}}},
      {"inner", "i,i", {{17}, {17}}},
      {"outer", "i,j->ij", {{5}, {4}}},
      {"diagonal", "ii->i", {{6, 6}}},
      {"trace", "ii", {{5, 5}}},
      {"batch_diagonal", "...ii->...i", {{2, 3, 4, 4}}},
      {"ellipsis_bcast", "...ij,...jk->...ik", {{2, 1, 3, 4}, {5, 4, 2}}},
      {"three_inputs", "ij,jk,kl->il", {{3, 4}, {4, 5}, {5, 2}}},
      {"upper_lower", "Ab,bA->", {{3, 4}, {4, 3}}},
      {"empty_out", "ij,jk->ik", {{0, 3}, {3, 4}}},
      {"empty_sum", "ij,jk->ik", {{2, 0}, {0, 4}}},
  };
  for (const E& e : es) {
    auto ins = [&](DataType t, double lo, double hi) {
      std::vector<CaseInput> r;
      for (const auto& s : e.shapes) r.push_back(in(s, t, lo, hi));
      return r;
    };
    const Attributes a = attrs({{"equation", Sa(e.eq)}});
    v.push_back(make_case(std::string("einsum_") + e.name, "Einsum", a, ins(kF32, -1, 1), kF));
    v.push_back(make_case(std::string("einsum_") + e.name + "_f64", "Einsum", a, ins(kF64, -1, 1),
                     kExact));
    v.push_back(make_case(std::string("einsum_") + e.name + "_i32", "Einsum", a, ins(kI32, -9, 9),
                     kExact));
  }
  v.push_back(make_case("einsum_i64_wrap", "Einsum", attrs({{"equation", Sa("i,i->")}}),
                   {in({8}, kI64, -4e9, 4e9), in({8}, kI64, -4e9, 4e9)}, kExact));
  v.push_back(make_case("einsum_i8", "Einsum", attrs({{"equation", Sa("ij,jk->ik")}}),
                   {in({3, 8}, kI8, -20, 20), in({8, 2}, kI8, -20, 20)}, kExact));
}

void rotary_cases(std::vector<OpCase>& v) {
  const int64_t B = 2, H = 3, S = 4, D = 8, P = 10;
  auto pos = [&](int64_t b) {
    std::vector<double> p;
    for (int64_t i = 0; i < b * S; ++i) p.push_back(static_cast<double>((i * 7 + 3) % P));
    return fixed({b, S}, p, kI64);
  };
  for (DataType t : {kF32, kF16}) {
    const std::string s = t == kF16 ? "_f16" : "";
    const Modes m = t == kF16 ? kExact : kF;
    v.push_back(make_case("rotary_4d" + s, "RotaryEmbedding", {},
                     {in({B, H, S, D}, t), in({P, D / 2}, t), in({P, D / 2}, t), pos(B)}, m));
    v.push_back(make_case("rotary_4d_interleaved" + s, "RotaryEmbedding", attrs({{"interleaved", I(1)}}),
                     {in({B, H, S, D}, t), in({P, D / 2}, t), in({P, D / 2}, t), pos(1)}, m));
    v.push_back(make_case("rotary_3d_rotary_dim" + s, "RotaryEmbedding",
                     attrs({{"num_heads", I(H)}, {"rotary_embedding_dim", I(4)}}),
                     {in({B, S, H * D}, t), in({P, 2}, t), in({P, 2}, t), pos(B)}, m));
    v.push_back(make_case("rotary_3d_interleaved_rotary_dim" + s, "RotaryEmbedding",
                     attrs({{"num_heads", I(H)}, {"rotary_embedding_dim", I(6)},
                            {"interleaved", I(1)}}),
                     {in({B, S, H * D}, t), in({P, 3}, t), in({P, 3}, t), pos(B)}, m));
    v.push_back(make_case("rotary_no_pos_3d_cache" + s, "RotaryEmbedding", {},
                     {in({B, H, S, D}, t), in({B, S, D / 2}, t), in({B, S, D / 2}, t)}, m));
    v.push_back(make_case("rotary_no_pos_2d_cache" + s, "RotaryEmbedding",
                     attrs({{"num_heads", I(H)}}),
                     {in({B, S, H * D}, t), in({S, D / 2}, t), in({S, D / 2}, t)}, m));
  }
  // Head size 64 in float16: rotary_half8_kernel (16-byte chunks), with and without positions.
  v.push_back(make_case("rotary_3d_d64_chunks_f16", "RotaryEmbedding", attrs({{"num_heads", I(H)}}),
                        {in({B, 5, H * 64}, kF16), in({5, 32}, kF16), in({5, 32}, kF16)}, kExact));
  v.push_back(make_case("rotary_4d_d64_chunks_pos_f16", "RotaryEmbedding", {},
                        {in({B, H, S, 64}, kF16), in({P, 32}, kF16), in({P, 32}, kF16), pos(B)},
                        kExact));
  // A head range (kiln_head_begin, kiln_head_end): one rotary over the Q and K heads of a packed
  // Q | K | V projection, the V heads copied; 3-D with positions and without, 4-D, and head size 64
  // in float16 (the chunk kernel's copy of the heads outside the range).
  auto range = [&](int64_t heads, int64_t b, int64_t e) {
    return attrs({{"num_heads", I(heads)}, {"kiln_head_begin", I(b)}, {"kiln_head_end", I(e)}});
  };
  for (DataType t : {kF32, kF16}) {
    const std::string s = t == kF16 ? "_f16" : "";
    const Modes m = t == kF16 ? kExact : kF;
    v.push_back(make_case("rotary_3d_head_range_qkv" + s, "RotaryEmbedding", range(8, 0, 6),
                          {in({B, S, 8 * D}, t), in({P, D / 2}, t), in({P, D / 2}, t), pos(B)}, m));
    v.push_back(make_case("rotary_3d_head_range_middle" + s, "RotaryEmbedding", range(5, 1, 3),
                          {in({B, S, 5 * D}, t), in({S, D / 2}, t), in({S, D / 2}, t)}, m));
    Attributes a4 = attrs({{"kiln_head_begin", I(1)}, {"kiln_head_end", I(2)}});
    v.push_back(make_case("rotary_4d_head_range" + s, "RotaryEmbedding", a4,
                          {in({B, H, S, D}, t), in({P, D / 2}, t), in({P, D / 2}, t), pos(B)}, m));
  }
  v.push_back(make_case("rotary_3d_d64_chunks_head_range_f16", "RotaryEmbedding", range(4, 0, 3),
                        {in({B, 5, 4 * 64}, kF16), in({5, 32}, kF16), in({5, 32}, kF16)}, kExact));
  v.push_back(make_case("rotary_3d_d64_chunks_head_range_pos_f16", "RotaryEmbedding", range(4, 1, 3),
                        {in({B, S, 4 * 64}, kF16), in({P, 32}, kF16), in({P, 32}, kF16), pos(B)},
                        kExact));
  v.push_back(make_case("rotary_empty", "RotaryEmbedding", {},
                   {in({0, H, S, D}), in({P, D / 2}), in({P, D / 2}), fixed({0, S}, {}, kI64)},
                   kExact));
}

}  // namespace

std::vector<OpCase> types_cases() {
  std::vector<OpCase> v;
  cast_cases(v);
  quant_cases(v);
  einsum_cases(v);
  rotary_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
