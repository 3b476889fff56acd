#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Attributes reduce_attrs(int64_t keepdims = 1, int64_t noop = 0) {
  Attributes a;
  a.set("keepdims", Attribute::Int(keepdims));
  if (noop) a.set("noop_with_empty_axes", Attribute::Int(noop));
  return a;
}

OpRun reduce(const std::string& op, const Tensor& x, std::vector<int64_t> axes,
             int64_t keepdims = 1, int64_t noop = 0) {
  Tensor a = Tensor::from<int64_t>({static_cast<int64_t>(axes.size())}, axes);
  return run_op(op, {&x, &a}, reduce_attrs(keepdims, noop), 1, {false, true});
}

// ONNX's "example" data: shape [3,2,2], reduced over axis 1 with keepdims.
const Tensor& example() {
  static const Tensor t = Tensor::from<float>({3, 2, 2}, {5, 1, 20, 2, 30, 1, 40, 2, 55, 1, 60, 2});
  return t;
}

// Asserts the run succeeded, then checks output 0 (tolerance rtol * max(1, |want|)).
void expect_output(const OpRun& r, const std::vector<float>& want, float rtol = 1e-6f) {
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values_scaled(r.outputs[0], std::vector<double>(want.begin(), want.end()), rtol);
}

TEST(Reduce, KnownValuesKeepdims) {
  const std::vector<std::pair<std::string, std::vector<float>>> cases = {
      {"ReduceSum", {25, 3, 70, 3, 115, 3}},
      {"ReduceMean", {12.5f, 1.5f, 35, 1.5f, 57.5f, 1.5f}},
      {"ReduceMax", {20, 2, 40, 2, 60, 2}},
      {"ReduceMin", {5, 1, 30, 1, 55, 1}},
      {"ReduceProd", {100, 2, 1200, 2, 3300, 2}},
      {"ReduceL1", {25, 3, 70, 3, 115, 3}},
      {"ReduceL2", {20.6155281f, 2.23606801f, 50, 2.23606801f, 81.394104f, 2.23606801f}},
      {"ReduceLogSum",
       {3.21887589f, 1.09861231f, 4.2484951f, 1.09861231f, 4.74493217f, 1.09861231f}},
      {"ReduceLogSumExp",
       {20.0000003f, 2.31326169f, 40.0000454f, 2.31326169f, 60.0067153f, 2.31326169f}},
      {"ReduceSumSquare", {425, 5, 2500, 5, 6625, 5}},
  };
  for (const auto& [op, want] : cases) {
    SCOPED_TRACE(op);
    auto r = reduce(op, example(), {1});
    expect_output(r, want);
    EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{3, 1, 2}));
    expect_inferred_matches(r);
  }
}

TEST(Reduce, L1UsesAbsoluteValues) {
  Tensor x = Tensor::from<float>({2, 2}, {-1, 2, -3, -4});
  expect_output(reduce("ReduceL1", x, {0}), {4, 6});
  expect_output(reduce("ReduceSum", x, {0}), {-4, -2});
}

// Independent formula: for each output element, scans the whole input for matching coords.
std::vector<double> naive_reduce(const Tensor& x, const std::vector<bool>& mask,
                                 const std::function<double(const std::vector<double>&)>& f) {
  const auto& s = x.shape();
  std::vector<int64_t> kept;
  for (size_t d = 0; d < s.size(); ++d) kept.push_back(mask[d] ? 1 : s[d]);
  int64_t out_n = 1;
  for (int64_t k : kept) out_n *= k;
  std::vector<double> out;
  for (int64_t o = 0; o < out_n; ++o) {
    std::vector<int64_t> oc(s.size());
    for (int64_t d = static_cast<int64_t>(s.size()) - 1, r = o; d >= 0; --d) {
      oc[d] = r % kept[d];
      r /= kept[d];
    }
    std::vector<double> group;
    for (int64_t i = 0; i < x.numel(); ++i) {
      bool match = true;
      for (int64_t d = static_cast<int64_t>(s.size()) - 1, r = i; d >= 0; --d) {
        if (!mask[d] && r % s[d] != oc[d]) match = false;
        r /= s[d];
      }
      if (match) group.push_back(x.at_double(i));
    }
    out.push_back(f(group));
  }
  return out;
}

TEST(Reduce, RandomAgainstNaiveFormula) {
  using G = const std::vector<double>&;
  const std::vector<std::pair<std::string, std::function<double(G)>>> ops = {
      {"ReduceSum",
       [](G g) {
         double s = 0;
         for (double v : g) s += v;
         return s;
       }},
      {"ReduceMean",
       [](G g) {
         double s = 0;
         for (double v : g) s += v;
         return s / g.size();
       }},
      {"ReduceMax",
       [](G g) {
         double m = -INFINITY;
         for (double v : g) m = std::max(m, v);
         return m;
       }},
      {"ReduceMin",
       [](G g) {
         double m = INFINITY;
         for (double v : g) m = std::min(m, v);
         return m;
       }},
      {"ReduceProd",
       [](G g) {
         double p = 1;
         for (double v : g) p *= v;
         return p;
       }},
      {"ReduceL1",
       [](G g) {
         double s = 0;
         for (double v : g) s += std::fabs(v);
         return s;
       }},
      {"ReduceL2",
       [](G g) {
         double s = 0;
         for (double v : g) s += v * v;
         return std::sqrt(s);
       }},
      {"ReduceLogSum",
       [](G g) {
         double s = 0;
         for (double v : g) s += v;
         return std::log(s);
       }},
      {"ReduceLogSumExp",
       [](G g) {
         double s = 0;
         for (double v : g) s += std::exp(v);
         return std::log(s);
       }},
      {"ReduceSumSquare",
       [](G g) {
         double s = 0;
         for (double v : g) s += v * v;
         return s;
       }},
  };
  const std::vector<std::vector<int64_t>> axes_cases = {{0},    {1},       {2},    {-1},
                                                        {0, 2}, {2, 0, 1}, {-2, 0}};
  for (const auto& [op, f] : ops) {
    // LogSum needs positive sums.
    Tensor x =
        op == "ReduceLogSum" ? random_tensor({3, 4, 5}, 0.1f, 2.f) : random_tensor({3, 4, 5});
    for (const auto& axes : axes_cases) {
      for (int64_t keep : {0, 1}) {
        SCOPED_TRACE(op + " axes " + shape_str(axes) + " keepdims " + std::to_string(keep));
        std::vector<bool> mask(3, false);
        for (int64_t a : axes) mask[a < 0 ? a + 3 : a] = true;
        auto want = naive_reduce(x, mask, f);
        auto r = reduce(op, x, axes, keep);
        ASSERT_TRUE(r.status.ok()) << r.status.message();
        expect_inferred_matches(r);
        std::vector<int64_t> shape;
        for (size_t d = 0; d < 3; ++d)
          if (!mask[d] || keep) shape.push_back(mask[d] ? 1 : x.dim(d));
        EXPECT_EQ(r.outputs[0].shape(), shape);
        ASSERT_EQ(r.outputs[0].numel(), static_cast<int64_t>(want.size()));
        for (size_t i = 0; i < want.size(); ++i)
          EXPECT_NEAR(r.outputs[0].at_double(i), want[i], 1e-5 * std::max(1.0, std::fabs(want[i])));
      }
    }
  }
}

TEST(Reduce, EmptyAxesReducesAll) {
  for (int64_t keep : {0, 1}) {
    auto r = reduce("ReduceSum", example(), {}, keep);
    expect_output(r, {219});
    EXPECT_EQ(r.outputs[0].shape(),
              keep ? std::vector<int64_t>({1, 1, 1}) : std::vector<int64_t>{});
    expect_inferred_matches(r);
    // Absent axes input too.
    auto r2 = run_op("ReduceMax", {&example()}, reduce_attrs(keep));
    expect_output(r2, {60});
    EXPECT_EQ(r2.outputs[0].rank(), keep ? 3 : 0);
    expect_inferred_matches(r2);
  }
}

TEST(Reduce, NoopWithEmptyAxesAppliesPerElement) {
  Tensor x = Tensor::from<float>({2, 2}, {1, -2, 3, 0.5f});
  auto r = reduce("ReduceSum", x, {}, 1, 1);
  expect_output(r, {1, -2, 3, 0.5f});
  EXPECT_EQ(r.outputs[0].shape(), x.shape());
  expect_inferred_matches(r);
  expect_output(reduce("ReduceSumSquare", x, {}, 0, 1), {1, 4, 9, 0.25f});
  expect_output(reduce("ReduceL1", x, {}, 1, 1), {1, 2, 3, 0.5f});
  expect_output(reduce("ReduceLogSumExp", x, {}, 1, 1), {1, -2, 3, 0.5f});
  Tensor p = Tensor::from<float>({2}, {1, 2});
  expect_output(reduce("ReduceLogSum", p, {}, 1, 1), {0, std::log(2.f)});
  // Absent axes with noop: identity shape as well.
  auto r2 = run_op("ReduceMean", {&x}, reduce_attrs(0, 1));
  expect_output(r2, {1, -2, 3, 0.5f});
  EXPECT_EQ(r2.outputs[0].shape(), x.shape());
  // Non-empty axes ignore noop.
  expect_output(reduce("ReduceSum", x, {0}, 0, 1), {4, -1.5f});
}

TEST(Reduce, NegativeAxes) {
  auto r = reduce("ReduceSum", example(), {-2});
  expect_output(r, {25, 3, 70, 3, 115, 3});
}

TEST(Reduce, EmptySetGivesIdentity) {
  Tensor x(DataType::kFloat32, {2, 0, 4});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::pair<std::string, float>> cases = {
      {"ReduceSum", 0},      {"ReduceMean", nan},     {"ReduceMax", -kInf},
      {"ReduceMin", kInf},   {"ReduceProd", 1},       {"ReduceL1", 0},
      {"ReduceL2", 0},       {"ReduceLogSum", -kInf}, {"ReduceLogSumExp", -kInf},
      {"ReduceSumSquare", 0}};
  for (const auto& [op, v] : cases) {
    SCOPED_TRACE(op);
    auto r = reduce(op, x, {1});
    expect_output(r, std::vector<float>(8, v));
    EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 1, 4}));
    expect_inferred_matches(r);
  }
  Tensor xi(DataType::kInt32, {0, 3});
  auto r = reduce("ReduceMax", xi, {0}, 0);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].at_int(2), std::numeric_limits<int32_t>::min());
  r = reduce("ReduceMin", Tensor(DataType::kUInt8, {0}), {}, 0);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].at_int(0), 255);
  r = reduce("ReduceMax", Tensor(DataType::kBool, {2, 0}), {1}, 1);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].at_int(0), 0);
  EXPECT_EQ(r.outputs[0].at_int(1), 0);
  r = reduce("ReduceMean", Tensor(DataType::kInt64, {0}), {0}, 1);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].at_int(0), 0);  // documented: integer mean of nothing is 0
}

TEST(Reduce, EmptyOutput) {
  Tensor x(DataType::kFloat32, {0, 3});
  auto r = reduce("ReduceSum", x, {1}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 1}));
  expect_inferred_matches(r);
}

TEST(Reduce, ScalarInput) {
  Tensor x = Tensor::scalar<float>(3.f);
  auto r = run_op("ReduceSumSquare", {&x}, reduce_attrs(1));
  expect_output(r, {9});
  EXPECT_EQ(r.outputs[0].rank(), 0);
  EXPECT_FALSE(reduce("ReduceSum", x, {0}).status.ok());
}

TEST(Reduce, IntegerTypes) {
  Tensor i32 = Tensor::from<int32_t>({2, 3}, {1, -2, 3, 4, 5, -7});
  auto r = reduce("ReduceSum", i32, {1}, 0);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt32);
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(reduce("ReduceMean", i32, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{0, 0}));  // 2/3 truncates
  EXPECT_EQ(reduce("ReduceMean", i32, {0}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{2, 1, -2}));  // -4/2, 3/2, -4/2
  EXPECT_EQ(reduce("ReduceProd", i32, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{-6, -140}));
  EXPECT_EQ(reduce("ReduceL1", i32, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{6, 16}));
  EXPECT_EQ(reduce("ReduceSumSquare", i32, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{14, 90}));
  EXPECT_EQ(reduce("ReduceL2", i32, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{3, 9}));  // sqrt(14)=3.74, sqrt(90)=9.49 truncated
  EXPECT_EQ(reduce("ReduceMax", i32, {0}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{4, 5, 3}));
  Tensor i64 = Tensor::from<int64_t>({3}, {int64_t{1} << 40, 3, -5});
  EXPECT_EQ(reduce("ReduceProd", i64, {0}, 0).outputs[0].at_int(0), -15 * (int64_t{1} << 40));
  Tensor u8 = Tensor::from<uint8_t>({4}, {3, 250, 7, 0});
  auto m = reduce("ReduceMin", u8, {0}, 0);
  EXPECT_EQ(m.outputs[0].dtype(), DataType::kUInt8);
  EXPECT_EQ(m.outputs[0].at_int(0), 0);
  EXPECT_EQ(reduce("ReduceMax", u8, {0}, 0).outputs[0].at_int(0), 250);
  Tensor i8 = Tensor::from<int8_t>({3}, {-128, 127, 0});
  EXPECT_EQ(reduce("ReduceMin", i8, {0}, 0).outputs[0].at_int(0), -128);
  Tensor u64 = Tensor::from<uint64_t>({2}, {~uint64_t{0} - 1, 1});
  EXPECT_EQ(static_cast<uint64_t>(reduce("ReduceMax", u64, {0}, 0).outputs[0].at_int(0)),
            ~uint64_t{0} - 1);
  // Sum wraps like int32 arithmetic.
  Tensor big = Tensor::from<int32_t>({2}, {std::numeric_limits<int32_t>::max(), 1});
  EXPECT_EQ(reduce("ReduceSum", big, {0}, 0).outputs[0].at_int(0),
            std::numeric_limits<int32_t>::min());
}

TEST(Reduce, BoolMaxMin) {
  Tensor b = Tensor::from<bool>({2, 2}, {true, false, false, false});
  auto mx = reduce("ReduceMax", b, {1}, 0);
  ASSERT_TRUE(mx.status.ok());
  EXPECT_EQ(mx.outputs[0].dtype(), DataType::kBool);
  EXPECT_EQ(mx.outputs[0].to_int64_vector(), (std::vector<int64_t>{1, 0}));
  Tensor c = Tensor::from<bool>({2, 2}, {true, true, true, false});
  EXPECT_EQ(reduce("ReduceMin", c, {1}, 0).outputs[0].to_int64_vector(),
            (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(reduce("ReduceSum", b, {1}, 0).status.ok());
}

TEST(Reduce, Float16AccumulatesInFloat) {
  // 3000 ones: a float16 accumulator would stop at 2048.
  Tensor h = Tensor::scalar<float>(1.f).cast(DataType::kFloat16);
  Tensor x(DataType::kFloat16, {3000});
  for (int i = 0; i < 3000; ++i) x.data<Half>()[i] = h.data<Half>()[0];
  auto r = reduce("ReduceSum", x, {0}, 0);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  EXPECT_EQ(r.outputs[0].at_double(0), 3000.0);
  auto m = reduce("ReduceMean", x, {0}, 0);
  EXPECT_EQ(m.outputs[0].at_double(0), 1.0);
  Tensor bf = example().cast(DataType::kBFloat16);
  auto rb = reduce("ReduceMax", bf, {1});
  EXPECT_EQ(rb.outputs[0].dtype(), DataType::kBFloat16);
  expect_output(rb, {20, 2, 40, 2, 60, 2});
}

TEST(Reduce, Float64) {
  Tensor x = example().cast(DataType::kFloat64);
  auto r = reduce("ReduceLogSumExp", x, {1});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat64);
  EXPECT_NEAR(r.outputs[0].at_double(1), std::log(std::exp(1.0) + std::exp(2.0)), 1e-14);
}

TEST(Reduce, LogSumExpIsStableForLargeInputs) {
  Tensor x = Tensor::from<float>({2}, {1000.f, 1000.f});
  expect_output(reduce("ReduceLogSumExp", x, {0}, 0), {1000.f + std::log(2.f)});
}

TEST(Reduce, MaxMinPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from<float>({3}, {1.f, nan, 3.f});
  EXPECT_TRUE(std::isnan(reduce("ReduceMax", x, {0}, 0).outputs[0].at_double(0)));
  EXPECT_TRUE(std::isnan(reduce("ReduceMin", x, {0}, 0).outputs[0].at_double(0)));
}

TEST(Reduce, Errors) {
  auto r = reduce("ReduceSum", example(), {3});
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("n0"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("out of range"), std::string::npos);
  r = reduce("ReduceMean", example(), {1, -2});
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("more than once"), std::string::npos) << r.status.message();
  Tensor fa = Tensor::from<float>({1}, {1.f});
  r = run_op("ReduceSum", {&example(), &fa}, reduce_attrs(), 1, {false, true});
  EXPECT_FALSE(r.status.ok());
  // A non-upgraded node (axes attribute) is refused rather than silently reducing all.
  Attributes a = reduce_attrs();
  a.set("axes", Attribute::Ints({1}));
  r = run_op("ReduceMax", {&example()}, a);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("upgraded"), std::string::npos);
}

TEST(Reduce, InferenceWithSymbolicAndUnknownAxes) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 3, 1, 5}));
  Value* axes = g.add_value("axes", TensorType(DataType::kInt64, {2}));
  Value* axes_c = g.add_constant("axes_c", Tensor::from<int64_t>({1}, {1}));
  auto infer = [&](Value* ax, int64_t keep) {
    Node* n = g.add_node("ReduceSum", "", {x, ax}, {g.unique_name("y")});
    n->attrs = reduce_attrs(keep);
    std::vector<TensorType> out(1);
    InferContext ctx(*n, out);
    EXPECT_TRUE(find_op("", "ReduceSum")->infer(ctx).ok());
    return out[0];
  };
  EXPECT_EQ(infer(axes_c, 1).str(), "float32[N,1,1,5]");
  EXPECT_EQ(infer(axes_c, 0).str(), "float32[N,1,5]");
  EXPECT_EQ(infer(axes, 1).str(), "float32[?,?,1,?]");
  EXPECT_EQ(infer(axes, 0).str(), "float32[?,?]");
  EXPECT_EQ(infer(nullptr, 0).str(), "float32[]");
  Value* dyn = g.add_value("dyn", TensorType::unknown_rank(DataType::kInt64));
  EXPECT_FALSE(infer(dyn, 0).has_rank());
}

TEST(Reduce, UpgradeMovesAxesAttributeToInput) {
  struct Case {
    const char* op;
    int opset;
    bool moves;
  };
  for (const Case& c :
       {Case{"ReduceSum", 11, true}, Case{"ReduceSum", 13, false}, Case{"ReduceMean", 13, true},
        Case{"ReduceLogSumExp", 1, true}, Case{"ReduceMax", 18, false}}) {
    SCOPED_TRACE(std::string(c.op) + " opset " + std::to_string(c.opset));
    Graph g;
    Value* x = g.add_value("x", TensorType::of(example()));
    g.add_input(x);
    Node* n = g.add_node(c.op, "r", {x}, {"y"});
    n->attrs.set("axes", Attribute::Ints({-2}));
    n->attrs.set("keepdims", Attribute::Int(0));
    const OpDef* def = find_op("", c.op);
    ASSERT_TRUE(def && def->upgrade);
    ImportContext ictx(g, *n, c.opset);
    ASSERT_TRUE(def->upgrade(ictx).ok());
    if (!c.moves) {
      EXPECT_EQ(n->num_inputs(), 1u);
      continue;
    }
    EXPECT_FALSE(n->attrs.has("axes"));
    ASSERT_EQ(n->num_inputs(), 2u);
    ASSERT_TRUE(n->input(1)->is_constant());
    EXPECT_EQ(n->input(1)->constant->to_int64_vector(), (std::vector<int64_t>{-2}));
    // The upgraded node computes the old semantics.
    std::vector<Tensor> outs(1);
    KernelContext k(*n, {&example(), n->input(1)->constant.get()}, outs);
    ASSERT_TRUE(def->cpu(k).ok());
    EXPECT_EQ(outs[0].shape(), (std::vector<int64_t>{3, 2}));
  }
  // Old opset without axes: reduce all (no input added).
  Graph g;
  Value* x = g.add_value("x", TensorType::of(example()));
  Node* n = g.add_node("ReduceProd", "r", {x}, {"y"});
  ImportContext ictx(g, *n, 11);
  ASSERT_TRUE(find_op("", "ReduceProd")->upgrade(ictx).ok());
  EXPECT_EQ(n->num_inputs(), 1u);
}

}  // namespace
}  // namespace kiln::test
