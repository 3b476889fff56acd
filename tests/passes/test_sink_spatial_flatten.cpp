// sink_spatial_flatten: a flattening of the spatial axes moves past a GroupNorm, and a 3-D
// transpose of flattened pixels becomes the 4-D channels-last transpose (a view of NHWC memory)
// and a reshape, as diffusers' VAE attention writes them; the graph computes what it did.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// The VAE attention's layout ops: x [2, 8, 4, 5] -> view [2, 8, 20] -> GroupNorm ->
// transpose [2, 20, 8] -> (a product) -> transpose back [2, 8, 20] -> view [2, 8, 4, 5] + x.
TEST(SinkSpatialFlatten, VaeAttentionsLayoutOpsBecomeChannelsLastViews) {
  G b;
  Value* x = b.in("x", {2, 8, 4, 5});
  Value* flat = b.op("Reshape", {x, b.c(ints({2, 8, -1}))});
  Value* n = b.op("GroupNormalization", {flat, b.c(rand_t({8})), b.c(rand_t({8}))},
                  attrs({{"num_groups", Attribute::Int(4)}, {"epsilon", Attribute::Float(1e-6f)}}));
  Value* rows = b.op("Transpose", {n}, attrs({{"perm", Attribute::Ints({0, 2, 1})}}));
  Value* p = b.op("MatMul", {rows, b.c(rand_t({8, 8}))});
  Value* back = b.op("Transpose", {p}, attrs({{"perm", Attribute::Ints({0, 2, 1})}}));
  Value* img = b.op("Reshape", {back, b.c(ints({2, 8, 4, 5}))});
  b.out(b.op("Add", {img, x}));
  auto opt = optimize_checked(b.g, {"sink_spatial_flatten"});
  const Node* gn = find_op(*opt, "GroupNormalization");
  ASSERT_NE(gn, nullptr);
  EXPECT_EQ(gn->input(0)->name, "x");  // the norm runs on the image
  std::vector<std::vector<int64_t>> perms;
  for (const Node* t : opt->nodes())
    if (t->op_type == "Transpose") perms.push_back(t->attrs.get_ints("perm"));
  EXPECT_EQ(perms, (std::vector<std::vector<int64_t>>{{0, 2, 3, 1}, {0, 3, 1, 2}}));
}

TEST(SinkSpatialFlatten, OtherViewsAndSharedValuesStay) {
  G b;
  Value* x = b.in("x", {2, 8, 4, 5});
  // Groups of channels, not spatial axes, are merged: not a flattening of the image.
  Value* v = b.op("Reshape", {x, b.c(ints({2, 4, 40}))});
  b.out(b.op("Transpose", {v}, attrs({{"perm", Attribute::Ints({0, 2, 1})}})));
  // The flattened value read twice.
  Value* f = b.op("Reshape", {x, b.c(ints({2, 8, 20}))});
  b.out(b.op("Transpose", {f}, attrs({{"perm", Attribute::Ints({0, 2, 1})}})));
  b.out(b.op("Neg", {f}));
  auto opt = optimize_checked(b.g, {"sink_spatial_flatten"});
  for (const Node* t : opt->nodes()) {
    if (t->op_type == "Transpose") {
      EXPECT_EQ(t->attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 1}));
    }
  }
}

}  // namespace
}  // namespace kiln::test
