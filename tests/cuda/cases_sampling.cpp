// Sampling family cases: GridSample (every mode, padding and align_corners; 4-D and 5-D; grids
// reaching outside [-1, 1], far outside for reflection; non-finite coordinates; RAFT's many
// small C = 1 maps; a wide map whose threads share a point over several channels) and RoiAlign
// (avg and max, both coordinate modes, sampling_ratio 0 and 2, spatial scales, rois across and
// beyond the map's borders, a huge roi, NHWC), AffineGrid. Odd sizes throughout: C = 1, 3, 33; H, W = 1, 7, 31.
//
// Coordinates (grid values, rois) are drawn on a grid of steps float16 stores exactly, so the
// fp16 modes test the kernels, not the rounding of a coordinate into a neighbouring pixel;
// nearest sampling's ties then fall exactly on half pixels in both float and double, where both
// round half to even. The fp32-only "cont" cases sample continuous coordinates.
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "backend_ops.h"

namespace kiln::gpu::test {

namespace {

using Modes = std::vector<std::string>;
const Modes kFloat = {"fp32", "fp16"};
const Modes k4D = {"fp32", "fp16", "nhwc16"};

Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute S(const std::string& s) { return Attribute::String(s); }
Attribute F(float v) { return Attribute::Float(v); }

// A random float input drawn in [lo, hi] on multiples of `step`.
CaseInput coords(std::vector<int64_t> shape, double lo, double hi, double step) {
  CaseInput c = in(std::move(shape), DataType::kFloat32, lo, hi);
  c.step = step;
  return c;
}

OpCase grid_sample(std::string name, const std::string& mode, const std::string& pad, int ac,
                   std::vector<int64_t> x, std::vector<int64_t> grid, double reach,
                   double step = 1.0 / 64, Modes modes = kFloat) {
  return make_case("gridsample_" + name, "GridSample",
                   attrs({{"mode", S(mode)}, {"padding_mode", S(pad)}, {"align_corners", I(ac)}}),
                   {in(std::move(x)), coords(std::move(grid), -reach, reach, step)},
                   std::move(modes));
}

void add_grid_sample(std::vector<OpCase>& v) {
  const char* kModes[] = {"linear", "nearest", "cubic"};
  const char* kPads[] = {"zeros", "border", "reflection"};
  // (C, H, W, H_out, W_out), cycled over the combinations.
  const int64_t kShapes[][5] = {{1, 7, 31, 5, 9}, {3, 31, 7, 9, 5},  {33, 7, 7, 3, 4},
                                {1, 1, 7, 6, 5},  {3, 31, 31, 7, 7}, {33, 1, 1, 2, 3},
                                {3, 7, 1, 4, 4}};
  int k = 0;
  for (const char* mode : kModes)
    for (const char* pad : kPads)
      for (int ac : {0, 1}) {
        const int64_t* s = kShapes[k++ % 7];
        // Reflection folds coordinates several periods back; the others need only reach past
        // the 3-pixel margin of the taps.
        const double reach = std::string(pad) == "reflection" ? 3.5 : 1.4;
        const std::string name = std::string(mode) + "_" + pad + "_ac" + std::to_string(ac);
        v.push_back(
            grid_sample(name, mode, pad, ac, {2, s[0], s[1], s[2]}, {2, s[3], s[4], 2}, reach));
        if (std::string(mode) != "nearest")  // continuous coordinates (ties are measure zero)
          v.push_back(grid_sample(name + "_cont", mode, pad, ac, {2, s[0], s[1], s[2]},
                                  {2, s[3], s[4], 2}, reach, 0, {"fp32"}));
      }
  // 5-D (volumetric): linear and nearest; (C, D, H, W, D_out, H_out, W_out).
  const int64_t k5[][7] = {{1, 3, 7, 5, 2, 3, 4}, {3, 1, 5, 7, 3, 2, 2}, {33, 4, 1, 3, 2, 2, 3}};
  k = 0;
  for (const char* mode : {"linear", "nearest"})
    for (const char* pad : kPads)
      for (int ac : {0, 1}) {
        const int64_t* s = k5[k++ % 3];
        const double reach = std::string(pad) == "reflection" ? 3.5 : 1.4;
        v.push_back(grid_sample(std::string("5d_") + mode + "_" + pad + "_ac" + std::to_string(ac),
                                mode, pad, ac, {2, s[0], s[1], s[2], s[3]},
                                {2, s[4], s[5], s[6], 3}, reach));
      }
  // A grid in another float type than X (the spec's T2; Deformable DETR samples a float32 map
  // with a float64 grid): the lowering converts it to X's type ahead of the kernel.
  for (const char* mode : {"linear", "nearest"}) {
    CaseInput g64 = in({2, 5, 9, 2}, DataType::kFloat64, -1.4, 1.4);
    g64.step = 1.0 / 64;
    v.push_back(make_case(std::string("gridsample_grid_f64_") + mode, "GridSample",
                          attrs({{"mode", S(mode)}, {"padding_mode", S("zeros")}}),
                          {in({2, 3, 7, 31}), std::move(g64)}, kFloat));
  }
  // RAFT's correlation lookup: a C = 1 map per flow pixel, a 9x9 window of points on each.
  v.push_back(
      grid_sample("raft_lookup", "linear", "zeros", 1, {96, 1, 11, 15}, {96, 9, 9, 2}, 1.3));
  // Enough points x channels that each thread takes several channels of a point.
  v.push_back(
      grid_sample("wide_channels", "linear", "border", 0, {1, 64, 33, 31}, {1, 64, 80, 2}, 1.2));
  v.push_back(grid_sample("wide_channels_cubic", "cubic", "reflection", 1, {1, 33, 7, 31},
                          {1, 96, 96, 2}, 2.0));
  // Non-finite coordinates give NaN; 40 and -60 lie far outside (float16 keeps them finite).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* mode : kModes)
    for (const char* pad : kPads)
      v.push_back(make_case(std::string("gridsample_nonfinite_") + mode + "_" + pad, "GridSample",
                            attrs({{"mode", S(mode)}, {"padding_mode", S(pad)}}),
                            {in({1, 3, 7, 7}), fixed({1, 2, 3, 2}, {nan, 0, inf, 0.5, -inf, 0, 0.5,
                                                                    nan, 0.25, -0.75, 40, -60})},
                            kFloat));
}

OpCase roi_align(std::string name, Attributes a, std::vector<int64_t> x, CaseInput rois,
                 int64_t num_rois) {
  const double last_batch = static_cast<double>(x[0] - 1);
  return make_case(
      "roialign_" + name, "RoiAlign", std::move(a),
      {in(std::move(x)), std::move(rois), in({num_rois}, DataType::kInt64, 0, last_batch)}, k4D);
}

void add_roi_align(std::vector<OpCase>& v) {
  // (N, C, H, W), output (oh, ow) and spatial_scale, cycled over the combinations.
  const int64_t kShapes[][4] = {
      {2, 1, 7, 31}, {2, 3, 31, 7}, {1, 33, 7, 7}, {2, 3, 1, 1}, {3, 1, 31, 31}};
  const int64_t kOut[][2] = {{1, 1}, {7, 7}, {3, 5}, {2, 4}};
  const float kScale[] = {1.f, 0.5f, 0.25f};
  std::mt19937 rng(7);
  int k = 0;
  for (const char* mode : {"avg", "max"})
    for (const char* ctm : {"half_pixel", "output_half_pixel"})
      for (int64_t ratio : {0, 2}) {
        const int64_t* s = kShapes[k % 5];
        const int64_t* o = kOut[k % 4];
        const float scale = kScale[k % 3];
        ++k;
        Attributes a = attrs({{"mode", S(mode)},
                              {"coordinate_transformation_mode", S(ctm)},
                              {"output_height", I(o[0])},
                              {"output_width", I(o[1])},
                              {"sampling_ratio", I(ratio)},
                              {"spatial_scale", F(scale)}});
        // Corners drawn from 3 pixels before the map to 3 after it on each axis (in input
        // coordinates, on eighths): rois across the borders, inverted ones, and ones wholly
        // outside. Drawn here, per axis, as the case's random inputs draw one range for all.
        auto corner = [&](int64_t len) {
          std::uniform_real_distribution<double> u(-3, static_cast<double>(len) + 3);
          return std::round(u(rng) / scale * 8) / 8;
        };
        std::vector<double> rois;
        for (int r = 0; r < 6; ++r)
          for (int64_t len : {s[3], s[2], s[3], s[2]}) rois.push_back(corner(len));  // x1 y1 x2 y2
        const std::string name = std::string(mode) + "_" + ctm + "_r" + std::to_string(ratio);
        v.push_back(roi_align(name, a, {s[0], s[1], s[2], s[3]}, fixed({6, 4}, rois), 6));
      }
  // Rois on the borders of a 7 x 31 map: the whole map, a pixel beyond it, the last pixel, a
  // sliver along each edge, a point, and one 400 times the map (the adaptive grid walks only the
  // samples over the map).
  const std::vector<double> border = {0,  0, 31,   7,    -1,    -1,    32,     8,   30, 6,
                                      31, 7, -0.5, -0.5, 31,    0.25,  30.875, 0,   31, 7,
                                      3,  3, 3,    3,    -4000, -1500, 8000,   1400};
  for (const char* mode : {"avg", "max"})
    for (const char* ctm : {"half_pixel", "output_half_pixel"})
      for (int64_t ratio : {0, 2})
        v.push_back(
            roi_align(std::string("border_") + mode + "_" + ctm + "_r" + std::to_string(ratio),
                      attrs({{"mode", S(mode)},
                             {"coordinate_transformation_mode", S(ctm)},
                             {"output_height", I(3)},
                             {"output_width", I(4)},
                             {"sampling_ratio", I(ratio)}}),
                      {2, 33, 7, 31}, fixed({7, 4}, border), 7));
}

// AffineGrid (gated until these pass on a GPU: KILN_UNVERIFIED_TACTICS=1): 2-D and 3-D, both
// align_corners, axes of one position (align_corners' -1), odd sizes.
void add_affine_grid(std::vector<OpCase>& v) {
  const auto size = [](std::vector<int64_t> s) {
    return konst(Tensor::from<int64_t>({static_cast<int64_t>(s.size())}, s));
  };
  for (int ac : {0, 1}) {
    const std::string a = "_ac" + std::to_string(ac);
    const Attributes at = attrs({{"align_corners", I(ac)}});
    v.push_back(make_case("affine_grid_2d" + a, "AffineGrid", at,
                          {in({3, 2, 3}), size({3, 5, 7, 31})}, kFloat));
    v.push_back(make_case("affine_grid_2d_single" + a, "AffineGrid", at,
                          {in({2, 2, 3}), size({2, 1, 1, 9})}, kFloat));
    v.push_back(make_case("affine_grid_3d" + a, "AffineGrid", at,
                          {in({2, 3, 4}), size({2, 1, 5, 3, 7})}, kFloat));
  }
}

}  // namespace

std::vector<OpCase> sampling_cases() {
  std::vector<OpCase> v;
  add_grid_sample(v);
  add_roi_align(v);
  add_affine_grid(v);
  return v;
}

}  // namespace kiln::gpu::test
