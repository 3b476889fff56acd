// Conv and ConvTranspose: known values (spec examples, onnx.reference literals for the padding
// rules), random cases against a direct-loop formula written here, dtypes, inference and errors.
#include <chrono>
#include <cmath>

#include "ops/conv.h"
#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

// Up to 3 spatial dims; missing trailing dims act as size 1, kernel 1, stride 1, no padding.
struct Geo {
  std::vector<int64_t> in, k, s, d, pb, out;
  int64_t at(const std::vector<int64_t>& v, size_t i, int64_t def) const {
    return i < v.size() ? v[i] : def;
  }
};

// Direct-loop Conv: y[n,m,o] = b[m] + sum x[n, g*Cg+c, o*s - pb + k*d] * w[m, c, k].
Tensor naive_conv(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group, Geo g) {
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0), Cg = C / group, Mg = M / group;
  int64_t I[3], K[3], S[3], D[3], PB[3], O[3];
  for (size_t i = 0; i < 3; ++i) {
    I[i] = g.at(g.in, i, 1);
    K[i] = g.at(g.k, i, 1);
    S[i] = g.at(g.s, i, 1);
    D[i] = g.at(g.d, i, 1);
    PB[i] = g.at(g.pb, i, 0);
    O[i] = g.at(g.out, i, 1);
  }
  std::vector<int64_t> shape = {N, M};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  Tensor y(DataType::kFloat32, shape);
  const float* X = x.data<float>();
  const float* W = w.data<float>();
  float* Y = y.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o0 = 0; o0 < O[0]; ++o0)
        for (int64_t o1 = 0; o1 < O[1]; ++o1)
          for (int64_t o2 = 0; o2 < O[2]; ++o2) {
            double acc = b ? b->data<float>()[m] : 0.0;
            const int64_t gi = m / Mg;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t k0 = 0; k0 < K[0]; ++k0)
                for (int64_t k1 = 0; k1 < K[1]; ++k1)
                  for (int64_t k2 = 0; k2 < K[2]; ++k2) {
                    const int64_t i0 = o0 * S[0] - PB[0] + k0 * D[0];
                    const int64_t i1 = o1 * S[1] - PB[1] + k1 * D[1];
                    const int64_t i2 = o2 * S[2] - PB[2] + k2 * D[2];
                    if (i0 < 0 || i0 >= I[0] || i1 < 0 || i1 >= I[1] || i2 < 0 || i2 >= I[2])
                      continue;
                    const int64_t xc = gi * Cg + c;
                    acc += X[(((n * C + xc) * I[0] + i0) * I[1] + i1) * I[2] + i2] *
                           W[(((m * Cg + c) * K[0] + k0) * K[1] + k1) * K[2] + k2];
                  }
            Y[(((n * M + m) * O[0] + o0) * O[1] + o1) * O[2] + o2] = static_cast<float>(acc);
          }
  return y;
}

// Direct-loop ConvTranspose (scatter): y[n, g*Mg+m, i*s - pb + k*d] += x[n, g*Cg+c, i] * w[c', m, k].
Tensor naive_conv_transpose(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group,
                            Geo g) {
  const int64_t N = x.dim(0), C = x.dim(1), Mg = w.dim(1), M = Mg * group, Cg = C / group;
  int64_t I[3], K[3], S[3], D[3], PB[3], O[3];
  for (size_t i = 0; i < 3; ++i) {
    I[i] = g.at(g.in, i, 1);
    K[i] = g.at(g.k, i, 1);
    S[i] = g.at(g.s, i, 1);
    D[i] = g.at(g.d, i, 1);
    PB[i] = g.at(g.pb, i, 0);
    O[i] = g.at(g.out, i, 1);
  }
  std::vector<int64_t> shape = {N, M};
  shape.insert(shape.end(), g.out.begin(), g.out.end());
  std::vector<double> acc(static_cast<size_t>(N * M * O[0] * O[1] * O[2]), 0.0);
  const float* X = x.data<float>();
  const float* W = w.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t m = 0; m < Mg; ++m)
        for (int64_t i0 = 0; i0 < I[0]; ++i0)
          for (int64_t i1 = 0; i1 < I[1]; ++i1)
            for (int64_t i2 = 0; i2 < I[2]; ++i2)
              for (int64_t k0 = 0; k0 < K[0]; ++k0)
                for (int64_t k1 = 0; k1 < K[1]; ++k1)
                  for (int64_t k2 = 0; k2 < K[2]; ++k2) {
                    const int64_t o0 = i0 * S[0] - PB[0] + k0 * D[0];
                    const int64_t o1 = i1 * S[1] - PB[1] + k1 * D[1];
                    const int64_t o2 = i2 * S[2] - PB[2] + k2 * D[2];
                    if (o0 < 0 || o0 >= O[0] || o1 < 0 || o1 >= O[1] || o2 < 0 || o2 >= O[2])
                      continue;
                    const int64_t om = (c / Cg) * Mg + m;
                    acc[(((n * M + om) * O[0] + o0) * O[1] + o1) * O[2] + o2] +=
                        X[(((n * C + c) * I[0] + i0) * I[1] + i1) * I[2] + i2] *
                        W[(((c * Mg + m) * K[0] + k0) * K[1] + k1) * K[2] + k2];
                  }
  Tensor y(DataType::kFloat32, shape);
  for (int64_t i = 0; i < y.numel(); ++i) {
    const int64_t m = (i / (O[0] * O[1] * O[2])) % M;
    y.data<float>()[i] = static_cast<float>(acc[i] + (b ? b->data<float>()[m] : 0.0));
  }
  return y;
}

void expect_close(const Tensor& got, const Tensor& want, float tol = 1e-4f) {
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(got.at_double(i), want.at_double(i), tol * (1 + std::fabs(want.at_double(i))))
        << "element " << i;
}

TEST(Conv, BasicWithAndWithoutPadding) {
  // ONNX spec example: 5x5 ramp convolved with a 3x3 box.
  Tensor x(DataType::kFloat32, {1, 1, 5, 5});
  for (int i = 0; i < 25; ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor w = Tensor::from<float>({1, 1, 3, 3}, std::vector<float>(9, 1.f));
  auto r = run_op("Conv", {&x, &w},
                  attrs({{"kernel_shape", Ints({3, 3})}, {"pads", Ints({1, 1, 1, 1})}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values(r.outputs[0], {12, 21, 27, 33, 24, 33, 54, 63, 72, 51, 63, 99, 108, 117, 81,
                               93, 144, 153, 162, 111, 72, 111, 117, 123, 84});
  r = run_op("Conv", {&x, &w}, {});  // kernel_shape inferred from W, no padding
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 3, 3}));
  expect_values(r.outputs[0], {54, 63, 72, 99, 108, 117, 144, 153, 162});
}

TEST(Conv, RandomAgainstDirectLoops) {
  struct Case {
    std::vector<int64_t> x, w;
    int64_t group;
    Geo g;
    bool bias;
  };
  const std::vector<Case> cases = {
      {{2, 3, 7}, {4, 3, 3}, 1, {{7}, {3}, {2}, {1}, {1}, {}}, true},                  // 1-D
      {{1, 4, 9}, {6, 2, 2}, 2, {{9}, {2}, {1}, {3}, {0}, {}}, false},                 // groups+dil
      {{1, 3, 8, 7}, {5, 3, 3, 2}, 1, {{8, 7}, {3, 2}, {2, 1}, {1, 2}, {1, 0}, {}}, true},
      {{2, 4, 6, 6}, {4, 1, 3, 3}, 4, {{6, 6}, {3, 3}, {1, 1}, {1, 1}, {1, 1}, {}}, true},  // dw
      {{1, 4, 6, 5}, {8, 1, 3, 3}, 4, {{6, 5}, {3, 3}, {2, 2}, {2, 1}, {2, 1}, {}}, false},
      {{1, 6, 5, 5}, {4, 3, 1, 1}, 2, {{5, 5}, {1, 1}, {1, 1}, {1, 1}, {0, 0}, {}}, true},  // 1x1
      {{1, 2, 5, 4, 6}, {3, 2, 2, 3, 2}, 1, {{5, 4, 6}, {2, 3, 2}, {1, 2, 2}, {2, 1, 1}, {1, 0, 1}, {}}, true},
  };
  for (const Case& c : cases) {
    // Asymmetric padding: pads end = pads begin + 1 on every axis.
    std::vector<int64_t> pads = c.g.pb;
    for (int64_t p : c.g.pb) pads.push_back(p + 1);
    Geo g = c.g;
    for (size_t i = 0; i < g.in.size(); ++i)
      g.out.push_back((g.in[i] + g.pb[i] * 2 + 1 - (g.k[i] - 1) * g.d[i] - 1) / g.s[i] + 1);
    Tensor x = random_tensor(c.x), w = random_tensor(c.w), b = random_tensor({c.w[0]});
    auto r = run_op("Conv", {&x, &w, c.bias ? &b : nullptr},
                    attrs({{"group", Attribute::Int(c.group)},
                           {"strides", Ints(g.s)},
                           {"dilations", Ints(g.d)},
                           {"pads", Ints(pads)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    expect_close(r.outputs[0], naive_conv(x, w, c.bias ? &b : nullptr, c.group, g));
  }
}

TEST(Conv, AutoPadSameWithStridesAndDilations) {
  const Tensor x = pattern({1, 2, 6, 7}), w = pattern({3, 2, 3, 3}, 7);
  const Attributes base = attrs({{"strides", Ints({2, 2})}, {"dilations", Ints({1, 2})}});
  // Literals from onnx.reference: H: out 3, total pad 1; W: out 4, total pad 4.
  Attributes a = base;
  a.set("auto_pad", Attribute::String("SAME_LOWER"));
  auto r = run_op("Conv", {&x, &w}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 3, 3, 4}));
  expect_values(r.outputs[0], {2.8125f, 3.75f, 2.8125f, 1.5625f, -1.5625f, -2.1875f, -1.875f, 0.f,
                               2.1875f, 0.f, -3.125f, -3.125f, 2.8125f, 3.75f, 2.8125f, 1.5625f,
                               -1.5625f, -2.1875f, -1.875f, 0.f, 2.1875f, 0.f, -3.125f, -3.125f,
                               2.8125f, 3.75f, 2.8125f, 1.5625f, -1.5625f, -2.1875f, -1.875f, 0.f,
                               2.1875f, 0.f, -3.125f, -3.125f});
  a.set("auto_pad", Attribute::String("SAME_UPPER"));
  r = run_op("Conv", {&x, &w}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {0.f, 1.875f, 2.1875f, 1.5625f, -3.125f, -2.8125f, -2.5f, -1.5625f,
                               0.9375f, 0.9375f, 0.f, -0.3125f, 0.f, 1.875f, 2.1875f, 1.5625f,
                               -3.125f, -2.8125f, -2.5f, -1.5625f, 0.9375f, 0.9375f, 0.f,
                               -0.3125f, 0.f, 1.875f, 2.1875f, 1.5625f, -3.125f, -2.8125f, -2.5f,
                               -1.5625f, 0.9375f, 0.9375f, 0.f, -0.3125f});
  // VALID ignores pads; the SAME/VALID results equal explicit padding with the implied pads.
  a.set("auto_pad", Attribute::String("VALID"));
  a.set("pads", Ints({5, 5, 5, 5}));
  r = run_op("Conv", {&x, &w}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_close(r.outputs[0], naive_conv(x, w, nullptr, 1, {{6, 7}, {3, 3}, {2, 2}, {1, 2}, {0, 0}, {2, 2}}));
}

TEST(Conv, DtypesAndEmptyBatch) {
  Tensor x = random_tensor({2, 2, 5, 5}), w = random_tensor({3, 2, 3, 3}), b = random_tensor({3});
  const Attributes a = attrs({{"pads", Ints({1, 1, 1, 1})}});
  auto ref = run_op("Conv", {&x, &w, &b}, a);
  ASSERT_TRUE(ref.status.ok()) << ref.status.message();
  for (DataType dt : {DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    Tensor xc = x.cast(dt), wc = w.cast(dt), bc = b.cast(dt);
    auto r = run_op("Conv", {&xc, &wc, &bc}, a);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    const float tol = dt == DataType::kFloat64 ? 1e-5f : dt == DataType::kFloat16 ? 2e-2f : 8e-2f;
    expect_close(r.outputs[0], ref.outputs[0], tol);
  }
  Tensor e(DataType::kFloat32, {0, 2, 5, 5});
  auto r = run_op("Conv", {&e, &w, &b}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 3, 5, 5}));
}

TEST(Conv, InferenceKeepsSymbolsAndUnknowns) {
  const TensorType x(DataType::kFloat32, {Dim::sym("N"), 3, Dim(), 32});
  const Tensor w = random_tensor({8, 3, 3, 3});
  auto out =
      infer("Conv", {x, w}, attrs({{"strides", Ints({2, 2})}, {"auto_pad", Str("SAME_UPPER")}}));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[N,8,?,16]");
  // X of unknown rank: the rank and M come from W.
  out = infer("Conv", {TensorType::unknown_rank(DataType::kFloat32), w}, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[?,8,?,?]");
  // ConvTranspose: M = W[1] * group, output_shape fixes the spatial dims.
  out = infer("ConvTranspose", {x, random_tensor({3, 2, 3, 3})},
              attrs({{"output_shape", Ints({9, 65})}, {"strides", Ints({2, 2})}}));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[N,2,9,65]");
}

TEST(Conv, Errors) {
  Tensor x = random_tensor({1, 4, 5, 5}), w = random_tensor({6, 2, 3, 3});
  Tensor b5 = random_tensor({5});
  EXPECT_FALSE(run_op("Conv", {&x, &w}, {}).status.ok());  // channels 4 vs 2 (group 1)
  EXPECT_TRUE(run_op("Conv", {&x, &w}, attrs({{"group", Attribute::Int(2)}})).status.ok());
  EXPECT_FALSE(run_op("Conv", {&x, &w}, attrs({{"group", Attribute::Int(3)}})).status.ok());
  EXPECT_FALSE(run_op("Conv", {&x, &w, &b5}, attrs({{"group", Attribute::Int(2)}})).status.ok());
  Tensor big = random_tensor({6, 4, 7, 7});
  EXPECT_FALSE(run_op("Conv", {&x, &big}, {}).status.ok());  // kernel larger than input
  EXPECT_FALSE(run_op("Conv", {&x, &big}, attrs({{"kernel_shape", Ints({3, 3})}})).status.ok());
  Tensor w4 = random_tensor({6, 4, 3, 3});
  EXPECT_FALSE(
      run_op("Conv", {&x, &w4}, attrs({{"auto_pad", Attribute::String("SAME")}})).status.ok());
  EXPECT_FALSE(run_op("Conv", {&x, &w4}, attrs({{"pads", Ints({1, 1})}})).status.ok());
  EXPECT_FALSE(run_op("Conv", {&x, &w4}, attrs({{"strides", Ints({0, 1})}})).status.ok());
  Tensor x2 = random_tensor({4, 5});
  Tensor w2 = random_tensor({6, 5});
  EXPECT_FALSE(run_op("Conv", {&x2, &w2}, {}).status.ok());  // no spatial dims
  Tensor xi = x.cast(DataType::kInt32), wi = w4.cast(DataType::kInt32);
  EXPECT_FALSE(run_op("Conv", {&xi, &wi}, {}).status.ok());
}

TEST(Conv, ReusableFloatKernel) {
  // conv_params + conv_f32, as a fused layer uses them.
  Graph g;
  Value* xv = g.add_value("x", {});
  Node* n = g.add_node("Conv", "c", {xv}, {"y"});
  n->attrs.set("pads", Ints({0, 1, 0, 1}));
  n->attrs.set("strides", Ints({1, 2}));
  Tensor x = random_tensor({1, 2, 4, 6}), w = random_tensor({3, 2, 2, 3}), b = random_tensor({3});
  auto p = conv_params(*n, x.shape(), w.shape());
  ASSERT_TRUE(p.ok()) << p.status().message();
  Tensor y(DataType::kFloat32, {1, 3, p->out[0], p->out[1]});
  conv_f32(*p, x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>());
  expect_close(y, naive_conv(x, w, &b, 1, {{4, 6}, {2, 3}, {1, 2}, {1, 1}, {0, 1}, {3, 3}}));
}

TEST(Conv, ResNetSizedLayerIsFast) {
  // 3x3, 128 -> 128 channels at 28x28 (~116 MMAC): a few hundred ms at most on one core.
  Tensor x = random_tensor({1, 128, 28, 28}), w = random_tensor({128, 128, 3, 3});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_op("Conv", {&x, &w}, attrs({{"pads", Ints({1, 1, 1, 1})}}));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.status.ok());
  EXPECT_LT(s, 2.0);
}

// --- ConvTranspose ---------------------------------------------------------------------------

TEST(ConvTranspose, SpecExample) {
  Tensor x(DataType::kFloat32, {1, 1, 3, 3});
  for (int i = 0; i < 9; ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor w = Tensor::from<float>({1, 2, 3, 3}, std::vector<float>(18, 1.f));
  auto r = run_op("ConvTranspose", {&x, &w}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 2, 5, 5}));
  const std::vector<double> plane = {0,  1,  3, 3,  2,  3,  8,  15, 12, 7,  9,  21, 36,
                                     27, 15, 9, 20, 33, 24, 13, 6,  13, 21, 15, 8};
  std::vector<double> want = plane;
  want.insert(want.end(), plane.begin(), plane.end());
  expect_values(r.outputs[0], want);
}

TEST(ConvTranspose, RandomAgainstScatterLoops) {
  struct Case {
    std::vector<int64_t> x, w;
    int64_t group;
    Geo g;
    std::vector<int64_t> opad;
  };
  const std::vector<Case> cases = {
      {{2, 3, 5}, {3, 2, 3}, 1, {{5}, {3}, {2}, {1}, {1}, {}}, {1}},
      {{1, 4, 4}, {4, 3, 2}, 2, {{4}, {2}, {2}, {2}, {1}, {}}, {1}},
      {{1, 2, 3, 4}, {2, 3, 3, 2}, 1, {{3, 4}, {3, 2}, {3, 2}, {1, 1}, {1, 0}, {}}, {1, 1}},
      {{1, 4, 3, 3}, {4, 1, 3, 3}, 4, {{3, 3}, {3, 3}, {2, 1}, {1, 2}, {0, 2}, {}}, {0, 0}},
      {{1, 2, 2, 3, 2}, {2, 2, 2, 2, 3}, 1, {{2, 3, 2}, {2, 2, 3}, {2, 1, 2}, {1, 2, 1}, {0, 1, 1}, {}}, {1, 0, 1}},
  };
  for (const Case& c : cases) {
    std::vector<int64_t> pads = c.g.pb;
    for (int64_t p : c.g.pb) pads.push_back(p);
    Geo g = c.g;
    for (size_t i = 0; i < g.in.size(); ++i)
      g.out.push_back(g.s[i] * (g.in[i] - 1) + c.opad[i] + (g.k[i] - 1) * g.d[i] + 1 - 2 * g.pb[i]);
    Tensor x = random_tensor(c.x), w = random_tensor(c.w), b = random_tensor({c.w[1] * c.group});
    auto r = run_op("ConvTranspose", {&x, &w, &b},
                    attrs({{"group", Attribute::Int(c.group)},
                           {"strides", Ints(g.s)},
                           {"dilations", Ints(g.d)},
                           {"pads", Ints(pads)},
                           {"output_padding", Ints(c.opad)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    expect_close(r.outputs[0], naive_conv_transpose(x, w, &b, c.group, g));
  }
}

TEST(ConvTranspose, OutputShapeAndAutoPad) {
  const Tensor x = pattern({1, 1, 3, 3}), w = pattern({1, 2, 3, 3}, 7);
  // output_shape larger than the natural 7x7 size: the implied pads are negative at the end.
  auto r = run_op("ConvTranspose", {&x, &w},
                  attrs({{"strides", Ints({3, 2})}, {"output_shape", Ints({10, 8})}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 2, 10, 8}));
  expect_close(r.outputs[0],
               naive_conv_transpose(x, w, nullptr, 1, {{3, 3}, {3, 3}, {3, 2}, {1, 1}, {0, 0}, {10, 8}}));
  // Smaller than natural: total pads H 2 -> (1,1), W 1 -> (1,0) (begin gets the extra).
  r = run_op("ConvTranspose", {&x, &w},
             attrs({{"strides", Ints({2, 2})}, {"output_shape", Ints({1, 2, 5, 6})}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_close(r.outputs[0],
               naive_conv_transpose(x, w, nullptr, 1, {{3, 3}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, {5, 6}}));
  // SAME_UPPER / SAME_LOWER: output = input * stride, total pad 1 at the end / the beginning
  // (onnx.reference literals, first row of each).
  r = run_op("ConvTranspose", {&x, &w},
             attrs({{"strides", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_UPPER")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 2, 6, 6}));
  for (int i = 0; i < 6; ++i)
    EXPECT_FLOAT_EQ(r.outputs[0].data<float>()[i],
                    (std::vector<float>{1.5625f, 1.5625f, 0.9375f, -0.625f, 0.f, 0.625f})[i]);
  r = run_op("ConvTranspose", {&x, &w},
             attrs({{"strides", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_LOWER")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  for (int i = 0; i < 6; ++i)
    EXPECT_FLOAT_EQ(r.outputs[0].data<float>()[6 + i],
                    (std::vector<float>{0.f, -0.9375f, -0.9375f, 0.625f, 1.5625f, 1.5625f})[i]);
}

TEST(ConvTranspose, DtypesAndErrors) {
  Tensor x = random_tensor({1, 2, 3, 3}), w = random_tensor({2, 3, 2, 2});
  auto ref = run_op("ConvTranspose", {&x, &w}, attrs({{"strides", Ints({2, 2})}}));
  ASSERT_TRUE(ref.status.ok());
  for (DataType dt : {DataType::kFloat64, DataType::kFloat16}) {
    Tensor xc = x.cast(dt), wc = w.cast(dt);
    auto r = run_op("ConvTranspose", {&xc, &wc}, attrs({{"strides", Ints({2, 2})}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    expect_close(r.outputs[0], ref.outputs[0], dt == DataType::kFloat16 ? 2e-2f : 1e-5f);
  }
  Tensor w3 = random_tensor({3, 3, 2, 2}), b = random_tensor({2});
  EXPECT_FALSE(run_op("ConvTranspose", {&x, &w3}, {}).status.ok());  // C 2 vs W 3
  EXPECT_FALSE(run_op("ConvTranspose", {&x, &w, &b}, {}).status.ok());  // bias [2] vs M 3
  EXPECT_FALSE(run_op("ConvTranspose", {&x, &w}, attrs({{"output_shape", Ints({5})}})).status.ok());
  EXPECT_FALSE(
      run_op("ConvTranspose", {&x, &w}, attrs({{"pads", Ints({3, 3, 3, 3})}})).status.ok());
}

}  // namespace
}  // namespace kiln::test
