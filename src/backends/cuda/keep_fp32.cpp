#include "keep_fp32.h"

#include <set>
#include <string_view>
#include <vector>

namespace kiln::gpu {
namespace {

// Ops the argument of a Sin or Cos may be computed by, walked back through.
bool on_argument_chain(const Node& n) {
  static const std::set<std::string_view> ops = {
      "Mul",   "Add",       "Sub",     "Div",      "Neg",    "Exp",       "Pow",
      "Cast",  "Unsqueeze", "Squeeze", "Reshape",  "Expand", "Transpose", "Concat",
      "Slice", "Gather",    "Flatten", "Identity", "MatMul", "Tile"};
  return n.domain.empty() && ops.count(n.op_type);
}

bool from_integer(const Node& n) {
  return n.op_type == "Cast" && n.num_inputs() > 0 && n.input(0) &&
         !dtype_is_float(n.input(0)->type.dtype);
}

// Ops a sampling grid is computed by: the argument chain's, splits and clamps, AffineGrid (a
// spatial transformer's grid from its theta), and kiln's fused elementwise chains and relayouts
// (the optimizer has run).
bool on_coordinate_chain(const Node& n) {
  if (n.domain == "kiln") return n.op_type == "ElementwiseChain" || n.op_type == "Relayout";
  static const std::set<std::string_view> more = {"Split", "Clip", "Min", "Max", "AffineGrid"};
  return on_argument_chain(n) || (n.domain.empty() && more.count(n.op_type));
}

// The residual (slot 3) of a kiln.FusedConv or FusedGemm, or null.
const Value* fused_residual(const Node& n) {
  if (n.domain != "kiln" || (n.op_type != "FusedConv" && n.op_type != "FusedGemm")) return nullptr;
  return n.num_inputs() > 3 ? n.input(3) : nullptr;
}

bool is_grid_sample(const Node& n) { return n.domain.empty() && n.op_type == "GridSample"; }

// Sampling coordinates (rule 2 of keep_fp32_nodes): each GridSample, the chain computing its grid
// (walked back through on_coordinate_chain ops and fused residual adds, stopping before any other
// op, whose output is converted where the chain reads it), and what that chain's values alone
// feed through the same ops or update as a fused residual (RAFT's last update, and its flow:
// positions less the base grid).
void keep_sampling_coordinates(const Graph& g, std::unordered_map<const Node*, std::string>* keep) {
  std::set<const Node*> chain;
  std::vector<const Node*> todo;
  for (const Node* n : g.nodes()) {
    if (!is_grid_sample(*n) || n->num_inputs() < 2 || !n->input(1)) continue;
    keep->emplace(n, "samples at float32 coordinates (FP16 rounds a pixel position by up to "
                     "1/16 of a pixel at 64..128: an iterative refinement accumulates it)");
    if (n->input(1)->producer) todo.push_back(n->input(1)->producer);
  }
  while (!todo.empty()) {
    const Node* m = todo.back();
    todo.pop_back();
    // An update fused into the layer computing it (positions + Conv(features): RAFT's flow head
    // with the Add as its residual, kiln.FusedConv/FusedGemm's R): kept, with the walk going on
    // through the residual only.
    const Value* r = fused_residual(*m);
    if ((!r && !on_coordinate_chain(*m)) || !chain.insert(m).second || from_integer(*m)) continue;
    if (r) {
      if (!r->is_constant() && r->producer) todo.push_back(r->producer);
      continue;
    }
    for (const Value* v : m->inputs())
      if (v && !v->is_constant() && v->producer) todo.push_back(v->producer);
  }
  // Forward: a chain op reading only kept values and constants stays kept, and so does an
  // update fused onto kept positions (the last one, which no GridSample reads: RAFT's output).
  for (bool grew = true; grew;) {
    grew = false;
    for (const Node* n : g.nodes()) {
      if (chain.count(n) || is_grid_sample(*n)) continue;
      if (const Value* r = fused_residual(*n); r && r->producer && chain.count(r->producer)) {
        grew = chain.insert(n).second || grew;
        continue;
      }
      if (!on_coordinate_chain(*n)) continue;
      bool any = false, all = true;
      for (const Value* v : n->inputs()) {
        if (!v || v->is_constant() || !v->producer) continue;
        any = true;
        all = all && chain.count(v->producer);
      }
      if (any && all) grew = chain.insert(n).second || grew;
    }
  }
  for (const Node* m : chain)
    keep->emplace(m, "computes sampling coordinates (FP16 would round them)");
}

}  // namespace

std::unordered_map<const Node*, std::string> keep_fp32_nodes(const Graph& g) {
  std::unordered_map<const Node*, std::string> keep;
  for (const Node* n : g.nodes()) {
    if (!n->domain.empty() || (n->op_type != "Sin" && n->op_type != "Cos")) continue;
    // The chain back to graph inputs, constants and casts from integers. One that reaches
    // another op (a Conv, a normalization) is a function of activations, not a positional
    // encoding: it stays as the tuner has it.
    std::set<const Node*> chain = {n};
    std::vector<const Node*> todo = {n};
    bool positional = true;
    while (!todo.empty() && positional) {
      const Node* m = todo.back();
      todo.pop_back();
      if (from_integer(*m)) continue;  // the chain starts here
      for (const Value* v : m->inputs()) {
        if (!v || v->is_constant()) continue;
        const Node* p = v->producer;
        if (!p || chain.count(p)) continue;
        if (!on_argument_chain(*p)) {
          positional = false;
          break;
        }
        chain.insert(p);
        todo.push_back(p);
      }
    }
    if (!positional) continue;
    for (const Node* m : chain)
      keep.emplace(m, m == n ? "a periodic function: its argument's rounding is its error"
                             : "computes the argument of " + n->label() +
                                   " (FP16 would round it: its rounding is the function's error)");
  }
  keep_sampling_coordinates(g, &keep);
  return keep;
}

}  // namespace kiln::gpu
