// kiln.Relayout: a region of layout ops as one layer (encoding in fused.h). The reference runs
// the region's ops in order with the registry's kernels, and infers its type by inferring theirs
// on a scratch graph, so the layer means exactly what its ops mean.
#include <algorithm>
#include <cctype>

#include "ops/fused.h"
#include "ops/fused_util.h"
#include "ops/relayout_types.h"

namespace kiln {

namespace {

const char* const kRelayoutOps[] = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                                    "Slice",     "Concat",  "Pad",     "Expand"};

// Operand j of step s: layer input (k >= 0), the step's constant attribute s<s>_c<j> or an
// absent input (-1), an earlier step's result (k <= -2: step -2 - k).
struct RelayoutProgram {
  std::vector<std::string> ops;
  std::vector<int64_t> arity, operands;
};

Expected<RelayoutProgram> read_relayout(const Node& n, size_t num_inputs) {
  RelayoutProgram p{n.attrs.get_strings("ops"), n.attrs.get_ints("arity"),
                    n.attrs.get_ints("operands")};
  if (p.ops.empty() || p.ops.size() != p.arity.size())
    return KILN_ERROR("{}: ops and arity must be non-empty and of equal length", n.label());
  int64_t total = 0;
  for (int64_t a : p.arity) {
    if (a < 1 || a > 64) return KILN_ERROR("{}: a step has {} operands", n.label(), a);
    total += a;
  }
  if (total != static_cast<int64_t>(p.operands.size()))
    return KILN_ERROR("{}: operands has {} entries, arity adds up to {}", n.label(),
                      p.operands.size(), total);
  size_t k = 0;
  for (size_t s = 0; s < p.ops.size(); ++s) {
    if (!relayout_op_supported(p.ops[s]))
      return KILN_ERROR("{}: step {} op '{}' is not a layout op", n.label(), s, p.ops[s]);
    for (int64_t j = 0; j < p.arity[s]; ++j, ++k) {
      const int64_t o = p.operands[k];
      if (o >= static_cast<int64_t>(num_inputs) || (o <= -2 && -2 - o >= static_cast<int64_t>(s)))
        return KILN_ERROR("{}: step {} operand {} refers to {}", n.label(), s, j, o);
      if (j == 0 && o == -1)
        return KILN_ERROR("{}: step {} has no data operand", n.label(), s);
      const Attribute* c = n.attrs.find(fmt::format("s{}_c{}", s, j));
      if (c && (o != -1 || c->kind != Attribute::Kind::kTensor || !c->t))
        return KILN_ERROR("{}: step {} constant {} is not a tensor operand", n.label(), s, j);
    }
  }
  return p;
}

// Step s's own attributes (its s<s>_ prefix removed, constants dropped).
Attributes step_attrs(const Node& n, size_t s) {
  Attributes a = fused::strip_prefix(n.attrs, fmt::format("s{}_", s));
  Attributes out;
  for (const auto& [name, v] : a.all())
    if (!(name.size() >= 2 && name[0] == 'c' && std::isdigit(static_cast<unsigned char>(name[1]))))
      out.set(name, v);
  return out;
}

}  // namespace

bool relayout_op_supported(const std::string& op_type) {
  return std::find(std::begin(kRelayoutOps), std::end(kRelayoutOps), op_type) !=
         std::end(kRelayoutOps);
}

Expected<std::unique_ptr<RelayoutTypes>> RelayoutTypes::prepare(const Node& n,
                                                                 size_t num_inputs) {
  KILN_ASSIGN_OR_RETURN(RelayoutProgram p, read_relayout(n, num_inputs));
  std::unique_ptr<RelayoutTypes> r(new RelayoutTypes());
  r->label_ = n.label();
  Graph& g = r->g_;
  for (size_t i = 0; i < num_inputs; ++i) {
    r->in_.push_back(g.add_value(fmt::format("in{}", i), TensorType()));
    g.add_input(r->in_.back());
  }
  size_t k = 0;
  for (size_t s = 0; s < p.ops.size(); ++s) {
    std::vector<Value*> ops;
    for (int64_t j = 0; j < p.arity[s]; ++j, ++k) {
      const int64_t o = p.operands[k];
      if (o >= 0) {
        ops.push_back(r->in_[static_cast<size_t>(o)]);
      } else if (o <= -2) {
        ops.push_back(r->results_[static_cast<size_t>(-2 - o)]);
      } else if (const Attribute* c = n.attrs.find(fmt::format("s{}_c{}", s, j))) {
        ops.push_back(g.add_constant(fmt::format("s{}_c{}", s, j), c->t->clone()));
      } else {
        ops.push_back(nullptr);
      }
    }
    Node* step = g.add_node(p.ops[s], fmt::format("{}/step{}", n.name, s), ops,
                            {fmt::format("s{}", s)});
    step->attrs = step_attrs(n, s);
    r->results_.push_back(step->output(0));
  }
  return r;
}

Expected<std::vector<TensorType>> RelayoutTypes::infer(const std::vector<TensorType>& inputs) {
  if (inputs.size() != in_.size())
    return KILN_ERROR("{}: {} inputs, not {}", label_, inputs.size(), in_.size());
  for (size_t i = 0; i < in_.size(); ++i) in_[i]->type = inputs[i];
  for (Value* v : results_) {  // as new: nothing of the last call's types or values
    v->type = TensorType();
    v->constant.reset();
  }
  Status st = infer_shapes(g_);
  if (!st.ok()) return st.with_context(label_);
  std::vector<TensorType> types;
  for (const Value* v : results_) types.push_back(v->type);
  return types;
}

Status infer_relayout_with(InferContext& ctx, std::unique_ptr<RelayoutTypes>& steps) {
  std::vector<TensorType> in;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return KILN_ERROR("{}: input {} is absent", ctx.node().label(), i);
    in.push_back(ctx.input_type(i));
  }
  if (!steps) {
    KILN_ASSIGN_OR_RETURN(steps, RelayoutTypes::prepare(ctx.node(), in.size()));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<TensorType> types, steps->infer(in));
  ctx.set_output(0, types.back());
  return Status::Ok();
}

Status infer_relayout(InferContext& ctx) {
  std::unique_ptr<RelayoutTypes> steps;
  return infer_relayout_with(ctx, steps);
}

Status cpu_relayout(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(RelayoutProgram p, read_relayout(n, ctx.num_inputs()));
  std::vector<Tensor> results;
  size_t k = 0;
  for (size_t s = 0; s < p.ops.size(); ++s) {
    std::vector<const Tensor*> ops;
    for (int64_t j = 0; j < p.arity[s]; ++j, ++k) {
      const int64_t o = p.operands[k];
      if (o >= 0) {
        ops.push_back(ctx.input(static_cast<size_t>(o)));
        if (!ops.back()) return KILN_ERROR("{}: input {} is missing", n.label(), o);
      } else if (o <= -2) {
        ops.push_back(&results[static_cast<size_t>(-2 - o)]);
      } else if (const Attribute* c = n.attrs.find(fmt::format("s{}_c{}", s, j))) {
        ops.push_back(c->t.get());
      } else {
        ops.push_back(nullptr);
      }
    }
    KILN_ASSIGN_OR_RETURN(Tensor r, fused::run_op(n, p.ops[s], step_attrs(n, s), ops));
    results.push_back(std::move(r));
  }
  ctx.set_output(0, std::move(results.back()));
  return Status::Ok();
}

}  // namespace kiln
