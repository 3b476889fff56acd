// qoperator_to_qdq: ONNX Runtime's QOperator ops in their QDQ / float form agree with the ops' CPU
// references (the integer arithmetic ONNX defines): QLinearConv and QLinearMatMul within one
// output step where float rounding meets a half (rarely: at most 1% of the outputs), the
// Cast<float> of MatMulInteger / ConvInteger exactly (integer sums below 2^24 are exact in
// float32); and the forms that stay ops say why.
#include <random>

#include "pass_test_util.h"

namespace kiln::test {
namespace {

template <typename T>
Tensor rand_q(std::vector<int64_t> shape, int seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(std::numeric_limits<T>::lowest(),
                                       std::numeric_limits<T>::max());
  Tensor t(DTypeOf<T>::value, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = static_cast<T>(d(rng));
  return t;
}

Tensor floats(std::vector<int64_t> shape, std::vector<float> v) {
  return Tensor::from<float>(std::move(shape), std::move(v));
}

// x (float input) quantized with scale 1/64 and zero point zp of type T.
template <typename T>
Value* quantized_input(G& b, const std::string& name, std::vector<int64_t> shape, T zp) {
  return b.op("QuantizeLinear",
              {b.in(name, std::move(shape)), b.cf(1.f / 64), b.c(Tensor::scalar<T>(zp))});
}

// Runs g before and after the pass on the same inputs: quantized outputs (read as their
// dequantized float through a final DequantizeLinear with scale `step`) differ by at most one
// step, in at most 1% of the elements.
void expect_within_one_step(const Graph& g, const Graph& opt, double step) {
  const auto ins = random_inputs(g);
  const auto a = run_cpu(g, ins), b = run_cpu(opt, ins);
  ASSERT_EQ(a.size(), b.size());
  for (size_t o = 0; o < a.size(); ++o) {
    ASSERT_EQ(a[o].shape(), b[o].shape());
    int64_t differ = 0;
    for (int64_t i = 0; i < a[o].numel(); ++i) {
      const double d = std::abs(a[o].at_double(i) - b[o].at_double(i));
      EXPECT_LE(d, step * 1.0001) << "output " << o << " element " << i;
      differ += d > 0;
    }
    EXPECT_LE(differ * 100, a[o].numel()) << "output " << o << ": " << differ << " differ";
  }
}

Attributes conv_attrs(std::vector<int64_t> pads, std::vector<int64_t> strides, int64_t group,
                      std::vector<int64_t> dilations) {
  return attrs({{"pads", Attribute::Ints(pads)},
                {"strides", Attribute::Ints(strides)},
                {"group", Attribute::Int(group)},
                {"dilations", Attribute::Ints(dilations)}});
}

TEST(QoperatorToQdq, QLinearConvAndMatMulBecomeQdq) {
  G b;
  const float ys = 0.05f;
  // uint8 activations (zero point 128), int8 per-channel weights, an int32 bias, two groups.
  Value* x = quantized_input<uint8_t>(b, "x", {2, 4, 7, 6}, 128);
  Value* y1 = b.op(
      "QLinearConv",
      {x, b.cf(1.f / 64), b.c(Tensor::scalar<uint8_t>(128)), b.c(rand_q<int8_t>({6, 2, 3, 3}, 1)),
       b.c(floats({6}, {0.002f, 0.003f, 0.001f, 0.004f, 0.0025f, 0.0015f})),
       b.c(Tensor::from<int8_t>({6}, {0, 0, 0, 0, 0, 0})), b.cf(ys),
       b.c(Tensor::scalar<uint8_t>(120)),
       b.c(Tensor::from<int32_t>({6}, {100, -2000, 5, 70000, -3, 0}))},
      conv_attrs({1, 0, 1, 2}, {2, 1}, 2, {1, 2}));
  b.out(b.op("DequantizeLinear", {y1, b.cf(ys), b.c(Tensor::scalar<uint8_t>(120))}));
  // int8 asymmetric activations, uint8 per-tensor weights, no bias.
  Value* x2 = quantized_input<int8_t>(b, "x2", {1, 3, 5, 5}, -10);
  Value* y2 = b.op(
      "QLinearConv",
      {x2, b.cf(1.f / 64), b.c(Tensor::scalar<int8_t>(-10)), b.c(rand_q<uint8_t>({4, 3, 2, 2}, 2)),
       b.cf(0.003f), b.c(Tensor::scalar<uint8_t>(130)), b.cf(ys), b.c(Tensor::scalar<int8_t>(3))},
      conv_attrs({0, 0, 0, 0}, {1, 1}, 1, {1, 1}));
  b.out(b.op("DequantizeLinear", {y2, b.cf(ys), b.c(Tensor::scalar<int8_t>(3))}));
  // Batched QLinearMatMul: a per row (uint8), b per column (int8).
  Value* a = quantized_input<uint8_t>(b, "a", {2, 3, 8}, 100);
  Value* y3 = b.op("QLinearMatMul", {a, b.c(floats({3}, {1.f / 64, 1.f / 64, 1.f / 64})),
                                     b.c(Tensor::from<uint8_t>({3}, {100, 100, 100})),
                                     b.c(rand_q<int8_t>({8, 5}, 3)),
                                     b.c(floats({5}, {0.01f, 0.02f, 0.005f, 0.03f, 0.015f})),
                                     b.c(Tensor::from<int8_t>({5}, {0, 1, -1, 2, 0})), b.cf(0.1f),
                                     b.c(Tensor::scalar<int8_t>(0))});
  b.out(b.op("DequantizeLinear", {y3, b.cf(0.1f), b.c(Tensor::scalar<int8_t>(0))}));
  auto opt = b.g.clone();
  ASSERT_TRUE(optimize_graph(*opt, only({"qoperator_to_qdq"})).ok());
  EXPECT_EQ(count(*opt, "QLinearConv"), 0);
  EXPECT_EQ(count(*opt, "QLinearMatMul"), 0);
  EXPECT_EQ(count(*opt, "Conv"), 2);
  EXPECT_EQ(count(*opt, "MatMul"), 1);
  auto changed = run_pass(*opt, "qoperator_to_qdq", only({"qoperator_to_qdq"}));
  ASSERT_TRUE(changed.ok());
  EXPECT_FALSE(*changed);
  expect_within_one_step(b.g, *opt, 0.1);
}

TEST(QoperatorToQdq, IntegerProductsReadAsFloatBecomeFloat) {
  G b;
  // quantize_dynamic's form: DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul.
  Node* dq = b.node("DynamicQuantizeLinear", {b.in("x", {2, 5, 16})}, {}, 3);
  Value* mm = b.op("MatMulInteger", {dq->output(0), b.c(rand_q<int8_t>({16, 6}, 4)), dq->output(2),
                                     b.c(Tensor::scalar<int8_t>(3))});
  Value* f = b.op("Cast", {mm}, attrs({{"to", Attribute::Int(1)}}));
  b.out(b.op("Mul", {f, dq->output(1)}));
  // Per-row a zero point, per-column b zero point, uint8 x uint8.
  Value* a = b.op("QuantizeLinear",
                  {b.in("a", {4, 9}), b.cf(1.f / 64), b.c(Tensor::scalar<uint8_t>(128))});
  Value* mm2 = b.op("MatMulInteger", {a, b.c(rand_q<uint8_t>({9, 3}, 5)),
                                      b.c(Tensor::from<uint8_t>({4}, {128, 120, 130, 0})),
                                      b.c(Tensor::from<uint8_t>({3}, {7, 200, 0}))});
  b.out(b.op("Cast", {mm2}, attrs({{"to", Attribute::Int(1)}})));
  // ConvInteger with a per-channel w zero point.
  Value* x2 = b.op("QuantizeLinear",
                   {b.in("x2", {1, 2, 6, 5}), b.cf(1.f / 64), b.c(Tensor::scalar<int8_t>(0))});
  Value* ci = b.op("ConvInteger",
                   {x2, b.c(rand_q<int8_t>({3, 2, 3, 2}, 6)), b.c(Tensor::scalar<int8_t>(-4)),
                    b.c(Tensor::from<int8_t>({3}, {1, -2, 0}))},
                   conv_attrs({1, 1, 1, 0}, {1, 2}, 1, {1, 1}));
  b.out(b.op("Cast", {ci}, attrs({{"to", Attribute::Int(1)}})));
  auto opt = optimize_checked(b.g, {"qoperator_to_qdq"}, 1e-12);
  EXPECT_EQ(count(*opt, "MatMulInteger"), 0);
  EXPECT_EQ(count(*opt, "ConvInteger"), 0);
  EXPECT_EQ(count(*opt, "MatMul"), 2);
  EXPECT_EQ(count(*opt, "Conv"), 1);
}

TEST(QoperatorToQdq, OpsThatStaySayWhy) {
  G b;
  // The int32 is a graph output: it stays MatMulInteger.
  Value* a =
      b.op("QuantizeLinear", {b.in("a", {2, 4}), b.cf(1.f / 64), b.c(Tensor::scalar<int8_t>(0))});
  b.out(b.op("MatMulInteger", {a, b.c(rand_q<int8_t>({4, 3}, 7))}));
  // float16 scales (opset 21): the op computes their product in float16.
  Value* q = b.op("QLinearMatMul",
                  {a, b.c(Tensor::scalar<Half>(Half(0.02f))), b.c(Tensor::scalar<int8_t>(0)),
                   b.c(rand_q<int8_t>({4, 3}, 8)), b.c(Tensor::scalar<Half>(Half(0.01f))),
                   b.c(Tensor::scalar<int8_t>(0)), b.c(Tensor::scalar<Half>(Half(0.05f))),
                   b.c(Tensor::scalar<int8_t>(0))});
  b.out(q);
  auto probe = b.g.clone();
  bool changed = true;
  const auto notes = pass_notes(*probe, "qoperator_to_qdq", passes::qoperator_to_qdq, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "read other than by one Cast to float32")) << dump_notes(notes);
  EXPECT_TRUE(has_note(notes, "scales are not float32")) << dump_notes(notes);
  auto opt = b.g.clone();
  ASSERT_TRUE(optimize_graph(*opt, only({"qoperator_to_qdq"})).ok());
  EXPECT_EQ(count(*opt, "MatMulInteger"), 1);
  EXPECT_EQ(count(*opt, "QLinearMatMul"), 1);
}

TEST(QoperatorToQdq, BadZeroPointIsOneLineNamingTheNode) {
  G b;
  Value* a =
      b.op("QuantizeLinear", {b.in("a", {2, 4}), b.cf(1.f / 64), b.c(Tensor::scalar<uint8_t>(0))});
  Node* n = b.node("MatMulInteger",
                   {a, b.c(rand_q<int8_t>({4, 3}, 9)), b.c(Tensor::from<uint8_t>({3}, {1, 2, 3}))});
  b.out(n->output(0));
  const Status st = infer_shapes(b.g);
  ASSERT_TRUE(st.ok()) << st.message();
  auto ex = CpuExecutor::create(b.g);
  ASSERT_TRUE(ex.ok()) << ex.status().message();
  auto r = (*ex)->run(random_inputs(b.g));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(n->name), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("one per row of A"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

}  // namespace
}  // namespace kiln::test
