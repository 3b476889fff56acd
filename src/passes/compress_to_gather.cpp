// Compress (numpy.compress: boolean mask selection along an axis) is a Gather of the positions
// NonZero finds in the condition:
//   Compress(x, condition; axis)  =>  Gather(x, Reshape(NonZero(c), [-1]), axis)
//   Compress(x, condition)        =>  Gather(Reshape(x, [-1]), Reshape(NonZero(c), [-1]), 0)
// with c the condition truncated to the axis length (a Slice, where it may be longer), so the
// GPU runs it on its NonZero and Gather layers. A true past the axis is dropped here, where the
// CPU op (as numpy) refuses it.
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct CompressToGather {
  struct Match {
    Node* n = nullptr;
    bool has_axis = false;
    int64_t axis = 0, length = 0;  // the axis length (the element count without an axis)
    bool truncate = false;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Compress")) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value *x = n.input(0), *c = n.input(1);
    if (!x || !x->type.has_rank() || !c || c->type.dtype != DataType::kBool ||
        !c->type.has_rank() || c->type.rank() != 1)
      return why("not an input of known rank and a 1-D bool condition");
    Match m;
    m.n = &n;
    m.has_axis = n.attrs.has("axis");
    const int64_t rank = x->type.rank();
    if (m.has_axis) {
      m.axis = n.attrs.get_int("axis", 0);
      if (m.axis < -rank || m.axis >= rank) return why("axis out of range (the op says why)");
      if (m.axis < 0) m.axis += rank;
      const Dim& d = (*x->type.dims)[static_cast<size_t>(m.axis)];
      if (!d.is_static()) return why("the axis length is not static");
      m.length = d.value;
    } else {
      if (!x->type.is_static()) return why("no axis and the input's shape is not static");
      m.length = 1;
      for (const Dim& d : *x->type.dims) m.length *= d.value;
    }
    const Dim& cl = (*c->type.dims)[0];
    m.truncate = !cl.is_static() || cl.value > m.length;
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    auto ints = [&](const char* what, std::vector<int64_t> v) {
      return r.constant(what, Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v));
    };
    Value* flat = ints("flat", {-1});
    Value* c = n.input(1);
    if (m.truncate)
      c = r.add_value("Slice",
                      {c, ints("starts", {0}), ints("ends", {m.length}), ints("axes", {0})},
                      "condition_in_range");
    Value* nz = r.add_value("NonZero", {c}, "positions");
    Value* idx = r.add_value("Reshape", {nz, flat}, "indices");
    Value* data = m.has_axis ? n.input(0) : r.add_value("Reshape", {n.input(0), flat}, "flat");
    Node* g = r.add("Gather", {data, idx}, "selected", 0);
    g->attrs.set("axis", Attribute::Int(m.has_axis ? m.axis : 0));
    return r.finish(g);
  }
};

}  // namespace

Expected<bool> compress_to_gather(PassContext& ctx) { return apply_pattern<CompressToGather>(ctx); }

}  // namespace kiln::passes
