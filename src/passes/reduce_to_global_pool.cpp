// A mean over every spatial axis is a global average pool:
//   ReduceMean(x [N, C, d1..dk], axes = {2..k+1}, keepdims = 1, k >= 2)  =>  GlobalAveragePool(x)
// Squeeze-excitation blocks (EfficientNet, MobileNetV3, RegNetY, GhostNet) are exported as
// `x.mean((2, 3), keepdim=True)`; as the pool they get its layers (NHWC, 16-byte loads, the
// spatial axes split over blocks when N x C is small) instead of a generic reduction.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct ReduceToGlobalPool {
  struct Match {
    Node* n;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "ReduceMean")) return std::nullopt;
    const Value* x = n.input(0);
    // Rank 4 and up: a rank-3 mean over the last axis is a LayerNorm's or RMSNorm's statistic,
    // which their own passes recognise in this form.
    if (!x || !x->type.has_rank() || x->type.rank() < 4 || !is_float_type(x->type.dtype)) {
      ctx.note(fmt::format("{}: not a float tensor with two or more spatial axes", n.label()));
      return std::nullopt;
    }
    const int64_t rank = x->type.rank();
    const auto axes = trailing_axes(&n, rank);
    if (!axes || static_cast<int64_t>(axes->size()) != rank - 2) {
      ctx.note(fmt::format("{}: does not reduce exactly the axes after N and C with keepdims",
                           n.label()));
      return std::nullopt;
    }
    return Match{&n};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    KILN_ASSIGN_OR_RETURN(Node * p, replace_with_layer(ctx, {m.n}, "", "GlobalAveragePool",
                                                       {m.n->input(0)}, {}, m.n->output(0)));
    (void)p;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> reduce_to_global_pool(PassContext& ctx) {
  return apply_pattern<ReduceToGlobalPool>(ctx);
}

}  // namespace kiln::passes
