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
  Value* where(Value* cond) {
    // -10000 rather than -inf: a row of random keys all masked stays finite to compare.
    return b.op("Where", {cond, b.c(Tensor::from<float>({1}, {0.f})),
                          b.c(Tensor::from<float>({1}, {-10000.f}))});
  }
  Node* mha(Value* mask) {
    Node* n = b.g.add_node("MultiHeadAttention", "mha", {q, k, v, mask}, {"y"}, "kiln");
    n->attrs.set("num_heads", Attribute::Int(kHeads));
    n->attrs.set("scale", Attribute::Float(0.5f));
    n->onnx_nodes = {n->name};
    b.out(n->output(0));
    return n;
  }
};

Tensor bools(std::vector<int64_t> shape, bool (*f)(int64_t row, int64_t col)) {
  Tensor t(DataType::kBool, shape);
  const int64_t cols = shape.back();
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = f(i / cols, i % cols);
  return t;
}

const Node* find_mha(const Graph& g) {
  for (const Node* n : g.nodes())
    if (n->op_type == "MultiHeadAttention") return n;
  return nullptr;
}

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
  Value* s = a.b.op("Gather", {a.b.op("Shape", {a.q}), a.b.c(Tensor::scalar<int64_t>(1))});
  Value* r = a.b.op("Range", {a.b.c(Tensor::scalar<int64_t>(0)), s,
                              a.b.c(Tensor::scalar<int64_t>(1))});
  Value* u = a.b.op("Unsqueeze", {r, a.b.c(ints({0, 1, 3}))});
  Value* ge = a.b.op("GreaterOrEqual", {u, a.b.c(Tensor::scalar<int64_t>(0))});
  a.mha(a.where(a.expand(a.b.op("And", {ge, a.keys()}))));
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
  Value* s = a.b.op("Gather", {a.b.op("Shape", {a.q}), a.b.c(Tensor::scalar<int64_t>(1))});
  Value* r = a.b.op("Range", {a.b.c(Tensor::scalar<int64_t>(1)),
                              a.b.op("Add", {s, a.b.c(Tensor::scalar<int64_t>(1))}),
                              a.b.c(Tensor::scalar<int64_t>(1))});
  Value* u = a.b.op("Unsqueeze", {r, a.b.c(ints({0, 1, 3}))});
  Value* ge = a.b.op("GreaterOrEqual", {u, a.b.c(Tensor::scalar<int64_t>(2))});
  a.mha(a.where(a.expand(a.b.op("And", {ge, a.keys()}))));
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
