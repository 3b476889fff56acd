// deform_conv_to_grid_sample: a DeformConv as GridSample over its taps and a 1x1 convolution
// agrees with the CPU op (a direct bilinear sum): offsets reaching past the image (zeros), DCNv2's
// mask, bias, groups and offset groups, strides, pads and dilations, a 1-pixel-high image.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// DeformConv over x [n, c, h, w] with a kernel kh x kw: offsets 3 * (an input in [-1, 1]) so
// that taps fall outside the image too, and a sigmoid mask when `masked`.
Value* deform(G& b, const std::string& name, std::vector<int64_t> x, int64_t oc, int64_t group,
              int64_t og, std::vector<int64_t> k, std::vector<int64_t> strides,
              std::vector<int64_t> pads, std::vector<int64_t> dilations, bool masked, bool bias) {
  const int64_t oh = (x[2] + pads[0] + pads[2] - dilations[0] * (k[0] - 1) - 1) / strides[0] + 1;
  const int64_t ow = (x[3] + pads[1] + pads[3] - dilations[1] * (k[1] - 1) - 1) / strides[1] + 1;
  Value* xv = b.in(name + "_x", x);
  Value* off = b.op("Mul", {b.in(name + "_off", {x[0], og * k[0] * k[1] * 2, oh, ow}), b.cf(3.f)});
  Value* w = b.c(rand_t({oc, x[1] / group, k[0], k[1]}, -0.5f, 0.5f));
  std::vector<Value*> ins = {xv, w, off};
  ins.push_back(bias ? b.c(rand_t({oc})) : nullptr);
  if (masked)
    ins.push_back(b.op("Sigmoid", {b.in(name + "_mask", {x[0], og * k[0] * k[1], oh, ow})}));
  return b.op("DeformConv", ins,
              attrs({{"group", Attribute::Int(group)},
                     {"offset_group", Attribute::Int(og)},
                     {"strides", Attribute::Ints(strides)},
                     {"pads", Attribute::Ints(pads)},
                     {"dilations", Attribute::Ints(dilations)}}));
}

TEST(DeformConvToGridSample, EveryFormAgreesWithTheOp) {
  G b;
  b.out(deform(b, "plain", {2, 3, 7, 9}, 4, 1, 1, {3, 3}, {1, 1}, {1, 1, 1, 1}, {1, 1}, false,
               false));
  b.out(deform(b, "dcn2", {1, 4, 8, 6}, 6, 2, 2, {3, 3}, {2, 1}, {1, 0, 1, 0}, {1, 2}, true, true));
  b.out(
      deform(b, "wide", {1, 6, 5, 11}, 3, 3, 3, {2, 3}, {1, 2}, {0, 2, 1, 2}, {2, 1}, true, false));
  b.out(deform(b, "one_row", {1, 2, 1, 6}, 2, 1, 1, {1, 3}, {1, 1}, {0, 1, 0, 1}, {1, 1}, false,
               true));
  auto opt = optimize_checked(b.g, {"deform_conv_to_grid_sample"}, 1e-5);
  EXPECT_EQ(count(*opt, "DeformConv"), 0);
  EXPECT_EQ(count(*opt, "GridSample"), 4);
  EXPECT_EQ(count(*opt, "Conv"), 4);
}

TEST(DeformConvToGridSample, UnknownSizesStay) {
  G b;
  Value* x =
      b.g.add_value("x", TensorType(DataType::kFloat32, {1, 2, Dim::sym("H"), Dim::sym("W")}));
  b.g.add_input(x);
  Value* off =
      b.g.add_value("off", TensorType(DataType::kFloat32, {1, 18, Dim::sym("H"), Dim::sym("W")}));
  b.g.add_input(off);
  Value* w = b.c(rand_t({2, 2, 3, 3}));
  b.out(b.op("DeformConv", {x, w, off}, attrs({{"pads", Attribute::Ints({1, 1, 1, 1})}})));
  bool changed = false;
  auto notes =
      pass_notes(b.g, "deform_conv_to_grid_sample", passes::deform_conv_to_grid_sample, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "not all static")) << dump_notes(notes);
}

}  // namespace
}  // namespace kiln::test
