// float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) and int4/uint4: the conversions against values
// computed with numpy + ml_dtypes, and Cast / QuantizeLinear / DequantizeLinear on them.
#include <cmath>

#include "op_test_util.h"

namespace kiln::test {
namespace {

const std::vector<float> kX = {0.3f,   -1.7f,  3.1415f, 447.f, 460.f,    470.f,
                               -1000.f, 1e-3f, -2.5e-3f, 0.f,   57344.f, 60000.f};

// ml_dtypes: x.astype(t) (no saturation) and np.clip(x, finfo.min, finfo.max).astype(t).
struct Expect {
  DataType t;
  std::vector<int> nosat, sat;
};
const Expect kExpect[] = {
    {DataType::kFloat8E4M3FN,
     {42, 190, 69, 126, 126, 127, 255, 1, 129, 0, 127, 127},
     {42, 190, 69, 126, 126, 126, 254, 1, 129, 0, 126, 126}},
    {DataType::kFloat8E4M3FNUZ,
     {50, 198, 77, 128, 128, 128, 128, 1, 131, 0, 128, 128},
     {50, 198, 77, 127, 127, 127, 255, 1, 131, 0, 127, 127}},
    {DataType::kFloat8E5M2,
     {53, 191, 66, 95, 95, 95, 228, 20, 153, 0, 123, 123},
     {53, 191, 66, 95, 95, 95, 228, 20, 153, 0, 123, 123}},
    {DataType::kFloat8E5M2FNUZ,
     {57, 195, 70, 99, 99, 99, 232, 24, 157, 0, 127, 127},
     {57, 195, 70, 99, 99, 99, 232, 24, 157, 0, 127, 127}},
};

TEST(Float8, EncodeMatchesMlDtypes) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(std::string(dtype_name(e.t)));
    for (size_t i = 0; i < kX.size(); ++i) {
      EXPECT_EQ(float_to_float8(e.t, kX[i], false), e.nosat[i]) << kX[i];
      EXPECT_EQ(float_to_float8(e.t, kX[i], true), e.sat[i]) << kX[i];
    }
  }
}

TEST(Float8, EveryFiniteCodeRoundTripsAndNaNInfFollowTheFormat) {
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(std::string(dtype_name(e.t)));
    for (int c = 0; c < 256; ++c) {
      const float v = low_bit_to_float(e.t, static_cast<uint8_t>(c));
      if (std::isnan(v) || std::isinf(v)) continue;
      if (v == 0.f && c == 0x80) continue;  // -0 encodes as 0x80 again (not in fnuz)
      EXPECT_EQ(float_to_float8(e.t, v, false), c) << v;
    }
  }
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(low_bit_to_float(DataType::kFloat8E5M2, 0x7c)));
  EXPECT_EQ(float_to_float8(DataType::kFloat8E5M2, -inf, false), 0xfc);
  EXPECT_EQ(float_to_float8(DataType::kFloat8E5M2, -inf, true), 0xfb);  // -57344
  EXPECT_TRUE(std::isnan(low_bit_to_float(DataType::kFloat8E4M3FNUZ, 0x80)));
  EXPECT_EQ(float_to_float8(DataType::kFloat8E4M3FNUZ, -0.f, false), 0);  // no negative zero
  EXPECT_EQ(float_to_float8(DataType::kFloat8E4M3FN, NAN, true), 0x7f);
}

Tensor with_type(DataType t, std::vector<int64_t> shape, const std::vector<uint8_t>& stored) {
  Tensor x(t, std::move(shape));
  std::memcpy(x.raw(), stored.data(), stored.size());
  return x;
}

TEST(Cast, FloatToFloat8HonoursSaturateAndBack) {
  Tensor x = F32({12}, kX);
  for (const Expect& e : kExpect) {
    SCOPED_TRACE(std::string(dtype_name(e.t)));
    for (int sat : {0, 1}) {
      OpRun r = run_op("Cast", {&x}, attrs({{"to", Int(static_cast<int>(e.t))}, {"saturate", Int(sat)}}));
      ASSERT_TRUE(r.status.ok()) << r.status.message();
      expect_inferred_matches(r);
      const auto* got = static_cast<const uint8_t*>(r.outputs[0].raw());
      for (size_t i = 0; i < kX.size(); ++i) EXPECT_EQ(got[i], (sat ? e.sat : e.nosat)[i]) << i;
      // And back to float32: the decoded values.
      OpRun b = run_op("Cast", {&r.outputs[0]}, attrs({{"to", Int(1)}}));
      ASSERT_TRUE(b.status.ok()) << b.status.message();
      for (size_t i = 0; i < kX.size(); ++i) {
        const float want = low_bit_to_float(e.t, got[i]);
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(b.outputs[0].data<float>()[i]));
        else EXPECT_EQ(b.outputs[0].data<float>()[i], want);
      }
    }
  }
}

TEST(Cast, FloatToInt4WrapsLikeNumpy) {
  Tensor x = F32({7}, {-9.f, -8.f, -1.5f, 2.5f, 7.f, 8.f, 20.f});
  OpRun r = run_op("Cast", {&x}, attrs({{"to", Int(22)}}));  // int4
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt4);
  expect_values(r.outputs[0], {7, -8, -1, 2, 7, -8, 4});
  r = run_op("Cast", {&x}, attrs({{"to", Int(21)}}));  // uint4
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {7, 8, 15, 2, 7, 8, 4});
}

TEST(QuantizeLinear, BlockedInt4RoundsHalfEvenAndSaturates) {
  // x [2, 4], blocks of 2 along axis 1: scale [2, 2].
  Tensor x = F32({2, 4}, {0.5f, 1.5f, -20.f, 3.f, 2.5f, -2.5f, 100.f, -0.4f});
  Tensor s = F32({2, 2}, {1.f, 0.5f, 1.f, 2.f});
  Tensor zp = with_type(DataType::kInt4, {2, 2}, {0, 1, 0xff, 0});  // 0, 1, -1, 0
  OpRun r = run_op("QuantizeLinear", {&x, &s, &zp}, attrs({{"axis", Int(1)}, {"block_size", Int(2)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  // 0.5->0, 1.5->2 | -40+1 -> -8 (sat), 6+1=7 | 2.5->2-1=1, -2.5->-2-1=-3 | 50->7, -0.2->0
  expect_values(r.outputs[0], {0, 2, -8, 7, 1, -3, 7, 0});
  OpRun d = run_op("DequantizeLinear", {&r.outputs[0], &s, &zp},
                   attrs({{"axis", Int(1)}, {"block_size", Int(2)}}));
  ASSERT_TRUE(d.status.ok()) << d.status.message();
  expect_values(d.outputs[0], {0, 2, -4.5, 3, 2, -2, 14, 0});
}

TEST(QuantizeLinear, Float8RandomMatchesEncodeOfQuotient) {
  Tensor x = random_tensor({3, 5}, -600.f, 600.f);
  Tensor s = Tensor::scalar<float>(1.5f);
  Tensor zp = with_type(DataType::kFloat8E4M3FN, {}, {0});
  for (int sat : {0, 1}) {
    OpRun r = run_op("QuantizeLinear", {&x, &s, &zp}, attrs({{"saturate", Int(sat)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat8E4M3FN);
    const auto* got = static_cast<const uint8_t*>(r.outputs[0].raw());
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_EQ(got[i], float_to_float8(DataType::kFloat8E4M3FN, x.data<float>()[i] / 1.5f, sat));
  }
}

TEST(DequantizeLinear, Float8WithScaleAndOutputDtype) {
  Tensor x = with_type(DataType::kFloat8E5M2, {4}, {53, 191, 66, 0x7c});  // .3125 -1.75 3 inf
  Tensor s = F32({}, {2.f});
  OpRun r = run_op("DequantizeLinear", {&x, &s}, attrs({{"output_dtype", Int(10)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kFloat16);
  expect_inferred_matches(r);
  expect_values(r.outputs[0], {0.625, -3.5, 6, INFINITY});
}

TEST(LowBit, OtherOpsRefuseThemByName) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat8E4M3FN, {Dim(2)}));
  g.add_input(x);
  Node* n = g.add_node("Relu", "relu", {x}, {"y"});
  g.add_output(n->output(0));
  Status st = infer_shapes(g);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("node 'relu' (Relu"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("float8e4m3fn"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kiln::test
