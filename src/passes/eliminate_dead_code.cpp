// Dead-code elimination: nodes none of whose outputs reach a graph output are removed (all
// ops are pure at inference), then values nothing refers to.
//   Op(...) -> (unused)  =>  (nothing)
#include "passes/passes.h"

namespace kiln::passes {

Expected<bool> eliminate_dead_code(PassContext& ctx) {
  Graph& g = ctx.g;
  bool changed = false;
  // Reverse order: removing a consumer can make its producers dead in the same sweep.
  for (size_t i = g.nodes().size(); i-- > 0;) {
    Node* n = g.nodes()[i];
    bool live = false;
    for (const Value* o : n->outputs()) live |= o && (!o->uses().empty() || g.is_graph_output(o));
    if (live) continue;
    KILN_RETURN_IF_ERROR(g.remove_node(n));
    ++ctx.rewrites;
    changed = true;
  }
  g.remove_dead_values();
  if (!changed) ctx.note("every node reaches a graph output");
  return changed;
}

}  // namespace kiln::passes
