// unflatten_batched_matmul: PyTorch's matmul decomposition (expand both operands to the common
// batch dims, flatten them into one for a 3-D product, unflatten the result) becomes one 4-D
// MatMul, checked against the graph before on the CPU; remove_noops then drops the Expands to
// their own shapes. A result unflattened to other dims stays.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kH = 3, kM = 5, kK = 4, kN = 6;

Value* bmm(G& b, Value* x, Value* y, std::vector<int64_t> xflat, std::vector<int64_t> yflat) {
  Value* ex = b.op("Expand", {x, b.c(ints({kB, kH, kM, kK}))});
  Value* ey = b.op("Expand", {y, b.c(ints({kB, kH, kK, kN}))});
  Value* p = b.op("MatMul", {b.op("Reshape", {ex, b.c(ints(std::move(xflat)))}),
                             b.op("Reshape", {ey, b.c(ints(std::move(yflat)))})});
  return b.op("Reshape", {p, b.c(ints({kB, kH, kM, kN}))});
}

TEST(UnflattenBatchedMatmul, FlattenedBatchBecomesOneMatMul) {
  G b;
  Value* x = b.in("x", {kB, kH, kM, kK});
  Value* y = b.in("y", {kB, kH, kK, kN});
  b.out(b.op("Relu", {bmm(b, x, y, {kB * kH, kM, kK}, {kB * kH, kK, kN})}));
  auto opt = optimize_checked(b.g, {"remove_noops", "unflatten_batched_matmul",
                                    "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MatMul"), 1);
  EXPECT_EQ(count(*opt, "Reshape"), 0);
  EXPECT_EQ(count(*opt, "Expand"), 0);
  EXPECT_EQ(find_op(*opt, "MatMul")->output(0)->type.rank(), 4);
}

TEST(UnflattenBatchedMatmul, OtherMergesStay) {
  // The result unflattened to other leading dims than the operands': not their batched product.
  G b;
  Value* x = b.in("x", {kB, kH, kM, kK});
  Value* y = b.in("y", {kB, kH, kK, kN});
  Value* q = b.op("MatMul", {b.op("Reshape", {x, b.c(ints({kB * kH, kM, kK}))}),
                             b.op("Reshape", {y, b.c(ints({kB * kH, kK, kN}))})});
  b.out(b.op("Reshape", {q, b.c(ints({kH, kB, kM, kN}))}));  // leading dims swapped
  auto opt = optimize_checked(b.g, {"unflatten_batched_matmul", "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MatMul"), 1);
  EXPECT_EQ(find_op(*opt, "MatMul")->output(0)->type.rank(), 3);
}

}  // namespace
}  // namespace kiln::test
