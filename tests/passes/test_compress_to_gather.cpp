// compress_to_gather: Compress as a Gather of NonZero's positions agrees with the CPU op: an axis,
// a negative axis, no axis (flattened), a condition shorter than the axis, and one longer whose
// tail is false (sliced off).
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* compress(G& b, Value* x, std::vector<bool> cond, std::optional<int64_t> axis) {
  Tensor c(DataType::kBool, {static_cast<int64_t>(cond.size())});
  for (size_t i = 0; i < cond.size(); ++i) c.data<bool>()[i] = cond[i];
  Attributes a;
  if (axis) a.set("axis", Attribute::Int(*axis));
  return b.op("Compress", {x, b.c(c)}, a);
}

TEST(CompressToGather, EveryCompressBecomesAGather) {
  G b;
  b.out(compress(b, b.in("rows", {4, 3}), {true, false, true, true}, 0));
  b.out(compress(b, b.in("last", {2, 3, 5}), {false, true, false, false, true}, -1));
  b.out(compress(b, b.in("flat", {2, 3}), {true, false, false, true, true, false}, std::nullopt));
  b.out(compress(b, b.in("short", {2, 5}), {false, true}, 1));
  b.out(compress(b, b.in("long", {3, 2}), {true, false, true, false, false}, 0));
  auto opt = optimize_checked(b.g, {"compress_to_gather"}, 1e-7);
  EXPECT_EQ(count(*opt, "Compress"), 0);
  EXPECT_EQ(count(*opt, "Gather"), 5);
  EXPECT_EQ(count(*opt, "Slice"), 1);
}

}  // namespace
}  // namespace kiln::test
