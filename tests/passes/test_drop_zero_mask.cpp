// drop_zero_mask: an attention mask that is zero everywhere, as exports of models without
// padding build one (ViT: an all-true boolean broadcast to the batch, then Where(c, 0, -inf)),
// is dropped from kiln.MultiHeadAttention, also where a dynamic batch keeps fold_constants from
// folding it; a mask that is not zero everywhere stays and computes the same.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kS = 6, kH = 8, kHeads = 2;

Tensor i64(int64_t v) { return Tensor::scalar<int64_t>(v); }

struct Attn {
  G b;
  Value *q, *k, *v;
  Attn() {
    for (Value** x : {&q, &k, &v}) {
      *x = b.g.add_value(x == &q ? "q" : x == &k ? "k" : "v",
                         TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(kS), Dim(kH)}));
      b.g.add_input(*x);
    }
  }
  Value* unsqueeze(Value* x, int64_t axis) { return b.op("Unsqueeze", {x, b.c(ints({axis}))}); }
  // [N, 1, 1, 1] from q's shape, as the TorchScript exporter writes an expand to the batch.
  Value* batch_shape() {
    Value* n = unsqueeze(b.op("Gather", {b.op("Shape", {q}), b.c(i64(0))}), 0);
    return b.op("Concat", {n, b.c(ints({1})), b.c(ints({1})), b.c(ints({1}))},
                attrs({{"axis", Attribute::Int(0)}}));
  }
  // HF's mask as TorchScript exports ViT: Where(Expand(Range(S) >= lo, [N, 1, 1, 1]), 0, -inf).
  Value* range_mask(int64_t lo, int64_t axis = 3) {
    Value* s = b.op("Gather", {b.op("Shape", {q}), b.c(i64(1))});
    Value* r = b.op("Range", {b.c(i64(0)), s, b.c(i64(1))});
    // [1, 1, S, 1] (axis 3: the query rows, as ViT's export) or [1, 1, 1, S] (axis 2: keys)
    Value* u = unsqueeze(unsqueeze(unsqueeze(r, 0), 1), axis);
    Value* ge = b.op("GreaterOrEqual", {u, b.c(i64(lo))});
    return where(b.op("Expand", {ge, batch_shape()}));
  }
  Value* where(Value* cond) {
    return b.op("Where", {cond, b.c(Tensor::from<float>({1}, {0.f})),
                          b.c(Tensor::from<float>({1}, {-INFINITY}))});
  }
  Node* mha(Value* mask) { return add_mha(b, q, k, v, mask, kHeads); }
};

const Node* find_mha(const Graph& g) { return find_op(g, "MultiHeadAttention"); }

// Optimizes a copy with detach_shapes, fold_constants and drop_zero_mask (in their pipeline
// order) and checks it against the original at batch 3; returns the copy.
std::unique_ptr<Graph> optimize_and_compare(const Graph& g) {
  auto opt = g.clone();
  Status st = optimize_graph(*opt, only({"detach_shapes", "fold_constants", "drop_zero_mask"}));
  EXPECT_TRUE(st.ok()) << st.message();
  const std::vector<Tensor> ins = {rand_t({3, kS, kH}), rand_t({3, kS, kH}), rand_t({3, kS, kH})};
  const auto before = run_cpu(g, ins);
  const auto after = run_cpu(*opt, ins);
  EXPECT_EQ(before.size(), 1u);
  EXPECT_EQ(after.size(), 1u);
  if (before.size() == 1 && after.size() == 1) {
    EXPECT_EQ(before[0].shape(), after[0].shape());
    EXPECT_LT(rel_l2(after[0], before[0]), 1e-6);
  }
  return opt;
}

TEST(DropZeroMask, AllTrueRangeMaskOfADynamicBatchIsDropped) {
  Attn a;
  a.mha(a.range_mask(0));
  auto opt = optimize_and_compare(a.b.g);
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->input(3), nullptr) << "the all-zero mask stays:\n" << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "Where"), 0);
}

TEST(DropZeroMask, DynamoAllTrueMaskIsDropped) {
  Attn a;
  // Where(True, 0, -inf) expanded to [N, 1, S, S]
  Value* n = a.unsqueeze(a.b.op("Gather", {a.b.op("Shape", {a.q}), a.b.c(i64(0))}), 0);
  Value* shape =
      a.b.op("Concat", {n, a.b.c(ints({1, kS, kS}))}, attrs({{"axis", Attribute::Int(0)}}));
  a.mha(a.where(a.b.op("Expand", {a.b.c(Tensor::scalar<bool>(true)), shape})));
  auto opt = optimize_and_compare(a.b.g);
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->input(3), nullptr);
}

TEST(DropZeroMask, MaskNotZeroEverywhereStays) {
  Attn a;
  a.mha(a.range_mask(2, 2));  // the first two keys masked out
  auto opt = optimize_and_compare(a.b.g);
  const Node* m = find_mha(*opt);
  ASSERT_TRUE(m);
  ASSERT_NE(m->input(3), nullptr);
  // The Where folded inside the Expand: a constant [1, 1, S, 1] of 0 and -inf, broadcast.
  const Node* e = m->input(3)->producer;
  ASSERT_TRUE(e && e->op_type == "Expand");
  ASSERT_TRUE(e->input(0)->is_constant());
  EXPECT_EQ(e->input(0)->constant->shape(), (std::vector<int64_t>{1, 1, 1, kS}));
  EXPECT_EQ(count(*opt, "Where"), 0);
}

}  // namespace
}  // namespace kiln::test
