// slices_to_split: Slices that cut one axis into adjacent parts become one Split (the packed
// projection's canonical form), checked against the graph before on the CPU; slices that leave a
// gap or overlap stay. remove_noops' Concat with empty tensors (Phi-3's partial rotary at the
// full head size). And the whole pipeline on a Phi-3-style attention: one projection sliced into
// Q, K and V (K and V repeated for grouped-query attention) becomes one packed attention.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// Slices of x's last axis at the given bounds, each read by a Relu (graph outputs).
void slices(G& b, Value* x, const std::vector<std::pair<int64_t, int64_t>>& bounds) {
  for (const auto& [s, e] : bounds)
    b.out(b.op("Relu", {b.op("Slice", {x, b.c(ints({s})), b.c(ints({e})), b.c(ints({-1}))})}));
}

TEST(SlicesToSplit, AdjacentPartsBecomeOneSplit) {
  G b;
  Value* x = b.in("x", {2, 3, 12});
  slices(b, x, {{8, 100}, {0, 4}, {4, 8}});  // any order; the last one's end past the axis
  auto opt = optimize_checked(b.g, {"slices_to_split"});
  EXPECT_EQ(count(*opt, "Slice"), 0);
  ASSERT_EQ(count(*opt, "Split"), 1);
}

TEST(SlicesToSplit, GapsAndOverlapsStay) {
  for (const auto& bounds : std::vector<std::vector<std::pair<int64_t, int64_t>>>{
           {{0, 4}, {5, 12}}, {{0, 6}, {4, 12}}, {{0, 4}, {4, 8}}}) {
    G b;
    slices(b, b.in("x", {2, 3, 12}), bounds);
    auto opt = optimize_checked(b.g, {"slices_to_split"});
    EXPECT_EQ(count(*opt, "Split"), 0);
    EXPECT_EQ(count(*opt, "Slice"), static_cast<int>(bounds.size()));
  }
}

TEST(RemoveNoops, ConcatWithEmptyTensorsIsItsOtherInput) {
  G b;
  Value* x = b.in("x", {2, 3, 8});
  Value* r = b.op("Relu", {x});
  Value* empty = b.op("Slice", {x, b.c(ints({8})), b.c(ints({8})), b.c(ints({-1}))});
  b.out(b.op("Sigmoid", {b.op("Concat", {r, empty}, attrs({{"axis", Attribute::Int(-1)}}))}));
  auto opt = optimize_checked(b.g, {"remove_noops", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Concat"), 0);
}

TEST(SlicesToSplit, PackedProjectionSlicedIntoQkvIsOnePackedAttention) {
  constexpr int64_t B = 2, S = 5, H = 4, KV = 2, D = 8, N = H * D;
  G b;
  Value* x = b.in("x", {B, S, N});
  Value* mask = b.in("mask", {1, 1, S, S});
  Value* qkv = b.op("MatMul", {x, b.c(rand_t({N, (H + 2 * KV) * D}))});
  auto part = [&](int64_t s, int64_t e) {
    return b.op("Slice", {qkv, b.c(ints({s})), b.c(ints({e})), b.c(ints({-1}))});
  };
  auto perm = [&](Value* v, std::vector<int64_t> p) {
    return b.op("Transpose", {v}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
  };
  auto heads = [&](Value* v, int64_t n) {
    return perm(b.op("Reshape", {v, b.c(ints({B, S, n, D}))}), {0, 2, 1, 3});
  };
  auto repeat = [&](Value* v) {  // repeat_kv
    Value* u = b.op("Unsqueeze", {v, b.c(ints({2}))});
    Value* e = b.op("Expand", {u, b.c(ints({B, KV, H / KV, S, D}))});
    return b.op("Reshape", {e, b.c(ints({B, H, S, D}))});
  };
  Value* q = heads(part(0, N), H);
  Value* k = repeat(heads(part(N, N + KV * D), KV));
  Value* v = repeat(heads(part(N + KV * D, N + 2 * KV * D), KV));
  Value* s =
      b.op("Add", {b.op("Mul", {b.op("MatMul", {q, perm(k, {0, 1, 3, 2})}), b.cf(0.3f)}), mask});
  Value* p = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b.op("MatMul", {p, v}), {0, 2, 1, 3});
  b.out(b.op("Reshape", {y, b.c(ints({B, S, N}))}));
  auto g = b.g.clone();
  OptimizeOptions o;
  o.opt_level = 2;
  ASSERT_TRUE(optimize_graph(*g, o).ok());
  auto ins = random_inputs(b.g);
  EXPECT_LT(rel_l2(run_cpu(*g, ins)[0], run_cpu(b.g, ins)[0]), 1e-5);
  ASSERT_EQ(count(*g, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*g, "Slice"), 0);
  EXPECT_EQ(count(*g, "Split"), 0);
  for (const Node* n : g->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
      EXPECT_EQ(n->attrs.get_int("kv_heads", 0), KV);
    }
}

}  // namespace
}  // namespace kiln::test
