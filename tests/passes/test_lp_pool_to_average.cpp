// lp_pool_to_average: LpPool as a pooled sum of |x|^p and GlobalLpPool as a reduced one agree
// with the CPU ops: p 1, 2 and 3, explicit pads, ceil_mode (a last window past the padding),
// SAME_UPPER/SAME_LOWER, dilations, 1-D and 3-D, and GlobalLpPool down to rank 2.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* lp(G& b, Value* x, int64_t p, std::vector<std::pair<std::string, Attribute>> extra) {
  Attributes a = attrs({{"p", Attribute::Int(p)}});
  for (auto& [k, v] : extra) a.set(k, v);
  return b.op("LpPool", {x}, a);
}

TEST(LpPoolToAverage, EveryLpPoolBecomesAnAverage) {
  G b;
  using A = Attribute;
  b.out(lp(b, b.in("plain", {2, 3, 6, 5}), 2, {{"kernel_shape", A::Ints({2, 2})}}));
  b.out(lp(b, b.in("pads", {1, 2, 7, 7}), 3,
           {{"kernel_shape", A::Ints({3, 3})}, {"pads", A::Ints({2, 1, 0, 2})}}));
  b.out(lp(b, b.in("ceil", {1, 2, 8, 7}), 1,
           {{"kernel_shape", A::Ints({3, 2})},
            {"strides", A::Ints({2, 3})},
            {"pads", A::Ints({1, 0, 0, 0})},
            {"ceil_mode", A::Int(1)}}));
  b.out(lp(b, b.in("same_upper", {1, 2, 7, 6}), 2,
           {{"kernel_shape", A::Ints({2, 3})},
            {"strides", A::Ints({2, 2})},
            {"auto_pad", A::String("SAME_UPPER")}}));
  b.out(lp(b, b.in("same_lower", {1, 1, 5, 5}), 4,
           {{"kernel_shape", A::Ints({2, 2})}, {"auto_pad", A::String("SAME_LOWER")}}));
  b.out(lp(b, b.in("dilated", {1, 2, 6, 6}), 2,
           {{"kernel_shape", A::Ints({2, 2})}, {"dilations", A::Ints({2, 2})}}));
  b.out(lp(b, b.in("one_d", {2, 3, 9}), 3,
           {{"kernel_shape", A::Ints({3})}, {"strides", A::Ints({2})}}));
  b.out(lp(b, b.in("three_d", {1, 2, 4, 3, 4}), 2, {{"kernel_shape", A::Ints({2, 2, 2})}}));
  for (int64_t p : {1, 2, 3})
    b.out(b.op("GlobalLpPool", {b.in("global" + std::to_string(p), {2, 3, 4, 5})},
               attrs({{"p", A::Int(p)}})));
  b.out(b.op("GlobalLpPool", {b.in("global_rank2", {2, 3})}));
  auto opt = optimize_checked(b.g, {"lp_pool_to_average"}, 1e-6);
  EXPECT_EQ(count(*opt, "LpPool"), 0);
  EXPECT_EQ(count(*opt, "GlobalLpPool"), 0);
  EXPECT_EQ(count(*opt, "AveragePool"), 8);
  EXPECT_EQ(count(*opt, "ReduceSum"), 3);
}

}  // namespace
}  // namespace kiln::test
