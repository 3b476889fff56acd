#include "shape_eval.h"

#include <algorithm>

#include "ops/op.h"

namespace kiln::gpu {

Tensor eval_shape_op(const Node& n, const std::vector<int64_t>& dims) {
  if (n.op_type == "Size") {
    int64_t numel = 1;
    for (int64_t d : dims) numel *= d;
    return Tensor::scalar<int64_t>(numel);
  }
  const int64_t rank = static_cast<int64_t>(dims.size());
  auto clamp = [&](int64_t a) { return std::clamp(a < 0 ? a + rank : a, int64_t{0}, rank); };
  const int64_t start = clamp(n.attrs.get_int("start", 0));
  const int64_t end = clamp(n.attrs.get_int("end", rank));
  std::vector<int64_t> v;
  for (int64_t i = start; i < end; ++i) v.push_back(dims[i]);
  return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
}

bool data_dependent(const Node& n) {
  if (!n.attrs.subgraphs().empty()) return true;
  const OpDef* def = find_op(n.domain, n.op_type);
  return def && def->bound;
}

Expected<ShapeResult> evaluate_shapes(const Graph& g, const std::vector<bool>& host_nodes,
                                      const std::vector<std::vector<int64_t>>& input_shapes,
                                      const std::vector<std::shared_ptr<const Tensor>>& input_values,
                                      bool partial) {
  if (input_shapes.size() != g.inputs().size())
    return KILN_ERROR("expected {} input shapes, got {}", g.inputs().size(), input_shapes.size());
  // Inference reads types and constants off the graph's values, so it runs on a private copy
  // whose inputs are made static and whose host values become constants as they are computed.
  std::unique_ptr<Graph> c = g.clone();
  ShapeResult r;
  for (size_t i = 0; i < input_shapes.size(); ++i) {
    // A rank-0 input has an empty shape too: only an input whose declared rank is not 0 is
    // taken as unknown.
    if (partial && input_shapes[i].empty() && g.inputs()[i]->type.rank() != 0) {
      r.dynamic.insert(g.inputs()[i]);
      continue;
    }
    std::vector<Dim> dims(input_shapes[i].begin(), input_shapes[i].end());
    c->inputs()[i]->type = TensorType(g.inputs()[i]->type.dtype, dims);
  }
  for (size_t i = 0; i < input_values.size() && i < input_shapes.size(); ++i) {
    if (!input_values[i]) continue;
    c->inputs()[i]->constant = input_values[i];
    r.host[g.inputs()[i]] = input_values[i];
  }
  for (size_t k = 0; k < c->nodes().size(); ++k) {
    Node* n = c->nodes()[k];
    const Node* orig = g.nodes()[k];
    if (partial) {
      // Control flow runs its subgraphs when the run reaches it: its outputs are the run's.
      bool dyn = !orig->attrs.subgraphs().empty();
      for (const Value* v : orig->inputs()) dyn |= v && r.dynamic.count(v);
      if (dyn) {  // known only at run time, and so is everything this node makes
        for (const Value* v : orig->outputs())
          if (v) r.dynamic.insert(v);
        continue;
      }
    }
    const OpDef* def = find_op(n->domain, n->op_type);
    if (!def || !def->infer) return KILN_ERROR("{}: no shape inference", n->label());
    std::vector<TensorType> outs(n->num_outputs());
    InferContext ictx(*n, outs);
    KILN_RETURN_IF_ERROR(def->infer(ictx).with_context(n->label()));
    for (size_t o = 0; o < n->num_outputs(); ++o)
      if (Value* v = n->output(o)) v->type = outs[o];
    if (host_nodes[k]) {
      std::vector<Tensor> results(n->num_outputs());
      if (is_shape_op(n->domain, n->op_type)) {
        const auto in_shape = n->input(0) ? n->input(0)->type.static_shape() : std::nullopt;
        if (!in_shape) return KILN_ERROR("{}: input shape is not known", n->label());
        results[0] = eval_shape_op(*n, *in_shape);
      } else {
        std::vector<const Tensor*> ins;
        std::vector<Tensor> like;  // empty stand-ins for inputs read only for their type
        like.reserve(n->num_inputs());
        for (size_t i = 0; i < n->num_inputs(); ++i) {
          const Value* v = n->input(i);
          if (v && !v->is_constant() && input_is_type_only(*n, i)) {
            like.emplace_back(v->type.dtype, std::vector<int64_t>{0});
            ins.push_back(&like.back());
          } else {
            ins.push_back(v ? v->constant.get() : nullptr);
          }
        }
        for (size_t i = 0; i < ins.size(); ++i)
          if (n->input(i) && !ins[i])
            return KILN_ERROR("{}: input {} is not known on the host", n->label(), i);
        KernelContext kctx(*n, ins, results);
        if (!def->cpu) return KILN_ERROR("{}: no host kernel", n->label());
        KILN_RETURN_IF_ERROR(def->cpu(kctx).with_context(n->label()));
      }
      for (size_t o = 0; o < n->num_outputs(); ++o) {
        Value* v = n->output(o);
        if (!v) continue;
        auto t = std::make_shared<const Tensor>(std::move(results[o]));
        v->type = TensorType::of(*t);
        v->constant = t;
        r.host[g.nodes()[k]->output(o)] = t;
      }
    }
    for (size_t o = 0; o < n->num_outputs(); ++o) {
      const Value* v = n->output(o);
      if (!v) continue;
      auto s = v->type.static_shape();
      if (!s && partial && data_dependent(*orig)) {
        r.dynamic.insert(orig->output(o));
        continue;
      }
      if (!s)
        return KILN_ERROR("{}: the shape of output '{}' is not known for these input shapes "
                          "({}); data-dependent shapes are not supported by the cuda backend",
                          n->label(), v->name, v->type.str());
      r.shapes[g.nodes()[k]->output(o)] = *s;
    }
  }
  for (size_t i = 0; i < g.inputs().size(); ++i)
    if (!r.dynamic.count(g.inputs()[i])) r.shapes[g.inputs()[i]] = input_shapes[i];
  for (const Value* v : g.values())
    if (v->is_constant()) r.shapes[v] = v->constant->shape();
  return r;
}

}  // namespace kiln::gpu
