// Conv family cases: Conv (1-3 spatial axes, strides, dilations, groups, depthwise, asymmetric
// and SAME padding), kiln.FusedConv (bias, residual, every fused activation) and ConvTranspose.
#include <tuple>
#include <cmath>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

OpCase conv(std::string name, std::vector<int64_t> x, std::vector<int64_t> w, Attributes a,
            bool bias = true, std::vector<std::string> modes = {"fp32", "tf32", "fp16", "nhwc16"}) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = "Conv";
  c.attrs = std::move(a);
  const double k = 1.0 / std::sqrt(static_cast<double>(w[1] * (w.size() > 2 ? w[2] : 1)));
  c.inputs = {in(x), konst_random(w, k)};
  if (bias) c.inputs.push_back(konst_random({w[0]}, 0.5));
  c.modes = std::move(modes);
  return c;
}

}  // namespace

std::vector<OpCase> conv_cases() {
  std::vector<OpCase> v;
  v.push_back(conv("3x3_pad1", {2, 8, 9, 11}, {16, 8, 3, 3}, attrs({{"pads", ints_attr({1, 1, 1, 1})}})));
  v.push_back(conv("1x1", {3, 16, 7, 7}, {8, 16, 1, 1}, {}));
  v.push_back(conv("7x7_s2_stem", {2, 3, 32, 32}, {16, 3, 7, 7},
                   attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}})));
  v.push_back(conv("strided_no_bias", {1, 4, 10, 10}, {6, 4, 3, 3},
                   attrs({{"strides", ints_attr({2, 3})}}), false));
  v.push_back(conv("dilated", {1, 4, 12, 12}, {4, 4, 3, 3},
                   attrs({{"dilations", ints_attr({2, 2})}, {"pads", ints_attr({2, 2, 2, 2})}})));
  v.push_back(conv("grouped", {2, 8, 6, 6}, {12, 2, 3, 3},
                   attrs({{"group", Attribute::Int(4)}, {"pads", ints_attr({1, 1, 1, 1})}})));
  v.push_back(conv("depthwise", {2, 16, 9, 9}, {16, 1, 3, 3},
                   attrs({{"group", Attribute::Int(16)}, {"pads", ints_attr({1, 1, 1, 1})}})));
  // Depthwise shapes kiln's own kernel takes (vector path: C % 8 == 0; scalar path: C = 6),
  // MobileNet's ReLU6 and a residual, strides and 5x5 (EfficientNet).
  for (int64_t C : {int64_t(24), int64_t(6)}) {
    for (int s : {1, 2}) {
      OpCase c = conv("dw_fused_c" + std::to_string(C) + "_s" + std::to_string(s), {2, C, 11, 10},
                      {C, 1, s == 1 ? 3 : 5, s == 1 ? 3 : 5},
                      attrs({{"group", Attribute::Int(C)}, {"strides", ints_attr({s, s})},
                             {"pads", ints_attr(s == 1 ? std::vector<int64_t>{1, 1, 1, 1}
                                                       : std::vector<int64_t>{2, 2, 2, 2})},
                             {"activation", Attribute::String("Clip")},
                             {"act_min", Attribute::Float(0.f)}, {"act_max", Attribute::Float(0.6f)}}));
      c.op_type = "FusedConv";
      c.domain = "kiln";
      if (s == 1) {
        c.inputs.push_back(in({2, C, 11, 10}));
        c.attrs.set("activation", Attribute::String("Relu"));
      }
      v.push_back(c);
    }
  }
  // ConvNeXt's 7x7 (pad 3) and the strip kernel's edges: widths that are not a multiple of its
  // strips, stride 2 with an odd width, a 3x3 stride-2 layer of odd size.
  for (const auto& [k, s, W] : {std::tuple<int, int, int64_t>{7, 1, 13}, {7, 2, 15},
                                {3, 2, 9}, {5, 1, 17}}) {
    v.push_back(conv("dw_k" + std::to_string(k) + "_s" + std::to_string(s) + "_w" +
                         std::to_string(W),
                     {2, 16, 7, W}, {16, 1, k, k},
                     attrs({{"group", Attribute::Int(16)}, {"strides", ints_attr({s, s})},
                            {"pads", ints_attr({k / 2, k / 2, k / 2, k / 2})}})));
  }
  // Larger depthwise layers: channel counts that are not a power of two, taller maps, three images;
  // channels not a multiple of the tile kernels' 32 (their last channel block is part empty).
  for (const auto& [C, k, s, H] : {std::tuple<int64_t, int, int, int64_t>{40, 7, 1, 37},
                                   {96, 3, 2, 35}, {64, 5, 1, 19}, {24, 3, 1, 11},
                                   {40, 5, 2, 13}, {8, 7, 1, 9}}) {
    v.push_back(conv("dw_c" + std::to_string(C) + "_k" + std::to_string(k) + "_s" +
                         std::to_string(s),
                     {3, C, H, 19}, {C, 1, k, k},
                     attrs({{"group", Attribute::Int(C)}, {"strides", ints_attr({s, s})},
                            {"pads", ints_attr({k / 2, k / 2, k / 2, k / 2})}})));
  }
  // TensorFlow's SAME padding folded into the convolution (fold_pad_into_conv): fewer rows and
  // columns before than after (stride 2 on even maps), and a stride-1 layer padded after only.
  for (const auto& [C, k, s, H, lo, hi] :
       {std::tuple<int64_t, int, int, int64_t, int64_t, int64_t>{32, 3, 2, 14, 0, 1},
        {64, 5, 2, 12, 1, 2}, {24, 3, 1, 9, 0, 2}}) {
    v.push_back(conv("dw_tf_same_c" + std::to_string(C) + "_k" + std::to_string(k) + "_s" +
                         std::to_string(s),
                     {2, C, H, H + 2}, {C, 1, k, k},
                     attrs({{"group", Attribute::Int(C)}, {"strides", ints_attr({s, s})},
                            {"pads", ints_attr({lo, lo, hi, hi})}})));
  }
  {  // EfficientNet's depthwise layer with its SiLU (Swish) and a residual: kiln's kernel only
    OpCase c = conv("dw_fused_swish", {2, 24, 9, 13}, {24, 1, 5, 5},
                    attrs({{"group", Attribute::Int(24)}, {"pads", ints_attr({2, 2, 2, 2})},
                           {"activation", Attribute::String("Swish")}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    c.inputs.push_back(in({2, 24, 9, 13}));
    v.push_back(c);
  }
  // Depthwise with a channel multiplier (group = C, M = K x C): FastViT's and MobileOne's 7x7
  // stride-2 downsampling (K = 2, the vector path at C = 8), K = 2 at C = 3 and K = 3 (scalar
  // paths), bias-free and fused.
  for (const auto& [C, K, k, s] : {std::tuple<int64_t, int64_t, int, int>{8, 2, 7, 2},
                                   {3, 2, 3, 1}, {4, 3, 3, 2}}) {
    v.push_back(conv("dw_mult" + std::to_string(K) + "_c" + std::to_string(C) + "_k" +
                         std::to_string(k) + "_s" + std::to_string(s),
                     {2, C, 13, 11}, {K * C, 1, k, k},
                     attrs({{"group", Attribute::Int(C)}, {"strides", ints_attr({s, s})},
                            {"pads", ints_attr({k / 2, k / 2, k / 2, k / 2})}}),
                     false));
  }
  {
    OpCase c = conv("dw_mult2_fused_gelu", {2, 16, 9, 10}, {32, 1, 3, 3},
                    attrs({{"group", Attribute::Int(16)}, {"pads", ints_attr({1, 1, 1, 1})},
                           {"activation", Attribute::String("Gelu")}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    c.inputs.push_back(in({2, 32, 9, 10}));
    v.push_back(c);
  }
  // kiln.FusedConvMean (a squeeze-excitation block's pool as the depthwise layer's second
  // output, made by the tile kernels): 3x3, 5x5 and 7x7 at strides 1 and 2, channels in part
  // blocks of 32 (40, 24) and whole ones, maps of many tiles and odd sizes, three images, SiLU,
  // ReLU, none, a residual. The tuner runs each several times first, so a mean's sums left
  // behind by one run would show in the next.
  for (const auto& [C, k, s, H, W, act, res] :
       {std::tuple<int64_t, int, int, int64_t, int64_t, const char*, bool>{40, 3, 1, 37, 19, "Swish", false},
        {24, 5, 2, 29, 30, "Swish", false},
        {64, 7, 1, 15, 15, "Relu", true},
        {96, 3, 2, 17, 9, "", false},
        {8, 5, 1, 7, 5, "Sigmoid", false}}) {
    OpCase c = conv("dw_mean_c" + std::to_string(C) + "_k" + std::to_string(k) + "_s" +
                        std::to_string(s),
                    {3, C, H, W}, {C, 1, k, k},
                    attrs({{"group", Attribute::Int(C)}, {"strides", ints_attr({s, s})},
                           {"pads", ints_attr({k / 2, k / 2, k / 2, k / 2})}}));
    c.op_type = "FusedConvMean";
    c.domain = "kiln";
    c.num_outputs = 2;
    if (*act) c.attrs.set("activation", Attribute::String(act));
    if (res) c.inputs.push_back(in({3, C, (H - 1) / s + 1, (W - 1) / s + 1}));
    v.push_back(c);
  }
  v.push_back(conv("depthwise_dilated_nobias", {1, 16, 9, 9}, {16, 1, 3, 3},
                   attrs({{"group", Attribute::Int(16)}, {"dilations", ints_attr({2, 2})},
                          {"pads", ints_attr({2, 2, 2, 2})}}), false));
  v.push_back(conv("asymmetric_pads", {1, 3, 8, 8}, {5, 3, 3, 3},
                   attrs({{"pads", ints_attr({0, 1, 2, 1})}})));
  v.push_back(conv("same_upper_s2", {1, 3, 9, 8}, {4, 3, 3, 3},
                   attrs({{"auto_pad", Attribute::String("SAME_UPPER")}, {"strides", ints_attr({2, 2})}})));
  v.push_back(conv("conv1d", {2, 4, 17}, {6, 4, 3}, attrs({{"pads", ints_attr({1, 1})}}), true,
                   {"fp32", "fp16"}));
  v.push_back(conv("conv3d", {1, 2, 5, 6, 7}, {3, 2, 3, 3, 3}, attrs({{"pads", ints_attr({1, 1, 1, 1, 1, 1})}}),
                   true, {"fp32", "fp16"}));
  v.push_back(conv("empty_batch", {0, 4, 5, 5}, {4, 4, 3, 3}, {}, true, {"fp32"}));
  {
    OpCase c = conv("float64", {1, 3, 6, 6}, {4, 3, 3, 3}, {}, true, {"fp32"});
    for (auto& i : c.inputs) {
      if (i.value) i.value = i.value->cast(DataType::kFloat64);
      i.dtype = DataType::kFloat64;
    }
    v.push_back(c);
  }
  // FusedConv: bias + activation, + residual.
  for (const char* act :
       {"", "Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSwish", "Gelu", "Swish"}) {
    OpCase c = conv(std::string("fused_") + (act[0] ? act : "none"), {2, 8, 7, 7}, {16, 8, 3, 3},
                    attrs({{"pads", ints_attr({1, 1, 1, 1})}, {"activation", Attribute::String(act)}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    if (std::string(act) == "Clip") {
      c.attrs.set("act_min", Attribute::Float(-0.5f));
      c.attrs.set("act_max", Attribute::Float(0.7f));
    }
    if (std::string(act) == "LeakyRelu") c.attrs.set("act_alpha", Attribute::Float(0.2f));
    if (std::string(act) == "Swish") c.attrs.set("act_alpha", Attribute::Float(1.702f));
    v.push_back(c);
  }
  // Grouped FusedConv (ResNeXt's and RegNet's 3x3; NFNet's group size 64 with SiLU): cuDNN's
  // graph API takes groups and any of its pointwise activations, the legacy layer the rest.
  for (const char* act : {"Relu", "Swish", "Gelu"}) {
    OpCase c = conv(std::string("fused_grouped_") + act, {2, 16, 7, 7}, {32, 4, 3, 3},
                    attrs({{"group", Attribute::Int(4)},
                           {"pads", ints_attr({1, 1, 1, 1})},
                           {"activation", Attribute::String(act)}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    if (std::string(act) == "Relu") c.inputs.push_back(in({2, 32, 7, 7}));  // + residual
    v.push_back(c);
  }
  {
    OpCase c = conv("fused_grouped_s2_swish", {2, 32, 9, 9}, {32, 8, 3, 3},
                    attrs({{"group", Attribute::Int(4)},
                           {"pads", ints_attr({1, 1, 1, 1})},
                           {"strides", ints_attr({2, 2})},
                           {"activation", Attribute::String("Swish")}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    v.push_back(c);
  }
  for (bool one : {false, true}) {
    OpCase c = one ? conv("fused_residual_1x1", {2, 16, 8, 8}, {32, 16, 1, 1}, {})
                   : conv("fused_residual_3x3", {2, 16, 8, 8}, {16, 16, 3, 3},
                          attrs({{"pads", ints_attr({1, 1, 1, 1})}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    c.attrs.set("activation", Attribute::String("Relu"));
    c.inputs.push_back(in({2, one ? 32 : 16, 8, 8}));
    v.push_back(c);
  }
  {  // ReLU6 (MobileNet): the cuDNN graph tactic fuses it as a clipped ReLU
    OpCase c = conv("fused_relu6_1x1", {2, 16, 8, 8}, {24, 16, 1, 1},
                    attrs({{"activation", Attribute::String("Clip")},
                           {"act_min", Attribute::Float(0.f)}, {"act_max", Attribute::Float(0.3f)}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    v.push_back(c);
  }
  {  // A residual without activation (MobileNet-V2's linear bottleneck)
    OpCase c = conv("fused_residual_noact_1x1", {2, 16, 8, 8}, {16, 16, 1, 1}, {});
    c.op_type = "FusedConv";
    c.domain = "kiln";
    c.inputs.push_back(in({2, 16, 8, 8}));
    v.push_back(c);
  }
  // Epilogues without a bias (MetaFormer's bias-free 1x1 convolutions: ReLU before StarReLU's
  // square, the residual add after the token mixer; a 3x3 with GELU): the library tactics run
  // them with a bias of zeros.
  for (const char* act : {"Relu", "", "Gelu"}) {
    const bool one = std::string(act) != "Gelu";
    OpCase c = conv(std::string("fused_nobias_") + (one ? "1x1_" : "3x3_") + (act[0] ? act : "residual"),
                    {2, 16, 8, 8}, {32, 16, one ? 1 : 3, one ? 1 : 3},
                    attrs({{"pads", ints_attr(one ? std::vector<int64_t>{0, 0, 0, 0}
                                                  : std::vector<int64_t>{1, 1, 1, 1})}}),
                    /*bias=*/false);
    c.op_type = "FusedConv";
    c.domain = "kiln";
    if (act[0]) c.attrs.set("activation", Attribute::String(act));
    if (!act[0]) c.inputs.insert(c.inputs.end(), {absent(), in({2, 32, 8, 8})});
    v.push_back(c);
  }
  // Post steps (fuse_conv_tail): StarReLU's square, scale and bias after a bias-free 1x1 with
  // ReLU; NFNet's gain after SiLU on a 3x3; and every other step kind on 1x1s (cuDNN's graph in
  // its epilogue, cuBLASLt as a pass over its output), one with a residual.
  struct Post {
    const char* name;
    int k;
    bool bias, residual;
    const char* act;
    std::vector<std::string> ops;
    std::vector<float> values;
  };
  for (const Post& t : std::vector<Post>{
           {"star_relu", 1, false, false, "Relu", {"Pow", "Mul", "Add"}, {2.f, 0.8f, -0.25f}},
           {"gain_3x3", 3, true, false, "Swish", {"Mul"}, {1.7f}},
           {"steps_a", 1, true, true, "", {"Tanh", "Mul", "Abs", "Sqrt", "Sub", "Div", "Max", "Min"},
            {0.f, 2.f, 0.f, 0.f, 0.5f, 1.5f, -0.2f, 0.9f}},
           {"steps_b", 1, true, false, "Sigmoid", {"Neg", "Exp", "Erf", "Relu", "Add"},
            {0.f, 0.f, 0.f, 0.f, 0.1f}}}) {
    OpCase c = conv(std::string("fused_post_") + t.name, {2, 16, 8, 8}, {32, 16, t.k, t.k},
                    attrs({{"pads", ints_attr(std::vector<int64_t>(4, t.k / 2))}}), t.bias);
    c.op_type = "FusedConv";
    c.domain = "kiln";
    if (t.act[0]) c.attrs.set("activation", Attribute::String(t.act));
    if (std::string(t.act) == "Swish") c.attrs.set("act_alpha", Attribute::Float(1.f));
    c.attrs.set("post_ops", Attribute::Strings(t.ops));
    c.attrs.set("post_values", Attribute::Floats(t.values));
    if (t.residual) c.inputs.push_back(in({2, 32, 8, 8}));
    v.push_back(c);
  }
  {
    OpCase c = conv("fused_s2_resnet_shape", {4, 64, 28, 28}, {128, 64, 3, 3},
                    attrs({{"pads", ints_attr({1, 1, 1, 1})}, {"strides", ints_attr({2, 2})},
                           {"activation", Attribute::String("Relu")}}));
    c.op_type = "FusedConv";
    c.domain = "kiln";
    v.push_back(c);
  }
  // A conv case as a kiln fused layer with an activation ("Clip" clips to [0, 0.5]).
  auto as_kiln_layer = [](OpCase& c, const char* op, const char* act) {
    c.op_type = op;
    c.domain = "kiln";
    c.attrs.set("activation", Attribute::String(act));
    if (std::string(act) == "Clip") {
      c.attrs.set("act_min", Attribute::Float(0.f));
      c.attrs.set("act_max", Attribute::Float(0.5f));
    }
  };
  // The stem kernel's problems (kiln.conv.stem: FP16 NHWC, C <= 4, K % 32 == 0): ResNet's 7x7/2
  // with pad 3 on RGB at odd sizes (tiles past the last pixel, edge taps), grayscale 3x3, 4
  // channels with a taller dilation and asymmetric padding, K = 32 (the narrow tile), no bias.
  struct Stem {
    const char* name;
    std::vector<int64_t> x, w;
    Attributes a;
    const char* act;
    bool bias;
  };
  const Stem stems[] = {
      {"stem_7x7_s2_rgb", {2, 3, 37, 29}, {64, 3, 7, 7},
       attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}}), "Relu", true},
      {"stem_3x3_gray_k32", {3, 1, 13, 17}, {32, 1, 3, 3}, attrs({{"pads", ints_attr({1, 1, 1, 1})}}),
       "HardSwish", true},
      {"stem_5x5_c4_dil", {1, 4, 15, 12}, {96, 4, 5, 5},
       attrs({{"pads", ints_attr({2, 0, 1, 3})}, {"dilations", ints_attr({2, 1})}}), "", false},
      {"stem_3x3_s2_rgb_k32", {2, 3, 24, 24}, {32, 3, 3, 3},
       attrs({{"pads", ints_attr({1, 1, 1, 1})}, {"strides", ints_attr({2, 2})}}), "Clip", true},
      // More tiles (336) than the kernel's persistent blocks (two per SM): each block walks
      // several tiles, swapping its patch buffers.
      {"stem_resnet_224_b3", {3, 3, 224, 224}, {64, 3, 7, 7},
       attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}}), "Relu", true},
  };
  for (const Stem& st : stems) {
    // (The stem kernel runs only in NHWC; the 224 x 224 case, slow on the CPU, only there.)
    OpCase c = conv(st.name, st.x, st.w, st.a, st.bias,
                    st.x[2] > 100 ? std::vector<std::string>{"nhwc16"}
                                  : std::vector<std::string>{"fp16", "nhwc16"});
    as_kiln_layer(c, "FusedConv", st.act);
    v.push_back(c);
  }
  // kiln.FusedConvPool (a stem with its max-pool): the stem kernel's pooled tiles (ResNet's
  // 7x7/2 + 3x3/2 pool at odd sizes: pooled tiles past the edge, the pool's padding; a 2x2/2 pool
  // on grayscale with K = 32) and the direct fallback every mode runs (float32, float64, C = 8).
  struct ConvPool {
    const char* name;
    std::vector<int64_t> x, w;
    Attributes a;
    std::vector<int64_t> pk, ps, pp;
    const char* act;
    std::vector<std::string> modes;
  };
  const ConvPool convpools[] = {
      {"convpool_resnet_stem", {2, 3, 37, 29}, {64, 3, 7, 7},
       attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}}), {3, 3}, {2, 2},
       {1, 1, 1, 1}, "Relu", {"fp32", "fp16", "nhwc16"}},
      {"convpool_gray_k32_2x2", {1, 1, 20, 19}, {32, 1, 3, 3}, attrs({{"pads", ints_attr({1, 1, 1, 1})}}),
       {2, 2}, {2, 2}, {0, 0, 0, 0}, "", {"fp16", "nhwc16"}},
      {"convpool_c8_direct", {1, 8, 12, 12}, {16, 8, 3, 3}, attrs({{"pads", ints_attr({1, 1, 1, 1})}}),
       {3, 3}, {1, 1}, {1, 0, 0, 1}, "Clip", {"fp32", "fp16", "nhwc16"}},
      // ResNet's stem at 224 x 224, batch 3: 399 pooled tiles, several per persistent block.
      {"convpool_resnet_224_b3", {3, 3, 224, 224}, {64, 3, 7, 7},
       attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}}), {3, 3}, {2, 2},
       {1, 1, 1, 1}, "Relu", {"nhwc16"}},
  };
  // The space-to-depth stem (kiln.convpool.s2d: float32 NCHW RGB in, an even width, stride 2,
  // K % 64 == 0, a 3x3/2 pool; the odd-width cases above are refused): a 5x5 filter with even and odd leading pads and K = 128 (two channel blocks)
  // under a pool with asymmetric pads, Clip (the generic activation path); an 8x8 filter with
  // even pads, no activation, an unpadded pool; and the .quantize form (int8 codes of the pooled
  // value, checked within one code of the float64 reference).
  const ConvPool s2d_pools[] = {
      {"convpool_s2d_5x5_k128", {2, 3, 45, 40}, {128, 3, 5, 5},
       attrs({{"pads", ints_attr({2, 1, 2, 2})}, {"strides", ints_attr({2, 2})}}), {3, 3}, {2, 2},
       {1, 0, 0, 1}, "Clip", {"nhwc16"}},
      {"convpool_s2d_8x8_even", {1, 3, 33, 30}, {64, 3, 8, 8},
       attrs({{"pads", ints_attr({2, 2, 1, 1})}, {"strides", ints_attr({2, 2})}}), {3, 3}, {2, 2},
       {0, 0, 0, 0}, "", {"nhwc16"}},
      {"convpool_resnet_stem_int8_out", {2, 3, 37, 30}, {64, 3, 7, 7},
       attrs({{"pads", ints_attr({3, 3, 3, 3})}, {"strides", ints_attr({2, 2})}}), {3, 3}, {2, 2},
       {1, 1, 1, 1}, "Relu", {"nhwc16"}},
  };
  auto add_convpool = [&](const ConvPool& cp) {
    OpCase c = conv(cp.name, cp.x, cp.w, cp.a, true, cp.modes);
    as_kiln_layer(c, "FusedConvPool", cp.act);
    c.attrs.set("pool_kernel_shape", ints_attr(cp.pk));
    c.attrs.set("pool_strides", ints_attr(cp.ps));
    c.attrs.set("pool_pads", ints_attr(cp.pp));
    // Values stay under 6 (weights scaled by 1/sqrt(C R), inputs in [-1, 1]): no code saturates.
    if (std::string(cp.name).ends_with("_int8_out")) c.out_scale = {8.f / 127};
    v.push_back(c);
  };
  for (const ConvPool& cp : convpools) add_convpool(cp);
  for (const ConvPool& cp : s2d_pools) add_convpool(cp);
  {
    OpCase c = conv("convpool_float64", {1, 3, 10, 9}, {32, 3, 3, 3},
                    attrs({{"pads", ints_attr({1, 1, 1, 1})}}), true, {"fp32"});
    for (auto& i : c.inputs) {
      if (i.value) i.value = i.value->cast(DataType::kFloat64);
      i.dtype = DataType::kFloat64;
    }
    c.op_type = "FusedConvPool";
    c.domain = "kiln";
    c.attrs.set("pool_kernel_shape", ints_attr({3, 3}));
    c.attrs.set("pool_strides", ints_attr({2, 2}));
    v.push_back(c);
  }
  // ConvTranspose.
  auto convt = [&](std::string name, std::vector<int64_t> x, std::vector<int64_t> w, Attributes a) {
    OpCase c = conv(std::move(name), std::move(x), w, std::move(a), true, {"fp32", "fp16"});
    c.op_type = "ConvTranspose";
    const int64_t group = c.attrs.get_int("group", 1);
    c.inputs[2] = konst_random({w[1] * group}, 0.5);
    return c;
  };
  v.push_back(convt("convt_s2", {1, 4, 5, 5}, {4, 3, 3, 3}, attrs({{"strides", ints_attr({2, 2})}})));
  v.push_back(convt("convt_pads_outpad", {2, 3, 4, 6}, {3, 5, 3, 3},
                    attrs({{"strides", ints_attr({2, 2})}, {"pads", ints_attr({1, 0, 1, 1})},
                           {"output_padding", ints_attr({1, 1})}})));
  v.push_back(convt("convt_grouped", {1, 4, 5, 5}, {4, 2, 3, 3},
                    attrs({{"group", Attribute::Int(2)}, {"strides", ints_attr({1, 2})}})));
  v.push_back(convt("convt_1d", {1, 3, 7}, {3, 2, 4}, attrs({{"strides", ints_attr({3})}})));
  return v;
}

}  // namespace kiln::gpu::test
