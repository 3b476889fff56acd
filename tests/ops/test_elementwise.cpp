// Tests of the elementwise family: unary math, binary arithmetic and comparison, logic,
// variadic ops, Pow, BitShift, Cast/CastLike, Clip, Where, and the opset upgrades.
#include <cmath>
#include <limits>
#include <random>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

using DT = DataType;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

OpRun run1(const std::string& op, const Tensor& x, const Attributes& a = {}) {
  return run_op(op, {&x}, a);
}
OpRun run2(const std::string& op, const Tensor& x, const Tensor& y, const Attributes& a = {}) {
  return run_op(op, {&x, &y}, a);
}

// ---------------------------------------------------------------------------------------------
struct UnaryCase {
  const char* op;
  double (*fn)(double);
  float lo, hi;
};

TEST(ElementwiseUnary, FloatOpsMatchFormulaInAllFloatTypes) {
  const UnaryCase cases[] = {
      {"Exp", [](double x) { return std::exp(x); }, -3, 3},
      {"Log", [](double x) { return std::log(x); }, 0.1f, 5},
      {"Sqrt", [](double x) { return std::sqrt(x); }, 0.1f, 5},
      {"Reciprocal", [](double x) { return 1 / x; }, 0.5f, 4},
      {"Floor", [](double x) { return std::floor(x); }, -5, 5},
      {"Ceil", [](double x) { return std::ceil(x); }, -5, 5},
      {"Sin", [](double x) { return std::sin(x); }, -4, 4},
      {"Cos", [](double x) { return std::cos(x); }, -4, 4},
      {"Tan", [](double x) { return std::tan(x); }, -1, 1},
      {"Asin", [](double x) { return std::asin(x); }, -0.9f, 0.9f},
      {"Acos", [](double x) { return std::acos(x); }, -0.9f, 0.9f},
      {"Atan", [](double x) { return std::atan(x); }, -3, 3},
      {"Sinh", [](double x) { return std::sinh(x); }, -2, 2},
      {"Cosh", [](double x) { return std::cosh(x); }, -2, 2},
      {"Asinh", [](double x) { return std::asinh(x); }, -2, 2},
      {"Acosh", [](double x) { return std::acosh(x); }, 1.1f, 4},
      {"Atanh", [](double x) { return std::atanh(x); }, -0.9f, 0.9f},
      {"Erf", [](double x) { return std::erf(x); }, -2, 2},
      {"Abs", [](double x) { return std::fabs(x); }, -3, 3},
      {"Neg", [](double x) { return -x; }, -3, 3},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op);
    // Floor/Ceil of a value rounded into a 16-bit float compare exactly with the rounded input.
    expect_unary_formula(c.op, random_tensor({2, 3, 4}, c.lo, c.hi), {}, c.fn,
                         {1e-12, 1e-6, 2e-3, 1e-2});
  }
}

TEST(ElementwiseUnary, RoundIsHalfToEven) {
  OpRun r = run1("Round", F32({8}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.4f, 2.6f, -2.6f}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values_scaled(r.outputs[0], {0, 2, 2, -0.0, -2, 2, 3, -3});
}

TEST(ElementwiseUnary, IntegerAbsNegSignWrapAndKeepType) {
  const Tensor x = Tensor::from<int8_t>({4}, {-128, -5, 0, 7});
  OpRun a = run1("Abs", x);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.outputs[0].dtype(), DT::kInt8);
  expect_values_scaled(a.outputs[0], {-128, 5, 0, 7});  // |-128| wraps in int8
  OpRun n = run1("Neg", Tensor::from<int32_t>({2}, {std::numeric_limits<int32_t>::min(), 3}));
  ASSERT_TRUE(n.status.ok());
  expect_values_scaled(n.outputs[0], {std::numeric_limits<int32_t>::min(), -3});
  OpRun s = run1("Sign", x);
  ASSERT_TRUE(s.status.ok());
  expect_values_scaled(s.outputs[0], {-1, -1, 0, 1});
  OpRun su = run1("Sign", Tensor::from<uint8_t>({2}, {0, 200}));
  ASSERT_TRUE(su.status.ok());
  expect_values_scaled(su.outputs[0], {0, 1});
  OpRun sf = run1("Sign", F32({4}, {-2.5f, 0.f, 3.f, NAN}));
  expect_values_scaled(sf.outputs[0], {-1, 0, 1, kNaN});
  expect_error(run1("Neg", Tensor::from<uint8_t>({1}, {1})), "does not support");
}

TEST(ElementwiseUnary, IsNaNIsInfNot) {
  const Tensor x = F32({5}, {1.f, NAN, INFINITY, -INFINITY, 0.f});
  OpRun nan = run1("IsNaN", x);
  ASSERT_TRUE(nan.status.ok());
  EXPECT_EQ(nan.outputs[0].dtype(), DT::kBool);
  expect_inferred_matches(nan);
  expect_values_scaled(nan.outputs[0], {0, 1, 0, 0, 0});
  expect_values_scaled(run1("IsInf", x).outputs[0], {0, 0, 1, 1, 0});
  expect_values_scaled(run1("IsInf", x, attrs({{"detect_negative", Attribute::Int(0)}})).outputs[0],
                       {0, 0, 1, 0, 0});
  expect_values_scaled(run1("IsInf", x, attrs({{"detect_positive", Attribute::Int(0)}})).outputs[0],
                       {0, 0, 0, 1, 0});
  OpRun n = run1("Not", Tensor::from<bool>({3}, {true, false, true}));
  ASSERT_TRUE(n.status.ok());
  expect_values_scaled(n.outputs[0], {0, 1, 0});
  expect_error(run1("Not", F32({1}, {1.f})), "does not support");
}

TEST(ElementwiseUnary, RejectsIntegerInputForFloatOps) {
  expect_error(run1("Sqrt", Tensor::from<int32_t>({2}, {4, 9})), "does not support");
  expect_error(run1("IsNaN", Tensor::from<int32_t>({2}, {4, 9})), "does not support");
}

TEST(ElementwiseUnary, EmptyTensor) {
  OpRun r = run1("Exp", Tensor(DT::kFloat32, {0, 3}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 3}));
  expect_inferred_matches(r);
}

// ---------------------------------------------------------------------------------------------
TEST(ElementwiseBinary, ArithmeticBroadcastsAgainstFormula) {
  const Tensor a = random_tensor({2, 3, 1}, -2, 2);
  const Tensor b = random_tensor({4}, 0.5f, 2);
  struct Case {
    const char* op;
    double (*fn)(double, double);
  } cases[] = {
      {"Add", [](double x, double y) { return x + y; }},
      {"Sub", [](double x, double y) { return x - y; }},
      {"Mul", [](double x, double y) { return x * y; }},
      {"Div", [](double x, double y) { return x / y; }},
  };
  for (const auto& c : cases) {
    for (DT dt : {DT::kFloat32, DT::kFloat64, DT::kFloat16}) {
      SCOPED_TRACE(std::string(c.op) + " " + std::string(dtype_name(dt)));
      const Tensor ta = a.cast(dt), tb = b.cast(dt);
      OpRun r = run2(c.op, ta, tb);
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3, 4}));
      expect_inferred_matches(r);
      std::vector<double> want;
      for (int64_t i = 0; i < 6; ++i)
        for (int64_t j = 0; j < 4; ++j) want.push_back(c.fn(ta.at_double(i), tb.at_double(j)));
      expect_values_scaled(r.outputs[0], want, dt == DT::kFloat16 ? 2e-3 : 1e-6);
    }
  }
}

TEST(ElementwiseBinary, IntegerArithmeticWrapsAndTruncates) {
  const Tensor a = Tensor::from<int32_t>({5}, {7, -7, 7, -7, std::numeric_limits<int32_t>::min()});
  const Tensor b = Tensor::from<int32_t>({5}, {2, 2, -2, -2, -1});
  expect_values_scaled(run2("Div", a, b).outputs[0],
                       {3, -3, -3, 3, std::numeric_limits<int32_t>::min()});
  const Tensor u = Tensor::from<uint8_t>({3}, {250, 3, 9});
  const Tensor v = Tensor::from<uint8_t>({3}, {10, 5, 2});
  expect_values_scaled(run2("Add", u, v).outputs[0], {4, 8, 11});
  expect_values_scaled(run2("Sub", u, v).outputs[0], {240, 254, 7});
  expect_values_scaled(run2("Mul", u, v).outputs[0], {196, 15, 18});
  expect_values_scaled(run2("Div", u, v).outputs[0], {25, 0, 4});
  const Tensor big = Tensor::from<int64_t>({1}, {std::numeric_limits<int64_t>::max()});
  expect_values_scaled(run2("Add", big, Tensor::from<int64_t>({1}, {1})).outputs[0],
                       {static_cast<double>(std::numeric_limits<int64_t>::min())});
}

TEST(ElementwiseBinary, IntegerDivisionByZeroIsAnError) {
  const Tensor a = Tensor::from<int32_t>({2}, {1, 2});
  const Tensor z = Tensor::from<int32_t>({2}, {1, 0});
  expect_error(run2("Div", a, z), "division by zero");
  expect_error(run2("Mod", a, z), "division by zero");
  OpRun f = run2("Div", F32({2}, {1.f, -1.f}), F32({2}, {0.f, 0.f}));  // floats: IEEE
  ASSERT_TRUE(f.status.ok());
  expect_values_scaled(f.outputs[0], {kInf, -kInf});
}

TEST(ElementwiseBinary, ModSignConventions) {
  const Tensor x = Tensor::from<int32_t>({6}, {-4, 7, 5, 4, -7, 8});
  const Tensor y = Tensor::from<int32_t>({6}, {2, -3, 8, -2, 3, 5});
  expect_values_scaled(run2("Mod", x, y).outputs[0], {0, -2, 5, 0, 2, 3});
  expect_values_scaled(run2("Mod", x, y, attrs({{"fmod", Attribute::Int(1)}})).outputs[0],
                       {0, 1, 5, 0, -1, 3});
  const Tensor fx = F32({6}, {-4.3f, 7.2f, 5.0f, 4.3f, -7.2f, 8.0f});
  const Tensor fy = F32({6}, {2.1f, -3.4f, 8.0f, -2.1f, 3.4f, 5.0f});
  expect_values_scaled(run2("Mod", fx, fy, attrs({{"fmod", Attribute::Int(1)}})).outputs[0],
                       {-0.1, 0.4, 5, 0.1, -0.4, 3}, 1e-5);
  expect_values_scaled(run2("Mod", fx, fy).outputs[0], {2.0, -3.0, 5, -2.0, 3.0, 3}, 1e-5);
  expect_values_scaled(
      run2("Mod", Tensor::from<uint16_t>({2}, {9, 4}), Tensor::from<uint16_t>({2}, {4, 9}))
          .outputs[0],
      {1, 4});
  expect_values_scaled(
      run2("Mod", Tensor::from<int8_t>({1}, {-128}), Tensor::from<int8_t>({1}, {-1})).outputs[0],
      {0});
}

TEST(ElementwiseBinary, ComparisonsOutputBool) {
  const Tensor a = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = F32({3}, {2, 2, 7});
  struct Case {
    const char* op;
    std::vector<double> want;
  } cases[] = {
      {"Equal", {0, 1, 0, 0, 0, 0}},          {"Greater", {0, 0, 0, 1, 1, 0}},
      {"GreaterOrEqual", {0, 1, 0, 1, 1, 0}}, {"Less", {1, 0, 1, 0, 0, 1}},
      {"LessOrEqual", {1, 1, 1, 0, 0, 1}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.op);
    OpRun r = run2(c.op, a, b);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), DT::kBool);
    expect_inferred_matches(r);
    expect_values_scaled(r.outputs[0], c.want);
    OpRun ri = run2(c.op, a.cast(DT::kInt64), b.cast(DT::kInt64));
    expect_values_scaled(ri.outputs[0], c.want);
  }
  const Tensor t = Tensor::from<bool>({2}, {true, false});
  expect_values_scaled(run2("Equal", t, Tensor::from<bool>({1}, {false})).outputs[0], {0, 1});
  expect_error(run2("Greater", t, t), "does not support");
  expect_values_scaled(run2("Equal", F32({1}, {NAN}), F32({1}, {NAN})).outputs[0], {0});
}

TEST(ElementwiseBinary, LogicOps) {
  const Tensor a = Tensor::from<bool>({2, 2}, {true, true, false, false});
  const Tensor b = Tensor::from<bool>({2}, {true, false});
  expect_values_scaled(run2("And", a, b).outputs[0], {1, 0, 0, 0});
  expect_values_scaled(run2("Or", a, b).outputs[0], {1, 1, 1, 0});
  expect_values_scaled(run2("Xor", a, b).outputs[0], {0, 1, 1, 0});
  expect_error(run2("And", F32({1}, {1}), F32({1}, {1})), "does not support");
}

TEST(ElementwiseBinary, BitShift) {
  const Tensor x = Tensor::from<uint8_t>({4}, {16, 4, 1, 255});
  const Tensor y = Tensor::from<uint8_t>({4}, {1, 2, 3, 9});
  expect_values_scaled(
      run2("BitShift", x, y, attrs({{"direction", Attribute::String("RIGHT")}})).outputs[0],
      {8, 1, 0, 0});
  expect_values_scaled(
      run2("BitShift", x, y, attrs({{"direction", Attribute::String("LEFT")}})).outputs[0],
      {32, 16, 8, 0});
  const Tensor x64 = Tensor::from<uint64_t>({1}, {1});
  expect_values_scaled(run2("BitShift", x64, Tensor::from<uint64_t>({1}, {40}),
                            attrs({{"direction", Attribute::String("LEFT")}}))
                           .outputs[0],
                       {1099511627776.0});
  expect_error(run2("BitShift", x, y, attrs({{"direction", Attribute::String("UP")}})),
               "direction");
}

// BitwiseAnd/Or/Xor/Not (opset 18): two's-complement bits of every integer type, broadcasting;
// floats and bool are refused.
TEST(ElementwiseBinary, Bitwise) {
  const Tensor a = Tensor::from<int8_t>({2, 3}, {-1, 5, -128, 12, 0, 127});
  const Tensor b = Tensor::from<int8_t>({3}, {6, -3, 127});
  EXPECT_EQ(values_i64(run2("BitwiseAnd", a, b).outputs[0]),
            (std::vector<int64_t>{6, 5, 0, 4, 0, 127}));
  EXPECT_EQ(values_i64(run2("BitwiseOr", a, b).outputs[0]),
            (std::vector<int64_t>{-1, -3, -1, 14, -3, 127}));
  EXPECT_EQ(values_i64(run2("BitwiseXor", a, b).outputs[0]),
            (std::vector<int64_t>{-7, -8, -1, 10, -3, 0}));
  EXPECT_EQ(values_i64(run1("BitwiseNot", a).outputs[0]),
            (std::vector<int64_t>{0, -6, 127, -13, -1, -128}));
  const Tensor u = Tensor::from<uint16_t>({2}, {0x00ff, 0xf0f0});
  EXPECT_EQ(values_i64(run1("BitwiseNot", u).outputs[0]), (std::vector<int64_t>{0xff00, 0x0f0f}));
  const Tensor big = Tensor::from<uint64_t>({1}, {0x8000000000000001ull});
  const Tensor one = Tensor::from<uint64_t>({1}, {1});
  EXPECT_EQ(run2("BitwiseXor", big, one).outputs[0].data<uint64_t>()[0], 0x8000000000000000ull);
  expect_error(run2("BitwiseAnd", F32({1}, {1}), F32({1}, {1})), "does not support");
  expect_error(run1("BitwiseNot", Tensor::from<bool>({1}, {true})), "does not support");
  expect_error(run2("BitwiseOr", a, Tensor::from<int16_t>({1}, {1})), "different types");
}

// BitShift-28: signed integers (left shift wraps, right shift is arithmetic; a negative shift
// or one of at least the bit width gives 0, or -1 for a negative value shifted right).
TEST(ElementwiseBinary, BitShiftSigned) {
  const Tensor x = Tensor::from<int8_t>({5}, {-8, 100, -1, 5, -128});
  const Tensor y = Tensor::from<int8_t>({5}, {1, 1, 8, -1, 7});
  const Attributes right = attrs({{"direction", Attribute::String("RIGHT")}});
  const Attributes left = attrs({{"direction", Attribute::String("LEFT")}});
  EXPECT_EQ(values_i64(run2("BitShift", x, y, right).outputs[0]),
            (std::vector<int64_t>{-4, 50, -1, 0, -1}));
  EXPECT_EQ(values_i64(run2("BitShift", x, y, left).outputs[0]),
            (std::vector<int64_t>{-16, -56, 0, 0, 0}));
  const Tensor big = Tensor::from<int64_t>({1}, {std::numeric_limits<int64_t>::min()});
  EXPECT_EQ(values_i64(run2("BitShift", big, Tensor::from<int64_t>({1}, {63}), right).outputs[0]),
            (std::vector<int64_t>{-1}));
}

TEST(ElementwiseBinary, MismatchedTypesAndShapesAreErrors) {
  expect_error(run2("Add", F32({2}, {1, 2}), Tensor::from<int32_t>({2}, {1, 2})),
               "different types");
  expect_error(run2("Add", F32({2}, {1, 2}), F32({3}, {1, 2, 3})), "broadcast");
}

TEST(ElementwiseBinary, SymbolicInference) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DT::kFloat32, {Dim::sym("N"), Dim(1), Dim(4)}));
  Value* b = g.add_value("b", TensorType(DT::kFloat32, {Dim(3), Dim(1)}));
  Value* c = g.add_value("c", TensorType::unknown_rank(DT::kFloat32));
  Node* n = g.add_node("Add", "add", {a, b}, {"o"});
  Node* m = g.add_node("Mul", "mul", {a, c}, {"p"});
  std::vector<TensorType> out(1);
  InferContext ictx(*n, out);
  ASSERT_TRUE(find_op("", "Add")->infer(ictx).ok());
  EXPECT_EQ(out[0].str(), "float32[N,3,4]");
  InferContext mctx(*m, out);
  ASSERT_TRUE(find_op("", "Mul")->infer(mctx).ok());
  EXPECT_FALSE(out[0].has_rank());
}

TEST(ElementwiseBinary, EmptyTensorsBroadcast) {
  OpRun r = run2("Add", Tensor(DT::kFloat32, {0, 3}), F32({3}, {1, 2, 3}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 3}));
  expect_inferred_matches(r);
  const Tensor e(DT::kFloat32, {2, 0});
  const Tensor one = F32({1}, {1});
  OpRun m = run_op("Max", {&e, &one}, {});
  ASSERT_TRUE(m.status.ok()) << m.status.message();
  EXPECT_EQ(m.outputs[0].shape(), (std::vector<int64_t>{2, 0}));
  expect_error(run2("Add", Tensor(DT::kFloat32, {0}), F32({3}, {1, 2, 3})), "broadcast");
}

TEST(ElementwiseBinary, InferenceReportsStaticMismatchAndKeepsSymbols) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DT::kFloat32, {Dim::sym("N"), Dim(4)}));
  Value* b = g.add_value("b", TensorType(DT::kFloat32, {Dim(5)}));
  Value* c = g.add_value("c", TensorType(DT::kBool, {Dim::sym("N"), Dim(1)}));
  std::vector<TensorType> out(1);
  Node* add = g.add_node("Add", "add", {a, b}, {"o1"});
  InferContext actx(*add, out);
  Status st = find_op("", "Add")->infer(actx);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'add'"), std::string::npos) << st.message();
  Node* where = g.add_node("Where", "where", {c, a, a}, {"o2"});
  InferContext wctx(*where, out);
  ASSERT_TRUE(find_op("", "Where")->infer(wctx).ok());
  EXPECT_EQ(out[0].str(), "float32[N,4]");
  Node* cast = g.add_node("Cast", "cast", {a}, {"o3"});
  cast->attrs.set("to", Attribute::Int(10));
  InferContext cctx(*cast, out);
  ASSERT_TRUE(find_op("", "Cast")->infer(cctx).ok());
  EXPECT_EQ(out[0].str(), "float16[N,4]");
  Node* eq = g.add_node("Equal", "eq", {a, a}, {"o4"});
  InferContext ectx(*eq, out);
  ASSERT_TRUE(find_op("", "Equal")->infer(ectx).ok());
  EXPECT_EQ(out[0].str(), "bool[N,4]");
  Node* sum = g.add_node("Sum", "sum", {a, a, a}, {"o5"});
  InferContext sctx(*sum, out);
  ASSERT_TRUE(find_op("", "Sum")->infer(sctx).ok());
  EXPECT_EQ(out[0].str(), "float32[N,4]");
}

TEST(ElementwiseUpgrade, LegacyBroadcastWithoutAxisIsNumpySuffixMatching) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DT::kBool, {Dim(2), Dim(3)}));
  Value* b = g.add_value("b", TensorType(DT::kBool, {Dim(3)}));
  Node* n = g.add_node("And", "and", {a, b}, {"y"});
  n->attrs.set("broadcast", Attribute::Int(1));
  ImportContext ctx(g, *n, 1);
  ASSERT_TRUE(find_op("", "And")->upgrade(ctx).ok());
  EXPECT_TRUE(n->attrs.all().empty());
  EXPECT_EQ(n->input(1), b);
}

// ---------------------------------------------------------------------------------------------
TEST(ElementwisePow, MixedTypes) {
  OpRun r = run2("Pow", F32({3}, {1, 2, 3}), Tensor::from<int64_t>({3}, {4, 5, 6}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DT::kFloat32);
  expect_inferred_matches(r);
  expect_values_scaled(r.outputs[0], {1, 32, 729});
  OpRun ri = run2("Pow", Tensor::from<int32_t>({3}, {1, 2, 3}), F32({3}, {4, 5, 0.5f}));
  EXPECT_EQ(ri.outputs[0].dtype(), DT::kInt32);
  expect_values_scaled(ri.outputs[0], {1, 32, 1});  // 3^0.5 = 1.73 truncates to 1
  OpRun ii = run2("Pow", Tensor::from<int64_t>({5}, {2, -3, 2, 1, -1}),
                  Tensor::from<int64_t>({5}, {10, 3, -1, -5, -3}));
  expect_values_scaled(ii.outputs[0], {1024, -27, 0, 1, -1});
  const Tensor x = random_tensor({2, 3}, 0.5f, 2);
  OpRun s = run2("Pow", x, Tensor::scalar<float>(2.5f));
  ASSERT_EQ(s.outputs[0].shape(), (std::vector<int64_t>{2, 3}));
  std::vector<double> want;
  for (int64_t i = 0; i < 6; ++i) want.push_back(std::pow(x.at_double(i), 2.5));
  expect_values_scaled(s.outputs[0], want, 1e-6);
}

TEST(ElementwiseVariadic, MaxMinSumMean) {
  const Tensor a = F32({2, 1}, {1, 5});
  const Tensor b = F32({3}, {2, 4, 6});
  const Tensor c = F32({1}, {3});
  const std::vector<const Tensor*> ins = {&a, &b, &c};
  OpRun mx = run_op("Max", ins, {});
  ASSERT_TRUE(mx.status.ok()) << mx.status.message();
  expect_inferred_matches(mx);
  expect_values_scaled(mx.outputs[0], {3, 4, 6, 5, 5, 6});
  expect_values_scaled(run_op("Min", ins, {}).outputs[0], {1, 1, 1, 2, 3, 3});
  expect_values_scaled(run_op("Sum", ins, {}).outputs[0], {6, 8, 10, 10, 12, 14});
  expect_values_scaled(run_op("Mean", ins, {}).outputs[0],
                       {2, 8 / 3.0, 10 / 3.0, 10 / 3.0, 4, 14 / 3.0});
  OpRun one = run_op("Sum", {&b}, {});
  expect_values_scaled(one.outputs[0], {2, 4, 6});
  expect_values_scaled(run_op("Max", {&c, &c}, {}).outputs[0], {3});
  const Tensor n = F32({2}, {NAN, 1});
  const Tensor m = F32({2}, {0, NAN});
  expect_values_scaled(run_op("Max", {&n, &m}, {}).outputs[0], {kNaN, kNaN});
  const Tensor i8 = Tensor::from<int8_t>({2}, {-5, 7});
  const Tensor j8 = Tensor::from<int8_t>({2}, {3, -9});
  expect_values_scaled(run_op("Max", {&i8, &j8}, {}).outputs[0], {3, 7});
  expect_values_scaled(run_op("Min", {&i8, &j8}, {}).outputs[0], {-5, -9});
  expect_error(run_op("Mean", {&i8, &j8}, {}), "does not support");
  expect_error(run_op("Max", {}, {}), "at least one input");
  const Tensor h = F32({2}, {1.5f, 2.5f}).cast(DT::kFloat16);
  OpRun mh = run_op("Mean", {&h, &h, &h}, {});
  EXPECT_EQ(mh.outputs[0].dtype(), DT::kFloat16);
  expect_values_scaled(mh.outputs[0], {1.5, 2.5});
}

// ---------------------------------------------------------------------------------------------
TEST(ElementwiseCast, FloatToIntIsDefinedForNaNAndOutOfRange) {
  const Tensor x = F32({7}, {1.7f, -1.7f, NAN, 1e10f, -1e10f, INFINITY, 300.f});
  OpRun r = run1("Cast", x, attrs({{"to", Attribute::Int(6)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DT::kInt32);
  expect_inferred_matches(r);
  // In int64 range: truncate, then wrap to 32 bits (1e10 mod 2^32); beyond: saturate.
  expect_values_scaled(r.outputs[0], {1, -1, 0, 1410065408.0, -1410065408.0, 2147483647.0, 300});
  expect_values_scaled(run1("Cast", x, attrs({{"to", Attribute::Int(2)}})).outputs[0],
                       {1, 255, 0, 0, 0, 255, 44});
  const Tensor big = F32({4}, {1e30f, -1e30f, -INFINITY, 1.5e19f});
  expect_values_scaled(run1("Cast", big, attrs({{"to", Attribute::Int(7)}})).outputs[0],
                       {9.223372036854775807e18, -9.223372036854775808e18, -9.223372036854775808e18,
                        9.223372036854775807e18});
  OpRun u64 = run1("Cast", big, attrs({{"to", Attribute::Int(13)}}));
  EXPECT_EQ(u64.outputs[0].data<uint64_t>()[0], std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(u64.outputs[0].data<uint64_t>()[3], static_cast<uint64_t>(1.5e19f));
}

TEST(ElementwiseCast, BoolIntegerAndHalfConversions) {
  expect_values_scaled(
      run1("Cast", F32({4}, {0.f, -0.f, NAN, 2.f}), attrs({{"to", Attribute::Int(9)}})).outputs[0],
      {0, 0, 1, 1});
  expect_values_scaled(
      run1("Cast", Tensor::from<bool>({2}, {true, false}), attrs({{"to", Attribute::Int(1)}}))
          .outputs[0],
      {1, 0});
  expect_values_scaled(
      run1("Cast", Tensor::from<int16_t>({3}, {200, -200, 5}), attrs({{"to", Attribute::Int(3)}}))
          .outputs[0],
      {-56, 56, 5});
  OpRun h =
      run1("Cast", F32({3}, {1.0009765625f, 65504.f, 1e6f}), attrs({{"to", Attribute::Int(10)}}));
  EXPECT_EQ(h.outputs[0].dtype(), DT::kFloat16);
  expect_values_scaled(h.outputs[0], {1.0009765625, 65504, kInf});
  // bfloat16 rounds to nearest even: 1 + 2^-8 is a tie (-> 1), 1 + 3*2^-9 rounds up.
  OpRun b =
      run1("Cast", F32({2}, {1.00390625f, 1.005859375f}), attrs({{"to", Attribute::Int(16)}}));
  expect_values_scaled(b.outputs[0], {1.0, 1.0078125});
  OpRun d = run1("Cast", Tensor::from<int64_t>({1}, {(1LL << 53) + 1}),
                 attrs({{"to", Attribute::Int(11)}}));
  expect_values_scaled(d.outputs[0], {9007199254740992.0});
}

TEST(ElementwiseCast, UnsupportedTargetsAreRefused) {
  const Tensor x = F32({1}, {1});
  expect_error(run1("Cast", x, attrs({{"to", Attribute::Int(8)}})), "string is not supported");
  // float8 and int4 are supported (test_lowbit.cpp); float4, float8e8m0 and 2-bit are not.
  expect_error(run1("Cast", x, attrs({{"to", Attribute::Int(23)}})), "float4e2m1");
  expect_error(run1("Cast", x, attrs({{"to", Attribute::Int(26)}})), "int2");
  expect_error(run1("Cast", x, attrs({{"to", Attribute::Int(99)}})), "not supported");
  expect_error(run1("Cast", x), "missing integer attribute 'to'");
}

TEST(ElementwiseCast, CastLikeTakesTheSecondInputsType) {
  OpRun r = run2("CastLike", F32({3}, {1.5f, -2.5f, 7.f}), Tensor::from<int64_t>({1}, {0}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DT::kInt64);
  expect_inferred_matches(r);
  expect_values_scaled(r.outputs[0], {1, -2, 7});
}

TEST(ElementwiseCast, Cast1StringTargetIsUpgraded) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DT::kFloat32, {Dim(2)}));
  Node* n = g.add_node("Cast", "c", {x}, {"y"});
  n->attrs.set("to", Attribute::String("INT64"));
  ImportContext ctx(g, *n, 1);
  ASSERT_TRUE(find_op("", "Cast")->upgrade(ctx).ok());
  EXPECT_EQ(n->attrs.get_int("to", 0), 7);
  n->attrs.set("to", Attribute::String("NOPE"));
  EXPECT_FALSE(find_op("", "Cast")->upgrade(ctx).ok());
}

// ---------------------------------------------------------------------------------------------
TEST(ElementwiseClip, BoundsAreOptional) {
  const Tensor x = F32({5}, {-3, -1, 0, 2, NAN});
  const Tensor lo = Tensor::scalar<float>(-1.5f), hi = Tensor::scalar<float>(1.f);
  OpRun r = run_op("Clip", {&x, &lo, &hi}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values_scaled(r.outputs[0], {-1.5, -1, 0, 1, kNaN});
  expect_values_scaled(run_op("Clip", {&x, nullptr, &hi}, {}).outputs[0], {-3, -1, 0, 1, kNaN});
  expect_values_scaled(run_op("Clip", {&x, &lo}, {}).outputs[0], {-1.5, -1, 0, 2, kNaN});
  expect_values_scaled(run_op("Clip", {&x}, {}).outputs[0], {-3, -1, 0, 2, kNaN});
  // min > max: everything becomes max.
  expect_values_scaled(run_op("Clip", {&x, &hi, &lo}, {}).outputs[0],
                       {-1.5, -1.5, -1.5, -1.5, kNaN});
  const Tensor xi = Tensor::from<int8_t>({3}, {-128, 0, 127});
  const Tensor li = Tensor::scalar<int8_t>(-5);
  expect_values_scaled(run_op("Clip", {&xi, &li}, {}).outputs[0], {-5, 0, 127});
  const Tensor bad = F32({2}, {0, 1});
  expect_error(run_op("Clip", {&x, &bad}, {}), "scalar");
}

TEST(ElementwiseClip, Clip6AttributesBecomeInputs) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DT::kFloat64, {Dim(3)}));
  Node* n = g.add_node("Clip", "clip", {x}, {"y"});
  n->attrs.set("max", Attribute::Float(0.5f));
  ImportContext ctx(g, *n, 6);
  ASSERT_TRUE(find_op("", "Clip")->upgrade(ctx).ok());
  EXPECT_FALSE(n->attrs.has("max"));
  ASSERT_EQ(n->num_inputs(), 3u);
  EXPECT_EQ(n->input(1), nullptr);
  ASSERT_TRUE(n->input(2) && n->input(2)->is_constant());
  EXPECT_EQ(n->input(2)->constant->dtype(), DT::kFloat64);
  EXPECT_EQ(n->input(2)->constant->at_double(0), 0.5);
}

TEST(ElementwiseWhere, BroadcastsThreeWays) {
  const Tensor c = Tensor::from<bool>({2, 1}, {true, false});
  const Tensor x = Tensor::from<int64_t>({3}, {1, 2, 3});
  const Tensor y = Tensor::from<int64_t>({}, {-1});
  OpRun r = run_op("Where", {&c, &x, &y}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 3}));
  expect_values_scaled(r.outputs[0], {1, 2, 3, -1, -1, -1});
  const Tensor fc = F32({1}, {1});
  expect_error(run_op("Where", {&fc, &x, &y}, {}), "bool");
  const Tensor yf = F32({1}, {1});
  expect_error(run_op("Where", {&c, &x, &yf}, {}), "different types");
}

// ---------------------------------------------------------------------------------------------
TEST(ElementwiseUpgrade, LegacyBroadcastAxisWithVariableInput) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DT::kFloat32, {Dim(2), Dim(3), Dim(4)}));
  Value* b = g.add_value("b", TensorType(DT::kFloat32, {Dim(3)}));
  Node* n = g.add_node("Add", "add", {a, b}, {"y"});
  n->attrs.set("broadcast", Attribute::Int(1));
  n->attrs.set("axis", Attribute::Int(1));
  n->attrs.set("consumed_inputs", Attribute::Ints({0, 0}));
  ImportContext ctx(g, *n, 6);
  ASSERT_TRUE(find_op("", "Add")->upgrade(ctx).ok());
  EXPECT_FALSE(n->attrs.has("broadcast") || n->attrs.has("axis") ||
               n->attrs.has("consumed_inputs"));
  ASSERT_TRUE(n->attrs.has("kiln_broadcast_axis"));
  // The canonical node broadcasts b[3] along axis 1 of a[2,3,4].
  const Tensor ta = random_tensor({2, 3, 4});
  const Tensor tb = F32({3}, {10, 20, 30});
  OpRun r = run2("Add", ta, tb, n->attrs);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  for (int64_t i = 0; i < 24; ++i)
    EXPECT_FLOAT_EQ(r.outputs[0].at_double(i), ta.at_double(i) + 10 * ((i / 4) % 3 + 1));
  expect_error(run2("Add", ta, F32({5}, {1, 2, 3, 4, 5}),
                    attrs({{"kiln_broadcast_axis", Attribute::Int(2)}})),
               "broadcast");
}

TEST(ElementwiseUpgrade, LegacyBroadcastAxisWithConstantIsFolded) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DT::kFloat32, {Dim(2), Dim(3), Dim(4), Dim(5)}));
  Value* b = g.add_constant("b", random_tensor({3, 4}));
  Node* n = g.add_node("Mul", "mul", {a, b}, {"y"});
  n->attrs.set("broadcast", Attribute::Int(1));
  n->attrs.set("axis", Attribute::Int(1));
  ImportContext ctx(g, *n, 5);
  ASSERT_TRUE(find_op("", "Mul")->upgrade(ctx).ok());
  EXPECT_TRUE(n->attrs.all().empty());
  ASSERT_TRUE(n->input(1)->is_constant());
  EXPECT_EQ(n->input(1)->constant->shape(), (std::vector<int64_t>{3, 4, 1}));
  // Opset 7+ nodes are left alone (axis would be an unknown attribute there anyway).
  Node* m = g.add_node("Sub", "sub", {a, b}, {"z"});
  m->attrs.set("foo", Attribute::Int(1));
  ImportContext ctx7(g, *m, 7);
  ASSERT_TRUE(find_op("", "Sub")->upgrade(ctx7).ok());
  EXPECT_TRUE(m->attrs.has("foo"));
  EXPECT_EQ(m->input(1), b);
}

TEST(ElementwiseUpgrade, ConsumedInputsDropped) {
  expect_consumed_inputs_dropped({"Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil",
                                  "Max", "Min", "Sum", "Mean"});
}

}  // namespace
}  // namespace kiln::test
