// Resize and Upsample. Expected values are the ONNX test data, or were generated once with
// onnx.reference (ReferenceEvaluator, onnx 1.23) and pasted here as literals.
#include "op_test_util.h"

namespace kiln::test {
namespace {

Tensor scales(std::vector<float> v) { return Tensor::from<float>({int64_t(v.size())}, v); }

Tensor iota4x4() {
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i + 1);
  return Tensor::from<float>({1, 1, 4, 4}, v);
}

// Runs Resize(X, roi, scales, sizes) with constant roi/scales/sizes and checks shape + values.
void expect_resize(const Attributes& a, const Tensor& x, const Tensor* roi, const Tensor* sc,
                   const Tensor* sz, const std::vector<int64_t>& shape,
                   const std::vector<double>& want, double tol = 1e-4) {
  OpRun r = run_op("Resize", {&x, roi, sc, sz}, a, 1, {false, true, true, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_TRUE(r.inferred[0].is_static()) << r.inferred[0].str();
  ASSERT_EQ(r.outputs[0].shape(), shape);
  expect_values(r.outputs[0], want, 0, tol);
}

// Imports a node of `op` at `opset` (running the upgrade, which must leave a Resize), then
// infers and runs it; inputs are graph inputs except where `consts` says constant.
OpRun import_resize(const std::string& op, const std::vector<const Tensor*>& inputs,
                    const Attributes& a, int opset, std::vector<bool> consts = {}) {
  OpRun r = run_imported(op, inputs, a, opset, 1, std::move(consts));
  if (!r.op_type.empty()) {
    EXPECT_EQ(r.op_type, "Resize");
  }
  return r;
}

// --- values from the ONNX node test data ------------------------------------------------------
TEST(Resize, OnnxTestDataCases) {
  Tensor x22 = Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor s2 = scales({1, 1, 2, 2});
  expect_resize(
      attrs({{"mode", Str("linear")}}), x22, nullptr, &s2, nullptr, {1, 1, 4, 4},
      {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0});
  Tensor x24 = Tensor::from<float>({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor s06 = scales({1, 1, 0.6f, 0.6f});
  expect_resize(
      attrs({{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}),
      x24, nullptr, &s06, nullptr, {1, 1, 1, 2}, {1, 3.142857});
  expect_resize(attrs({{"mode", Str("nearest")}}), x24, nullptr, &s06, nullptr, {1, 1, 1, 2},
                {1, 3});
  // opset 11 mode, nearest with sizes.
  Tensor sz = I64v({1, 1, 3, 2});
  expect_resize(attrs({{"mode", Str("nearest")},
                       {"coordinate_transformation_mode", Str("tf_half_pixel_for_nn")}}),
                iota4x4(), nullptr, nullptr, &sz, {1, 1, 3, 2}, {6, 8, 10, 12, 14, 16});
}

// --- values from onnx.reference ---------------------------------------------------------------
TEST(Resize, AntialiasLinearAndCubic) {
  Tensor s = scales({1, 1, 0.6f, 0.6f});
  expect_resize(attrs({{"mode", Str("linear")}, {"antialias", Int(1)}}), iota4x4(), nullptr, &s,
                nullptr, {1, 1, 2, 2}, {2.875, 4.5, 9.375, 11});
  expect_resize(attrs({{"mode", Str("cubic")}, {"antialias", Int(1)}}), iota4x4(), nullptr, &s,
                nullptr, {1, 1, 2, 2}, {2.51807, 4.285886, 9.589335, 11.35715});
  Tensor sz = I64v({1, 1, 3, 2});
  expect_resize(attrs({{"mode", Str("cubic")}, {"antialias", Int(1)}}), iota4x4(), nullptr, nullptr,
                &sz, {1, 1, 3, 2}, {2.110242, 4.129773, 7.490235, 9.509767, 12.87023, 14.88976});
}

TEST(Resize, AxesAndKeepAspectRatio) {
  Tensor sz = I64v({7, 8});
  expect_resize(
      attrs({{"mode", Str("nearest")},
             {"axes", Attribute::Ints({2, 3})},
             {"keep_aspect_ratio_policy", Str("not_larger")}}),
      iota4x4(), nullptr, nullptr, &sz, {1, 1, 7, 7},
      {1, 1, 2, 2, 3, 4,  4,  1,  1,  2,  2,  3,  4,  4,  5,  5,  6,  6,  7,  8,  8,  5,  5,  6, 6,
       7, 8, 8, 9, 9, 10, 10, 11, 12, 12, 13, 13, 14, 14, 15, 16, 16, 13, 13, 14, 14, 15, 16, 16});
  Tensor sz2 = I64v({2, 3});  // negative axes: W -> 2, H -> 3, then not_smaller: scale 0.75
  expect_resize(attrs({{"mode", Str("linear")},
                       {"axes", Attribute::Ints({-1, -2})},
                       {"keep_aspect_ratio_policy", Str("not_smaller")}}),
                iota4x4(), nullptr, nullptr, &sz2, {1, 1, 3, 3},
                {1.833333, 3.166667, 4.5, 7.166667, 8.5, 9.833333, 12.5, 13.83333, 15.16667});
}

TEST(Resize, CoordinateModes) {
  Tensor s = scales({1, 1, 1.3f, 0.7f});
  expect_resize(attrs({{"mode", Str("linear")},
                       {"coordinate_transformation_mode", Str("half_pixel_symmetric")}}),
                iota4x4(), nullptr, &s, nullptr, {1, 1, 5, 2},
                {1.785714, 3.214286, 4.708791, 6.137362, 7.785714, 9.214286, 10.86264, 12.29121,
                 13.78571, 15.21429});
  Tensor sz = I64v({1, 1, 3, 1});
  expect_resize(attrs({{"mode", Str("linear")},
                       {"coordinate_transformation_mode", Str("pytorch_half_pixel")}}),
                iota4x4(), nullptr, nullptr, &sz, {1, 1, 3, 1}, {1.666667, 7, 12.33333});
  Tensor x3 = Tensor::from<float>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor sz3 = I64v({3, 3, 3});
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)  // trilinear align_corners on a linear ramp is the ramp
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 3; ++k) want.push_back(1 + 2.0 * i + 1.0 * j + 0.5 * k);
  expect_resize(
      attrs({{"mode", Str("linear")}, {"coordinate_transformation_mode", Str("align_corners")}}),
      x3, nullptr, nullptr, &sz3, {3, 3, 3}, want);
}

TEST(Resize, TfCropAndResize) {
  Tensor roi = Tensor::from<float>({4}, {0.2f, 0.4f, 1.3f, 0.8f});
  Tensor sz = I64v({3, 3});
  expect_resize(attrs({{"mode", Str("linear")},
                       {"coordinate_transformation_mode", Str("tf_crop_and_resize")},
                       {"axes", Attribute::Ints({3, 2})},
                       {"extrapolation_value", Attribute::Float(-1)}}),
                iota4x4(), &roi, nullptr, &sz, {1, 1, 3, 3},
                {6.4, 8.05, -1, 8.8, 10.45, -1, 11.2, 12.85, -1});
  Tensor roi4 = Tensor::from<float>({8}, {0, 0, 0.4f, 0.6f, 1, 1, 1.2f, 1.7f});
  Tensor sz4 = I64v({1, 1, 3, 3});
  expect_resize(attrs({{"mode", Str("nearest")},
                       {"coordinate_transformation_mode", Str("tf_crop_and_resize")},
                       {"extrapolation_value", Attribute::Float(10)}}),
                iota4x4(), &roi4, nullptr, &sz4, {1, 1, 3, 3}, {7, 10, 10, 11, 10, 10, 10, 10, 10});
  // Without roi the mode cannot work.
  Tensor x = iota4x4();
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, nullptr, &sz4},
                      attrs({{"coordinate_transformation_mode", Str("tf_crop_and_resize")}}))
                   .status.ok());
}

TEST(Resize, CubicExcludeOutside) {
  Tensor s = scales({1, 1, 1.5f, 0.8f});
  expect_resize(
      attrs({{"mode", Str("cubic")},
             {"exclude_outside", Int(1)},
             {"cubic_coeff_a", Attribute::Float(-0.5f)}}),
      iota4x4(), nullptr, &s, nullptr, {1, 1, 6, 3},
      {0.8104685, 2.111843, 3.455678, 2.720684, 4.022059, 5.365894, 5.74029, 7.041664, 8.3855,
       8.406961, 9.708336, 11.05217, 11.42657, 12.72794, 14.07178, 13.33678, 14.63816, 15.98199});
}

TEST(Resize, NearestModes) {
  Tensor s = scales({1, 1, 1.5f, 2.5f});
  expect_resize(attrs({{"mode", Str("nearest")}, {"nearest_mode", Str("round_prefer_ceil")}}),
                iota4x4(), nullptr, &s, nullptr, {1, 1, 6, 10},
                {1,  1,  2,  2,  2,  3,  3,  4,  4,  4,  5,  5,  6,  6,  6,  7,  7,  8,  8,  8,
                 5,  5,  6,  6,  6,  7,  7,  8,  8,  8,  9,  9,  10, 10, 10, 11, 11, 12, 12, 12,
                 13, 13, 14, 14, 14, 15, 15, 16, 16, 16, 13, 13, 14, 14, 14, 15, 15, 16, 16, 16});
  Tensor s2 = scales({1, 1, 0.75f, 1.5f});
  expect_resize(attrs({{"mode", Str("nearest")}, {"nearest_mode", Str("floor")}}), iota4x4(),
                nullptr, &s2, nullptr, {1, 1, 3, 6},
                {1, 1, 2, 2, 3, 4, 5, 5, 6, 6, 7, 8, 9, 9, 10, 10, 11, 12});
  expect_resize(attrs({{"mode", Str("nearest")},
                       {"nearest_mode", Str("ceil")},
                       {"coordinate_transformation_mode", Str("asymmetric")}}),
                iota4x4(), nullptr, &s2, nullptr, {1, 1, 3, 6},
                {1, 2, 3, 3, 4, 4, 9, 10, 11, 11, 12, 12, 13, 14, 15, 15, 16, 16});
}

// --- dtypes, empty tensors, inference ----------------------------------------------------------
TEST(Resize, IntegerDtypes) {
  // Linear on uint8 rounds half to even and saturates; nearest on int64 is exact.
  Tensor x = Tensor::from<uint8_t>({1, 4}, {0, 102, 200, 255});
  Tensor s = scales({1, 2});
  OpRun r = run_op("Resize", {&x, nullptr, &s}, attrs({{"mode", Str("linear")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kUInt8);
  // half_pixel: 0, 25.5, 76.5, 126.5, 175.5, 213.75, 241.25, 255
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{0, 26, 76, 126, 176, 214, 241, 255}));
  Tensor big = Tensor::from<int64_t>({2}, {(int64_t{1} << 60) + 1, -3});
  Tensor s3 = scales({1.5f});
  r = run_op("Resize", {&big, nullptr, &s3}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].data<int64_t>()[0], (int64_t{1} << 60) + 1);
  EXPECT_EQ(r.outputs[0].data<int64_t>()[2], -3);
  for (DataType t : {DataType::kFloat16, DataType::kFloat64, DataType::kInt8}) {
    Tensor xt = iota4x4().cast(t);
    Tensor s2 = scales({1, 1, 2, 2});
    r = run_op("Resize", {&xt, nullptr, &s2}, attrs({{"mode", Str("cubic")}}));
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.outputs[0].dtype(), t);
  }
}

TEST(Resize, EmptyAndInference) {
  Tensor e(DataType::kFloat32, {0, 3, 4});
  Tensor s = scales({1, 2, 0.5f});
  OpRun r = run_op("Resize", {&e, nullptr, &s}, attrs({{"mode", Str("linear")}}), 1,
                   {false, false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 6, 2}));
  expect_inferred_matches(r);
  // Symbolic batch stays symbolic; scaled static dims are computed; non-constant scales -> ?.
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 3, 5, 7}));
  Value* sc = g.add_constant("s", scales({1, 1, 2, 0.5f}));
  Value* dyn = g.add_value("d", TensorType(DataType::kFloat32, {4}));
  Node* n = g.add_node("Resize", "n0", {x, nullptr, sc}, {"y"});
  Node* m = g.add_node("Resize", "n1", {x, nullptr, dyn}, {"z"});
  std::vector<TensorType> out(1);
  InferContext c1(*n, out);
  ASSERT_TRUE(find_op("", "Resize")->infer(c1).ok());
  EXPECT_EQ(out[0].str(), "float32[N,3,10,3]");
  InferContext c2(*m, out);
  ASSERT_TRUE(find_op("", "Resize")->infer(c2).ok());
  EXPECT_EQ(out[0].rank(), 4);
  EXPECT_FALSE((*out[0].dims)[2].is_static());
}

TEST(Resize, Errors) {
  Tensor x = iota4x4();
  Tensor s = scales({1, 1, 2, 2}), s3 = scales({1, 2, 2}), neg = scales({1, 1, -1, 2});
  Tensor sz = I64v({1, 1, 8, 8});
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &s, &sz}, {}).status.ok());  // both
  EXPECT_FALSE(run_op("Resize", {&x}, {}).status.ok());                    // neither
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &s3}, {}).status.ok());      // wrong count
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &neg}, {}).status.ok());
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &s}, attrs({{"mode", Str("area")}})).status.ok());
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &s},
                      attrs({{"coordinate_transformation_mode", Str("corner")}}))
                   .status.ok());
  EXPECT_FALSE(
      run_op("Resize", {&x, nullptr, &s}, attrs({{"axes", Attribute::Ints({2, 2})}})).status.ok());
  Tensor e(DataType::kFloat32, {0, 2});
  Tensor se = I64v({3, 2});
  OpRun r = run_op("Resize", {&e, nullptr, nullptr, &se}, {});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("n0"), std::string::npos);
}

// --- old opsets --------------------------------------------------------------------------------
TEST(Resize, Opset10AndUpsample) {
  Tensor x24 = Tensor::from<float>({1, 1, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor down = scales({1, 1, 0.6f, 0.6f});
  OpRun r =
      import_resize("Resize", {&x24, &down}, attrs({{"mode", Str("nearest")}}), 10, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{1, 3}));  // opset-10 test data
  Tensor x22 = Tensor::from<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor up = scales({1, 1, 2, 3});
  const std::vector<double> repeat = {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2,
                                      3, 3, 3, 4, 4, 4, 3, 3, 3, 4, 4, 4};
  r = import_resize("Resize", {&x22, &up}, attrs({{"mode", Str("nearest")}}), 10, {false, true});
  ASSERT_TRUE(r.status.ok());
  expect_inferred_matches(r);
  EXPECT_EQ(values_d(r.outputs[0]), repeat);
  r = import_resize("Upsample", {&x22, &up}, attrs({{"mode", Str("nearest")}}), 9, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.inferred[0].str(), "float32[1,1,4,6]");
  EXPECT_EQ(values_d(r.outputs[0]), repeat);
  r = import_resize("Upsample", {&x22},
                    attrs({{"mode", Str("nearest")}, {"scales", Attribute::Floats({1, 1, 2, 3})}}),
                    7);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_d(r.outputs[0]), repeat);
  // Linear upsample is asymmetric: [1, 2] x2 -> [1, 1.5, 2, 2].
  Tensor x12 = Tensor::from<float>({1, 2}, {1, 2});
  r = import_resize("Upsample", {&x12},
                    attrs({{"mode", Str("bilinear")}, {"scales", Attribute::Floats({1, 2})}}), 7);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{1, 1.5, 2, 2}));
  EXPECT_FALSE(import_resize("Upsample", {&x12},
                             attrs({{"mode", Str("cubic")}, {"scales", Attribute::Floats({1, 2})}}),
                             7)
                   .status.ok());
}

TEST(Resize, Opset11EmptyRoiAndScales) {
  // Opset 11 models pass empty tensors for unused roi/scales.
  Tensor empty(DataType::kFloat32, {0});
  Tensor sz = I64v({1, 1, 3, 2});
  Tensor x = iota4x4();
  OpRun r = import_resize("Resize", {&x, &empty, &empty, &sz},
                          attrs({{"mode", Str("nearest")},
                                 {"coordinate_transformation_mode", Str("tf_half_pixel_for_nn")}}),
                          11, {false, true, true, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.inferred[0].str(), "float32[1,1,3,2]");
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{6, 8, 10, 12, 14, 16}));
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

TEST(Resize, HugeOrNonFiniteParametersAreErrorsNotCrashes) {
  Tensor x = iota4x4();
  Tensor sz = I64v({1, 1, int64_t{1} << 40, 4});
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, nullptr, &sz}, {}).status.ok());
  Tensor sz0 = I64v({1, 0, int64_t{1} << 40, 4});  // zero elements, but a huge axis plan
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, nullptr, &sz0}, {}).status.ok());
  Tensor s = scales({1, 1, 1e30f, 1});
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &s}, {}).status.ok());
  Tensor nan = scales({1, 1, std::nanf(""), 1});
  EXPECT_FALSE(run_op("Resize", {&x, nullptr, &nan}, {}).status.ok());
  // A NaN roi extrapolates instead of indexing with NaN.
  Tensor roi = Tensor::from<float>({4}, {std::nanf(""), 0, 1, 1});
  Tensor sz2 = I64v({2, 2});
  OpRun r = run_op("Resize", {&x, &roi, nullptr, &sz2},
                   attrs({{"mode", Str("linear")},
                          {"coordinate_transformation_mode", Str("tf_crop_and_resize")},
                          {"axes", Attribute::Ints({2, 3})},
                          {"extrapolation_value", Attribute::Float(-5)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_d(r.outputs[0]), (std::vector<double>{-5, -5, -5, -5}));
}

}  // namespace
}  // namespace kiln::test
