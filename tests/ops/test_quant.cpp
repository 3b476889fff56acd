#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

Attributes axis_attrs(int64_t axis, int64_t block_size = 0) {
  Attributes a;
  a.set("axis", Attribute::Int(axis));
  if (block_size) a.set("block_size", Attribute::Int(block_size));
  return a;
}

// ONNX test data (test_quantizelinear / test_dequantizelinear, opset 13).
TEST(QuantizeLinear, PerTensorUint8) {
  Tensor x = Tensor::from<float>({6}, {0, 2, 3, 1000, -254, -1000});
  Tensor s = Tensor::scalar<float>(2.f);
  Tensor z = Tensor::scalar<uint8_t>(128);
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kUInt8);
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{128, 129, 130, 255, 1, 0}));
  expect_inferred_matches(r);
}

TEST(QuantizeLinear, PerAxis) {
  Tensor x = Tensor::from<float>({1, 3, 3, 2}, {-162, 10, -100, 232, -20, -50, -76, 0, 0, 252, 32,
                                                -44, 245, -485, -960, -270, -375, -470});
  Tensor s = Tensor::from<float>({3}, {2, 4, 5});
  Tensor z = Tensor::from<uint8_t>({3}, {84, 24, 196});
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, {});  // axis defaults to 1
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].to_int64_vector(),
            (std::vector<int64_t>{3, 89, 34, 200, 74, 59, 5, 24, 24, 87, 32, 13, 245, 99, 4, 142,
                                  121, 102}));
  expect_inferred_matches(r);
  // The same with a negative axis.
  auto r2 = run_op("QuantizeLinear", {&x, &s, &z}, axis_attrs(-3));
  ASSERT_TRUE(r2.status.ok());
  EXPECT_EQ(r2.outputs[0].to_int64_vector(), r.outputs[0].to_int64_vector());
}

TEST(QuantizeLinear, RoundsHalfToEvenAndSaturatesInt8) {
  Tensor x = Tensor::from<float>({9}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 300, -300, 126.5f});
  Tensor s = Tensor::scalar<float>(1.f);
  Tensor z = Tensor::scalar<int8_t>(0);
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt8);
  EXPECT_EQ(r.outputs[0].to_int64_vector(),
            (std::vector<int64_t>{0, 2, 2, 0, -2, -2, 127, -128, 126}));
}

TEST(QuantizeLinear, DefaultZeroPointIsUint8Zero) {
  Tensor x = Tensor::from<float>({4}, {-1, 1, 2.6f, 1000});
  Tensor s = Tensor::scalar<float>(1.f);
  auto r = run_op("QuantizeLinear", {&x, &s}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kUInt8);
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{0, 1, 3, 255}));
  expect_inferred_matches(r);
}

TEST(QuantizeLinear, OutputDtypeInt16) {
  // Values from onnx.reference (opset 21, output_dtype=INT16).
  Tensor x = Tensor::from<float>({7}, {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 100000, -100000});
  Tensor s = Tensor::scalar<float>(1.f);
  Attributes a;
  a.set("output_dtype", Attribute::Int(static_cast<int64_t>(DataType::kInt16)));
  auto r = run_op("QuantizeLinear", {&x, &s}, a);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt16);
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{0, 2, 2, 0, -2, 32767, -32768}));
  expect_inferred_matches(r);
  // uint16 through the zero point's type.
  Tensor z = Tensor::scalar<uint16_t>(1000);
  auto r2 = run_op("QuantizeLinear", {&x, &s, &z}, {});
  ASSERT_TRUE(r2.status.ok());
  EXPECT_EQ(r2.outputs[0].dtype(), DataType::kUInt16);
  EXPECT_EQ(r2.outputs[0].to_int64_vector(),
            (std::vector<int64_t>{1000, 1002, 1002, 1000, 998, 65535, 0}));
}

TEST(QuantizeLinear, Blocked) {
  // Values from onnx.reference (opset 21, axis=1, block_size=3: blocks [0,3) and [3,5)).
  Tensor x = Tensor::from<float>({2, 5}, {-3.5f, 0.25f, 1, 7, 2.5f, 10, -10, 0.5f, 1.5f, -2.5f});
  Tensor s = Tensor::from<float>({2, 2}, {0.5f, 2, 1, 0.25f});
  Tensor z = Tensor::from<int8_t>({2, 2}, {1, -2, 0, 3});
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, axis_attrs(1, 3));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].to_int64_vector(),
            (std::vector<int64_t>{-6, 1, 3, 2, -1, 10, -10, 0, 9, -7}));
  auto d = run_op("DequantizeLinear", {&r.outputs[0], &s, &z}, axis_attrs(1, 3));
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  EXPECT_EQ(values_f(d.outputs[0]),
            (std::vector<float>{-3.5f, 0, 1, 8, 2, 10, -10, 0, 1.5f, -2.5f}));
  // Wrong block count.
  Tensor bad = Tensor::from<float>({2, 3}, {1, 1, 1, 1, 1, 1});
  auto e = run_op("QuantizeLinear", {&x, &bad}, axis_attrs(1, 3));
  EXPECT_FALSE(e.status.ok());
  EXPECT_NE(e.status.message().find("block"), std::string::npos) << e.status.message();
}

TEST(QuantizeLinear, RandomAgainstFormula) {
  Tensor x = random_tensor({4, 3, 5}, -50.f, 50.f);
  Tensor s = random_tensor({3}, 0.1f, 1.f);
  Tensor z = Tensor::from<int8_t>({3}, {-5, 0, 17});
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, axis_attrs(1));
  ASSERT_TRUE(r.status.ok());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t c = (i / 5) % 3;
    const float q = x.data<float>()[i] / s.data<float>()[c];
    double want = std::nearbyint(q) + z.data<int8_t>()[c];
    want = std::min(127.0, std::max(-128.0, want));
    EXPECT_EQ(r.outputs[0].at_int(i), static_cast<int64_t>(want)) << i;
  }
}

TEST(QuantizeLinear, HalfAndDoubleInputs) {
  Tensor x = Tensor::from<float>({3}, {1.f, 2.5f, -4.f});
  Tensor s = Tensor::scalar<float>(0.5f);
  Tensor z = Tensor::scalar<uint8_t>(10);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    Tensor xt = x.cast(t), st = s.cast(t);
    auto r = run_op("QuantizeLinear", {&xt, &st, &z}, {});
    ASSERT_TRUE(r.status.ok()) << dtype_name(t) << ": " << r.status.message();
    EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{12, 15, 2})) << dtype_name(t);
  }
  Tensor xi = Tensor::from<int32_t>({3}, {7, -7, 1000});
  Tensor si = Tensor::scalar<float>(2.f);
  auto r = run_op("QuantizeLinear", {&xi, &si}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{4, 0, 255}));
}

TEST(QuantizeLinear, NaNGoesToZeroPointAndInfSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = Tensor::from<float>({3}, {std::nanf(""), inf, -inf});
  Tensor s = Tensor::scalar<float>(1.f);
  Tensor z = Tensor::scalar<int8_t>(3);
  auto r = run_op("QuantizeLinear", {&x, &s, &z}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{3, 127, -128}));
}

TEST(QuantizeLinear, EmptyInput) {
  Tensor x(DataType::kFloat32, {0, 3});
  Tensor s = Tensor::from<float>({3}, {1, 2, 3});
  auto r = run_op("QuantizeLinear", {&x, &s}, axis_attrs(1));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 3}));
  expect_inferred_matches(r);
}

TEST(QuantizeLinear, Errors) {
  Tensor x = random_tensor({2, 3});
  Tensor s = Tensor::scalar<float>(1.f);
  Attributes f8;
  // float8 and int4 targets are supported (test_lowbit.cpp); float4 and 2-bit are not.
  f8.set("output_dtype", Attribute::Int(23));
  auto r = run_op("QuantizeLinear", {&x, &s}, f8);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("float4e2m1"), std::string::npos) << r.status.message();
  EXPECT_NE(r.status.message().find("n0"), std::string::npos);
  Attributes i2;
  i2.set("output_dtype", Attribute::Int(26));
  EXPECT_NE(run_op("QuantizeLinear", {&x, &s}, i2).status.message().find("int2"),
            std::string::npos);
  // output_dtype disagreeing with the zero point.
  Tensor z = Tensor::scalar<int8_t>(0);
  Attributes u8;
  u8.set("output_dtype", Attribute::Int(2));
  EXPECT_FALSE(run_op("QuantizeLinear", {&x, &s, &z}, u8).status.ok());
  // Zero point of a non-quantized type.
  Tensor zf = Tensor::scalar<int32_t>(0);
  EXPECT_FALSE(run_op("QuantizeLinear", {&x, &s, &zf}, {}).status.ok());
  // Per-axis scale of the wrong length, scale/zero-point shape mismatch, bad axis.
  Tensor s2 = Tensor::from<float>({2}, {1, 2});
  r = run_op("QuantizeLinear", {&x, &s2}, axis_attrs(1));
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("per-axis"), std::string::npos) << r.status.message();
  Tensor s3 = Tensor::from<float>({3}, {1, 2, 3});
  Tensor z2 = Tensor::from<uint8_t>({2}, {1, 2});
  EXPECT_FALSE(run_op("QuantizeLinear", {&x, &s3, &z2}, axis_attrs(1)).status.ok());
  EXPECT_FALSE(run_op("QuantizeLinear", {&x, &s3}, axis_attrs(2)).status.ok());
  // Integer scale, missing scale.
  Tensor si = Tensor::scalar<int32_t>(1);
  EXPECT_FALSE(run_op("QuantizeLinear", {&x, &si}, {}).status.ok());
  EXPECT_FALSE(run_op("QuantizeLinear", {&x}, {}).status.ok());
}

TEST(DequantizeLinear, PerTensorAndPerAxis) {
  Tensor x = Tensor::from<uint8_t>({4}, {0, 3, 128, 255});
  Tensor s = Tensor::scalar<float>(2.f);
  Tensor z = Tensor::scalar<uint8_t>(128);
  auto r = run_op("DequantizeLinear", {&x, &s, &z}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat32);
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{-256, -250, 0, 254}));
  expect_inferred_matches(r);

  Tensor xa = Tensor::from<uint8_t>(
      {1, 3, 3, 2}, {3, 89, 34, 200, 74, 59, 5, 24, 24, 87, 32, 13, 245, 99, 4, 142, 121, 102});
  Tensor sa = Tensor::from<float>({3}, {2, 4, 5});
  Tensor za = Tensor::from<uint8_t>({3}, {84, 24, 196});
  auto ra = run_op("DequantizeLinear", {&xa, &sa, &za}, {});
  ASSERT_TRUE(ra.status.ok()) << ra.status.message();
  EXPECT_EQ(values_f(ra.outputs[0]),
            (std::vector<float>{-162, 10, -100, 232, -20, -50, -76, 0, 0, 252, 32, -44, 245, -485,
                                -960, -270, -375, -470}));
  expect_inferred_matches(ra);
}

TEST(DequantizeLinear, Int32WithoutZeroPointAndInt16) {
  Tensor x = Tensor::from<int32_t>({3}, {-100000, 0, 7});
  Tensor s = Tensor::scalar<float>(0.5f);
  auto r = run_op("DequantizeLinear", {&x, &s}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{-50000, 0, 3.5f}));
  Tensor x16 = Tensor::from<int16_t>({2}, {-32768, 32767});
  Tensor z16 = Tensor::scalar<int16_t>(-1);
  auto r16 = run_op("DequantizeLinear", {&x16, &s, &z16}, {});
  ASSERT_TRUE(r16.status.ok()) << r16.status.message();
  EXPECT_EQ(values_f(r16.outputs[0]), (std::vector<float>{-16383.5f, 16384}));
}

TEST(DequantizeLinear, OutputTypeFollowsScale) {
  Tensor x = Tensor::from<int8_t>({3}, {-128, 5, 127});
  Tensor z = Tensor::scalar<int8_t>(1);
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    Tensor s = Tensor::scalar<float>(0.25f).cast(t);
    auto r = run_op("DequantizeLinear", {&x, &s, &z}, {});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), t);
    EXPECT_EQ(values_f(r.outputs[0]), (std::vector<float>{-32.25f, 1, 31.5f})) << dtype_name(t);
    expect_inferred_matches(r);
  }
}

TEST(DequantizeLinear, RoundTripsQuantize) {
  Tensor x = random_tensor({3, 8}, -3.f, 3.f);
  Tensor s = Tensor::from<float>({3}, {0.05f, 0.02f, 0.1f});
  Tensor z = Tensor::from<int8_t>({3}, {0, -10, 4});
  auto q = run_op("QuantizeLinear", {&x, &s, &z}, axis_attrs(0));
  ASSERT_TRUE(q.status.ok()) << q.status.message();
  auto d = run_op("DequantizeLinear", {&q.outputs[0], &s, &z}, axis_attrs(0));
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float sc = s.data<float>()[i / 8];
    const float v = x.data<float>()[i];
    const float lo = (-128 - z.data<int8_t>()[i / 8]) * sc,
                hi = (127 - z.data<int8_t>()[i / 8]) * sc;
    EXPECT_NEAR(d.outputs[0].at_double(i), std::min(hi, std::max(lo, v)), sc / 2 + 1e-6) << i;
  }
}

TEST(DequantizeLinear, Errors) {
  Tensor x = Tensor::from<uint8_t>({2}, {1, 2});
  Tensor s = Tensor::scalar<float>(1.f);
  Tensor z = Tensor::scalar<int8_t>(0);
  auto r = run_op("DequantizeLinear", {&x, &s, &z}, {});
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("zero point"), std::string::npos) << r.status.message();
  Tensor xf = random_tensor({2});
  EXPECT_FALSE(run_op("DequantizeLinear", {&xf, &s}, {}).status.ok());
  Tensor si = Tensor::scalar<int32_t>(1);
  EXPECT_FALSE(run_op("DequantizeLinear", {&x, &si}, {}).status.ok());
  Tensor s3 = Tensor::from<float>({3}, {1, 2, 3});
  EXPECT_FALSE(run_op("DequantizeLinear", {&x, &s3}, axis_attrs(0)).status.ok());
}

// Expected values from onnx.reference (the first two are ONNX's own test inputs).
TEST(DynamicQuantizeLinear, KnownValues) {
  struct Case {
    std::vector<float> x;
    std::vector<int64_t> y;
    float scale;
    int64_t zp;
  };
  const std::vector<Case> cases = {
      {{0, 2, -3, -2.5f, 1.34f, 0.5f}, {153, 255, 0, 26, 221, 179}, 0.0196078438f, 153},
      {{-1, -2.1f, -1.3f, -2.5f, -3.34f, -4}, {191, 121, 172, 96, 42, 0}, 0.0156862754f, 255},
      {{0, 0, 0}, {0, 0, 0}, 0.00392156886f, 0},
      {{1, 2, 3}, {85, 170, 255}, 0.0117647061f, 0},
  };
  for (const Case& c : cases) {
    Tensor x = Tensor::from<float>({static_cast<int64_t>(c.x.size())}, c.x);
    auto r = run_op("DynamicQuantizeLinear", {&x}, {}, 3);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].to_int64_vector(), c.y);
    EXPECT_FLOAT_EQ(r.outputs[1].data<float>()[0], c.scale);
    EXPECT_EQ(r.outputs[2].at_int(0), c.zp);
    expect_inferred_matches(r);
  }
}

TEST(DynamicQuantizeLinear, EmptyNaNAndErrors) {
  Tensor e(DataType::kFloat32, {0, 2});
  auto r = run_op("DynamicQuantizeLinear", {&e}, {}, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{0, 2}));
  expect_inferred_matches(r);
  Tensor x = Tensor::from<float>({3}, {std::nanf(""), 2.55f, -2.55f});
  r = run_op("DynamicQuantizeLinear", {&x}, {}, 3);
  ASSERT_TRUE(r.status.ok());
  EXPECT_FLOAT_EQ(r.outputs[1].data<float>()[0], 0.02f);
  EXPECT_EQ(r.outputs[2].at_int(0), 128);  // 127.5 rounds to even
  EXPECT_EQ(r.outputs[0].to_int64_vector(), (std::vector<int64_t>{128, 255, 0}));
  Tensor xi = Tensor::from<int32_t>({1}, {1});
  EXPECT_FALSE(run_op("DynamicQuantizeLinear", {&xi}, {}, 3).status.ok());
}

}  // namespace
}  // namespace kiln::test
