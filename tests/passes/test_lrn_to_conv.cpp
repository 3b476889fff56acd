// lrn_to_conv: LRN as squares, a banded channel Conv and a division agrees with the CPU op, at odd
// and even sizes (the window's two sides differ), rank 3 and 4, and sizes past the channels.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* lrn(G& b, Value* x, int64_t size, float alpha, float beta, float bias) {
  return b.op("LRN", {x},
              attrs({{"size", Attribute::Int(size)},
                     {"alpha", Attribute::Float(alpha)},
                     {"beta", Attribute::Float(beta)},
                     {"bias", Attribute::Float(bias)}}));
}

TEST(LrnToConv, EveryLrnBecomesAConv) {
  G b;
  b.out(lrn(b, b.in("alexnet", {2, 7, 5, 4}), 5, 1e-4f, 0.75f, 2.0f));
  b.out(lrn(b, b.in("even", {1, 6, 3, 3}), 4, 0.5f, 0.6f, 1.0f));
  b.out(lrn(b, b.in("wide", {1, 3, 4, 2}), 9, 2.0f, 1.5f, 0.5f));
  b.out(lrn(b, b.in("seq", {2, 5, 6}), 3, 1.0f, 0.75f, 1.0f));
  auto opt = optimize_checked(b.g, {"lrn_to_conv"}, 1e-6);
  EXPECT_EQ(count(*opt, "LRN"), 0);
  EXPECT_EQ(count(*opt, "Conv"), 4);
}

}  // namespace
}  // namespace kiln::test
