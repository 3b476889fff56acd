// kiln.FusedConvPair in float: shape inference and the CPU kernel against Conv + Conv + Add
// (+ the activation) run as separate ops, and the shape check between the two convolutions.
#include <gtest/gtest.h>

#include <random>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

Tensor run_one(const std::string& op, const std::vector<const Tensor*>& ins, const Attributes& a) {
  OpRun r = run_op(op, ins, a);
  EXPECT_TRUE(r.status.ok()) << op << ": " << r.status.message();
  return r.outputs.empty() ? Tensor() : r.outputs[0];
}

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(got.data<float>()[i], want.data<float>()[i]) << "element " << i;
}

// ResNet's bottleneck block 0 of a stage, at toy size: the 1x1 expand conv on the block's
// 6x6 feature map and the stride-2 downsample of its 12x12 input, then ReLU.
TEST(FusedConvPair, EqualsTwoConvsAddAndRelu) {
  const Tensor x = random_tensor({2, 8, 6, 6}, 1), w = random_tensor({16, 8, 1, 1}, 2),
               b = random_tensor({16}, 3), x2 = random_tensor({2, 4, 12, 12}, 4),
               w2 = random_tensor({16, 4, 1, 1}, 5), b2 = random_tensor({16}, 6);
  const Attributes conv1 = attrs({{"kernel_shape", Ints({1, 1})}});
  const Attributes conv2 = attrs({{"kernel_shape", Ints({1, 1})}, {"strides", Ints({2, 2})}});
  const Tensor y1 = run_one("Conv", {&x, &w, &b}, conv1);
  const Tensor y2 = run_one("Conv", {&x2, &w2, &b2}, conv2);
  const Tensor sum = run_one("Add", {&y1, &y2}, {});
  const Tensor want = run_one("Relu", {&sum}, {});

  Attributes pair = attrs({{"kernel_shape", Ints({1, 1})},
                           {"conv2_kernel_shape", Ints({1, 1})},
                           {"conv2_strides", Ints({2, 2})},
                           {"activation", Str("Relu")}});
  OpRun r = run_op("FusedConvPair", {&x, &w, &b, &x2, &w2, &b2}, pair, 1, {}, "kiln");
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.inferred[0].str(), "float32[2,16,6,6]");
  expect_same(r.outputs[0], want);

  // No biases, no activation: the plain sum.
  pair.erase("activation");
  r = run_op("FusedConvPair", {&x, &w, nullptr, &x2, &w2, nullptr}, pair, 1, {}, "kiln");
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  const Tensor y1n = run_one("Conv", {&x, &w, nullptr}, conv1);
  const Tensor y2n = run_one("Conv", {&x2, &w2, nullptr}, conv2);
  expect_same(r.outputs[0], run_one("Add", {&y1n, &y2n}, {}));
}

// Outputs of different shapes are an error naming the layer and both shapes, in inference and
// in the kernel (no broadcasting, even where Add would broadcast).
TEST(FusedConvPair, RefusesOutputsOfDifferentShapes) {
  const Tensor x = random_tensor({1, 8, 6, 6}, 7), w = random_tensor({16, 8, 1, 1}, 8),
               x2 = random_tensor({1, 4, 12, 12}, 9), w2 = random_tensor({16, 4, 1, 1}, 10);
  const Attributes pair = attrs({{"kernel_shape", Ints({1, 1})}});  // conv2: stride 1 -> 12x12
  OpRun r = run_op("FusedConvPair", {&x, &w, nullptr, &x2, &w2, nullptr}, pair, 1, {}, "kiln");
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("node 'n0' (FusedConvPair"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("outputs differ in shape: float32[1,16,6,6] and "
                                    "float32[1,16,12,12]"),
            std::string::npos)
      << r.status.message();

  // The kernel checks too (shapes unknown to inference): a 1x1 second output would broadcast.
  const Tensor x1 = random_tensor({1, 4, 1, 1}, 11);
  Graph g;
  std::vector<Value*> ins;
  for (const char* name : {"x", "w", "", "x2", "w2", ""})
    ins.push_back(*name ? g.add_value(name, TensorType::unknown_rank(DataType::kFloat32))
                        : nullptr);
  Node* n = g.add_node("FusedConvPair", "pair", ins, {"y"}, "kiln");
  n->attrs = pair;
  std::vector<Tensor> outs(1);
  KernelContext k(*n, {&x, &w, nullptr, &x1, &w2, nullptr}, outs);
  Status st = find_op("kiln", "FusedConvPair")->cpu(k);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("node 'pair' (FusedConvPair"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("outputs differ in shape: [1,16,6,6] and [1,16,1,1]"),
            std::string::npos)
      << st.message();
}

TEST(FusedConvPair, NeedsTheSecondConvolution) {
  const Tensor x = random_tensor({1, 8, 6, 6}, 12), w = random_tensor({16, 8, 1, 1}, 13);
  OpRun r = run_op("FusedConvPair", {&x, &w}, attrs({}), 1, {}, "kiln");
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("needs X2 and W2"), std::string::npos) << r.status.message();
}

}  // namespace
}  // namespace kiln::test
