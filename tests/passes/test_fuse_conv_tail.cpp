// fuse_conv_tail: elementwise ops with a scalar constant after a convolution become the
// FusedConv's post steps (post_ops, post_values) where the cuda backend has a tactic for the
// layer; the layer's CPU kernel computes what the ops did, and unfuse_layer splits them back.

#include "ops/fused.h"
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// x -> Conv (k x k, no bias) -> Relu -> Pow(2) -> Mul(s) -> Add(b): MetaFormer's StarReLU after
// a bias-free convolution; `tensor_scale` makes s a per-channel tensor instead of a scalar.
std::unique_ptr<Graph> star_relu(int64_t k, bool tensor_scale = false) {
  G b;
  Value* x = b.in("x", {2, 16, 9, 7});
  Value* y = b.op("Conv", {x, b.c(rand_t({32, 16, k, k}))},
                  attrs({{"pads", Attribute::Ints({k / 2, k / 2, k / 2, k / 2})}}));
  y = b.op("Relu", {y});
  y = b.op("Pow", {y, b.c(scalar_f(2.f))});
  y = b.op("Mul", {b.c(tensor_scale ? rand_t({32, 1, 1}) : scalar_f(0.8f)), y});
  b.out(b.op("Add", {y, b.c(scalar_f(-0.25f))}));
  return b.g.clone();
}

std::unique_ptr<Graph> fuse(const Graph& g, const std::string& backend,
                            const std::string& precision) {
  auto opt = g.clone();
  OptimizeOptions o = only({"fuse_conv_act", "fuse_conv_tail", "fuse_elementwise"});
  o.backend = backend;
  o.precision = precision;
  EXPECT_TRUE(optimize_graph(*opt, o).ok());
  return opt;
}

TEST(FuseConvTail, StarReluJoinsTheConvolutionsEpilogue) {
#ifndef KILN_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  for (int64_t k : {int64_t(1), int64_t(3)}) {
    const auto g = star_relu(k);
    for (const char* precision : {"fp16", "fp32"}) {
      auto opt = fuse(*g, "cuda", precision);
      ASSERT_EQ(opt->nodes().size(), 1u) << k << " " << precision;
      const Node* n = opt->nodes()[0];
      EXPECT_EQ(n->op_type, "FusedConv");
      EXPECT_EQ(n->attrs.get_string("activation", ""), "Relu");
      EXPECT_EQ(n->attrs.get_strings("post_ops"), (std::vector<std::string>{"Pow", "Mul", "Add"}));
      EXPECT_EQ(n->attrs.get_floats("post_values"), (std::vector<float>{2.f, 0.8f, -0.25f}));
      expect_same_outputs(*g, *opt, 1e-6);
    }
  }
  // Not on the CPU (nothing saved), not in INT8 builds, not with a per-channel operand (the tail
  // is then one elementwise chain after the FusedConv).
  EXPECT_EQ(count(*fuse(*star_relu(1), "cpu", "fp32"), "ElementwiseChain"), 1);
  EXPECT_EQ(count(*fuse(*star_relu(1), "cuda", "int8"), "Pow"), 1);
  const auto g = star_relu(1, true);
  auto per_channel = fuse(*g, "cuda", "fp16");
  const Node* conv = find_kiln(*per_channel, "FusedConv");
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->attrs.get_strings("post_ops"), (std::vector<std::string>{"Pow"}));
  EXPECT_EQ(count(*per_channel, "ElementwiseChain"), 1);
  expect_same_outputs(*g, *per_channel, 1e-6);
#endif
}

TEST(FuseConvTail, SplitsBackIntoItsOps) {
  G b;
  Value* x = b.in("x", {2, 8, 6, 5});
  Node* n = b.node("FusedConv", {x, b.c(rand_t({8, 8, 1, 1})), nullptr, b.in("z", {2, 8, 6, 5})},
                   attrs({{"activation", Attribute::String("Sigmoid")},
                          {"post_ops", Attribute::Strings({"Sub", "Abs", "Sqrt", "Div", "Min"})},
                          {"post_values", Attribute::Floats({0.5f, 0.f, 0.f, 1.5f, 0.4f})}}));
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  auto split = b.g.clone();
  Node* fused = nullptr;
  for (Node* q : split->nodes())
    if (q->op_type == "FusedConv") fused = q;
  ASSERT_NE(fused, nullptr);
  ASSERT_TRUE(unfuse_layer(*split, fused).ok());
  ASSERT_TRUE(split->topo_sort().ok());
  ASSERT_TRUE(infer_shapes(*split).ok());
  EXPECT_EQ(count(*split, "FusedConv"), 0);
  for (const char* op : {"Conv", "Add", "Sigmoid", "Sub", "Abs", "Sqrt", "Div", "Min"})
    EXPECT_EQ(count(*split, op), 1) << op;
  const auto ins = random_inputs(b.g);
  const auto a = run_cpu(b.g, ins), c = run_cpu(*split, ins);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(rel_l2(c[0], a[0]), 0.0);
  // A malformed tail (fewer values than steps) is not a layer any backend takes.
  n->attrs.set("post_values", Attribute::Floats({0.5f}));
  EXPECT_FALSE(fused_layer_supported("FusedConv", n->attrs));
}

}  // namespace
}  // namespace kiln::test
