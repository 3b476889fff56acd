// narrow_attention_mask: a mask that only broadcasts a smaller tensor (Expand; And with an
// all-true constant) reaches kiln.MultiHeadAttention at that smaller size, as BERT's TorchScript
// export builds its key-padding mask: [B, 1, 1, S] -> And(all-true [1, 1, S, 1]) -> Expand
// [B, 1, S, S] -> Where(., 0, -big). The output stays the same; a mask whose And carries
// information (a causal constant) stays as it is.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 6, kH = 8, kHeads = 2;

struct Attn {
  G b;
  Value *q, *k, *v, *pad;
  Attn() {
    q = b.in("q", {kB, kS, kH});
    k = b.in("k", {kB, kS, kH});
    v = b.in("v", {kB, kS, kH});
    pad = b.in("pad", {kB, kS});  // > 0: the key is kept
  }
  // The padding mask as BERT's export shapes it: bool [B, 1, 1, S].
  Value* keys() {
    Value* kept = b.op("Greater", {pad, b.cf(0.f)});
    return b.op("Reshape", {kept, b.c(ints({kB, 1, 1, kS}))});
  }
  Value* and_const(Value* x, Tensor c) { return b.op("And", {b.c(std::move(c)), x}); }
  Value* expand(Value* x) { return b.op("Expand", {x, b.c(ints({kB, 1, kS, kS}))}); }
  // Range(start, S + extra) unsqueezed to [1, 1, S, 1], >= lo: all true for start >= lo.
  Value* range_at_least(int64_t start, int64_t extra, int64_t lo) {
    Value* s = b.op("Gather", {b.op("Shape", {q}), b.c(Tensor::scalar<int64_t>(1))});
    if (extra) s = b.op("Add", {s, b.c(Tensor::scalar<int64_t>(extra))});
    Value* r = b.op("Range", {b.c(Tensor::scalar<int64_t>(start)), s,
                              b.c(Tensor::scalar<int64_t>(1))});
    Value* u = b.op("Unsqueeze", {r, b.c(ints({0, 1, 3}))});
    return b.op("GreaterOrEqual", {u, b.c(Tensor::scalar<int64_t>(lo))});
  }
  Value* where(Value* cond) {
    // -10000 rather than -inf: a row of random keys all masked stays finite to compare.
    return b.op("Where", {cond, b.c(Tensor::from<float>({1}, {0.f})),
                          b.c(Tensor::from<float>({1}, {-10000.f}))});
  }
  Node* mha(Value* mask) { return add_mha(b, q, k, v, mask, kHeads); }
};

Tensor bools(std::vector<int64_t> shape, bool (*f)(int64_t row, int64_t col)) {
  Tensor t(DataType::kBool, shape);
  const int64_t cols = shape.back();
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = f(i / cols, i % cols);
  return t;
}

const Node* find_mha(const Graph& g) { return find_op(g, "MultiHeadAttention"); }

TEST(NarrowAttentionMask, BertPaddingMaskReachesTheAttentionAsOneRow) {
  Attn a;
  // And with all-true [1, 1, S, 1], then Expand to [B, 1, S, S].
  Value* all = a.and_const(a.keys(), bools({1, 1, kS, 1}, [](int64_t, int64_t) { return true; }));
  a.mha(a.where(a.expand(all)));
  auto opt = optimize_checked(a.b.g, {"narrow_attention_mask", "eliminate_dead_code"});
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m && m->input(3));
  EXPECT_EQ(m->input(3)->type.static_shape(), (std::vector<int64_t>{kB, 1, 1, kS}))
      << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "And"), 0);
  EXPECT_EQ(count(*opt, "Expand"), 0);
  EXPECT_EQ(count(*opt, "Where"), 1);
}

TEST(NarrowAttentionMask, RangeFromZeroAtLeastZeroIsAllTrue) {
  Attn a;
  // As a dynamic sequence length leaves it: Range(0, S) unsqueezed to [1, 1, S, 1], >= 0.
  a.mha(a.where(a.expand(a.b.op("And", {a.range_at_least(0, 0, 0), a.keys()}))));
  auto opt = optimize_checked(a.b.g, {"narrow_attention_mask", "eliminate_dead_code"});
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m && m->input(3));
  EXPECT_EQ(m->input(3)->type.static_shape(), (std::vector<int64_t>{kB, 1, 1, kS}))
      << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "Range"), 0);
}

TEST(NarrowAttentionMask, RangeFromOneAtLeastTwoStays) {
  Attn a;
  // Range(1, S + 1) >= 2 is false at its first element: the And carries information.
  a.mha(a.where(a.expand(a.b.op("And", {a.range_at_least(1, 1, 2), a.keys()}))));
  auto opt = optimize_checked(a.b.g, {"narrow_attention_mask", "eliminate_dead_code"});
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m && m->input(3));
  EXPECT_EQ(m->input(3)->type.static_shape(), (std::vector<int64_t>{kB, 1, kS, kS}));
  EXPECT_EQ(count(*opt, "Range"), 1);
}

TEST(NarrowAttentionMask, ExpandedAdditiveMaskIsReadUnexpanded) {
  Attn a;
  Value* add = a.b.op("Reshape", {a.pad, a.b.c(ints({kB, 1, 1, kS}))});
  a.mha(a.expand(add));
  auto opt = optimize_checked(a.b.g, {"narrow_attention_mask", "eliminate_dead_code"});
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m && m->input(3));
  EXPECT_EQ(m->input(3)->type.static_shape(), (std::vector<int64_t>{kB, 1, 1, kS}));
  EXPECT_EQ(count(*opt, "Expand"), 0);
}

TEST(NarrowAttentionMask, CausalAndStays) {
  Attn a;
  // And with a causal [1, 1, S, S] constant: it carries information, so the mask stays.
  Value* causal = a.and_const(a.keys(), bools({1, 1, kS, kS}, [](int64_t r, int64_t c) {
    return c <= r % kS;
  }));
  a.mha(a.where(a.expand(causal)));
  auto opt = optimize_checked(a.b.g, {"narrow_attention_mask", "eliminate_dead_code"});
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m && m->input(3));
  EXPECT_EQ(m->input(3)->type.static_shape(), (std::vector<int64_t>{kB, 1, kS, kS}));
  EXPECT_EQ(count(*opt, "And"), 1);
}

}  // namespace
}  // namespace kiln::test
