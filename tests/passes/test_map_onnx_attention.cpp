// map_onnx_attention: ONNX's Attention op becomes kiln.Attention where the semantics fit, and
// outputs agree before and after on the CPU reference.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

int count_kiln_attention(const Graph& g) {
  int n = 0;
  for (const Node* x : g.nodes()) n += x->domain == "kiln" && x->op_type == "Attention";
  return n;
}

Node* attention(G& b, std::vector<Value*> ins, Attributes a = {}, size_t nout = 1) {
  return b.node("Attention", std::move(ins), std::move(a), nout);
}

TEST(MapOnnxAttention, AdditiveMaskAndScale) {
  G b;
  Value* q = b.in("q", {2, 3, 5, 4});
  Value* k = b.in("k", {2, 3, 6, 4});
  Value* v = b.in("v", {2, 3, 6, 8});
  Value* mask = b.in("mask", {2, 1, 5, 6});
  b.out(attention(b, {q, k, v, mask}, attrs({{"scale", Attribute::Float(0.3f)}}))->output(0));
  b.out(attention(b, {q, k, v})->output(0));  // default scale 1/sqrt(4)
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 2);
  EXPECT_EQ(count(*opt, "Transpose"), 2);
  for (const Node* n : opt->nodes()) {
    if (n->domain == "kiln") {
      EXPECT_EQ(n->attrs.get_int("nan_to_zero", 0), 1);
    }
  }
}

TEST(MapOnnxAttention, CausalAndBooleanMask) {
  G b;
  Value* q = b.in("q", {1, 2, 4, 4});
  Value* k = b.in("k", {1, 2, 4, 4});
  Value* v = b.in("v", {1, 2, 4, 4});
  Tensor bm(DataType::kBool, {4, 4});
  for (int64_t i = 0; i < 16; ++i) bm.data<bool>()[i] = (i % 3) != 0;
  Value* mask = b.c(bm);
  b.out(attention(b, {q, k, v}, attrs({{"is_causal", Attribute::Int(1)}}))->output(0));
  b.out(attention(b, {q, k, v, mask})->output(0));
  b.out(attention(b, {q, k, v, mask}, attrs({{"is_causal", Attribute::Int(1)}}))->output(0));
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 3);
  EXPECT_EQ(count(*opt, "Where"), 2);
}

TEST(MapOnnxAttention, GroupedQueryHeadsAndPackedHeads) {
  G b;
  Value* q = b.in("q", {2, 4, 3, 4});
  Value* k = b.in("k", {2, 2, 5, 4});
  Value* v = b.in("v", {2, 2, 5, 6});
  Value* mask = b.in("mask", {2, 1, 3, 5});
  Tensor bm(DataType::kBool, {3, 5});
  for (int64_t i = 0; i < 15; ++i) bm.data<bool>()[i] = (i % 4) != 1;
  b.out(attention(b, {q, k, v, mask})->output(0));
  b.out(attention(b, {q, k, v, b.c(bm)}, attrs({{"is_causal", Attribute::Int(1)}}))->output(0));
  Value* q3 = b.in("q3", {2, 3, 8});
  Value* k3 = b.in("k3", {2, 5, 4});
  Value* v3 = b.in("v3", {2, 5, 6});
  Attributes heads =
      attrs({{"q_num_heads", Attribute::Int(4)}, {"kv_num_heads", Attribute::Int(2)}});
  b.out(attention(b, {q3, k3, v3}, heads)->output(0));
  Attributes same =
      attrs({{"q_num_heads", Attribute::Int(2)}, {"kv_num_heads", Attribute::Int(2)}});
  b.out(attention(b, {q3, q3, q3}, same)->output(0));
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 4);
  EXPECT_EQ(count(*opt, "Attention"), 4);
}

TEST(MapOnnxAttention, OtherFormsStayAsTheyAre) {
  G b;
  Value* q = b.in("q", {1, 4, 3, 4});
  Value* k4 = b.in("k4", {1, 4, 3, 4});
  Value* v4 = b.in("v4", {1, 4, 3, 4});
  Value* pk = b.in("pk", {1, 4, 2, 4});
  Value* pv = b.in("pv", {1, 4, 2, 4});
  Value* short_mask = b.in("short_mask", {3, 2});
  b.out(attention(b, {q, k4, v4, nullptr, pk, pv}, {}, 3)->output(0));  // past key/value
  b.out(attention(b, {q, k4, v4}, attrs({{"softcap", Attribute::Float(2.f)}}))->output(0));
  b.out(attention(b, {q, k4, v4, short_mask})->output(0));  // mask padded to the keys
  Node* qk = attention(b, {q, k4, v4}, attrs({{"qk_matmul_output_mode", Attribute::Int(0)}}), 4);
  b.out(qk->output(0));
  b.out(qk->output(3));  // scores are an output
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 0);
  EXPECT_EQ(count(*opt, "Attention"), 4);
}

// Grouped-query heads: K and V repeated to Q's heads (Unsqueeze, Tile, Reshape), so a mask per
// query head applies as it is; 3-D inputs whose heads are split from projections then fold into
// one kiln.MultiHeadAttention reading the K/V heads in place.
TEST(MapOnnxAttention, GroupedHeadsAreRepeatedInTheExportersForm) {
  G b;
  Value* q = b.in("q", {1, 4, 3, 4});
  Value* k2 = b.in("k2", {1, 2, 3, 4});
  b.out(attention(b, {q, k2, k2, b.in("head_mask", {1, 4, 3, 3})})->output(0));
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 1);
  EXPECT_EQ(count(*opt, "Tile"), 2);

  G p;  // projections of one x, heads packed in the last dim
  Value* x = p.in("x", {2, 5, 16});
  auto proj = [&](int64_t n) { return p.op("MatMul", {x, p.c(rand_t({16, n}))}); };
  Attributes heads =
      attrs({{"q_num_heads", Attribute::Int(4)}, {"kv_num_heads", Attribute::Int(2)}});
  p.out(attention(p, {proj(16), proj(8), proj(8)}, heads)->output(0));
  auto folded =
      optimize_checked(p.g, {"map_onnx_attention", "fold_attention_heads", "eliminate_dead_code"});
  ASSERT_EQ(count(*folded, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*folded, "Tile"), 0);
  EXPECT_EQ(find_op(*folded, "MultiHeadAttention")->attrs.get_int("kv_heads", 0), 2);
}

// 16-bit Attention stays on the exact ONNX kernel, which rounds Q and K and every step as the ONNX
// function does (the conformance suite checks float16 and bfloat16 results to the ulp).
TEST(MapOnnxAttention, SixteenBitInputsStay) {
  G b;
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<Value*> qkv;
    for (const char* name : {"q", "k", "v"}) {
      Value* x = b.g.add_value(fmt::format("{}{}", name, dtype_name(t)), TensorType(t, {1, 2, 3, 4}));
      b.g.add_input(x);
      qkv.push_back(x);
    }
    b.out(attention(b, qkv, attrs({{"is_causal", Attribute::Int(1)}}))->output(0));
  }
  auto opt = optimize_checked(b.g, {"map_onnx_attention"});
  EXPECT_EQ(count_kiln_attention(*opt), 0);
  EXPECT_EQ(count(*opt, "Attention"), 2);
}

}  // namespace
}  // namespace kiln::test
