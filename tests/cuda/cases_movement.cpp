// Data movement family cases: the Reshape family (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
// Dropout with and without its mask), Transpose (tiled and general paths, one large NCHW->NHWC),
// Slice (negative steps, clamping, empty results), Concat, Split, Expand, Tile, DepthToSpace /
// SpaceToDepth (both modes), Trilu, Gather / GatherElements / GatherND (negative indices,
// batch_dims), ScatterND / ScatterElements (every reduction), Pad (every mode, negative pads,
// axes), Resize (nearest modes, linear, cubic, every coordinate transformation, sizes vs
// scales, antialias, NHWC) and kiln.Relayout (a region of layout ops as one gather). Movement is exact, so integer, bool and float64 variants run "fp32".
#include <cstdint>
#include <limits>

#include "backend_ops.h"

namespace kiln::gpu::test {

namespace {

using Modes = std::vector<std::string>;
using DT = DataType;
const Modes kFloat = {"fp32", "fp16"};
const Modes k4D = {"fp32", "fp16", "nhwc16"};
const Modes kExact = {"fp32"};

OpCase make(std::string name, std::string op, Attributes a, std::vector<CaseInput> ins,
            Modes modes = kFloat, int outputs = 1) {
  OpCase c;
  c.name = std::move(name);
  c.op_type = std::move(op);
  c.attrs = std::move(a);
  c.inputs = std::move(ins);
  c.modes = std::move(modes);
  c.num_outputs = outputs;
  return c;
}

Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute S(const char* s) { return Attribute::String(s); }
Attribute F(float v) { return Attribute::Float(v); }

// A device (non-constant) int64 input with fixed values.
CaseInput dev_ints(std::vector<int64_t> shape, std::vector<int64_t> values) {
  CaseInput c = konst(Tensor::from<int64_t>(std::move(shape), values));
  c.constant = false;
  return c;
}
CaseInput const_ints(std::vector<int64_t> shape, std::vector<int64_t> values) {
  return konst(Tensor::from<int64_t>(std::move(shape), values));
}
CaseInput floats(std::vector<float> v) {
  return konst(Tensor::from<float>({static_cast<int64_t>(v.size())}, v));
}
CaseInput scalar_f(float v) { return konst(Tensor::scalar<float>(v)); }

// The exact-type variants most movement ops get: int64, bool, float64, int8.
const std::pair<const char*, DT> kTypes[] = {
    {"int64", DT::kInt64}, {"bool", DT::kBool}, {"f64", DT::kFloat64}, {"int8", DT::kInt8}};

void reshape_cases(std::vector<OpCase>& v) {
  v.push_back(make("reshape", "Reshape", {}, {in({2, 3, 4}), ints({4, -1})}));
  v.push_back(make("reshape_copy_dim", "Reshape", {}, {in({2, 3, 4}), ints({0, 12})}));
  v.push_back(make("reshape_empty", "Reshape", {}, {in({2, 0, 3}), ints({0, -1})}, kExact));
  v.push_back(make("flatten", "Flatten", attrs({{"axis", I(2)}}), {in({2, 3, 4, 5})}));
  v.push_back(make("flatten_neg_axis", "Flatten", attrs({{"axis", I(-1)}}), {in({2, 3, 4})}));
  v.push_back(make("flatten_axis0", "Flatten", attrs({{"axis", I(0)}}), {in({3, 4})}));
  v.push_back(make("squeeze_axes", "Squeeze", {}, {in({1, 3, 1, 4}), ints({0, -2})}));
  v.push_back(make("squeeze_all", "Squeeze", {}, {in({1, 3, 1, 4})}));
  v.push_back(make("unsqueeze", "Unsqueeze", {}, {in({3, 4}), ints({0, -1})}));
  v.push_back(make("identity", "Identity", {}, {in({5, 7})}));
  v.push_back(make("dropout", "Dropout", {}, {in({4, 6})}));
  v.push_back(make("dropout_mask", "Dropout", {}, {in({4, 6})}, kFloat, 2));
  v.push_back(make("dropout_ratio", "Dropout", {},
                   {in({3, 5}), scalar_f(0.3f), konst(Tensor::scalar<bool>(false))}));
  for (const auto& [name, t] : kTypes) {
    v.push_back(make(std::string("reshape_") + name, "Reshape", {},
                     {in({2, 6}, t, -50, 50), ints({3, 4})}, kExact));
    v.push_back(
        make(std::string("identity_") + name, "Identity", {}, {in({7}, t, -50, 50)}, kExact));
  }
}

void transpose_cases(std::vector<OpCase>& v) {
  const auto perm = [](std::vector<int64_t> p) { return attrs({{"perm", Attribute::Ints(p)}}); };
  v.push_back(make("transpose_2d", "Transpose", {}, {in({37, 65})}));
  v.push_back(make("transpose_nchw_to_nhwc", "Transpose", perm({0, 2, 3, 1}), {in({2, 16, 7, 9})}));
  v.push_back(make("transpose_nhwc_to_nchw", "Transpose", perm({0, 3, 1, 2}), {in({2, 7, 9, 16})}));
  v.push_back(make("transpose_large", "Transpose", perm({0, 2, 3, 1}), {in({8, 64, 56, 56})}));
  v.push_back(make("transpose_general", "Transpose", perm({1, 3, 0, 2}), {in({2, 3, 4, 5})}));
  v.push_back(make("transpose_neg_perm", "Transpose", perm({-1, 0, 1}), {in({3, 4, 5})}));
  v.push_back(make("transpose_batched_last2", "Transpose", perm({0, 1, 2, 4, 3}),
                   {in({2, 3, 4, 33, 40})}));
  v.push_back(make("transpose_heads", "Transpose", perm({0, 2, 1, 3}), {in({2, 12, 9, 16})}));
  v.push_back(make("transpose_empty", "Transpose", {}, {in({0, 3})}, kExact));
  v.push_back(make("transpose_fp16_odd", "Transpose", perm({2, 0, 1}), {in({31, 3, 17})}));
  for (const auto& [name, t] : kTypes)
    v.push_back(make(std::string("transpose_") + name, "Transpose", perm({0, 2, 3, 1}),
                     {in({2, 5, 6, 7}, t, -100, 100)}, kExact));
}

void slice_cases(std::vector<OpCase>& v) {
  v.push_back(
      make("slice", "Slice", {}, {in({5, 6, 7}), ints({1, 0}), ints({4, -1}), ints({0, 2})}));
  v.push_back(make("slice_steps", "Slice", {},
                   {in({9, 8, 7}), ints({1, 0}), ints({9, 7}), ints({0, 2}), ints({2, 3})}));
  v.push_back(make("slice_neg_step_reverse", "Slice", {},
                   {in({4, 6}), ints({-1}), ints({-1000000}), ints({1}), ints({-1})}));
  v.push_back(make("slice_neg_step2", "Slice", {},
                   {in({5, 9}), ints({7, 4}), ints({0, 0}), ints({1, 0}), ints({-2, -3})}));
  v.push_back(make("slice_clamp", "Slice", {}, {in({4, 5}), ints({-100, 2}), ints({1000, 1000})}));
  v.push_back(
      make("slice_empty", "Slice", {}, {in({4, 5}), ints({3}), ints({2}), ints({-1})}, kExact));
  v.push_back(
      make("slice_neg_axis_last_row", "Slice", {},
           {in({3, 4, 8}), ints({-3}), ints({std::numeric_limits<int64_t>::max()}), ints({-1})}));
  v.push_back(make(
      "slice_nchw", "Slice", {},
      {in({2, 8, 6, 6}), ints({2, 1, 0}), ints({7, 5, 6}), ints({1, 2, 3}), ints({1, 1, 2})}, k4D));
  v.push_back(make("slice_channels_nhwc", "Slice", {},
                   {in({1, 16, 5, 5}), ints({4}), ints({12}), ints({1})}, k4D));
  for (const auto& [name, t] : kTypes)
    v.push_back(
        make(std::string("slice_") + name, "Slice", {},
             {in({6, 5}, t, -100, 100), ints({5, 1}), ints({0, 5}), ints({0, 1}), ints({-2, 2})},
             kExact));
}

void concat_split_cases(std::vector<OpCase>& v) {
  v.push_back(make("concat_channels", "Concat", attrs({{"axis", I(1)}}),
                   {in({2, 3, 4, 5}), in({2, 5, 4, 5}), in({2, 1, 4, 5})}, k4D));
  v.push_back(make("concat_densenet", "Concat", attrs({{"axis", I(1)}}),
                   {in({2, 64, 14, 14}), in({2, 32, 14, 14})}, k4D));
  v.push_back(make("concat_spatial", "Concat", attrs({{"axis", I(-1)}}),
                   {in({2, 3, 4, 5}), in({2, 3, 4, 2})}, k4D));
  v.push_back(make("concat_axis0", "Concat", attrs({{"axis", I(0)}}),
                   {in({2, 3}), in({4, 3}), in({1, 3})}));
  v.push_back(
      make("concat_neg_axis", "Concat", attrs({{"axis", I(-1)}}), {in({3, 7}), in({3, 1})}));
  v.push_back(make("concat_one", "Concat", attrs({{"axis", I(0)}}), {in({5})}));
  v.push_back(make("concat_empty_input", "Concat", attrs({{"axis", I(1)}}),
                   {in({2, 0, 3}), in({2, 4, 3})}, kExact));
  v.push_back(make("concat_odd_bytes", "Concat", attrs({{"axis", I(1)}}),
                   {in({3, 3, 5}), in({3, 1, 5}), in({3, 2, 5})}));
  for (const auto& [name, t] : kTypes)
    v.push_back(make(std::string("concat_") + name, "Concat", attrs({{"axis", I(1)}}),
                     {in({2, 3, 2}, t, -100, 100), in({2, 2, 2}, t, -100, 100)}, kExact));

  // Many small parts share a launch (32 a launch), in any unit from 16 bytes to 1, a large
  // part among them running as planned in its place.
  std::vector<CaseInput> rows0, rows1, bytes1;
  for (int64_t i = 0; i < 40; ++i) rows0.push_back(in({1 + i % 7, 4}));
  for (int64_t i = 0; i < 35; ++i) rows1.push_back(in({3, 1 + i % 5, 5}));
  rows1.insert(rows1.begin() + 17, in({3, 30000, 5}));
  for (int64_t i = 0; i < 34; ++i) bytes1.push_back(in({2, 1 + i % 3}, DT::kInt8, -100, 100));
  v.push_back(make("concat_40_parts", "Concat", attrs({{"axis", I(0)}}), rows0));
  v.push_back(make("concat_36_parts_one_large", "Concat", attrs({{"axis", I(1)}}), rows1));
  v.push_back(make("concat_34_parts_int8", "Concat", attrs({{"axis", I(1)}}), bytes1, kExact));
  v.push_back(make("split_33_parts", "Split", attrs({{"axis", I(1)}, {"num_outputs", I(33)}}),
                   {in({3, 99, 2})}, kFloat, 33));
  v.push_back(make("split_equal", "Split", attrs({{"axis", I(0)}}), {in({6, 4})}, kFloat, 3));
  v.push_back(make("split_sizes", "Split", attrs({{"axis", I(-1)}}),
                   {in({2, 3, 6}), ints({1, 3, 2})}, kFloat, 3));
  v.push_back(make("split_num_outputs", "Split", attrs({{"axis", I(1)}, {"num_outputs", I(3)}}),
                   {in({2, 7})}, kFloat, 3));
  v.push_back(make("split_channels", "Split", attrs({{"axis", I(1)}}),
                   {in({2, 12, 5, 5}), ints({4, 8})}, k4D, 2));
  v.push_back(make("split_zero_size", "Split", attrs({{"axis", I(0)}}), {in({4, 3}), ints({0, 4})},
                   kExact, 2));
  v.push_back(make("split_int32", "Split", attrs({{"axis", I(1)}}),
                   {in({3, 4}, DT::kInt32, -1000, 1000)}, kExact, 2));
  v.push_back(
      make("split_bool", "Split", attrs({{"axis", I(0)}}), {in({4, 3}, DT::kBool)}, kExact, 2));
}

void expand_tile_cases(std::vector<OpCase>& v) {
  v.push_back(make("expand", "Expand", {}, {in({3, 1}), ints({2, 3, 4})}));
  v.push_back(make("expand_scalar_like", "Expand", {}, {in({1}), ints({2, 3})}));
  v.push_back(make("expand_lower_rank_shape", "Expand", {}, {in({2, 1, 4}), ints({3, 1})}));
  v.push_back(make("expand_middle", "Expand", {}, {in({2, 1, 5}), ints({2, 6, 5})}));
  v.push_back(make("expand_empty", "Expand", {}, {in({2, 1}), ints({2, 0})}, kExact));
  v.push_back(make("tile", "Tile", {}, {in({2, 3}), ints({2, 3})}));
  v.push_back(make("tile_middle", "Tile", {}, {in({2, 3, 4}), ints({1, 2, 1})}));
  v.push_back(make("tile_zero", "Tile", {}, {in({2, 3}), ints({0, 2})}, kExact));
  v.push_back(make("tile_4d", "Tile", {}, {in({1, 2, 3, 2}), ints({2, 1, 2, 3})}));
  for (const auto& [name, t] : kTypes) {
    v.push_back(make(std::string("expand_") + name, "Expand", {},
                     {in({3, 1}, t, -9, 9), ints({3, 4})}, kExact));
    v.push_back(make(std::string("tile_") + name, "Tile", {}, {in({2, 2}, t, -9, 9), ints({3, 2})},
                     kExact));
  }
}

void space_cases(std::vector<OpCase>& v) {
  for (const char* mode : {"DCR", "CRD"}) {
    const std::string m = mode;
    v.push_back(make("depth_to_space_" + m, "DepthToSpace",
                     attrs({{"blocksize", I(2)}, {"mode", S(mode)}}), {in({2, 8, 3, 4})}, k4D));
    v.push_back(make("depth_to_space_b3_" + m, "DepthToSpace",
                     attrs({{"blocksize", I(3)}, {"mode", S(mode)}}), {in({1, 18, 2, 3})}, k4D));
    v.push_back(make("depth_to_space_int32_" + m, "DepthToSpace",
                     attrs({{"blocksize", I(2)}, {"mode", S(mode)}}),
                     {in({1, 12, 2, 2}, DT::kInt32, -1000, 1000)}, {"fp32", "nhwc16"}));
    v.push_back(make("space_to_depth_" + m, "SpaceToDepth",
                     attrs({{"blocksize", I(2)}, {"mode", S(mode)}}), {in({2, 3, 6, 4})}, k4D));
  }
  v.push_back(make("space_to_depth_default", "SpaceToDepth", attrs({{"blocksize", I(3)}}),
                   {in({1, 2, 6, 9})}, k4D));
  v.push_back(make("space_to_depth_f64", "SpaceToDepth", attrs({{"blocksize", I(2)}}),
                   {in({1, 2, 4, 4}, DT::kFloat64)}, kExact));
}

void trilu_cases(std::vector<OpCase>& v) {
  const auto k = [](int64_t x) { return konst(Tensor::scalar<int64_t>(x)); };
  v.push_back(make("trilu_upper", "Trilu", {}, {in({3, 4, 5})}));
  v.push_back(make("trilu_lower_k_neg", "Trilu", attrs({{"upper", I(0)}}), {in({2, 6, 4}), k(-1)}));
  v.push_back(make("trilu_upper_k2", "Trilu", {}, {in({5, 7}), k(2)}));
  v.push_back(make("trilu_huge_k", "Trilu", attrs({{"upper", I(0)}}),
                   {in({4, 4}), k(std::numeric_limits<int64_t>::min())}));
  v.push_back(make("trilu_empty", "Trilu", {}, {in({0, 3, 3})}, kExact));
  for (const auto& [name, t] : kTypes)
    v.push_back(make(std::string("trilu_") + name, "Trilu", attrs({{"upper", I(0)}}),
                     {in({3, 5}, t, -100, 100), k(1)}, kExact));
}

// ReverseSequence (gated until these pass on a GPU: KILN_UNVERIFIED_TACTICS=1): time-first and
// batch-first, lengths 0, partial and full, odd inner sizes, exact types.
void reverse_sequence_cases(std::vector<OpCase>& v) {
  const auto batch_first = attrs({{"time_axis", I(1)}, {"batch_axis", I(0)}});
  v.push_back(make("reverse_sequence_time_first", "ReverseSequence", {},
                   {in({7, 4, 5}), dev_ints({4}, {7, 0, 3, 1})}, kExact));
  v.push_back(make("reverse_sequence_batch_first", "ReverseSequence", batch_first,
                   {in({3, 9, 2, 3}), dev_ints({3}, {9, 5, 2})}));
  v.push_back(make("reverse_sequence_rank2", "ReverseSequence", batch_first,
                   {in({4, 6}), dev_ints({4}, {1, 6, 4, 0})}, kExact));
  v.push_back(make("reverse_sequence_empty_inner", "ReverseSequence", {},
                   {in({5, 2, 0}), dev_ints({2}, {5, 3})}, kExact));
  for (const auto& [name, t] : kTypes)
    v.push_back(make(std::string("reverse_sequence_") + name, "ReverseSequence", batch_first,
                     {in({2, 8, 3}, t, -100, 100), dev_ints({2}, {8, 5})}, kExact));
}

void gather_cases(std::vector<OpCase>& v) {
  // Random indices span [-dim, dim-1]: negative ones wrap.
  v.push_back(make("gather_axis0", "Gather", {}, {in({5, 4}), in({3, 2}, DT::kInt64, -5, 4)}));
  v.push_back(make("gather_axis1_int32", "Gather", attrs({{"axis", I(1)}}),
                   {in({3, 6, 4}), konst(Tensor::from<int32_t>({4}, {-1, 0, 5, 2}))}));
  v.push_back(make("gather_neg_axis", "Gather", attrs({{"axis", I(-1)}}),
                   {in({2, 3, 7}), in({2, 2}, DT::kInt64, -7, 6)}));
  v.push_back(make("gather_scalar_index", "Gather", attrs({{"axis", I(1)}}),
                   {in({4, 5, 3}), dev_ints({}, {-2})}));
  v.push_back(
      make("gather_embedding", "Gather", {}, {in({100, 64}), in({8, 16}, DT::kInt64, -100, 99)}));
  v.push_back(make("gather_empty_indices", "Gather", {}, {in({5, 4}), dev_ints({0}, {})}, kExact));
  for (const auto& [name, t] : kTypes)
    v.push_back(make(std::string("gather_") + name, "Gather", attrs({{"axis", I(1)}}),
                     {in({3, 5}, t, -100, 100), in({4}, DT::kInt32, -5, 4)}, kExact));

  v.push_back(make("gather_elements_axis0", "GatherElements", {},
                   {in({3, 4}), in({3, 4}, DT::kInt64, -3, 2)}));
  v.push_back(make("gather_elements_axis1_smaller", "GatherElements", attrs({{"axis", I(1)}}),
                   {in({3, 4}), in({2, 3}, DT::kInt32, -4, 3)}));
  v.push_back(make("gather_elements_neg_axis", "GatherElements", attrs({{"axis", I(-1)}}),
                   {in({2, 3, 5}), in({2, 3, 7}, DT::kInt64, -5, 4)}));
  v.push_back(make("gather_elements_int64", "GatherElements", {},
                   {in({4, 3}, DT::kInt64, -1000, 1000), in({5, 3}, DT::kInt64, -4, 3)}, kExact));

  v.push_back(make("gather_elements_bool", "GatherElements", attrs({{"axis", I(1)}}),
                   {in({90, 500}, DT::kBool), in({90, 30}, DT::kInt64, 0, 499)}, kExact));

  v.push_back(make("gather_nd", "GatherND", {}, {in({3, 4, 5}), in({2, 2}, DT::kInt64, -3, 2)}));
  v.push_back(
      make("gather_nd_full", "GatherND", {}, {in({3, 4, 5}), in({6, 3}, DT::kInt64, -3, 2)}));
  v.push_back(make("gather_nd_batch", "GatherND", attrs({{"batch_dims", I(1)}}),
                   {in({2, 3, 4}), in({2, 5, 1}, DT::kInt32, -3, 2)}));
  v.push_back(make("gather_nd_batch2", "GatherND", attrs({{"batch_dims", I(2)}}),
                   {in({2, 3, 4, 6}), in({2, 3, 2, 2}, DT::kInt64, -4, 3)}));
  v.push_back(make("gather_nd_f64", "GatherND", {},
                   {in({4, 6}, DT::kFloat64), in({3, 1}, DT::kInt64, -4, 3)}, kExact));
}

void scatter_cases(std::vector<OpCase>& v) {
  // Reduction "none" needs unique indices (duplicates are unspecified on the GPU).
  v.push_back(make("scatter_nd", "ScatterND", {},
                   {in({4, 5, 3}), const_ints({3, 1}, {0, 2, -1}), in({3, 5, 3})}));
  v.push_back(make("scatter_nd_device_indices", "ScatterND", {},
                   {in({4, 5}), dev_ints({2, 2}, {1, 2, -1, 0}), in({2})}));
  for (const char* r : {"add", "mul", "max", "min"}) {
    const std::string s = r;
    const auto dup = const_ints({4, 2}, {1, 2, 1, 2, 0, -1, 1, 2});
    v.push_back(make("scatter_nd_" + s, "ScatterND", attrs({{"reduction", S(r)}}),
                     {in({3, 4}), dup, in({4})}, kExact));
    v.push_back(make("scatter_nd_int32_" + s, "ScatterND", attrs({{"reduction", S(r)}}),
                     {in({3, 4}, DT::kInt32, -9, 9), dup, in({4}, DT::kInt32, -9, 9)}, kExact));
    v.push_back(make("scatter_elements_" + s, "ScatterElements", attrs({{"reduction", S(r)}}),
                     {in({4, 5}), in({3, 5}, DT::kInt64, -4, 3), in({3, 5})}, kExact));
    v.push_back(make("scatter_elements_int8_" + s, "ScatterElements",
                     attrs({{"reduction", S(r)}, {"axis", I(1)}}),
                     {in({3, 5}, DT::kInt8, -5, 5), in({3, 4}, DT::kInt64, -5, 4),
                      in({3, 4}, DT::kInt8, -5, 5)}, kExact));
  }
  v.push_back(make("scatter_nd_add_fp16", "ScatterND", attrs({{"reduction", S("add")}}),
                   {in({3, 4}), const_ints({3, 1}, {1, 1, -1}), in({3, 4})}));
  v.push_back(make("scatter_elements", "ScatterElements", {},
                   {in({4, 5}), const_ints({2, 5}, {0, 1, 2, 3, -1, 1, 2, 3, -4, 0}), in({2, 5})}));
  v.push_back(make("scatter_elements_axis1", "ScatterElements", attrs({{"axis", I(-1)}}),
                   {in({3, 4}), const_ints({3, 1}, {3, -4, 1}), in({3, 1})}));
  v.push_back(make("scatter_elements_bool_add", "ScatterElements", attrs({{"reduction", S("add")}}),
                   {in({4, 3}, DT::kBool), in({5, 3}, DT::kInt32, -4, 3), in({5, 3}, DT::kBool)},
                   kExact));
  v.push_back(make(
      "scatter_elements_f64_mul", "ScatterElements", attrs({{"reduction", S("mul")}}),
      {in({4, 3}, DT::kFloat64), in({5, 3}, DT::kInt32, -4, 3), in({5, 3}, DT::kFloat64)}, kExact));
  v.push_back(make("scatter_nd_empty_updates", "ScatterND", {},
                   {in({4, 3}), dev_ints({0, 1}, {}), in({0, 3})}, kExact));
}

void pad_cases(std::vector<OpCase>& v) {
  v.push_back(make("pad_constant", "Pad", {},
                   {in({2, 3, 4}), ints({0, 1, 2, 1, 0, 1}), scalar_f(1.5f)}));
  v.push_back(make("pad_constant_default", "Pad", {},
                   {in({1, 3, 4, 4}), ints({0, 0, 1, 1, 0, 0, 1, 1})}, k4D));
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    const std::string m = mode;
    v.push_back(make("pad_" + m, "Pad", attrs({{"mode", S(mode)}}),
                     {in({1, 2, 5, 6}), ints({0, 0, 2, 3, 0, 0, 3, 2})}, k4D));
    v.push_back(make("pad_" + m + "_channels", "Pad", attrs({{"mode", S(mode)}}),
                     {in({1, 4, 3, 3}), ints({0, 1, 0, 0, 0, 2, 1, 0})}, k4D));
    v.push_back(make("pad_" + m + "_int64", "Pad", attrs({{"mode", S(mode)}}),
                     {in({3, 4}, DT::kInt64, -100, 100), ints({1, 2, 2, 1})}, kExact));
  }
  v.push_back(make("pad_wrap_beyond", "Pad", attrs({{"mode", S("wrap")}}),
                   {in({2, 5}), ints({0, 7, 0, 6})}));
  v.push_back(make("pad_reflect_beyond", "Pad", attrs({{"mode", S("reflect")}}),
                   {in({2, 3}), ints({0, 5, 0, 4})}));
  v.push_back(make("pad_reflect_len1", "Pad", attrs({{"mode", S("reflect")}}),
                   {in({3, 1}), ints({0, 2, 0, 1})}));
  v.push_back(make("pad_negative", "Pad", {}, {in({4, 6}), ints({-1, 2, 0, -3})}));
  v.push_back(make("pad_axes", "Pad", attrs({{"mode", S("edge")}}),
                   {in({2, 3, 4}), ints({1, 2}), absent(), ints({-1})}));
  v.push_back(
      make("pad_int32_value", "Pad", {},
           {in({2, 3}, DT::kInt32, -9, 9), ints({1, 1, 1, 1}), konst(Tensor::scalar<int32_t>(7))},
           kExact));
  v.push_back(make("pad_bool_edge", "Pad", attrs({{"mode", S("edge")}}),
                   {in({3, 3}, DT::kBool), ints({1, 0, 2, 1})}, kExact));
  v.push_back(make("pad_f64", "Pad", attrs({{"mode", S("reflect")}}),
                   {in({4, 4}, DT::kFloat64), ints({2, 1, 1, 2})}, kExact));
  v.push_back(make("pad_to_empty", "Pad", {}, {in({2, 3}), ints({0, -3, 0, 0})}, kExact));
  v.push_back(make("pad_empty_input", "Pad", {}, {in({0, 3}), ints({1, 0, 1, 0})}, kExact));
}

void resize_cases(std::vector<OpCase>& v) {
  const auto scales = [](std::vector<float> s) { return floats(std::move(s)); };
  const auto R = [&](std::string name, Attributes a, std::vector<int64_t> shape, CaseInput sc,
                     CaseInput sz, Modes modes = k4D, DT t = DT::kFloat32) {
    const double lo = t == DT::kFloat32 || t == DT::kFloat64 ? -1 : -100;
    v.push_back(make("resize_" + name, "Resize", std::move(a),
                     {in(shape, t, lo, -lo), absent(), std::move(sc), std::move(sz)},
                     std::move(modes)));
  };
  const auto none = absent;
  // nearest
  R("nearest_asym_floor", attrs({{"coordinate_transformation_mode", S("asymmetric")},
                                 {"nearest_mode", S("floor")}}),
    {1, 3, 4, 5}, scales({1, 1, 2, 2}), none());
  R("nearest_default_frac", {}, {1, 2, 4, 5}, scales({1, 1, 1.5f, 0.75f}), none());
  R("nearest_prefer_ceil_align", attrs({{"coordinate_transformation_mode", S("align_corners")},
                                        {"nearest_mode", S("round_prefer_ceil")}}),
    {1, 2, 5, 4}, none(), ints({1, 2, 8, 7}));
  R("nearest_ceil_tf_half", attrs({{"coordinate_transformation_mode", S("tf_half_pixel_for_nn")},
                                   {"nearest_mode", S("ceil")}}),
    {2, 2, 6, 6}, scales({1, 1, 0.5f, 0.7f}), none());
  R("nearest_down_half_pixel", {}, {1, 3, 9, 7}, none(), ints({1, 3, 4, 3}));
  // Scale 1 under tf_half_pixel_for_nn still shifts by half a pixel (not a plain copy).
  R("nearest_tf_half_scale1", attrs({{"coordinate_transformation_mode", S("tf_half_pixel_for_nn")},
                                     {"nearest_mode", S("round_prefer_ceil")}}),
    {1, 2, 5, 6}, scales({1, 1, 1, 2}), none());
  R("nearest_legacy_down", attrs({{"coordinate_transformation_mode", S("asymmetric")},
                                  {"kiln_nearest_legacy", I(1)}}),
    {1, 2, 8, 8}, scales({1, 1, 0.5f, 0.5f}), none());
  R("nearest_int64", attrs({{"nearest_mode", S("floor")}}), {2, 3, 4}, scales({1, 2, 1.5f}), none(),
    kExact, DT::kInt64);
  R("nearest_bool", {}, {3, 4}, scales({2, 0.5f}), none(), kExact, DT::kBool);
  R("nearest_empty_batch", {}, {0, 2, 3, 3}, scales({1, 1, 2, 2}), none(), kExact);
  // linear
  const auto linear = [](const char* coord) {
    return attrs({{"mode", S("linear")}, {"coordinate_transformation_mode", S(coord)}});
  };
  R("linear_half_pixel_up", linear("half_pixel"), {1, 3, 5, 6}, scales({1, 1, 2, 2}), none());
  R("linear_align_corners_sizes", linear("align_corners"), {1, 2, 4, 5}, none(),
    ints({1, 2, 7, 9}));
  R("linear_pytorch_half_pixel", linear("pytorch_half_pixel"), {1, 2, 6, 5}, none(),
    ints({1, 2, 1, 8}));
  R("linear_asymmetric", linear("asymmetric"), {1, 2, 4, 4}, scales({1, 1, 1.7f, 2.5f}), none());
  R("linear_half_pixel_symmetric", linear("half_pixel_symmetric"), {1, 2, 5, 5},
    scales({1, 1, 1.3f, 0.6f}), none());
  R("linear_down", linear("half_pixel"), {1, 3, 12, 10}, scales({1, 1, 0.5f, 0.4f}), none());
  {
    Attributes a = linear("half_pixel");
    a.set("antialias", I(1));
    R("linear_antialias_down", a, {1, 2, 12, 13}, scales({1, 1, 0.3f, 0.5f}), none());
  }
  R("trilinear_5d", linear("half_pixel"), {1, 2, 3, 4, 5}, scales({1, 1, 2, 1.5f, 0.5f}), none(),
    kFloat);
  R("linear_all_axes", linear("half_pixel"), {2, 3, 4, 5}, scales({1.5f, 2, 0.5f, 1.5f}), none());
  R("linear_int32", linear("half_pixel"), {1, 1, 4, 4}, scales({1, 1, 2, 2}), none(), kExact,
    DT::kInt32);
  R("linear_f64", linear("align_corners"), {2, 3, 4}, scales({1, 1.5f, 2}), none(), kExact,
    DT::kFloat64);
  {
    Attributes a = linear("tf_crop_and_resize");
    a.set("extrapolation_value", F(-2.5f));
    v.push_back(make("resize_tf_crop_and_resize", "Resize", a,
                     {in({1, 1, 5, 6}), floats({0, 0, -0.2f, 0.1f, 1, 1, 0.8f, 1.3f}), absent(),
                      ints({1, 1, 7, 6})}, k4D));
  }
  {
    Attributes a = linear("half_pixel");
    a.set("axes", Attribute::Ints({2, -1}));
    R("linear_axes", a, {2, 3, 4, 6}, scales({2, 0.5f}), none());
    a.set("keep_aspect_ratio_policy", S("not_larger"));
    R("linear_not_larger", a, {1, 2, 4, 6}, none(), ints({8, 9}));
    a.set("keep_aspect_ratio_policy", S("not_smaller"));
    R("linear_not_smaller", a, {1, 2, 4, 6}, none(), ints({8, 9}));
  }
  R("linear_nhwc_large", linear("half_pixel"), {1, 32, 40, 40}, scales({1, 1, 2, 2}), none());
  // cubic
  const auto cubic = [](const char* coord) {
    return attrs({{"mode", S("cubic")}, {"coordinate_transformation_mode", S(coord)}});
  };
  R("cubic_half_pixel", cubic("half_pixel"), {1, 2, 5, 6}, scales({1, 1, 2, 2}), none());
  R("cubic_align_corners", cubic("align_corners"), {1, 2, 5, 6}, none(), ints({1, 2, 9, 4}));
  {
    Attributes a = cubic("half_pixel");
    a.set("exclude_outside", I(1));
    a.set("cubic_coeff_a", F(-0.5f));
    R("cubic_exclude_outside", a, {1, 2, 6, 5}, scales({1, 1, 1.6f, 2}), none());
    a.set("antialias", I(1));
    R("cubic_antialias_down", a, {1, 1, 16, 12}, scales({1, 1, 0.25f, 0.5f}), none());
  }
  R("cubic_pytorch_down", cubic("pytorch_half_pixel"), {1, 2, 9, 9}, scales({1, 1, 0.6f, 0.6f}),
    none());
}

// kiln.Relayout: ops/arity/operands (k >= 0: input k, -1: the step's constant s<i>_c<j> or absent,
// k <= -2: step -2 - k), step attributes prefixed "s<i>_".
OpCase relayout(std::string name, std::vector<std::string> ops, std::vector<int64_t> arity,
                std::vector<int64_t> operands, std::vector<CaseInput> ins, Attributes a,
                Modes modes = kFloat) {
  a.set("ops", Attribute::Strings(std::move(ops)));
  a.set("arity", Attribute::Ints(std::move(arity)));
  a.set("operands", Attribute::Ints(std::move(operands)));
  OpCase c = make(std::move(name), "Relayout", std::move(a), std::move(ins), std::move(modes));
  c.domain = "kiln";
  return c;
}
Attribute T(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Attribute::TensorValue(Tensor::from<int64_t>({n}, v));
}

void relayout_cases(std::vector<OpCase>& v) {
  // Swin's cyclic shift by 2 (Slice, Slice, Concat along H, then along W) and window partition
  // (Reshape, Transpose, Reshape) of [2, 8, 8, C]: C = 16 takes the 16-byte path, C = 5 the
  // per-element one.
  for (int64_t c : {16, 5}) {
    Attributes a;
    auto slice = [&](int s, int64_t b, int64_t e, int64_t axis) {
      a.set(fmt::format("s{}_c1", s).c_str(), T({b}));
      a.set(fmt::format("s{}_c2", s).c_str(), T({e}));
      a.set(fmt::format("s{}_c3", s).c_str(), T({axis}));
    };
    slice(0, 2, 8, 1);
    slice(1, 0, 2, 1);
    a.set("s2_axis", I(1));
    slice(3, 2, 8, 2);
    slice(4, 0, 2, 2);
    a.set("s5_axis", I(2));
    a.set("s6_c1", T({2, 2, 4, 2, 4, c}));
    a.set("s7_perm", Attribute::Ints({0, 1, 3, 2, 4, 5}));
    a.set("s8_c1", T({-1, 16, c}));
    v.push_back(relayout(fmt::format("relayout_roll_windows_c{}", c),
                         {"Slice", "Slice", "Concat", "Slice", "Slice", "Concat", "Reshape",
                          "Transpose", "Reshape"},
                         {4, 4, 2, 4, 4, 2, 2, 1, 2},
                         {0, -1, -1, -1, 0, -1, -1, -1, -2, -3, -4, -1, -1, -1, -4, -1, -1, -1,
                          -5, -6, -7, -1, -8, -9, -1},
                         {in({2, 8, 8, c})}, a));
  }
  // Pad with a value, a rotating Transpose, Expand to a new leading axis and a reversing Slice:
  // odd sizes (per element), the padding answered without a read.
  {
    Attributes a;
    a.set("s0_c1", T({0, 1, 0, 0, 0, 2}));
    a.set("s0_c2", Attribute::TensorValue(Tensor::scalar<float>(0.5f)));
    a.set("s1_perm", Attribute::Ints({2, 0, 1}));
    a.set("s2_c1", T({2, 9, 3, 6}));
    a.set("s3_c1", T({-1}));
    a.set("s3_c2", T({-100}));
    a.set("s3_c3", T({3}));
    a.set("s3_c4", T({-1}));
    v.push_back(relayout("relayout_pad_expand_reverse", {"Pad", "Transpose", "Expand", "Slice"},
                         {3, 1, 2, 5}, {0, -1, -1, -2, -3, -1, -4, -1, -1, -1, -1},
                         {in({3, 5, 7})}, a));
  }
  // Two inputs concatenated between slices of 4-D tensors (NHWC storage in nhwc16), and a
  // strided slice; int64 data moves as its bits.
  {
    Attributes a;
    a.set("s0_c1", T({1}));
    a.set("s0_c2", T({5}));
    a.set("s0_c3", T({2}));
    a.set("s1_axis", I(2));
    a.set("s2_c1", T({0}));
    a.set("s2_c2", T({8}));
    a.set("s2_c3", T({1}));
    a.set("s2_c4", T({2}));
    v.push_back(relayout("relayout_concat_two_inputs", {"Slice", "Concat", "Slice"}, {4, 2, 5},
                         {0, -1, -1, -1, -2, 1, -3, -1, -1, -1, -1},
                         {in({2, 8, 5, 6}), in({2, 8, 3, 6})}, a, k4D));
  }
  {
    Attributes a;
    a.set("s0_perm", Attribute::Ints({1, 0, 2}));
    a.set("s1_c1", T({1}));
    a.set("s1_c2", T({3}));
    a.set("s1_c3", T({0}));
    v.push_back(relayout("relayout_int64", {"Transpose", "Slice"}, {1, 4}, {0, -2, -1, -1, -1},
                         {in({4, 3, 5}, DT::kInt64, -100, 100)}, a, kExact));
  }
}

}  // namespace

std::vector<OpCase> movement_cases() {

  std::vector<OpCase> v;
  reshape_cases(v);
  transpose_cases(v);
  slice_cases(v);
  concat_split_cases(v);
  expand_tile_cases(v);
  space_cases(v);
  trilu_cases(v);
  reverse_sequence_cases(v);
  gather_cases(v);
  scatter_cases(v);
  pad_cases(v);
  resize_cases(v);
  relayout_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
