// ScatterND, ScatterElements (every reduction) and NonZero: hand-computed examples (the ONNX
// spec's), random data against naive loops written out here, and errors.
#include "op_test_util.h"

namespace kiln::test {
namespace {

TEST(ScatterND, SpecExampleSlicesAndReductions) {
  Tensor data = iota_f({4, 2});
  Tensor idx = I64({2, 1}, {3, 1});
  Tensor upd = F32({2, 2}, {10, 20, 30, 40});
  OpRun r = run_op("ScatterND", {&data, &idx, &upd}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values(r.outputs[0], {0, 1, 30, 40, 4, 5, 10, 20});
  r = run_op("ScatterND", {&data, &idx, &upd}, attrs({{"reduction", Str("mul")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {0, 1, 60, 120, 4, 5, 60, 140});
}

TEST(ScatterND, RandomElementIndicesWithAddAndNegativeIndex) {
  Tensor data = random_tensor({3, 4});
  Tensor idx = I64({3, 2}, {0, 1, -1, 3, 0, 1});  // (0,1) twice: add accumulates
  Tensor upd = random_tensor({3});
  OpRun r = run_op("ScatterND", {&data, &idx, &upd}, attrs({{"reduction", Str("add")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  std::vector<double> want = values_d(data);
  want[1] += upd.at_double(0) + upd.at_double(2);
  want[11] += upd.at_double(1);
  expect_values(r.outputs[0], want);
  Tensor bad = I64({1, 2}, {3, 0});
  Tensor u1 = random_tensor({1});
  expect_error(run_op("ScatterND", {&data, &bad, &u1}, {}), "out of range");
}

TEST(ScatterElements, SpecExampleAxis1AndMaxMin) {
  Tensor data = F32({1, 5}, {1, 2, 3, 4, 5});
  Tensor idx = I64({1, 2}, {1, 3});
  Tensor upd = F32({1, 2}, {1.1f, 2.1f});
  OpRun r = run_op("ScatterElements", {&data, &idx, &upd}, attrs({{"axis", Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {1, 1.1, 3, 2.1, 5});
  r = run_op("ScatterElements", {&data, &idx, &upd},
             attrs({{"axis", Int(1)}, {"reduction", Str("max")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {1, 2, 3, 4, 5});
  r = run_op("ScatterElements", {&data, &idx, &upd},
             attrs({{"axis", Int(1)}, {"reduction", Str("min")}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {1, 1.1, 3, 2.1, 5});
}

TEST(ScatterElements, RandomAxis0MatchesNaiveLoop) {
  Tensor data = random_tensor({4, 3});
  Tensor idx = I64({2, 3}, {3, 0, 1, -4, 2, 3});
  Tensor upd = random_tensor({2, 3});
  OpRun r = run_op("ScatterElements", {&data, &idx, &upd}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  std::vector<double> want = values_d(data);
  const std::vector<int64_t> iv = values_i64(idx);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      const int64_t row = iv[i * 3 + j] < 0 ? iv[i * 3 + j] + 4 : iv[i * 3 + j];
      want[row * 3 + j] = upd.at_double(i * 3 + j);
    }
  expect_values(r.outputs[0], want);
}

TEST(NonZero, CoordinatesInRowMajorOrderAndUnknownCount) {
  Tensor x = F32({2, 3}, {0, 1.5f, 0, -2, 0, 3});
  OpRun r = run_op("NonZero", {&x}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt64);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{0, 1, 1, 1, 0, 2}));
  ASSERT_TRUE(r.inferred[0].dims.has_value());
  EXPECT_EQ((*r.inferred[0].dims)[0].value, 2);
  EXPECT_FALSE((*r.inferred[0].dims)[1].is_static());  // learnt at run time
}

}  // namespace
}  // namespace kiln::test
