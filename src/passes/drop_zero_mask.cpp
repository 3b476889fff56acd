// An attention mask that is provably zero everywhere is dropped:
//   Where(c, x, y) with c (or Expand(c, s)) a constant of one value  =>  Expand(x or y, s)
//   kiln.MultiHeadAttention(q, k, v, Expand(0, s))                     =>  (q, k, v)
// Dynamo exports of models without padding (ViT) still build a mask from an all-true boolean:
// Where(True, 0, -inf) broadcast to [B, 1, S, S]. Folded, the attention runs without one.
#include <cstring>

#include "ops/shape_values.h"
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

struct FoldUniformWhere {
  struct Match {
    Node* where;
    Value* pick;
    Value* shape;
  };

  static std::optional<Match> match(PassContext& ctx, Node& w) {
    if (!is_op(&w, "Where") || w.num_inputs() != 3) return std::nullopt;
    Node* e = producer_if(w.input(0), "Expand");
    const Value* c = e ? e->input(0) : w.input(0);
    const auto cv = uniform_const(c);
    Value* pick = cv ? (*cv != 0 ? w.input(1) : w.input(2)) : nullptr;
    if (!pick || !e || pick->type.rank() != 0 || !pick->is_constant()) return std::nullopt;
    (void)ctx;
    return Match{&w, pick, e->input(1)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, {m.where}, "", "Expand", {m.pick, m.shape}, {},
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
    const TensorType& q = n.input(0)->type;
    const TensorType& mt = m->type;
    if (mt.rank() > 4 || !q.has_rank() || !mt.has_rank()) return std::nullopt;
    const std::vector<Dim>& md = *mt.dims;
    const size_t off = 4 - md.size();
    for (size_t i = 0; i < md.size(); ++i) {
      const size_t axis = off + i;
      const Dim& d = md[i];
      if (d.is_static() && d.value == 1) continue;
      const bool ok = (axis == 0 && same_dim(d, (*q.dims)[0])) ||
                      (axis == 2 && same_dim(d, (*q.dims)[1])) ||
                      (axis == 3 && n.attrs.get_int("packed", 0) && same_dim(d, (*q.dims)[1])) ||
                      (axis == 3 && n.input(1) && same_dim(d, (*n.input(1)->type.dims)[1]));
      if (!ok) {
        ctx.note(fmt::format("{}: its zero mask may widen the scores", n.label()));
        return std::nullopt;
      }
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
  KILN_ASSIGN_OR_RETURN(bool where, apply_pattern<FoldUniformWhere>(ctx));
  KILN_ASSIGN_OR_RETURN(bool mask, apply_pattern<DropZeroMask>(ctx));
  return where || mask;
}

}  // namespace kiln::passes
