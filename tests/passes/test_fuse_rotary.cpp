// fuse_rotary: Hugging Face's rotate_half rotary embedding on the heads of a projection becomes
// one RotaryEmbedding in front of the head split (checked against the unfused graph on the CPU).
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 3, kD = 8;

Value* slice_last(G& b, Value* x, int64_t start, int64_t end) {
  return b.op("Slice", {x, b.c(ints({start})), b.c(ints({end})), b.c(ints({-1}))});
}

// cos and sin [1, S, D] from positions x frequencies f [1, S, D/2], as LlamaRotaryEmbedding
// computes them (Concat(f, f), then Cos/Sin times the attention scaling).
std::pair<Value*, Value*> caches(G& b, Value* f, bool equal_halves = true) {
  Value* emb = b.op("Concat", {f, equal_halves ? f : b.op("Neg", {f})},
                    attrs({{"axis", Attribute::Int(-1)}}));
  return {b.op("Mul", {b.op("Cos", {emb}), b.cf(1.f)}), b.op("Sin", {emb})};
}

// The heads of q [B, S, H*D] with the rotation applied as the exporters write it; cos and sin
// are unsqueezed at `axes` (none: they are [B or 1, 1, S, D] already).
Value* rotated_heads(G& b, Value* q, Value* cos, Value* sin, bool swap_operands,
                     std::vector<int64_t> axes = {1}) {
  Value* x = b.op("Reshape", {q, b.c(ints({kB, kS, kH, kD}))});
  x = b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  Value* rot = b.op(
      "Concat", {b.op("Neg", {slice_last(b, x, kD / 2, INT64_MAX)}), slice_last(b, x, 0, kD / 2)},
      attrs({{"axis", Attribute::Int(-1)}}));
  Value* c = axes.empty() ? cos : b.op("Unsqueeze", {cos, b.c(ints(axes))});
  Value* s = axes.empty() ? sin : b.op("Unsqueeze", {sin, b.c(ints(axes))});
  Value* a = swap_operands ? b.op("Mul", {c, x}) : b.op("Mul", {x, c});
  Value* r = swap_operands ? b.op("Mul", {s, rot}) : b.op("Mul", {rot, s});
  return swap_operands ? b.op("Add", {r, a}) : b.op("Add", {a, r});
}

TEST(FuseRotary, RotateHalfOnHeadsBecomesOneRotaryEmbedding) {
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  Value* k = b.in("k", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}));
  // Read by a layer, as attention reads them (a graph output keeps its producer).
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false)}));
  b.out(b.op("Relu", {rotated_heads(b, k, cos, sin, true)}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 2);
  EXPECT_EQ(count(*opt, "Neg"), 0);
  EXPECT_EQ(count(*opt, "Slice"), 2);  // each cache's first half, shared by q and k
  for (const Node* n : opt->nodes()) {
    if (n->op_type == "RotaryEmbedding") {
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kH);
    }
  }
}

TEST(FuseRotary, CachesWithoutEqualHalvesStay) {
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}), /*equal_halves=*/false);
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false)}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 0);
}

TEST(FuseRotary, CachesWithoutBatchAxis) {
  // transformers 5 computes cos and sin as [S, D] and unsqueezes them at axes 0 and 1.
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {kS, kD / 2}));
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false, {0, 1})}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 1);
}

// A constant [1, 1, S, D] cache (as fold_constants leaves it at static shapes) whose rows are
// f, f (or f, -f when `equal` is false).
Value* constant_cache(G& b, bool equal) {
  Tensor t = rand_t({1, 1, kS, kD});
  float* p = t.data<float>();
  for (int64_t r = 0; r < kS; ++r)
    for (int64_t i = 0; i < kD / 2; ++i) p[r * kD + kD / 2 + i] = (equal ? 1 : -1) * p[r * kD + i];
  return b.c(t);
}

TEST(FuseRotary, FoldedConstantCaches) {
  for (bool equal : {true, false}) {
    G b;
    Value* q = b.in("q", {kB, kS, kH * kD});
    b.out(b.op("Relu", {rotated_heads(b, q, constant_cache(b, equal), constant_cache(b, true),
                                      false, {})}));
    auto opt = optimize_checked(b.g, {"fuse_rotary", "eliminate_dead_code"});
    EXPECT_EQ(count(*opt, "RotaryEmbedding"), equal ? 1 : 0) << "equal halves " << equal;
  }
}

}  // namespace
}  // namespace kiln::test
