// RMSNormalization, LpNormalization, MeanVarianceNormalization, GroupNormalization: random
// data against naive formulas written out here, hand-computed examples, and errors.
#include <cmath>

#include "op_test_util.h"

namespace kiln::test {
namespace {

TEST(RMSNormalization, HandComputed) {
  Tensor x = F32({2, 2}, {3, 4, 1, -1});
  Tensor s = F32({2}, {2, 0.5f});
  OpRun r = run_op("RMSNormalization", {&x, &s}, attrs({{"epsilon", Attribute::Float(0.f)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  // rms of (3,4) = sqrt(12.5); of (1,-1) = 1.
  const double a = std::sqrt(12.5);
  expect_values(r.outputs[0], {3 / a * 2, 4 / a * 0.5, 2, -0.5});
}

TEST(RMSNormalization, RandomOverTrailingAxesAndDtypes) {
  Tensor x = random_tensor({2, 3, 4});
  Tensor s = random_tensor({3, 4});
  std::vector<double> want(x.numel());
  for (int64_t b = 0; b < 2; ++b) {
    double ss = 0;
    for (int64_t i = 0; i < 12; ++i) ss += std::pow(x.at_double(b * 12 + i), 2);
    for (int64_t i = 0; i < 12; ++i)
      want[b * 12 + i] = x.at_double(b * 12 + i) / std::sqrt(ss / 12 + 1e-5) * s.at_double(i);
  }
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    Tensor xt = x.cast(t), st = s.cast(t);
    OpRun r = run_op("RMSNormalization", {&xt, &st}, attrs({{"axis", Int(1)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    const double tol = t == DataType::kFloat32 ? 1e-5 : 5e-2;
    expect_values_scaled(r.outputs[0], want, tol);
  }
}

TEST(LpNormalization, RandomP1AndP2AlongAxis) {
  Tensor x = random_tensor({3, 4});
  for (int p : {1, 2}) {
    OpRun r = run_op("LpNormalization", {&x}, attrs({{"axis", Int(0)}, {"p", Int(p)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    std::vector<double> want(12);
    for (int c = 0; c < 4; ++c) {
      double norm = 0;
      for (int i = 0; i < 3; ++i)
        norm += p == 1 ? std::fabs(x.at_double(i * 4 + c)) : std::pow(x.at_double(i * 4 + c), 2);
      if (p == 2) norm = std::sqrt(norm);
      for (int i = 0; i < 3; ++i) want[i * 4 + c] = x.at_double(i * 4 + c) / norm;
    }
    expect_values(r.outputs[0], want);
  }
  OpRun bad = run_op("LpNormalization", {&x}, attrs({{"p", Int(3)}}));
  expect_error(bad, "p must be 1 or 2");
}

TEST(MeanVarianceNormalization, RandomDefaultAxes) {
  Tensor x = random_tensor({2, 3, 2, 2});
  OpRun r = run_op("MeanVarianceNormalization", {&x}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  std::vector<double> want(x.numel());
  for (int c = 0; c < 3; ++c) {  // statistics per channel over N, H, W
    double m = 0, sq = 0;
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 4; ++i) m += x.at_double((b * 3 + c) * 4 + i) / 8;
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 4; ++i) sq += std::pow(x.at_double((b * 3 + c) * 4 + i) - m, 2) / 8;
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 4; ++i) {
        const int64_t k = (b * 3 + c) * 4 + i;
        want[k] = (x.at_double(k) - m) / std::sqrt(sq + 1e-9);
      }
  }
  expect_values(r.outputs[0], want, 1e-4, 1e-4);
}

std::vector<double> naive_groupnorm(const Tensor& x, const Tensor& s, const Tensor& b, int G,
                                    bool per_group) {
  const int64_t N = x.dim(0), C = x.dim(1), inner = x.numel() / (N * C), per = C / G * inner;
  std::vector<double> out(x.numel());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t base = (n * G + g) * per;
      double m = 0, v = 0;
      for (int64_t i = 0; i < per; ++i) m += x.at_double(base + i) / per;
      for (int64_t i = 0; i < per; ++i) v += std::pow(x.at_double(base + i) - m, 2) / per;
      for (int64_t i = 0; i < per; ++i) {
        const int64_t k = per_group ? g : g * (C / G) + i / inner;
        out[base + i] = (x.at_double(base + i) - m) / std::sqrt(v + 1e-5) * s.at_double(k) +
                        b.at_double(k);
      }
    }
  return out;
}

TEST(GroupNormalization, RandomPerChannelAndOpset18PerGroup) {
  Tensor x = random_tensor({2, 4, 3});
  Tensor s = random_tensor({4}), b = random_tensor({4});
  OpRun r = run_op("GroupNormalization", {&x, &s, &b}, attrs({{"num_groups", Int(2)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], naive_groupnorm(x, s, b, 2, false), 1e-4, 1e-4);
  Tensor sg = random_tensor({2}), bg = random_tensor({2});
  r = run_imported("GroupNormalization", {&x, &sg, &bg}, attrs({{"num_groups", Int(2)}}), 18);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], naive_groupnorm(x, sg, bg, 2, true), 1e-4, 1e-4);
  r = run_op("GroupNormalization", {&x, &s, &b}, attrs({{"num_groups", Int(3)}}));
  expect_error(r, "num_groups 3 must divide the 4 channels");
}

}  // namespace
}  // namespace kiln::test
