// fold_periodic_add: Reshape(x, [G, W, ...]) -> Add(C [1, W, ...]) -> Reshape(back) becomes
// Add(x, Tile(C', [G, 1, ..])); and fuse_attention's two additive terms, so that Swin's shifted
// window attention (scores + relative bias, split into [B, nW, H, N, N], + per-window mask,
// merged back) becomes one attention layer, also with a dynamic batch.
#include <cmath>

#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kW = 4, kH = 2, kN = 6, kD = 4;

Value* ax0(G& b, std::vector<Value*> parts) {
  return b.op("Concat", std::move(parts), attrs({{"axis", Attribute::Int(0)}}));
}

// A Swin-like mask: 0 or -100 per window, [kW, 1, N, N] (or with a leading 1).
Tensor window_mask(bool rank5) {
  std::vector<int64_t> shape = {kW, 1, kN, kN};
  if (rank5) shape.insert(shape.begin(), 1);
  Tensor t(DataType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = ((i * 7 + i / (kN * kN)) % 3 == 0) ? -100.f : 0.f;
  return t;
}

// Shifted-window attention as TorchScript exports timm's Swin: q, k, v [batch, nW, H, N, D]
// flattened to windows [batch*nW, H, N, D]; the split shape computed from Shape(v).
struct Swin {
  G b;
  Value *q, *k, *v;
  explicit Swin(bool const_mask = true, bool rank5 = false) {
    for (Value** x : {&q, &k, &v}) {
      *x = b.g.add_value(
          x == &q   ? "q"
          : x == &k ? "k"
                    : "v",
          TensorType(DataType::kFloat32, {Dim::sym("batch"), Dim(kW), Dim(kH), Dim(kN), Dim(kD)}));
      b.g.add_input(*x);
    }
    auto windows = [&](Value* t) { return b.op("Reshape", {t, b.c(ints({-1, kH, kN, kD}))}); };
    Value *q4 = windows(q), *k4 = windows(k), *v4 = windows(v);
    Value* n = b.op(
        "Unsqueeze",
        {b.op("Gather", {b.op("Shape", {v}), b.c(Tensor::scalar<int64_t>(3))}), b.c(ints({0}))});
    Value* kt = b.op("Transpose", {k4}, attrs({{"perm", Attribute::Ints({0, 1, 3, 2})}}));
    Value* s = b.op("MatMul", {b.op("Mul", {q4, b.cf(0.5f)}), kt});
    Value* s1 = b.op("Add", {s, b.c(rand_t({kH, kN, kN}))});
    Value* s5 = b.op("Reshape", {s1, ax0(b, {b.c(ints({-1, kW, kH})), n, n})});
    Value* mask = const_mask ? b.c(window_mask(rank5)) : b.in("mask", {kW, 1, kN, kN});
    Value* s4 = b.op("Reshape", {b.op("Add", {s5, mask}), ax0(b, {b.c(ints({-1, kH})), n, n})});
    Value* p = b.op("Softmax", {s4}, attrs({{"axis", Attribute::Int(-1)}}));
    b.out(b.op("MatMul", {p, v4}));
  }
};

int attention_layers(const Graph& g) {
  return count(g, "Attention") + count(g, "MultiHeadAttention");
}

// The CPU backend's outputs of g and opt on the same random inputs at batch `n`.
void expect_same_outputs(const Graph& g, const Graph& opt, int64_t n) {
  std::vector<Tensor> ins;
  for (const Value* in : g.inputs()) {
    std::vector<int64_t> shape;
    for (const Dim& d : *in->type.dims) shape.push_back(d.is_static() ? d.value : n);
    ins.push_back(rand_t(shape));
  }
  const auto before = run_cpu(g, ins);
  const auto after = run_cpu(opt, ins);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(before[0].shape(), after[0].shape());
  if (before[0].shape() == after[0].shape()) {
    double worst = 0;
    for (int64_t i = 0; i < before[0].numel(); ++i)
      worst = std::max(worst, std::abs(before[0].at_double(i) - after[0].at_double(i)));
    EXPECT_LT(worst, 1e-5) << "batch " << n;
  }
}

std::unique_ptr<Graph> optimize_full(const Graph& g) {
  auto opt = g.clone();
  Status st = optimize_graph(*opt, OptimizeOptions{});
  EXPECT_TRUE(st.ok()) << st.message();
  return opt;
}

TEST(FoldPeriodicAdd, ShiftedWindowAttentionOfADynamicBatchIsOneLayer) {
  for (bool rank5 : {false, true}) {
    Swin s(true, rank5);
    auto opt = optimize_full(s.b.g);
    EXPECT_EQ(attention_layers(*opt), 1) << graph_to_text(*opt);
    EXPECT_EQ(count(*opt, "Softmax"), 0);
    EXPECT_EQ(count(*opt, "MatMul"), 0);
    // The batch is dynamic: the mask is tiled at run time, its repeat count read off an input.
    EXPECT_EQ(count(*opt, "Tile"), 1);
    for (int64_t n : {1, 3}) expect_same_outputs(s.b.g, *opt, n);
  }
}

// The scores' first term already taken by fuse_matmul_add (a round in which the mask's Add was
// not yet folded): kiln.FusedGemm[MatMul](q, kt, bias) + tiled mask is still one attention.
TEST(FoldPeriodicAdd, BiasFusedIntoTheScoresProductStillFuses) {
  Swin s;
  auto opt = s.b.g.clone();
  OptimizeOptions o;
  ASSERT_TRUE(infer_shapes(*opt).ok());
  for (const char* p : {"fold_constants", "fuse_matmul_add"}) {
    auto changed = run_pass(*opt, p, o);
    ASSERT_TRUE(changed.ok()) << changed.status().message();
  }
  ASSERT_EQ(count(*opt, "FusedGemm"), 1) << graph_to_text(*opt);
  Status st = optimize_graph(
      *opt, only({"fold_constants", "fold_periodic_add", "fuse_attention", "eliminate_dead_code"}));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(count(*opt, "Attention"), 1) << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "Softmax"), 0);
  for (int64_t n : {1, 2}) expect_same_outputs(s.b.g, *opt, n);
}

TEST(FoldPeriodicAdd, MaskThatIsNotAConstantStaysUnfused) {
  Swin s(/*const_mask=*/false);
  auto opt = optimize_full(s.b.g);
  EXPECT_EQ(attention_layers(*opt), 0);
  EXPECT_EQ(count(*opt, "Softmax"), 1);
  EXPECT_EQ(count(*opt, "Tile"), 0);
  expect_same_outputs(s.b.g, *opt, 2);
}

// The pass alone, static shapes: x [8, 2, 3, 3] split into [2, 4, 2, 3, 3].
struct Split {
  G b;
  Value* x;
  Split() : x(b.in("x", {8, 2, 3, 3})) {}
  void build(std::vector<int64_t> split, Tensor c) {
    Value* y = b.op("Reshape", {x, b.c(ints(split))});
    b.out(b.op("Reshape", {b.op("Add", {b.c(std::move(c)), y}), b.c(ints({8, 2, 3, 3}))}));
  }
};

TEST(FoldPeriodicAdd, ConstantPerGroupBecomesATiledAdd) {
  Split s;
  s.build({2, 4, 2, 3, 3}, rand_t({4, 1, 3, 3}));
  auto opt = optimize_checked(s.b.g, {"fold_periodic_add"});
  EXPECT_EQ(count(*opt, "Reshape"), 0) << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "Tile"), 1);
  EXPECT_EQ(count(*opt, "Add"), 1);
}

TEST(FoldPeriodicAdd, ConstantThatBroadcastsOverTheGroupNeedsNoTile) {
  Split s;
  s.build({2, 4, 2, 3, 3}, rand_t({1, 1, 1, 3, 3}));
  auto opt = optimize_checked(s.b.g, {"fold_periodic_add"});
  EXPECT_EQ(count(*opt, "Reshape"), 0) << graph_to_text(*opt);
  EXPECT_EQ(count(*opt, "Tile"), 0);
}

TEST(FoldPeriodicAdd, ReshapeThatDoesNotSplitAxis0OrConstantPerGroupStays) {
  {
    Split s;  // merges axes 1 and 2 as well: not a split of axis 0 alone
    s.build({2, 4, 6, 3}, rand_t({4, 1, 3}));
    auto opt = optimize_checked(s.b.g, {"fold_periodic_add"});
    EXPECT_EQ(count(*opt, "Reshape"), 2);
    EXPECT_EQ(count(*opt, "Tile"), 0);
  }
  {
    Split s;  // differs between the groups (axis 0 is 2, not 1)
    s.build({2, 4, 2, 3, 3}, rand_t({2, 4, 1, 3, 3}));
    auto opt = optimize_checked(s.b.g, {"fold_periodic_add"});
    EXPECT_EQ(count(*opt, "Reshape"), 2);
    EXPECT_EQ(count(*opt, "Tile"), 0);
  }
}

}  // namespace
}  // namespace kiln::test
