// Pooling and gemm family cases: MaxPool (1-3 spatial axes, pads, auto_pad, strides, dilations,
// ceil_mode, storage_order, the Indices output, integer types), AveragePool (count_include_pad,
// ceil_mode, dilations), GlobalAveragePool / GlobalMaxPool (NaN, wide planes, NHWC); Gemm
// (transposes, alpha/beta, every C broadcast, integers), MatMul (1-D operands, batch broadcast,
// empty dims, integers), kiln.FusedGemm (every activation, both bases) and kiln.Attention (mask,
// fully masked rows, nan_to_zero, long rows, broadcast heads).
#include <cmath>
#include <limits>
#include <tuple>

#include "backend_ops.h"

namespace kiln::gpu::test {

std::vector<OpCase> gemm_pool_cases();

namespace {

using Modes = std::vector<std::string>;
const Modes kPoolModes = {"fp32", "fp16", "nhwc16"};
const Modes kGemmModes = {"fp32", "tf32", "fp16"};
const Modes kExact = {"fp32"};


// A non-constant input with fixed values (NaN, -inf masks, ...).
CaseInput fixed(std::vector<int64_t> shape, std::vector<float> values) {
  CaseInput c = konst(Tensor::from<float>(std::move(shape), values));
  c.constant = false;
  return c;
}

// Random float values with every `every`-th one NaN.
std::vector<float> with_nans(int64_t n, int64_t every) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<float>(s >> 8) / static_cast<float>(1 << 24) * 2.f - 1.f;
    if (every > 0 && i % every == every - 1) v[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return v;
}

void pool_cases(std::vector<OpCase>& v) {
  const auto k = [](std::vector<int64_t> s) { return Attribute::Ints(std::move(s)); };
  // MaxPool
  v.push_back(make_case("maxpool_3x3_s2_p1", "MaxPool",
                   attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 1, 1, 1})}}),
                   {in({2, 5, 11, 13})}, kPoolModes));
  v.push_back(make_case("maxpool_2x2_c64", "MaxPool", attrs({{"kernel_shape", k({2, 2})}, {"strides", k({2, 2})}}),
                   {in({1, 64, 8, 10})}, kPoolModes));
  // The vectorised NHWC path (channels a multiple of 8): stem geometry, pads, a dilated window.
  v.push_back(make_case("maxpool_stem_c16", "MaxPool",
                   attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 1, 1, 1})}}),
                   {in({3, 16, 15, 14})}, kPoolModes));
  // pool.max.quantize (Y written as the int8 codes of its value's scale; checked within one code
  // of the float64 max): the stem's 3x3/2 window with padding, and a 2x2 window.
  for (auto [name, a, shape] : {std::tuple{"maxpool_stem_int8_out",
                                           attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 1, 1, 1})}}),
                                           std::vector<int64_t>{3, 64, 15, 14}},
                                std::tuple{"maxpool_2x2_int8_out",
                                           attrs({{"kernel_shape", k({2, 2})}, {"strides", k({2, 2})}}),
                                           std::vector<int64_t>{2, 16, 8, 9}}}) {
    OpCase q = make_case(name, "MaxPool", a, {in(shape)}, {"nhwc16"});
    q.out_scale = {1.1f / 127};
    v.push_back(std::move(q));
  }
  v.push_back(make_case("maxpool_dilated_c24", "MaxPool",
                   attrs({{"kernel_shape", k({2, 3})}, {"dilations", k({2, 1})}, {"pads", k({1, 0, 1, 2})}}),
                   {in({2, 24, 9, 10})}, kPoolModes));
  v.push_back(make_case("maxpool_1d", "MaxPool",
                   attrs({{"kernel_shape", k({4})}, {"strides", k({3})}, {"pads", k({1, 2})}}),
                   {in({2, 3, 20})}, {"fp32", "fp16"}));
  v.push_back(make_case("maxpool_3d", "MaxPool",
                   attrs({{"kernel_shape", k({2, 3, 2})}, {"strides", k({2, 2, 1})}, {"pads", k({0, 1, 0, 1, 1, 0})}}),
                   {in({1, 2, 6, 7, 5})}, {"fp32", "fp16"}));
  v.push_back(make_case("maxpool_ceil", "MaxPool",
                   attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"ceil_mode", Attribute::Int(1)}}),
                   {in({1, 3, 10, 10})}, kPoolModes));
  v.push_back(make_case("maxpool_dilated", "MaxPool",
                   attrs({{"kernel_shape", k({3, 3})}, {"dilations", k({2, 3})}, {"pads", k({2, 2, 2, 3})}}),
                   {in({1, 2, 12, 13})}, kPoolModes));
  v.push_back(make_case("maxpool_same_upper", "MaxPool",
                   attrs({{"kernel_shape", k({3, 2})}, {"strides", k({2, 2})}, {"auto_pad", Attribute::String("SAME_UPPER")}}),
                   {in({1, 3, 9, 8})}, kPoolModes));
  v.push_back(make_case("maxpool_same_lower", "MaxPool",
                   attrs({{"kernel_shape", k({2, 3})}, {"strides", k({1, 2})}, {"auto_pad", Attribute::String("SAME_LOWER")}}),
                   {in({2, 3, 7, 9})}, kPoolModes));
  v.push_back(make_case("maxpool_global_window", "MaxPool", attrs({{"kernel_shape", k({7, 7})}}),
                   {in({2, 40, 7, 7})}, kPoolModes));
  v.push_back(make_case("maxpool_empty_batch", "MaxPool", attrs({{"kernel_shape", k({2, 2})}}),
                   {in({0, 3, 6, 6})}, kExact));
  v.push_back(make_case("maxpool_nan", "MaxPool", attrs({{"kernel_shape", k({2, 3})}, {"strides", k({1, 2})}}),
                   {fixed({2, 3, 6, 7}, with_nans(2 * 3 * 6 * 7, 11))}, kPoolModes));
  // Indices: exact, so float cases stay float32 (fp16 rounding would create ties); integer
  // inputs also run NHWC.
  {
    OpCase c = make_case("maxpool_indices", "MaxPool",
                    attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 1, 1, 1})}}),
                    {in({2, 3, 9, 11})}, kExact);
    c.num_outputs = 2;
    v.push_back(c);
    c.name = "maxpool_indices_col_major";
    c.attrs.set("storage_order", Attribute::Int(1));
    v.push_back(c);
    c = make_case("maxpool_indices_int32_nhwc", "MaxPool",
             attrs({{"kernel_shape", k({2, 3})}, {"strides", k({2, 1})}, {"pads", k({0, 1, 1, 1})}}),
             {in({2, 5, 8, 7}, DataType::kInt32, -1000, 1000)}, {"fp32", "nhwc16"});
    c.num_outputs = 2;
    v.push_back(c);
    c.name = "maxpool_indices_int32_nhwc_col_major";
    c.attrs.set("storage_order", Attribute::Int(1));
    v.push_back(c);
    c = make_case("maxpool_indices_3d", "MaxPool",
             attrs({{"kernel_shape", k({2, 2, 3})}, {"strides", k({1, 2, 2})}, {"storage_order", Attribute::Int(1)}}),
             {in({1, 2, 4, 5, 7})}, kExact);
    c.num_outputs = 2;
    v.push_back(c);
    c = make_case("maxpool_indices_1d_ceil", "MaxPool",
             attrs({{"kernel_shape", k({3})}, {"strides", k({2})}, {"ceil_mode", Attribute::Int(1)}}),
             {in({3, 2, 10})}, kExact);
    c.num_outputs = 2;
    v.push_back(c);
  }
  for (auto [name, t] : {std::pair{"int8", DataType::kInt8}, std::pair{"uint8", DataType::kUInt8},
                         std::pair{"int64", DataType::kInt64}, std::pair{"float64", DataType::kFloat64}}) {
    OpCase c = make_case(std::string("maxpool_") + name, "MaxPool",
                    attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 1, 1, 1})}}),
                    {in({1, 4, 9, 10}, t, t == DataType::kUInt8 ? 0 : -100, 100)}, kExact);
    c.num_outputs = 2;
    v.push_back(c);
  }
  // AveragePool
  for (int include : {0, 1}) {
    const std::string s = include ? "_incl" : "";
    const Attribute inc = Attribute::Int(include);
    v.push_back(make_case("avgpool_3x3_p1" + s, "AveragePool",
                     attrs({{"kernel_shape", k({3, 3})}, {"pads", k({1, 1, 1, 1})}, {"count_include_pad", inc}}),
                     {in({2, 5, 9, 10})}, kPoolModes));
    v.push_back(make_case("avgpool_ceil" + s, "AveragePool",
                     attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})}, {"pads", k({1, 0, 1, 0})},
                            {"ceil_mode", Attribute::Int(1)}, {"count_include_pad", inc}}),
                     {in({1, 3, 11, 12})}, kPoolModes));
    v.push_back(make_case("avgpool_dilated" + s, "AveragePool",
                     attrs({{"kernel_shape", k({2, 3})}, {"dilations", k({2, 2})}, {"pads", k({1, 2, 1, 2})},
                            {"count_include_pad", inc}}),
                     {in({1, 2, 10, 9})}, kPoolModes));
    v.push_back(make_case("avgpool_same_lower" + s, "AveragePool",
                     attrs({{"kernel_shape", k({3, 3})}, {"strides", k({2, 2})},
                            {"auto_pad", Attribute::String("SAME_LOWER")}, {"count_include_pad", inc}}),
                     {in({2, 3, 8, 9})}, kPoolModes));
    v.push_back(make_case("avgpool_1d" + s, "AveragePool",
                     attrs({{"kernel_shape", k({5})}, {"strides", k({2})}, {"pads", k({2, 1})}, {"count_include_pad", inc}}),
                     {in({2, 3, 19})}, {"fp32", "fp16"}));
    v.push_back(make_case("avgpool_3d" + s, "AveragePool",
                     attrs({{"kernel_shape", k({3, 2, 2})}, {"strides", k({2, 1, 2})}, {"pads", k({1, 0, 1, 1, 1, 0})},
                            {"count_include_pad", inc}}),
                     {in({1, 2, 7, 5, 6})}, {"fp32", "fp16"}));
  }
  // Channels a multiple of 16 bytes: the vectorised NHWC kernel (nhwc16), e.g. NFNet's and
  // ResNet-D's 2x2 stride-2 shortcut pool with ceil_mode, and a padded 3x3 counting the padding.
  v.push_back(make_case("avgpool_vec_2x2_s2_ceil", "AveragePool",
                        attrs({{"kernel_shape", k({2, 2})},
                               {"strides", k({2, 2})},
                               {"ceil_mode", Attribute::Int(1)},
                               {"count_include_pad", Attribute::Int(0)}}),
                        {in({2, 16, 9, 11})}, kPoolModes));
  v.push_back(make_case("avgpool_vec_3x3_p1_incl", "AveragePool",
                        attrs({{"kernel_shape", k({3, 3})},
                               {"pads", k({1, 1, 1, 1})},
                               {"count_include_pad", Attribute::Int(1)}}),
                        {in({1, 24, 7, 6})}, kPoolModes));
  v.push_back(make_case("avgpool_float64", "AveragePool",
                   attrs({{"kernel_shape", k({2, 2})}, {"strides", k({2, 2})}, {"ceil_mode", Attribute::Int(1)}}),
                   {in({2, 3, 7, 7}, DataType::kFloat64)}, kExact));
  v.push_back(make_case("avgpool_empty", "AveragePool", attrs({{"kernel_shape", k({3, 3})}}),
                   {in({0, 2, 5, 5})}, kExact));
  // Global pools
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    const std::string p = std::string(op) == "GlobalMaxPool" ? "gmp_" : "gap_";
    v.push_back(make_case(p + "resnet", op, {}, {in({2, 64, 7, 7})}, kPoolModes));
    v.push_back(make_case(p + "odd_channels", op, {}, {in({3, 37, 5, 6})}, kPoolModes));
    v.push_back(make_case(p + "c3", op, {}, {in({2, 3, 9, 9})}, kPoolModes));
    v.push_back(make_case(p + "wide_plane", op, {}, {in({1, 5, 100, 90})}, kPoolModes));
    v.push_back(make_case(p + "rank3", op, {}, {in({2, 5, 17})}, {"fp32", "fp16"}));
    v.push_back(make_case(p + "rank5", op, {}, {in({1, 3, 4, 5, 6})}, {"fp32", "fp16"}));
    v.push_back(make_case(p + "rank2", op, {}, {in({3, 7})}, {"fp32", "fp16"}));
    v.push_back(make_case(p + "float64", op, {}, {in({2, 4, 6, 5}, DataType::kFloat64)}, kExact));
    v.push_back(make_case(p + "empty_batch", op, {}, {in({0, 4, 3, 3})}, kExact));
    v.push_back(make_case(p + "nan", op, {}, {fixed({2, 6, 5, 7}, with_nans(2 * 6 * 5 * 7, 37))}, kPoolModes));
    // Few images x channels over a large plane: the split-over-blocks NHWC path.
    v.push_back(make_case(p + "se_pool", op, {}, {in({4, 40, 48, 48})}, kPoolModes));
    // EfficientNet's: channel vectors that do not divide a block's 256 threads, an odd plane.
    v.push_back(make_case(p + "se_pool_c144", op, {}, {in({2, 144, 37, 29})}, kPoolModes));
    v.push_back(make_case(p + "split_nan", op, {}, {fixed({1, 8, 40, 40}, with_nans(8 * 40 * 40, 37))}, kPoolModes));
    // ResNet-50's head: 2048 channels over 7x7 (NHWC: the 16-byte vector loads).
    v.push_back(make_case(p + "resnet50_head", op, {}, {in({3, 2048, 7, 7})}, kPoolModes));
  }
  // pool.global_avg.codes: the input stored as its value's int8 codes (scale 1/127). The feeds
  // are exact multiples of the scale, so the codes hold them exactly and the only error is the
  // mean's float rounding: 2048 channels (ResNet-50's head) and 48 (a block's vector row only
  // partly used).
  for (int64_t C : {2048, 48}) {
    const std::vector<int64_t> shape = {3, C, 7, 7};
    std::vector<float> vals(static_cast<size_t>(3 * C * 49));
    for (size_t i = 0; i < vals.size(); ++i)
      vals[i] = static_cast<float>(static_cast<int64_t>((i * 7919) % 255) - 127) / 127.f;
    OpCase c = make_case("gap_codes_c" + std::to_string(C), "GlobalAveragePool", {},
                         {fixed(shape, vals)}, {"int8", "int8fp16"});
    c.in_scales[0] = {1.f / 127};
    v.push_back(std::move(c));
  }
}

OpCase gemm(std::string name, std::vector<int64_t> a, std::vector<int64_t> b, CaseInput c,
            Attributes at = {}, Modes modes = kGemmModes) {
  std::vector<CaseInput> ins = {in(std::move(a)), in(std::move(b)), std::move(c)};
  return make_case(std::move(name), "Gemm", std::move(at), std::move(ins), std::move(modes));
}

OpCase matmul(std::string name, std::vector<int64_t> a, std::vector<int64_t> b, Modes modes = kGemmModes) {
  return make_case(std::move(name), "MatMul", {}, {in(std::move(a)), in(std::move(b))}, std::move(modes));
}

void gemm_cases(std::vector<OpCase>& v) {
  const Attribute one = Attribute::Int(1);
  // Gemm: A [M,K] (or [K,M]), B [K,N] (or [N,K]), C broadcast to [M,N].
  v.push_back(gemm("gemm_bias_n", {7, 13}, {13, 9}, in({9})));
  v.push_back(gemm("gemm_no_c", {7, 13}, {13, 9}, absent()));
  v.push_back(gemm("gemm_transA", {13, 7}, {13, 9}, in({7, 9}), attrs({{"transA", one}})));
  v.push_back(gemm("gemm_transB_const", {5, 33}, {17, 33}, konst_random({17}, 0.5),
                   attrs({{"transB", one}})));
  v.back().inputs[1] = konst_random({17, 33}, 0.2);
  v.push_back(gemm("gemm_transAB", {33, 6}, {10, 33}, in({6, 1}),
                   attrs({{"transA", one}, {"transB", one}, {"alpha", Attribute::Float(0.5f)},
                          {"beta", Attribute::Float(2.f)}})));
  v.push_back(gemm("gemm_c_scalar", {4, 6}, {6, 5}, in({}), attrs({{"beta", Attribute::Float(-1.5f)}})));
  v.push_back(gemm("gemm_c_1xn", {4, 6}, {6, 5}, in({1, 5})));
  v.push_back(gemm("gemm_c_1x1", {4, 6}, {6, 5}, in({1, 1})));
  v.push_back(gemm("gemm_beta0", {4, 6}, {6, 5}, in({4, 5}), attrs({{"beta", Attribute::Float(0.f)}})));
  v.push_back(gemm("gemm_k1", {9, 1}, {1, 11}, in({11})));
  v.push_back(gemm("gemm_m1", {1, 200}, {200, 70}, in({70}), attrs({{"alpha", Attribute::Float(-0.25f)}})));
  v.push_back(gemm("gemm_large", {129, 257}, {257, 95}, in({95})));
  v.push_back(gemm("gemm_empty_m", {0, 8}, {8, 5}, in({5}), {}, kExact));
  v.push_back(gemm("gemm_k0", {3, 0}, {0, 4}, in({3, 4}), attrs({{"beta", Attribute::Float(0.5f)}}), kExact));
  {
    OpCase c = gemm("gemm_float64", {6, 11}, {11, 7}, in({7}, DataType::kFloat64),
                    attrs({{"transA", Attribute::Int(0)}, {"alpha", Attribute::Float(1.5f)}}), kExact);
    c.inputs[0].dtype = c.inputs[1].dtype = DataType::kFloat64;
    v.push_back(c);
  }
  for (auto [name, t] : {std::pair{"int32", DataType::kInt32}, std::pair{"int64", DataType::kInt64}}) {
    OpCase c = gemm(std::string("gemm_") + name, {5, 9}, {7, 9}, in({5, 1}, t, -9, 9),
                    attrs({{"transB", one}, {"alpha", Attribute::Float(2.f)}, {"beta", Attribute::Float(-0.5f)}}),
                    kExact);
    for (int i = 0; i < 2; ++i) c.inputs[i] = in(c.inputs[i].shape, t, -9, 9);
    v.push_back(c);
    OpCase d = gemm(std::string("gemm_") + name + "_plain", {17, 18}, {18, 19}, in({19}, t, -50, 50), {}, kExact);
    for (int i = 0; i < 2; ++i) d.inputs[i] = in(d.inputs[i].shape, t, -50, 50);
    v.push_back(d);
  }
  // MatMul
  v.push_back(matmul("matmul_2d", {5, 7}, {7, 3}));
  v.push_back(matmul("matmul_1d_2d", {7}, {7, 3}));
  v.push_back(matmul("matmul_2d_1d", {5, 7}, {7}));
  v.push_back(matmul("matmul_1d_1d", {33}, {33}));
  v.push_back(matmul("matmul_batched", {2, 3, 5, 7}, {2, 3, 7, 4}));
  v.push_back(matmul("matmul_shared_b", {2, 3, 5, 7}, {7, 4}));
  v.push_back(make_case("matmul_shared_const_b", "MatMul", {}, {in({4, 9, 24}), konst_random({24, 40}, 0.2)}, kGemmModes));
  v.push_back(matmul("matmul_shared_a", {5, 7}, {3, 7, 4}));
  v.push_back(matmul("matmul_batch_bcast", {2, 1, 5, 7}, {1, 3, 7, 4}));
  v.push_back(matmul("matmul_batch_bcast_5d", {4, 1, 3, 5, 6}, {2, 1, 6, 2}));
  v.push_back(matmul("matmul_1d_batched", {7}, {3, 7, 4}));
  v.push_back(matmul("matmul_batched_1d", {3, 2, 7}, {7}));
  v.push_back(matmul("matmul_k1", {2, 6, 1}, {2, 1, 9}));
  v.push_back(matmul("matmul_large", {3, 64, 130}, {130, 97}));
  v.push_back(matmul("matmul_empty_batch", {0, 5, 7}, {7, 3}, kExact));
  v.push_back(matmul("matmul_empty_m", {2, 0, 7}, {7, 3}, kExact));
  v.push_back(matmul("matmul_k0", {2, 4, 0}, {0, 3}, kExact));
  {
    OpCase c = matmul("matmul_float64", {2, 5, 9}, {9, 6}, kExact);
    for (auto& i : c.inputs) i.dtype = DataType::kFloat64;
    v.push_back(c);
  }
  for (auto [name, t] : {std::pair{"int32", DataType::kInt32}, std::pair{"int64", DataType::kInt64},
                         std::pair{"uint32", DataType::kUInt32}}) {
    OpCase c = matmul(std::string("matmul_") + name, {2, 1, 17, 19}, {3, 19, 18}, kExact);
    for (auto& i : c.inputs) i = in(i.shape, t, t == DataType::kUInt32 ? 0 : -100, 100);
    v.push_back(c);
    OpCase d = matmul(std::string("matmul_") + name + "_1d", {19}, {19, 5}, kExact);
    for (auto& i : d.inputs) i = in(i.shape, t, t == DataType::kUInt32 ? 0 : -100, 100);
    v.push_back(d);
  }
  // kiln.FusedGemm: every activation, on Gemm (bias [N]) and MatMul (bias [N] / [M,N]).
  for (const char* act : {"", "Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSwish", "Gelu", "GeluTanh"}) {
    const std::string a = act;
    Attributes at = attrs({{"base", Attribute::String("Gemm")}, {"transB", one},
                           {"activation", Attribute::String(a == "GeluTanh" ? "Gelu" : a)}});
    if (a == "Clip") {
      at.set("act_min", Attribute::Float(-0.5f));
      at.set("act_max", Attribute::Float(0.7f));
    }
    if (a == "LeakyRelu") at.set("act_alpha", Attribute::Float(0.2f));
    if (a == "GeluTanh") at.set("act_approximate", Attribute::String("tanh"));
    OpCase c = make_case("fused_gemm_" + (a.empty() ? std::string("none") : a), "FusedGemm", at,
                    {in({6, 40}), konst_random({23, 40}, 0.3), konst_random({23}, 0.5)}, kGemmModes, "kiln");
    v.push_back(c);
    c.name = "fused_matmul_" + (a.empty() ? std::string("none") : a);
    c.attrs.set("base", Attribute::String("MatMul"));
    c.attrs.erase("transB");
    c.inputs = {in({2, 5, 40}), konst_random({40, 23}, 0.3), konst_random({23}, 0.5)};
    v.push_back(c);
  }
  v.push_back(make_case("fused_matmul_bias_mn", "FusedGemm",
                   attrs({{"base", Attribute::String("MatMul")}, {"activation", Attribute::String("Relu")}}),
                   {in({3, 5, 8}), in({8, 7}), in({5, 7})}, kGemmModes, "kiln"));
  v.push_back(make_case("fused_matmul_no_bias", "FusedGemm",
                   attrs({{"base", Attribute::String("MatMul")}, {"activation", Attribute::String("Tanh")}}),
                   {in({9, 8}), in({8, 7})}, kGemmModes, "kiln"));
  v.push_back(make_case("fused_gemm_alpha_beta", "FusedGemm",
                   attrs({{"base", Attribute::String("Gemm")}, {"activation", Attribute::String("Sigmoid")},
                          {"alpha", Attribute::Float(0.7f)}, {"beta", Attribute::Float(-2.f)}, {"transA", one}}),
                   {in({12, 6}), in({12, 10}), in({6, 10})}, kGemmModes, "kiln"));
  // kiln.Attention
  const Attribute scale = Attribute::Float(0.35f);
  auto attention = [&](std::string name, std::vector<int64_t> q, std::vector<int64_t> kt,
                       std::vector<int64_t> vv, CaseInput mask, Attributes at, Modes modes = kGemmModes) {
    std::vector<CaseInput> ins = {in(std::move(q)), in(std::move(kt)), in(std::move(vv))};
    if (!mask.absent) ins.push_back(std::move(mask));
    return make_case(std::move(name), "Attention", std::move(at), std::move(ins), std::move(modes), "kiln");
  };
  v.push_back(attention("attention_plain", {2, 3, 5, 8}, {2, 3, 8, 6}, {2, 3, 6, 4}, absent(),
                        attrs({{"scale", scale}})));
  v.push_back(attention("attention_mask", {2, 3, 5, 8}, {2, 3, 8, 6}, {2, 3, 6, 4}, in({2, 1, 5, 6}),
                        attrs({{"scale", scale}})));
  v.push_back(attention("attention_mask_row", {2, 3, 5, 8}, {2, 3, 8, 6}, {2, 3, 6, 4}, in({6}),
                        attrs({{"scale", scale}})));
  v.push_back(attention("attention_heads_bcast", {2, 3, 5, 8}, {2, 1, 8, 6}, {2, 1, 6, 4}, absent(),
                        attrs({{"scale", scale}})));
  v.push_back(attention("attention_3d", {4, 7, 16}, {4, 16, 9}, {4, 9, 5}, in({7, 9}), attrs({})));
  v.push_back(attention("attention_long_rows", {1, 2, 3, 16}, {1, 2, 16, 1500}, {1, 2, 1500, 8},
                        in({1, 1, 3, 1500}), attrs({{"scale", Attribute::Float(0.25f)}})));
  {
    // Row 1 of every head fully masked (-inf), row 3 partly.
    const float ninf = -std::numeric_limits<float>::infinity();
    std::vector<float> m(5 * 6, 0.f);
    for (int t = 0; t < 6; ++t) m[1 * 6 + t] = ninf;
    m[3 * 6 + 0] = m[3 * 6 + 4] = ninf;
    for (int nz : {0, 1}) {
      OpCase c = attention(nz ? "attention_masked_row_nan_to_zero" : "attention_masked_row_nan",
                           {2, 3, 5, 8}, {2, 3, 8, 6}, {2, 3, 6, 4},
                           konst(Tensor::from<float>({1, 1, 5, 6}, m)),
                           attrs({{"scale", scale}, {"nan_to_zero", Attribute::Int(nz)}}));
      v.push_back(c);
    }
  }
  {
    OpCase c = attention("attention_float64", {2, 4, 6}, {2, 6, 5}, {2, 5, 3}, in({2, 4, 5}),
                         attrs({{"scale", scale}}), kExact);
    for (auto& i : c.inputs) i.dtype = DataType::kFloat64;
    v.push_back(c);
  }
}

}  // namespace

std::vector<OpCase> gemm_pool_cases() {
  std::vector<OpCase> v;
  pool_cases(v);
  gemm_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
