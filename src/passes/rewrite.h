// The pattern-rewrite toolkit shared by the optimizer's passes.
//
// A pass is a small struct with
//   static std::optional<Match> match(PassContext&, Node&);   // pure: reads the graph only
//   static Status rewrite(PassContext&, const Match&);         // edits through Graph's API
// driven by apply_pattern<P>(). match() may record why a candidate was rejected with
// ctx.note(); in verbose mode a pass that did not fire prints those reasons.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"
#include "passes/pipeline.h"

namespace kiln::passes {

struct PassContext {
  Graph& g;
  const OptimizeOptions& opts;
  std::string pass;             // name of the running pass (becomes Node::origin)
  std::set<std::string> notes;  // why candidates were not rewritten
  int rewrites = 0;

  void note(std::string why) {
    if (opts.verbose) notes.insert(std::move(why));
  }
  // Asks the target backend whether it can run this layer as one kernel at the build precision.
  // `node`: the layer as it would be made (scratch_layer), for backends that need more than
  // its attributes.
  bool backend_supports(const std::string& domain, const std::string& op_type,
                        const Attributes& attrs, DataType dtype, const Node* node = nullptr);
};

// Runs P over the graph until it no longer matches; returns whether anything changed.
template <typename P>
Expected<bool> apply_pattern(PassContext& ctx) {
  constexpr int kMaxRewrites = 1000000;
  bool changed = false;
  size_t i = 0;
  while (i < ctx.g.nodes().size()) {
    Node* n = ctx.g.nodes()[i];
    std::optional<typename P::Match> m = P::match(ctx, *n);
    if (!m) {
      ++i;
      continue;
    }
    KILN_RETURN_IF_ERROR(P::rewrite(ctx, *m));
    changed = true;
    if (++ctx.rewrites > kMaxRewrites)
      return KILN_ERROR("{}: did not converge after {} rewrites", ctx.pass, kMaxRewrites);
    i = 0;  // the node list changed: scan again (rejected candidates stay rejected)
  }
  return changed;
}

// --- queries --------------------------------------------------------------------------------
bool is_op(const Node* n, const char* op_type);  // ai.onnx op of this type
bool is_kiln_op(const Node* n, const char* op_type);
// The node producing v when it is an ai.onnx op of `op_type`, else nullptr.
Node* producer_if(const Value* v, const char* op_type);
// Exactly one consumer and not a graph output: the value may disappear inside a fused layer.
bool single_use(const Graph& g, const Value* v);
// The only consumer of v (nullptr unless single_use).
Node* sole_consumer(const Graph& g, const Value* v);
// A tensor's elements as doubles (weights rewritten by folding passes).
std::vector<double> tensor_values(const Tensor& t);
// Constant scalar (any numel-1 tensor) value as double.
std::optional<double> scalar_const(const Value* v);
bool is_scalar_const(const Value* v, double expected, double rel_tol = 1e-4);
// float32, float64, float16 or bfloat16 (a graph exported with model.half() fuses as a float32 one;
// each fusion still asks the backend for the layer at that type).
bool is_float_type(DataType t);
// Same rank and dims (static values or equal, non-empty symbols; ops/shape_values.h same_dim).
bool same_dims(const TensorType& a, const TensorType& b);
// A Transpose's permutation (the reversal when the attribute is absent and the rank is known).
std::vector<int64_t> transpose_perm(const Node& n);
// When `r` is a Reshape that splits its input's last axis in two and keeps every other dim,
// provably for every shape ([..., H*D] -> [..., H, D]): (H, D).
std::optional<std::pair<int64_t, int64_t>> splits_last_axis(const Node* r);
// True when `other` provably broadcasts into `target` without changing target's shape: its
// rank is not larger and each of its dims (aligned right) is 1, or equals target's dim (same
// static value or same symbol). Unknown dims prove nothing.
bool broadcasts_into(const TensorType& other, const TensorType& target);
// True when `mask` broadcasts into the scores [B, 1, Sq, Sk] of kiln.MultiHeadAttention `mha`
// (B and Sq Q's, Sk K's, or Q's when packed; swapped with seq_first) without widening them
// (broadcasts_into).
bool mask_fits_scores(const Node& mha, const TensorType& mask);

// Every value the group makes, other than `out`, is read only inside the group and is not a
// graph output (so the group can become one layer).
bool group_is_closed(const Graph& g, const std::vector<Node*>& group, const Value* out);
// For a binary node: its input other than `v` (nullptr when v is not an input or both are v).
Value* other_input(const Node* n, const Value* v);
// If n is `op_type` with one operand the scalar constant `c` (rel. tolerance 1e-4), the other
// operand; `c_first` restricts the constant to operand 0 (true) or 1 (false) when set.
Value* operand_besides_const(const Node* n, const char* op_type, double c,
                             std::optional<bool> c_first = std::nullopt);

// The column range [start, start + width) of x that `v` is: an output of a Split of x's last
// axis with static widths (pack_gemm's packed projections), or a step-1 Slice of x's last axis
// with constant bounds (torch.chunk as the TorchScript exporter writes it). `node` is the Split
// or Slice. Readers that take column ranges read such a part in place.
struct ColumnPart {
  Node* node;
  Value* x;
  int64_t start, width;
};
std::optional<ColumnPart> column_part(const Value* v);

// A Slice of one axis with constant inputs: its axis (normalised for `rank`; axis 0 where axes is
// absent), and its start, end and step as written (step 1 where absent). nullopt otherwise.
struct AxisSlice {
  int64_t axis, start, end, step;
};
std::optional<AxisSlice> axis_slice(const Node* s, int64_t rank);
// ReduceMean's axes as positive numbers, when it keeps dims and reduces exactly the trailing
// axes of a rank-`rank` input (axes from the attribute or a constant input).
std::optional<std::vector<int64_t>> trailing_axes(const Node* rm, int64_t rank);
// A constant equal in shape to the normalized dims `norm` (leading 1s allowed), as a tensor of
// exactly that shape (LayerNorm/RMSNorm scale and bias).
std::optional<Tensor> affine_param(const Value* v, const std::vector<int64_t>& norm);
// When the sole consumer of *out is `op_type` (Mul: scale, Add: bias) with an affine_param as its
// other operand: appends that node to `group`, moves *out to its output, returns the parameter.
std::optional<Tensor> absorb_affine(const Graph& g, const char* op_type,
                                    const std::vector<int64_t>& norm, std::vector<Node*>& group,
                                    Value*& out);
// A tensor of ones of shape `norm` and type `t` (the scale of a norm without one).
Tensor ones(const std::vector<int64_t>& norm, DataType t);

// A would-be layer in a graph of its own: its inputs' types, constants and INT8 scales, its
// output's type and scales.
// For capability queries that need more than attributes; the real graph is not touched.
std::unique_ptr<Graph> scratch_layer(const std::string& domain, const std::string& op_type,
                                     const std::vector<Value*>& inputs, const Attributes& attrs,
                                     const Value* out);

// --- edits ------------------------------------------------------------------------------------
// Replaces `group` (its nodes' outputs other than `out` must be used only inside the group) by
// one new node computing `out`, placed where the group's last node was. Sets origin = pass name
// and onnx_nodes = the union of the group's. Returns the new node (named after group[0]).
Expected<Node*> replace_with_layer(PassContext& ctx, const std::vector<Node*>& group,
                                   const std::string& domain, const std::string& op_type,
                                   const std::vector<Value*>& inputs, Attributes attrs, Value* out);
// An op rewritten as a chain of other ops (its canonical form), built before it: each node named
// after the op ("NAME/what"), made by the running pass and covering the op's ONNX nodes.
class Replacement {
 public:
  Replacement(PassContext& ctx, Node& op) : ctx_(ctx), op_(op) {}
  // A node before the op with `outputs` fresh outputs (0 for the last one: finish gives it the
  // op's output).
  Node* add(const std::string& op_type, const std::vector<Value*>& inputs, const std::string& what,
            size_t outputs = 1);
  Value* add_value(const std::string& op_type, const std::vector<Value*>& inputs,
                   const std::string& what) {
    return add(op_type, inputs, what)->output(0);
  }
  Value* constant(const std::string& what, Tensor t);
  // Removes the op and makes `last` produce its output value (in place of an output `last` was
  // added with), whose name and place among the graph outputs stay.
  Status finish(Node* last);

 private:
  PassContext& ctx_;
  Node& op_;
};

// Removes single-output-in-use node n whose output `out` equals its input `in`, keeping a
// graph output's name. False (graph unchanged) when `out` is a graph output that `in` cannot
// stand for (a graph input, constant or another graph output).
Expected<bool> bypass_node(Graph& g, Node* n, Value* out, Value* in);
// The attributes a fused layer carries for activation node `act` (ops/fused.h): activation =
// its op type, Clip's constant scalar bounds as act_min / act_max, any other op's attributes
// prefixed act_. False (with `why`) for a Clip whose bounds are not constant scalars or another
// op with inputs besides its operand.
bool activation_attrs(const Node& act, Attributes& to, std::string* why);
// Copies every attribute of `from` into `to` with `prefix` prepended to its name.
void copy_attrs_prefixed(const Attributes& from, Attributes& to, const std::string& prefix);
// Appends the onnx_nodes of `from` to `to` (no duplicates).
void merge_onnx_nodes(Node& to, const Node& from);

}  // namespace kiln::passes
