// Einsum: random data against loops written out here; the implicit form, diagonals, "...",
// integer types, and errors.
#include "op_test_util.h"

namespace kiln::test {
namespace {

OpRun einsum(const std::string& eq, const std::vector<const Tensor*>& ins) {
  return run_op("Einsum", ins, attrs({{"equation", Str(eq)}}));
}

TEST(Einsum, BatchedMatMulAgainstLoops) {
  Tensor a = random_tensor({2, 3, 4}), b = random_tensor({2, 4, 5});
  OpRun r = einsum("bij, bjk -> bik", {&a, &b});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  std::vector<double> want(2 * 3 * 5, 0.0);
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 5; ++k)
        for (int j = 0; j < 4; ++j)
          want[(n * 3 + i) * 5 + k] +=
              a.at_double((n * 3 + i) * 4 + j) * b.at_double((n * 4 + j) * 5 + k);
  expect_values(r.outputs[0], want);
}

TEST(Einsum, ImplicitOutputTransposeTraceAndSum) {
  Tensor a = random_tensor({3, 3});
  OpRun t = einsum("ji", {&a});  // implicit output "ij": a transpose
  ASSERT_TRUE(t.status.ok()) << t.status.message();
  OpRun tr = einsum("ii", {&a});  // trace (a label used twice is summed)
  ASSERT_TRUE(tr.status.ok()) << tr.status.message();
  OpRun d = einsum("ii->i", {&a});
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  OpRun s = einsum("ij->", {&a});
  ASSERT_TRUE(s.status.ok()) << s.status.message();
  std::vector<double> tw(9), dw(3);
  double trace = 0, sum = 0;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      tw[i * 3 + j] = a.at_double(j * 3 + i);
      sum += a.at_double(i * 3 + j);
    }
  for (int i = 0; i < 3; ++i) trace += dw[i] = a.at_double(i * 4);
  expect_values(t.outputs[0], tw);
  expect_values(tr.outputs[0], {trace});
  EXPECT_EQ(tr.outputs[0].rank(), 0);
  expect_values(d.outputs[0], dw);
  expect_values(s.outputs[0], {sum});
}

TEST(Einsum, EllipsisBroadcastsAndOuterProductOfIntegers) {
  Tensor a = random_tensor({2, 1, 3, 4}), b = random_tensor({5, 4, 2});
  OpRun r = einsum("...ij,...jk->...ik", {&a, &b});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 5, 3, 2}));
  for (int x = 0; x < 2; ++x)
    for (int y = 0; y < 5; ++y)
      for (int i = 0; i < 3; ++i)
        for (int k = 0; k < 2; ++k) {
          double w = 0;
          for (int j = 0; j < 4; ++j)
            w += a.at_double((x * 3 + i) * 4 + j) * b.at_double((y * 4 + j) * 2 + k);
          EXPECT_NEAR(r.outputs[0].at_double(((x * 5 + y) * 3 + i) * 2 + k), w, 1e-5);
        }
  Tensor u = I64({3}, {1, -2, 3}), v = I64({2}, {4, 5});
  OpRun o = einsum("i,j", {&u, &v});
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  EXPECT_EQ(o.outputs[0].dtype(), DataType::kInt64);
  EXPECT_EQ(values_i64(o.outputs[0]), (std::vector<int64_t>{4, 5, -8, -10, 12, 15}));
}

TEST(Einsum, BadInputIsOneLineError) {
  Tensor a = random_tensor({2, 3}), b = random_tensor({4, 5});
  expect_error(einsum("ij,jk->ik", {&a, &b}), "has sizes 3 and 4");
  expect_error(einsum("ij->ik", {&a}), "output label 'k'");
  expect_error(einsum("ijk", {&a}), "has rank 2");
  expect_error(einsum("ij,jk", {&a}), "2 terms for 1 inputs");
  Tensor i = I64({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_error(einsum("ij,ij->ij", {&a, &i}), "share one type");
}

}  // namespace
}  // namespace kiln::test
