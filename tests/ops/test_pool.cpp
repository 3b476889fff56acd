// MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, LpPool, GlobalLpPool, MaxUnpool: known
// values (onnx.reference literals for ceil_mode / dilations / SAME / storage_order), random cases
// against direct loops written here, dtypes, inference and errors.
#include <cmath>
#include <limits>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

OpRun run_ok(const std::string& op, const Tensor& x, const Attributes& a, size_t nout = 1) {
  OpRun r = run_op(op, {&x}, a, nout);
  EXPECT_TRUE(r.status.ok()) << r.status.message();
  if (r.status.ok()) expect_inferred_matches(r);
  return r;
}

// Direct 2-D pooling with explicit pads: max (with row-major flat index) or average.
struct Pool2d {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
};
void naive_pool2d(const Tensor& x, Pool2d p, bool avg, bool include_pad, int64_t oh, int64_t ow,
                  std::vector<double>& y, std::vector<int64_t>& idx) {
  const int64_t planes = x.dim(0) * x.dim(1), H = x.dim(2), W = x.dim(3);
  for (int64_t pl = 0; pl < planes; ++pl)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0;
        int64_t bi = -1, n = 0, counted = 0;
        for (int64_t a = 0; a < p.kh; ++a)
          for (int64_t b = 0; b < p.kw; ++b) {
            const int64_t h = i * p.sh - p.pt + a * p.dh, w = j * p.sw - p.pl + b * p.dw;
            if (h >= -p.pt && h < H + p.pb && w >= -p.pl && w < W + p.pr) ++counted;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            const double v = x.at_double((pl * H + h) * W + w);
            sum += v;
            ++n;
            if (v > best) {
              best = v;
              bi = (pl * H + h) * W + w;
            }
          }
        y.push_back(avg ? sum / static_cast<double>(include_pad ? counted : n) : best);
        idx.push_back(bi);
      }
}

TEST(MaxPool, RandomAgainstDirectLoops) {
  const std::vector<std::pair<std::vector<int64_t>, Pool2d>> cases = {
      {{2, 3, 7, 6}, {3, 3, 2, 2, 1, 1, 1, 1, 1, 1}},
      {{1, 2, 9, 8}, {2, 3, 1, 2, 2, 1, 0, 1, 1, 0}},
      {{1, 1, 5, 5}, {5, 5, 1, 1, 1, 1, 2, 2, 2, 2}},
      {{1, 2, 8, 8}, {2, 2, 3, 3, 3, 2, 1, 0, 0, 1}},
  };
  for (const auto& [shape, p] : cases) {
    Tensor x = random_tensor(shape);
    const int64_t oh = (shape[2] + p.pt + p.pb - (p.kh - 1) * p.dh - 1) / p.sh + 1;
    const int64_t ow = (shape[3] + p.pl + p.pr - (p.kw - 1) * p.dw - 1) / p.sw + 1;
    const Attributes a = attrs({{"kernel_shape", Ints({p.kh, p.kw})},
                                {"strides", Ints({p.sh, p.sw})},
                                {"dilations", Ints({p.dh, p.dw})},
                                {"pads", Ints({p.pt, p.pl, p.pb, p.pr})}});
    auto r = run_ok("MaxPool", x, a, 2);
    ASSERT_TRUE(r.status.ok());
    ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{shape[0], shape[1], oh, ow}));
    std::vector<double> y;
    std::vector<int64_t> idx;
    naive_pool2d(x, p, false, false, oh, ow, y, idx);
    expect_values(r.outputs[0], y);
    ASSERT_EQ(r.outputs[1].dtype(), DataType::kInt64);
    for (size_t i = 0; i < idx.size(); ++i) EXPECT_EQ(r.outputs[1].data<int64_t>()[i], idx[i]);
    for (bool include_pad : {false, true}) {
      Attributes av = a;
      av.set("count_include_pad", Attribute::Int(include_pad));
      auto ra = run_ok("AveragePool", x, av);
      std::vector<double> ya;
      idx.clear();
      naive_pool2d(x, p, true, include_pad, oh, ow, ya, idx);
      expect_values(ra.outputs[0], ya);
    }
  }
}

TEST(MaxPool, CeilModeDilationsAndIndices) {
  // onnx.reference literals.
  auto r = run_ok("MaxPool", pattern({1, 1, 5, 6}),
                  attrs({{"kernel_shape", Ints({2, 2})},
                         {"strides", Ints({2, 2})},
                         {"dilations", Ints({2, 1})},
                         {"pads", Ints({1, 1, 0, 0})},
                         {"ceil_mode", Attribute::Int(1)}}),
                  2);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 3, 4}));
  expect_values(r.outputs[0], {1, 0, 0.75, -1.25, 1, 0.75, 0.75, 0.5, 0, 0.75, -0.25, 0.5});
  expect_values(r.outputs[1], {6, 7, 9, 11, 6, 20, 9, 23, 18, 20, 21, 23});
  // SAME_UPPER with stride 2 on the last axis.
  r = run_ok("MaxPool", pattern({1, 1, 2, 7}),
             attrs({{"kernel_shape", Ints({2, 3})},
                    {"strides", Ints({1, 2})},
                    {"auto_pad", Attribute::String("SAME_UPPER")}}),
             2);
  expect_values(r.outputs[0], {0.5, 1.25, 1.25, 1, 0, 0.75, 0.5, 0.5});
  expect_values(r.outputs[1], {1, 3, 3, 6, 7, 9, 12, 12});
  // storage_order = 1: column-major index inside each plane, plus the plane offset.
  r = run_ok("MaxPool", pattern({1, 2, 5, 6}),
             attrs({{"kernel_shape", Ints({2, 2})},
                    {"strides", Ints({2, 2})},
                    {"storage_order", Attribute::Int(1)}}),
             2);
  expect_values(r.outputs[0], {1, 1.25, 0.25, 0.5, 1.25, 1, 1.25, 1, 0.5, 0.75, 1, 1.25});
  expect_values(r.outputs[1], {1, 15, 20, 2, 12, 27, 31, 46, 50, 32, 43, 57});
  // 3-D with padding.
  r = run_ok("MaxPool", pattern({1, 1, 3, 4, 4}, 13),
             attrs({{"kernel_shape", Ints({2, 2, 2})},
                    {"strides", Ints({1, 2, 2})},
                    {"pads", Ints({0, 1, 0, 1, 0, 1})}}),
             2);
  expect_values(r.outputs[0], {0.75, 1, 1.75, 1.75, 1.25, 1.5, 1.75, 1.5, 1.25, 1.5, 1.75, 0.75});
  expect_values(r.outputs[1], {16, 18, 24, 11, 33, 35, 24, 22, 33, 35, 37, 42});
}

TEST(MaxPool, OneDimensionalIntegerTypesAndPaddingIsNotAValue) {
  // All-negative input: padding must never win the max.
  Tensor x = Tensor::from<float>({1, 1, 4}, {-3, -1, -2, -4});
  auto r = run_ok("MaxPool", x, attrs({{"kernel_shape", Ints({2})}, {"pads", Ints({1, 1})}}), 2);
  expect_values(r.outputs[0], {-3, -1, -1, -2, -4});
  expect_values(r.outputs[1], {0, 1, 1, 2, 3});
  Tensor u = Tensor::from<uint8_t>({1, 1, 4}, {3, 250, 7, 1});
  r = run_ok("MaxPool", u, attrs({{"kernel_shape", Ints({2})}, {"pads", Ints({1, 0})}}));
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kUInt8);
  expect_values(r.outputs[0], {3, 250, 250, 7});
  Tensor i8 = Tensor::from<int8_t>({1, 1, 3}, {-128, -100, -120});
  r = run_ok("MaxPool", i8, attrs({{"kernel_shape", Ints({2})}}));
  expect_values(r.outputs[0], {-100, -100});
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    Tensor xc = x.cast(dt);
    r = run_ok("MaxPool", xc, attrs({{"kernel_shape", Ints({2})}, {"strides", Ints({2})}}));
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    expect_values(r.outputs[0], {-1, -2});
  }
}

TEST(AveragePool, CeilModeLastWindowRuleAndDilations) {
  // in 5, k 2, s 2, pads 1/1, ceil: 4 windows by the formula, but the 4th would start in the
  // right padding, so there are 3 (onnx.reference / PyTorch).
  auto r = run_ok("AveragePool", pattern({1, 1, 5}),
                  attrs({{"kernel_shape", Ints({2})},
                         {"strides", Ints({2})},
                         {"pads", Ints({1, 1})},
                         {"ceil_mode", Attribute::Int(1)}}));
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 3}));
  expect_values(r.outputs[0], {-1.25, 0, 0.75});
  r = run_ok("AveragePool", pattern({1, 1, 5}),
             attrs({{"kernel_shape", Ints({3})},
                    {"strides", Ints({2})},
                    {"pads", Ints({1, 1})},
                    {"ceil_mode", Attribute::Int(1)},
                    {"count_include_pad", Attribute::Int(1)}}));
  expect_values(r.outputs[0], {-0.25, 0.416667, 0.5});
  r = run_ok("AveragePool", pattern({1, 1, 5, 6}),
             attrs({{"kernel_shape", Ints({3, 2})},
                    {"strides", Ints({2, 3})},
                    {"pads", Ints({1, 0, 0, 1})},
                    {"ceil_mode", Attribute::Int(1)},
                    {"count_include_pad", Attribute::Int(1)}}));
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 3, 2}));
  expect_values(r.outputs[0], {0.0416667, 0.333333, 0, -0.25, -0.0625, -0.3125});
  r = run_ok("AveragePool", pattern({1, 2, 12}),
             attrs({{"kernel_shape", Ints({3})},
                    {"strides", Ints({2})},
                    {"dilations", Ints({2})},
                    {"pads", Ints({2, 1})},
                    {"count_include_pad", Attribute::Int(1)}}));
  expect_values(r.outputs[0], {-0.583333, -0.5, 0.25, 0.0833333, -0.0833333, -0.416667, 0.583333,
                               0.333333, 0.166667, 0, -0.166667, -0.166667});
  r = run_ok("AveragePool", pattern({1, 1, 2, 7}),
             attrs({{"kernel_shape", Ints({2, 3})},
                    {"strides", Ints({1, 2})},
                    {"auto_pad", Attribute::String("SAME_LOWER")}}));
  expect_values(r.outputs[0], {-0.375, 0.416667, 0.25, 0.125, -0.4375, 0.125, -0.0416667, 0.0625});
}

TEST(AveragePool, DtypesEmptyAndErrors) {
  Tensor x = random_tensor({2, 3, 4, 4});
  const Attributes a = attrs({{"kernel_shape", Ints({2, 2})}, {"strides", Ints({2, 2})}});
  auto ref = run_ok("AveragePool", x, a);
  for (DataType dt : {DataType::kFloat16, DataType::kFloat64}) {
    auto r = run_ok("AveragePool", x.cast(dt), a);
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    for (int64_t i = 0; i < ref.outputs[0].numel(); ++i)
      EXPECT_NEAR(r.outputs[0].at_double(i), ref.outputs[0].at_double(i), 2e-3);
  }
  auto r = run_ok("AveragePool", Tensor(DataType::kFloat32, {0, 3, 4, 4}), a);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 3, 2, 2}));
  Tensor xi = x.cast(DataType::kInt32);
  EXPECT_FALSE(run_op("AveragePool", {&xi}, a).status.ok());
  EXPECT_FALSE(run_op("AveragePool", {&x}, {}).status.ok());  // kernel_shape required
  EXPECT_FALSE(run_op("MaxPool", {&x}, attrs({{"kernel_shape", Ints({5, 5})}})).status.ok());
  EXPECT_FALSE(run_op("MaxPool", {&x}, attrs({{"kernel_shape", Ints({2})}})).status.ok());
  EXPECT_FALSE(run_op("MaxPool", {&x},
                      attrs({{"kernel_shape", Ints({2, 2})}, {"storage_order", Attribute::Int(2)}}))
                   .status.ok());
  Tensor r2 = random_tensor({3, 4});
  EXPECT_FALSE(run_op("MaxPool", {&r2}, attrs({{"kernel_shape", Ints({2})}})).status.ok());
}

TEST(Pool, InferenceWithSymbolicDims) {
  const TensorType x(DataType::kFloat32, {Dim::sym("N"), 8, 15, Dim()});
  auto out = infer(
      "MaxPool", {x},
      attrs({{"kernel_shape", Ints({3, 3})}, {"strides", Ints({2, 2})}, {"ceil_mode", Int(1)}}), 2);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[N,8,7,?]");
  EXPECT_EQ((*out)[1].str(), "int64[N,8,7,?]");
  out = infer("GlobalAveragePool", {x}, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[N,8,1,1]");
}

TEST(GlobalPool, AverageAndMaxOverAllSpatialDims) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2, 3, 5}, {1, 2, 3, 4}, {2, 2, 2, 3, 2}}) {
    Tensor x = random_tensor(shape);
    auto ra = run_ok("GlobalAveragePool", x, {});
    auto rm = run_ok("GlobalMaxPool", x, {});
    std::vector<int64_t> want = {shape[0], shape[1]};
    want.resize(shape.size(), 1);
    ASSERT_EQ(ra.outputs[0].shape(), want);
    ASSERT_EQ(rm.outputs[0].shape(), want);
    const int64_t planes = shape[0] * shape[1], inP = x.numel() / planes;
    for (int64_t p = 0; p < planes; ++p) {
      double s = 0, m = -1e30;
      for (int64_t i = 0; i < inP; ++i) {
        s += x.at_double(p * inP + i);
        m = std::max(m, x.at_double(p * inP + i));
      }
      EXPECT_NEAR(ra.outputs[0].at_double(p), s / static_cast<double>(inP), 1e-5);
      EXPECT_EQ(rm.outputs[0].at_double(p), m);
    }
  }
  Tensor h = Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4}).cast(DataType::kFloat16);
  auto r = run_ok("GlobalAveragePool", h, {});
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  EXPECT_EQ(r.outputs[0].at_double(0), 2.5);
  Tensor empty(DataType::kFloat32, {1, 2, 0});
  EXPECT_FALSE(run_op("GlobalMaxPool", {&empty}, {}).status.ok());
  Tensor xi = Tensor::from<int32_t>({1, 1, 2}, {1, 2});
  EXPECT_FALSE(run_op("GlobalAveragePool", {&xi}, {}).status.ok());
}

// MaxUnpool: ONNX's examples (with output_shape the unpooled tensor sits at the start), every
// float type, and errors for bad indices, a too-small output_shape and mismatched I.
TEST(MaxUnpool, KnownValuesTypesAndErrors) {
  const Attributes a =
      attrs({{"kernel_shape", Attribute::Ints({2, 2})}, {"strides", Attribute::Ints({2, 2})}});
  const Tensor x = Tensor::from<float>({1, 1, 2, 2}, {5, 6, 7, 8});
  const Tensor i = Tensor::from<int64_t>({1, 1, 2, 2}, {5, 7, 13, 15});
  OpRun r = run_op("MaxUnpool", {&x, &i}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 4, 4}));
  expect_values_scaled(r.outputs[0], {0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 7, 0, 8});
  const Tensor shape = Tensor::from<int64_t>({4}, {1, 1, 5, 5});
  r = run_op("MaxUnpool", {&x, &i, &shape}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values_scaled(r.outputs[0],
                       {0, 0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 8, 0, 0, 0, 0, 0, 0});
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    const Tensor xt = x.cast(t);
    r = run_op("MaxUnpool", {&xt, &i}, a);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    EXPECT_EQ(r.outputs[0].at_double(15), 8.0);
  }
  const Tensor bad = Tensor::from<int64_t>({1, 1, 2, 2}, {5, 7, 13, 16});
  expect_error(run_op("MaxUnpool", {&x, &bad}, a), "outside the unpooled");
  const Tensor neg = Tensor::from<int64_t>({1, 1, 2, 2}, {-1, 7, 13, 15});
  expect_error(run_op("MaxUnpool", {&x, &neg}, a), "outside the unpooled");
  const Tensor small = Tensor::from<int64_t>({4}, {1, 1, 3, 5});
  expect_error(run_op("MaxUnpool", {&x, &i, &small}, a), "smaller than the unpooled");
  const Tensor negative = Tensor::from<int64_t>({4}, {1, 1, -5, 5});
  expect_error(run_op("MaxUnpool", {&x, &i, &negative}, a), "negative size");
  const Tensor i3 = Tensor::from<int64_t>({1, 1, 3}, {0, 1, 2});
  expect_error(run_op("MaxUnpool", {&x, &i3}, a), "must have X's shape");
  const Tensor xi = Tensor::from<int32_t>({1, 1, 2, 2}, {1, 2, 3, 4});
  expect_error(run_op("MaxUnpool", {&xi, &i}, a), "must be a float");
  expect_error(run_op("MaxUnpool", {&x, &i}, attrs({{"kernel_shape", Attribute::Ints({2})}})),
               "kernel_shape has 1 values");
}

// LpPool / GlobalLpPool: padding adds nothing to the sum, p 1 / 2 / 3 by hand, errors.
TEST(LpPool, KnownValuesAndErrors) {
  const Tensor x = Tensor::from<float>({1, 1, 2, 2}, {3, -4, 1, -2});
  auto r = run_ok(
      "LpPool", x,
      attrs({{"kernel_shape", Attribute::Ints({2, 2})}, {"pads", Attribute::Ints({0, 0, 1, 1})}}));
  // Windows at (0,0), (0,1), (1,0), (1,1); p = 2.
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_NEAR(r.outputs[0].at_double(0), std::sqrt(9.0 + 16 + 1 + 4), 1e-5);
  EXPECT_NEAR(r.outputs[0].at_double(1), std::sqrt(16.0 + 4), 1e-5);
  EXPECT_NEAR(r.outputs[0].at_double(3), 2.0, 1e-6);
  auto r1 = run_ok("LpPool", x,
                   attrs({{"kernel_shape", Attribute::Ints({1, 2})}, {"p", Attribute::Int(1)}}));
  expect_values_scaled(r1.outputs[0], {7, 3});
  auto g3 = run_ok("GlobalLpPool", x, attrs({{"p", Attribute::Int(3)}}));
  EXPECT_NEAR(g3.outputs[0].at_double(0), std::cbrt(27.0 + 64 + 1 + 8), 1e-5);
  const Tensor h = x.cast(DataType::kFloat16);
  EXPECT_EQ(run_ok("GlobalLpPool", h, {}).outputs[0].dtype(), DataType::kFloat16);
  expect_error(run_op("LpPool", {&x},
                      attrs({{"kernel_shape", Attribute::Ints({2, 2})}, {"p", Attribute::Int(0)}})),
               "p must be >= 1");
  const Tensor xi = Tensor::from<int32_t>({1, 1, 2}, {1, 2});
  expect_error(run_op("GlobalLpPool", {&xi}, {}), "float types only");
  expect_error(run_op("LpPool", {&x}, {}), "kernel_shape is required");
}

}  // namespace
}  // namespace kiln::test
