// max_unpool_to_scatter: MaxUnpool as a scatter into zeros agrees with the CPU op on MaxPool's
// own values and indices: 1-D, 2-D with strides and pads, 3-D, and a larger output_shape (the
// unpooled tensor at its start).
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* pool_unpool(G& b, Value* x, std::vector<int64_t> k, std::vector<int64_t> s,
                   std::vector<int64_t> p, Value* shape = nullptr) {
  Attributes a = attrs({{"kernel_shape", Attribute::Ints(k)},
                        {"strides", Attribute::Ints(s)},
                        {"pads", Attribute::Ints(p)}});
  Node* pool = b.node("MaxPool", {x}, a, 2);
  std::vector<Value*> ins = {pool->output(0), pool->output(1)};
  if (shape) ins.push_back(shape);
  return b.op("MaxUnpool", ins, a);
}

TEST(MaxUnpoolToScatter, EveryUnpoolBecomesAScatter) {
  G b;
  b.out(pool_unpool(b, b.in("one_d", {2, 3, 8}), {2}, {2}, {0, 0}));
  b.out(pool_unpool(b, b.in("strided", {2, 2, 7, 7}), {3, 3}, {2, 2}, {1, 1, 1, 1}));
  b.out(pool_unpool(b, b.in("three_d", {1, 2, 4, 4, 4}), {2, 2, 2}, {2, 2, 2}, {0, 0, 0, 0, 0, 0}));
  b.out(pool_unpool(b, b.in("sized", {1, 3, 4, 4}), {2, 2}, {2, 2}, {0, 0, 0, 0},
                    b.c(Tensor::from<int64_t>({4}, {2, 3, 5, 6}))));
  auto opt = optimize_checked(b.g, {"max_unpool_to_scatter"}, 1e-7);
  EXPECT_EQ(count(*opt, "MaxUnpool"), 0);
  EXPECT_EQ(count(*opt, "ScatterElements"), 4);
}

}  // namespace
}  // namespace kiln::test
