// Pad (all modes, negative pads, axes, opset < 11 attributes), DepthToSpace, SpaceToDepth.
#include "op_test_util.h"

namespace kiln::test {
namespace {

Attributes mode_attr(const std::string& m) { return attrs({{"mode", Str(m)}}); }

const Tensor kX = Tensor::from<float>({3, 2}, {1.0f, 1.2f, 2.3f, 3.4f, 4.5f, 5.7f});

// The ONNX operator examples (pads [0, 2, 0, 0] on the 3x2 input).
TEST(Pad, OnnxExamplesAllModes) {
  Tensor pads = Tensor::from<int64_t>({4}, {0, 2, 0, 0});
  struct Case {
    std::string mode;
    std::vector<double> want;
  };
  const std::vector<Case> cases = {
      {"constant", {0, 0, 1.0, 1.2, 0, 0, 2.3, 3.4, 0, 0, 4.5, 5.7}},
      {"reflect", {1.0, 1.2, 1.0, 1.2, 2.3, 3.4, 2.3, 3.4, 4.5, 5.7, 4.5, 5.7}},
      {"edge", {1.0, 1.0, 1.0, 1.2, 2.3, 2.3, 2.3, 3.4, 4.5, 4.5, 4.5, 5.7}},
      {"wrap", {1.0, 1.2, 1.0, 1.2, 2.3, 3.4, 2.3, 3.4, 4.5, 5.7, 4.5, 5.7}},
  };
  for (const Case& c : cases) {
    OpRun r = run_op("Pad", {&kX, &pads}, mode_attr(c.mode), 1, {false, true});
    ASSERT_TRUE(r.status.ok()) << c.mode << ": " << r.status.message();
    expect_inferred_matches(r);
    EXPECT_EQ(r.inferred[0].str(), "float32[3,4]");
    const auto got = values_d(r.outputs[0]);
    ASSERT_EQ(got.size(), c.want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], c.want[i], 1e-6) << c.mode << i;
  }
}

TEST(Pad, ReflectAcrossSeveralPeriodsAndConstantValue) {
  Tensor x = Tensor::from<int32_t>({3}, {1, 2, 3});
  Tensor pads = Tensor::from<int64_t>({2}, {5, 5});
  OpRun r = run_op("Pad", {&x, &pads}, mode_attr("reflect"));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_d(r.outputs[0]),
            (std::vector<double>{2, 1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2}));  // numpy 'reflect'
  r = run_op("Pad", {&x, &pads}, mode_attr("wrap"));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2}));
  Tensor v = Tensor::scalar<int32_t>(-7);
  Tensor p1 = Tensor::from<int64_t>({2}, {1, 2});
  r = run_op("Pad", {&x, &p1, &v}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{-7, 1, 2, 3, -7, -7}));
}

TEST(Pad, NegativePadsCrop) {
  Tensor x = Tensor::from<int64_t>({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor pads = Tensor::from<int64_t>({4}, {0, -1, 1, -2});
  OpRun r = run_op("Pad", {&x, &pads}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{1, 5, 0}));
  Tensor too_much = Tensor::from<int64_t>({4}, {0, -3, 0, -3});
  EXPECT_FALSE(run_op("Pad", {&x, &too_much}, {}).status.ok());
}

TEST(Pad, AxesInputOpset18) {
  Tensor x = random_tensor({2, 3, 4});
  Tensor pads =
      Tensor::from<int64_t>({4}, {1, 0, 0, 2});  // axes [-1, 0]: last +1 front, axis0 +2 back
  Tensor axes = Tensor::from<int64_t>({2}, {-1, 0});
  Tensor v = Tensor::scalar<float>(9.f);
  OpRun r = run_op("Pad", {&x, &pads, &v, &axes}, {}, 1, {false, true, false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{4, 3, 5}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 5; ++k) {
        const double got = r.outputs[0].at_double((i * 3 + j) * 5 + k);
        const double want = (i >= 2 || k == 0) ? 9.0 : x.at_double((i * 3 + j) * 4 + k - 1);
        EXPECT_EQ(got, want);
      }
}

TEST(Pad, Opset2AttributesBecomeInputs) {
  Attributes a = mode_attr("constant");
  a.set("pads", Attribute::Ints({0, 1, 0, 1}));
  a.set("value", Attribute::Float(2.5f));
  OpRun r = run_imported("Pad", {&kX}, a, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.inferred[0].str(), "float32[3,4]");
  EXPECT_EQ(values_d(r.outputs[0])[0], 2.5);
  EXPECT_NEAR(values_d(r.outputs[0])[1], 1.0, 1e-6);
  // Opset 1 called it `paddings`; edge mode without a value.
  Attributes b = mode_attr("edge");
  b.set("paddings", Attribute::Ints({1, 0, 0, 0}));
  r = run_imported("Pad", {&kX}, b, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_NEAR(values_d(r.outputs[0])[0], 1.0, 1e-6);
}

TEST(Pad, DtypesEmptyAndErrors) {
  for (DataType t : {DataType::kFloat16, DataType::kBool, DataType::kUInt8, DataType::kInt64}) {
    Tensor x = kX.cast(t);
    Tensor pads = Tensor::from<int64_t>({4}, {1, 1, 1, 1});
    OpRun r = run_op("Pad", {&x, &pads}, mode_attr("edge"));
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.outputs[0].dtype(), t);
    EXPECT_EQ(r.outputs[0].at_double(0), x.at_double(0));
  }
  Tensor e(DataType::kFloat32, {0, 2});
  Tensor pads = Tensor::from<int64_t>({4}, {1, 0, 0, 0});
  OpRun r = run_op("Pad", {&e, &pads}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(run_op("Pad", {&e, &pads}, mode_attr("reflect")).status.ok());
  Tensor short_pads = Tensor::from<int64_t>({2}, {1, 1});
  EXPECT_FALSE(run_op("Pad", {&kX, &short_pads}, {}).status.ok());
  EXPECT_FALSE(run_op("Pad", {&kX, &pads}, mode_attr("mirror")).status.ok());
}

// --- DepthToSpace / SpaceToDepth ------------------------------------------------------------
Attributes block(int64_t b, const std::string& mode = "") {
  Attributes a;
  a.set("blocksize", Attribute::Int(b));
  if (!mode.empty()) a.set("mode", Attribute::String(mode));
  return a;
}

// Numpy formulas from the ONNX spec, evaluated by index arithmetic.
double d2s_want(const Tensor& x, int64_t b, bool crd, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t C = x.dim(1), H = x.dim(2), W = x.dim(3), Co = C / (b * b);
  const int64_t i = h % b, j = w % b;
  const int64_t ci = crd ? c * b * b + i * b + j : (i * b + j) * Co + c;
  return x.at_double(((n * C + ci) * H + h / b) * W + w / b);
}

TEST(DepthToSpace, DcrAndCrdMatchSpecFormula) {
  Tensor x = random_tensor({2, 8, 2, 3});
  for (const std::string mode : {"DCR", "CRD", ""}) {
    OpRun r = run_op("DepthToSpace", {&x}, block(2, mode));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 2, 4, 6}));
    int64_t e = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < 2; ++c)
        for (int64_t h = 0; h < 4; ++h)
          for (int64_t w = 0; w < 6; ++w)
            EXPECT_EQ(r.outputs[0].at_double(e++), d2s_want(x, 2, mode == "CRD", n, c, h, w));
  }
}

TEST(DepthToSpace, OnnxCrdExample) {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i);
  Tensor x = Tensor::from<float>({1, 4, 2, 2}, v);
  OpRun r = run_op("DepthToSpace", {&x}, block(2, "CRD"));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_d(r.outputs[0]),
            (std::vector<double>{0, 4, 1, 5, 8, 12, 9, 13, 2, 6, 3, 7, 10, 14, 11, 15}));
}

TEST(SpaceToDepth, InvertsDepthToSpaceDcr) {
  Tensor x = random_tensor({1, 3, 4, 6}).cast(DataType::kFloat64);
  OpRun s = run_op("SpaceToDepth", {&x}, block(2));
  ASSERT_TRUE(s.status.ok()) << s.status.message();
  expect_inferred_matches(s);
  ASSERT_EQ(s.outputs[0].shape(), (std::vector<int64_t>{1, 12, 2, 3}));
  // Spec formula: output channel (i*b + j)*C + c at (h, w) holds x[c, h*b+i, w*b+j];
  // here i = j = 1, c = 2, h = 1, w = 2.
  EXPECT_EQ(s.outputs[0].at_double((11 * 2 + 1) * 3 + 2), x.at_double((2 * 4 + 3) * 6 + 5));
  OpRun d = run_op("DepthToSpace", {&s.outputs[0]}, block(2, "DCR"));
  ASSERT_TRUE(d.status.ok());
  EXPECT_EQ(values_d(d.outputs[0]), values_d(x));
}

TEST(SpaceToDepth, Errors) {
  Tensor x = random_tensor({1, 3, 5, 6});
  EXPECT_FALSE(run_op("SpaceToDepth", {&x}, block(2)).status.ok());
  EXPECT_FALSE(run_op("DepthToSpace", {&x}, block(2)).status.ok());  // 3 % 4 != 0
  EXPECT_FALSE(run_op("DepthToSpace", {&x}, block(0)).status.ok());
  Tensor r3 = random_tensor({4, 2, 2});
  EXPECT_FALSE(run_op("DepthToSpace", {&r3}, block(2)).status.ok());
  Tensor x4 = random_tensor({1, 4, 1, 1});
  EXPECT_FALSE(run_op("DepthToSpace", {&x4}, block(2, "XYZ")).status.ok());
  Tensor e(DataType::kInt8, {0, 4, 1, 1});
  OpRun r = run_op("DepthToSpace", {&e}, block(2));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 1, 2, 2}));
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

TEST(Pad, InferenceWithUnknownsAndHugePads) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 3}));
  Value* pc = g.add_constant("p", Tensor::from<int64_t>({4}, {0, 1, 0, 2}));
  Value* pd = g.add_value("pd", TensorType(DataType::kInt64, {4}));
  Node* a = g.add_node("Pad", "a", {x, pc}, {"ya"});
  Node* b = g.add_node("Pad", "b", {x, pd}, {"yb"});
  std::vector<TensorType> out(1);
  InferContext ca(*a, out);
  ASSERT_TRUE(find_op("", "Pad")->infer(ca).ok());
  EXPECT_EQ(out[0].str(), "float32[N,6]");  // symbolic dim with zero pads keeps its symbol
  InferContext cb(*b, out);
  ASSERT_TRUE(find_op("", "Pad")->infer(cb).ok());
  EXPECT_EQ(out[0].str(), "float32[?,?]");
  Tensor huge = Tensor::from<int64_t>({4}, {0, int64_t{1} << 50, 0, 0});
  EXPECT_FALSE(run_op("Pad", {&kX, &huge}, {}).status.ok());
  EXPECT_FALSE(run_op("Pad", {&kX, &huge}, {}, 1, {false, true}).status.ok());
}

}  // namespace
}  // namespace kiln::test
