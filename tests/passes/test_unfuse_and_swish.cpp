// fuse_swish (x * sigmoid(x) => Swish), Swish joining a convolution, and unfuse_layer (a fused
// layer split back into its ops for a backend that has no kernel for it).
#include "ops/fused.h"
#include "pass_test_util.h"

namespace kiln::test {
namespace {

TEST(FuseSwish, SigmoidTimesInputBecomesSwish) {
  G b;
  Value* x = b.in("x", {2, 3, 4});
  b.out(b.op("Mul", {x, b.op("Sigmoid", {x})}));                               // SiLU
  b.out(b.op("Mul", {b.op("Sigmoid", {b.op("Mul", {x, b.cf(1.702f)})}), x}));  // scaled, swapped
  auto opt = optimize_checked(b.g, {"fuse_swish"});
  EXPECT_EQ(count(*opt, "Swish"), 2);
  EXPECT_EQ(count(*opt, "Sigmoid"), 0);
  EXPECT_EQ(count(*opt, "Mul"), 0);
}

TEST(FuseSwish, SharedSigmoidOrBroadcastStays) {
  G b;
  Value* x = b.in("x", {2, 3, 4});
  Value* s = b.op("Sigmoid", {x});
  b.out(b.op("Mul", {x, s}));
  b.out(s);  // the sigmoid is an output too
  Value* y = b.in("y", {2, 1, 4});
  b.out(b.op("Mul", {b.in("z", {2, 3, 4}), b.op("Sigmoid", {y})}));  // not x * sigmoid(x)
  auto opt = optimize_checked(b.g, {"fuse_swish"});
  EXPECT_EQ(count(*opt, "Swish"), 0);
}

TEST(FuseSwish, JoinsAConvolutionOnTheCpuBackend) {
  G b;
  Value* c = b.op("Conv", {b.in("x", {1, 4, 6, 6}), b.c(rand_t({4, 1, 3, 3})), b.c(rand_t({4}))},
                  attrs({{"group", Attribute::Int(4)}, {"pads", Attribute::Ints({1, 1, 1, 1})}}));
  b.out(b.op("Mul", {c, b.op("Sigmoid", {c})}));
  auto opt = optimize_checked(b.g, {"fuse_swish", "fuse_conv_act"});
  ASSERT_EQ(count(*opt, "FusedConv"), 1);
  EXPECT_EQ(find_op(*opt, "FusedConv")->attrs.get_string("activation", ""), "Swish");
}

// unfuse_layer leaves a graph that computes what the fused layer did.
void expect_unfused_same(const Graph& g, int want_nodes) {
  auto split = g.clone();
  Node* fused = nullptr;
  for (Node* n : split->nodes())
    if (n->domain == "kiln") fused = n;
  ASSERT_NE(fused, nullptr);
  ASSERT_TRUE(unfuse_layer(*split, fused).ok());
  ASSERT_TRUE(split->topo_sort().ok());
  ASSERT_TRUE(infer_shapes(*split).ok());
  EXPECT_EQ(static_cast<int>(split->nodes().size()), want_nodes);
  for (const Node* n : split->nodes()) EXPECT_NE(n->domain, "kiln");
  const auto ins = random_inputs(g);
  const auto a = run_cpu(g, ins), c = run_cpu(*split, ins);
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(rel_l2(c[i], a[i]), 1e-6);
  EXPECT_EQ(split->outputs()[0]->name, g.outputs()[0]->name);
}

TEST(UnfuseLayer, ConvWithBroadcastResidualAndClip) {
  G b;
  Node* n = b.node("FusedConv",
                   {b.in("x", {2, 3, 5, 5}), b.c(rand_t({4, 3, 3, 3})), b.c(rand_t({4})),
                    b.in("z", {1, 4, 1, 1})},
                   attrs({{"pads", Attribute::Ints({1, 1, 1, 1})},
                          {"activation", Attribute::String("Clip")},
                          {"act_min", Attribute::Float(0.f)},
                          {"act_max", Attribute::Float(0.5f)}}));
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  expect_unfused_same(b.g, 3);  // Conv, Add, Clip
}

TEST(UnfuseLayer, MatMulGemmWithBiasResidualAndGelu) {
  G b;
  Value* a = b.in("a", {2, 3, 8});
  Node* n = b.node("FusedGemm", {a, b.c(rand_t({8, 5})), b.c(rand_t({5})), b.in("r", {2, 3, 5})},
                   attrs({{"base", Attribute::String("MatMul")},
                          {"activation", Attribute::String("Gelu")},
                          {"act_approximate", Attribute::String("tanh")}}));
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  expect_unfused_same(b.g, 4);  // MatMul, Add, Add, Gelu
}

}  // namespace
}  // namespace kiln::test
