// ONNX Attention (opset 23-25) and RotaryEmbedding: random data against a naive reference
// written out here (4-D heads, double), the 3-D packed form, grouped-query heads, past
// key/value, masks, softcap, qk_matmul_output, and errors.
#include <cmath>
#include <limits>

#include "op_test_util.h"

namespace kiln::test {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// Naive attention on 4-D [B,H,S,D] tensors; bias(b,h,i,j) is added to the scores.
template <typename Bias>
std::vector<double> naive(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                          Bias bias, double softcap = 0) {
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), D = q.dim(3);
  const int64_t Hkv = k.dim(1), L = k.dim(2), Dv = v.dim(3);
  std::vector<double> y(B * Hq * Sq * Dv, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t kh = h / (Hq / Hkv);
        std::vector<double> s(L);
        double mx = -kInf, sum = 0;
        for (int64_t j = 0; j < L; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < D; ++d)
            acc += q.at_double(((b * Hq + h) * Sq + i) * D + d) *
                   k.at_double(((b * Hkv + kh) * L + j) * D + d);
          acc *= scale;
          if (softcap > 0) acc = softcap * std::tanh(acc / softcap);
          s[j] = acc + bias(b, h, i, j);
          mx = std::max(mx, s[j]);
        }
        if (mx == -kInf) continue;  // fully masked: zeros
        for (double& x : s) sum += x = std::exp(x - mx);
        for (int64_t d = 0; d < Dv; ++d)
          for (int64_t j = 0; j < L; ++j)
            y[((b * Hq + h) * Sq + i) * Dv + d] +=
                s[j] / sum * v.at_double(((b * Hkv + kh) * L + j) * Dv + d);
      }
  return y;
}

auto no_bias = [](int64_t, int64_t, int64_t, int64_t) { return 0.0; };

TEST(Attention, FourDimsDefaultScaleAndAdditiveMask) {
  Tensor q = random_tensor({2, 3, 4, 8}), k = random_tensor({2, 3, 6, 8}),
         v = random_tensor({2, 3, 6, 5}), m = random_tensor({4, 6});
  OpRun r = run_op("Attention", {&q, &k, &v, &m}, {}, 1);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values(r.outputs[0], naive(q, k, v, 1 / std::sqrt(8.0), [&](auto, auto, auto i, auto j) {
                  return m.at_double(i * 6 + j);
                }));
}

TEST(Attention, GroupedQueryHeadsPackedWithPastAndCausal) {
  // 3-D: q 4 heads of 2, kv 2 heads; past of 3 keys; causal with offset 3.
  const int64_t B = 1, Sq = 2, Skv = 2, P = 3, D = 2;
  Tensor q3 = random_tensor({B, Sq, 4 * D}), k3 = random_tensor({B, Skv, 2 * D}),
         v3 = random_tensor({B, Skv, 2 * D});
  Tensor pk = random_tensor({B, 2, P, D}), pv = random_tensor({B, 2, P, D});
  Attributes a = attrs({{"q_num_heads", Int(4)},
                        {"kv_num_heads", Int(2)},
                        {"is_causal", Int(1)},
                        {"scale", Attribute::Float(0.7f)}});
  OpRun r = run_op("Attention", {&q3, &k3, &v3, nullptr, &pk, &pv}, a, 3);
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  // Unpack to 4-D and build the full K/V by hand.
  auto heads = [&](const Tensor& t, int64_t H, int64_t S) {
    Tensor o(DataType::kFloat32, {B, H, S, D});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d)
          o.data<float>()[(h * S + s) * D + d] =
              static_cast<float>(t.at_double((s * H + h) * D + d));
    return o;
  };
  Tensor q = heads(q3, 4, Sq), kc = heads(k3, 2, Skv), vc = heads(v3, 2, Skv);
  Tensor kf(DataType::kFloat32, {B, 2, P + Skv, D}), vf(DataType::kFloat32, {B, 2, P + Skv, D});
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t s = 0; s < P + Skv; ++s)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t o = (h * (P + Skv) + s) * D + d;
        kf.data<float>()[o] = static_cast<float>(s < P ? pk.at_double((h * P + s) * D + d)
                                                       : kc.at_double((h * Skv + s - P) * D + d));
        vf.data<float>()[o] = static_cast<float>(s < P ? pv.at_double((h * P + s) * D + d)
                                                       : vc.at_double((h * Skv + s - P) * D + d));
      }
  expect_values(r.outputs[1], values_d(kf));
  expect_values(r.outputs[2], values_d(vf));
  std::vector<double> y4 =
      naive(q, kf, vf, 0.7, [&](auto, auto, auto i, auto j) { return j <= i + P ? 0.0 : -kInf; });
  std::vector<double> y3(y4.size());  // back to [B, Sq, Hq * D]
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t s = 0; s < Sq; ++s)
      for (int64_t d = 0; d < D; ++d) y3[(s * 4 + h) * D + d] = y4[(h * Sq + s) * D + d];
  ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{B, Sq, 4 * D}));
  expect_values(r.outputs[0], y3);
}

TEST(Attention, BooleanMaskFullyMaskedRowSoftcapAndQkOutput) {
  Tensor q = random_tensor({1, 2, 3, 4}), k = random_tensor({1, 2, 3, 4}),
         v = random_tensor({1, 2, 3, 4});
  Tensor m(DataType::kBool, {3, 3});
  for (int64_t i = 0; i < 9; ++i) m.data<bool>()[i] = i >= 3 && (i % 2 == 0);  // row 0 masked
  for (int64_t mode : {0, 2, 3}) {
    OpRun r = run_op(
        "Attention", {&q, &k, &v, &m},
        attrs({{"softcap", Attribute::Float(0.5f)}, {"qk_matmul_output_mode", Int(mode)}}), 4);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    auto bias = [&](auto, auto, auto i, auto j) { return m.data<bool>()[i * 3 + j] ? 0.0 : -kInf; };
    expect_values(r.outputs[0], naive(q, k, v, 0.5, bias, 0.5));
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(r.outputs[0].at_double(i), 0.0);  // masked row
    ASSERT_EQ(r.outputs[3].shape(), (std::vector<int64_t>{1, 2, 3, 3}));
    const double s01 = [&] {  // head 0, query 1, key 0: softcapped score
      double acc = 0;
      for (int d = 0; d < 4; ++d) acc += q.at_double(4 + d) * k.at_double(d);
      return 0.5 * std::tanh(acc * 0.5 / 0.5);
    }();
    const double got = r.outputs[3].at_double(3);
    if (mode == 0) {
      EXPECT_NEAR(got, s01, 1e-5);
    } else if (mode == 2) {
      EXPECT_EQ(got, -kInf);  // (1, 0) is masked
    } else if (mode == 3) {
      EXPECT_EQ(got, 0.0);
    }
  }
}

TEST(Attention, BadInputIsOneLineError) {
  Tensor q = random_tensor({1, 4, 3, 4}), k = random_tensor({1, 3, 3, 4}),
         v = random_tensor({1, 3, 3, 4}), q3 = random_tensor({1, 3, 8});
  expect_error(run_op("Attention", {&q, &k, &v}, {}), "multiple of kv heads");
  expect_error(run_op("Attention", {&q3, &q3, &q3}, {}), "need q_num_heads and kv_num_heads");
  expect_error(run_op("Attention", {&q, &q3, &q3}, {}), "must all be 3-D or all 4-D");
  Tensor qi = I64({1, 1, 1, 1}, {1});
  expect_error(run_op("Attention", {&qi, &qi, &qi}, {}), "must be float16");
}

// --- RotaryEmbedding ---------------------------------------------------------------------------

TEST(RotaryEmbedding, HalvesInterleavedPartialAndPositionIds) {
  const int64_t B = 2, H = 2, S = 3, D = 6;
  Tensor x = random_tensor({B, H, S, D});
  Tensor cosc = random_tensor({5, 2}), sinc = random_tensor({5, 2});
  Tensor pos = I64({B, S}, {0, 1, 2, 4, 3, 1});
  for (int inter : {0, 1}) {
    OpRun r = run_op("RotaryEmbedding", {&x, &cosc, &sinc, &pos},
                     attrs({{"interleaved", Int(inter)}, {"rotary_embedding_dim", Int(4)}}));
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    std::vector<double> want = values_d(x);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t kk = 0; kk < 2; ++kk) {
            const int64_t base = ((b * H + h) * S + s) * D, p = pos.at_int(b * S + s);
            const int64_t i1 = base + (inter ? 2 * kk : kk),
                          i2 = base + (inter ? 2 * kk + 1 : kk + 2);
            const double c = cosc.at_double(p * 2 + kk), sn = sinc.at_double(p * 2 + kk);
            want[i1] = c * x.at_double(i1) - sn * x.at_double(i2);
            want[i2] = sn * x.at_double(i1) + c * x.at_double(i2);
          }
    expect_values(r.outputs[0], want);
  }
}

TEST(RotaryEmbedding, PackedHeadsWithPerBatchCachesMatchFourDims) {
  const int64_t B = 1, H = 2, S = 3, D = 4;
  Tensor x3 = random_tensor({B, S, H * D});
  Tensor x4(DataType::kFloat32, {B, H, S, D});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t d = 0; d < D; ++d)
        x4.data<float>()[(h * S + s) * D + d] =
            static_cast<float>(x3.at_double((s * H + h) * D + d));
  Tensor cosc = random_tensor({B, S, 2}), sinc = random_tensor({B, S, 2});
  OpRun r3 = run_op("RotaryEmbedding", {&x3, &cosc, &sinc}, attrs({{"num_heads", Int(H)}}));
  OpRun r4 = run_op("RotaryEmbedding", {&x4, &cosc, &sinc}, {});
  ASSERT_TRUE(r3.status.ok()) << r3.status.message();
  ASSERT_TRUE(r4.status.ok()) << r4.status.message();
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t d = 0; d < D; ++d)
        EXPECT_EQ(r3.outputs[0].at_double((s * H + h) * D + d),
                  r4.outputs[0].at_double((h * S + s) * D + d));
  expect_error(run_op("RotaryEmbedding", {&x3, &cosc, &sinc}, {}), "needs num_heads");
  Tensor bad = random_tensor({B, S, 3});
  expect_error(run_op("RotaryEmbedding", {&x4, &bad, &bad}, {}), "rotary_embedding_dim/2");
}

}  // namespace
}  // namespace kiln::test
