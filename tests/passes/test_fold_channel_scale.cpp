// fold_channel_scale: a Mul by a constant along a product's output channels (a layer scale)
// folds into the product's weights and bias, also through a Transpose; the graph computes what
// it did. Not along another axis, not after an activation, not where the product's output is
// read elsewhere, and not where the scale would push weights into float16's subnormal range.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

std::unique_ptr<Graph> fold(const Graph& g, const std::string& precision = "fp32",
                            std::vector<std::string> passes = {"fold_channel_scale"}) {
  auto opt = g.clone();
  OptimizeOptions o = only(std::move(passes));
  o.precision = precision;
  EXPECT_TRUE(optimize_graph(*opt, o).ok());
  return opt;
}

TEST(FoldChannelScale, ConvAndGemmTakeTheirLayerScale) {
  {
    G b;
    Value* y = b.op("Conv", {b.in("x", {2, 3, 6, 6}), b.c(rand_t({4, 3, 3, 3})), b.c(rand_t({4}))});
    b.out(b.op("Relu", {b.op("Mul", {b.c(rand_t({4, 1, 1}, 0.5f, 2.f)), y})}));  // c first
    auto opt = fold(b.g);
    EXPECT_EQ(count(*opt, "Mul"), 0);
    expect_same_outputs(b.g, *opt);
  }
  {  // Gemm with transB and a bias of the columns' length
    G b;
    Value* y = b.op("Gemm", {b.in("a", {3, 8}), b.c(rand_t({6, 8})), b.c(rand_t({6}))},
                    attrs({{"transB", Attribute::Int(1)}, {"beta", Attribute::Float(0.5f)}}));
    b.out(b.op("Mul", {y, b.c(rand_t({1, 6}, 0.5f, 2.f))}));
    auto opt = fold(b.g);
    EXPECT_EQ(count(*opt, "Mul"), 0);
    expect_same_outputs(b.g, *opt);
  }
}

TEST(FoldChannelScale, ALinearsLayerScaleAndConvNextsThroughItsPermute) {
  {  // a transformer's Linear on [B, S, C] (MatMul + Add: a FusedGemm) times gamma
    G b;
    Value* y = b.op("Add", {b.op("MatMul", {b.in("x", {2, 5, 8}), b.c(rand_t({8, 6}))}),
                            b.c(rand_t({6}))});
    b.out(b.op("Add", {b.op("Mul", {y, b.c(rand_t({6}, 0.05f, 0.2f))}), b.in("r", {2, 5, 6})}));
    auto opt = fold(b.g, "fp32", {"fuse_matmul_add", "fold_channel_scale"});
    EXPECT_EQ(count(*opt, "Mul"), 0);
    EXPECT_EQ(count(*opt, "FusedGemm"), 1);
    expect_same_outputs(b.g, *opt);
  }
  {  // ConvNeXt: Linear on [N, H, W, C], permute to [N, C, H, W], times gamma [C, 1, 1]
    G b;
    Value* y = b.op("MatMul", {b.in("x", {2, 3, 4, 8}), b.c(rand_t({8, 6}))});
    Value* t = b.op("Transpose", {y}, attrs({{"perm", Attribute::Ints({0, 3, 1, 2})}}));
    b.out(b.op("Add", {b.op("Mul", {t, b.c(rand_t({6, 1, 1}, 0.5f, 2.f))}),
                       b.in("r", {2, 6, 3, 4})}));
    auto opt = fold(b.g);
    EXPECT_EQ(count(*opt, "Mul"), 0);
    EXPECT_EQ(count(*opt, "Transpose"), 1);
    expect_same_outputs(b.g, *opt);
  }
}

// The scaled tensor keeps the Mul's output name and no tensor keeps the unscaled product's
// (kiln compare --per-layer matches the engine's tensors with the model's by name).
TEST(FoldChannelScale, TheScaledTensorKeepsTheMulsName) {
  for (bool through_transpose : {false, true}) {
    G b;
    Value* y = b.op("MatMul", {b.in("x", {2, 3, 4, 8}), b.c(rand_t({8, 6}))});
    Value* t = through_transpose
                   ? b.op("Transpose", {y}, attrs({{"perm", Attribute::Ints({0, 3, 1, 2})}}))
                   : y;
    Value* s = b.op(
        "Mul",
        {t, b.c(rand_t(through_transpose ? std::vector<int64_t>{6, 1, 1} : std::vector<int64_t>{6},
                       0.5f, 2.f))});
    b.out(b.op("Relu", {s}));
    const std::string scaled = s->name, unscaled = y->name, moved = t->name;
    auto opt = fold(b.g);
    ASSERT_EQ(count(*opt, "Mul"), 0);
    const Value* v = opt->find_value(scaled);
    ASSERT_NE(v, nullptr);
    ASSERT_NE(v->producer, nullptr);
    EXPECT_EQ(v->producer->op_type, through_transpose ? "Transpose" : "MatMul");
    EXPECT_EQ(opt->find_value(unscaled), nullptr);
    if (through_transpose) EXPECT_EQ(opt->find_value(moved), nullptr);
    expect_same_outputs(b.g, *opt);
  }
}

TEST(FoldChannelScale, StaysWhereItWouldNotBeTheSame) {
  {  // the constant varies along H, not the channels
    G b;
    Value* y = b.op("Conv", {b.in("x", {2, 3, 6, 6}), b.c(rand_t({4, 3, 3, 3}))});
    b.out(b.op("Mul", {y, b.c(rand_t({4, 1}))}));
    EXPECT_EQ(count(*fold(b.g), "Mul"), 1);
  }
  {  // after the activation
    G b;
    Value* y = b.op("Conv", {b.in("x", {2, 3, 6, 6}), b.c(rand_t({4, 3, 3, 3}))});
    b.out(b.op("Mul", {b.op("Relu", {y}), b.c(rand_t({4, 1, 1}))}));
    EXPECT_EQ(count(*fold(b.g, "fp32", {"fuse_conv_act", "fold_channel_scale"}), "Mul"), 1);
  }
  {  // the product's output is read by something else too
    G b;
    Value* y = b.op("Conv", {b.in("x", {2, 3, 6, 6}), b.c(rand_t({4, 3, 3, 3}))});
    b.out(b.op("Mul", {y, b.c(rand_t({4, 1, 1}))}));
    b.out(y);
    EXPECT_EQ(count(*fold(b.g), "Mul"), 1);
  }
  {  // ConvNeXt's 1e-6 initial layer scale: float16 weights would go subnormal (at every
     // precision: FP16 and INT8 builds reuse the graph optimized at FP32)
    G b;
    Value* y = b.op("Conv", {b.in("x", {2, 3, 6, 6}), b.c(rand_t({4, 3, 3, 3}, -0.05f, 0.05f))});
    b.out(b.op("Mul", {y, b.c(rand_t({4, 1, 1}, 1e-6f, 2e-6f))}));
    EXPECT_EQ(count(*fold(b.g, "fp16"), "Mul"), 1);
    EXPECT_EQ(count(*fold(b.g, "fp32"), "Mul"), 1);
  }
}

}  // namespace
}  // namespace kiln::test
