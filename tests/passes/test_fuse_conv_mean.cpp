// fuse_conv_mean: a squeeze-excitation block's pool of its depthwise convolution's output becomes
// that convolution's second output (kiln.FusedConvMean) where the cuda backend's depthwise tile
// kernels take the layer; the layer's CPU kernel computes what the two layers did, and
// unfuse_layer splits it back into the FusedConv and the pool.

#include "ops/fused.h"
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// x -> depthwise conv (k x k, stride s, SiLU) -> y; y * sigmoid(fc2(relu(fc1(mean(y))))).
std::unique_ptr<Graph> se_block(int64_t c, int64_t k, int64_t s, bool reduce_mean,
                                int64_t multiplier = 1, int64_t kw = 0) {
  G b;
  kw = kw ? kw : k;
  Value* x = b.in("x", {2, c, 13, 11});
  Value* y = b.op("Conv", {x, b.c(rand_t({c * multiplier, 1, k, kw})), b.c(rand_t({c * multiplier}))},
                  attrs({{"group", Attribute::Int(c)},
                         {"strides", Attribute::Ints({s, s})},
                         {"pads", Attribute::Ints({k / 2, kw / 2, k / 2, kw / 2})}}));
  y = b.op("Mul", {y, b.op("Sigmoid", {y})});
  const int64_t m = c * multiplier;
  Value* p = reduce_mean ? b.op("ReduceMean", {y, b.c(ints({2, 3}))},
                                attrs({{"keepdims", Attribute::Int(1)}}))
                         : b.op("GlobalAveragePool", {y});
  Value* h = b.op("Relu", {b.op("Conv", {p, b.c(rand_t({4, m, 1, 1})), b.c(rand_t({4}))})});
  Value* g = b.op("Sigmoid", {b.op("Conv", {h, b.c(rand_t({m, 4, 1, 1})), b.c(rand_t({m}))})});
  b.out(b.op("Mul", {y, g}));
  return b.g.clone();
}

std::unique_ptr<Graph> fuse(const Graph& g, const std::string& backend,
                            const std::string& precision) {
  auto opt = g.clone();
  OptimizeOptions o = only({"reduce_to_global_pool", "fuse_swish", "fuse_conv_act",
                            "fuse_conv_mean"});
  o.backend = backend;
  o.precision = precision;
  EXPECT_TRUE(optimize_graph(*opt, o).ok());
  return opt;
}

TEST(FuseConvMean, SqueezeExcitationPoolJoinsTheDepthwiseConvolution) {
#ifndef KILN_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  for (bool reduce_mean : {false, true}) {
    const auto g = se_block(16, 5, 2, reduce_mean);
    auto opt = fuse(*g, "cuda", "fp16");
    ASSERT_EQ(count(*opt, "FusedConvMean"), 1) << reduce_mean;
    EXPECT_EQ(count(*opt, "GlobalAveragePool"), 0);
    EXPECT_EQ(count(*opt, "ReduceMean"), 0);
    const Node* n = nullptr;
    for (const Node* q : opt->nodes())
      if (q->op_type == "FusedConvMean") n = q;
    EXPECT_EQ(n->attrs.get_string("activation", ""), "Swish");
    ASSERT_EQ(n->num_outputs(), 2u);
    EXPECT_EQ(n->output(1)->type.dims->size(), 4u);
    // Y is read by the scale and by nothing else; the mean by the first FC.
    EXPECT_EQ(n->output(0)->uses().size(), 1u);
    EXPECT_EQ(n->output(1)->uses()[0].first->op_type, "FusedConv");  // with its ReLU
    const auto ins = random_inputs(*g);
    const auto before = run_cpu(*g, ins), after = run_cpu(*opt, ins);
    ASSERT_EQ(after.size(), 1u);
    EXPECT_LT(rel_l2(after[0], before[0]), 1e-6);
    EXPECT_EQ(count(*fuse(*g, "cuda", "fp32"), "FusedConvMean"), 1);
  }
  // Not on the CPU (nothing to save there), not in INT8 builds, not where the tile kernels do
  // not reach: a channel multiplier, a 5x3 filter, 12 channels in FP16 (not whole 16-byte
  // vectors).
  EXPECT_EQ(count(*fuse(*se_block(16, 3, 1, false), "cpu", "fp32"), "FusedConvMean"), 0);
  EXPECT_EQ(count(*fuse(*se_block(16, 3, 1, false), "cuda", "int8"), "FusedConvMean"), 0);
  EXPECT_EQ(count(*fuse(*se_block(8, 3, 1, false, 2), "cuda", "fp16"), "FusedConvMean"), 0);
  EXPECT_EQ(count(*fuse(*se_block(16, 5, 1, false, 1, 3), "cuda", "fp16"), "FusedConvMean"), 0);
  EXPECT_EQ(count(*fuse(*se_block(12, 3, 1, false), "cuda", "fp16"), "FusedConvMean"), 0);
#endif
}

TEST(FuseConvMean, SplitsBackIntoTheConvolutionAndThePool) {
  G b;
  Value* x = b.in("x", {2, 8, 9, 7});
  Node* n = b.node("FusedConvMean",
                   {x, b.c(rand_t({8, 1, 3, 3})), b.c(rand_t({8})), b.in("z", {2, 8, 9, 7})},
                   attrs({{"group", Attribute::Int(8)},
                          {"pads", Attribute::Ints({1, 1, 1, 1})},
                          {"activation", Attribute::String("Relu")}}),
                   2);
  n->domain = "kiln";
  b.out(n->output(0));
  b.out(n->output(1));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  EXPECT_EQ(n->output(1)->type.dims->at(2).value, 1);
  auto split = b.g.clone();
  Node* fused = nullptr;
  for (Node* q : split->nodes())
    if (q->op_type == "FusedConvMean") fused = q;
  ASSERT_NE(fused, nullptr);
  ASSERT_TRUE(unfuse_layer(*split, fused).ok());
  ASSERT_TRUE(split->topo_sort().ok());
  ASSERT_TRUE(infer_shapes(*split).ok());
  EXPECT_EQ(count(*split, "FusedConv"), 1);
  EXPECT_EQ(count(*split, "GlobalAveragePool"), 1);
  EXPECT_EQ(count(*split, "FusedConvMean"), 0);
  const auto ins = random_inputs(b.g);
  const auto a = run_cpu(b.g, ins), c = run_cpu(*split, ins);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(rel_l2(c[i], a[i]), 0.0);
  EXPECT_EQ(a[1].shape(), (std::vector<int64_t>{2, 8, 1, 1}));
}

}  // namespace
}  // namespace kiln::test
