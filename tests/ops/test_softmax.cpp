// Softmax, LogSoftmax, Hardmax: known values, every axis against a naive formula, the
// opset < 13 upgrade (2-D coercion), dtypes, empty tensors and errors.
#include <cmath>

#include "op_test_util.h"

namespace kiln::test {
namespace {

Attributes axis_attr(int64_t axis) { return attrs({{"axis", Int(axis)}}); }

// Softmax over `n` elements at stride `inner`, without the max shift (inputs are small).
std::vector<double> naive(const std::string& op, const Tensor& x, int64_t outer, int64_t n,
                          int64_t inner) {
  std::vector<double> out(x.numel());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      double sum = 0, best = -1e300;
      int64_t arg = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double v = x.at_double((o * n + k) * inner + i);
        sum += std::exp(v);
        if (v > best) best = v, arg = k;
      }
      for (int64_t k = 0; k < n; ++k) {
        const int64_t e = (o * n + k) * inner + i;
        const double v = x.at_double(e);
        out[e] = op == "Softmax"      ? std::exp(v) / sum
                 : op == "LogSoftmax" ? v - std::log(sum)
                                      : (k == arg ? 1.0 : 0.0);
      }
    }
  return out;
}

TEST(Softmax, KnownValues) {
  Tensor x = Tensor::from<float>({1, 3}, {1, 2, 3});
  OpRun r = run_op("Softmax", {&x}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {0.09003057, 0.24472847, 0.66524096}, 0, 1e-6);
  r = run_op("LogSoftmax", {&x}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {-2.40760596, -1.40760596, -0.40760596}, 0, 1e-6);
}

TEST(Softmax, LargeNumbersAreStable) {
  Tensor x = Tensor::from<float>({2, 3}, {1000, 1001, 1002, -1000, -1001, -1002});
  OpRun r = run_op("Softmax", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0],
                {0.09003057, 0.24472847, 0.66524096, 0.66524096, 0.24472847, 0.09003057}, 0, 1e-6);
  r = run_op("LogSoftmax", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0],
                {-2.40760596, -1.40760596, -0.40760596, -0.40760596, -1.40760596, -2.40760596}, 0,
                1e-4);
}

TEST(Softmax, EveryAxisMatchesNaiveFormula) {
  const std::vector<int64_t> shape = {2, 3, 4};
  Tensor x = random_tensor(shape, -3, 3);
  for (const std::string op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    for (int64_t axis = -3; axis < 3; ++axis) {
      const int64_t a = axis < 0 ? axis + 3 : axis;
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < a; ++i) outer *= shape[i];
      for (int64_t i = a + 1; i < 3; ++i) inner *= shape[i];
      OpRun r = run_op(op, {&x}, axis_attr(axis));
      ASSERT_TRUE(r.status.ok()) << op << " " << r.status.message();
      expect_inferred_matches(r);
      expect_values(r.outputs[0], naive(op, x, outer, shape[a], inner), 0, 1e-5);
    }
  }
}

TEST(Softmax, DefaultAxisIsLast) {
  Tensor x = random_tensor({3, 5});
  OpRun r = run_op("Softmax", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0], naive("Softmax", x, 3, 5, 1), 0, 1e-6);
}

TEST(Softmax, LegacyOpsetCoercesTo2D) {
  Tensor x = random_tensor({2, 3, 4}, -2, 2);
  for (const std::string op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    // opset 11, no axis: default 1, flattened to [2, 12].
    OpRun r = run_imported(op, {&x}, {}, 11);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    expect_values(r.outputs[0], naive(op, x, 2, 12, 1), 0, 1e-5);
    // opset 11, axis 0: one softmax over all 24 elements.
    r = run_imported(op, {&x}, axis_attr(0), 11);
    ASSERT_TRUE(r.status.ok());
    expect_values(r.outputs[0], naive(op, x, 1, 24, 1), 0, 1e-5);
    // opset 13: axis 1 is a single axis.
    r = run_imported(op, {&x}, axis_attr(1), 13);
    ASSERT_TRUE(r.status.ok());
    expect_values(r.outputs[0], naive(op, x, 2, 3, 4), 0, 1e-5);
  }
}

TEST(Hardmax, FirstMaximumWins) {
  Tensor x = Tensor::from<float>({2, 3}, {3, 1, 3, 0, 5, 2});
  OpRun r = run_op("Hardmax", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0], {1, 0, 0, 0, 1, 0}, 0, 0);
  r = run_op("Hardmax", {&x}, axis_attr(0));
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0], {1, 0, 1, 0, 1, 0}, 0, 0);
}

TEST(Softmax, FloatDtypes) {
  Tensor x = random_tensor({4, 6});
  const auto want = naive("Softmax", x, 4, 6, 1);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    Tensor xt = x.cast(t);
    OpRun r = run_op("Softmax", {&xt}, {});
    ASSERT_TRUE(r.status.ok()) << dtype_name(t);
    EXPECT_EQ(r.outputs[0].dtype(), t);
    expect_inferred_matches(r);
    expect_values(r.outputs[0], naive("Softmax", xt, 4, 6, 1), 0,
                  t == DataType::kFloat64 ? 1e-12 : 1e-2);
    if (t == DataType::kFloat64) expect_values(r.outputs[0], want, 0, 1e-6);
  }
}

TEST(Softmax, EmptyTensors) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{0, 3}, std::vector<int64_t>{3, 0}}) {
    Tensor x(DataType::kFloat32, shape);
    for (const std::string op : {"Softmax", "LogSoftmax", "Hardmax"}) {
      OpRun r = run_op(op, {&x}, {});
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      EXPECT_EQ(r.outputs[0].shape(), shape);
      expect_inferred_matches(r);
    }
  }
}

TEST(Softmax, SymbolicDimsPropagate) {
  auto out = infer("Softmax", {TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(10)})}, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[N,10]");
}

TEST(Softmax, Errors) {
  Tensor xi = Tensor::from<int32_t>({2}, {1, 2});
  EXPECT_FALSE(run_op("Softmax", {&xi}, {}).status.ok());
  Tensor x = random_tensor({2, 3});
  OpRun r = run_op("LogSoftmax", {&x}, axis_attr(2));
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("n0"), std::string::npos) << r.status.message();
  EXPECT_FALSE(run_op("Hardmax", {&x}, axis_attr(-3)).status.ok());
  Tensor s = Tensor::scalar<float>(1.f);
  EXPECT_FALSE(run_op("Softmax", {&s}, {}).status.ok());
}

}  // namespace
}  // namespace kiln::test
