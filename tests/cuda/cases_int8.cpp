// INT8 layer cases (docs/quantization.md; layers/conv_int8*.cu, conv_stem_s2d.cu):
// kiln.FusedConv, kiln.FusedGemm, kiln.FusedConvPool and kiln.FusedConvPair with int8 = 1 and
// scales on their values, against the CPU INT8 reference (fused_int8.cpp).
// Shapes: 1x1, 3x3 stride 1/2, padding (also asymmetric), dilation, batch 1, odd sizes, an
// empty batch, and seeded random ones; residual int8 / float / absent; Relu / Clip / none;
// output int8 (±1 code) or float; per-tensor and per-channel weight scales.
#include <cmath>
#include <random>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

enum class Residual { kNone, kInt8, kFloat };

struct ConvSpec {
  std::string name;
  std::vector<int64_t> x, w;  // X [N,C,H,W], W [K,C,R,S]
  Attributes attrs;
  Residual residual = Residual::kNone;
  std::string act;  // "", "Relu", "Clip"
  bool int8_out = true;
  bool per_channel = true;
  bool bias = true;
};

ConvSpec spec(std::string name, std::vector<int64_t> x, std::vector<int64_t> w, Attributes a,
              Residual residual = Residual::kNone, std::string act = "", bool int8_out = true,
              bool per_channel = true, bool bias = true) {
  ConvSpec s;
  s.name = std::move(name);
  s.x = std::move(x);
  s.w = std::move(w);
  s.attrs = std::move(a);
  s.residual = residual;
  s.act = std::move(act);
  s.int8_out = int8_out;
  s.per_channel = per_channel;
  s.bias = bias;
  return s;
}

// Weight scales: per channel (some below the channel's amax, so codes saturate) or one.
std::vector<float> weight_scales(int64_t K, double range, bool per_channel) {
  std::vector<float> s;
  for (int64_t k = 0; k < (per_channel ? K : 1); ++k)
    s.push_back(static_cast<float>(range / 127 * (0.8 + 0.1 * static_cast<double>(k % 5))));
  return s;
}

std::vector<int64_t> conv_out(const ConvSpec& c) {
  const auto pads = c.attrs.get_ints("pads", {0, 0, 0, 0});
  const auto st = c.attrs.get_ints("strides", {1, 1});
  const auto dl = c.attrs.get_ints("dilations", {1, 1});
  std::vector<int64_t> y = {c.x[0], c.w[0], 0, 0};
  for (int d = 0; d < 2; ++d)
    y[2 + d] = (c.x[2 + d] + pads[d] + pads[2 + d] - dl[d] * (c.w[2 + d] - 1) - 1) / st[d] + 1;
  return y;
}

OpCase int8_conv(const ConvSpec& s) {
  OpCase c;
  c.name = s.name;
  c.op_type = "FusedConv";
  c.domain = "kiln";
  c.attrs = s.attrs;
  c.attrs.set("int8", Attribute::Int(1));
  if (!s.act.empty()) c.attrs.set("activation", Attribute::String(s.act));
  if (s.act == "Clip") {
    c.attrs.set("act_min", Attribute::Float(-0.25f));
    c.attrs.set("act_max", Attribute::Float(0.75f));
  }
  const double range = 1.0 / std::sqrt(static_cast<double>(s.w[1] * s.w[2] * s.w[3]));
  c.inputs = {in(s.x), konst_random(s.w, range)};
  c.in_scales[0] = {1.f / 127};
  c.in_scales[1] = weight_scales(s.w[0], range, s.per_channel);
  c.inputs.push_back(s.bias ? konst_random({s.w[0]}, 0.5) : absent());
  if (s.residual != Residual::kNone) {
    c.inputs.push_back(in(conv_out(s)));
    if (s.residual == Residual::kInt8) c.in_scales[3] = {1.f / 127};
  }
  if (s.int8_out) c.out_scale = {2.f / 127};
  c.modes = {"int8", "int8fp16"};
  return c;
}

Attributes conv_attrs(std::vector<int64_t> pads, std::vector<int64_t> strides,
                      std::vector<int64_t> dilations = {1, 1}) {
  return attrs({{"pads", ints_attr(std::move(pads))},
                {"strides", ints_attr(std::move(strides))},
                {"dilations", ints_attr(std::move(dilations))}});
}

// kiln.FusedConvPool int8 = 1 (kiln.convpool.s2d.int8): an RGB stem and its 3x3/2 max-pool, X
// the model's float32 NCHW images quantized with their scale, W per channel or per tensor, Y int8.
OpCase int8_convpool(std::string name, std::vector<int64_t> x, std::vector<int64_t> w,
                     std::vector<int64_t> pads, std::vector<int64_t> pool_pads, std::string act,
                     bool per_channel) {
  ConvSpec s = spec(std::move(name), std::move(x), std::move(w),
                    conv_attrs(std::move(pads), {2, 2}), Residual::kNone, std::move(act), true,
                    per_channel);
  OpCase c = int8_conv(s);
  c.op_type = "FusedConvPool";
  c.attrs.set("pool_kernel_shape", ints_attr({3, 3}));
  c.attrs.set("pool_strides", ints_attr({2, 2}));
  c.attrs.set("pool_pads", ints_attr(std::move(pool_pads)));
  c.modes = {"int8"};
  return c;
}

// FusedGemm: base Gemm (X [M,K] times W [N,K]^T or [K,N], C [N] with alpha/beta) or MatMul
// (X [..., K] times W [K,N] plus a bias [N]).
OpCase int8_gemm(std::string name, std::string base, std::vector<int64_t> x, int64_t N, bool transB,
                 std::string act, bool int8_out, bool per_channel, float alpha = 1.f,
                 float beta = 1.f) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = "FusedGemm";
  c.domain = "kiln";
  const int64_t K = x.back();
  c.attrs = attrs({{"base", Attribute::String(base)}, {"int8", Attribute::Int(1)}});
  if (base == "Gemm") {
    c.attrs.set("transB", Attribute::Int(transB ? 1 : 0));
    c.attrs.set("alpha", Attribute::Float(alpha));
    c.attrs.set("beta", Attribute::Float(beta));
  }
  if (!act.empty()) c.attrs.set("activation", Attribute::String(act));
  if (act == "Clip") {
    c.attrs.set("act_min", Attribute::Float(0.f));
    c.attrs.set("act_max", Attribute::Float(0.5f));
  }
  const double range = 1.0 / std::sqrt(static_cast<double>(K));
  const std::vector<int64_t> w = transB ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N};
  c.inputs = {in(x), konst_random(w, range), konst_random({N}, 0.5)};
  c.in_scales[0] = {1.f / 127};
  c.in_scales[1] = weight_scales(N, range, per_channel);
  if (int8_out) c.out_scale = {2.f / 127};
  c.modes = {"int8", "int8fp16"};
  return c;
}

// kiln.FusedConvPair (conv_int8.pair): act(conv(X, W) + conv(X2, W2)), two 1x1 convolutions
// without padding, X2's at stride s2, both int8 with their own scales, Y int8.
OpCase int8_pair(std::string name, std::vector<int64_t> x, std::vector<int64_t> x2, int64_t K,
                 int64_t s2, std::string act, bool bias1, bool bias2, bool per_channel2) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = "FusedConvPair";
  c.domain = "kiln";
  c.attrs = attrs({{"int8", Attribute::Int(1)},
                   {"conv2_strides", ints_attr({s2, s2})}});
  if (!act.empty()) c.attrs.set("activation", Attribute::String(act));
  const double r1 = 1.0 / std::sqrt(static_cast<double>(x[1]));
  const double r2 = 1.0 / std::sqrt(static_cast<double>(x2[1]));
  c.inputs = {in(x), konst_random({K, x[1], 1, 1}, r1), bias1 ? konst_random({K}, 0.5) : absent(),
              in(x2), konst_random({K, x2[1], 1, 1}, r2), bias2 ? konst_random({K}, 0.25) : absent()};
  c.in_scales[0] = {1.f / 127};
  c.in_scales[1] = weight_scales(K, r1, true);
  c.in_scales[3] = {1.5f / 127};
  c.in_scales[4] = weight_scales(K, r2, per_channel2);
  c.out_scale = {3.f / 127};
  c.modes = {"int8"};
  return c;
}

}  // namespace

std::vector<OpCase> int8_cases() {
  std::vector<OpCase> v;
  const Attributes same3 = conv_attrs({1, 1, 1, 1}, {1, 1});
  v.push_back(int8_conv(spec("i8_1x1", {2, 16, 7, 7}, {24, 16, 1, 1}, {})));
  v.push_back(int8_conv(spec("i8_3x3_pad1", {2, 8, 9, 11}, {16, 8, 3, 3}, same3)));
  v.push_back(int8_conv(
      spec("i8_3x3_s2", {3, 12, 13, 10}, {20, 12, 3, 3}, conv_attrs({1, 1, 1, 1}, {2, 2}))));
  v.push_back(
      int8_conv(spec("i8_1x1_s2_nobias", {1, 32, 8, 8}, {64, 32, 1, 1},
                     conv_attrs({0, 0, 0, 0}, {2, 2}), Residual::kNone, "", true, true, false)));
  v.push_back(int8_conv(spec("i8_asym_pad_dilated", {1, 4, 12, 9}, {5, 4, 3, 3},
                             conv_attrs({2, 1, 0, 2}, {1, 2}, {2, 1}), Residual::kNone, "Relu")));
  // Residual x activation x output type, per-tensor and per-channel weights.
  for (Residual r : {Residual::kNone, Residual::kInt8, Residual::kFloat})
    for (const char* act : {"", "Relu", "Clip"})
      for (bool int8_out : {true, false}) {
        const std::string name = fmt::format("i8_res{}_{}_{}",
                                             r == Residual::kNone   ? "none"
                                             : r == Residual::kInt8 ? "int8"
                                                                    : "float",
                                             *act ? act : "noact", int8_out ? "outi8" : "outf");
        v.push_back(int8_conv(spec(name, {2, 20, 6, 5}, {20, 20, 3, 3}, same3, r, act, int8_out,
                                   r != Residual::kFloat)));
      }
  // ResNet-like shapes: batch 1 and an odd batch, many channels (several K tiles), 7x7 maps.
  v.push_back(int8_conv(
      spec("i8_resnet_1x1", {1, 256, 14, 14}, {64, 256, 1, 1}, {}, Residual::kNone, "Relu")));
  v.push_back(int8_conv(
      spec("i8_resnet_3x3_b3", {3, 64, 7, 7}, {136, 64, 3, 3}, same3, Residual::kInt8, "Relu")));
  v.push_back(int8_conv(
      spec("i8_empty_batch", {0, 8, 5, 5}, {8, 8, 3, 3}, same3, Residual::kInt8, "Relu")));
  // The pipelined kernel's problems (conv_int8.pipelined: C and K multiples of 64, Y int8, the
  // residual int8 or absent): pixel counts that are not a multiple of its 128-pixel tile, several
  // 64-channel reduction steps, K tiles of 64 and of 128, ResNet's 7x7 maps; 3x3 taps with
  // padding (zero-filled loads), stride, asymmetric padding and dilation.
  v.push_back(int8_conv(spec("i8_pl_1x1_res_relu", {3, 128, 13, 11}, {256, 128, 1, 1}, {},
                             Residual::kInt8, "Relu")));
  v.push_back(int8_conv(
      spec("i8_pl_1x1_k64_clip", {2, 64, 9, 7}, {64, 64, 1, 1}, {}, Residual::kNone, "Clip")));
  v.push_back(int8_conv(spec("i8_pl_1x1_c192_pertensor", {1, 192, 10, 10}, {128, 192, 1, 1}, {},
                             Residual::kInt8, "", true, false, false)));
  v.push_back(int8_conv(spec("i8_pl_1x1_resnet_l4", {1, 512, 7, 7}, {2048, 512, 1, 1}, {},
                             Residual::kInt8, "Relu")));
  v.push_back(int8_conv(spec("i8_pl_1x1_s2_res", {2, 128, 14, 13}, {256, 128, 1, 1},
                             conv_attrs({0, 0, 0, 0}, {2, 2}), Residual::kInt8, "Relu")));
  // The persistent pointwise kernel (conv_int8.pointwise: 1x1, no padding, C of 64, 128 or 256):
  // enough pixels that each block walks three or more tiles around its two-stage ring, a last
  // tile cut short, no activation, and a strided layer whose pixel rows are not contiguous.
  v.push_back(int8_conv(spec("i8_pw_1x1_c64_k512_res_relu", {8, 64, 56, 55}, {512, 64, 1, 1}, {},
                             Residual::kInt8, "Relu")));
  v.push_back(int8_conv(spec("i8_pw_1x1_c256_s2_noact", {2, 256, 29, 27}, {128, 256, 1, 1},
                             conv_attrs({0, 0, 0, 0}, {2, 2}), Residual::kNone, "")));
  // The persistent 3x3 kernel (conv_int8.conv3x3: stride 1, padding 1, C of 64 or 128): ResNet's
  // 56x56 maps (25 tiles an image, the last one half full, several tiles a block), a width that
  // does not divide a tile (rows wrap inside it) with a residual, K of two blocks, an image
  // smaller than a tile and one wider than a tile (a tile within one row).
  v.push_back(int8_conv(
      spec("i8_k3_c64_56x56_relu", {4, 64, 56, 56}, {64, 64, 3, 3}, same3, Residual::kNone, "Relu")));
  v.push_back(int8_conv(spec("i8_k3_c128_k128_res", {3, 128, 28, 27}, {128, 128, 3, 3}, same3,
                             Residual::kInt8, "Relu")));
  v.push_back(int8_conv(
      spec("i8_k3_c64_tiny_noact", {2, 64, 5, 3}, {128, 64, 3, 3}, same3, Residual::kNone, "")));
  v.push_back(int8_conv(
      spec("i8_k3_c64_wide", {1, 64, 3, 150}, {64, 64, 3, 3}, same3, Residual::kInt8, "Relu")));
  // Images narrower than the output rows a tile stages (conv_int8.conv3x3.wgmma sizes its
  // patch stages for them), enough of them that each block walks several tiles, with a residual.
  v.push_back(int8_conv(spec("i8_k3_c64_narrow_many", {600, 64, 3, 2}, {64, 64, 3, 3}, same3,
                             Residual::kInt8, "Relu")));
  v.push_back(int8_conv(
      spec("i8_pl_3x3_res", {2, 64, 11, 9}, {64, 64, 3, 3}, same3, Residual::kInt8, "Relu")));
  v.push_back(int8_conv(spec("i8_pl_3x3_s2", {1, 128, 15, 13}, {128, 128, 3, 3},
                             conv_attrs({1, 1, 1, 1}, {2, 2}), Residual::kNone, "Relu")));
  v.push_back(int8_conv(spec("i8_pl_3x3_asym_dilated", {1, 64, 12, 10}, {128, 64, 3, 3},
                             conv_attrs({2, 1, 0, 2}, {1, 2}, {2, 1}), Residual::kNone, "Clip")));
  // Seeded random shapes (C a multiple of 4, the kernel's requirement; the case names stay
  // stable from run to run).
  std::mt19937 rng(20240611);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 6; ++i) {
    const int64_t k = pick(0, 1) ? 3 : 1, s = pick(1, 2), p = k == 3 ? pick(0, 1) : 0;
    std::vector<int64_t> x = {pick(1, 3), 4 * pick(1, 12), pick(3, 17), pick(3, 17)};
    std::vector<int64_t> w = {pick(1, 70), x[1], k, k};
    ConvSpec c = spec("i8_random" + std::to_string(i), x, w, conv_attrs({p, p, p, p}, {s, s}));
    c.residual = static_cast<Residual>(pick(0, 2));
    c.act = pick(0, 1) ? "Relu" : "";
    c.int8_out = pick(0, 1);
    c.per_channel = pick(0, 1);
    v.push_back(int8_conv(c));
  }
  // The pair kernel (conv_int8.pair, C1 = C2 = 64): ResNet's stage 1 (both stride 1, a last
  // tile cut short, K of two 128-channel blocks), X2 at stride 2 from a map twice the size with
  // no activation, one bias and W2 per tensor, and K = 64 (one 64-channel block, no n128 tile).
  v.push_back(int8_pair("i8_pair_c64_c64_relu", {3, 64, 20, 19}, {3, 64, 20, 19}, 256, 1, "Relu",
                        true, true, true));
  v.push_back(int8_pair("i8_pair_s2_noact", {2, 64, 14, 13}, {2, 64, 28, 26}, 128, 2, "", false,
                        true, false));
  v.push_back(int8_pair("i8_pair_k64_b1", {1, 64, 9, 9}, {1, 64, 9, 9}, 64, 1, "Relu", true,
                        false, true));
  // The wgmma pair kernel (conv_int8.pair.wgmma): ResNet's stages 2-4 (C1, C2) with the
  // downsample at stride 2 (a last tile cut short; stage 3 without activation, one bias and W2
  // per tensor; stage 4's 64-channel blocks), and one 128-channel block over 20,000 pixels,
  // X2 at stride 1: 313 tiles, so that some warpgroups walk two (the ring across a tile's end).
  v.push_back(int8_pair("i8_pair_c128_c256_s2", {3, 128, 14, 13}, {3, 256, 28, 26}, 512, 2,
                        "Relu", true, true, true));
  v.push_back(int8_pair("i8_pair_c256_c512_noact", {2, 256, 7, 7}, {2, 512, 14, 14}, 256, 2, "",
                        false, true, false));
  v.push_back(int8_pair("i8_pair_c512_c1024", {1, 512, 5, 6}, {1, 1024, 9, 11}, 2048, 2, "Relu",
                        true, true, true));
  v.push_back(int8_pair("i8_pair_c128_c256_many", {2, 128, 100, 100}, {2, 256, 100, 100}, 128, 1,
                        "Relu", true, false, true));
  // ... and (64, 64), a chunk holding both inputs' codes, with 313 tiles (one chunk per tile:
  // loads three tiles ahead).
  v.push_back(int8_pair("i8_pair_c64_c64_many", {2, 64, 100, 100}, {2, 64, 100, 100}, 128, 1,
                        "Relu", true, true, false));
  // The INT8 pooled stem: ResNet's 7x7/2 + 3x3/2 at odd sizes (pooled tiles past the edge, the
  // pool's padding); a 5x5 filter with even and odd leading pads, K = 128 (two channel blocks),
  // an asymmetric pool, Clip, one weight scale; ResNet's stem at 224 x 224, batch 8: 448 pooled
  // tiles, more than one per persistent block.
  v.push_back(int8_convpool("i8_convpool_resnet_stem", {2, 3, 37, 30}, {64, 3, 7, 7}, {3, 3, 3, 3},
                            {1, 1, 1, 1}, "Relu", true));
  v.push_back(int8_convpool("i8_convpool_5x5_k128_clip", {2, 3, 45, 40}, {128, 3, 5, 5},
                            {2, 1, 2, 2}, {1, 0, 0, 1}, "Clip", false));
  v.push_back(int8_convpool("i8_convpool_8x8_noact", {1, 3, 33, 30}, {64, 3, 8, 8}, {2, 2, 1, 1},
                            {0, 0, 0, 0}, "", true));
  v.push_back(int8_convpool("i8_convpool_resnet_224_b8", {8, 3, 224, 224}, {64, 3, 7, 7},
                            {3, 3, 3, 3}, {1, 1, 1, 1}, "Relu", true));
  // FusedGemm: ResNet's FC (transB, C [N]), plain Gemm with alpha/beta, MatMul with a bias.
  v.push_back(int8_gemm("i8_gemm_fc", "Gemm", {2, 512}, 100, true, "", false, true));
  v.push_back(int8_gemm("i8_gemm_b1_relu_i8", "Gemm", {1, 64}, 33, true, "Relu", true, false));
  v.push_back(int8_gemm("i8_gemm_notrans_alpha_beta", "Gemm", {5, 36}, 70, false, "Clip", true,
                        true, 0.5f, 2.f));
  v.push_back(int8_gemm("i8_matmul_3d", "MatMul", {2, 3, 20}, 17, false, "", false, true));
  v.push_back(int8_gemm("i8_gemm_empty", "Gemm", {0, 16}, 8, true, "Relu", true, true));
  // Transformers' projections (gemm_int8.cutlass_sm90: float16 Y, not requantized): an FFN's
  // first GEMM with erf GELU, GPT-2's with tanh GELU (Gemm, W stored [N, K]), an output
  // projection with the float16 residual, and a scaled Y written in float16 (within a code).
  {
    OpCase c = int8_gemm("i8_matmul_gelu_f16y", "MatMul", {2, 40, 128}, 256, false, "Gelu", false,
                         true);
    c.modes = {"int8fp16"};
    v.push_back(c);
    c = int8_gemm("i8_gemm_transb_gelu_tanh_f16y", "Gemm", {72, 96}, 64, true, "Gelu", false,
                  true);
    c.attrs.set("act_approximate", Attribute::String("tanh"));
    c.modes = {"int8fp16"};
    v.push_back(c);
    c = int8_gemm("i8_matmul_residual_f16y", "MatMul", {3, 50, 256}, 128, false, "", false, true);
    c.inputs.push_back(in({3, 50, 128}));
    c.modes = {"int8fp16"};
    v.push_back(c);
    c = int8_gemm("i8_matmul_scaled_y_f16", "MatMul", {2, 16, 64}, 32, false, "", true, true);
    c.modes = {"int8fp16"};
    v.push_back(c);
  }
  return v;
}

}  // namespace kiln::gpu::test
