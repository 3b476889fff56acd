// Slices that cut one axis of a tensor into adjacent parts are the parts of a Split:
//   y1 = Slice(x, [0, w1), axis a), y2 = Slice(x, [w1, w1 + w2), axis a), ... covering x's axis a
//     =>  (y1, y2, ...) = Split(x, [w1, w2, ...], axis a)
// The canonical form of a packed projection's parts (Phi-3's qkv_proj sliced into Q, K and V;
// chunk() written as Slices): the passes that read parts in place (fuse_rotary's RotaryOverSplit,
// pack_qkv, fold_attention_heads' walk, fuse_elementwise through column_part) then see one form
// whatever the exporter wrote. Step-1 slices with constant bounds of a static axis only, no two
// covering the same range, none a graph output. Runs after fuse_rotary: rotate_half's two halves
// of a head are such slices, and that pass reads them as Slices.
#include <algorithm>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct SlicesToSplit {
  struct Part {
    Node* slice;
    int64_t begin, end;
  };
  struct Match {
    Value* x;
    int64_t axis;
    std::vector<Part> parts;  // in order along the axis
  };

  static std::optional<Match> match(PassContext& ctx, Node& s) {
    if (!is_op(&s, "Slice") || !s.input(0) || !s.input(0)->type.has_rank()) return std::nullopt;
    Value* x = s.input(0);
    const int64_t r = x->type.rank();
    const auto sl = axis_slice(&s, r);
    if (!sl || sl->axis < 0 || sl->axis >= r || sl->step != 1) return std::nullopt;
    const Dim& n = (*x->type.dims)[sl->axis];
    if (!n.is_static()) return std::nullopt;
    auto clamp = [&](int64_t i) {
      return std::clamp<int64_t>(i < 0 ? i + n.value : i, 0, n.value);
    };
    std::vector<Part> parts;
    for (const auto& use : x->uses()) {
      Node* const user = use.first;  // captured below: clang before 16 cannot capture a binding
      if (use.second != 0 || !is_op(user, "Slice")) continue;
      const auto u = axis_slice(user, r);
      if (!u || u->axis != sl->axis || u->step != 1) continue;
      if (std::any_of(parts.begin(), parts.end(), [&](const Part& p) { return p.slice == user; }))
        continue;
      parts.push_back({user, clamp(u->start), std::max(clamp(u->start), clamp(u->end))});
    }
    // The first of them in the graph's order opens the match (the others would find the same).
    if (parts.size() < 2 || std::any_of(parts.begin(), parts.end(),
                                        [&](const Part& p) { return p.slice->index < s.index; }))
      return std::nullopt;
    std::sort(parts.begin(), parts.end(),
              [](const Part& a, const Part& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const Part& p : parts) {
      if (p.begin != at || p.end <= p.begin) {
        ctx.note(fmt::format("{}: the slices of {} do not cut its axis {} into adjacent parts",
                             s.label(), x->name, sl->axis));
        return std::nullopt;
      }
      if (ctx.g.is_graph_output(p.slice->output(0))) {
        ctx.note(fmt::format("{}: a slice of {} is a graph output", s.label(), x->name));
        return std::nullopt;
      }
      at = p.end;
    }
    if (at != n.value) {
      ctx.note(fmt::format("{}: the slices of {} leave part of axis {} out", s.label(), x->name,
                           sl->axis));
      return std::nullopt;
    }
    return Match{x, sl->axis, std::move(parts)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    std::vector<int64_t> widths;
    std::vector<std::string> names;
    Node* first = m.parts[0].slice;
    for (const Part& p : m.parts) {
      widths.push_back(p.end - p.begin);
      names.push_back(g.unique_name(p.slice->output(0)->name + "_part"));
      if (p.slice->index < first->index) first = p.slice;
    }
    Value* sizes = g.add_constant(g.unique_name(m.x->name + "_widths"),
                                  Tensor::from<int64_t>({int64_t(widths.size())}, widths));
    Node* split = g.insert_node_before(first, "Split", g.unique_name(m.x->name + "_split"),
                                       {m.x, sizes}, names);
    split->attrs.set("axis", Attribute::Int(m.axis));
    split->origin = ctx.pass;
    for (size_t i = 0; i < m.parts.size(); ++i) {
      Node* s = m.parts[i].slice;
      merge_onnx_nodes(*split, *s);
      split->output(i)->type = s->output(0)->type;
      g.replace_all_uses(s->output(0), split->output(i));
    }
    for (const Part& p : m.parts) KILN_RETURN_IF_ERROR(g.remove_node(p.slice));
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> slices_to_split(PassContext& ctx) { return apply_pattern<SlicesToSplit>(ctx); }

}  // namespace kiln::passes
