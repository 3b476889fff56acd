// An attention mask that is provably zero everywhere is dropped:
//   Where(Expand(c, s), x, y), c, x, y constants, x and y one value each
//                                                     =>  Expand(Where(c, x, y) folded, s)
//   kiln.MultiHeadAttention(q, k, v, Expand(0, s))   =>  (q, k, v)
// Exports of models without padding (ViT) still build a mask from an all-true boolean and
// broadcast it to the batch: the dynamo exporter Where(True, 0, -inf) expanded to [B, 1, S, S],
// the TorchScript exporter Where(Expand(Range(S) >= 0, [B, 1, 1, 1]), 0, -inf). With a dynamic
// batch the Expand's shape is not a constant, so fold_constants cannot fold the Where; moved
// inside the Expand it folds (Expand and Where broadcast alike, so the shape is the same), and
// the attention runs without the mask.
#include <cstring>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The one value every element of constant `v` has, as double (nullopt when they differ).
std::optional<double> uniform_const(const Value* v) {
  if (!v || !v->is_constant() || v->constant->numel() == 0) return std::nullopt;
  const Tensor& t = *v->constant;
  const double first = t.at_double(0);
  for (int64_t i = 1; i < t.numel(); ++i)
    if (t.at_double(i) != first) return std::nullopt;
  return first;
}

struct FoldConstantWhere {
  struct Match {
    Node* where;
    const Tensor* cond;
    double x, y;
    Value* shape;
  };

  static std::optional<Match> match(PassContext& ctx, Node& w) {
    if (!is_op(&w, "Where") || w.num_inputs() != 3) return std::nullopt;
    Node* e = producer_if(w.input(0), "Expand");
    if (!e || !e->input(0) || !e->input(0)->is_constant()) return std::nullopt;
    const auto x = scalar_const(w.input(1)), y = scalar_const(w.input(2));
    if (!x || !y || w.input(1)->type.dtype != w.input(2)->type.dtype) return std::nullopt;
    // Folded as fold_constants would fold it: not into a constant of more than 64 MiB.
    const size_t bytes = static_cast<size_t>(e->input(0)->constant->numel()) *
                         dtype_size(w.input(1)->type.dtype);
    if (bytes > (size_t{64} << 20)) {
      ctx.note(fmt::format("{}: its condition folded would be {} MiB", w.label(), bytes >> 20));
      return std::nullopt;
    }
    return Match{&w, e->input(0)->constant.get(), *x, *y, e->input(1)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    // Where(c, x, y) at the broadcast of c's shape and x's and y's (one value each).
    std::vector<int64_t> shape = m.cond->shape();
    for (const Value* v : {m.where->input(1), m.where->input(2)})
      if (v->type.rank() > static_cast<int64_t>(shape.size()))
        shape.insert(shape.begin(), v->type.rank() - shape.size(), 1);
    Tensor sel(DataType::kFloat64, shape);
    for (int64_t i = 0; i < sel.numel(); ++i)
      sel.data<double>()[i] = m.cond->at_double(i) != 0 ? m.x : m.y;
    Value* folded = ctx.g.add_constant(m.where->output(0)->name + "_where_values",
                                       sel.cast(m.where->input(1)->type.dtype));
    return replace_with_layer(ctx, {m.where}, "", "Expand", {folded, m.shape}, {},
                              m.where->output(0))
        .status();
  }
};

struct DropZeroMask {
  struct Match {
    Node* mha;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_kiln_op(&n, "MultiHeadAttention") || !n.input(3)) return std::nullopt;
    const Value* m = n.input(3);
    Node* e = producer_if(m, "Expand");
    const auto z = uniform_const(e ? e->input(0) : m);
    if (!z || *z != 0) return std::nullopt;
    // The mask must not widen the scores [B, H, Sq, Sk]: batch and lengths as Q's and K's.
    if (!mask_fits_scores(n, m->type)) {
      ctx.note(fmt::format("{}: its zero mask may widen the scores", n.label()));
      return std::nullopt;
    }
    return Match{&n};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    ctx.g.set_input(m.mha, 3, nullptr);
    m.mha->origin = ctx.pass;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> drop_zero_mask(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool where, apply_pattern<FoldConstantWhere>(ctx));
  KILN_ASSIGN_OR_RETURN(bool mask, apply_pattern<DropZeroMask>(ctx));
  return where || mask;
}

}  // namespace kiln::passes
