// The INT8 representation and the CPU reference of INT8 layers, checked against independent
// integer loops (the arithmetic docs/quantization.md specifies), and the engine file's scales.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/cpu/cpu_executor.h"
#include "engine/plan_format.h"
#include "ops/op.h"
#include "passes/pass_test_util.h"
#include "quant/int8.h"

namespace kiln {
namespace {

using test::G;
using test::rand_t;

TEST(Int8, QuantizeRoundsHalfToEvenAndSaturates) {
  EXPECT_EQ(quant::quantize_value(2.5f, 1.f), 2);
  EXPECT_EQ(quant::quantize_value(3.5f, 1.f), 4);
  EXPECT_EQ(quant::quantize_value(-2.5f, 1.f), -2);
  EXPECT_EQ(quant::quantize_value(0.75f, 0.5f), 2);  // 1.5 -> 2
  EXPECT_EQ(quant::quantize_value(1000.f, 1.f), 127);
  EXPECT_EQ(quant::quantize_value(-1000.f, 1.f), -128);
  EXPECT_EQ(quant::quantize_value(NAN, 1.f), 0);
}

TEST(Int8, WeightScalesPerOutputChannel) {
  Tensor w = Tensor::from<float>({2, 3}, {0.5f, -2.f, 1.f, 0.f, 0.f, 0.f});
  auto s = quant::weight_scales(w, 0);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_FLOAT_EQ(s[0], 2.f / 127.f);
  EXPECT_FLOAT_EQ(s[1], 1.f);  // an all-zero channel
  auto s1 = quant::weight_scales(w, 1);
  ASSERT_EQ(s1.size(), 3u);
  EXPECT_FLOAT_EQ(s1[1], 2.f / 127.f);
  Tensor q = quant::quantize_weights(w, s, 0);
  EXPECT_EQ(q.data<int8_t>()[1], -127);
  EXPECT_EQ(q.data<int8_t>()[0], 32);  // 0.5 / (2/127) = 31.75
}

// Independent reference: NCHW conv, 3x3, stride 1, pad 1, integer loops.
std::vector<float> naive_int8_conv(const Tensor& x, float sx, const Tensor& w,
                                   const std::vector<float>& sw, const Tensor& b, const Tensor& z,
                                   float sz, float sy) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), K = w.dim(0);
  std::vector<float> out(static_cast<size_t>(N * K * H * W));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t ww = 0; ww < W; ++ww) {
          int32_t acc = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t r = 0; r < 3; ++r)
              for (int64_t s = 0; s < 3; ++s) {
                const int64_t ih = h + r - 1, iw = ww + s - 1;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const float xv = x.data<float>()[((n * C + c) * H + ih) * W + iw];
                const float wv = w.data<float>()[((k * C + c) * 3 + r) * 3 + s];
                acc += int32_t{quant::quantize_value(xv, sx)} * quant::quantize_value(wv, sw[k]);
              }
          const int64_t i = ((n * K + k) * H + h) * W + ww;
          float y = static_cast<float>(acc) * (sx * sw[k]);
          y += b.data<float>()[k];
          y += static_cast<float>(quant::quantize_value(z.data<float>()[i], sz)) * sz;
          y = std::max(y, 0.f);
          out[static_cast<size_t>(i)] = static_cast<float>(quant::quantize_value(y, sy)) * sy;
        }
  return out;
}

TEST(Int8, FusedConvReferenceMatchesIntegerLoops) {
  G b;
  Value* x = b.in("x", {2, 5, 6, 7});
  Value* zin = b.in("z", {2, 4, 6, 7});
  Tensor wt = rand_t({4, 5, 3, 3}), bt = rand_t({4}), xt = rand_t({2, 5, 6, 7}, -2, 2),
         zt = rand_t({2, 4, 6, 7});
  Value* w = b.c(wt);
  Value* bias = b.c(bt);
  Node* n = b.node("Conv", {x, w, bias, zin},
                   test::attrs({{"pads", Attribute::Ints({1, 1, 1, 1})},
                                {"kernel_shape", Attribute::Ints({3, 3})},
                                {"activation", Attribute::String("Relu")}}));
  n->op_type = "FusedConv";
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {2.f / 127};
  zin->quant_scales = {1.f / 127};
  n->output(0)->quant_scales = {0.05f};
  auto marked = quant::mark_int8_layers(b.g, {}, false);
  ASSERT_TRUE(marked.ok()) << marked.status().message();
  ASSERT_EQ(marked->int8_layers.size(), 1u);
  ASSERT_EQ(w->quant_scales.size(), 4u);
  EXPECT_EQ(w->quant_axis, 0);
  const auto got = test::run_cpu(b.g, {xt, zt});
  ASSERT_EQ(got.size(), 1u);
  const auto want = naive_int8_conv(xt, x->quant_scales[0], wt, w->quant_scales, bt, zt,
                                    zin->quant_scales[0], 0.05f);
  ASSERT_EQ(got[0].numel(), static_cast<int64_t>(want.size()));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(got[0].data<float>()[i], want[i]) << "element " << i;
}

// kiln.FusedConvPool (a stem and its max-pool) marked INT8: the convolution's INT8 arithmetic,
// then the 3x3/2 max-pool (padding 1) of the requantized values.
TEST(Int8, FusedConvPoolReferenceIsTheInt8ConvThenMaxPool) {
  G b;
  Value* x = b.in("x", {2, 3, 9, 8});
  Tensor wt = rand_t({4, 3, 3, 3}), bt = rand_t({4}), xt = rand_t({2, 3, 9, 8}, -2, 2);
  Value* w = b.c(wt);
  Value* bias = b.c(bt);
  Node* n = b.node("Conv", {x, w, bias},
                   test::attrs({{"pads", Attribute::Ints({1, 1, 1, 1})},
                                {"kernel_shape", Attribute::Ints({3, 3})},
                                {"activation", Attribute::String("Relu")},
                                {"pool_kernel_shape", Attribute::Ints({3, 3})},
                                {"pool_strides", Attribute::Ints({2, 2})},
                                {"pool_pads", Attribute::Ints({1, 1, 1, 1})}}));
  n->op_type = "FusedConvPool";
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {2.f / 127};
  n->output(0)->quant_scales = {0.05f};
  auto marked = quant::mark_int8_layers(b.g, {}, false);
  ASSERT_TRUE(marked.ok()) << marked.status().message();
  ASSERT_EQ(marked->int8_layers.size(), 1u);
  ASSERT_EQ(w->quant_scales.size(), 4u);
  const auto got = test::run_cpu(b.g, {xt});
  ASSERT_EQ(got.size(), 1u);
  const Tensor zero(DataType::kFloat32, {2, 4, 9, 8});
  const auto conv =
      naive_int8_conv(xt, x->quant_scales[0], wt, w->quant_scales, bt, zero, 1.f, 0.05f);
  ASSERT_EQ(got[0].shape(), (std::vector<int64_t>{2, 4, 5, 4}));
  for (int64_t i = 0; i < got[0].numel(); ++i) {
    const int64_t q = i % 4, p = (i / 4) % 5, k = (i / 20) % 4, m = i / 80;
    float want = -INFINITY;
    for (int64_t dy = 0; dy < 3; ++dy)
      for (int64_t dx = 0; dx < 3; ++dx) {
        const int64_t h = 2 * p - 1 + dy, ww = 2 * q - 1 + dx;
        if (h >= 0 && h < 9 && ww >= 0 && ww < 8)
          want = std::max(want, conv[static_cast<size_t>(((m * 4 + k) * 9 + h) * 8 + ww)]);
      }
    ASSERT_EQ(got[0].data<float>()[i], want) << "element " << i;
  }
}

TEST(Int8, GemmReferenceWithTransBAlphaAndC) {
  G b;
  Value* x = b.in("x", {3, 8});
  Tensor wt = rand_t({5, 8}), ct = rand_t({5}), xt = rand_t({3, 8});
  Value* w = b.c(wt);
  Value* y = b.op("Gemm", {x, w, b.c(ct)},
                  test::attrs({{"transB", Attribute::Int(1)},
                               {"alpha", Attribute::Float(0.5f)},
                               {"beta", Attribute::Float(2.f)}}));
  b.out(y);
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {1.f / 127};
  ASSERT_TRUE(quant::mark_int8_layers(b.g, {}, false).ok());
  ASSERT_EQ(b.g.nodes()[0]->op_type, "FusedGemm");
  const auto got = test::run_cpu(b.g, {xt});
  const auto& sw = w->quant_scales;
  for (int64_t m = 0; m < 3; ++m)
    for (int64_t n = 0; n < 5; ++n) {
      int32_t acc = 0;
      for (int64_t k = 0; k < 8; ++k)
        acc += int32_t{quant::quantize_value(xt.data<float>()[m * 8 + k], 1.f / 127)} *
               quant::quantize_value(wt.data<float>()[n * 8 + k], sw[n]);
      const float want =
          static_cast<float>(acc) * (1.f / 127 * sw[n]) * 0.5f + ct.data<float>()[n] * 2.f;
      ASSERT_EQ(got[0].data<float>()[m * 5 + n], want)
          << m << "," << n;  // output has no scale: float
    }
}

// Two MatMuls, x -> h -> y; x has an INT8 scale.
void two_matmuls(G& b, Value** h) {
  Value* x = b.in("x", {1, 4});
  *h = b.op("MatMul", {x, b.c(rand_t({4, 4}))});
  b.out(b.op("MatMul", {*h, b.c(rand_t({4, 2}))}));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {0.01f};
}

TEST(Int8, PinsAndMissingScalesKeepLayersFloat) {
  G b;
  Value* h = nullptr;
  two_matmuls(b, &h);
  const std::string first = b.g.nodes()[0]->name;
  auto s = quant::mark_int8_layers(b.g, {{first, "fp32"}}, false);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->int8_layers.empty());
  EXPECT_EQ(s->float_layers.at(first), "pinned to fp32");
  EXPECT_NE(s->float_layers.at(b.g.nodes()[1]->name).find("has no INT8 scale"), std::string::npos);
}

// "*" pins every layer not named (--layer-precisions '*:fp16,NAME:int8').
TEST(Int8, WildcardPinAppliesToLayersNotNamed) {
  G b;
  Value* h = nullptr;
  two_matmuls(b, &h);
  h->quant_scales = {0.02f};
  const std::string first = b.g.nodes()[0]->name, second = b.g.nodes()[1]->name;
  const std::map<std::string, std::string> pins = {{"*", "fp16"}, {second, "int8"}};
  ASSERT_NE(quant::layer_pin(pins, first), nullptr);
  EXPECT_EQ(*quant::layer_pin(pins, first), "fp16");
  EXPECT_EQ(*quant::layer_pin(pins, second), "int8");
  EXPECT_EQ(quant::layer_pin({{second, "int8"}}, first), nullptr);
  auto s = quant::mark_int8_layers(b.g, pins, false);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->float_layers.at(first), "pinned to fp16");
  EXPECT_EQ(s->float_layers.count(second), 0u);
}

TEST(Int8, EngineFileKeepsScalesAndRefusesBadOnes) {
  G b;
  Value* x = b.in("x", {1, 4});
  Value* w = b.c(rand_t({3, 4}));
  Value* y = b.op("Gemm", {x, w}, test::attrs({{"transB", Attribute::Int(1)}}));
  b.out(y);
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {0.25f};
  w->quant_scales = {0.1f, 0.2f, 0.3f};
  w->quant_axis = 0;
  EngineMetadata meta{"", "cpu", "cpu-x86_64", nlohmann::json::object(), nlohmann::json::object()};
  auto bytes = serialize_plan(b.g, meta);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto loaded = deserialize_plan(std::make_shared<std::vector<uint8_t>>(*bytes), "E.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Value* lw = loaded->graph->find_value(w->name);
  EXPECT_EQ(lw->quant_scales, w->quant_scales);
  EXPECT_EQ(lw->quant_axis, 0);
  EXPECT_EQ(loaded->graph->find_value("x")->quant_scales, std::vector<float>{0.25f});

  w->quant_scales = {0.1f, 0.2f};  // 2 scales for 3 channels: the writer refuses
  auto bad = serialize_plan(b.g, meta);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("2 INT8 scales along axis 0 of size 3"), std::string::npos);
  // A forged file with a negative scale: find x's scale (0.25f) and flip its sign.
  std::vector<uint8_t> img = *bytes;
  const uint32_t quarter = 0x3e800000u;
  bool patched = false;
  for (size_t i = 0; i + 4 <= img.size() && !patched; ++i)
    if (plan_internal::load_u32(&img[i]) == quarter) {
      plan_internal::store_u32(&img[i], quarter | 0x80000000u);
      patched = true;
    }
  ASSERT_TRUE(patched);
  plan_internal::reseal(img);
  auto forged = deserialize_plan(std::make_shared<std::vector<uint8_t>>(img), "E.kiln");
  ASSERT_FALSE(forged.ok());
  EXPECT_NE(forged.status().message().find("invalid INT8 scale"), std::string::npos)
      << forged.status().message();
}

// Independent reference of one INT8 1x1 convolution without padding (any stride), up to its
// bias: float(acc) * (sx * sw[k]) rounded as float32, + b[k] (float32) when there is a bias.
std::vector<float> naive_int8_1x1(const Tensor& x, float sx, const Tensor& w,
                                  const std::vector<float>& sw, const Tensor* b, int64_t stride) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), K = w.dim(0);
  const int64_t Ho = (H - 1) / stride + 1, Wo = (W - 1) / stride + 1;
  std::vector<float> out(static_cast<size_t>(N * K * Ho * Wo));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t h = 0; h < Ho; ++h)
        for (int64_t ww = 0; ww < Wo; ++ww) {
          int32_t acc = 0;
          for (int64_t c = 0; c < C; ++c) {
            const float xv = x.data<float>()[((n * C + c) * H + h * stride) * W + ww * stride];
            acc += int32_t{quant::quantize_value(xv, sx)} *
                   quant::quantize_value(w.data<float>()[k * C + c], sw[static_cast<size_t>(k)]);
          }
          const float scale = sx * sw[static_cast<size_t>(k)];
          float y = static_cast<float>(acc) * scale;
          if (b) y += b->data<float>()[k];
          out[static_cast<size_t>(((n * K + k) * Ho + h) * Wo + ww)] = y;
        }
  return out;
}

// kiln.FusedConvPair with int8 = 1: each convolution as its own INT8 product (its input's scale,
// its weights' per-channel scales, its bias), the two added in float32 (never quantized), then
// the activation and the output's requantization. The second convolution has stride 2, as
// ResNet's downsample. Marking gives W2 per-channel scales as it gives W.
TEST(Int8, FusedConvPairReferenceMatchesIntegerLoops) {
  struct Case {
    bool bias, bias2, relu, out_scale;
  };
  for (const Case c : {Case{true, true, true, true}, Case{false, false, false, false},
                       Case{false, false, true, true}, Case{true, false, true, false},
                       Case{false, true, false, true}}) {
    SCOPED_TRACE(::testing::Message() << "bias " << c.bias << " bias2 " << c.bias2 << " relu "
                                      << c.relu << " out_scale " << c.out_scale);
    G b;
    Value* x = b.in("x", {2, 8, 6, 6});
    Value* x2 = b.in("x2", {2, 4, 12, 12});
    const Tensor wt = rand_t({16, 8, 1, 1}), bt = rand_t({16}), w2t = rand_t({16, 4, 1, 1}),
                 b2t = rand_t({16}), xt = rand_t({2, 8, 6, 6}, -2, 2),
                 x2t = rand_t({2, 4, 12, 12}, -3, 3);
    Value* w = b.c(wt);
    Value* w2 = b.c(w2t);
    Attributes a = test::attrs({{"kernel_shape", Attribute::Ints({1, 1})},
                                {"conv2_kernel_shape", Attribute::Ints({1, 1})},
                                {"conv2_strides", Attribute::Ints({2, 2})}});
    if (c.relu) a.set("activation", Attribute::String("Relu"));
    Node* n =
        b.node("Conv", {x, w, c.bias ? b.c(bt) : nullptr, x2, w2, c.bias2 ? b.c(b2t) : nullptr}, a);
    n->op_type = "FusedConvPair";
    n->domain = "kiln";
    b.out(n->output(0));
    ASSERT_TRUE(infer_shapes(b.g).ok());
    x->quant_scales = {2.f / 127};
    x2->quant_scales = {3.f / 127};
    const float sy = 0.04f;
    if (c.out_scale) n->output(0)->quant_scales = {sy};
    EXPECT_EQ(quant::weight_channel_axis(*n), 0);
    auto marked = quant::mark_int8_layers(b.g, {}, false);
    ASSERT_TRUE(marked.ok()) << marked.status().message();
    ASSERT_EQ(marked->int8_layers.size(), 1u);
    ASSERT_EQ(w->quant_scales.size(), 16u);
    ASSERT_EQ(w2->quant_scales.size(), 16u);
    EXPECT_EQ(w2->quant_axis, 0);
    EXPECT_EQ(w2->quant_scales, quant::weight_scales(w2t, 0));

    const auto got = test::run_cpu(b.g, {xt, x2t});
    ASSERT_EQ(got.size(), 1u);
    const auto y1 =
        naive_int8_1x1(xt, x->quant_scales[0], wt, w->quant_scales, c.bias ? &bt : nullptr, 1);
    const auto y2 = naive_int8_1x1(x2t, x2->quant_scales[0], w2t, w2->quant_scales,
                                   c.bias2 ? &b2t : nullptr, 2);
    ASSERT_EQ(got[0].shape(), (std::vector<int64_t>{2, 16, 6, 6}));
    ASSERT_EQ(y1.size(), y2.size());
    for (size_t i = 0; i < y1.size(); ++i) {
      float y = y1[i] + y2[i];
      if (c.relu) y = std::max(y, 0.f);
      if (c.out_scale) y = static_cast<float>(quant::quantize_value(y, sy)) * sy;
      ASSERT_EQ(got[0].data<float>()[i], y) << "element " << i;
    }
  }
}

// int8_blocker checks the second convolution's input and weights as it checks the first's.
TEST(Int8, FusedConvPairBlockerChecksTheSecondConvolution) {
  G b;
  Value* x = b.in("x", {1, 8, 4, 4});
  Value* x2 = b.in("x2", {1, 4, 4, 4});
  Value* w2 = b.c(rand_t({16, 4, 1, 1}));
  Node* n = b.node("Conv", {x, b.c(rand_t({16, 8, 1, 1})), nullptr, x2, w2, nullptr},
                   test::attrs({{"kernel_shape", Attribute::Ints({1, 1})}}));
  n->op_type = "FusedConvPair";
  n->domain = "kiln";
  b.out(n->output(0));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {0.1f};
  EXPECT_EQ(quant::int8_blocker(*n), "input 'x2' has no INT8 scale");
  x2->quant_scales = {0.1f};
  EXPECT_EQ(quant::int8_blocker(*n), "");
  w2->quant_scales = {0.1f, 0.2f, 0.3f};
  w2->quant_axis = 0;
  EXPECT_EQ(quant::int8_blocker(*n),
            fmt::format("weight '{}' has 3 scales for 16 channels", w2->name));
  w2->quant_axis = 1;
  EXPECT_EQ(quant::int8_blocker(*n),
            fmt::format("weight '{}' has scales along axis 1, but its output channels are axis 0",
                        w2->name));
  // Weights computed at run time (not a constant).
  G c;
  Value* cx = c.in("x", {1, 8, 4, 4});
  Value* cx2 = c.in("x2", {1, 4, 4, 4});
  Value* cw2 = c.in("w2", {16, 4, 1, 1});
  Node* m = c.node("Conv", {cx, c.c(rand_t({16, 8, 1, 1})), nullptr, cx2, cw2, nullptr});
  m->op_type = "FusedConvPair";
  m->domain = "kiln";
  cx->quant_scales = {0.1f};
  cx2->quant_scales = {0.1f};
  m->output(0)->type = cx->type;
  EXPECT_EQ(quant::int8_blocker(*m), "its second weights are not a float32 constant");
  // Marked as INT8 but not runnable: the reference says why.
  n->attrs.set("int8", Attribute::Int(1));
  x2->quant_scales.clear();
  w2->quant_scales.clear();
  const auto ins = test::random_inputs(b.g);
  auto ex = CpuExecutor::create(b.g);
  ASSERT_TRUE(ex.ok()) << ex.status().message();
  auto r = (*ex)->run(ins);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("marked INT8 but cannot run in INT8: input 'x2' has no "
                                      "INT8 scale"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace kiln
