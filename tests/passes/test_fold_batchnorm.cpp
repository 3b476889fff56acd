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

// LeViT's Linear + BatchNorm1d over its tokens: MatMul [B, N, C] x [C, D] -> Flatten to
// [B*N, D] -> BN -> Reshape back. The view keeps D last, so the BN folds into the MatMul's
// columns and a bias Add; the Flatten stays (a view). Not through a view that moves D.
TEST(FoldBatchNorm, MatMulThroughAViewThatKeepsItsColumns) {
  G b;
  Value* y = b.op("MatMul", {b.in("a", {2, 3, 5}), b.c(rand_t({5, 4}))});
  Value* flat = b.op("Flatten", {y}, attrs({{"axis", Attribute::Int(2)}}));
  b.out(b.op("Reshape", {batchnorm(b, flat, 4), b.c(ints({2, 3, 4}))}));
  auto opt = optimize_checked(b.g, {"fold_batchnorm"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
  EXPECT_EQ(count(*opt, "Add"), 1);
  EXPECT_EQ(count(*opt, "Flatten"), 1);

  G c;
  Value* z = c.op("MatMul", {c.in("a", {2, 3, 5}), c.c(rand_t({5, 4}))});
  Value* moved = c.op("Reshape", {z, c.c(ints({4, 6}))});  // [2, 3, 4] -> [4, 6]: not by column
  c.out(batchnorm(c, moved, 6));
  EXPECT_EQ(count(*optimize_checked(c.g, {"fold_batchnorm"}), "BatchNormalization"), 1);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// BatchNormalization in training mode normalizes with the batch's own statistics: NFNets
// standardize constant weights this way, which fold_constants then folds.
TEST(FoldBatchNorm, TrainingModeUsesBatchStatistics) {
  G b;
  Value* x = b.in("x", {2, 2, 3});
  Value* mean = b.c(Tensor::from<float>({2}, {100.f, -100.f}));  // ignored in training mode
  Value* var = b.c(Tensor::from<float>({2}, {50.f, 50.f}));
  b.out(b.op("BatchNormalization",
             {x, b.c(Tensor::from<float>({2}, {2.f, 1.f})),
              b.c(Tensor::from<float>({2}, {0.f, 0.5f})), mean, var},
             attrs({{"epsilon", Attribute::Float(0.f)}, {"training_mode", Attribute::Int(1)}})));
  // Expected values from the definition: per channel, mean and population variance over N and L.
  const std::vector<float> xv = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const auto y = run_cpu(b.g, {Tensor::from<float>({2, 2, 3}, xv)});
  ASSERT_EQ(y.size(), 1u);
  for (int c = 0; c < 2; ++c) {
    double m = 0, v = 0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 3; ++i) m += xv[(n * 2 + c) * 3 + i] / 6.0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 3; ++i) v += std::pow(xv[(n * 2 + c) * 3 + i] - m, 2) / 6.0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 3; ++i) {
        const int e = (n * 2 + c) * 3 + i;
        const double want = (xv[e] - m) / std::sqrt(v) * (c == 0 ? 2.0 : 1.0) + (c == 0 ? 0 : 0.5);
        EXPECT_NEAR(y[0].at_double(e), want, 1e-5) << "element " << e;
      }
  }
}

TEST(FoldBatchNorm, TrainingModeOnConstantWeightsFolds) {
  G b;
  Value* w = b.c(rand_t({1, 6, 36}));
  Value* std_w = b.op("BatchNormalization",
                      {w, b.c(rand_t({6}, 0.5f, 1.5f)), b.c(rand_t({6})), b.c(rand_t({6})),
                       b.c(rand_t({6}, 0.5f, 2.f))},
                      attrs({{"epsilon", Attribute::Float(1e-5f)},
                             {"training_mode", Attribute::Int(1)}}));
  Value* w4 = b.op("Reshape", {std_w, b.c(ints({6, 4, 3, 3}))});
  b.out(b.op("Conv", {b.in("x", {1, 4, 5, 5}), w4}, conv_attrs()));
  auto opt = optimize_checked(b.g, {"fold_constants"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
  EXPECT_EQ(count(*opt, "Conv"), 1);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// batchnorm_to_affine: a BatchNorm no producer took becomes Mul + Add and chains with the ReLU
// after it (DenseNet's BN -> ReLU -> Conv behind a Concat).
TEST(BatchNormToAffine, ChainsWithTheActivation) {
  G b;
  Value* cat = b.op("Concat", {b.in("a", {2, 3, 5, 5}), b.in("c", {2, 3, 5, 5})},
                    attrs({{"axis", Attribute::Int(1)}}));
  Value* r = b.op("Relu", {batchnorm(b, cat, 6)});
  b.out(b.op("Conv", {r, b.c(rand_t({4, 6, 1, 1}))}));
  auto opt = optimize_checked(b.g, {"fold_batchnorm", "batchnorm_to_affine", "fuse_elementwise"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 0);
  EXPECT_EQ(count(*opt, "ElementwiseChain"), 1);
  EXPECT_EQ(count(*opt, "Relu"), 0);
}

TEST(BatchNormToAffine, FoldsFirstAndLeavesTrainingMode) {
  G b;
  Value* x = b.in("x", {1, 4, 5, 5});
  // After a convolution: fold_batchnorm takes it (it runs first in the pipeline).
  b.out(batchnorm(b, b.op("Conv", {x, b.c(rand_t({6, 4, 3, 3}))}, conv_attrs()), 6));
  // Rank 3 (BatchNorm1d) becomes the affine map with [C, 1] constants.
  b.out(batchnorm(b, b.in("s", {2, 4, 7}), 4));
  // Non-constant parameters stay.
  b.out(batchnorm(b, b.in("y", {2, 6, 3, 3}), 6, /*const_params=*/false));
  auto opt = optimize_checked(b.g, {"fold_batchnorm", "batchnorm_to_affine"});
  EXPECT_EQ(count(*opt, "BatchNormalization"), 1);
  EXPECT_EQ(count(*opt, "Conv"), 1);
  EXPECT_EQ(count(*opt, "Mul"), 1);
  EXPECT_EQ(count(*opt, "Add"), 1);
}

}  // namespace
}  // namespace kiln::test
