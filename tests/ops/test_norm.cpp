// BatchNormalization, InstanceNormalization, LayerNormalization: known values, random data vs
// naive formulas, old-opset upgrades (is_test/spatial/consumed_inputs), dtypes and errors.
#include <cmath>

#include "op_test_util.h"

namespace kiln::test {
namespace {

// --- BatchNormalization ---------------------------------------------------------------------
std::vector<double> naive_bn(const Tensor& x, const Tensor& s, const Tensor& b, const Tensor& m,
                             const Tensor& v, double eps, bool per_activation) {
  const int64_t C = x.dim(1), inner = x.numel() / std::max<int64_t>(1, x.dim(0) * C);
  std::vector<double> out(x.numel());
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t k = per_activation ? e % (C * inner) : (e / inner) % C;
    out[e] = (x.at_double(e) - m.at_double(k)) / std::sqrt(v.at_double(k) + eps) * s.at_double(k) +
             b.at_double(k);
  }
  return out;
}

TEST(BatchNorm, OnnxExample) {
  Tensor x = Tensor::from<float>({1, 2, 1, 3}, {-1, 0, 1, 2, 3, 4});
  Tensor s = Tensor::from<float>({2}, {1.0f, 1.5f}), b = Tensor::from<float>({2}, {0, 1});
  Tensor m = Tensor::from<float>({2}, {0, 3}), v = Tensor::from<float>({2}, {1, 1.5f});
  OpRun r = run_op("BatchNormalization", {&x, &s, &b, &m, &v}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values(r.outputs[0], {-0.999995, 0, 0.999995, -0.22474074, 1, 2.2247407}, 0, 1e-5);
}

TEST(BatchNorm, RandomMatchesFormulaWithEpsilonAndDtypes) {
  Tensor x = random_tensor({2, 3, 4, 5});
  Tensor s = random_tensor({3}), b = random_tensor({3}), m = random_tensor({3});
  Tensor v = random_tensor({3}, 0.1f, 2.f);
  Attributes a;
  a.set("epsilon", Attribute::Float(0.01f));
  const auto want = naive_bn(x, s, b, m, v, 0.01f, false);
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    Tensor xt = x.cast(t);
    // Opset 15 lets scale/bias and mean/var have their own float types.
    Tensor vt = v.cast(DataType::kFloat64);
    OpRun r = run_op("BatchNormalization", {&xt, &s, &b, &m, &vt}, a);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    expect_inferred_matches(r);
    const double tol = t == DataType::kFloat16 ? 2e-2 : t == DataType::kBFloat16 ? 1e-1 : 1e-5;
    expect_values(r.outputs[0], want, 0, tol);
  }
}

TEST(BatchNorm, Opset6AttributesImport) {
  Tensor x = random_tensor({2, 3, 4});
  Tensor s = random_tensor({3}), b = random_tensor({3}), m = random_tensor({3});
  Tensor v = random_tensor({3}, 0.1f, 2.f);
  Attributes a;
  a.set("is_test", Attribute::Int(1));
  a.set("spatial", Attribute::Int(1));
  a.set("momentum", Attribute::Float(0.9f));
  a.set("consumed_inputs", Attribute::Ints({0, 0, 0, 1, 1}));
  OpRun r = run_imported("BatchNormalization", {&x, &s, &b, &m, &v}, a, 6);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], naive_bn(x, s, b, m, v, 1e-5, false), 0, 1e-5);
  // Unconsumed extra outputs (listed by old exporters) are fine; consumed ones mean training.
  r = run_imported("BatchNormalization", {&x, &s, &b, &m, &v}, a, 6, 5, {}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  r = run_imported("BatchNormalization", {&x, &s, &b, &m, &v}, a, 9, 3, {}, 3);
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("training"), std::string::npos);
}

TEST(BatchNorm, SpatialZeroIsPerActivation) {
  Tensor x = random_tensor({2, 3, 2, 2});
  Tensor s = random_tensor({3, 2, 2}), b = random_tensor({3, 2, 2}), m = random_tensor({3, 2, 2});
  Tensor v = random_tensor({3, 2, 2}, 0.1f, 2.f);
  Attributes a;
  a.set("spatial", Attribute::Int(0));
  OpRun r = run_imported("BatchNormalization", {&x, &s, &b, &m, &v}, a, 7);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], naive_bn(x, s, b, m, v, 1e-5, true), 0, 1e-5);
  // Without the upgrade, per-activation parameters are a shape error.
  EXPECT_FALSE(run_op("BatchNormalization", {&x, &s, &b, &m, &v}, {}).status.ok());
}

// training_mode = 1 normalizes with the batch's own statistics (each channel of Y then has mean
// B and population variance scale^2, up to epsilon); with per-activation statistics
// (spatial = 0) it is refused.
TEST(BatchNorm, TrainingModeUsesTheBatchStatistics) {
  Tensor x = random_tensor({3, 2, 5});
  Tensor s = random_tensor({2}), b = random_tensor({2}), v = random_tensor({2}, 0.5f, 1.f);
  Attributes a;
  a.set("training_mode", Attribute::Int(1));
  a.set("epsilon", Attribute::Float(0.f));
  OpRun r = run_op("BatchNormalization", {&x, &s, &b, &b, &v}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  for (int64_t c = 0; c < 2; ++c) {
    double m = 0, q = 0;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < 5; ++i) m += r.outputs[0].at_double((n * 2 + c) * 5 + i) / 15;
    for (int64_t n = 0; n < 3; ++n)
      for (int64_t i = 0; i < 5; ++i) q += std::pow(r.outputs[0].at_double((n * 2 + c) * 5 + i) - m, 2) / 15;
    EXPECT_NEAR(m, b.at_double(c), 1e-5);
    EXPECT_NEAR(q, s.at_double(c) * s.at_double(c), 1e-4);
  }
  EXPECT_TRUE(run_imported("BatchNormalization", {&x, &s, &b, &b, &v}, a, 15).status.ok());
  a.set("kiln_per_activation", Attribute::Int(1));
  Tensor p = random_tensor({2, 5});
  OpRun per = run_op("BatchNormalization", {&x, &p, &p, &p, &p}, a);
  ASSERT_FALSE(per.status.ok());
  EXPECT_NE(per.status.message().find("training"), std::string::npos);
}

TEST(BatchNorm, EmptyBatchAndErrors) {
  Tensor x(DataType::kFloat32, {0, 2, 3});
  Tensor s = random_tensor({2}), v = random_tensor({2}, 0.5f, 1.f);
  OpRun r = run_op("BatchNormalization", {&x, &s, &s, &s, &v}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 2, 3}));
  Tensor x2 = random_tensor({1, 3, 2});
  EXPECT_FALSE(run_op("BatchNormalization", {&x2, &s, &s, &s, &v}, {}).status.ok());
  Tensor xi = Tensor::from<int32_t>({1, 2}, {1, 2});
  EXPECT_FALSE(run_op("BatchNormalization", {&xi, &s, &s, &s, &v}, {}).status.ok());
  Tensor x1 = random_tensor({2});
  EXPECT_FALSE(run_op("BatchNormalization", {&x1, &s, &s, &s, &v}, {}).status.ok());
}

// --- InstanceNormalization ------------------------------------------------------------------
std::vector<double> naive_in(const Tensor& x, const Tensor& s, const Tensor& b, double eps) {
  const int64_t C = x.dim(1), inner = x.numel() / (x.dim(0) * C);
  std::vector<double> out(x.numel());
  for (int64_t nc = 0; nc < x.dim(0) * C; ++nc) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < inner; ++i) mean += x.at_double(nc * inner + i) / inner;
    for (int64_t i = 0; i < inner; ++i)
      var += std::pow(x.at_double(nc * inner + i) - mean, 2) / inner;
    for (int64_t i = 0; i < inner; ++i)
      out[nc * inner + i] =
          s.at_double(nc % C) * (x.at_double(nc * inner + i) - mean) / std::sqrt(var + eps) +
          b.at_double(nc % C);
  }
  return out;
}

TEST(InstanceNorm, OnnxExampleValues) {
  // onnx example: x=[[[[-1,0,1]],[[2,3,4]]]], s=[1,1.5], b=[0,1]
  Tensor x = Tensor::from<float>({1, 2, 1, 3}, {-1, 0, 1, 2, 3, 4});
  Tensor s = Tensor::from<float>({2}, {1.f, 1.5f}), b = Tensor::from<float>({2}, {0, 1});
  OpRun r = run_op("InstanceNormalization", {&x, &s, &b}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {-1.22474, 0, 1.22474, -0.83711, 1, 2.83711}, 0, 1e-4);
}

TEST(InstanceNorm, RandomMatchesFormula) {
  Tensor x = random_tensor({2, 3, 4, 5}, -2, 3);
  Tensor s = random_tensor({3}), b = random_tensor({3});
  Attributes a;
  a.set("epsilon", Attribute::Float(0.01f));
  for (DataType t : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16}) {
    Tensor xt = x.cast(t), st = s.cast(t), bt = b.cast(t);
    OpRun r = run_op("InstanceNormalization", {&xt, &st, &bt}, a);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    expect_values(r.outputs[0], naive_in(xt, st, bt, 0.01f), 0,
                  t == DataType::kFloat16 ? 2e-2 : 1e-5);
  }
  Tensor bad = random_tensor({4});
  EXPECT_FALSE(run_op("InstanceNormalization", {&x, &bad, &b}, a).status.ok());
  Tensor x1 = random_tensor({3});
  EXPECT_FALSE(run_op("InstanceNormalization", {&x1, &s, &b}, a).status.ok());
  Tensor empty(DataType::kFloat32, {0, 3, 2});
  EXPECT_TRUE(run_op("InstanceNormalization", {&empty, &s, &b}, a).status.ok());
}

// --- LayerNormalization ---------------------------------------------------------------------
struct LnWant {
  std::vector<double> y, mean, inv;
};
LnWant naive_ln(const Tensor& x, int64_t axis, const Tensor& s, const Tensor* b, double eps) {
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dim(i);
  const int64_t inner = x.numel() / outer;
  LnWant w;
  w.y.resize(x.numel());
  for (int64_t o = 0; o < outer; ++o) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < inner; ++i) mean += x.at_double(o * inner + i) / inner;
    for (int64_t i = 0; i < inner; ++i)
      var += std::pow(x.at_double(o * inner + i) - mean, 2) / inner;
    const double inv = 1 / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i)  // s and b broadcast from the right
      w.y[o * inner + i] = (x.at_double(o * inner + i) - mean) * inv * s.at_double(i % s.numel()) +
                           (b ? b->at_double(i % b->numel()) : 0);
    w.mean.push_back(mean);
    w.inv.push_back(inv);
  }
  return w;
}

TEST(LayerNorm, EveryAxisWithStatsOutputs) {
  Tensor x = random_tensor({2, 3, 4}, -2, 2);
  for (int64_t axis = -3; axis < 3; ++axis) {
    const int64_t a = axis < 0 ? axis + 3 : axis;
    std::vector<int64_t> nshape(x.shape().begin() + a, x.shape().end());
    Tensor s = random_tensor(nshape), b = random_tensor(nshape);
    Attributes at;
    at.set("axis", Attribute::Int(axis));
    at.set("epsilon", Attribute::Float(1e-3f));
    OpRun r = run_op("LayerNormalization", {&x, &s, &b}, at, 3);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    const LnWant w = naive_ln(x, a, s, &b, 1e-3f);
    expect_values(r.outputs[0], w.y, 0, 1e-5);
    expect_values(r.outputs[1], w.mean, 0, 1e-6);
    expect_values(r.outputs[2], w.inv, 0, 1e-4);
    std::vector<int64_t> stat = x.shape();
    for (int64_t i = a; i < 3; ++i) stat[i] = 1;
    EXPECT_EQ(r.outputs[1].shape(), stat);
  }
}

TEST(LayerNorm, DefaultsBroadcastNoBiasAndStashType) {
  Tensor x = random_tensor({3, 2, 5});
  Tensor s = random_tensor({5});  // broadcast over the normalised [2, 5]
  Attributes at;
  at.set("axis", Attribute::Int(1));
  OpRun r = run_op("LayerNormalization", {&x, &s}, at, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], naive_ln(x, 1, s, nullptr, 1e-5).y, 0, 1e-5);
  // float16 data: Mean/InvStdDev come out in the stash type (float32).
  Tensor xh = x.cast(DataType::kFloat16), sh = s.cast(DataType::kFloat16);
  r = run_op("LayerNormalization", {&xh, &sh}, {}, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  EXPECT_EQ(r.outputs[1].dtype(), DataType::kFloat32);
  expect_values(r.outputs[0], naive_ln(xh, 2, sh, nullptr, 1e-5).y, 0, 2e-2);
}

TEST(LayerNorm, Errors) {
  Tensor x = random_tensor({2, 3});
  Tensor s = random_tensor({4});
  EXPECT_FALSE(run_op("LayerNormalization", {&x, &s}, {}).status.ok());
  Tensor s3 = random_tensor({3});
  Attributes at;
  at.set("axis", Attribute::Int(2));
  EXPECT_FALSE(run_op("LayerNormalization", {&x, &s3}, at).status.ok());
  Attributes st;
  st.set("stash_type", Attribute::Int(7));
  EXPECT_FALSE(run_op("LayerNormalization", {&x, &s3}, st).status.ok());
  Tensor empty(DataType::kFloat32, {0, 3});
  EXPECT_TRUE(run_op("LayerNormalization", {&empty, &s3}, {}, 3).status.ok());
}

}  // namespace
}  // namespace kiln::test
