// fold_pad_into_conv: a zero Pad in front of convolutions (TensorFlow's SAME padding, asymmetric
// on strided layers) becomes the convolutions' pads; the CPU reference gives the same outputs.

#include "pass_test_util.h"

namespace kiln::test {
namespace {

// x [2, 8, 12, 10] -> Pad(pads, value) -> Conv(k x k, stride s, conv_pads, group) -> y.
struct PadConv {
  std::vector<int64_t> pads = {0, 0, 0, 0, 0, 0, 1, 1};
  float value = 0.f;
  std::string mode = "constant";
  std::vector<int64_t> conv_pads;
  int64_t group = 8, k = 3, s = 2;
  bool axes = false;          // opset 18's axes input [2, 3], pads given for those axes only
  bool other_reader = false;  // the padded tensor is also a graph output through a Relu
};

std::unique_ptr<Graph> pad_conv(const PadConv& p) {
  G b;
  Value* x = b.in("x", {2, 8, 12, 10});
  std::vector<Value*> pin = {x, b.c(ints(p.pads)), b.cf(p.value)};
  if (p.axes) pin.push_back(b.c(ints({2, 3})));
  Value* xp = b.op("Pad", pin, attrs({{"mode", Attribute::String(p.mode)}}));
  Attributes a = attrs({{"group", Attribute::Int(p.group)},
                        {"strides", Attribute::Ints({p.s, p.s})}});
  if (!p.conv_pads.empty()) a.set("pads", Attribute::Ints(p.conv_pads));
  b.out(b.op("Conv", {xp, b.c(rand_t({8, 8 / p.group, p.k, p.k})), b.c(rand_t({8}))}, a));
  if (p.other_reader) b.out(b.op("Relu", {xp}));
  return b.g.clone();
}

TEST(FoldPadIntoConv, TensorFlowSamePaddingBecomesTheConvolutionsPads) {
  const auto g = pad_conv({});
  auto opt = optimize_checked(*g, {"fold_pad_into_conv", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Pad"), 0);
  const Node* conv = find_op(*opt, "Conv");
  ASSERT_TRUE(conv);
  EXPECT_EQ(conv->attrs.get_ints("pads"), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(conv->input(0), opt->inputs()[0]);
  expect_same_outputs(*g, *opt);
}

TEST(FoldPadIntoConv, AddsToTheConvolutionsOwnPadsAndReadsAxes) {
  PadConv p;
  p.pads = {2, 0, 1, 3};  // axes 2 and 3: begin (2, 0), end (1, 3)
  p.axes = true;
  p.conv_pads = {1, 1, 1, 1};
  p.group = 1;
  p.s = 1;
  const auto g = pad_conv(p);
  auto opt = optimize_checked(*g, {"fold_pad_into_conv", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Pad"), 0);
  EXPECT_EQ(find_op(*opt, "Conv")->attrs.get_ints("pads"), (std::vector<int64_t>{3, 1, 2, 4}));
  expect_same_outputs(*g, *opt);
}

TEST(FoldPadIntoConv, LeavesPadsAConvolutionCannotTake) {
  auto kept = [](const PadConv& p, const std::string& why) {
    auto g = pad_conv(p);
    bool changed = true;
    const auto notes = pass_notes(*g, "fold_pad_into_conv", passes::fold_pad_into_conv, &changed);
    EXPECT_FALSE(changed) << why;
    EXPECT_TRUE(has_note(notes, why)) << dump_notes(notes);
  };
  PadConv p;
  p.value = 1.f;
  kept(p, "the pad value is not zero");
  p = {};
  p.mode = "reflect";
  kept(p, "not a constant pad");
  p = {};
  p.pads = {1, 0, 0, 0, 0, 0, 0, 0};
  kept(p, "pads on the batch or channel axis");
  p = {};
  p.pads = {0, 0, 0, 0, 0, 0, -1, 0};
  kept(p, "negative pads");
  p = {};
  p.other_reader = true;
  kept(p, "not as a convolution's input");
}

}  // namespace
}  // namespace kiln::test
