// A straight chain of elementwise ops becomes one layer (and a Concat in front of it joins it:
// AbsorbConcat below):
//   e1(x, ...) -> e2(., ...) -> ... -> en(., ...)  =>  kiln.ElementwiseChain(x, ...)
// Each link's value must have no other consumer and not be a graph output, every step must
// keep the chain's shape (an operand that broadcasts the chain to a bigger shape ends it) and
// element type. Needs two or more steps, or one that reads a part of a last-axis Split or Slice
// (which the chain then reads in place: AbsorbSplit below).
#include <algorithm>
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
    if (chain.size() < 2) {
      bool reads_part = false;
      for (const Value* v : first.inputs()) {
        const auto part = v ? column_part(v) : std::nullopt;
        reads_part |= part && part->x->type.dtype == first.output(0)->type.dtype;
      }
      if (!reads_part) return std::nullopt;
    }
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

// A Concat whose only reader is an elementwise chain joins the chain as its concatenated operand:
//   Concat(p0, ..., pm-1) -> kiln.ElementwiseChain(cat, x, ...)
//     =>  kiln.ElementwiseChain(p0, ..., pm-1, x, ...; concat_parts=m, concat_axis)
// The chain reads each part in place, so the concatenation is never written: DenseNet's
// Concat -> BatchNorm -> ReLU in every dense layer (whose parts grow with the block: the copies
// were quadratic in its depth). 2 to kMaxChainConcatParts parts of the chain's type.
struct AbsorbConcat {
  struct Match {
    Node* concat;
    Node* chain;
    size_t slot;  // the chain input the Concat makes
  };

  static std::optional<Match> match(PassContext& ctx, Node& chain) {
    if (!is_kiln_op(&chain, "ElementwiseChain") || chain.attrs.get_int("concat_parts", 0) != 0 ||
        chain.attrs.has("col_slices") || !chain.output(0))
      return std::nullopt;
    for (size_t j = 0; j < chain.num_inputs(); ++j) {
      Node* cat = producer_if(chain.input(j), "Concat");
      if (!cat) continue;
      auto reject = [&](const std::string& why) {
        ctx.note(fmt::format("{} -> {}: {}", cat->label(), chain.label(), why));
        return std::nullopt;
      };
      if (!single_use(ctx.g, chain.input(j)))
        return reject("the concatenation has another reader or is a graph output");
      const int64_t m = static_cast<int64_t>(cat->num_inputs());
      if (m < 2 || m > kMaxChainConcatParts)
        return reject(fmt::format("{} parts (2 to {} join a chain)", m, kMaxChainConcatParts));
      for (const Value* v : cat->inputs())
        if (!v || v->type.dtype != chain.output(0)->type.dtype || !v->type.has_rank())
          return reject("a part is absent, of unknown rank or of another type than the chain");
      Match mt{cat, &chain, j};
      std::vector<Value*> ins;
      const Attributes a = attrs_after(mt, &ins);
      auto scratch = scratch_layer("kiln", "ElementwiseChain", ins, a, chain.output(0));
      if (!ctx.backend_supports("kiln", "ElementwiseChain", a, chain.output(0)->type.dtype,
                                scratch->nodes().back()))
        return reject("the backend cannot run the chain with its concatenation");
      return mt;
    }
    return std::nullopt;
  }

  // The absorbing chain's attributes and inputs: the parts first, then the chain's other inputs
  // in order; operand j (the concatenation) becomes 0, the others move past the parts.
  static Attributes attrs_after(const Match& m, std::vector<Value*>* ins) {
    const int64_t parts = static_cast<int64_t>(m.concat->num_inputs());
    ins->assign(m.concat->inputs().begin(), m.concat->inputs().end());
    for (size_t i = 0; i < m.chain->num_inputs(); ++i)
      if (i != m.slot) ins->push_back(m.chain->input(i));
    Attributes a = m.chain->attrs;
    std::vector<int64_t> operands = a.get_ints("operands");
    const int64_t j = static_cast<int64_t>(m.slot);
    for (int64_t& o : operands) {
      if (o < 0) continue;
      o = o == j ? 0 : parts + (o < j ? o : o - 1);
    }
    a.set("operands", Attribute::Ints(std::move(operands)));
    a.set("concat_parts", Attribute::Int(parts));
    a.set("concat_axis", Attribute::Int(m.concat->attrs.get_int("axis", 0)));
    return a;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins;
    Attributes a = attrs_after(m, &ins);
    return replace_with_layer(ctx, {m.concat, m.chain}, "kiln", "ElementwiseChain", ins,
                              std::move(a), m.chain->output(0))
        .status();
  }
};

// A chain input that is a part of a Split of some x's last axis is read as that column range of
// x in place (col_slices), so the Split's copy is not made for it:
//   (p0, .., pm-1) = Split(x, last axis) -> kiln.ElementwiseChain(.., pj, ..)
//     =>  kiln.ElementwiseChain(.., x, ..; col_slices: x's columns of pj)
// Llama's silu(gate) * up on pack_gemm's packed gate and up projections; a step-1 Slice of the
// last axis likewise (diffusers' GEGLU: hidden * gelu(gate) on the two chunks of one
// projection). The Split or Slice stays for its other readers (it goes when none is left). Not
// for a concatenation's parts.
struct AbsorbSplit {
  struct Match {
    Node* chain;
    std::vector<Value*> inputs;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& chain) {
    if (!is_kiln_op(&chain, "ElementwiseChain") || !chain.output(0)) return std::nullopt;
    const int64_t parts = chain.attrs.get_int("concat_parts", 0);
    std::vector<int64_t> slices = chain.attrs.get_ints("col_slices");
    if (slices.empty()) slices.assign(2 * chain.num_inputs(), 0);
    if (slices.size() != 2 * chain.num_inputs()) return std::nullopt;
    std::vector<Value*> ins(chain.inputs().begin(), chain.inputs().end());
    bool any = false;
    for (size_t j = static_cast<size_t>(parts); j < ins.size(); ++j) {
      if (!ins[j] || slices[2 * j + 1] != 0) continue;
      const auto part = column_part(ins[j]);
      if (!part) continue;
      if (part->x->type.dtype != ins[j]->type.dtype) continue;
      slices[2 * j] = part->start;
      slices[2 * j + 1] = part->width;
      ins[j] = part->x;
      any = true;
    }
    if (!any) return std::nullopt;
    Attributes a = chain.attrs;
    a.set("col_slices", Attribute::Ints(slices));
    auto scratch = scratch_layer("kiln", "ElementwiseChain", ins, a, chain.output(0));
    if (!ctx.backend_supports("kiln", "ElementwiseChain", a, chain.output(0)->type.dtype,
                              scratch->nodes().back())) {
      ctx.note(fmt::format("{}: the backend cannot read the chain's column slices in place",
                           chain.label()));
      return std::nullopt;
    }
    return Match{&chain, std::move(ins), std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    for (size_t j = 0; j < m.inputs.size(); ++j)
      if (m.chain->input(j) != m.inputs[j]) ctx.g.set_input(m.chain, j, m.inputs[j]);
    m.chain->attrs = m.attrs;
    m.chain->origin = ctx.pass;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fuse_elementwise(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool chains, apply_pattern<FuseElementwiseSupported>(ctx));
  KILN_ASSIGN_OR_RETURN(bool concats, apply_pattern<AbsorbConcat>(ctx));
  KILN_ASSIGN_OR_RETURN(bool splits, apply_pattern<AbsorbSplit>(ctx));
  return chains || concats || splits;
}

}  // namespace kiln::passes
