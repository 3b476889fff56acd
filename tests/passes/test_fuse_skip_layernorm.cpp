// fuse_skip_layernorm: LayerNorm(a + b) becomes kiln.SkipLayerNorm, with the sum as a second
// output where something else reads it, also through a Reshape that keeps the last axis (Swin's
// blocks add on [B, H, W, C] and normalize [B, H*W, C]); the optimized graph computes what the
// original did.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Attributes ln_attrs() { return attrs({{"axis", Attribute::Int(-1)}}); }

TEST(FuseSkipLayerNorm, ResidualAddJoinsTheNormAndKeepsItsSum) {
  G b;
  Value* x = b.in("x", {2, 5, 16});
  Value* s = b.op("Add", {x, b.in("r", {2, 5, 16})});
  Value* y = b.op("LayerNormalization", {s, b.c(rand_t({16})), b.c(rand_t({16}))}, ln_attrs());
  b.out(b.op("Add", {y, s}));  // the residual stream reads the sum too
  auto opt = optimize_checked(b.g, {"fuse_skip_layernorm"});
  ASSERT_EQ(count(*opt, "SkipLayerNorm"), 1);
  EXPECT_EQ(find_op(*opt, "SkipLayerNorm")->num_outputs(), 2u);
  EXPECT_EQ(count(*opt, "LayerNormalization"), 0);
  expect_same_outputs(b.g, *opt);
}

TEST(FuseSkipLayerNorm, ThroughAReshapeThatKeepsTheLastAxis) {
  G b;
  Value* x = b.in("x", {2, 4, 3, 8});
  Value* s = b.op("Add", {x, b.in("r", {2, 4, 3, 8})});
  Value* flat = b.op("Reshape", {s, b.c(ints({2, -1, 8}))});
  Value* y = b.op("LayerNormalization", {flat, b.c(rand_t({8})), b.c(rand_t({8}))}, ln_attrs());
  b.out(b.op("Add", {y, flat}));  // Swin's MLP adds it back
  auto opt = optimize_checked(b.g, {"fuse_skip_layernorm"});
  ASSERT_EQ(count(*opt, "SkipLayerNorm"), 1);
  const Node* n = find_op(*opt, "SkipLayerNorm");
  ASSERT_EQ(n->num_outputs(), 2u);
  EXPECT_EQ(n->output(1)->type.rank(), 3);
  EXPECT_EQ(count(*opt, "Reshape"), 2);  // one a side, views
  EXPECT_EQ(count(*opt, "Add"), 1);      // the MLP's, not the residual's
  expect_same_outputs(b.g, *opt);
}

TEST(FuseSkipLayerNorm, NotThroughAReshapeOfTheLastAxisOrASharedSum) {
  {  // [2, 4, 3, 8] -> [2, 4, 24]: the rows change
    G b;
    Value* s = b.op("Add", {b.in("x", {2, 4, 3, 8}), b.in("r", {2, 4, 3, 8})});
    Value* flat = b.op("Reshape", {s, b.c(ints({2, 4, 24}))});
    b.out(b.op("LayerNormalization", {flat, b.c(rand_t({24})), b.c(rand_t({24}))}, ln_attrs()));
    auto opt = optimize_checked(b.g, {"fuse_skip_layernorm"});
    EXPECT_EQ(count(*opt, "SkipLayerNorm"), 0);
  }
  {  // the 4-D sum is read besides the Reshape
    G b;
    Value* s = b.op("Add", {b.in("x", {2, 4, 3, 8}), b.in("r", {2, 4, 3, 8})});
    Value* flat = b.op("Reshape", {s, b.c(ints({2, 12, 8}))});
    b.out(b.op("LayerNormalization", {flat, b.c(rand_t({8})), b.c(rand_t({8}))}, ln_attrs()));
    b.out(s);
    auto opt = optimize_checked(b.g, {"fuse_skip_layernorm"});
    EXPECT_EQ(count(*opt, "SkipLayerNorm"), 0);
  }
}

}  // namespace
}  // namespace kiln::test
