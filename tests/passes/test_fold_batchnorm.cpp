// fold_batchnorm: Conv / ConvTranspose / Gemm / MatMul followed by a constant BatchNorm.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// BatchNormalization with random constant parameters (variance positive).
Value* batchnorm(G& b, Value* x, int64_t c, bool const_params = true) {
  Value* scale = const_params ? b.c(rand_t({c})) : b.in("bn_scale", {c});
  return b.op("BatchNormalization",
              {x, scale, b.c(rand_t({c})), b.c(rand_t({c})), b.c(rand_t({c}, 0.5f, 2.f))},
              attrs({{"epsilon", Attribute::Float(1e-3f)}}));
}

Attributes conv_attrs(int64_t group = 1) {
  return attrs({{"kernel_shape", Attribute::Ints({3, 3})},
                {"pads", Attribute::Ints({1, 1, 1, 1})},
                {"group", Attribute::Int(group)}});
}

TEST(FoldBatchNorm, ConvWithAndWithoutBias) {
  for (bool bias : {false, true}) {
    G b;
    std::vector<Value*> ins = {b.in("x", {2, 4, 5, 5}), b.c(rand_t({6, 4, 3, 3}))};
    if (bias) ins.push_back(b.c(rand_t({6})));
    b.out(b.op("Relu", {batchnorm(b, b.op("Conv", ins, conv_attrs()), 6)}));
    auto opt = optimize_checked(b.g, {"fold_batchnorm"});
    EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
    ASSERT_EQ(count(*opt, "Conv"), 1);
    const Node* conv = opt->nodes()[0];
    EXPECT_EQ(conv->origin, "fold_batchnorm");
    EXPECT_EQ(conv->onnx_nodes.size(), 2u);
    EXPECT_TRUE(conv->input(2) && conv->input(2)->is_constant());
  }
}

TEST(FoldBatchNorm, GroupedConvAndConvTranspose) {
  G b;
  Value* x = b.in("x", {1, 4, 5, 5});
  Value* c = b.op("Conv", {x, b.c(rand_t({6, 2, 3, 3}))}, conv_attrs(2));
  b.out(batchnorm(b, c, 6));
  Value* t = b.op("ConvTranspose", {x, b.c(rand_t({4, 3, 3, 3})), b.c(rand_t({6}))},
                  attrs({{"group", Attribute::Int(2)}, {"strides", Attribute::Ints({2, 2})}}));
  b.out(batchnorm(b, t, 6));
  auto opt = optimize_checked(b.g, {"fold_batchnorm"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
  EXPECT_EQ(opt->nodes().size(), 2u);
}

TEST(FoldBatchNorm, GemmAndMatMul) {
  G b;
  Value* a = b.in("a", {3, 5});
  Value* g1 = b.op("Gemm", {a, b.c(rand_t({4, 5})), b.c(rand_t({4}))},
                   attrs({{"transB", Attribute::Int(1)},
                          {"alpha", Attribute::Float(0.5f)},
                          {"beta", Attribute::Float(2.f)}}));
  b.out(batchnorm(b, g1, 4));
  b.out(batchnorm(b, b.op("MatMul", {a, b.c(rand_t({5, 7}))}), 7));
  auto opt = optimize_checked(b.g, {"fold_batchnorm"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
  EXPECT_EQ(count(*opt, "Gemm"), 2);
  EXPECT_EQ(count(*opt, "MatMul"), 0);
}

TEST(FoldBatchNorm, NonConstantParametersDoNotFold) {
  G b;
  Value* c = b.op("Conv", {b.in("x", {1, 4, 5, 5}), b.c(rand_t({6, 4, 3, 3}))}, conv_attrs());
  b.out(batchnorm(b, c, 6, /*const_params=*/false));
  auto opt = optimize_checked(b.g, {"fold_batchnorm"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 1);
  EXPECT_EQ(count(*opt, "Conv"), 1);
}

TEST(FoldBatchNorm, ConvOutputWithAnotherConsumerOrGraphOutputDoesNotFold) {
  for (bool as_output : {false, true}) {
    G b;
    Value* c = b.op("Conv", {b.in("x", {1, 4, 5, 5}), b.c(rand_t({6, 4, 3, 3}))}, conv_attrs());
    b.out(batchnorm(b, c, 6));
    if (as_output)
      b.out(c);
    else
      b.out(b.op("Relu", {c}));
    auto opt = optimize_checked(b.g, {"fold_batchnorm"});
    EXPECT_EQ(count(*opt, "BatchNormalization"), 1);
  }
}

TEST(FoldBatchNorm, MatMulWithBatchDimsDoesNotFold) {
  G b;  // BN's channel axis (1) is not MatMul's column axis for rank-3 products
  b.out(batchnorm(b, b.op("MatMul", {b.in("a", {2, 3, 5}), b.c(rand_t({5, 3}))}), 3));
  auto opt = optimize_checked(b.g, {"fold_batchnorm"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 1);
}

}  // namespace
}  // namespace kiln::test
