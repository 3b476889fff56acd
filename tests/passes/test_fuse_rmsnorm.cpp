// fuse_rmsnorm: decomposed RMSNorm (the forms exporters write before opset 23) becomes
// RMSNormalization; a LayerNorm's tail and non-trailing means stay as they are.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// x * rsqrt(mean(x^2, last axis) + eps) [* g]; rsqrt as 1 / Sqrt, Reciprocal(Sqrt) or Div.
Value* rmsnorm_decomposed(G& b, Value* x, int64_t h, int form, bool affine,
                          std::vector<int64_t> axes = {-1}) {
  Value* sq = form == 0 ? b.op("Pow", {x, b.cf(2.f)}) : b.op("Mul", {x, x});
  Value* ms = b.op("ReduceMean", {sq, b.c(ints(axes))});
  Value* r = b.op("Sqrt", {b.op("Add", {ms, b.cf(1e-6f)})});
  Value* n = form == 0   ? b.op("Mul", {x, b.op("Reciprocal", {r})})
             : form == 1 ? b.op("Div", {x, r})
                         : b.op("Mul", {b.op("Div", {b.cf(1.f), r}), x});
  return affine ? b.op("Mul", {b.c(rand_t({h})), n}) : n;
}

TEST(FuseRmsNorm, TheThreeRsqrtFormsWithAndWithoutScale) {
  for (int form = 0; form < 3; ++form)
    for (bool affine : {true, false}) {
      G b;
      Value* x = b.in("x", {2, 5, 8});
      b.out(b.op("Add", {rmsnorm_decomposed(b, x, 8, form, affine), x}));
      auto opt = optimize_checked(b.g, {"fuse_rmsnorm"});
      EXPECT_EQ(count(*opt, "RMSNormalization"), 1) << "form " << form << " affine " << affine;
      EXPECT_EQ(opt->nodes().size(), 2u);
      for (const Node* n : opt->nodes())
        if (n->op_type == "RMSNormalization") {
          EXPECT_EQ(n->attrs.get_int("axis", 0), -1);
          EXPECT_NEAR(n->attrs.get_float("epsilon", 0), 1e-6f, 1e-12);
        }
    }
}

TEST(FuseRmsNorm, LayerNormTailAndOtherAxesStay) {
  G b;
  Value* x = b.in("x", {2, 5, 8});
  Value* axes = b.c(ints({-1}));
  Value* d = b.op("Sub", {x, b.op("ReduceMean", {x, axes})});  // centred: a LayerNorm
  b.out(rmsnorm_decomposed(b, d, 8, 1, true));
  b.out(rmsnorm_decomposed(b, x, 8, 1, true, {1}));  // mean over axis 1, not trailing
  auto opt = optimize_checked(b.g, {"fuse_rmsnorm"});
  EXPECT_EQ(count(*opt, "RMSNormalization"), 0);
  auto both = optimize_checked(b.g, {"fuse_layernorm", "fuse_rmsnorm"});
  EXPECT_EQ(count(*both, "LayerNormalization"), 1);
  EXPECT_EQ(count(*both, "RMSNormalization"), 0);
}

}  // namespace
}  // namespace kiln::test
