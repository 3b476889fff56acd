// Shared helpers of the shape and index op families (src/ops/shape*.cpp, src/ops/index*.cpp):
// the sub-tables each file contributes, dtype-agnostic strided copies and small dim helpers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "ops/op.h"

namespace kiln::shape_detail {

// Sub-tables, concatenated by shape_ops() / index_ops().
std::span<const OpDef> reshape_like_ops();  // shape_reshape.cpp: Reshape, Shape, Size, Flatten,
                                            // Squeeze, Unsqueeze, Transpose, Identity, Dropout
std::span<const OpDef> concat_like_ops();   // shape_concat.cpp: Concat, Split, Expand, Tile
std::span<const OpDef> slice_ops();         // shape_slice.cpp: Slice
std::span<const OpDef> constant_ops();      // shape_constant.cpp: Constant, ConstantOfShape, Range
std::span<const OpDef> gather_ops();        // index_gather.cpp: Gather, GatherElements, GatherND
std::span<const OpDef> sort_ops();          // index_sort.cpp: TopK, ArgMax, ArgMin
std::span<const OpDef> scan_ops();          // index_scan.cpp: Trilu, CumSum, ReverseSequence

// A Pad's `pads` (2 * len(axes) values, begins then ends; `axes_t` its axes input, or nullptr for
// every axis) as 2 * rank values, begins then ends (src/ops/pad.cpp); an error names node `n`.
Expected<std::vector<int64_t>> full_pads(const Node& n, int64_t rank, const std::vector<int64_t>& pads,
                                         const Tensor* axes_t);

// Copies a strided view of `src` into the contiguous `dst`: element o (multi-index o_k over
// `out_shape`) reads src element `offset + sum_k o_k * strides[k]` (strides in elements, may
// be 0 or negative). Works on raw bytes of `esize` bytes per element.
void strided_copy(const void* src, int64_t offset, const std::vector<int64_t>& strides,
                  void* dst, const std::vector<int64_t>& out_shape, size_t esize);

// Product of dims, or nullopt when one is unknown. A known 0 makes the product 0.
std::optional<int64_t> static_product(std::span<const Dim> dims);
// Product of dims as a Dim: static when all are known (or one is 0); with symbols, their
// product as a compound symbol ("2*N*S", ops/shape_values.h); unknown when a dim is unknown.
Dim dim_product(std::span<const Dim> dims);
// Product of a concrete shape.
int64_t product(std::span<const int64_t> dims);

// The int64 values of an integer-typed (or any numeric) tensor, error naming the node when the
// tensor has the wrong dtype.
Expected<std::vector<int64_t>> int_values(const Tensor& t, const Node& n, const char* what);

// Shape of a tensor as dims.
// `rank` dims of unknown size, for an output whose rank comes from another input's declared
// length (a shape or axes input read only as a type); a malformed model may declare any length,
// so a rank below 0 or above 1024 is an error naming the node, not an allocation.
inline Expected<std::vector<Dim>> unknown_dims(int64_t rank, const Node& n, const char* what) {
  if (rank < 0 || rank > 1024)
    return KILN_ERROR("{}: {} makes the output rank {} (0 to 1024)", n.label(), what, rank);
  return std::vector<Dim>(static_cast<size_t>(rank));
}

inline std::vector<Dim> to_dims(const std::vector<int64_t>& s) {
  return std::vector<Dim>(s.begin(), s.end());
}

// Merges two dims describing the same size: known wins, then a symbol.
inline Dim merge_dim(const Dim& a, const Dim& b) {
  if (a.is_static()) return a;
  if (b.is_static()) return b;
  if (!a.symbol.empty()) return a;
  return b;
}

}  // namespace kiln::shape_detail
