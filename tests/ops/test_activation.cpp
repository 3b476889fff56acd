// Tests of the activation family: each op against its formula (default and explicit attributes,
// every float type), integer Relu/PRelu, PRelu broadcasting, attribute errors and upgrades.
#include <cmath>
#include <functional>
#include <limits>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

using DT = DataType;

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double clamp01(double v) { return std::min(1.0, std::max(0.0, v)); }

// Float attributes are float32 in ONNX, so formulas use the float32 value of each constant.
struct ActCase {
  const char* op;
  Attributes attrs;
  std::function<double(double)> fn;
};

std::vector<ActCase> cases() {
  const double selu_a = 1.67326319217681884765625, selu_g = 1.05070102214813232421875;
  return {
      {"Relu", {}, [](double x) { return std::max(x, 0.0); }},
      {"LeakyRelu", {}, [](double x) { return x < 0 ? double(0.01f) * x : x; }},
      {"LeakyRelu", attrs({{"alpha", Attribute::Float(0.25f)}}),
       [](double x) { return x < 0 ? 0.25 * x : x; }},
      {"Sigmoid", {}, sigmoid},
      {"Tanh", {}, [](double x) { return std::tanh(x); }},
      {"Elu", {}, [](double x) { return x < 0 ? std::exp(x) - 1 : x; }},
      {"Elu", attrs({{"alpha", Attribute::Float(2.f)}}),
       [](double x) { return x < 0 ? 2 * (std::exp(x) - 1) : x; }},
      {"Selu",
       {},
       [=](double x) { return x > 0 ? selu_g * x : selu_g * selu_a * (std::exp(x) - 1); }},
      {"Selu", attrs({{"alpha", Attribute::Float(2.f)}, {"gamma", Attribute::Float(3.f)}}),
       [](double x) { return x > 0 ? 3 * x : 3 * (2 * std::exp(x) - 2); }},
      {"Celu", {}, [](double x) { return std::max(0.0, x) + std::min(0.0, std::exp(x) - 1); }},
      {"Celu", attrs({{"alpha", Attribute::Float(2.f)}}),
       [](double x) { return std::max(0.0, x) + std::min(0.0, 2 * (std::exp(x / 2) - 1)); }},
      {"HardSigmoid", {}, [](double x) { return clamp01(double(0.2f) * x + 0.5); }},
      {"HardSigmoid", attrs({{"alpha", Attribute::Float(0.5f)}, {"beta", Attribute::Float(0.6f)}}),
       [](double x) { return clamp01(0.5 * x + double(0.6f)); }},
      {"HardSwish", {}, [](double x) { return x * clamp01(x / 6 + 0.5); }},
      {"Swish", {}, [](double x) { return x * sigmoid(x); }},
      {"Swish", attrs({{"alpha", Attribute::Float(1.5f)}}),
       [](double x) { return x * sigmoid(1.5 * x); }},
      {"Softplus", {}, [](double x) { return std::log(1 + std::exp(x)); }},
      {"Softsign", {}, [](double x) { return x / (1 + std::fabs(x)); }},
      {"Gelu", {}, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"Gelu", attrs({{"approximate", Attribute::String("tanh")}}),
       [](double x) {
         return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
       }},
      {"ThresholdedRelu", {}, [](double x) { return x > 1 ? x : 0; }},
      {"ThresholdedRelu", attrs({{"alpha", Attribute::Float(2.f)}}),
       [](double x) { return x > 2 ? x : 0; }},
      {"Shrink", {}, [](double x) { return x < -0.5  ? x
                                           : x > 0.5 ? x
                                                     : 0; }},
      {"Shrink", attrs({{"lambd", Attribute::Float(1.f)}, {"bias", Attribute::Float(0.5f)}}),
       [](double x) { return x < -1  ? x + 0.5
                             : x > 1 ? x - 0.5
                                     : 0; }},
      {"Mish", {}, [](double x) { return x * std::tanh(std::log(1 + std::exp(x))); }},
  };
}

TEST(Activation, MatchesFormulaInAllFloatTypes) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(std::string(c.op) + " " + std::to_string(c.attrs.all().size()) + " attrs");
    expect_unary_formula(c.op, random_tensor({3, 4, 5}, -4, 4), c.attrs, c.fn,
                         {1e-12, 2e-6, 2e-3, 1e-2});
  }
}

TEST(Activation, KnownValues) {
  const Tensor x = F32({3}, {-1, 0, 1});
  expect_values_scaled(run_op("Selu", {&x}, {}).outputs[0], {-1.1113307, 0, 1.0507010}, 1e-6);
  expect_values_scaled(run_op("HardSigmoid", {&x}, {}).outputs[0], {0.3, 0.5, 0.7}, 1e-6);
  expect_values_scaled(run_op("HardSwish", {&x}, {}).outputs[0], {-1.0 / 3, 0, 2.0 / 3}, 1e-6);
  expect_values_scaled(run_op("Elu", {&x}, {}).outputs[0], {-0.63212056, 0, 1}, 1e-6);
  expect_values_scaled(run_op("Gelu", {&x}, {}).outputs[0], {-0.15865525, 0, 0.84134475}, 1e-6);
}

TEST(Activation, ExtremeInputsStayFinite) {
  const Tensor x = F32({4}, {-200, -100, 100, 200});
  expect_values_scaled(run_op("Sigmoid", {&x}, {}).outputs[0], {0, 0, 1, 1}, 1e-6);
  expect_values_scaled(run_op("Softplus", {&x}, {}).outputs[0], {0, 0, 100, 200}, 1e-6);
  expect_values_scaled(run_op("Mish", {&x}, {}).outputs[0], {0, 0, 100, 200}, 1e-6);
  const Tensor n = F32({1}, {NAN});
  expect_values_scaled(run_op("Relu", {&n}, {}).outputs[0], {std::nan("")});
}

TEST(Activation, IntegerRelu) {
  const Tensor x = Tensor::from<int64_t>({3}, {-5, 0, 9});
  OpRun r = run_op("Relu", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DT::kInt64);
  expect_values_scaled(r.outputs[0], {0, 0, 9});
  const Tensor i8 = Tensor::from<int8_t>({2}, {-128, 127});
  expect_values_scaled(run_op("Relu", {&i8}, {}).outputs[0], {0, 127});
  const Tensor u = Tensor::from<uint8_t>({1}, {1});
  expect_error(run_op("Relu", {&u}, {}), "does not support");
  expect_error(run_op("Sigmoid", {&x}, {}), "does not support");
}

TEST(Activation, AttributeErrors) {
  const Tensor x = F32({1}, {1});
  expect_error(run_op("Gelu", {&x}, attrs({{"approximate", Attribute::String("fast")}})),
               "approximate");
  expect_error(run_op("Celu", {&x}, attrs({{"alpha", Attribute::Float(0.f)}})), "alpha");
}

TEST(Activation, EmptyTensor) {
  const Tensor x(DT::kFloat32, {2, 0});
  OpRun r = run_op("HardSwish", {&x}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{2, 0}));
}

TEST(PRelu, SlopeBroadcastsToX) {
  const Tensor x = random_tensor({2, 3, 4});
  const Tensor s3 = F32({3, 1}, {0.1f, 0.2f, 0.3f});
  OpRun r = run_op("PRelu", {&x, &s3}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  std::vector<double> want;
  for (int64_t i = 0; i < 24; ++i) {
    const double v = x.at_double(i);
    want.push_back(v < 0 ? v * 0.1 * ((i / 4) % 3 + 1) : v);
  }
  expect_values_scaled(r.outputs[0], want, 1e-6);
  const Tensor s4 = F32({4}, {1, 2, 3, 4});
  const Tensor xd = x.cast(DT::kFloat64), s4d = s4.cast(DT::kFloat64);
  OpRun rd = run_op("PRelu", {&xd, &s4d}, {});
  ASSERT_TRUE(rd.status.ok());
  for (int64_t i = 0; i < 24; ++i) {
    const double v = xd.at_double(i);
    EXPECT_DOUBLE_EQ(rd.outputs[0].at_double(i), v < 0 ? v * (i % 4 + 1) : v);
  }
}

TEST(PRelu, IntegersAndErrors) {
  const Tensor x = Tensor::from<int32_t>({3}, {-4, 0, 5});
  const Tensor s = Tensor::from<int32_t>({1}, {3});
  expect_values_scaled(run_op("PRelu", {&x, &s}, {}).outputs[0], {-12, 0, 5});
  // Unidirectional: the slope may not make the output bigger than X.
  const Tensor xs = F32({3, 1}, {1, 2, 3});
  const Tensor big = F32({3, 4}, {});
  expect_error(run_op("PRelu", {&xs, &big}, {}), "does not broadcast");
  const Tensor sf = F32({1}, {1});
  expect_error(run_op("PRelu", {&x, &sf}, {}), "different types");
}

TEST(PRelu, Opset6SlopeIsPerChannel) {
  // Constant slope and known X rank: the upgrade reshapes the slope to [C,1,1].
  Graph g;
  Value* x = g.add_value("x", TensorType(DT::kFloat32, {Dim(2), Dim(3), Dim(4), Dim(5)}));
  Value* s = g.add_constant("s", F32({3}, {0.1f, 0.2f, 0.3f}));
  Node* n = g.add_node("PRelu", "p", {x, s}, {"y"});
  ImportContext ctx(g, *n, 6);
  ASSERT_TRUE(find_op("", "PRelu")->upgrade(ctx).ok());
  ASSERT_TRUE(n->input(1)->is_constant());
  EXPECT_EQ(n->input(1)->constant->shape(), (std::vector<int64_t>{3, 1, 1}));
  EXPECT_TRUE(n->attrs.all().empty());
  // Variable slope: an attribute makes the kernel apply it per channel.
  Value* sv = g.add_value("sv", TensorType(DT::kFloat32, {Dim(3)}));
  Node* m = g.add_node("PRelu", "q", {x, sv}, {"z"});
  ImportContext ctx2(g, *m, 6);
  ASSERT_TRUE(find_op("", "PRelu")->upgrade(ctx2).ok());
  ASSERT_TRUE(m->attrs.has("kiln_prelu_channel_slope"));
  const Tensor tx = random_tensor({2, 3, 4});
  const Tensor ts = F32({3}, {0.1f, 0.2f, 0.3f});
  OpRun r = run_op("PRelu", {&tx, &ts}, m->attrs);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  for (int64_t i = 0; i < 24; ++i) {
    const double v = tx.at_double(i);
    EXPECT_NEAR(r.outputs[0].at_double(i), v < 0 ? v * 0.1 * ((i / 4) % 3 + 1) : v, 1e-6);
  }
  // Opset 7+: numpy broadcasting, slope[3] does not fit X[2,3,4].
  expect_error(run_op("PRelu", {&tx, &ts}, {}), "does not broadcast");
}

TEST(Activation, ConsumedInputsDroppedOnUpgrade) {
  expect_consumed_inputs_dropped(
      {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "HardSigmoid", "PRelu"});
}

}  // namespace
}  // namespace kiln::test
