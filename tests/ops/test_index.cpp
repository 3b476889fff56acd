// Index family: Gather, GatherElements, GatherND, Trilu, CumSum, TopK, ArgMax, ArgMin. Spec
// examples, random data against naive loops, negative indices, opset upgrades, dtypes, errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "op_test_util.h"

namespace kiln::test {
namespace {

using V = std::vector<int64_t>;
using FV = std::vector<float>;

// Inference on symbolic input types (no constants).
TensorType infer_types(const std::string& op, const std::vector<TIn>& ins, const Attributes& a,
                       size_t out = 0, size_t nout = 1) {
  auto types = infer(op, ins, a, nout);
  EXPECT_TRUE(types.ok()) << types.status().message();
  return types.ok() ? (*types)[out] : TensorType();
}
const Dim N = Dim::sym("N");

// ------------------------------------------------------------------------------ Gather
TEST(Gather, AxesNegativeIndicesAndErrors) {
  Tensor x = iota_f({3, 4}), ind = I64({2, 2}, {0, -1, 2, 1});
  auto r = run_op("Gather", {&x, &ind}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 2, 4}));
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0, 1, 2, 3, 8, 9, 10, 11, 8, 9, 10, 11, 4, 5, 6, 7}));
  expect_inferred_matches(r);
  Tensor i32 = Tensor::from<int32_t>({2}, {3, -4});
  r = run_op("Gather", {&x, &i32}, attrs({{"axis", Int(-1)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), (FV{3, 0, 7, 4, 11, 8}));
  Tensor sc = Tensor::scalar<int64_t>(1);
  r = run_op("Gather", {&x, &sc}, attrs({{"axis", Int(1)}}));
  EXPECT_EQ(r.outputs[0].shape(), (V{3}));
  EXPECT_EQ(values_f(r.outputs[0]), (FV{1, 5, 9}));
  expect_inferred_matches(r);
  Tensor empty(DataType::kInt64, {0});
  r = run_op("Gather", {&x, &empty}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (V{0, 4}));
  Tensor oob = I64v({3}), oobn = I64v({-4}), fl = F32({1}, {0});
  EXPECT_FALSE(run_op("Gather", {&x, &oob}, {}).status.ok());
  EXPECT_FALSE(run_op("Gather", {&x, &oobn}, {}).status.ok());
  EXPECT_FALSE(run_op("Gather", {&x, &fl}, {}).status.ok());
  EXPECT_FALSE(run_op("Gather", {&x, &sc}, attrs({{"axis", Int(2)}})).status.ok());
  EXPECT_EQ(infer_types("Gather", {TensorType(DataType::kFloat32, {N, 5, 6}),
                                   TensorType(DataType::kInt64, {Dim::sym("S")})},
                        attrs({{"axis", Int(1)}})).str(),
            "float32[N,S,6]");
}

TEST(Gather, RandomAgainstNaiveAndDtypes) {
  std::mt19937 rng(std::random_device{}());
  Tensor x = random_tensor({4, 5, 3});
  std::uniform_int_distribution<int64_t> pick(-5, 4);
  std::vector<int64_t> idx(6);
  for (auto& v : idx) v = pick(rng);
  Tensor ind = I64({2, 3}, idx);
  auto r = run_op("Gather", {&x, &ind}, attrs({{"axis", Int(1)}}));
  ASSERT_TRUE(r.status.ok());
  const Tensor o = r.outputs[0];
  ASSERT_EQ(o.shape(), (V{4, 2, 3, 3}));
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t j = 0; j < 6; ++j)
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t k = idx[j] < 0 ? idx[j] + 5 : idx[j];
        EXPECT_EQ(o.at_double((a * 6 + j) * 3 + c), x.at_double((a * 5 + k) * 3 + c));
      }
  Tensor h = x.cast(DataType::kFloat16), b = Tensor::from<bool>({3}, {true, false, true});
  r = run_op("Gather", {&h, &ind}, attrs({{"axis", Int(1)}}));
  EXPECT_EQ(values_f(r.outputs[0]), values_f(o.cast(DataType::kFloat16)));
  Tensor bi = I64v({2, 1});
  r = run_op("Gather", {&b, &bi}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 0}));
}

// ------------------------------------------------------------------------------ GatherElements
TEST(GatherElements, SpecExamplesAndErrors) {
  Tensor x = F32({2, 2}, {1, 2, 3, 4}), ind = I64({2, 2}, {0, 0, 1, 0});
  auto r = run_op("GatherElements", {&x, &ind}, attrs({{"axis", Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (FV{1, 1, 4, 3}));
  Tensor y = iota_f({3, 3}), ind2 = I64({2, 3}, {1, 2, 0, 2, 0, -3});
  r = run_op("GatherElements", {&y, &ind2}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), (FV{3, 7, 2, 6, 1, 2}));
  expect_inferred_matches(r);
  Tensor oob = I64({1, 1}, {3}), rank1 = I64v({0});
  EXPECT_FALSE(run_op("GatherElements", {&y, &oob}, {}).status.ok());
  EXPECT_FALSE(run_op("GatherElements", {&y, &rank1}, {}).status.ok());
  Tensor big = I64({4, 1}, {0, 0, 0, 0});  // exceeds data on a non-axis dim
  EXPECT_FALSE(run_op("GatherElements", {&y, &big}, attrs({{"axis", Int(1)}})).status.ok());
}

// ------------------------------------------------------------------------------ GatherND
TEST(GatherND, SpecExamplesAndBatchDims) {
  Tensor x = Tensor::from<int32_t>({2, 2}, {0, 1, 2, 3});
  Tensor i1 = I64({2, 2}, {0, 0, 1, 1}), i2 = I64({2, 1}, {1, 0});
  auto r = run_op("GatherND", {&x, &i1}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_i64(r.outputs[0]), (V{0, 3}));
  expect_inferred_matches(r);
  r = run_op("GatherND", {&x, &i2}, {});
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 2}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2, 3, 0, 1}));
  Tensor y = Tensor::from<int32_t>({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor i3 = I64({2, 1}, {1, 0});
  r = run_op("GatherND", {&y, &i3}, attrs({{"batch_dims", Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 2}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2, 3, 4, 5}));
  expect_inferred_matches(r);
  Tensor i4 = I64({2, 1, 2}, {-1, 0, 0, 1});  // batch_dims 1, negative index
  r = run_op("GatherND", {&y, &i4}, attrs({{"batch_dims", Int(1)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 1}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2, 5}));
  Tensor i5 = I64({1, 3}, {0, 0, 0}), i6 = I64({1, 2}, {2, 0});
  EXPECT_FALSE(run_op("GatherND", {&x, &i5}, {}).status.ok());
  EXPECT_FALSE(run_op("GatherND", {&x, &i6}, {}).status.ok());
  EXPECT_FALSE(run_op("GatherND", {&y, &i3}, attrs({{"batch_dims", Int(2)}})).status.ok());
  Tensor i7 = I64({3, 1}, {0, 0, 0});  // batch dim 3 vs 2
  EXPECT_FALSE(run_op("GatherND", {&y, &i7}, attrs({{"batch_dims", Int(1)}})).status.ok());
}

// ------------------------------------------------------------------------------ Trilu
TEST(Trilu, UpperLowerK) {
  Tensor x = iota_f({3, 4});
  auto r = run_op("Trilu", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0, 1, 2, 3, 0, 5, 6, 7, 0, 0, 10, 11}));
  Tensor k = Tensor::scalar<int64_t>(-1);
  r = run_op("Trilu", {&x, &k}, attrs({{"upper", Int(0)}}));
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0, 0, 0, 0, 4, 0, 0, 0, 8, 9, 0, 0}));
  Tensor k2 = Tensor::scalar<int64_t>(2);
  r = run_op("Trilu", {&x, &k2}, {});
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0, 0, 2, 3, 0, 0, 0, 7, 0, 0, 0, 0}));
  Tensor huge = Tensor::scalar<int64_t>(100);
  r = run_op("Trilu", {&x, &huge}, attrs({{"upper", Int(0)}}));
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
  // Batched int64 and bool.
  Tensor b = Tensor::from<bool>({2, 2, 2}, {true, true, true, true, true, true, true, true});
  r = run_op("Trilu", {&b}, attrs({{"upper", Int(0)}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 0, 1, 1, 1, 0, 1, 1}));
  expect_inferred_matches(r);
  Tensor e(DataType::kInt64, {0, 3});
  EXPECT_TRUE(run_op("Trilu", {&e}, {}).status.ok());
  Tensor v = I64v({1, 2});
  EXPECT_FALSE(run_op("Trilu", {&v}, {}).status.ok());
}

// ------------------------------------------------------------------------------ ReverseSequence
TEST(ReverseSequence, TimeAndBatchFirstAndBadLengths) {
  // x[t, b] = 10 t + b: batch entry b's first lens[b] steps in reverse.
  Tensor x = F32({4, 3}, {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32});
  Tensor lens = I64({3}, {4, 2, 0});
  auto r = run_op("ReverseSequence", {&x, &lens}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (FV{30, 11, 2, 20, 1, 12, 10, 21, 22, 0, 31, 32}));
  expect_inferred_matches(r);
  // Batch first: the transposed input, the transposed answer.
  Tensor xb = F32({3, 4}, {0, 10, 20, 30, 1, 11, 21, 31, 2, 12, 22, 32});
  r = run_op("ReverseSequence", {&xb, &lens}, attrs({{"time_axis", Int(1)}, {"batch_axis", Int(0)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (FV{30, 20, 10, 0, 11, 1, 21, 31, 2, 12, 22, 32}));
  // A length past the time axis, a negative one, lengths not one per batch entry, axes not 0/1.
  for (std::vector<int64_t> bad : {std::vector<int64_t>{5, 1, 1}, {-1, 1, 1}, {1, 1}}) {
    Tensor l = I64({static_cast<int64_t>(bad.size())}, bad);
    r = run_op("ReverseSequence", {&x, &l}, {});
    ASSERT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.message().find('\n'), std::string::npos) << r.status.message();
  }
  EXPECT_FALSE(run_op("ReverseSequence", {&x, &lens}, attrs({{"time_axis", Int(1)}})).status.ok());
}

// ------------------------------------------------------------------------------ CumSum
TEST(CumSum, ExclusiveReverseAxes) {
  Tensor x = F32({5}, {1, 2, 3, 4, 5}), ax = Tensor::scalar<int32_t>(0);
  auto run = [&](int64_t excl, int64_t rev) {
    return run_op("CumSum", {&x, &ax}, attrs({{"exclusive", Int(excl)}, {"reverse", Int(rev)}}));
  };
  EXPECT_EQ(values_f(run(0, 0).outputs[0]), (FV{1, 3, 6, 10, 15}));
  EXPECT_EQ(values_f(run(1, 0).outputs[0]), (FV{0, 1, 3, 6, 10}));
  EXPECT_EQ(values_f(run(0, 1).outputs[0]), (FV{15, 14, 12, 9, 5}));
  EXPECT_EQ(values_f(run(1, 1).outputs[0]), (FV{14, 12, 9, 5, 0}));
  Tensor y = Tensor::from<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6}), neg = I64v({-1});
  auto r = run_op("CumSum", {&y, &neg}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 3, 6, 4, 9, 15}));
  expect_inferred_matches(r);
  Tensor a0 = Tensor::scalar<int64_t>(0);
  r = run_op("CumSum", {&y, &a0}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 2, 3, 5, 7, 9}));
  Tensor h = F32({3}, {0.5f, 0.25f, 1.f}).cast(DataType::kFloat16);
  r = run_op("CumSum", {&h, &a0}, {});
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0.5f, 0.75f, 1.75f}));
  Tensor a2 = Tensor::scalar<int64_t>(2), fa = Tensor::scalar<float>(0);
  EXPECT_FALSE(run_op("CumSum", {&y, &a2}, {}).status.ok());
  EXPECT_FALSE(run_op("CumSum", {&y, &fa}, {}).status.ok());
  EXPECT_FALSE(run_op("CumSum", {&y}, {}).status.ok());
}

// CumProd (opset 26): the spec's example in all four modes, an inner axis, integer wrap-around,
// float16, and the errors.
TEST(CumProd, ExclusiveReverseAxesAndWrap) {
  Tensor x = F32({3}, {1, 2, 3}), ax = Tensor::scalar<int32_t>(0);
  auto run = [&](int64_t excl, int64_t rev) {
    return run_op("CumProd", {&x, &ax}, attrs({{"exclusive", Int(excl)}, {"reverse", Int(rev)}}));
  };
  EXPECT_EQ(values_f(run(0, 0).outputs[0]), (FV{1, 2, 6}));
  EXPECT_EQ(values_f(run(1, 0).outputs[0]), (FV{1, 1, 2}));
  EXPECT_EQ(values_f(run(0, 1).outputs[0]), (FV{6, 6, 3}));
  EXPECT_EQ(values_f(run(1, 1).outputs[0]), (FV{6, 3, 1}));
  Tensor y = Tensor::from<int64_t>({2, 3}, {1, -2, 3, 4, 5, 6}), a0 = Tensor::scalar<int64_t>(0);
  auto r = run_op("CumProd", {&y, &a0}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, -2, 3, 4, -10, 18}));
  Tensor big = Tensor::from<int32_t>({3}, {65536, 65536, 3});  // 2^32 wraps to 0
  r = run_op("CumProd", {&big, &ax}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (V{65536, 0, 0}));
  Tensor h = F32({3}, {0.5f, 0.5f, 4.f}).cast(DataType::kFloat16);
  r = run_op("CumProd", {&h, &a0}, {});
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  EXPECT_EQ(values_f(r.outputs[0]), (FV{0.5f, 0.25f, 1.f}));
  Tensor a2 = Tensor::scalar<int64_t>(2);
  expect_error(run_op("CumProd", {&y, &a2}, {}), "axis");
  expect_error(run_op("CumProd", {&y}, {}), "CumProd needs the axis input");
  Tensor b(DataType::kBool, {2});
  expect_error(run_op("CumProd", {&b, &a0}, {}), "CumProd does not support bool");
}

// ------------------------------------------------------------------------------ TopK
TEST(TopK, LargestSmallestTiesAxis) {
  Tensor x = F32({2, 4}, {1, 3, 3, 2, 5, 5, 5, 0}), k = I64v({2});
  auto r = run_op("TopK", {&x, &k}, {}, 2, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (FV{3, 3, 5, 5}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{1, 2, 0, 1}));
  expect_inferred_matches(r);
  EXPECT_EQ(r.inferred[1].str(), "int64[2,2]");
  r = run_op("TopK", {&x, &k}, attrs({{"largest", Int(0)}}), 2);
  EXPECT_EQ(values_f(r.outputs[0]), (FV{1, 2, 0, 5}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{0, 3, 3, 0}));
  Tensor k1 = I64v({1});
  r = run_op("TopK", {&x, &k1}, attrs({{"axis", Int(0)}}), 2);
  EXPECT_EQ(values_f(r.outputs[0]), (FV{5, 5, 5, 2}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{1, 1, 1, 0}));
  Tensor k0 = I64v({0});
  r = run_op("TopK", {&x, &k0}, {}, 2);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 0}));
  Tensor k9 = I64v({9}), kn = I64v({-1});
  EXPECT_FALSE(run_op("TopK", {&x, &k9}, {}, 2).status.ok());
  EXPECT_FALSE(run_op("TopK", {&x, &k9}, {}, 2, {false, true}).status.ok());
  EXPECT_FALSE(run_op("TopK", {&x, &kn}, {}, 2).status.ok());
}

TEST(TopK, RandomAgainstSortAndOpset9) {
  Tensor x = random_tensor({3, 50});
  Tensor k = I64v({7});
  auto r = run_op("TopK", {&x, &k}, {}, 2);
  ASSERT_TRUE(r.status.ok());
  for (int64_t row = 0; row < 3; ++row) {
    std::vector<float> v(x.data<float>() + row * 50, x.data<float>() + row * 50 + 50);
    std::vector<float> sorted = v;
    std::sort(sorted.rbegin(), sorted.rend());
    for (int64_t j = 0; j < 7; ++j) {
      EXPECT_EQ(r.outputs[0].data<float>()[row * 7 + j], sorted[j]);
      EXPECT_EQ(v[r.outputs[1].data<int64_t>()[row * 7 + j]], sorted[j]);
    }
  }
  // Opset 9: k is an attribute, upgraded into input 1.
  Graph g;
  Value* in = g.add_value("x", TensorType::of(x));
  g.add_input(in);
  Node* n = g.add_node("TopK", "n0", {in}, {"v", "i"});
  n->attrs.set("k", Int(3));
  const OpDef* def = find_op("", "TopK");
  ImportContext ic(g, *n, 9);
  ASSERT_TRUE(def->upgrade(ic).ok());
  ASSERT_TRUE(n->input(1) && n->input(1)->is_constant());
  EXPECT_EQ(values_i64(*n->input(1)->constant), (V{3}));
  std::vector<TensorType> types(2);
  InferContext ctx(*n, types);
  ASSERT_TRUE(def->infer(ctx).ok());
  EXPECT_EQ(types[0].str(), "float32[3,3]");
}

// ------------------------------------------------------------------------------ ArgMax, ArgMin
TEST(ArgMax, KeepdimsSelectLastAndDtypes) {
  Tensor x = F32({2, 3}, {1, 5, 5, 7, 2, 7});
  auto r = run_op("ArgMax", {&x}, attrs({{"axis", Int(1)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 1}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 0}));
  expect_inferred_matches(r);
  r = run_op("ArgMax", {&x}, attrs({{"axis", Int(-1)}, {"select_last_index", Int(1)}, {"keepdims", Int(0)}}));
  EXPECT_EQ(r.outputs[0].shape(), (V{2}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2, 2}));
  expect_inferred_matches(r);
  r = run_op("ArgMin", {&x}, {});
  EXPECT_EQ(r.outputs[0].shape(), (V{1, 3}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{0, 1, 0}));
  Tensor u = Tensor::from<uint8_t>({4}, {3, 1, 1, 9});
  r = run_op("ArgMin", {&u}, attrs({{"select_last_index", Int(1)}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2}));
  Tensor big = Tensor::from<int64_t>({2}, {(int64_t{1} << 60) + 1, int64_t{1} << 60});
  r = run_op("ArgMax", {&big}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (V{0}));  // exact for int64, not rounded through double
  Tensor e(DataType::kFloat32, {0, 3});
  EXPECT_FALSE(run_op("ArgMax", {&e}, {}).status.ok());
  r = run_op("ArgMax", {&e}, attrs({{"axis", Int(1)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (V{0, 1}));
  EXPECT_FALSE(run_op("ArgMax", {&x}, attrs({{"axis", Int(2)}})).status.ok());
  EXPECT_EQ(infer_types("ArgMin", {TensorType(DataType::kFloat32, {N, 4})}, attrs({{"keepdims", Int(0)}})).str(),
            "int64[4]");
}

// Compress: numpy.compress along an axis and flattened, a short condition, a long one false past
// the axis, integer and bool data, and the errors.
TEST(Compress, AxesConditionsAndErrors) {
  const Tensor x = Tensor::from<int32_t>({3, 2}, {1, 2, 3, 4, 5, 6});
  auto cond = [](std::vector<bool> v) {
    Tensor c(DataType::kBool, {static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i) c.data<bool>()[i] = v[i];
    return c;
  };
  auto run = [&](const Tensor& data, const Tensor& c, std::optional<int64_t> axis) {
    Attributes a;
    if (axis) a.set("axis", Attribute::Int(*axis));
    return run_op("Compress", {&data, &c}, a);
  };
  const Tensor c01 = cond({false, true, true});
  OpRun r = run(x, c01, 0);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 2}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{3, 4, 5, 6}));
  const Tensor c1 = cond({false, true});
  r = run(x, c1, -1);
  EXPECT_EQ(values_i64(r.outputs[0]), (V{2, 4, 6}));
  r = run(x, c1, 1);
  EXPECT_EQ(r.outputs[0].shape(), (V{3, 1}));
  const Tensor flat =
      cond({true, false, false, false, true, false, false, false});  // long, false tail
  r = run(x, flat, std::nullopt);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 5}));
  const Tensor none = cond({false, false});
  EXPECT_EQ(run(x, none, 0).outputs[0].shape(), (V{0, 2}));
  const Tensor b = cond({true, false, true});
  EXPECT_EQ(run(b, cond({true, true, false}), std::nullopt).outputs[0].shape(), (V{2}));
  expect_error(run(x, cond({false, false, false, true}), 0), "past the axis of size 3");
  expect_error(run(x, c01, 2), "axis");
  const Tensor not_bool = Tensor::from<int32_t>({2}, {1, 0});
  expect_error(run(x, not_bool, 0), "condition must be bool");
}

// Unique: the four outputs sorted and in first-occurrence order, slices along an axis (a
// negative one), NaN equal to NaN and last, bool and uint64, and a bad axis.
TEST(Unique, SortedUnsortedAxesAndNaN) {
  auto run = [](const Tensor& x, Attributes a) { return run_op("Unique", {&x}, a, 4); };
  const Tensor x = F32({6}, {2, 1, 1, 3, 4, 3});
  OpRun r = run(x, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (FV{1, 2, 3, 4}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{1, 0, 3, 4}));
  EXPECT_EQ(values_i64(r.outputs[2]), (V{1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(values_i64(r.outputs[3]), (V{2, 1, 2, 1}));
  r = run(x, attrs({{"sorted", Int(0)}}));
  EXPECT_EQ(values_f(r.outputs[0]), (FV{2, 1, 3, 4}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{0, 1, 3, 4}));
  EXPECT_EQ(values_i64(r.outputs[2]), (V{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(values_i64(r.outputs[3]), (V{1, 2, 2, 1}));
  // Columns of a [2, 4]: (1,5) (0,4) (1,5) (0,3); sorted: (0,3) (0,4) (1,5).
  const Tensor m = Tensor::from<int64_t>({2, 4}, {1, 0, 1, 0, 5, 4, 5, 3});
  r = run(m, attrs({{"axis", Int(-1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (V{2, 3}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{0, 0, 1, 3, 4, 5}));
  EXPECT_EQ(values_i64(r.outputs[1]), (V{3, 1, 0}));
  EXPECT_EQ(values_i64(r.outputs[2]), (V{2, 1, 2, 0}));
  EXPECT_EQ(values_i64(r.outputs[3]), (V{1, 1, 2}));
  r = run(m, attrs({{"axis", Int(1)}, {"sorted", Int(0)}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (V{1, 0, 0, 5, 4, 3}));
  EXPECT_EQ(values_i64(r.outputs[2]), (V{0, 1, 0, 2}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  r = run(F32({4}, {nan, 1, nan, 0}), {});
  ASSERT_EQ(r.outputs[0].numel(), 3);
  EXPECT_EQ(r.outputs[0].at_double(0), 0.0);
  EXPECT_TRUE(std::isnan(r.outputs[0].at_double(2)));
  EXPECT_EQ(values_i64(r.outputs[3]), (V{1, 1, 2}));
  Tensor b(DataType::kBool, {3});
  b.data<bool>()[0] = true, b.data<bool>()[1] = false, b.data<bool>()[2] = true;
  EXPECT_EQ(run(b, {}).outputs[0].numel(), 2);
  const Tensor big = Tensor::from<uint64_t>({3}, {~uint64_t{0}, ~uint64_t{0} - 1, ~uint64_t{0}});
  EXPECT_EQ(values_i64(run(big, {}).outputs[3]), (V{1, 2}));  // no rounding through double
  const Tensor empty(DataType::kFloat32, {0});
  EXPECT_EQ(run(empty, {}).outputs[0].numel(), 0);
  expect_error(run(m, attrs({{"axis", Int(2)}})), "axis");
}

}  // namespace
}  // namespace kiln::test
