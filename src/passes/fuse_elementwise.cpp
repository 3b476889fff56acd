// A straight chain of elementwise ops becomes one layer:
//   e1(x, ...) -> e2(., ...) -> ... -> en(., ...)  =>  kiln.ElementwiseChain(x, ...)
// Each link's value must have no other consumer and not be a graph output, every step must
// keep the chain's shape (an operand that broadcasts the chain to a bigger shape ends it) and
// element type. Needs two or more steps.
#include <map>

#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool is_chain_op(const Node* n) {
  if (!n || !n->domain.empty() || !chain_op_supported(n->op_type) || n->num_outputs() != 1 ||
      !n->output(0))
    return false;
  if ((n->op_type == "Max" || n->op_type == "Min") && n->num_inputs() != 2) return false;
  return is_float_type(n->output(0)->type.dtype) && n->output(0)->type.has_rank();
}

struct FuseElementwise {
  struct Match {
    std::vector<Node*> chain;
  };

  // Can `next` extend a chain whose current value is `cur`?
  static bool extends(PassContext& ctx, const Value* cur, Node* next) {
    if (!is_chain_op(next)) return false;
    int uses_of_cur = 0;
    for (const Value* v : next->inputs()) uses_of_cur += v == cur;
    if (uses_of_cur != 1) return false;  // e.g. Mul(t, t): keep it simple and exact
    if (next->output(0)->type.dtype != cur->type.dtype) return false;
    for (const Value* v : next->inputs()) {
      if (!v || v == cur) continue;
      if (!broadcasts_into(v->type, cur->type)) {
        ctx.note(
            fmt::format("{}: operand '{}' {} may broadcast the chain's {} to a bigger shape; "
                        "the chain ends before it",
                        next->label(), v->name, v->type.str(), cur->type.str()));
        return false;
      }
    }
    return true;
  }

  static std::optional<Match> match(PassContext& ctx, Node& first) {
    if (!is_chain_op(&first)) return std::nullopt;
    std::vector<Node*> chain = {&first};
    for (;;) {
      const Value* cur = chain.back()->output(0);
      Node* next = sole_consumer(ctx.g, cur);
      if (!next || !extends(ctx, cur, next)) break;
      chain.push_back(next);
    }
    if (chain.size() < 2) return std::nullopt;
    return Match{chain};
  }

  static Attributes program(const std::vector<Node*>& chain, std::vector<Value*>& inputs) {
    std::vector<std::string> ops;
    std::vector<int64_t> arity, operands;
    std::map<const Value*, int64_t> index;
    Attributes a;
    for (size_t s = 0; s < chain.size(); ++s) {
      const Node* n = chain[s];
      ops.push_back(n->op_type);
      arity.push_back(static_cast<int64_t>(n->num_inputs()));
      for (Value* v : n->inputs()) {
        if (!v) {
          operands.push_back(-2);
          continue;
        }
        if (s > 0 && v == chain[s - 1]->output(0)) {
          operands.push_back(-1);
          continue;
        }
        auto [it, fresh] = index.emplace(v, static_cast<int64_t>(inputs.size()));
        if (fresh) inputs.push_back(v);
        operands.push_back(it->second);
      }
      copy_attrs_prefixed(n->attrs, a, fmt::format("s{}_", s));
    }
    a.set("ops", Attribute::Strings(ops));
    a.set("arity", Attribute::Ints(arity));
    a.set("operands", Attribute::Ints(operands));
    return a;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> inputs;
    Attributes a = program(m.chain, inputs);
    return replace_with_layer(ctx, m.chain, "kiln", "ElementwiseChain", inputs, std::move(a),
                              m.chain.back()->output(0))
        .status();
  }
};

// The capability query needs the program, so it runs on the matched chain.
struct FuseElementwiseSupported : FuseElementwise {
  static std::optional<Match> match(PassContext& ctx, Node& first) {
    auto m = FuseElementwise::match(ctx, first);
    if (!m) return m;
    std::vector<Value*> inputs;
    Attributes a = program(m->chain, inputs);
    if (!ctx.backend_supports("kiln", "ElementwiseChain", a, first.output(0)->type.dtype))
      return std::nullopt;
    return m;
  }
};

}  // namespace

Expected<bool> fuse_elementwise(PassContext& ctx) {
  return apply_pattern<FuseElementwiseSupported>(ctx);
}

}  // namespace kiln::passes
