// Every connected region of layout ops with one result becomes one kiln.Relayout layer:
//   Slice(x) Slice(x) -> Concat -> Slice Slice -> Concat -> Reshape -> Transpose -> Reshape
//     =>  kiln.Relayout(x)     (Swin's cyclic shift and window partition: 7 copies -> 1)
// A region grows from its last op (its sink) towards the inputs: a layout op joins when every
// reader of its result is already in the region (so nothing outside sees an intermediate) and
// the result is not a graph output; so does a part of a Split so read, as a Slice of the Split's
// input (the region reads its columns in place; a decoder's K part of its packed Q|K projection
// going into the KV cache's Concat, while the attention reads Q's). Its data operands from outside
// become the layer's inputs;
// its constant operands (starts, shapes, pads) go into the layer. A region needs two or more
// ops that copy (Transpose, Slice, Concat, Pad, Expand): a lone copy among reshapes is already
// one kernel, and reshapes alone copy nothing.
//
// It runs after the pattern passes have converged (pipeline.cpp), so that it takes only the
// layout ops no specific fusion wanted; a backend runs the region as one gather (the CUDA
// backend: relayout.cu) and the CPU runs its ops.
#include <algorithm>
#include <map>
#include <set>

#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr size_t kMaxSteps = 12, kMaxInputs = 8;
constexpr int64_t kMaxRank = 8;

bool reshape_like(const std::string& op) {
  return op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten";
}

// Whether input j of a layout op carries data (else it is a parameter: starts, shape, pads).
bool is_data_slot(const Node& n, size_t j) { return n.op_type == "Concat" || j == 0; }

// Why n cannot be a step of a region, or "" when it can.
std::string why_not_step(const Node& n) {
  if (!n.domain.empty() || !relayout_op_supported(n.op_type)) return "not a layout op";
  if (n.num_outputs() != 1 || !n.output(0) || !n.output(0)->type.has_rank() ||
      n.output(0)->type.rank() > kMaxRank)
    return fmt::format("its result has an unknown rank or one over {}", kMaxRank);
  for (size_t j = 0; j < n.num_inputs(); ++j) {
    const Value* v = n.input(j);
    if (is_data_slot(n, j)) {
      if (!v || !v->type.has_rank() || v->type.rank() > kMaxRank)
        return "a data operand is absent or of unknown rank";
    } else if (v && !v->is_constant()) {
      return fmt::format("operand {} is computed, not a constant", j);
    }
  }
  if (n.op_type == "Pad" && (n.attrs.get_string("mode", "constant") != "constant" || n.input(3)))
    return "a Pad other than constant padding of every axis";
  return "";
}

// Where a Split's output v lies in its input: the axis and the range along it, or nullopt
// where the parts before it are not of known length.
struct SplitPart {
  Value* x;
  int64_t axis, start, len;
};
std::optional<SplitPart> split_part(Value* v) {
  Node* s = v ? v->producer : nullptr;
  if (!s || !s->domain.empty() || s->op_type != "Split" || !s->input(0) ||
      !s->input(0)->type.has_rank() || !v->type.has_rank())
    return std::nullopt;
  const int64_t r = s->input(0)->type.rank();
  int64_t axis = s->attrs.get_int("axis", 0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r || r > kMaxRank) return std::nullopt;
  int64_t start = 0;
  for (size_t k = 0; k < s->num_outputs() && s->output(k) != v; ++k) {
    const Value* o = s->output(k);
    if (!o || !o->type.has_rank() || !(*o->type.dims)[axis].is_static()) return std::nullopt;
    start += (*o->type.dims)[axis].value;
  }
  const Dim& len = (*v->type.dims)[axis];
  if (!len.is_static()) return std::nullopt;
  return SplitPart{s->input(0), axis, start, len.value};
}

struct Region {
  std::vector<Node*> steps;  // in graph order; the last is the sink
  std::vector<Value*> inputs;
  Attributes attrs;
};

// The region that ends at `sink`, grown while a producer's every reader is inside it, in graph
// order (`order`: each node's position); `parts`: the Split outputs it reads that way.
std::vector<Node*> grow(PassContext& ctx, Node* sink, const std::map<const Node*, size_t>& order,
                        std::vector<Value*>* parts) {
  std::vector<Node*> r{sink};
  std::set<const Node*> in{sink};
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = 0; i < r.size(); ++i) {
      Node* n = r[i];
      for (size_t j = 0; j < n->num_inputs(); ++j) {
        Value* v = n->input(j);
        if (!is_data_slot(*n, j) || !v) continue;
        Node* p = v->producer;
        if (!p || in.count(p) || ctx.g.is_graph_output(v)) continue;
        const bool step = why_not_step(*p).empty();
        const bool part = !step && split_part(v).has_value();
        if (!step && !part) continue;
        bool inside = true;
        for (const auto& [user, slot] : v->uses()) inside &= in.count(user) != 0;
        if (!inside) continue;
        if (part) {
          if (std::find(parts->begin(), parts->end(), v) == parts->end()) parts->push_back(v);
          continue;
        }
        r.push_back(p);
        in.insert(p);
        grew = true;
      }
    }
  }
  std::sort(r.begin(), r.end(),
            [&](const Node* a, const Node* b) { return order.at(a) < order.at(b); });
  return r;
}

// The layer's program for `steps`, or why it cannot be one.
Expected<Region> program(std::vector<Node*> steps) {
  Region rg{std::move(steps), {}, {}};
  std::map<const Value*, int64_t> step_of, input_of;
  std::vector<std::string> ops;
  std::vector<int64_t> arity, operands;
  for (size_t s = 0; s < rg.steps.size(); ++s) {
    const Node* n = rg.steps[s];
    ops.push_back(n->op_type);
    arity.push_back(static_cast<int64_t>(n->num_inputs()));
    for (size_t j = 0; j < n->num_inputs(); ++j) {
      Value* v = n->input(j);
      if (!is_data_slot(*n, j)) {
        operands.push_back(-1);
        if (v)
          rg.attrs.set(fmt::format("s{}_c{}", s, j), Attribute::TensorValue(v->constant->clone()));
        continue;
      }
      if (auto it = step_of.find(v); it != step_of.end()) {
        operands.push_back(-2 - it->second);
        continue;
      }
      auto [it, fresh] = input_of.emplace(v, static_cast<int64_t>(rg.inputs.size()));
      if (fresh) rg.inputs.push_back(v);
      operands.push_back(it->second);
    }
    copy_attrs_prefixed(n->attrs, rg.attrs, fmt::format("s{}_", s));
    step_of[n->output(0)] = static_cast<int64_t>(s);
  }
  if (rg.steps.size() > kMaxSteps || rg.inputs.size() > kMaxInputs)
    return KILN_ERROR("{} ops over {} inputs (a layer takes up to {} over {})", rg.steps.size(),
                      rg.inputs.size(), kMaxSteps, kMaxInputs);
  rg.attrs.set("ops", Attribute::Strings(std::move(ops)));
  rg.attrs.set("arity", Attribute::Ints(std::move(arity)));
  rg.attrs.set("operands", Attribute::Ints(std::move(operands)));
  return rg;
}

}  // namespace

Expected<bool> fuse_relayout(PassContext& ctx) {
  bool changed = false;
  std::set<const Node*> tried;  // sinks whose region was rejected (new nodes are never sinks)
  std::map<const Node*, size_t> order;  // node positions, remade after each rewrite
  for (bool rewritten = true;;) {
    if (rewritten) {
      order.clear();
      for (size_t i = 0; i < ctx.g.nodes().size(); ++i) order[ctx.g.nodes()[i]] = i;
      rewritten = false;
    }
    Node* sink = nullptr;
    for (size_t i = ctx.g.nodes().size(); i-- > 0 && !sink;) {
      Node* n = ctx.g.nodes()[i];
      if (!tried.count(n) && why_not_step(*n).empty()) sink = n;
    }
    if (!sink) break;
    tried.insert(sink);
    std::vector<Value*> parts;
    std::vector<Node*> steps = grow(ctx, sink, order, &parts);
    size_t copies = parts.size();
    for (const Node* n : steps) copies += !reshape_like(n->op_type);
    if (copies < 2) {
      if (steps.size() + parts.size() > 1)
        ctx.note(fmt::format("{}: its region of {} ops copies {} time(s); nothing to save",
                             sink->label(), steps.size() + parts.size(), copies));
      continue;
    }
    // Each Split part the region reads becomes a Slice of the Split's input, first among its
    // steps (taken back where the region is not made).
    std::vector<std::pair<Value*, Node*>> slices;
    for (Value* v : parts) {
      const SplitPart sp = *split_part(v);
      const std::string name = ctx.g.unique_name(v->name + "_part");
      auto c = [&](int64_t x) {
        return ctx.g.add_constant(ctx.g.unique_name(name + "_c"), Tensor::from<int64_t>({1}, {x}));
      };
      Node* sl =
          ctx.g.insert_node_before(steps.front(), "Slice", name,
                                   {sp.x, c(sp.start), c(sp.start + sp.len), c(sp.axis)}, {name});
      sl->output(0)->type = v->type;
      sl->origin = ctx.pass;
      sl->onnx_nodes = v->producer->onnx_nodes;
      ctx.g.replace_all_uses(v, sl->output(0));
      slices.emplace_back(v, sl);
      steps.insert(steps.begin(), sl);
    }
    auto take_back = [&] {
      for (auto& [v, sl] : slices) {
        ctx.g.replace_all_uses(sl->output(0), v);
        (void)ctx.g.remove_node(sl, true);
      }
    };
    Expected<Region> rg = program(steps);
    if (!rg.ok()) {
      ctx.note(fmt::format("{}: {}", sink->label(), rg.status().message()));
      take_back();
      continue;
    }
    auto scratch = scratch_layer("kiln", "Relayout", rg->inputs, rg->attrs, sink->output(0));
    if (!ctx.backend_supports("kiln", "Relayout", rg->attrs, sink->output(0)->type.dtype,
                              scratch->nodes().back())) {
      ctx.note(fmt::format("{}: the backend cannot run its region of {} ops as one layer",
                           sink->label(), steps.size()));
      take_back();
      continue;
    }
    KILN_RETURN_IF_ERROR(replace_with_layer(ctx, rg->steps, "kiln", "Relayout", rg->inputs,
                                            std::move(rg->attrs), sink->output(0))
                             .status());
    ++ctx.rewrites;
    changed = rewritten = true;
  }
  return changed;
}

}  // namespace kiln::passes
