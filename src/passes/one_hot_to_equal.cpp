// OneHot with a constant depth is a comparison with the positions along the new axis:
//   OneHot(indices, depth, values; axis)  =>  i = indices (int64 where they are integers);
//     i = Where(i < 0, i + depth, i);  Where(Unsqueeze(i, axis) == range [depth, 1, ...],
//     values[1], values[0])
// so every backend runs it on its elementwise layers (label smoothing, token-type tables,
// detectors' class targets).
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct OneHotToEqual {
  struct Match {
    Node* n = nullptr;
    int64_t depth = 0, axis = 0, rank = 0;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "OneHot")) return std::nullopt;
    const Value *ind = n.input(0), *d = n.input(1), *vals = n.input(2);
    if (!ind || !ind->type.has_rank() || !d || !d->constant || d->constant->numel() != 1 || !vals ||
        !vals->type.has_rank() || vals->type.rank() != 1) {
      ctx.note(fmt::format("{}: depth is not a constant, or the ranks are not known", n.label()));
      return std::nullopt;
    }
    const double depth = d->constant->at_double(0);
    const int64_t rank = ind->type.rank(), axis = n.attrs.get_int("axis", -1);
    if (!(depth >= 1) || depth > (1 << 24) || axis < -rank - 1 || axis > rank) {
      ctx.note(fmt::format("{}: depth or axis out of range (the op says why)", n.label()));
      return std::nullopt;
    }
    return Match{&n, static_cast<int64_t>(depth), axis < 0 ? axis + rank + 1 : axis, rank};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    auto add = [&](const char* op, std::vector<Value*> ins, const char* what) {
      return r.add(op, ins, what);
    };
    auto constant = [&](const char* what, Tensor t) { return r.constant(what, std::move(t)); };
    Value* i = n.input(0);
    DataType it = i->type.dtype;
    if (dtype_is_integer(it) && it != DataType::kInt64) {
      Node* c = add("Cast", {i}, "as_int64");
      c->attrs.set("to", Attribute::Int(static_cast<int64_t>(DataType::kInt64)));
      i = c->output(0);
      it = DataType::kInt64;
    }
    if (it == DataType::kUndefined) it = DataType::kInt64;
    auto scalar = [&](const char* what, double v) {
      return constant(what, Tensor::scalar<double>(v).cast(it));
    };
    Value* neg = add("Less", {i, scalar("zero", 0)}, "negative")->output(0);
    Value* wrapped =
        add("Add", {i, scalar("depth", static_cast<double>(m.depth))}, "wrapped")->output(0);
    Value* idx = add("Where", {neg, wrapped, i}, "index")->output(0);
    Value* u =
        add("Unsqueeze", {idx, constant("axis", Tensor::from<int64_t>({1}, {m.axis}))}, "on_axis")
            ->output(0);
    std::vector<int64_t> rshape = {m.depth};
    rshape.resize(static_cast<size_t>(m.rank - m.axis + 1), 1);
    Tensor positions(DataType::kFloat64, rshape);
    for (int64_t k = 0; k < m.depth; ++k) positions.data<double>()[k] = static_cast<double>(k);
    Value* hit = add("Equal", {u, constant("positions", positions.cast(it))}, "hit")->output(0);
    Value* vals = n.input(2);
    auto part = [&](int64_t k, const char* what) {
      Node* gth = add("Gather", {vals, constant(what, Tensor::scalar<int64_t>(k))}, what);
      gth->attrs.set("axis", Attribute::Int(0));
      return gth->output(0);
    };
    Value* on = part(1, "on_value");
    Value* off = part(0, "off_value");
    return r.finish(r.add("Where", {hit, on, off}, "one_hot", 0));
  }
};

}  // namespace

Expected<bool> one_hot_to_equal(PassContext& ctx) { return apply_pattern<OneHotToEqual>(ctx); }

}  // namespace kiln::passes
