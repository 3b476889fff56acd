#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kiln/tensor.h"

namespace kiln {
namespace {

TEST(Half, RoundTripsEveryHalfValue) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = half_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
      continue;
    }
    EXPECT_EQ(float_to_half(f), h) << "bits " << b;
  }
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);       // tie -> even (down)
  EXPECT_EQ(float_to_half(1.0f + 3.0f / 2048), 0x3c02);       // tie -> even (up)
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                 // overflows to inf
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(5.96046448e-08f), 0x0001);          // smallest subnormal
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
}

TEST(BFloat16, RoundTrip) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(-1e6f, 1e6f);
  for (int i = 0; i < 1000; ++i) {
    const float f = d(rng);
    const float r = bfloat16_to_float(float_to_bfloat16(f));
    EXPECT_NEAR(r, f, std::fabs(f) / 128.0f);
  }
}

TEST(Tensor, CastAndReshape) {
  Tensor t = Tensor::from<float>({2, 3}, {1.5f, -2.5f, 3, 4, 5, 6});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.desc(), "float32[2,3]");
  Tensor i = t.cast(DataType::kInt32);
  EXPECT_EQ(i.data<int32_t>()[0], 1);
  EXPECT_EQ(i.data<int32_t>()[1], -2);
  auto r = t.reshaped({3, 2});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_FALSE(t.reshaped({4, 2}).ok());
  Tensor h = t.cast(DataType::kFloat16);
  EXPECT_FLOAT_EQ(static_cast<float>(h.data<Half>()[1]), -2.5f);
}

TEST(Tensor, ViewIsCopyOnWrite) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3});
  Tensor v = Tensor::view(DataType::kFloat32, {3}, owner->data(), owner);
  v.data<float>()[0] = 9;
  EXPECT_EQ((*owner)[0], 1);
  EXPECT_EQ(v.data<float>()[0], 9);
}

TEST(Tensor, EmptyTensor) {
  Tensor t(DataType::kFloat32, {0, 4});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.clone().numel(), 0);
}

}  // namespace
}  // namespace kiln
