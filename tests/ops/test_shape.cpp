// Shape family: Reshape, Shape, Size, Flatten, Squeeze, Unsqueeze, Transpose, Concat, Split,
// Slice, Expand, Tile, Identity, Dropout, Constant, ConstantOfShape, Range. Known values, opset
// upgrade paths, symbolic shape inference, dtypes, empty tensors and errors.
#include <limits>

#include "op_test_util.h"
#include "ops/shape_values.h"

namespace kiln::test {
namespace {

TensorType T(DataType t, std::vector<Dim> d) { return TensorType(t, std::move(d)); }
const Dim N = Dim::sym("N");
constexpr auto F = DataType::kFloat32;

// ------------------------------------------------------------------------------ Reshape
TEST(Reshape, MinusOneAndZeroCopy) {
  Tensor x = iota_f({2, 3, 4}), s = I64v({0, -1});
  auto r = run_op("Reshape", {&x, &s}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
  expect_inferred_matches(r);
  EXPECT_EQ(r.inferred[0].str(), "float32[2,12]");
}

TEST(Reshape, AllowZeroKeepsLiteralZero) {
  Tensor x(DataType::kFloat32, {0, 3}), s = I64v({3, 0});
  auto r = run_op("Reshape", {&x, &s}, attrs({{"allowzero", Int(1)}}), 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 0}));
  // Without allowzero the 0 copies dim 1 (3): [3,3] has 9 elements, not 0.
  EXPECT_FALSE(run_op("Reshape", {&x, &s}, {}, 1, {false, true}).status.ok());
  // allowzero with -1 is ambiguous.
  Tensor s2 = I64v({0, -1});
  EXPECT_FALSE(run_op("Reshape", {&x, &s2}, attrs({{"allowzero", Int(1)}})).status.ok());
}

TEST(Reshape, Errors) {
  Tensor x = iota_f({2, 3}), two = I64v({-1, -1}), bad = I64v({4, 2}), neg = I64v({-2, 3});
  EXPECT_FALSE(run_op("Reshape", {&x, &two}, {}).status.ok());
  EXPECT_FALSE(run_op("Reshape", {&x, &bad}, {}).status.ok());
  EXPECT_FALSE(run_op("Reshape", {&x, &bad}, {}, 1, {false, true}).status.ok());
  EXPECT_FALSE(run_op("Reshape", {&x, &neg}, {}).status.ok());
}

TEST(Reshape, SymbolicInference) {
  auto t = infer("Reshape", {T(F, {N, 3, 4}), I64v({0, -1})}, {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].str(), "float32[N,12]");
  t = infer("Reshape", {T(F, {N, 3, 4}), I64v({0, 3, 2, 2})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,3,2,2]");
  t = infer("Reshape", {T(F, {N, 3, 4}), I64v({-1, 4})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[3*N,4]");  // a compound symbol (ops/shape_values.h)
  t = infer("Reshape", {T(F, {N, 1}), I64v({-1})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N]");
  // Non-constant shape of known length: known rank, unknown dims.
  t = infer("Reshape", {T(F, {N, 3, 4}), T(DataType::kInt64, {3})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[?,?,?]");
}

TEST(Reshape, Opset4ShapeAttribute) {
  Tensor x = iota_f({2, 3});
  auto r = run_imported("Reshape", {&x}, attrs({{"shape", Ints({3, -1})}}), 4);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(r.inferred[0].str(), "float32[3,2]");
}

// ------------------------------------------------------------------------------ Shape, Size
TEST(Shape, StartEnd) {
  Tensor x(DataType::kFloat16, {2, 3, 4, 5});
  auto r = run_op("Shape", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{2, 3, 4, 5}));
  r = run_op("Shape", {&x}, attrs({{"start", Int(1)}, {"end", Int(-1)}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{3, 4}));
  expect_inferred_matches(r);
  r = run_op("Shape", {&x}, attrs({{"start", Int(-10)}, {"end", Int(10)}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{2, 3, 4, 5}));
  r = run_op("Shape", {&x}, attrs({{"start", Int(3)}, {"end", Int(1)}}));
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0}));
  expect_inferred_matches(r);
  auto t = infer("Shape", {T(F, {N, 3})}, {});
  EXPECT_EQ((*t)[0].str(), "int64[2]");
}

TEST(Size, CountsElements) {
  Tensor x(DataType::kBool, {2, 0, 3}), y = iota_f({3, 4});
  auto r = run_op("Size", {&x}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{0}));
  r = run_op("Size", {&y}, {});
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{12}));
  EXPECT_EQ(r.outputs[0].rank(), 0);
  expect_inferred_matches(r);
}

// ------------------------------------------------------------------------------ Flatten
TEST(Flatten, Axes) {
  Tensor x = iota_f({2, 3, 4});
  for (auto [axis, a, b] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {0, 1, 24}, {1, 2, 12}, {3, 24, 1}, {-1, 6, 4}, {-3, 1, 24}}) {
    auto r = run_op("Flatten", {&x}, attrs({{"axis", Int(axis)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{a, b})) << axis;
    EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
    expect_inferred_matches(r);
  }
  EXPECT_FALSE(run_op("Flatten", {&x}, attrs({{"axis", Int(4)}})).status.ok());
  EXPECT_FALSE(run_op("Flatten", {&x}, attrs({{"axis", Int(-4)}})).status.ok());
  auto t = infer("Flatten", {T(F, {N, 3, 4})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,12]");
  t = infer("Flatten", {T(F, {2, N, 4})}, attrs({{"axis", Int(2)}}));
  EXPECT_EQ((*t)[0].str(), "float32[2*N,4]");
}

// ------------------------------------------------------------------------------ Squeeze
TEST(Squeeze, AxesInputNegativeAndAll) {
  Tensor x = iota_f({1, 3, 1, 2}), ax = I64v({-2});
  auto r = run_op("Squeeze", {&x, &ax}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 3, 2}));
  expect_inferred_matches(r);
  r = run_op("Squeeze", {&x}, {});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(r.inferred[0].str(), "float32[3,2]");
  Tensor bad = I64v({1});
  EXPECT_FALSE(run_op("Squeeze", {&x, &bad}, {}).status.ok());
  EXPECT_FALSE(run_op("Squeeze", {&x, &bad}, {}, 1, {false, true}).status.ok());
  Tensor dup = I64v({0, -4});
  EXPECT_FALSE(run_op("Squeeze", {&x, &dup}, {}).status.ok());
}

TEST(Squeeze, Opset11AxesAttribute) {
  Tensor x = iota_f({1, 3, 1});
  auto r = run_imported("Squeeze", {&x}, attrs({{"axes", Ints({0})}}), 11);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 1}));
  auto t = infer("Squeeze", {T(F, {N, 1, 3}), I64v({1})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,3]");
  t = infer("Squeeze", {T(F, {N, 1, 3})}, {});  // N may be 1: rank unknown
  EXPECT_FALSE((*t)[0].has_rank());
}

// ------------------------------------------------------------------------------ Unsqueeze
TEST(Unsqueeze, Axes) {
  Tensor x = iota_f({3, 4}), ax = I64v({0, -1});
  auto r = run_op("Unsqueeze", {&x, &ax}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1, 3, 4, 1}));
  expect_inferred_matches(r);
  Tensor s = Tensor::scalar<int32_t>(7), a0 = I64v({0});
  r = run_op("Unsqueeze", {&s, &a0}, {});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{1}));
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{7}));
  Tensor dup = I64v({1, 1}), out = I64v({3});
  EXPECT_FALSE(run_op("Unsqueeze", {&x, &dup}, {}).status.ok());
  EXPECT_FALSE(run_op("Unsqueeze", {&x, &out}, {}).status.ok());
  r = run_imported("Unsqueeze", {&x}, attrs({{"axes", Ints({1})}}), 11);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 1, 4}));
  auto t = infer("Unsqueeze", {T(F, {N, 3}), I64v({1})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,1,3]");
}

// ------------------------------------------------------------------------------ Transpose
TEST(Transpose, DefaultReversesAndRandomPerm) {
  Tensor x = iota_f({2, 3});
  auto r = run_op("Transpose", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor y = random_tensor({2, 3, 4, 5});
  std::vector<int64_t> perm = {2, 0, 3, 1};
  r = run_op("Transpose", {&y}, attrs({{"perm", Ints(perm)}}));
  ASSERT_TRUE(r.status.ok());
  expect_inferred_matches(r);
  const Tensor& o = r.outputs[0];
  ASSERT_EQ(o.shape(), (std::vector<int64_t>{4, 2, 5, 3}));
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 5; ++c)
        for (int64_t d = 0; d < 3; ++d)
          // out[a,b,c,d] = y[b, d, a, c]
          EXPECT_EQ(o.at_double(((a * 2 + b) * 5 + c) * 3 + d), y.at_double(((b * 3 + d) * 4 + a) * 5 + c));
  Tensor z = Tensor::from<int64_t>({2, 2}, {1, 2, 3, 4});
  r = run_op("Transpose", {&z}, attrs({{"perm", Ints({1, 0})}}));
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{1, 3, 2, 4}));
  EXPECT_FALSE(run_op("Transpose", {&z}, attrs({{"perm", Ints({0, 0})}})).status.ok());
  EXPECT_FALSE(run_op("Transpose", {&z}, attrs({{"perm", Ints({0})}})).status.ok());
  auto t = infer("Transpose", {T(F, {N, 3, 4})}, attrs({{"perm", Ints({0, 2, 1})}}));
  EXPECT_EQ((*t)[0].str(), "float32[N,4,3]");
}

// ------------------------------------------------------------------------------ Concat
TEST(Concat, NegativeAxisEmptyAndDtypes) {
  Tensor a = iota_f({2, 1}), b(DataType::kFloat32, {2, 0}), c = F32({2, 2}, {7, 8, 9, 10});
  auto r = run_op("Concat", {&a, &b, &c}, attrs({{"axis", Int(-1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{0, 7, 8, 1, 9, 10}));
  expect_inferred_matches(r);
  Tensor p = Tensor::from<bool>({1, 2}, {true, false}), q = Tensor::from<bool>({2, 2}, {false, true, true, true});
  r = run_op("Concat", {&p, &q}, attrs({{"axis", Int(0)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{1, 0, 0, 1, 1, 1}));
  Tensor bad = iota_f({3, 1});
  EXPECT_FALSE(run_op("Concat", {&a, &bad}, attrs({{"axis", Int(1)}})).status.ok());
  EXPECT_FALSE(run_op("Concat", {&a, &p}, attrs({{"axis", Int(0)}})).status.ok());
  EXPECT_FALSE(run_op("Concat", {&a, &c}, {}).status.ok());  // axis is required
  auto t = infer("Concat", {T(F, {N, 3}), T(F, {N, 5})}, attrs({{"axis", Int(1)}}));
  EXPECT_EQ((*t)[0].str(), "float32[N,8]");
  t = infer("Concat", {T(F, {N, 3}), T(F, {2, 3})}, attrs({{"axis", Int(0)}}));
  EXPECT_EQ((*t)[0].str(), "float32[N+2,3]");  // a sum of sizes (ops/shape_values.h)
  t = infer("Concat", {I64v({1, 2}), I64v({3})}, attrs({{"axis", Int(0)}}));
  EXPECT_EQ((*t)[0].str(), "int64[3]");
}

// Symbolic sums and differences (a KV cache: the past and the new tokens): canonical whatever
// the order or spacing they are written in, so a computed "past+seq" is the declared
// "seq + past"; past + seq - past is seq; products distribute; a difference that may be
// negative is not a size.
TEST(SymbolicDims, SumsAndDifferences) {
  const Dim past = Dim::sym("past"), seq = Dim::sym("seq");
  const Dim total = add_dims(past, seq);
  EXPECT_EQ(total.str(), "past+seq");
  EXPECT_TRUE(same_dim(total, Dim::sym("seq + past")));
  EXPECT_FALSE(same_dim(total, seq));
  EXPECT_EQ(sub_dims(total, past).str(), "seq");
  EXPECT_EQ(sub_dims(seq, seq).str(), "0");
  const Dim twice = mul_dims(Dim(2), total);
  EXPECT_EQ(twice.str(), "2*past+2*seq");
  EXPECT_EQ(div_dims(twice, Dim(2)).str(), "past+seq");
  EXPECT_EQ(div_dims(total, Dim(2)).str(), "?");  // past + seq may be odd
  // By a sum: a monomial multiple of it (a KV cache's length, as written and as inferred).
  EXPECT_EQ(div_dims(total, Dim::sym("past + seq")).str(), "1");
  EXPECT_EQ(div_dims(twice, total).str(), "2");
  const Dim batch_total = mul_dims(mul_dims(Dim::sym("B"), Dim(3)), total);
  EXPECT_EQ(div_dims(batch_total, total).str(), "3*B");
  EXPECT_EQ(div_dims(total, batch_total).str(), "?");
  EXPECT_EQ(div_dims(add_dims(total, Dim(1)), total).str(), "?");
  EXPECT_EQ(div_dims(add_dims(twice, seq), total).str(), "?");  // 2*past + 3*seq
  EXPECT_TRUE(nonnegative_dim(total));
  const Dim less = sub_dims(Dim(3), seq);
  EXPECT_EQ(less.str(), "-seq+3");
  EXPECT_FALSE(nonnegative_dim(less));
  EXPECT_EQ(add_dims(Dim(3), Dim()).str(), "?");
  // Products of sums stop growing: (a + b)^16 would have 17 terms.
  Dim power = add_dims(Dim::sym("a"), Dim::sym("b"));
  for (int i = 0; i < 4; ++i) power = mul_dims(power, power);
  EXPECT_EQ(power.str(), "?");
  // A KV cache's concatenation, and the positions Range(past, past + seq, 1) of the new tokens.
  auto t = infer("Concat", {T(F, {N, 4, past, 16}), T(F, {N, 4, seq, 16})}, attrs({{"axis", Int(2)}}));
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].str(), "float32[N,4,past+seq,16]");
  Graph g;
  Value* cache = g.add_value("cache", T(F, {N, 4, past, 16}));
  Value* ids = g.add_value("ids", T(DataType::kInt64, {N, seq}));
  g.add_input(cache);
  g.add_input(ids);
  Value* p = g.add_node("Gather", "p", {g.add_node("Shape", "sc", {cache}, {"sc"})->output(0),
                                        g.add_constant("two", Tensor::scalar<int64_t>(2))}, {"p"})->output(0);
  Value* s = g.add_node("Gather", "s", {g.add_node("Shape", "si", {ids}, {"si"})->output(0),
                                        g.add_constant("one", Tensor::scalar<int64_t>(1))}, {"s"})->output(0);
  Value* end = g.add_node("Add", "end", {p, s}, {"end"})->output(0);
  Node* range = g.add_node("Range", "pos", {p, end, g.add_constant("step", Tensor::scalar<int64_t>(1))}, {"pos"});
  g.add_output(range->output(0));
  ASSERT_TRUE(infer_shapes(g).ok());
  EXPECT_EQ(range->output(0)->type.str(), "int64[seq]");
}

TEST(Concat, Opset1DefaultAxisIsOne) {
  Tensor a = iota_f({2, 1}), b = iota_f({2, 2});
  auto r = run_imported("Concat", {&a, &b}, {}, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3}));
}

// ------------------------------------------------------------------------------ Split
TEST(Split, SplitInputEqualAndNumOutputs) {
  Tensor x = iota_f({2, 6}), s = I64v({2, 4});
  auto r = run_op("Split", {&x, &s}, attrs({{"axis", Int(-1)}}), 2, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{0, 1, 6, 7}));
  EXPECT_EQ(values_f(r.outputs[1]), (std::vector<float>{2, 3, 4, 5, 8, 9, 10, 11}));
  expect_inferred_matches(r);
  r = run_op("Split", {&x}, attrs({{"axis", Int(1)}}), 3);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[2]), (std::vector<float>{4, 5, 10, 11}));
  expect_inferred_matches(r);
  Tensor y = iota_f({7});
  r = run_op("Split", {&y}, attrs({{"num_outputs", Int(3)}}), 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(values_f(r.outputs[2]), (std::vector<float>{6}));
  expect_inferred_matches(r);
  // Legacy equal split must divide evenly; split sizes must sum to the axis length.
  EXPECT_FALSE(run_op("Split", {&y}, {}, 3).status.ok());
  Tensor bad = I64v({2, 2});
  EXPECT_FALSE(run_op("Split", {&x, &bad}, attrs({{"axis", Int(1)}}), 2).status.ok());
  EXPECT_FALSE(run_op("Split", {&y}, attrs({{"num_outputs", Int(2)}}), 3).status.ok());
}

TEST(Split, ZeroSizesAndOpset11Attribute) {
  Tensor x(DataType::kInt64, {0}), s = I64v({0, 0, 0});
  auto r = run_op("Split", {&x, &s}, {}, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  for (auto& o : r.outputs) EXPECT_EQ(o.shape(), (std::vector<int64_t>{0}));
  Tensor y = iota_f({5, 2});
  r = run_imported("Split", {&y}, attrs({{"split", Ints({1, 4})}}), 11, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[1].shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(r.inferred[1].str(), "float32[4,2]");
  auto t = infer("Split", {T(F, {N, 6})}, attrs({{"axis", Int(1)}}), 2);
  EXPECT_EQ((*t)[1].str(), "float32[N,3]");
}

// ------------------------------------------------------------------------------ Slice
// out[i] = x[start + i*step] along each axis, the spec's clamping done by hand per case.
TEST(Slice, KnownCases) {
  Tensor x = iota_f({3, 4});
  Tensor st = I64v({1, 3}), en = I64v({3, 0}), ax = I64v({0, 1}), sp = I64v({1, -2});
  auto r = run_op("Slice", {&x, &st, &en, &ax, &sp}, {}, 1, {false, true, true, true, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{7, 5, 11, 9}));
  expect_inferred_matches(r);
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  // Huge ends clamp; axes omitted; negative start counts from the end.
  Tensor st2 = I64v({-2}), en2 = I64v({big});
  r = run_op("Slice", {&x, &st2, &en2}, {});
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  // Full reverse with INT_MIN end.
  Tensor st3 = I64v({big}), en3 = I64v({small}), ax3 = I64v({-1}), sp3 = I64v({-1});
  r = run_op("Slice", {&x, &st3, &en3, &ax3, &sp3}, {}, 1, {false, true, true, true, true});
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8}));
  expect_inferred_matches(r);
  // Start beyond the end: empty.
  Tensor st4 = I64v({1000}), en4 = I64v({1000});
  r = run_op("Slice", {&x, &st4, &en4, &ax3}, {}, 1, {false, true, true, true});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 0}));
  expect_inferred_matches(r);
  // Negative step over an empty axis.
  Tensor e(DataType::kFloat32, {3, 0});
  r = run_op("Slice", {&e, &st3, &en3, &ax3, &sp3}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 0}));
  // Huge step.
  Tensor sp5 = I64v({big}), st5 = I64v({0}), en5 = I64v({big});
  r = run_op("Slice", {&x, &st5, &en5, &ax3, &sp5}, {});
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{0, 4, 8}));
  Tensor sp6 = I64v({small}), st6 = I64v({-1}), en6 = I64v({small});
  r = run_op("Slice", {&x, &st6, &en6, &ax3, &sp6}, {});
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{3, 7, 11}));
}

TEST(Slice, RandomAgainstNaive) {
  std::mt19937 rng(std::random_device{}());
  Tensor x = random_tensor({5, 7});
  for (int it = 0; it < 200; ++it) {
    std::uniform_int_distribution<int64_t> v(-9, 9), s(-3, 3);
    int64_t step = s(rng);
    if (step == 0) step = 1;
    const int64_t start = v(rng), end = v(rng), axis = it % 2;
    Tensor ts = I64v({start}), te = I64v({end}), ta = I64v({axis}), tp = I64v({step});
    auto r = run_op("Slice", {&x, &ts, &te, &ta, &tp}, {}, 1, {false, true, true, true, true});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    // The spec's clamping (which differs from Python's for a negative step and a start before
    // the beginning: the spec clamps it to 0 and picks element 0).
    const int64_t dim = x.shape()[axis];
    std::vector<int64_t> picks;
    int64_t b = start < 0 ? start + dim : start, e = end < 0 ? end + dim : end;
    if (step > 0) {
      b = std::clamp<int64_t>(b, 0, dim), e = std::clamp<int64_t>(e, 0, dim);
      for (int64_t i = b; i < e; i += step) picks.push_back(i);
    } else {
      b = std::clamp<int64_t>(b, 0, dim - 1), e = std::clamp<int64_t>(e, -1, dim - 1);
      for (int64_t i = b; i > e; i += step) picks.push_back(i);
    }
    ASSERT_EQ(r.outputs[0].shape()[axis], static_cast<int64_t>(picks.size()));
    const Tensor& o = r.outputs[0];
    for (int64_t i = 0; i < o.numel(); ++i) {
      const int64_t row = i / o.shape()[1], col = i % o.shape()[1];
      const int64_t sr = axis == 0 ? picks[row] : row, sc = axis == 1 ? picks[col] : col;
      ASSERT_EQ(o.at_double(i), x.at_double(sr * 7 + sc));
    }
  }
}

TEST(Slice, ErrorsUpgradeAndSymbolic) {
  Tensor x = iota_f({3, 4}), st = I64v({0}), en = I64v({2}), ax = I64v({0}), zero = I64v({0});
  EXPECT_FALSE(run_op("Slice", {&x, &st, &en, &ax, &zero}, {}).status.ok());
  Tensor ax2 = I64v({2}), dup = I64v({0, -2}), st2 = I64v({0, 0}), en2 = I64v({1, 1});
  EXPECT_FALSE(run_op("Slice", {&x, &st, &en, &ax2}, {}).status.ok());
  EXPECT_FALSE(run_op("Slice", {&x, &st2, &en2, &dup}, {}).status.ok());
  EXPECT_FALSE(run_op("Slice", {&x, &st2, &en}, {}).status.ok());
  auto r = run_imported(
      "Slice", {&x}, attrs({{"starts", Ints({1})}, {"ends", Ints({-1})}, {"axes", Ints({1})}}), 9);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(r.inferred[0].str(), "float32[3,2]");
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto t = infer("Slice", {T(F, {N, 8}), I64v({0, 2}), I64v({big, 6})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,4]");
  t = infer("Slice", {T(F, {N, 8}), I64v({1}), I64v({big})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[?,8]");
  t = infer("Slice", {T(F, {N, 8}), T(DataType::kInt64, {1}), I64v({3})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[?,?]");
}

// ------------------------------------------------------------------------------ Expand, Tile
TEST(Expand, BidirectionalBroadcast) {
  Tensor x = F32({3, 1}, {1, 2, 3}), s = I64v({2, 1, 2});
  auto r = run_op("Expand", {&x, &s}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
  expect_inferred_matches(r);
  Tensor s1 = I64v({1, 1});  // smaller target: keeps the input shape
  r = run_op("Expand", {&x, &s1}, {});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 1}));
  Tensor bad = I64v({2, 1});
  EXPECT_FALSE(run_op("Expand", {&x, &bad}, {}).status.ok());
  Tensor b = Tensor::from<bool>({}, {true}), s0 = I64v({2, 0});
  r = run_op("Expand", {&b, &s0}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 0}));
  auto t = infer("Expand", {T(F, {N, 1}), I64v({1, 5})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,5]");
}

TEST(Tile, Repeats) {
  Tensor x = Tensor::from<int16_t>({2, 2}, {1, 2, 3, 4}), rep = I64v({2, 3});
  auto r = run_op("Tile", {&x, &rep}, {}, 1, {false, true});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{4, 6}));
  const std::vector<int64_t> row0 = {1, 2, 1, 2, 1, 2}, row1 = {3, 4, 3, 4, 3, 4};
  auto v = values_i64(r.outputs[0]);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(std::vector<int64_t>(v.begin() + i * 6, v.begin() + i * 6 + 6), i % 2 ? row1 : row0);
  expect_inferred_matches(r);
  Tensor r0 = I64v({0, 1});
  r = run_op("Tile", {&x, &r0}, {});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 2}));
  Tensor bad = I64v({2}), neg = I64v({-1, 1});
  EXPECT_FALSE(run_op("Tile", {&x, &bad}, {}).status.ok());
  EXPECT_FALSE(run_op("Tile", {&x, &neg}, {}).status.ok());
  auto t = infer("Tile", {T(F, {N, 3}), I64v({1, 2})}, {});
  EXPECT_EQ((*t)[0].str(), "float32[N,6]");
}

// ------------------------------------------------------------------------------ Identity, Dropout
TEST(Dropout, InferenceAndTraining) {
  Tensor x = random_tensor({2, 3});
  auto r = run_op("Identity", {&x}, {});
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
  r = run_op("Dropout", {&x}, {}, 2);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
  EXPECT_EQ(r.outputs[1].dtype(), DataType::kBool);
  EXPECT_EQ(values_i64(r.outputs[1]), std::vector<int64_t>(6, 1));
  expect_inferred_matches(r);
  Tensor ratio = Tensor::scalar<float>(0.3f), on = Tensor::scalar<bool>(true), zero = Tensor::scalar<float>(0.f);
  r = run_op("Dropout", {&x, &ratio, &on}, {}, 2);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("training"), std::string::npos);
  r = run_op("Dropout", {&x, nullptr, &on}, {});
  EXPECT_FALSE(r.status.ok());
  r = run_op("Dropout", {&x, &zero, &on}, {}, 2);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
}

TEST(Dropout, OldOpsets) {
  Tensor x = random_tensor({4});
  auto r = run_imported("Dropout", {&x}, attrs({{"ratio", Attribute::Float(0.2f)}}), 11, 2);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), values_f(x));
  EXPECT_EQ(r.outputs[1].dtype(), DataType::kBool);
  r = run_imported("Dropout", {&x}, {}, 9, 2);  // mask has the data type before opset 10
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[1].dtype(), DataType::kFloat32);
  EXPECT_EQ(values_f(r.outputs[1]), std::vector<float>(4, 1.f));
  expect_inferred_matches(r);
  r = run_imported("Dropout", {&x}, attrs({{"is_test", Int(1)}}), 6);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  r = run_imported("Dropout", {&x}, {}, 6);  // is_test = 0: training dropout
  EXPECT_FALSE(r.status.ok());
}

// ------------------------------------------------------------------------------ Constant*
TEST(Constant, Variants) {
  auto r = run_op("Constant", {}, attrs({{"value_floats", Attribute::Floats({1.5f, 2.f})}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{1.5f, 2.f}));
  expect_inferred_matches(r);
  r = run_op("Constant", {}, attrs({{"value_int", Int(3)}}));
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt64);
  EXPECT_EQ(r.outputs[0].rank(), 0);
  r = run_op("Constant", {}, attrs({{"value", Attribute::TensorValue(Tensor::from<uint8_t>({2}, {5, 6}))}}));
  EXPECT_EQ(r.inferred[0].str(), "uint8[2]");
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{5, 6}));
  r = run_op("Constant", {}, attrs({{"value_string", Attribute::String("a")}}));
  EXPECT_NE(r.status.message().find("string"), std::string::npos);
  r = run_op("Constant", {}, attrs({{"sparse_value", Int(0)}}));
  EXPECT_NE(r.status.message().find("sparse"), std::string::npos);
  EXPECT_FALSE(run_op("Constant", {}, {}).status.ok());
}

// EyeLike: diagonals above and below, k past either edge, dtype, every allowed type, errors.
TEST(EyeLike, DiagonalsTypesAndErrors) {
  const Tensor x = Tensor::from<float>({3, 4}, std::vector<float>(12, 7.0f));
  auto eye = [&](const Tensor& in, Attributes a) { return run_op("EyeLike", {&in}, a); };
  OpRun r = eye(x, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values_scaled(r.outputs[0], {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  r = eye(x, attrs({{"k", Attribute::Int(2)}}));
  expect_values_scaled(r.outputs[0], {0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0});
  r = eye(x, attrs({{"k", Attribute::Int(-1)}, {"dtype", Attribute::Int(7)}}));  // int64
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt64);
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0}));
  for (int64_t k : {int64_t{4}, int64_t{-3}, std::numeric_limits<int64_t>::min(),
                    std::numeric_limits<int64_t>::max()}) {
    r = eye(x, attrs({{"k", Attribute::Int(k)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_values_scaled(r.outputs[0], std::vector<double>(12, 0.0));
  }
  for (DataType t : {DataType::kBool, DataType::kUInt8, DataType::kInt16, DataType::kUInt64,
                     DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    const Tensor xt = x.cast(t);
    r = eye(xt, {});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    EXPECT_EQ(r.outputs[0].at_double(5), 1.0);
  }
  const Tensor empty(DataType::kFloat32, {0, 3});
  EXPECT_EQ(eye(empty, {}).outputs[0].shape(), (std::vector<int64_t>{0, 3}));
  const Tensor v = Tensor::from<float>({3}, {1, 2, 3});
  expect_error(eye(v, {}), "must be 2-D");
  expect_error(eye(x, attrs({{"dtype", Attribute::Int(8)}})), "dtype 8");  // string
}

TEST(ConstantOfShape, ValuesAndShapes) {
  Tensor s = I64v({2, 3});
  auto r = run_op("ConstantOfShape", {&s}, {}, 1, {true});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.inferred[0].str(), "float32[2,3]");
  EXPECT_EQ(values_f(r.outputs[0]), std::vector<float>(6, 0.f));
  r = run_op("ConstantOfShape", {&s}, attrs({{"value", Attribute::TensorValue(I64v({7}))}}));
  EXPECT_EQ(values_i64(r.outputs[0]), std::vector<int64_t>(6, 7));
  Tensor empty(DataType::kInt64, {0});
  r = run_op("ConstantOfShape", {&empty}, attrs({{"value", Attribute::TensorValue(Tensor::from<bool>({1}, {true}))}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].rank(), 0);
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{1}));
  expect_inferred_matches(r);
  Tensor z = I64v({0, 4}), neg = I64v({-1});
  r = run_op("ConstantOfShape", {&z}, {});
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 4}));
  EXPECT_FALSE(run_op("ConstantOfShape", {&neg}, {}).status.ok());
}

TEST(Range, FloatIntNegativeEmpty) {
  auto run = [](const Tensor& a, const Tensor& b, const Tensor& c, bool consts) {
    return run_op("Range", {&a, &b, &c}, {}, 1, {consts, consts, consts});
  };
  auto r = run(Tensor::scalar<float>(1), Tensor::scalar<float>(2), Tensor::scalar<float>(0.3f), true);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.inferred[0].str(), "float32[4]");
  auto v = values_f(r.outputs[0]);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_NEAR(v[3], 1.9f, 1e-6);
  r = run(Tensor::scalar<int32_t>(10), Tensor::scalar<int32_t>(4), Tensor::scalar<int32_t>(-3), false);
  EXPECT_EQ(values_i64(r.outputs[0]), (std::vector<int64_t>{10, 7}));
  EXPECT_EQ(r.inferred[0].str(), "int32[?]");
  r = run(Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(2), true);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0}));
  r = run(Tensor::scalar<double>(0), Tensor::scalar<double>(-1), Tensor::scalar<double>(0.25), false);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0}));
  EXPECT_FALSE(run(Tensor::scalar<int64_t>(0), Tensor::scalar<int64_t>(5), Tensor::scalar<int64_t>(0), false).status.ok());
  EXPECT_FALSE(run(Tensor::scalar<int64_t>(0), Tensor::scalar<int32_t>(5), Tensor::scalar<int64_t>(1), false).status.ok());
  EXPECT_FALSE(run(Tensor::scalar<uint8_t>(0), Tensor::scalar<uint8_t>(5), Tensor::scalar<uint8_t>(1), false).status.ok());
}

}  // namespace
}  // namespace kiln::test
