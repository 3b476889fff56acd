// one_hot_to_equal: OneHot as a comparison with the positions along its axis agrees with the CPU
// op: any axis, negative indices wrapped, out-of-range ones all off, float indices.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* one_hot(G& b, Value* ind, int64_t depth, int64_t axis) {
  return b.op(
      "OneHot",
      {ind, b.c(Tensor::scalar<int64_t>(depth)), b.c(Tensor::from<float>({2}, {-0.5f, 3.0f}))},
      attrs({{"axis", Attribute::Int(axis)}}));
}

TEST(OneHotToEqual, EveryAxisAndIndexForm) {
  G b;
  Tensor ids(DataType::kInt64, {2, 3});
  const int64_t v[] = {0, 4, -1, -5, 7, 2};  // in range, wrapped, too low, too high
  std::memcpy(ids.raw(), v, sizeof v);
  Value* c = b.c(ids);
  b.out(one_hot(b, c, 5, -1));
  b.out(one_hot(b, c, 5, 0));
  b.out(one_hot(b, c, 5, 1));
  Tensor f = Tensor::from<float>({4}, {1.0f, 2.5f, -2.0f, 3.0f});  // 2.5 matches nothing
  b.out(one_hot(b, b.c(f), 4, -1));
  auto opt = optimize_checked(b.g, {"one_hot_to_equal"}, 1e-7);
  EXPECT_EQ(count(*opt, "OneHot"), 0);
  EXPECT_EQ(count(*opt, "Equal"), 4);
}

}  // namespace
}  // namespace kiln::test
