// A Loop-carried value that each iteration grows by one Concat is a scan output: scripted loops
// that append to a tensor (torchvision's mask pasting and keypoint decoding, `acc =
// torch.cat((acc, x))`) copy all that came before at every iteration, quadratic in the trips. As
// a scan output each iteration's part is kept and stacked once after the loop, then laid out as
// the Concat would have:
//   Loop(M, cond, v0 = [..0 along a..]){ v' = Concat(v, y, axis=a) }
//     =>  Loop(M, cond, v0){ v' = v; scan y } -> S [T, y...] -> Transpose (T before a)
//         -> Reshape (T*y_a at a); the carried v0, empty, passes through unchanged
// It applies where v0 is a constant empty along a (its other dims non-zero), v is read by that
// Concat alone, and y's dim a is static: every part then has v0's other dims (or the Concat
// would fail) and y's dim a, the same shape each iteration, as a scan output needs.
#include <algorithm>
#include <vector>

#include "ops/control_flow.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct LoopConcatToScan {
  struct Match {
    Node* loop;
    Graph* body;
    size_t j;      // the carried value's index among the carried ones
    Node* concat;  // in the body
    Node* cast;    // a Cast of the carried value to its own type before the Concat, or null
    int64_t axis;
    std::vector<int64_t> part;  // every iteration's part: v0's dims, y's along the axis
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Loop")) return std::nullopt;
    Graph* body = n.attrs.get_graph("body");
    const int64_t caps = capture_count(n);
    if (!body || n.num_inputs() < 2 + static_cast<size_t>(caps)) return std::nullopt;
    const size_t carried = n.num_inputs() - 2 - static_cast<size_t>(caps);
    if (body->inputs().size() != n.num_inputs() || body->outputs().size() != 1 + n.num_outputs() ||
        n.num_outputs() < carried)
      return std::nullopt;  // malformed: inference reports it
    for (size_t j = 0; j < carried; ++j) {
      Value* v_in = body->inputs()[2 + j];
      Value* v_out = body->outputs()[1 + j];
      Node* c = producer_if(v_out, "Concat");
      if (!v_in || !c) continue;
      const auto why = [&](const char* r) {
        ctx.note(fmt::format("{}: carried value {} grows by a Concat but {}", n.label(), j, r));
      };
      // The carried value as the Concat reads it, through a Cast to its own type (TorchScript
      // writes one where the accumulator's type is re-asserted).
      Node* cast = producer_if(c->num_inputs() ? c->input(0) : nullptr, "Cast");
      if (cast && !(cast->input(0) == v_in && c->input(0)->type.dtype == v_in->type.dtype &&
                    c->input(0)->uses().size() == 1))
        cast = nullptr;
      const Value* read = cast ? cast->output(0) : v_in;
      if (c->num_inputs() != 2 || c->input(0) != read || c->input(1) == v_in ||
          c->input(1) == read || v_in->uses().size() != 1) {
        why("the Concat is not (carried, part) or the carried value has other readers");
        continue;
      }
      if (v_out->uses().size() != 0 ||
          std::count(body->outputs().begin(), body->outputs().end(), v_out) != 1) {
        why("the grown value is read in the body");
        continue;
      }
      Value* y = c->input(1);
      const Value* v0 = n.input(2 + j);
      if (!y->producer || !y->type.dims) {
        why("its part is not computed in the body or has no known rank");
        continue;
      }
      if (!v0 || !v0->is_constant()) {
        why("its initial value is computed at run time");
        continue;
      }
      // Every part has v0's dims but along a (the Concat would fail otherwise), and y's own
      // there: each iteration's part has the same shape, as a scan output needs.
      const std::vector<Dim>& yd = *y->type.dims;
      const std::vector<int64_t>& s0 = v0->constant->shape();
      const int64_t rank = static_cast<int64_t>(s0.size());
      int64_t a = c->attrs.get_int("axis", 0);
      if (a < 0) a += rank;
      bool ok = rank > 0 && static_cast<int64_t>(yd.size()) == rank && a >= 0 && a < rank &&
                s0[a] == 0 && yd[a].is_static() && yd[a].value > 0 &&
                v0->constant->dtype() == y->type.dtype && n.output(j) != nullptr;
      for (int64_t d = 0; ok && d < rank; ++d)
        if (d != a) ok = s0[d] > 0 && (!yd[d].is_static() || yd[d].value == s0[d]);
      if (!ok) {
        why(fmt::format("its initial value {} is not empty along axis {} with the part's ({}) "
                        "other dims", shape_str(s0), a, y->type.str()).c_str());
        continue;
      }
      std::vector<int64_t> part = s0;
      part[a] = yd[a].value;
      return Match{&n, body, j, c, cast, a, part};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node* n = m.loop;
    Graph& b = *m.body;
    const size_t j = m.j;
    Value* y = m.concat->input(1);
    // The body: the carried value passes through unchanged (empty, it costs nothing), the
    // Concat goes, the part becomes the last scan output.
    b.set_output(1 + j, b.inputs()[2 + j]);
    KILN_RETURN_IF_ERROR(b.remove_node(m.concat, /*force=*/true));
    if (m.cast) KILN_RETURN_IF_ERROR(b.remove_node(m.cast, /*force=*/true));
    b.add_output(y);
    b.remove_dead_values();
    // The node: the carried output is the empty value now; the stacked parts are its last.
    Value* grown = n->output(j);
    g.set_node_output(n, j, g.add_value(g.unique_name(n->name + "/empty"), n->input(2 + j)->type));
    std::vector<Dim> sdims{Dim()};
    for (int64_t d : m.part) sdims.emplace_back(d);
    Value* stacked = g.add_value(g.unique_name(n->name + "/parts"), TensorType(y->type.dtype, sdims));
    g.set_node_output(n, n->num_outputs(), stacked);
    n->origin = ctx.pass;
    // [T, y...] laid out as the Concat along a: T moved next to y's axis a, then merged with it.
    const int64_t rank = static_cast<int64_t>(m.part.size());
    Value* x = stacked;
    if (m.axis > 0) {
      std::vector<int64_t> perm(rank + 1);
      for (int64_t d = 0; d < m.axis; ++d) perm[d] = d + 1;
      perm[m.axis] = 0;
      for (int64_t d = m.axis + 1; d <= rank; ++d) perm[d] = d;
      Node* t = g.add_node("Transpose", g.unique_name(n->name + "/to_axis"), {x},
                           {g.unique_name(n->name + "/moved")});
      t->attrs.set("perm", Attribute::Ints(perm));
      t->origin = ctx.pass;
      x = t->output(0);
    }
    std::vector<int64_t> shape = m.part;
    shape[m.axis] = -1;
    Value* target = g.add_constant(g.unique_name(n->name + "/concat_shape"),
                                   Tensor::from<int64_t>({rank}, shape));
    Node* r = g.add_node("Reshape", g.unique_name(n->name + "/as_concat"), {x, target}, {});
    g.set_node_output(r, 0, grown);
    r->origin = ctx.pass;
    return g.topo_sort();
  }
};

}  // namespace

Expected<bool> loop_concat_to_scan(PassContext& ctx) {
  return apply_pattern<LoopConcatToScan>(ctx);
}

}  // namespace kiln::passes
