// A transpose written through merged leading dims is a transpose of the original tensor:
//   Reshape(Transpose(Reshape(x, [P, t...]), perm), [x0, .., x(j-1), u...])
//     =>  Transpose(x, [0, .., j-1, j-1+perm[1..]])
// where the first Reshape merges x's leading j dims into P (x's other dims are t...), perm keeps
// axis 0 in front, and the last Reshape splits it back. PyTorch's SDPA export writes K's
// transpose this way ([B, H, S, D] -> [B*H, S, D] -> [B*H, D, S] -> [B, H, D, S]); folded, it
// becomes the Transpose that fold_attention_heads recognises. Dims are compared symbolically,
// so the rule holds for every shape of a dynamic profile.
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FoldReshapeTranspose {
  struct Match {
    Node *r1, *t, *r2;
    std::vector<int64_t> perm;
  };

  static std::optional<Match> match(PassContext& ctx, Node& r2) {
    if (!is_op(&r2, "Reshape")) return std::nullopt;
    Node* t = producer_if(r2.input(0), "Transpose");
    Node* r1 = t ? producer_if(t->input(0), "Reshape") : nullptr;
    if (!r1 || !single_use(ctx.g, t->output(0)) || !single_use(ctx.g, r1->output(0)))
      return std::nullopt;
    const TensorType &x = r1->input(0)->type, &merged = r1->output(0)->type;
    const TensorType &tt = t->output(0)->type, &y = r2.output(0)->type;
    const int64_t r = x.rank(), m = merged.rank() - 1;
    const std::vector<int64_t> perm = transpose_perm(*t);
    if (r < 2 || m < 1 || m >= r || y.rank() != r || tt.rank() != m + 1 ||
        perm.size() != static_cast<size_t>(m + 1) || perm[0] != 0)
      return std::nullopt;
    const int64_t j = r - m;  // leading dims merged into one
    auto dim = [](const TensorType& tp, int64_t i) { return (*tp.dims)[i]; };
    for (int64_t i = 1; i <= m; ++i)
      if (!same_dim(dim(merged, i), dim(x, j - 1 + i)) ||
          !same_dim(dim(y, j - 1 + i), dim(tt, i))) {
        ctx.note(
            fmt::format("{}: the reshapes around {} do not provably merge and split the "
                        "same leading dims",
                        r2.label(), t->label()));
        return std::nullopt;
      }
    for (int64_t i = 0; i < j; ++i)
      if (!same_dim(dim(y, i), dim(x, i))) {
        ctx.note(fmt::format("{}: does not split {}'s merged dim back", r2.label(), r1->label()));
        return std::nullopt;
      }
    std::vector<int64_t> folded(static_cast<size_t>(r));
    for (int64_t i = 0; i < j; ++i) folded[i] = i;
    for (int64_t i = 1; i <= m; ++i) folded[j - 1 + i] = j - 1 + perm[i];
    return Match{r1, t, &r2, folded};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Attributes a;
    a.set("perm", Attribute::Ints(m.perm));
    return replace_with_layer(ctx, {m.r1, m.t, m.r2}, "", "Transpose", {m.r1->input(0)}, a,
                              m.r2->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fold_reshape_transpose(PassContext& ctx) {
  return apply_pattern<FoldReshapeTranspose>(ctx);
}

}  // namespace kiln::passes
