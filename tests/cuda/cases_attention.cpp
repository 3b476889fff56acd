// ONNX Attention cases (layers/attention_onnx.cu; built at -O0, so no case is mapped onto
// kiln.Attention): 3-D and 4-D inputs, grouped-query heads, additive and boolean masks (also
// shorter than the keys), is_causal, past key/value with present outputs, softcap, left/right
// windows, nonpad_kv_seqlen, softmax_precision, every qk_matmul_output_mode, fully masked rows,
// long rows, float16/bfloat16/float64; and the 16-bit Softmax and kiln.Attention paths that round
// like the CPU reference.
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
  return v;
}

}  // namespace kiln::gpu::test
