// fuse_groupnorm: nn.GroupNorm as PyTorch's TorchScript exporter writes it (a view to
// [N, G, -1], InstanceNormalization with unit scale and zero bias, the view back, the per-channel
// affine) becomes GroupNormalization with the affine; the graph computes what it did.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

std::unique_ptr<Graph> group_norm(bool affine, bool plain_instance_norm = true) {
  G b;
  Value* x = b.in("x", {2, 6, 4, 5});
  Value* r = b.op("Reshape", {x, b.c(ints({0, 3, -1}))});
  Value* n = b.op("InstanceNormalization",
                  {r, b.c(plain_instance_norm ? passes::ones({3}, DataType::kFloat32) : rand_t({3})),
                   b.c(Tensor::from<float>({3}, {0.f, 0.f, 0.f}))},
                  attrs({{"epsilon", Attribute::Float(1e-5f)}}));
  Value* y = b.op("Reshape", {n, b.c(ints({2, 6, 4, 5}))});
  if (affine) {
    y = b.op("Mul", {y, b.c(rand_t({6, 1, 1}))});
    y = b.op("Add", {y, b.c(rand_t({6, 1, 1}))});
  }
  b.out(b.op("Relu", {y}));
  return b.g.clone();
}

TEST(FuseGroupNorm, TorchScriptsGroupNormBecomesOneLayer) {
  for (bool affine : {true, false}) {
    const auto g = group_norm(affine);
    auto opt = optimize_checked(*g, {"fuse_groupnorm"});
    ASSERT_EQ(count(*opt, "GroupNormalization"), 1) << affine;
    EXPECT_EQ(find_op(*opt, "GroupNormalization")->attrs.get_int("num_groups", 0), 3);
    EXPECT_EQ(count(*opt, "InstanceNormalization"), 0);
    EXPECT_EQ(count(*opt, "Reshape"), 0);
    EXPECT_EQ(count(*opt, "Mul"), 0);
  }
}

// A detector head's norm: the batch dim unknown (here made by a selection), the view back to
// Shape(x) itself, which proves it is x's shape.
TEST(FuseGroupNorm, ViewBackToXsOwnShapeWhateverItsDims) {
  G b;
  Value* xin = b.in("x", {2, 6, 4, 5});
  Value* all = b.op("NonZero", {b.op("Greater", {b.in("sel", {2}), b.cf(-10.f)})});
  Value* x = b.op("Gather", {xin, b.op("Squeeze", {all, b.c(ints({0}))})});  // [?, 6, 4, 5]
  Value* r = b.op("Reshape", {x, b.c(ints({0, 3, -1}))});
  Value* n = b.op("InstanceNormalization",
                  {r, b.c(passes::ones({3}, DataType::kFloat32)),
                   b.c(Tensor::from<float>({3}, {0.f, 0.f, 0.f}))});
  Value* y = b.op("Reshape", {n, b.op("Shape", {x})});
  y = b.op("Add", {b.op("Mul", {y, b.c(rand_t({6, 1, 1}))}), b.c(rand_t({6, 1, 1}))});
  b.out(b.op("Relu", {y}));
  auto opt = optimize_checked(b.g, {"fuse_groupnorm", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "GroupNormalization"), 1);
  EXPECT_EQ(count(*opt, "Mul"), 0);
}

TEST(FuseGroupNorm, NotWithTheInstanceNormsOwnScale) {
  auto opt = optimize_checked(*group_norm(true, false), {"fuse_groupnorm"});
  EXPECT_EQ(count(*opt, "GroupNormalization"), 0);
}

}  // namespace
}  // namespace kiln::test
