// ONNX Attention cases (layers/attention_onnx.cu; built at -O0, so no case is mapped onto
// kiln.Attention): 3-D and 4-D inputs, grouped-query heads, additive and boolean masks (also
// shorter than the keys), is_causal, past key/value with present outputs, softcap, left/right
// windows, nonpad_kv_seqlen, softmax_precision, every qk_matmul_output_mode, fully masked rows,
// long rows, float16/bfloat16/float64; the 16-bit Softmax and kiln.Attention paths that round
// like the CPU reference; and kiln.Attention under workspace limits its scores exceed (chunks).
#include <limits>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

using Modes = std::vector<std::string>;
const Modes kFloatModes = {"fp32", "fp16"};
const Modes kExact = {"fp32"};

struct Spec {
  std::string name;
  std::vector<int64_t> q, k, v;
  CaseInput mask = absent(), past_k = absent(), past_v = absent(), nonpad = absent();
  Attributes a = {};  // an initializer: cases that leave it out warn under -Wextra otherwise
  int outputs = 4;
  Modes modes = kFloatModes;
  DataType t = DataType::kFloat32;
  double tolerance = 0;
};

OpCase make(Spec s) {
  OpCase c;
  c.name = "attention_onnx_" + s.name;
  c.op_type = "Attention";
  c.attrs = std::move(s.a);
  c.inputs = {in(s.q, s.t),        in(s.k, s.t),        in(s.v, s.t),       std::move(s.mask),
              std::move(s.past_k), std::move(s.past_v), std::move(s.nonpad)};
  while (!c.inputs.empty() && c.inputs.back().absent) c.inputs.pop_back();
  c.num_outputs = s.outputs;
  c.modes = std::move(s.modes);
  c.tolerance = s.tolerance;
  return c;
}

// A non-constant input with fixed values.
CaseInput fixed(Tensor t) {
  CaseInput c = konst(std::move(t));
  c.constant = false;
  return c;
}

Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute F(float v) { return Attribute::Float(v); }

// kiln.Attention under a workspace limit its scores exceed (layers/attention_chunks.h; the
// pieces each limit makes are test_attention_chunks.cpp's): Q, Kt, V of type `t` and the mask.
OpCase chunked(std::string name, std::vector<int64_t> q, std::vector<int64_t> kt,
               std::vector<int64_t> vv, CaseInput mask, size_t limit, Modes modes = kFloatModes,
               DataType t = DataType::kFloat32, int nan_to_zero = 0) {
  OpCase c;
  c.name = "kiln_attention_chunked_" + name;
  c.op_type = "Attention";
  c.domain = "kiln";
  c.attrs = attrs({{"scale", F(0.35f)}, {"nan_to_zero", I(nan_to_zero)}});
  c.inputs = {in(std::move(q), t, -2, 2), in(std::move(kt), t, -2, 2), in(std::move(vv), t)};
  if (!mask.absent) {
    if (!mask.value) mask.dtype = t;
    c.inputs.push_back(std::move(mask));
  }
  c.modes = std::move(modes);
  c.workspace_limit = limit;
  return c;
}

// A causal mask [1, 1, S, S] (-inf above the diagonal) with row `full_row` masked entirely.
CaseInput causal_mask(int64_t s, int64_t full_row) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<double> m(static_cast<size_t>(s * s), 0.0);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j)
      if (j > i || i == full_row) m[static_cast<size_t>(i * s + j)] = ninf;
  return fixed(Tensor::from<double>({1, 1, s, s}, m).cast(DataType::kFloat32));
}

// The scores of each case outgrow its limit: batch x heads in even pieces of whole heads, or,
// where one head's scores do not fit, pieces of its query rows (shorter last pieces included).
void chunked_cases(std::vector<OpCase>& v) {
  // 3 heads of 37 x 45 scores (6.5 KiB in float32) under 16 KiB: 2 + 1 heads a piece (fp16,
  // with its float16 probabilities beside the scores: 1 head).
  v.push_back(chunked("heads", {2, 3, 37, 8}, {2, 3, 8, 45}, {2, 3, 45, 5}, absent(), 16 << 10));
  // A key-padding mask [B, 1, 1, Sk]; 300 keys, 6 query rows (fp16: 4) a piece.
  v.push_back(chunked("rows_padding", {2, 2, 53, 16}, {2, 2, 16, 300}, {2, 2, 300, 7},
                      in({2, 1, 1, 300}, DataType::kFloat32, -6, 0), 8 << 10));
  // A full mask [B, H, Sq, Sk], 2 heads a piece.
  v.push_back(chunked("full_mask", {3, 4, 29, 8}, {3, 4, 8, 31}, {3, 4, 31, 7}, in({3, 4, 29, 31}),
                      8 << 10));
  // Causal, 14 rows a piece, row 40 fully masked (0 with nan_to_zero, NaN without).
  for (int nz : {0, 1})
    v.push_back(chunked(nz ? "causal_rows_nan_to_zero" : "causal_rows", {1, 2, 70, 8},
                        {1, 2, 8, 70}, {1, 2, 70, 3}, causal_mask(70, 40), 4 << 10, kFloatModes,
                        DataType::kFloat32, nz));
  // V wider than the scores (batch [1, 3] and Y's [2, 3]); Kt shared by the heads; 3-D.
  v.push_back(chunked("v_wider", {1, 3, 11, 8}, {1, 3, 8, 13}, {2, 3, 13, 4}, absent(), 1 << 10));
  v.push_back(chunked("kt_shared_row_mask", {2, 3, 17, 8}, {2, 1, 8, 19}, {2, 1, 19, 5}, in({19}),
                      2 << 10));
  v.push_back(chunked("3d_mask", {5, 33, 12}, {5, 12, 41}, {5, 41, 9}, in({33, 41}), 12 << 10));
  // float64 scores; bfloat16 (float32 scores, bfloat16 probabilities, rounded as the reference).
  v.push_back(chunked("float64", {2, 4, 19, 6}, {2, 4, 6, 23}, {2, 4, 23, 3}, in({2, 4, 19, 23}),
                      4 << 10, kExact, DataType::kFloat64));
  OpCase bf16 = chunked("bf16", {2, 3, 21, 8}, {2, 3, 8, 26}, {2, 3, 26, 4}, in({2, 1, 21, 26}),
                        4 << 10, kExact, DataType::kBFloat16);
  bf16.tolerance = 1e-2;
  v.push_back(bf16);
}

}  // namespace

std::vector<OpCase> attention_cases() {
  std::vector<OpCase> v;
  v.push_back(make({.name = "plain_y_only",
                    .q = {2, 3, 5, 8},
                    .k = {2, 3, 6, 8},
                    .v = {2, 3, 6, 4},
                    .outputs = 1}));
  // Grouped-query heads, past key/value, causal (offset by the past), every output.
  v.push_back(make({.name = "gqa_past_causal",
                    .q = {2, 4, 3, 8},
                    .k = {2, 2, 5, 8},
                    .v = {2, 2, 5, 6},
                    .past_k = in({2, 2, 4, 8}),
                    .past_v = in({2, 2, 4, 6}),
                    .a = attrs({{"is_causal", I(1)}})}));
  // 3-D packed heads, softcap, scale, an additive mask over [Sq, L], scores before the mask.
  v.push_back(make({.name = "packed_softcap_mask",
                    .q = {2, 3, 16},
                    .k = {2, 5, 8},
                    .v = {2, 5, 12},
                    .mask = in({3, 5}),
                    .a = attrs({{"q_num_heads", I(4)},
                                {"kv_num_heads", I(2)},
                                {"softcap", F(0.75f)},
                                {"scale", F(2.f)},
                                {"qk_matmul_output_mode", I(1)}})}));
  // A boolean mask shorter than the keys (the rest is masked), scores with the bias (-inf).
  v.push_back(make({.name = "bool_mask_padded",
                    .q = {2, 2, 3, 8},
                    .k = {2, 2, 6, 8},
                    .v = {2, 2, 6, 5},
                    .mask = in({2, 1, 3, 4}, DataType::kBool),
                    .a = attrs({{"qk_matmul_output_mode", I(2)}})}));
  // Sliding window around the diagonal, probabilities out.
  v.push_back(make({.name = "window",
                    .q = {1, 2, 7, 8},
                    .k = {1, 2, 7, 8},
                    .v = {1, 2, 7, 8},
                    .a = attrs({{"left_window_size", I(2)},
                                {"right_window_size", I(1)},
                                {"qk_matmul_output_mode", I(3)}})}));
  // nonpad_kv_seqlen with is_causal: the causal offset is nonpad - q_len per batch.
  v.push_back(make({.name = "nonpad_causal",
                    .q = {2, 2, 3, 8},
                    .k = {2, 2, 6, 8},
                    .v = {2, 2, 6, 4},
                    .nonpad = fixed(Tensor::from<int64_t>({2}, {4, 6})),
                    .a = attrs({{"is_causal", I(1)}, {"qk_matmul_output_mode", I(3)}})}));
  {
    // Row 1 of the boolean mask false everywhere: zeros in Y and in the probabilities.
    Tensor m(DataType::kBool, {3, 6});
    for (int j = 0; j < 18; ++j) m.data<bool>()[j] = j / 6 != 1;
    m.data<bool>()[2 * 6 + 3] = false;
    v.push_back(make({.name = "fully_masked_row",
                      .q = {2, 2, 3, 8},
                      .k = {2, 2, 6, 8},
                      .v = {2, 2, 6, 4},
                      .mask = konst(std::move(m)),
                      .a = attrs({{"qk_matmul_output_mode", I(3)}})}));
  }
  // Long rows: many keys per block, a head size over the block width.
  v.push_back(make({.name = "long_rows",
                    .q = {1, 4, 256},
                    .k = {1, 1500, 128},
                    .v = {1, 1500, 128},
                    .mask = in({1, 1, 4, 1500}),
                    .a = attrs({{"q_num_heads", I(2)}, {"kv_num_heads", I(1)}}),
                    .outputs = 1}));
  // 16-bit inputs round after every step as the reference does; softmax_precision float.
  v.push_back(make({.name = "fp16_softmax_float",
                    .q = {2, 2, 4, 8},
                    .k = {2, 2, 6, 8},
                    .v = {2, 2, 6, 4},
                    .mask = in({2, 2, 4, 6}, DataType::kFloat16),
                    .a = attrs({{"softmax_precision", I(1)}, {"is_causal", I(1)}}),
                    .modes = kExact,
                    .t = DataType::kFloat16,
                    .tolerance = 1e-2}));
  v.push_back(make({.name = "bf16_past_softcap",
                    .q = {1, 2, 3, 8},
                    .k = {1, 2, 3, 8},
                    .v = {1, 2, 3, 4},
                    .past_k = in({1, 2, 2, 8}, DataType::kBFloat16),
                    .past_v = in({1, 2, 2, 4}, DataType::kBFloat16),
                    .a = attrs({{"softcap", F(1.5f)}, {"qk_matmul_output_mode", I(3)}}),
                    .modes = kExact,
                    .t = DataType::kBFloat16,
                    .tolerance = 2e-2}));
  v.push_back(make({.name = "float64_past_causal_window",
                    .q = {2, 2, 3, 5},
                    .k = {2, 1, 4, 5},
                    .v = {2, 1, 4, 3},
                    .past_k = in({2, 1, 2, 5}, DataType::kFloat64),
                    .past_v = in({2, 1, 2, 3}, DataType::kFloat64),
                    .a = attrs({{"is_causal", I(1)}, {"left_window_size", I(3)}}),
                    .modes = kExact,
                    .t = DataType::kFloat64}));
  // The 16-bit paths that round like the CPU reference: Softmax of a float16/bfloat16 model
  // (over the last axis and an inner one), kiln.Attention in bfloat16 (mapped ONNX Attention).
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16})
    for (int64_t axis : {-1, 1}) {
      OpCase c;
      c.name = fmt::format("softmax16_{}_axis{}", dtype_name(t), axis < 0 ? "last" : "1");
      c.op_type = "Softmax";
      c.attrs = attrs({{"axis", I(axis)}});
      c.inputs = {in({3, 40, 7}, t, -4, 4)};
      c.modes = kExact;
      c.tolerance = 1e-3;  // a rare one-ulp difference of exp
      v.push_back(c);
    }
  {
    OpCase c;
    c.name = "kiln_attention_bf16_mask";
    c.op_type = "Attention";
    c.domain = "kiln";
    c.attrs = attrs({{"scale", F(0.35f)}, {"nan_to_zero", I(1)}});
    const DataType t = DataType::kBFloat16;
    c.inputs = {in({2, 3, 5, 8}, t), in({2, 3, 8, 6}, t), in({2, 3, 6, 4}, t), in({2, 1, 5, 6}, t)};
    c.modes = kExact;
    c.tolerance = 1e-2;
    v.push_back(c);
  }
  chunked_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
