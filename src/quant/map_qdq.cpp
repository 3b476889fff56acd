// Explicit quantization: ONNX QuantizeLinear / DequantizeLinear nodes (ONNX Runtime's QDQ
// format, NVIDIA ModelOpt) mapped onto kiln's INT8 representation (docs/quantization.md):
//
//   x -> Q(s) -> DQ(s) -> ...      =>  x (scale s) -> ...        activations: per tensor
//   DQ(int8 const W, s[c], axis)   =>  float const W' = W * s[c] carrying its scales
//   DQ(int32 const b, s)           =>  float const b' (a quantized bias: applied in float)
//   Q(float const) -> DQ           =>  the same, Q evaluated first
//
// What kiln's symmetric int8 cannot express (asymmetric or uint8 activations, per-channel
// activation scales, a DQ of a computed tensor without its Q, ...) stays in the graph as
// QuantizeLinear/DequantizeLinear ops computed in float, exactly as ONNX defines them; constants
// are folded whatever their quantization, keeping a scale only for symmetric int8 weights.
// Runs before the optimizer (constant folding would otherwise fold the weights' DQ away).
#include <cmath>

#include "ops/op.h"
#include "passes/rewrite.h"
#include "quant/int8_build.h"

namespace kiln::quant {
namespace {

bool is_q(const Node* n) { return n && n->domain.empty() && n->op_type == "QuantizeLinear"; }
bool is_dq(const Node* n) { return n && n->domain.empty() && n->op_type == "DequantizeLinear"; }

Status cannot_map(const Node& n, const std::string& why) {
  return KILN_ERROR("{}: Q/DQ pattern kiln cannot map: {}", n.label(), why);
}

// Runs the op's reference kernel on constant inputs (a node with a computed scale or zero point
// stays an op).
Expected<Tensor> evaluate(const Node& n) {
  std::vector<const Tensor*> ins;
  for (const Value* v : n.inputs()) {
    if (v && !v->is_constant()) return cannot_map(n, fmt::format("'{}' is not a constant", v->name));
    ins.push_back(v ? v->constant.get() : nullptr);
  }
  std::vector<Tensor> outs(n.num_outputs());
  KernelContext ctx(n, ins, outs);
  KILN_RETURN_IF_ERROR(find_op("", n.op_type)->cpu(ctx));
  return std::move(outs[0]);
}

// Scale and zero point must be constants; the zero point, when given, all zeros of type int8
// (kiln's INT8 is symmetric int8). Returns the scales as floats.
Expected<std::vector<float>> symmetric_scales(const Node& n) {
  const Value* s = n.input(1);
  const Value* zp = n.input(2);
  if (!s || !s->is_constant()) return cannot_map(n, "its scale is not a constant");
  if (zp && !zp->is_constant()) return cannot_map(n, "its zero point is not a constant");
  if (n.attrs.get_int("block_size", 0) != 0) return cannot_map(n, "blocked quantization");
  if (zp) {
    if (zp->constant->dtype() != DataType::kInt8 && zp->constant->dtype() != DataType::kInt32)
      return cannot_map(n, fmt::format("zero point of type {}: kiln maps symmetric int8 only "
                                       "(quantize with signed int8 activations and weights)",
                                       dtype_name(zp->constant->dtype())));
    for (int64_t i = 0; i < zp->constant->numel(); ++i)
      if (zp->constant->at_int(i) != 0)
        return cannot_map(n, fmt::format("zero point {} (kiln maps symmetric quantization, zero "
                                         "point 0, only)",
                                         zp->constant->at_int(i)));
  }
  std::vector<float> out;
  for (int64_t i = 0; i < s->constant->numel(); ++i) {
    const auto v = static_cast<float>(s->constant->at_double(i));
    if (!std::isfinite(v) || !(v > 0))
      return cannot_map(n, fmt::format("scale {} is not positive", v));
    out.push_back(v);
  }
  if (out.empty()) return cannot_map(n, "empty scale");
  return out;
}

Value* replace_with_constant(Graph& g, Node* n, Tensor t) {
  Value* out = n->output(0);
  Value* c = g.add_constant(g.unique_name(out->name), std::move(t));
  g.replace_all_uses(out, c);
  (void)g.remove_node(n, true);
  return c;
}

// Q of a constant (weights fake-quantized in float) becomes the constant it computes.
Status fold_constant_q(Graph& g, Node* q) {
  KILN_ASSIGN_OR_RETURN(Tensor t, evaluate(*q));
  replace_with_constant(g, q, std::move(t));
  return Status::Ok();
}

// DQ of a constant becomes the float constant it computes; a symmetric int8 weight keeps its
// grid (the scales and axis), which makes its layer an INT8 candidate.
Status fold_constant_dq(Graph& g, Node* dq) {
  const DataType xt = dq->input(0)->constant->dtype();
  Expected<std::vector<float>> scales = symmetric_scales(*dq);
  KILN_ASSIGN_OR_RETURN(Tensor w, evaluate(*dq));
  const int64_t rank = w.rank();
  const bool weight = xt == DataType::kInt8 && scales.ok() && w.dtype() == DataType::kFloat32;
  int64_t axis = dq->attrs.get_int("axis", 1);
  if (axis < 0) axis += rank;
  Value* c = replace_with_constant(g, dq, std::move(w));
  if (weight) {  // keep its grid
    c->quant_scales = *scales;
    c->quant_axis = scales->size() > 1 ? axis : -1;
  }
  return Status::Ok();
}

// x -> Q -> DQ... : every consumer of Q must be a DQ with the same scale. Checks only: an error
// is why the pair stays as ops; `s` gets the scale, `dqs` the DQs.
Status check_activation_pair(const Graph& g, const Node* q, std::vector<float>& s,
                             std::vector<Node*>& dqs) {
  const Value* x = q->input(0);
  const Value* y = q->output(0);
  if (!y || y->type.dtype != DataType::kInt8)
    return cannot_map(*q, fmt::format("quantizes to {} (kiln maps int8 only: use signed int8 "
                                      "activations)",
                                      y ? dtype_name(y->type.dtype) : "nothing"));
  KILN_ASSIGN_OR_RETURN(s, symmetric_scales(*q));
  if (s.size() != 1) return cannot_map(*q, "per-channel activation scales (kiln maps per-tensor)");
  if (g.is_graph_output(y)) return cannot_map(*q, "its int8 output is a graph output");
  for (const auto& [user, slot] : y->uses()) {
    if (!is_dq(user) || slot != 0)
      return cannot_map(*q, fmt::format("its output feeds {}, not a "
                                        "DequantizeLinear",
                                        user->label()));
    KILN_ASSIGN_OR_RETURN(std::vector<float> ds, symmetric_scales(*user));
    if (ds != s) return cannot_map(*user, "its scale differs from its QuantizeLinear's");
    dqs.push_back(user);
  }
  if (!x->quant_scales.empty() && x->quant_scales != s)
    return cannot_map(*q, fmt::format("tensor '{}' is quantized with two scales", x->name));
  return Status::Ok();
}

// The checked pair becomes x carrying the scale; an error here is the build's.
Status map_activation_pair(Graph& g, Node* q, const std::vector<float>& s,
                           const std::vector<Node*>& dqs) {
  Value* x = q->input(0);
  x->quant_scales = s;
  KILN_RETURN_IF_ERROR(g.remove_node(q, true));
  for (Node* dq : dqs) {
    Value* out = dq->output(0);
    out->quant_scales = s;
    KILN_ASSIGN_OR_RETURN(bool done, passes::bypass_node(g, dq, out, x));
    if (!done) return cannot_map(*dq, "its output is a graph output that cannot be renamed");
  }
  return Status::Ok();
}

}  // namespace

Expected<QdqMapping> map_qdq(Graph& g) {
  QdqMapping r;
  for (const Node* n : g.nodes()) r.any |= is_q(n) || is_dq(n);
  if (!r.any) return r;
  auto keep = [&](const Status& st) {
    if (r.why.empty()) r.why = st.message();
  };
  const std::vector<Node*> nodes = g.nodes();
  for (Node* n : nodes)
    if (is_q(n) && n->input(0) && n->input(0)->is_constant())
      if (Status st = fold_constant_q(g, n); !st.ok()) keep(st);
  for (Node* n : std::vector<Node*>(g.nodes()))
    if (is_dq(n) && n->input(0) && n->input(0)->is_constant())
      if (Status st = fold_constant_dq(g, n); !st.ok()) keep(st);
  // The Q nodes first: mapping one removes it and its DQs, which a snapshot of every node would
  // then visit after they are freed (AddressSanitizer: heap-use-after-free). A pair that fails
  // the checks is left as it is.
  std::vector<Node*> qs;
  for (Node* n : g.nodes())
    if (is_q(n) && !(n->input(0) && n->input(0)->is_constant())) qs.push_back(n);
  for (Node* q : qs) {
    std::vector<float> s;
    std::vector<Node*> dqs;
    if (Status st = check_activation_pair(g, q, s, dqs); !st.ok())
      keep(st);
    else
      KILN_RETURN_IF_ERROR(map_activation_pair(g, q, s, dqs));
  }
  for (const Node* n : g.nodes())
    if (is_q(n) || is_dq(n)) {
      ++r.kept;
      const Value* x = n->input(0);
      if (is_dq(n) && x && !is_q(x->producer))
        keep(cannot_map(*n, fmt::format("input '{}' comes from {}, not a QuantizeLinear", x->name,
                                        x->producer ? x->producer->label() : "the graph")));
    }
  g.remove_dead_values();
  g.renumber();
  return r;
}

}  // namespace kiln::quant
