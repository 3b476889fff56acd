// Shape(x) of an activation whose dims are all known, as constants or as dims of the graph's
// inputs, is computed from the inputs instead:
//   Shape(x)  =>  Concat(Gather(Shape(input_i), [k]) | [constant], ...)
// TorchScript exports read shapes off intermediate tensors (x.size(0) before a view); such a
// read is one more consumer of the tensor and keeps the patterns that need a value used once
// (the attention head merge, for one) from applying. The new nodes read only input shapes, so
// they run on the host when shapes are set, as Shape did.
#include <algorithm>

#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct Source {
  Value* input = nullptr;  // nullptr: a static dim
  int64_t index = 0;
  int64_t value = 0;
};

struct DetachShape {
  struct Match {
    Node* shape;
    std::vector<Source> dims;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Shape")) return std::nullopt;
    const Value* x = n.input(0);
    if (!x || !x->producer || !x->type.has_rank() || ctx.g.is_graph_input(x)) return std::nullopt;
    const int64_t rank = x->type.rank();
    auto clampi = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
    const int64_t start = clampi(n.attrs.get_int("start", 0));
    const int64_t end = n.attrs.has("end") ? clampi(n.attrs.get_int("end", rank)) : rank;
    std::vector<Source> dims;
    for (int64_t k = start; k < end; ++k) {
      const Dim& d = (*x->type.dims)[k];
      if (d.is_static()) {
        dims.push_back({nullptr, 0, d.value});
        continue;
      }
      bool found = false;
      for (Value* in : ctx.g.inputs()) {
        if (!in->type.has_rank()) continue;
        for (int64_t j = 0; j < in->type.rank() && !found; ++j)
          if (same_dim((*in->type.dims)[j], d) && !d.symbol.empty()) {
            dims.push_back({in, j, 0});
            found = true;
          }
        if (found) break;
      }
      if (!found) return std::nullopt;
    }
    if (dims.empty()) return std::nullopt;
    return Match{&n, std::move(dims)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    std::vector<Value*> parts;
    for (const Source& s : m.dims) {
      if (!s.input) {
        parts.push_back(g.add_constant(g.unique_name(m.shape->name + "_dim"),
                                       Tensor::from<int64_t>({1}, {s.value})));
        continue;
      }
      Node* shape = g.insert_node_before(m.shape, "Shape", g.unique_name(m.shape->name + "_in"),
                                         {s.input}, {g.unique_name(m.shape->name + "_in")});
      Value* idx = g.add_constant(g.unique_name(m.shape->name + "_at"),
                                  Tensor::from<int64_t>({1}, {s.index}));
      Node* gather =
          g.insert_node_before(m.shape, "Gather", g.unique_name(m.shape->name + "_dim"),
                               {shape->output(0), idx}, {g.unique_name(m.shape->name + "_dim")});
      for (Node* made : {shape, gather}) made->origin = ctx.pass;
      parts.push_back(gather->output(0));
    }
    Attributes a;
    a.set("axis", Attribute::Int(0));
    return replace_with_layer(ctx, {m.shape}, "", "Concat", parts, a, m.shape->output(0)).status();
  }
};

}  // namespace

Expected<bool> detach_shapes(PassContext& ctx) { return apply_pattern<DetachShape>(ctx); }

}  // namespace kiln::passes
