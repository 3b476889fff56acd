// RoiAlign and NonMaxSuppression. Expected values are onnxruntime 1.32's CPU results (pasted as
// literals); tests/models/run_sampling_ops_tests.py compares many more random cases with it.
#include <limits>

#include "op_test_util.h"

namespace kiln::test {
namespace {

// --- RoiAlign
// -------------------------------------------------------------------------------------
Attributes roi(const std::string& mode, int64_t oh, int64_t ow, int64_t ratio,
               const std::string& ctm = "half_pixel", float scale = 1.f) {
  return attrs({{"mode", Str(mode)},
                {"output_height", Int(oh)},
                {"output_width", Int(ow)},
                {"sampling_ratio", Int(ratio)},
                {"coordinate_transformation_mode", Str(ctm)},
                {"spatial_scale", Attribute::Float(scale)}});
}

OpRun roi_align(const Tensor& x, const Tensor& rois, const Tensor& bi, const Attributes& a) {
  return run_op("RoiAlign", {&x, &rois, &bi}, a);
}

Tensor x4x4() {  // 1 .. 16 on a 4 x 4 map
  Tensor t = iota_f({1, 1, 4, 4});
  for (int64_t i = 0; i < 16; ++i) t.data<float>()[i] += 1;
  return t;
}

TEST(RoiAlign, MatchesOnnxRuntime) {
  const Tensor x = x4x4(), b0 = I64v({0});
  const Tensor r = F32({1, 4}, {1, 0.5f, 5, 7});
  OpRun avg = roi_align(x, r, b0, roi("avg", 2, 3, 0, "half_pixel", 0.5f));
  ASSERT_TRUE(avg.status.ok()) << avg.status.message();
  expect_inferred_matches(avg);
  expect_values(avg.outputs[0], {3.5833335, 4.25, 4.916667, 10.083334, 10.75, 11.416666}, 1e-6);
  OpRun mx = roi_align(x, r, b0, roi("max", 2, 3, 2, "half_pixel", 0.5f));
  ASSERT_TRUE(mx.status.ok()) << mx.status.message();
  expect_values(mx.outputs[0], {4.036458, 4.84375, 5.651042, 6.4322915, 6.9270835, 7.4218755},
                1e-6);
  // A roi far larger than the map: adaptive sampling visits only the samples on the map.
  OpRun big = roi_align(x, F32({1, 4}, {-100, -50, 300, 200}), b0, roi("avg", 2, 2, 0));
  ASSERT_TRUE(big.status.ok()) << big.status.message();
  expect_values(big.outputs[0], {0.01224, 0, 0, 0}, 1e-5, 1e-7);
  // An inverted roi in half_pixel mode has no samples.
  OpRun inv = roi_align(x, F32({1, 4}, {3, 3, 1, 1}), b0, roi("max", 2, 2, 0));
  ASSERT_TRUE(inv.status.ok()) << inv.status.message();
  expect_values(inv.outputs[0], {0, 0, 0, 0}, 0, 0);
}

TEST(RoiAlign, MaxModeIsOnnxRuntimes) {
  // One sample at (1.5, 1.5) between 6, 7, 10 and 11, each weighted 1/4: onnxruntime's max mode
  // takes the largest weighted neighbour, 2.75 (the spec's text would give the interpolated 8.5).
  OpRun r = roi_align(x4x4(), F32({1, 4}, {1, 1, 2, 2}), I64v({0}),
                      roi("max", 1, 1, 1, "output_half_pixel"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {2.75}, 0, 1e-6);
}

TEST(RoiAlign, Opset10IsOutputHalfPixel) {
  const Tensor x = x4x4(), r = F32({1, 4}, {0.3f, 1, 2, 2.7f}), b0 = I64v({0});
  const Attributes a =
      attrs({{"output_height", Int(2)}, {"output_width", Int(2)}, {"sampling_ratio", Int(2)}});
  OpRun r10 = run_imported("RoiAlign", {&x, &r, &b0}, a, 10);
  ASSERT_TRUE(r10.status.ok()) << r10.status.message();
  expect_values(r10.outputs[0], {7.4249997, 8.275, 10.825001, 11.675001}, 1e-6);
  // Opset 16's default is half_pixel: a different result.
  OpRun r16 = run_imported("RoiAlign", {&x, &r, &b0}, a, 16);
  ASSERT_TRUE(r16.status.ok()) << r16.status.message();
  EXPECT_GT(std::fabs(r16.outputs[0].at_double(0) - 7.4249997), 0.1);
}

TEST(RoiAlign, BatchesChannelsAndFloat64) {
  const Tensor x = random_tensor({3, 5, 6, 7});
  const Tensor r = F32({4, 4}, {0, 0, 6, 5, 1.5f, 2, 4, 7, -2, -1, 3, 2, 5, 4, 9, 9});
  const Tensor bi = I64v({2, 0, 1, 2});
  OpRun r32 = roi_align(x, r, bi, roi("avg", 3, 2, 0));
  ASSERT_TRUE(r32.status.ok()) << r32.status.message();
  ASSERT_EQ(r32.outputs[0].shape(), (std::vector<int64_t>{4, 5, 3, 2}));
  // The float64 mode computes the same samples in double.
  const Tensor x64 = x.cast(DataType::kFloat64), r64 = r.cast(DataType::kFloat64);
  OpRun d = roi_align(x64, r64, bi, roi("avg", 3, 2, 0));
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  EXPECT_EQ(d.outputs[0].dtype(), DataType::kFloat64);
  expect_values(d.outputs[0], values_d(r32.outputs[0]), 1e-5, 1e-6);
  // The same roi on another image gives that image's values.
  OpRun one = roi_align(x, F32({1, 4}, {0, 0, 6, 5}), I64v({2}), roi("avg", 3, 2, 0));
  ASSERT_TRUE(one.status.ok());
  const std::vector<double> all = values_d(r32.outputs[0]);
  expect_values(one.outputs[0], std::vector<double>(all.begin(), all.begin() + 30), 0, 0);
}

TEST(RoiAlign, InfersShapes) {
  auto t = infer(
      "RoiAlign",
      {TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(256), Dim::sym("H"), Dim::sym("W")}),
       TensorType(DataType::kFloat32, {Dim::sym("R"), Dim(4)}),
       TensorType(DataType::kInt64, {Dim::sym("R")})},
      attrs({{"output_height", Int(7)}, {"output_width", Int(5)}}));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].str(), "float32[R,256,7,5]");
}

TEST(RoiAlign, RefusesBadInput) {
  const Tensor x = x4x4(), r = F32({1, 4}, {0, 0, 2, 2});
  expect_error(roi_align(x, r, I64v({1}), {}), "batch_indices[0] = 1 is out of range");
  expect_error(roi_align(x, r, I64v({-1}), {}), "out of range");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_error(roi_align(x, F32({1, 4}, {0, nan, 2, 2}), I64v({0}), {}), "not finite");
  expect_error(
      roi_align(x, F32({1, 4}, {0, 0, 3e38f, 2}), I64v({0}), roi("avg", 1, 1, 0, "half_pixel", 10)),
      "not finite");
  expect_error(roi_align(x, F32({1, 5}, {0, 0, 2, 2, 0}), I64v({0}), {}),
               "rois must be [num_rois, 4]");
  expect_error(roi_align(x, F32({2, 4}, {0, 0, 2, 2, 0, 0, 2, 2}), I64v({0}), {}), "2 rois but 1");
  expect_error(roi_align(x, r, Tensor::from<int32_t>({1}, {0}), {}), "batch_indices must be int64");
  expect_error(roi_align(x, r, I64v({0}), roi("sum", 1, 1, 0)), "mode must be avg or max");
  expect_error(roi_align(x, r, I64v({0}), roi("avg", 0, 1, 0)), "output_height");
  expect_error(roi_align(x, r, I64v({0}), roi("avg", 1, 1, -1)), "sampling_ratio");
  expect_error(roi_align(x, r, I64v({0}), roi("avg", 1, 1, 5000)), "sampling_ratio");
  expect_error(roi_align(x, r, I64v({0}), roi("avg", 1, 1, 0, "asymmetric")),
               "coordinate_transformation_mode");
  const Tensor x3 = random_tensor({1, 4, 4});
  expect_error(roi_align(x3, r, I64v({0}), {}), "X must be 4-D");
}

// --- NonMaxSuppression
// -----------------------------------------------------------------------------
struct Nms {
  Tensor boxes = F32({1, 6, 4}, {0, 0,  1, 1,  0, 0.1f,  1, 1.1f,  0, -0.1f, 1, 0.9f,
                                 0, 10, 1, 11, 0, 10.1f, 1, 11.1f, 0, 100,   1, 101});
  Tensor scores = F32({1, 1, 6}, {0.9f, 0.75f, 0.6f, 0.95f, 0.5f, 0.3f});
  Tensor max_out = I64v({3});
  Tensor iou = F32({1}, {0.5f});
  Tensor score_th = F32({1}, {0.f});
  OpRun run(size_t inputs = 5, const Attributes& a = {}) const {
    std::vector<const Tensor*> in = {&boxes, &scores, &max_out, &iou, &score_th};
    in.resize(inputs);
    OpRun r = run_op("NonMaxSuppression", in, a);
    if (r.status.ok()) expect_inferred_matches(r);
    return r;
  }
};

void expect_selected(const OpRun& r, const std::vector<int64_t>& want) {
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  ASSERT_EQ(r.outputs[0].dtype(), DataType::kInt64);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{static_cast<int64_t>(want.size()) / 3, 3}));
  EXPECT_EQ(values_i64(r.outputs[0]), want);
}

TEST(NonMaxSuppression, MatchesOnnxRuntime) {
  Nms n;
  expect_selected(n.run(), {0, 0, 3, 0, 0, 0, 0, 0, 5});
  n.max_out = I64v({10});
  expect_selected(n.run(), {0, 0, 3, 0, 0, 0, 0, 0, 5});  // 1, 2, 4 overlap a kept box
  n.score_th = F32({1}, {0.6f});                          // strictly greater: box 2 (0.6) is out
  expect_selected(n.run(), {0, 0, 3, 0, 0, 0});
  n.max_out = Tensor::scalar<int64_t>(2);  // a scalar works as well as [1]
  n.score_th = F32({1}, {0.f});
  expect_selected(n.run(), {0, 0, 3, 0, 0, 0});
}

TEST(NonMaxSuppression, CenterPointBoxes) {
  Nms n;
  // The same boxes as [x_center, y_center, width, height].
  n.boxes = F32({1, 6, 4}, {0.5f,  0.5f, 1, 1, 0.6f,  0.5f, 1, 1, 0.4f,   0.5f, 1, 1,
                            10.5f, 0.5f, 1, 1, 10.6f, 0.5f, 1, 1, 100.5f, 0.5f, 1, 1});
  n.max_out = I64v({10});
  expect_selected(n.run(5, attrs({{"center_point_box", Int(1)}})), {0, 0, 3, 0, 0, 0, 0, 0, 5});
}

TEST(NonMaxSuppression, TiesGoByIndex) {
  Nms n;
  n.scores = F32({1, 1, 6}, {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f});
  n.max_out = I64v({10});
  expect_selected(n.run(), {0, 0, 0, 0, 0, 3, 0, 0, 5});
}

TEST(NonMaxSuppression, BatchesAndClasses) {
  Nms n;
  n.boxes = F32({2, 2, 4}, {0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 5, 5, 6, 6});
  n.scores = F32({2, 2, 2}, {0.1f, 0.2f, 0.4f, 0.3f, 0.9f, 0.8f, 0.7f, 0.6f});
  n.max_out = I64v({5});
  expect_selected(n.run(), {0, 0, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 1, 1, 1});
}

TEST(NonMaxSuppression, EdgeCasesAsOnnxRuntime) {
  Nms n;
  expect_selected(n.run(2), {});  // no max_output_boxes_per_class: nothing selected
  n.max_out = I64v({-3});
  expect_selected(n.run(), {});
  n.max_out = I64v({10});
  // A NaN score is never selected (onnxruntime drops it with or without a threshold).
  n.scores.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  expect_selected(n.run(), {0, 0, 0, 0, 0, 4, 0, 0, 5});
  expect_selected(n.run(4), {0, 0, 0, 0, 0, 4, 0, 0, 5});
  // A NaN coordinate: the box neither suppresses nor is suppressed.
  Nms m;
  m.max_out = I64v({10});
  m.boxes.data<float>()[3 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();
  expect_selected(m.run(), {0, 0, 3, 0, 0, 0, 0, 0, 4, 0, 0, 5});
  // No boxes at all.
  Nms e;
  e.boxes = Tensor(DataType::kFloat32, {1, 0, 4});
  e.scores = Tensor(DataType::kFloat32, {1, 1, 0});
  expect_selected(e.run(), {});
}

TEST(NonMaxSuppression, RefusesBadInput) {
  Nms n;
  n.iou = F32({1}, {1.5f});
  expect_error(n.run(), "iou_threshold must be in [0, 1]");
  n.iou = F32({1}, {std::numeric_limits<float>::quiet_NaN()});
  expect_error(n.run(), "iou_threshold");
  Nms b;
  b.boxes = F32({6, 4}, std::vector<float>(24, 0.f));
  expect_error(b.run(), "boxes must be [batches, boxes, 4]");
  b.boxes = F32({1, 6, 5}, std::vector<float>(30, 0.f));
  expect_error(b.run(), "boxes must be [batches, boxes, 4]");
  Nms s;
  s.scores = F32({2, 1, 6}, std::vector<float>(12, 0.5f));
  expect_error(s.run(), "scores must be [batches, classes, boxes]");
  Nms m;
  m.max_out = Tensor::from<int32_t>({1}, {3});
  expect_error(m.run(), "max_output_boxes_per_class must be int64");
  expect_error(Nms().run(5, attrs({{"center_point_box", Int(2)}})), "center_point_box");
}

TEST(NonMaxSuppression, InfersADataDependentCount) {
  auto t = infer("NonMaxSuppression",
                 {TensorType(DataType::kFloat32, {Dim::sym("B"), Dim::sym("N"), Dim(4)}),
                  TensorType(DataType::kFloat32, {Dim::sym("B"), Dim(80), Dim::sym("N")})},
                 {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].str(), "int64[?,3]");
}

}  // namespace
}  // namespace kiln::test
