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
  return keep;
}

}  // namespace kiln::gpu
