// Symbolic values of shape tensors (ONNX's "data propagation"). Exporters compute Reshape,
// Expand and Range arguments from Shape(x) at run time: Shape -> Gather/Slice -> Concat ->
// Reshape. With dynamic dims those tensors are not constants, yet their elements are known
// symbolically: Shape(x) of x: float32[N,S,768] is [N, S, 768]. infer_shapes records such
// elements on Value::shape_value as it walks the graph, so shape inference gives Reshape's
// output [N, S, 12, 64] rather than [?, ?, ?, ?], and the optimizer's patterns can prove what a
// Reshape or Expand does (a head split, a broadcast) for every shape of a dynamic profile.
//
// Only small integer tensors (at most kMaxShapeValueElements elements, rank 0 or 1) carry
// values. A product of dims that is not static becomes a compound symbol "2*N*S" (factors
// sorted), the form dynamo exporters also write into value_info; sums and differences become
// polynomials ("past+seq", terms in canonical order), and a declared "past + seq" reads as one.
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"

namespace kiln {

inline constexpr int64_t kMaxShapeValueElements = 64;

// The elements of v when known: a small constant integer tensor's values, or v->shape_value.
std::optional<std::vector<SymInt>> known_shape_value(const Value* v);

// Sets the shape_value of n's outputs from its inputs (nullopt where nothing is known). Ops:
// Shape, Size, Gather, Slice, Concat, Squeeze, Unsqueeze, Reshape, Flatten, Identity, Cast,
// Add, Sub, Mul, Div, Max, Min, Equal, Where, ConstantOfShape.
void propagate_shape_value(Node& n);

// a * b as a Dim: static when both are, else a compound symbol; unknown when either is.
Dim mul_dims(const Dim& a, const Dim& b);
// a / b when it is known exactly (static division without remainder, or b's factors cancel
// from a's), else unknown.
Dim div_dims(const Dim& a, const Dim& b);
// a + b and a - b as Dims: static when both are, else a polynomial symbol ("past+seq"; terms in
// canonical order, so equal sums compare equal); unknown when either is, or for a negative
// constant.
Dim add_dims(const Dim& a, const Dim& b);
Dim sub_dims(const Dim& a, const Dim& b);
// Whether a dim is a sum of sizes (static, or a polynomial without a subtracted term): never
// negative whatever its symbols are.
bool nonnegative_dim(const Dim& d);
// Whether two dims are provably the same size (equal static values, or equal symbols after
// normalising compound symbols).
bool same_dim(const Dim& a, const Dim& b);

}  // namespace kiln
