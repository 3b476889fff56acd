// col2im_to_conv_transpose: Col2Im (torch's F.fold) as a grouped ConvTranspose with one-hot
// kernels agrees with the CPU op: blocks apart (MobileViT-v2's patches), overlapping, padded,
// dilated, and with rows past the last block.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* col2im(G& b, Value* x, std::vector<int64_t> image, std::vector<int64_t> block,
              std::vector<int64_t> strides, std::vector<int64_t> dilations,
              std::vector<int64_t> pads) {
  return b.op("Col2Im", {x, b.c(ints(image)), b.c(ints(block))},
              attrs({{"strides", Attribute::Ints(strides)},
                     {"dilations", Attribute::Ints(dilations)},
                     {"pads", Attribute::Ints(pads)}}));
}

TEST(Col2ImToConvTranspose, EveryFoldBecomesAConvTranspose) {
  G b;
  b.out(col2im(b, b.in("patches", {2, 3 * 4, 9}), {6, 6}, {2, 2}, {2, 2}, {1, 1}, {0, 0, 0, 0}));
  b.out(col2im(b, b.in("overlap", {1, 2 * 9, 16}), {6, 6}, {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}));
  b.out(col2im(b, b.in("padded", {1, 2 * 4, 12}), {5, 5}, {2, 2}, {2, 2}, {1, 1}, {1, 1, 2, 1}));
  b.out(col2im(b, b.in("dilated", {1, 1 * 4, 9}), {7, 7}, {2, 2}, {2, 2}, {2, 2}, {0, 0, 0, 0}));
  b.out(col2im(b, b.in("tail", {1, 2 * 4, 6}), {6, 7}, {2, 2}, {3, 2}, {1, 1}, {0, 0, 0, 0}));
  auto opt = optimize_checked(b.g, {"col2im_to_conv_transpose"}, 1e-6);
  EXPECT_EQ(count(*opt, "Col2Im"), 0);
  EXPECT_EQ(count(*opt, "ConvTranspose"), 5);
}

TEST(Col2ImToConvTranspose, OtherFoldsStay) {
  G b;
  b.out(col2im(b, b.in("three_d", {1, 8, 8}), {4, 4, 4}, {2, 2, 2}, {2, 2, 2}, {1, 1, 1},
               {0, 0, 0, 0, 0, 0}));
  bool changed = false;
  auto notes =
      pass_notes(b.g, "col2im_to_conv_transpose", passes::col2im_to_conv_transpose, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "two spatial axes")) << dump_notes(notes);
}

}  // namespace
}  // namespace kiln::test
