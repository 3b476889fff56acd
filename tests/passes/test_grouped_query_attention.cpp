// fold_attention_heads on grouped-query attention: K and V with fewer heads, each repeated as
// Hugging Face's repeat_kv writes it (Unsqueeze, Expand, Reshape; K then transposed), become
// one kiln.MultiHeadAttention with kv_heads that reads them in place (checked against the
// unfused graph on the CPU); a repeat that is not of whole heads stays.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 4, kKv = 2, kD = 4;

Value* perm(G& b, Value* x, std::vector<int64_t> p) {
  return b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
}

// [B, S, heads*D] -> [B, heads, S, D]
Value* heads(G& b, Value* x, int64_t n) {
  return perm(b, b.op("Reshape", {x, b.c(ints({kB, kS, n, kD}))}), {0, 2, 1, 3});
}

// repeat_kv: [B, G, S, D] -> [B, G*rep, S, D], each head rep times in a row; `axis` is where
// the copies are inserted (2 repeats whole heads).
Value* repeat_kv(G& b, Value* x, int64_t rep, int64_t axis = 2) {
  Value* u = b.op("Unsqueeze", {x, b.c(ints({axis}))});
  std::vector<int64_t> to = {kB, kKv, kS, kD};
  to.insert(to.begin() + axis, rep);
  Value* e = b.op("Expand", {u, b.c(ints(to))});
  return b.op("Reshape", {e, b.c(ints({kB, kKv * rep, kS, kD}))});
}

void build(G& b, int64_t axis) {
  Value* x = b.in("x", {kB, kS, kH * kD});
  Value* mask = b.in("mask", {1, 1, kS, kS});
  auto proj = [&](int64_t n) { return b.op("MatMul", {x, b.c(rand_t({kH * kD, n}))}); };
  Value* q = heads(b, proj(kH * kD), kH);
  Value* k = repeat_kv(b, heads(b, proj(kKv * kD), kKv), kH / kKv, axis);
  Value* v = repeat_kv(b, heads(b, proj(kKv * kD), kKv), kH / kKv, axis);
  Value* s = b.op("Add", {b.op("Mul", {b.op("MatMul", {q, perm(b, k, {0, 1, 3, 2})}), b.cf(0.5f)}),
                          mask});
  Value* p = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b, b.op("MatMul", {p, v}), {0, 2, 1, 3});
  b.out(b.op("Reshape", {y, b.c(ints({kB, kS, kH * kD}))}));
}

TEST(GroupedQueryAttention, RepeatedKeyValueHeadsAreReadInPlace) {
  G b;
  build(b, 2);
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*opt, "Expand"), 0);
  EXPECT_EQ(count(*opt, "Transpose"), 0);
  for (const Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kH);
      EXPECT_EQ(n->attrs.get_int("kv_heads", 0), kKv);
    }
}

TEST(GroupedQueryAttention, WholePipelinePacksTheProjections) {
  G b;
  build(b, 2);
  auto g = b.g.clone();
  OptimizeOptions o;
  o.opt_level = 2;
  ASSERT_TRUE(optimize_graph(*g, o).ok());
  auto ins = random_inputs(b.g);
  auto ref = run_cpu(b.g, ins);
  auto got = run_cpu(*g, ins);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_LT(rel_l2(got[0], ref[0]), 1e-5);
  ASSERT_EQ(count(*g, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*g, "MatMul"), 0);  // Q, K and V: one GEMM of H + 2 Hkv heads
  for (const Node* n : g->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
      EXPECT_EQ(n->attrs.get_int("kv_heads", 0), kKv);
    }
}

TEST(GroupedQueryAttention, CopiesInterleavedAcrossHeadsStay) {
  // Copies inserted after the sequence axis: [B, G, S, rep, D] -> [B, G*rep, S, D] is not a
  // repeat of whole heads.
  G b;
  build(b, 3);
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MultiHeadAttention"), 0);
}

}  // namespace
}  // namespace kiln::test
