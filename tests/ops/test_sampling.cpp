// GridSample and AffineGrid. Expected values are onnxruntime 1.32's CPU results (pasted as literals), or follow
// from the definition (identity grids). tests/models/run_sampling_ops_tests.py compares many more
// random cases with onnxruntime.
#include <limits>

#include "op_test_util.h"

namespace kiln::test {
namespace {

Attributes gs(const std::string& mode, const std::string& pad, int64_t align = 0) {
  return attrs({{"mode", Str(mode)}, {"padding_mode", Str(pad)}, {"align_corners", Int(align)}});
}

OpRun grid_sample(const Tensor& x, const Tensor& grid, const Attributes& a) {
  return run_op("GridSample", {&x, &grid}, a);
}

TEST(GridSample, IdentityGridReproducesTheInput) {
  // With align_corners, -1 and 1 are the edge pixels' centres: a grid of the pixel centres
  // returns X in every mode and padding.
  const Tensor x = random_tensor({2, 3, 4, 5});
  Tensor grid(DataType::kFloat32, {2, 4, 5, 2});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        grid.data<float>()[((b * 4 + i) * 5 + j) * 2] = -1 + 2 * j / 4.f;
        grid.data<float>()[((b * 4 + i) * 5 + j) * 2 + 1] = -1 + 2 * i / 3.f;
      }
  for (const char* mode : {"linear", "nearest", "cubic"})
    for (const char* pad : {"zeros", "border", "reflection"}) {
      SCOPED_TRACE(std::string(mode) + " " + pad);
      OpRun r = grid_sample(x, grid, gs(mode, pad, 1));
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      expect_inferred_matches(r);
      expect_values(r.outputs[0], values_d(x), 1e-5, 1e-5);
    }
}

TEST(GridSample, MatchesOnnxRuntime) {
  // A 1 x 3 image: reflection in both corner conventions, every mode.
  const Tensor x = F32({1, 1, 1, 3}, {1, 2, 3});
  const Tensor g = F32({1, 1, 2, 2}, {0.3f, 0.2f, -1.5f, 2.5f});
  const struct {
    const char* mode;
    int64_t align;
    std::vector<double> want;
  } cases[] = {{"linear", 0, {2.4499998, 1.25}}, {"cubic", 0, {2.5459077, 1.1914062}},
               {"nearest", 0, {2, 1}},           {"linear", 1, {2.3, 1.5}},
               {"cubic", 1, {2.4365, 1.3125}},   {"nearest", 1, {2, 1}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.mode) + " align " + std::to_string(c.align));
    OpRun r = grid_sample(x, g, gs(c.mode, "reflection", c.align));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_values(r.outputs[0], c.want, 1e-6, 1e-6);
  }
  // Bicubic: padding applies to each tap (onnxruntime and PyTorch); for border this differs from
  // the ONNX reference implementation, which clamps the coordinate first.
  const Tensor x34 = iota_f({1, 1, 3, 4});
  const Tensor g3 = F32({1, 1, 3, 2}, {-1.3f, 0.4f, 1.2f, -1.1f, 0.3f, 0.3f});
  const std::pair<const char*, std::vector<double>> cubic[] = {
      {"zeros", {-0.46169823, 0.06456199, 9.241803}},
      {"border", {6.7359977, 2.767876, 8.326377}},
      {"reflection", {6.811248, 2.3850021, 8.326377}}};
  for (const auto& [pad, want] : cubic) {
    SCOPED_TRACE(pad);
    OpRun r = grid_sample(x34, g3, gs("cubic", pad));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_values(r.outputs[0], want, 1e-5, 1e-5);
  }
}

TEST(GridSample, NearestRoundsHalfToEven) {
  // x = k + 0.5 exactly for k = -1..7 on an 8-pixel row: 0 (zero padding), 0, 2, 2, 4, ...
  const Tensor x = iota_f({1, 1, 1, 8});
  Tensor g(DataType::kFloat32, {1, 1, 9, 2});
  for (int k = -1; k < 8; ++k) {
    g.data<float>()[(k + 1) * 2] = (2.f * k + 2) / 8 - 1;
    g.data<float>()[(k + 1) * 2 + 1] = 0;
  }
  OpRun r = grid_sample(x, g, gs("nearest", "zeros"));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {0, 0, 2, 2, 4, 4, 6, 6, 0}, 0, 0);
}

TEST(GridSample, Volumetric) {
  const Tensor x = iota_f({1, 1, 2, 3, 4});
  const Tensor g = F32({1, 1, 1, 2, 3}, {1.3f, -1.6f, 0.5f, 0.9f, 0.2f, -0.7f});
  const std::tuple<const char*, const char*, std::vector<double>> cases[] = {
      {"linear", "zeros", {0, 4.5920005}},
      {"linear", "border", {15, 8.200001}},
      {"linear", "reflection", {16.5, 8.200001}},
      {"nearest", "zeros", {0, 7}},
      {"nearest", "border", {15, 7}},
      {"nearest", "reflection", {15, 7}}};
  for (const auto& [mode, pad, want] : cases) {
    SCOPED_TRACE(std::string(mode) + " " + pad);
    OpRun r = grid_sample(x, g, gs(mode, pad));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 1, 1, 2}));
    expect_values(r.outputs[0], want, 1e-5, 1e-5);
  }
}

TEST(GridSample, FarAndNonFiniteCoordinates) {
  const Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // Far outside: zeros gives 0, border the edge pixels, reflection folds the coordinate back by
  // whole periods (onnxruntime's values). NaN and infinite coordinates give NaN (onnxruntime
  // converts them to integers, which is undefined behaviour).
  const Tensor g = F32({1, 1, 4, 2}, {1e6f, 1e6f, -1e7f, 0.5f, std::nanf(""), 0, inf, 0});
  const std::pair<const char*, std::vector<double>> cases[] = {{"zeros", {0, 0, nan, nan}},
                                                               {"border", {4, 3, nan, nan}},
                                                               {"reflection", {2.5, 3, nan, nan}}};
  for (const char* mode : {"linear", "cubic"})
    for (const auto& [pad, want] : cases) {
      SCOPED_TRACE(std::string(mode) + " " + pad);
      OpRun r = grid_sample(x, g, gs(mode, pad));
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      expect_values(r.outputs[0], want, 1e-6, 1e-6);
    }
}

TEST(GridSample, Float64AndFloat16) {
  const Tensor x = random_tensor({1, 2, 5, 6});
  const Tensor g = random_tensor({1, 3, 4, 2}, -1.2f, 1.2f);
  OpRun r32 = grid_sample(x, g, gs("cubic", "border"));
  ASSERT_TRUE(r32.status.ok()) << r32.status.message();
  for (DataType t : {DataType::kFloat64, DataType::kFloat16}) {
    const Tensor xt = x.cast(t), gt = g.cast(DataType::kFloat32);
    OpRun r = grid_sample(xt, gt, gs("cubic", "border"));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    expect_values(r.outputs[0], values_d(r32.outputs[0]), 0, t == DataType::kFloat16 ? 1e-2 : 1e-5);
  }
}

TEST(GridSample, Opset16ModeNamesAreUpgraded) {
  const Tensor x = random_tensor({1, 1, 3, 3});
  const Tensor g = random_tensor({1, 2, 2, 2});
  for (const auto& [old_name, canon] :
       {std::pair{"bilinear", "linear"}, {"bicubic", "cubic"}, {"nearest", "nearest"}}) {
    OpRun old_form = run_imported("GridSample", {&x, &g}, attrs({{"mode", Str(old_name)}}), 16);
    ASSERT_TRUE(old_form.status.ok()) << old_form.status.message();
    OpRun new_form = grid_sample(x, g, attrs({{"mode", Str(canon)}}));
    ASSERT_TRUE(new_form.status.ok());
    expect_values(old_form.outputs[0], values_d(new_form.outputs[0]), 0, 0);
  }
  // Opset 16's default mode is bilinear.
  OpRun def = run_imported("GridSample", {&x, &g}, {}, 16);
  ASSERT_TRUE(def.status.ok()) << def.status.message();
  expect_error(run_imported("GridSample", {&x, &g}, attrs({{"mode", Str("linear")}}), 16),
               "bilinear, nearest or bicubic");
  expect_error(run_imported("GridSample", {&x, &g}, attrs({{"mode", Str("bilinear")}}), 20),
               "linear, nearest or cubic");
}

TEST(GridSample, InfersSymbolicShapes) {
  auto t = infer("GridSample",
                 {TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(3), Dim(8), Dim(8)}),
                  TensorType(DataType::kFloat32, {Dim::sym("N"), Dim::sym("H"), Dim(5), Dim(2)})},
                 {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].str(), "float32[N,3,H,5]");
}

TEST(GridSample, RefusesBadInput) {
  const Tensor x = random_tensor({1, 2, 3, 3});
  const Tensor g3 = random_tensor({1, 2, 2, 3});
  expect_error(grid_sample(x, g3, {}), "grid must be [N, D1..D2, 2]");
  const Tensor g5 = random_tensor({1, 2, 2, 2, 2});
  expect_error(grid_sample(x, g5, {}), "grid must be");
  const Tensor gb = random_tensor({2, 2, 2, 2});
  expect_error(grid_sample(x, gb, {}), "batch");
  const Tensor x5 = random_tensor({1, 2, 3, 3, 3});
  const Tensor g53 = random_tensor({1, 2, 2, 2, 3});
  expect_error(grid_sample(x5, g53, gs("cubic", "zeros")), "cubic mode takes 4-D X only");
  const Tensor g = random_tensor({1, 2, 2, 2});
  expect_error(grid_sample(x, g, gs("area", "zeros")), "mode must be");
  expect_error(grid_sample(x, g, gs("linear", "wrap")), "padding_mode");
  expect_error(grid_sample(x, g, gs("linear", "zeros", 2)), "align_corners");
  const Tensor xi = Tensor(DataType::kInt32, {1, 2, 3, 3});
  expect_error(grid_sample(xi, g, {}), "X must be a float tensor");
  const Tensor empty = random_tensor({1, 2, 0, 3});
  expect_error(grid_sample(empty, g, {}), "nothing to sample from");
}

// AffineGrid: the identity theta gives the base coordinates (pixel centres, or corners with
// align_corners; -1 on an axis of one position), x before y; a 3-D theta rotates x into y.
TEST(AffineGrid, BaseCoordinatesAndThetas) {
  const Tensor id = Tensor::from<float>({1, 2, 3}, {1, 0, 0, 0, 1, 0});
  const Tensor size = Tensor::from<int64_t>({4}, {1, 3, 2, 4});
  OpRun r = run_op("AffineGrid", {&id, &size}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 2, 4, 2}));
  // x at (2j + 1) / 4 - 1, y at (2i + 1) / 2 - 1.
  expect_values(r.outputs[0], {-.75, -.5, -.25, -.5, .25, -.5, .75, -.5,
                               -.75, .5, -.25, .5, .25, .5, .75, .5}, 1e-7, 1e-7);
  r = run_op("AffineGrid", {&id, &size}, attrs({{"align_corners", Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {-1, -1, -1. / 3, -1, 1. / 3, -1, 1, -1,
                               -1, 1, -1. / 3, 1, 1. / 3, 1, 1, 1}, 1e-6, 1e-6);
  const Tensor one = Tensor::from<int64_t>({4}, {1, 3, 1, 1});
  r = run_op("AffineGrid", {&id, &one}, attrs({{"align_corners", Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {-1, -1}, 0, 0);
  // 3-D: theta's rows give (y, x, z + 0.5): the grid holds the base's (y, x, z + 0.5).
  const Tensor t3 = Tensor::from<float>({1, 3, 4}, {0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, .5f});
  const Tensor s3 = Tensor::from<int64_t>({5}, {1, 1, 1, 1, 2});
  r = run_op("AffineGrid", {&t3, &s3}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 1, 1, 2, 3}));
  expect_values(r.outputs[0], {0, -.5, .5, 0, .5, .5}, 1e-7, 1e-7);
  expect_inferred_matches(r);
}

TEST(AffineGrid, RefusesBadInput) {
  const Tensor theta = random_tensor({2, 2, 3});
  const Tensor size = Tensor::from<int64_t>({4}, {2, 1, 3, 3});
  const Tensor wide = random_tensor({2, 2, 4});
  expect_error(run_op("AffineGrid", {&wide, &size}, {}), "theta must be [N, 2, 3] or [N, 3, 4]");
  const Tensor five = Tensor::from<int64_t>({5}, {2, 1, 3, 3, 3});
  expect_error(run_op("AffineGrid", {&theta, &five}, {}), "does not fit");
  const Tensor batch = Tensor::from<int64_t>({4}, {3, 1, 3, 3});
  expect_error(run_op("AffineGrid", {&theta, &batch}, {}), "batch");
  const Tensor neg = Tensor::from<int64_t>({4}, {2, 1, -3, 3});
  expect_error(run_op("AffineGrid", {&theta, &neg}, {}), "negative");
  expect_error(run_op("AffineGrid", {&theta, &size}, attrs({{"align_corners", Int(2)}})),
               "align_corners");
}

}  // namespace
}  // namespace kiln::test
