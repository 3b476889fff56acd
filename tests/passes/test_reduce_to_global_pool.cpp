// reduce_to_global_pool: a ReduceMean over every spatial axis with keepdims is GlobalAveragePool.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* reduce_mean(G& b, Value* x, std::vector<int64_t> axes, int64_t keepdims = 1) {
  return b.op("ReduceMean", {x, b.c(ints(axes))}, attrs({{"keepdims", Attribute::Int(keepdims)}}));
}

TEST(ReduceToGlobalPool, SpatialMeansBecomePools) {
  G b;
  Value* x = b.in("x", {2, 5, 4, 3});
  // A squeeze-excitation gate: x * sigmoid(mean over H, W), axes written both ways.
  b.out(b.op("Mul", {x, b.op("Sigmoid", {reduce_mean(b, x, {2, 3})})}));
  b.out(reduce_mean(b, x, {-1, -2}));
  b.out(reduce_mean(b, b.in("v", {1, 3, 2, 2, 2}), {2, 3, 4}));
  auto opt = optimize_checked(b.g, {"reduce_to_global_pool"});
  EXPECT_EQ(count(*opt, "ReduceMean"), 0);
  EXPECT_EQ(count(*opt, "GlobalAveragePool"), 3);
}

TEST(ReduceToGlobalPool, OtherMeansStay) {
  G b;
  Value* x = b.in("x", {2, 5, 4, 3});
  b.out(reduce_mean(b, x, {2, 3}, /*keepdims=*/0));  // [N, C]: not the pool's shape
  b.out(reduce_mean(b, x, {3}));                     // one spatial axis
  b.out(reduce_mean(b, x, {1, 2, 3}));               // channels too
  b.out(reduce_mean(b, b.in("s", {2, 7, 8}), {2}));  // a LayerNorm's statistic
  auto opt = optimize_checked(b.g, {"reduce_to_global_pool"});
  EXPECT_EQ(count(*opt, "ReduceMean"), 4);
  EXPECT_EQ(count(*opt, "GlobalAveragePool"), 0);
}

}  // namespace
}  // namespace kiln::test
