// An If whose condition is a constant (often only once the profile's shapes fold the Shape ->
// ReduceProd -> Equal that computes it) becomes the nodes of the branch it takes, on the values
// the branch captured; the other branch is dropped.
//   If(true, captures...){then_branch, else_branch}  =>  then_branch's nodes
#include <unordered_map>

#include "ops/control_flow.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FoldIf {
  struct Match {
    Node* node;
    Graph* branch;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "If")) return std::nullopt;
    const std::optional<double> cond = scalar_const(n.input(0));
    if (!cond) {
      ctx.note(fmt::format("{}: the condition is computed at run time", n.label()));
      return std::nullopt;
    }
    Graph* branch = n.attrs.get_graph(*cond != 0.0 ? "then_branch" : "else_branch");
    if (!branch || branch->inputs().size() != static_cast<size_t>(capture_count(n)) ||
        branch->outputs().size() != n.num_outputs())
      return std::nullopt;  // malformed: inference reports it
    return Match{&n, branch};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node* n = m.node;
    const Graph& b = *m.branch;
    std::unordered_map<const Value*, Value*> map;
    for (size_t i = 0; i < b.inputs().size(); ++i) map[b.inputs()[i]] = n->input(1 + i);
    const std::string prefix = n->name + "/";
    for (const Value* v : b.values())
      if (v->is_constant()) {
        Value* c = g.add_value(g.unique_name(prefix + v->name), v->type);
        c->constant = v->constant;
        map[v] = c;
      }
    for (const Node* s : b.nodes()) {
      std::vector<Value*> ins;
      for (const Value* v : s->inputs()) ins.push_back(v ? map.at(v) : nullptr);
      std::vector<std::string> outs;
      for (const Value* o : s->outputs()) outs.push_back(o ? g.unique_name(prefix + o->name) : "");
      Node* c = g.insert_node_before(n, s->op_type, g.unique_name(prefix + s->name), ins, outs,
                                     s->domain);
      c->attrs = s->attrs;
      c->onnx_nodes = s->onnx_nodes;
      c->origin = ctx.pass;
      for (size_t k = 0; k < s->num_outputs(); ++k) {
        Value* o = c->output(k);
        if (!o) continue;  // an absent output slot stays absent
        o->type = s->output(k)->type;
        map[s->output(k)] = o;
      }
    }
    // Graph outputs keep their names: an Identity from the branch's result writes each one.
    std::vector<std::pair<Value*, Value*>> kept;  // (graph output, its source)
    for (size_t i = 0; i < n->num_outputs(); ++i) {
      Value* o = n->output(i);
      if (!o) continue;
      Value* src = map.at(b.outputs()[i]);
      if (g.is_graph_output(o))
        kept.emplace_back(o, src);
      else
        g.replace_all_uses(o, src);
    }
    const std::string name = n->name;
    KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
    for (auto [o, src] : kept) {
      Node* id = g.add_node("Identity", g.unique_name(name + "/" + o->name), {src}, {});
      g.set_node_output(id, 0, o);
      id->origin = ctx.pass;
    }
    ++ctx.rewrites;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fold_if(PassContext& ctx) { return apply_pattern<FoldIf>(ctx); }

}  // namespace kiln::passes
