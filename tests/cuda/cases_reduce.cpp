// Reduction family cases: the ten Reduce* ops (axes forms, keepdims, noop_with_empty_axes,
// empty reductions and tensors, NaN, integer and bool types, NHWC spatial means), ArgMax/ArgMin
// (select_last_index, ties, NaN), TopK (ties, k = axis size, NaN, the block and workspace sorts),
// Softmax/LogSoftmax/Hardmax (last and inner axes, legacy 2-D, long and many rows), the
// normalizations (Layer, RMS, Instance, Group, Lp, MVN, Batch incl. NHWC), CumSum, CumProd
// (gated) and Quantize/Dequantize/DynamicQuantizeLinear.
#include <cmath>
#include <limits>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

using Modes = std::vector<std::string>;
const Modes kF = {"fp32", "fp16"};
const Modes kNhwc = {"fp32", "fp16", "nhwc16"};
const Modes kExact = {"fp32"};
constexpr DataType kF64 = DataType::kFloat64;
constexpr DataType kI32 = DataType::kInt32;
constexpr DataType kI64 = DataType::kInt64;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Attribute I(int64_t v) { return Attribute::Int(v); }

OpCase make(std::string name, std::string op, Attributes a, std::vector<CaseInput> ins,
            Modes modes, int outputs = 1) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = std::move(op);
  c.attrs = std::move(a);
  c.inputs = std::move(ins);
  c.modes = std::move(modes);
  c.num_outputs = outputs;
  return c;
}

// A non-constant float input with fixed values.
CaseInput fixed(std::vector<int64_t> shape, std::vector<float> values) {
  CaseInput c = konst(Tensor::from<float>(std::move(shape), values));
  c.constant = false;
  return c;
}

// A constant input of random values in [lo, hi] (fresh per run).
CaseInput konst_range(std::vector<int64_t> shape, double lo, double hi, DataType t = DataType::kFloat32) {
  CaseInput c = in(std::move(shape), t, lo, hi);
  c.constant = true;
  return c;
}

// Pseudo-random floats in [-1, 1) with every `every`-th one replaced by `special`.
std::vector<float> values_with(int64_t n, int64_t every, float special) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = 2024;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    v[i] = static_cast<float>(s >> 8) / static_cast<float>(1 << 24) * 2.f - 1.f;
    if (every > 0 && i % every == every - 1) v[i] = special;
  }
  return v;
}

// n distinct multiples of 1/16 in a scrambled order: exact in float16, so index outputs agree
// between the fp16 build and the float32 reference.
std::vector<float> distinct16(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + 11) % n) / 16.f - 8.f;
  return v;
}

// n values exact in float16, `kinds` of them (many ties when kinds < n).
std::vector<float> ties16(int64_t n, int64_t kinds) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 37 + 11) % kinds) / 16.f - 6.f;
  return v;
}

// --- Reduce* -----------------------------------------------------------------------------------

void reduce_op_cases(std::vector<OpCase>& v) {
  struct Op {
    const char* name;
    double lo, hi;  // input range that keeps the op defined and fp16-meaningful
  };
  const Op ops[] = {{"ReduceSum", -1, 1},   {"ReduceMean", -1, 1},      {"ReduceMax", -1, 1},
                    {"ReduceMin", -1, 1},   {"ReduceProd", 0.7, 1.3},   {"ReduceL1", -1, 1},
                    {"ReduceL2", -1, 1},    {"ReduceLogSum", 0.1, 1},   {"ReduceLogSumExp", -2, 2},
                    {"ReduceSumSquare", -1, 1}};
  for (const Op& op : ops) {
    const std::string n = op.name;
    v.push_back(make(n + "_last_keep", n, {}, {in({3, 5, 40}, DataType::kFloat32, op.lo, op.hi), ints({-1})}, kF));
    v.push_back(make(n + "_axes02_nokeep", n, attrs({{"keepdims", I(0)}}),
                     {in({4, 6, 7}, DataType::kFloat32, op.lo, op.hi), ints({0, -1})}, kF));
    v.push_back(make(n + "_all", n, {}, {in({3, 4, 5}, DataType::kFloat32, op.lo, op.hi)}, kF));
    v.push_back(make(n + "_middle_f64", n, {}, {in({2, 9, 8}, kF64, op.lo, op.hi), ints({1})}, kExact));
    v.push_back(make(n + "_spatial_nhwc", n, {}, {in({2, 24, 5, 6}, DataType::kFloat32, op.lo, op.hi), ints({2, 3})},
                     kNhwc));
    v.push_back(make(n + "_empty_set", n, {}, {in({0, 3}), ints({0})}, kExact));
    v.push_back(make(n + "_noop", n, attrs({{"noop_with_empty_axes", I(1)}}),
                     {in({3, 4}, DataType::kFloat32, op.lo, op.hi)}, kExact));
  }
  // The common shapes: a long last axis (block per row), SE-block means, reducing a leading axis.
  v.push_back(make("ReduceMean_last_long", "ReduceMean", {}, {in({6, 5000}), ints({1})}, kF));
  v.push_back(make("ReduceMean_se_block", "ReduceMean", {}, {in({2, 96, 7, 7}), ints({-2, -1})}, kNhwc));
  v.push_back(make("ReduceMean_se_block_nokeep", "ReduceMean", attrs({{"keepdims", I(0)}}),
                   {in({2, 300, 7, 7}), ints({2, 3})}, kNhwc));
  v.push_back(make("ReduceSum_leading_axis", "ReduceSum", {}, {in({3000, 33}), ints({0})}, kF));
  v.push_back(make("ReduceSum_leading_few", "ReduceSum", {}, {in({5000, 3}), ints({0})}, kF));
  // Few rows with the reduced axes strided, split into pieces (mode 1's chunks): ConvNeXt-V2's
  // GRN (an L2 norm over H and W of a channels-last tensor), a long leading axis, an NHWC mean.
  v.push_back(make("ReduceL2_grn_split", "ReduceL2", {}, {in({2, 40, 40, 96}), ints({1, 2})}, kF));
  v.push_back(make("ReduceSum_leading_split", "ReduceSum", {}, {in({4000, 40}), ints({0})}, kF));
  v.push_back(make("ReduceMean_spatial_nhwc_split", "ReduceMean", {}, {in({2, 64, 40, 40}), ints({2, 3})},
                   kNhwc));
  // Large whole-tensor reductions (grid-stride loops). A zero-mean float16 sum is dominated by
  // the inputs' rounding, so the float16 build is checked on a mean of positive values.
  v.push_back(make("ReduceSum_whole_large", "ReduceSum", attrs({{"keepdims", I(0)}}), {in({300000})}, kExact));
  v.push_back(make("ReduceMean_whole_large", "ReduceMean", attrs({{"keepdims", I(0)}}),
                   {in({300, 1000}, DataType::kFloat32, 0, 1)}, kF));
  v.push_back(make("ReduceMax_channel_nhwc", "ReduceMax", {}, {in({2, 16, 5, 5}), ints({1})}, kNhwc));
  v.push_back(make("ReduceSum_scalar", "ReduceSum", {}, {in({})}, kExact));
  v.push_back(make("ReduceSum_empty_axes_tensor", "ReduceSum", {}, {in({3, 4}), ints({})}, kExact));
  v.push_back(make("ReduceSum_empty_tensor_kept", "ReduceSum", {}, {in({2, 0, 3}), ints({2})}, kExact));
  v.push_back(make("ReduceSum_all_nokeep_rank0", "ReduceSum", attrs({{"keepdims", I(0)}}),
                   {in({2, 3, 4})}, kExact));
  v.push_back(make("ReduceSum_noncontiguous_axes", "ReduceSum", {}, {in({3, 4, 5, 6}), ints({0, 2})}, kF));
  // NaN propagation (and infinities) of Max/Min; LogSumExp of a row with +inf and -inf.
  v.push_back(make("ReduceMax_nan", "ReduceMax", {}, {fixed({6, 20}, values_with(120, 37, kNaN)), ints({1})}, kF));
  v.push_back(make("ReduceMin_nan", "ReduceMin", {}, {fixed({6, 20}, values_with(120, 37, kNaN)), ints({1})}, kF));
  v.push_back(make("ReduceMax_neg_inf", "ReduceMax", {}, {fixed({2, 3}, {-kInf, -kInf, -kInf, 1, -kInf, 2}), ints({1})}, kExact));
  v.push_back(make("ReduceLogSumExp_inf", "ReduceLogSumExp", {},
                   {fixed({3, 3}, {kInf, 1, 2, -kInf, -kInf, -kInf, 0.5f, -kInf, 1}), ints({1})}, kExact));
  // Integer and bool types (exact).
  for (auto [tn, t] : {std::pair{"int32", kI32}, std::pair{"int64", kI64}}) {
    const std::string s = tn;
    for (const char* op : {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceL1", "ReduceSumSquare"}) {
      v.push_back(make(std::string(op) + "_" + s, op, {}, {in({3, 10, 4}, t, -100, 100), ints({1})}, kExact));
      v.push_back(make(std::string(op) + "_" + s + "_all", op, attrs({{"keepdims", I(0)}}),
                       {in({5, 300}, t, -1000, 1000)}, kExact));
    }
    v.push_back(make("ReduceProd_" + s, "ReduceProd", {}, {in({4, 6}, t, -3, 3), ints({1})}, kExact));
    v.push_back(make("ReduceL2_" + s, "ReduceL2", {}, {in({4, 6}, t, -20, 20), ints({1})}, kExact));
    v.push_back(make("ReduceLogSum_" + s, "ReduceLogSum", {}, {in({4, 6}, t, 1, 500), ints({1})}, kExact));
    v.push_back(make("ReduceLogSumExp_" + s, "ReduceLogSumExp", {}, {in({4, 6}, t, -5, 5), ints({1})}, kExact));
    v.push_back(make("ReduceMax_empty_" + s, "ReduceMax", {}, {in({0, 3}, t), ints({0})}, kExact));
    v.push_back(make("ReduceMean_empty_" + s, "ReduceMean", {}, {in({0, 3}, t), ints({0})}, kExact));
  }
  v.push_back(make("ReduceSum_int32_wraps", "ReduceSum", {}, {in({2, 50}, kI32, 1e8, 2e9), ints({1})}, kExact));
  v.push_back(make("ReduceSum_uint8", "ReduceSum", {}, {in({3, 70}, DataType::kUInt8, 0, 255), ints({1})}, kExact));
  v.push_back(make("ReduceMax_int8", "ReduceMax", {}, {in({3, 70}, DataType::kInt8, -128, 127), ints({0})}, kExact));
  v.push_back(make("ReduceMax_bool", "ReduceMax", {}, {in({4, 5}, DataType::kBool), ints({1})}, kExact));
  v.push_back(make("ReduceMin_bool", "ReduceMin", attrs({{"keepdims", I(0)}}), {in({4, 5}, DataType::kBool), ints({0})}, kExact));
}

// --- ArgMax / ArgMin / TopK --------------------------------------------------------------------

void index_cases(std::vector<OpCase>& v) {
  for (const char* op : {"ArgMax", "ArgMin"}) {
    const std::string n = op;
    v.push_back(make(n + "_axis1", n, attrs({{"axis", I(1)}}), {in({3, 7, 5})}, kExact));
    v.push_back(make(n + "_last_nokeep", n, attrs({{"axis", I(-1)}, {"keepdims", I(0)}}), {in({4, 3, 50})}, kExact));
    v.push_back(make(n + "_axis0", n, {}, {in({40, 6})}, kExact));
    v.push_back(make(n + "_long_row", n, attrs({{"axis", I(-1)}}), {in({2, 5000})}, kExact));
    v.push_back(make(n + "_split_row", n, attrs({{"axis", I(-1)}}), {in({2, 20000})}, kExact));
    v.push_back(make(n + "_split_row_ties_last", n, attrs({{"axis", I(-1)}, {"select_last_index", I(1)}}),
                     {in({3, 30000}, kI32, 0, 50)}, kExact));
    v.push_back(make(n + "_f64", n, attrs({{"axis", I(1)}}), {in({3, 20}, kF64)}, kExact));
    v.push_back(make(n + "_fp16_exact", n, attrs({{"axis", I(1)}}), {fixed({2, 256}, distinct16(512))}, kF));
    v.push_back(make(n + "_nan", n, attrs({{"axis", I(1)}}), {fixed({6, 20}, values_with(120, 23, kNaN))}, kExact));
    for (auto [tn, t] : {std::pair{"int32", kI32}, std::pair{"int64", kI64}}) {
      v.push_back(make(n + "_ties_" + tn, n, attrs({{"axis", I(1)}}), {in({5, 40}, t, 0, 3)}, kExact));
      v.push_back(make(n + "_ties_last_" + tn, n, attrs({{"axis", I(1)}, {"select_last_index", I(1)}}),
                       {in({5, 40}, t, 0, 3)}, kExact));
    }
    v.push_back(make(n + "_ties_last_inner", n, attrs({{"axis", I(0)}, {"select_last_index", I(1)}}),
                     {in({30, 4, 3}, kI32, 0, 2)}, kExact));
    // A long leading axis split into pieces: ties across pieces keep the first (or last) index.
    v.push_back(make(n + "_leading_split", n, attrs({{"axis", I(0)}}), {in({3000, 20}, kI32, 0, 50)}, kExact));
    v.push_back(make(n + "_leading_split_ties_last", n, attrs({{"axis", I(0)}, {"select_last_index", I(1)}}),
                     {in({3000, 20}, kI32, 0, 50)}, kExact));
    v.push_back(make(n + "_bool", n, attrs({{"axis", I(1)}}), {in({4, 9}, DataType::kBool)}, kExact));
    v.push_back(make(n + "_empty_outer", n, attrs({{"axis", I(1)}}), {in({0, 5})}, kExact));
  }
  auto topk = [&](std::string name, std::vector<CaseInput> ins, int64_t k, Attributes a, Modes m) {
    ins.push_back(ints({k}));
    v.push_back(make("TopK_" + name, "TopK", std::move(a), std::move(ins), std::move(m), 2));
  };
  topk("last", {in({3, 20})}, 5, {}, kExact);
  topk("smallest_axis0", {in({10, 4, 3})}, 3, attrs({{"axis", I(0)}, {"largest", I(0)}}), kExact);
  topk("k_all", {in({4, 33})}, 33, {}, kExact);
  topk("k_zero", {in({4, 33})}, 0, {}, kExact);
  topk("ties_int32", {in({6, 50}, kI32, 0, 4)}, 50, {}, kExact);
  topk("ties_int32_smallest", {in({6, 50}, kI32, 0, 4)}, 20, attrs({{"largest", I(0)}}), kExact);
  topk("ties_int64_inner", {in({20, 3, 2}, kI64, -2, 2)}, 20, attrs({{"axis", I(-3)}}), kExact);
  topk("f64", {in({5, 17}, kF64)}, 4, attrs({{"largest", I(0)}}), kExact);
  topk("nan", {fixed({4, 30}, values_with(120, 7, kNaN))}, 10, {}, kExact);
  topk("nan_smallest", {fixed({4, 30}, values_with(120, 7, kNaN))}, 30, attrs({{"largest", I(0)}}), kExact);
  topk("fp16_exact", {fixed({2, 300}, distinct16(600))}, 17, {}, kF);
  topk("row_3000", {in({3, 3000})}, 100, {}, kExact);
  topk("row_4096_all", {in({2, 4096})}, 4096, attrs({{"largest", I(0)}}), kExact);
  topk("row_5000_workspace", {in({2, 5000})}, 50, {}, kExact);
  topk("row_9000_ties_workspace", {in({2, 9000}, kI32, -20, 20)}, 9000, {}, kExact);
  // Long lanes sort by radix keys: one lane device-wide, several as segments, a strided axis;
  // ties by index, NaN largest and -0 equal to +0 in either direction.
  topk("one_lane_20000", {in({1, 20000})}, 1000, {}, kExact);
  topk("f64_long_smallest", {in({2, 5000}, kF64)}, 100, attrs({{"largest", I(0)}}), kExact);
  topk("int64_long_inner", {in({5000, 2}, kI64, -30, 30)}, 5000, attrs({{"axis", I(0)}}), kExact);
  topk("int8_long_smallest", {in({3, 6000}, DataType::kInt8, -100, 100)}, 300,
       attrs({{"largest", I(0)}}), kExact);
  topk("fp16_long_ties", {fixed({2, 7000}, ties16(14000, 200))}, 2000, {}, kF);
  std::vector<float> special = values_with(9000, 7, kNaN);
  for (size_t i = 0; i < special.size(); ++i) {
    if (i % 11 == 3) special[i] = -0.f;
    if (i % 13 == 5) special[i] = 0.f;
    if (i % 17 == 6) special[i] = kInf;
    if (i % 19 == 8) special[i] = -kInf;
  }
  topk("long_special", {fixed({1, 9000}, special)}, 4000, {}, kExact);
  topk("long_special_smallest", {fixed({1, 9000}, special)}, 9000, attrs({{"largest", I(0)}}), kExact);
  // Lanes of 1025-4096 sort by the same keys in one block (CUB's block radix sort): ties by index,
  // special values, 64-bit and 8-bit keys, a strided axis, a detector's one class of 3,234 anchors.
  std::vector<float> block_special(special.begin(), special.begin() + 3234);
  topk("block_special", {fixed({1, 3234}, block_special)}, 300, {}, kExact);
  topk("block_special_smallest", {fixed({1, 3234}, block_special)}, 3234, attrs({{"largest", I(0)}}),
       kExact);
  topk("block_ties_int32_inner", {in({2000, 3}, kI32, -5, 5)}, 1500, attrs({{"axis", I(0)}}), kExact);
  topk("block_f64_smallest", {in({3, 2500}, kF64)}, 2500, attrs({{"largest", I(0)}}), kExact);
  topk("block_int8", {in({4, 1100}, DataType::kInt8, -100, 100)}, 1025, {}, kExact);
  topk("block_fp16_ties", {fixed({2, 3000}, ties16(6000, 100))}, 300, {}, kF);
  // batch_select_topk's masked top-k: 90 classes' rows of 3,234 anchors, most masked to -inf
  // (ties among them by index), K 300 with fewer selected than K in some rows.
  std::vector<float> masked(90 * 3234);
  uint32_t seed = 7;
  for (size_t i = 0; i < masked.size(); ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float u = static_cast<float>(seed >> 8) / 16777216.f;
    masked[i] = u < 0.9f + 0.1f * static_cast<float>(i / 3234 % 3) / 3.f ? -kInf : u;
  }
  topk("masked_class_rows", {fixed({90, 3234}, masked)}, 300, attrs({{"axis", I(1)}}), kExact);
  topk("many_rows", {in({2000, 12})}, 3, {}, kExact);
  topk("empty_lanes", {in({0, 8})}, 2, {}, kExact);
}

// --- Softmax / LogSoftmax / Hardmax -----------------------------------------------------------

void softmax_cases(std::vector<OpCase>& v) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const std::string n = op;
    v.push_back(make(n + "_small", n, {}, {in({3, 10}, DataType::kFloat32, -3, 3)}, kF));
    v.push_back(make(n + "_long_row", n, {}, {in({4, 4096}, DataType::kFloat32, -4, 4)}, kF));
    v.push_back(make(n + "_many_rows", n, {}, {in({4096, 128}, DataType::kFloat32, -4, 4)}, kF));
    v.push_back(make(n + "_rows_1000", n, {}, {in({2, 3, 1000}, DataType::kFloat32, -4, 4)}, kF));
    v.push_back(make(n + "_rows_300", n, {}, {in({5, 300})}, kF));
    v.push_back(make(n + "_axis1", n, attrs({{"axis", I(1)}}), {in({2, 5, 4, 3}, DataType::kFloat32, -3, 3)}, kF));
    v.push_back(make(n + "_axis_neg3", n, attrs({{"axis", I(-3)}}), {in({2, 5, 4, 3})}, kF));
    v.push_back(make(n + "_legacy_2d", n, attrs({{"axis", I(1)}, {"kiln_legacy_2d", I(1)}}),
                     {in({2, 3, 4, 5}, DataType::kFloat32, -3, 3)}, kF));
    v.push_back(make(n + "_f64", n, {}, {in({6, 70}, kF64, -5, 5)}, kExact));
    v.push_back(make(n + "_f64_axis0", n, attrs({{"axis", I(0)}}), {in({6, 7}, kF64, -5, 5)}, kExact));
    v.push_back(make(n + "_stable_large", n, {}, {in({8, 64}, DataType::kFloat32, -80, 80)}, kExact));
    v.push_back(make(n + "_special", n, {},
                     {fixed({4, 3}, {kNaN, 1, 2, 0, kNaN, 1, -kInf, -kInf, -kInf, kInf, 0, 1})}, kExact));
    v.push_back(make(n + "_empty", n, {}, {in({0, 5})}, kExact));
  }
  const std::string h = "Hardmax";
  v.push_back(make(h + "_last", h, {}, {in({5, 30})}, kExact));
  v.push_back(make(h + "_long_row", h, {}, {in({3, 3000})}, kExact));
  v.push_back(make(h + "_axis0", h, attrs({{"axis", I(0)}}), {in({7, 4, 3})}, kExact));
  v.push_back(make(h + "_fp16_exact", h, {}, {fixed({4, 128}, distinct16(512))}, kF));
  v.push_back(make(h + "_ties", h, {}, {fixed({3, 4}, {1, 3, 3, 2, 5, 5, 5, 5, 0, -1, 0, -1})}, kF));
  v.push_back(make(h + "_nan", h, {}, {fixed({3, 4}, {kNaN, 3, 4, 2, 1, kNaN, 5, 5, 0, 1, 2, kNaN})}, kExact));
  v.push_back(make(h + "_legacy_2d", h, attrs({{"axis", I(1)}, {"kiln_legacy_2d", I(1)}}), {in({2, 3, 4})}, kExact));
  v.push_back(make(h + "_f64", h, attrs({{"axis", I(1)}}), {in({3, 9, 2}, kF64)}, kExact));
}

// --- normalizations --------------------------------------------------------------------------

void norm_cases(std::vector<OpCase>& v) {
  const std::string ln = "LayerNormalization";
  v.push_back(make("LayerNorm_bert", ln, {}, {in({2, 128, 768}), konst_random({768}, 1), konst_random({768}, 1)}, kF));
  v.push_back(make("LayerNorm_stats", ln, attrs({{"epsilon", Attribute::Float(1e-3f)}}),
                   {in({4, 7, 50}), in({50}), in({50})}, kF, 3));
  v.push_back(make("LayerNorm_axis1", ln, attrs({{"axis", I(1)}}), {in({2, 3, 4, 5}), in({3, 4, 5}), absent()}, kF, 3));
  v.push_back(make("LayerNorm_bcast_params", ln, attrs({{"axis", I(-2)}}), {in({3, 6, 4, 5}), in({5}), in({4, 1})}, kF));
  v.push_back(make("LayerNorm_no_bias", ln, {}, {in({5, 33}), in({33})}, kF));
  v.push_back(make("LayerNorm_long_row", ln, {}, {in({4, 3000}), in({3000}), in({3000})}, kF, 3));
  v.push_back(make("LayerNorm_f64", ln, {}, {in({3, 40}, kF64), in({40}, kF64), in({40}, kF64)}, kExact, 3));
  v.push_back(make("LayerNorm_offset_input", ln, {}, {in({8, 64}, DataType::kFloat32, 5, 7), in({64}), in({64})}, kF));
  v.push_back(make("LayerNorm_empty", ln, {}, {in({0, 16}), in({16}), in({16})}, kExact));

  const std::string rms = "RMSNormalization";
  v.push_back(make("RMSNorm_last", rms, {}, {in({2, 16, 64}), in({64})}, kF));
  v.push_back(make("RMSNorm_axis1", rms, attrs({{"axis", I(1)}, {"epsilon", Attribute::Float(1e-6f)}}),
                   {in({3, 4, 10}), in({4, 10})}, kF));
  v.push_back(make("RMSNorm_scale_full_bcast", rms, {}, {in({2, 3, 40}), in({2, 1, 40})}, kF));
  v.push_back(make("RMSNorm_long", rms, {}, {in({3, 2048}), in({2048})}, kF));
  v.push_back(make("RMSNorm_f64", rms, {}, {in({4, 30}, kF64), in({30}, kF64)}, kExact));
  // A float16 X with a float32 scale (the generic parameter path); float16 output precision.
  v.push_back(make("RMSNorm_mixed_types", rms, {}, {in({2, 8, 32}, DataType::kFloat16), in({32})}, kExact));
  v.back().tolerance = 1e-2;

  const std::string inn = "InstanceNormalization";
  v.push_back(make("InstanceNorm_small", inn, {}, {in({2, 3, 5, 6}), in({3}), in({3})}, kF));
  v.push_back(make("InstanceNorm_large_plane", inn, attrs({{"epsilon", Attribute::Float(1e-3f)}}),
                   {in({1, 4, 64, 64}), konst_random({4}, 1), konst_random({4}, 1)}, kF));
  v.push_back(make("InstanceNorm_3d", inn, {}, {in({2, 4, 9}), in({4}), in({4})}, kF));
  v.push_back(make("InstanceNorm_f64", inn, {}, {in({2, 3, 4, 4}, kF64), in({3}, kF64), in({3}, kF64)}, kExact));

  const std::string gn = "GroupNormalization";
  v.push_back(make("GroupNorm_g3", gn, attrs({{"num_groups", I(3)}}), {in({2, 6, 4, 5}), in({6}), in({6})}, kF));
  v.push_back(make("GroupNorm_g1", gn, attrs({{"num_groups", I(1)}}), {in({2, 4, 3, 3}), in({4}), in({4})}, kF));
  v.push_back(make("GroupNorm_per_channel_groups", gn, attrs({{"num_groups", I(8)}}), {in({1, 8, 6}), in({8}), in({8})}, kF));
  v.push_back(make("GroupNorm_per_group_params", gn, attrs({{"num_groups", I(2)}, {"kiln_per_group", I(1)}}),
                   {in({2, 4, 3, 3}), in({2}), in({2})}, kF));
  v.push_back(make("GroupNorm_large", gn, attrs({{"num_groups", I(4)}}), {in({2, 16, 24, 24}), in({16}), in({16})}, kF));
  v.push_back(make("GroupNorm_f64", gn, attrs({{"num_groups", I(2)}}), {in({2, 4, 5}, kF64), in({4}, kF64), in({4}, kF64)}, kExact));
  // Few long rows split over blocks (norm_split_*), on values away from 0 so that combining the
  // pieces' centred sums matters: rows of whole 16-byte vectors and of an odd length (the
  // scalar path); one group in NHWC storage (the row the whole image, the channel innermost),
  // also split; LayerNormalization's Mean and InvStdDev outputs from it.
  v.push_back(make("GroupNorm_split", gn, attrs({{"num_groups", I(2)}}),
                   {in({2, 8, 64, 64}, DataType::kFloat32, 3, 5), in({8}), in({8})}, kF));
  v.push_back(make("GroupNorm_g1_nhwc", gn, attrs({{"num_groups", I(1)}}), {in({2, 16, 5, 6}), in({16}), in({16})},
                   kNhwc));
  v.push_back(make("GroupNorm_g1_nhwc_split", gn, attrs({{"num_groups", I(1)}}),
                   {in({2, 24, 40, 40}, DataType::kFloat32, 1, 3), in({24}), in({24})}, kNhwc));
  v.push_back(make("InstanceNorm_split", inn, {}, {in({1, 2, 128, 128}), in({2}), in({2})}, kF));
  // Channels-last GroupNorm of any group count (groupnorm.nhwc): groups whose channels straddle
  // 16-byte vectors (SD's 320 channels in 32 groups of 10), channels past one block's 256 vectors
  // (2560: a group split between two passes), channel counts that allow no vector (12: the
  // scalar path), one group, many pixel tiles, values far from 0 (the shifted sums), odd N.
  const Modes kNhwcGn = {"nhwc16", "nhwc32"};
  v.push_back(make("GroupNorm_nhwc_sd320", gn, attrs({{"num_groups", I(32)}}),
                   {in({2, 320, 9, 7}), in({320}), in({320})}, kNhwcGn));
  v.push_back(make("GroupNorm_nhwc_2560", gn, attrs({{"num_groups", I(32)}, {"epsilon", Attribute::Float(1e-6f)}}),
                   {in({2, 2560, 3, 5}), in({2560}), in({2560})}, kNhwcGn));
  v.push_back(make("GroupNorm_nhwc_scalar", gn, attrs({{"num_groups", I(3)}}),
                   {in({3, 12, 5, 7}), in({12}), in({12})}, kNhwcGn));
  v.push_back(make("GroupNorm_nhwc_tiles_offset", gn, attrs({{"num_groups", I(4)}}),
                   {in({1, 64, 67, 61}, DataType::kFloat32, 3, 5), in({64}), in({64})}, kNhwcGn));
  v.push_back(make("GroupNorm_nhwc_g1", gn, attrs({{"num_groups", I(1)}}),
                   {in({2, 40, 11, 13}, DataType::kFloat32, -4, -2), in({40}), in({40})}, kNhwcGn));
  // kiln.FusedGroupNorm: act(GroupNorm(X + addend)), the addend [N, C, 1, 1], [1, C, 1, 1] or
  // [C, 1, 1] (a UNet's timestep embedding); SiLU (its own path), GELU (the generic one).
  auto fgn = [&](const char* name, std::vector<int64_t> x, int64_t g, std::vector<int64_t> t,
                 const char* act, double lo = -1, double hi = 1) {
    Attributes a = attrs({{"num_groups", I(g)}});
    if (*act) a.set("activation", Attribute::String(act));
    const int64_t c = x[1];
    std::vector<CaseInput> ins = {in(x, DataType::kFloat32, lo, hi), konst_random({c}, 1),
                                  konst_random({c}, 1)};
    if (!t.empty()) ins.push_back(in(t, DataType::kFloat32, -2, 2));
    v.push_back(make_case(name, "FusedGroupNorm", a, ins, kNhwcGn, "kiln"));
  };
  fgn("FusedGroupNorm_silu", {2, 320, 8, 8}, 32, {}, "Swish");
  fgn("FusedGroupNorm_silu_addend", {2, 640, 5, 6}, 32, {2, 640, 1, 1}, "Swish", 2, 4);
  fgn("FusedGroupNorm_shared_addend", {3, 96, 7, 5}, 8, {1, 96, 1, 1}, "Swish");
  fgn("FusedGroupNorm_channel_addend", {2, 48, 9, 9}, 6, {48, 1, 1}, "");
  fgn("FusedGroupNorm_gelu_scalar", {2, 20, 6, 5}, 5, {2, 20, 1, 1}, "Gelu");
  fgn("FusedGroupNorm_2560_addend", {2, 2560, 4, 4}, 32, {2, 2560, 1, 1}, "Swish");
  fgn("FusedGroupNorm_vae_tiles", {1, 128, 96, 80}, 32, {}, "Swish", -3, 5);
  v.push_back(make("GroupNorm_split_odd_rows", gn, attrs({{"num_groups", I(1)}}),
                   {in({2, 3, 71, 73}, DataType::kFloat32, -3, -1), in({3}), in({3})}, kF));
  v.push_back(make("LayerNorm_split", ln, attrs({{"axis", I(1)}}),
                   {in({2, 8, 48, 48}, DataType::kFloat32, -2, 0), in({8, 48, 48}), in({8, 48, 48})}, kF, 3));

  const std::string lp = "LpNormalization";
  v.push_back(make("LpNorm_l2_last", lp, {}, {in({3, 10})}, kF));
  v.push_back(make("LpNorm_l1_axis1", lp, attrs({{"p", I(1)}, {"axis", I(1)}}), {in({2, 5, 4})}, kF));
  v.push_back(make("LpNorm_l2_axis0", lp, attrs({{"axis", I(0)}}), {in({6, 7, 2})}, kF));
  v.push_back(make("LpNorm_zero_row", lp, {}, {fixed({2, 3}, {0, 0, 0, 3, 4, 0})}, kF));
  v.push_back(make("LpNorm_f64", lp, attrs({{"p", I(1)}}), {in({3, 8}, kF64)}, kExact));

  const std::string mvn = "MeanVarianceNormalization";
  v.push_back(make("MVN_default", mvn, {}, {in({2, 3, 4, 5})}, kF));
  v.push_back(make("MVN_hw", mvn, attrs({{"axes", ints_attr({2, 3})}}), {in({2, 3, 4, 5})}, kF));
  v.push_back(make("MVN_channel", mvn, attrs({{"axes", ints_attr({1})}}), {in({2, 6, 3})}, kF));
  v.push_back(make("MVN_f64", mvn, attrs({{"axes", ints_attr({-1})}}), {in({4, 9}, kF64)}, kExact));

  const std::string bn = "BatchNormalization";
  auto bn_params = [](int64_t c, DataType t = DataType::kFloat32, bool constant = false) {
    std::vector<CaseInput> p = {in({c}, t), in({c}, t), in({c}, t), in({c}, t, 0.5, 1.5)};
    for (auto& i : p) i.constant = constant;
    return p;
  };
  auto with = [](std::vector<CaseInput> x, std::vector<CaseInput> p) {
    x.insert(x.end(), p.begin(), p.end());
    return x;
  };
  v.push_back(make("BatchNorm_4d", bn, {}, with({in({2, 8, 5, 6})}, bn_params(8)), kNhwc));
  v.push_back(make("BatchNorm_4d_const", bn, attrs({{"epsilon", Attribute::Float(1e-3f)}}),
                   with({in({2, 40, 7, 7})}, bn_params(40, DataType::kFloat32, true)), kNhwc));
  v.push_back(make("BatchNorm_densenet_nhwc", bn, {}, with({in({1, 96, 14, 14})}, bn_params(96, DataType::kFloat32, true)), kNhwc));
  v.push_back(make("BatchNorm_3d", bn, {}, with({in({2, 4, 10})}, bn_params(4)), kF));
  v.push_back(make("BatchNorm_2d", bn, {}, with({in({5, 4})}, bn_params(4)), kF));
  v.push_back(make("BatchNorm_5d", bn, {}, with({in({1, 3, 2, 3, 4})}, bn_params(3)), kF));
  {
    std::vector<CaseInput> p = {in({4, 3}), in({4, 3}), in({4, 3}), in({4, 3}, DataType::kFloat32, 0.5, 1.5)};
    v.push_back(make("BatchNorm_per_activation", bn, attrs({{"kiln_per_activation", I(1)}}),
                     with({in({2, 4, 3})}, p), kF));
  }
  v.push_back(make("BatchNorm_f64", bn, {}, with({in({2, 3, 4, 4}, kF64)}, bn_params(3, kF64)), kExact));
  v.push_back(make("BatchNorm_empty", bn, {}, with({in({0, 3, 4, 4})}, bn_params(3)), kExact));
}

// --- CumSum ----------------------------------------------------------------------------------

void cumsum_cases(std::vector<OpCase>& v) {
  const std::string c = "CumSum";
  for (int ex : {0, 1})
    for (int rev : {0, 1}) {
      const std::string s = std::string(ex ? "_exclusive" : "") + (rev ? "_reverse" : "");
      const Attributes a = attrs({{"exclusive", I(ex)}, {"reverse", I(rev)}});
      v.push_back(make("CumSum_rows" + s, c, a, {in({3, 40}), ints({1})}, kF));
      v.push_back(make("CumSum_inner" + s, c, a, {in({4, 5, 6}), ints({1})}, kF));
      v.push_back(make("CumSum_long" + s, c, a, {in({2, 3000}), ints({-1})}, kF));
      v.push_back(make("CumSum_int32" + s, c, a, {in({3, 300}, kI32, -1000, 1000), ints({1})}, kExact));
    }
  v.push_back(make("CumSum_axis_neg3", c, {}, {in({4, 5, 6}), ints({-3})}, kF));
  v.push_back(make("CumSum_axis_int32_scalar", c, {}, {in({4, 7}), konst(Tensor::scalar<int32_t>(0))}, kF));
  v.push_back(make("CumSum_int64_inner", c, attrs({{"reverse", I(1)}}), {in({5, 6, 3}, kI64, -1e6, 1e6), ints({1})}, kExact));
  v.push_back(make("CumSum_int32_wraps", c, {}, {in({2, 40}, kI32, 1e8, 2e9), ints({1})}, kExact));
  v.push_back(make("CumSum_f64", c, attrs({{"exclusive", I(1)}}), {in({3, 500}, kF64), ints({1})}, kExact));
  v.push_back(make("CumSum_empty", c, {}, {in({0, 4}), ints({1})}, kExact));
  v.push_back(make("CumSum_1d", c, {}, {in({700}), ints({0})}, kF));
  // CumProd: the same kernels with a product; factors near 1 keep long float products in range,
  // integers wrap exactly. The 3000-long product runs at fp32 only: its 3000 float16 inputs alone
  // put the product 1.5% from the float32 reference (each rounded by up to 2^-11; the H200 run
  // gave 0.016 in one of four seeds, every other case passing at fp16).
  const std::string p = "CumProd";
  for (int ex : {0, 1})
    for (int rev : {0, 1}) {
      const std::string s = std::string(ex ? "_exclusive" : "") + (rev ? "_reverse" : "");
      const Attributes a = attrs({{"exclusive", I(ex)}, {"reverse", I(rev)}});
      v.push_back(make("CumProd_rows" + s, p, a, {in({3, 40}, DataType::kFloat32, 0.8, 1.2), ints({1})}, kF));
      v.push_back(make("CumProd_inner" + s, p, a, {in({4, 5, 6}, DataType::kFloat32, -2, 2), ints({1})}, kF));
      v.push_back(make("CumProd_long" + s, p, a, {in({2, 3000}, DataType::kFloat32, 0.99, 1.01), ints({-1})}, kExact));
      v.push_back(make("CumProd_int32" + s, p, a, {in({3, 300}, kI32, -3, 3), ints({1})}, kExact));
    }
  v.push_back(make("CumProd_int64_inner", p, attrs({{"reverse", I(1)}}), {in({5, 6, 3}, kI64, -9, 9), ints({1})}, kExact));
  v.push_back(make("CumProd_f64", p, attrs({{"exclusive", I(1)}}), {in({3, 500}, kF64, 0.9, 1.1), ints({1})}, kExact));
  v.push_back(make("CumProd_empty", p, {}, {in({0, 4}), ints({1})}, kExact));
}

// --- QuantizeLinear / DequantizeLinear / DynamicQuantizeLinear ---------------------------------

void quant_cases(std::vector<OpCase>& v) {
  const std::string q = "QuantizeLinear", dq = "DequantizeLinear";
  // The float16 builds run Quantize/DynamicQuantize at float32 precision (a float16 scale would
  // shift the values), so their results stay exact there too.
  v.push_back(make("Quantize_uint8_tensor", q, {},
                   {in({3, 4, 5}, DataType::kFloat32, -3, 3), konst(Tensor::scalar<float>(0.02f)),
                    konst(Tensor::scalar<uint8_t>(128))}, kF));
  v.push_back(make("Quantize_default_uint8", q, {}, {in({50}, DataType::kFloat32, -1, 6), konst(Tensor::scalar<float>(0.03f))}, kExact));
  v.push_back(make("Quantize_int8_axis", q, {},
                   {in({2, 4, 5}, DataType::kFloat32, -2, 2), konst(Tensor::from<float>({4}, {0.01f, 0.02f, 0.05f, 0.1f})),
                    konst(Tensor::from<int8_t>({4}, {0, -10, 5, 127}))}, kExact));
  v.push_back(make("Quantize_int8_axis_last", q, attrs({{"axis", I(-1)}}),
                   {in({3, 2, 3}, DataType::kFloat32, -2, 2), konst(Tensor::from<float>({3}, {0.01f, 0.02f, 0.05f})),
                    konst(Tensor::from<int8_t>({3}, {1, -2, 3}))}, kExact));
  v.push_back(make("Quantize_blocked", q, attrs({{"axis", I(1)}, {"block_size", I(3)}}),
                   {in({2, 8, 3}, DataType::kFloat32, -2, 2), konst_range({2, 3, 3}, 0.01, 0.05)}, kExact));
  v.push_back(make("Quantize_blocked_int8_zp", q, attrs({{"axis", I(0)}, {"block_size", I(2)}}),
                   {in({5, 4}, DataType::kFloat32, -2, 2), konst_range({3, 4}, 0.01, 0.05),
                    konst_range({3, 4}, -20, 20, DataType::kInt8)}, kExact));
  v.push_back(make("Quantize_int16", q, {},
                   {in({40}, DataType::kFloat32, -100, 100), konst(Tensor::scalar<float>(0.001f)),
                    konst(Tensor::scalar<int16_t>(-7))}, kExact));
  v.push_back(make("Quantize_uint16_axis", q, {},
                   {in({2, 3, 4}, DataType::kFloat32, -1, 60), konst(Tensor::from<float>({3}, {0.001f, 0.002f, 0.01f})),
                    konst(Tensor::from<uint16_t>({3}, {0, 1000, 30000}))}, kExact));
  v.push_back(make("Quantize_from_int32", q, {},
                   {in({30}, kI32, -5000, 5000), konst(Tensor::scalar<float>(20.f)), konst(Tensor::scalar<int8_t>(3))}, kExact));
  v.push_back(make("Quantize_f64", q, {},
                   {in({30}, kF64, -3, 3), konst(Tensor::scalar<double>(0.01)), konst(Tensor::scalar<uint8_t>(100))}, kExact));
  v.push_back(make("Quantize_ties_nan_inf", q, {},
                   {fixed({10}, {0.25f, 0.75f, 1.25f, -0.25f, -0.75f, -1.25f, kNaN, kInf, -kInf, 63.75f}),
                    konst(Tensor::scalar<float>(0.5f)), konst(Tensor::scalar<int8_t>(1))}, kExact));
  v.push_back(make("Quantize_scale_input", q, {},
                   {in({4, 6}, DataType::kFloat32, -1, 1), in({6}, DataType::kFloat32, 0.01, 0.02),
                    konst(Tensor::from<uint8_t>({6}, {0, 10, 128, 200, 255, 3}))}, kExact));
  v.back().attrs.set("axis", I(1));
  v.push_back(make("Quantize_empty", q, {}, {in({0, 3}), konst(Tensor::scalar<float>(0.1f))}, kExact));

  v.push_back(make("Dequantize_int8_tensor", dq, {},
                   {in({3, 4, 5}, DataType::kInt8, -128, 127), konst(Tensor::scalar<float>(0.05f)),
                    konst(Tensor::scalar<int8_t>(-3))}, kF));
  v.push_back(make("Dequantize_uint8_axis", dq, {},
                   {in({2, 4, 3}, DataType::kUInt8, 0, 255), konst(Tensor::from<float>({4}, {0.01f, 0.02f, 0.5f, 1.f})),
                    konst(Tensor::from<uint8_t>({4}, {0, 128, 3, 255}))}, kF));
  v.push_back(make("Dequantize_int32_no_zp", dq, {}, {in({30}, kI32, -100000, 100000), konst(Tensor::scalar<float>(0.001f))}, kF));
  v.push_back(make("Dequantize_blocked", dq, attrs({{"axis", I(-1)}, {"block_size", I(4)}}),
                   {in({3, 10}, DataType::kInt8, -128, 127), konst_range({3, 3}, 0.01, 0.1),
                    konst_range({3, 3}, -5, 5, DataType::kInt8)}, kF));
  v.push_back(make("Dequantize_int16", dq, {},
                   {in({20}, DataType::kInt16, -30000, 30000), konst(Tensor::scalar<float>(0.001f)),
                    konst(Tensor::scalar<int16_t>(100))}, kF));
  v.push_back(make("Dequantize_f64_scale", dq, {},
                   {in({12}, DataType::kUInt8, 0, 255), konst(Tensor::scalar<double>(0.25)), konst(Tensor::scalar<uint8_t>(7))}, kExact));
  v.push_back(make("Dequantize_scale_input", dq, attrs({{"axis", I(0)}}),
                   {in({3, 5}, DataType::kInt8, -128, 127), in({3}, DataType::kFloat32, 0.1, 1)}, kF));

  const std::string dyn = "DynamicQuantizeLinear";
  v.push_back(make("DynQuant_mixed", dyn, {}, {in({4, 50}, DataType::kFloat32, -3, 5)}, kF, 3));
  v.push_back(make("DynQuant_positive", dyn, {}, {in({3, 7}, DataType::kFloat32, 0.5, 2)}, kExact, 3));
  v.push_back(make("DynQuant_negative", dyn, {}, {in({3, 7}, DataType::kFloat32, -4, -1)}, kExact, 3));
  v.push_back(make("DynQuant_large", dyn, {}, {in({600, 200}, DataType::kFloat32, -10, 3)}, kExact, 3));
  v.push_back(make("DynQuant_zeros_nan", dyn, {}, {fixed({5}, {0, 0, kNaN, 0, 0})}, kExact, 3));
  v.push_back(make("DynQuant_empty", dyn, {}, {in({0, 4})}, kExact, 3));
}

}  // namespace

std::vector<OpCase> reduce_cases() {
  std::vector<OpCase> v;
  reduce_op_cases(v);
  index_cases(v);
  softmax_cases(v);
  norm_cases(v);
  cumsum_cases(v);
  quant_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
