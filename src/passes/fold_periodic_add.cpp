// A constant added once per group of W rows of axis 0, written through a reshape that splits
// axis 0 into (G, W) and one that merges it back, becomes a plain Add of the constant repeated
// over the groups:
//   y = Reshape(x [G*W, d1..dk], [G, W, d1..dk]);  z = Reshape(Add(y, C), x's shape)
//     =>  z = Add(x, Tile(C', [G, 1, .., 1]))
// C is a constant whose axis 0 (after aligning it to y's rank) is 1, so it is the same for
// every group; C' is C without that axis ([W or 1, ...], its broadcast dims kept at 1). The
// repeat count G is a constant when static; else it is read off the graph input dim it equals
// (so the new Shape reads no activation), else computed as Shape(x)[0] / W; shape ops, which
// run on the host. Both Reshapes must provably (for every shape of the profile: dims compared
// symbolically) split only axis 0 and restore x's shape, and C must not widen y.
// Swin's shifted-window attention adds its per-window mask this way
// (scores [B*nW, H, N, N] -> [B, nW, H, N, N] + mask [nW, 1, N, N] -> back): folded, the mask
// is one more additive term of the scores, which fuse_attention takes.
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FoldPeriodicAdd {
  struct Match {
    Node *r1, *add, *r2;
    Value* x;
    Tensor period;      // C' = C without its leading 1 axis
    bool tile = false;  // C varies along W: repeat it G times
    int64_t w = 0;
    Dim groups;  // G
  };

  static std::optional<Match> match(PassContext& ctx, Node& r2) {
    if (!is_op(&r2, "Reshape")) return std::nullopt;
    Node* add = producer_if(r2.input(0), "Add");
    if (!add || add->num_inputs() != 2 || !single_use(ctx.g, add->output(0))) return std::nullopt;
    Node* r1 = nullptr;
    Value* c = nullptr;
    for (size_t side = 0; side < 2 && !r1; ++side) {
      Node* r = producer_if(add->input(side), "Reshape");
      if (r && add->input(1 - side) && add->input(1 - side)->is_constant()) {
        r1 = r;
        c = add->input(1 - side);
      }
    }
    if (!r1) return std::nullopt;  // not the pattern (no note: every Reshape is a candidate)
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{} -> {} -> {}: {}", r1->label(), add->label(), r2.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, r1->output(0)))
      return reject("the split tensor has another consumer or is a graph output");
    Value* x = r1->input(0);
    const TensorType &xt = x->type, &yt = r1->output(0)->type, &zt = r2.output(0)->type;
    if (!xt.has_rank() || xt.rank() < 1 || yt.rank() != xt.rank() + 1)
      return reject("the first Reshape does not add exactly one axis");
    const std::vector<Dim>&xd = *xt.dims, &yd = *yt.dims;
    const Dim& w = yd[1];
    if (!w.is_static() || w.value < 1)
      return reject("the period (axis 1 after the split) is not static");
    if (!same_dim(mul_dims(yd[0], w), xd[0]))
      return reject("the first Reshape does not provably split axis 0 into (G, W)");
    for (int64_t i = 1; i < xt.rank(); ++i)
      if (!same_dim(yd[static_cast<size_t>(i + 1)], xd[static_cast<size_t>(i)]))
        return reject("the first Reshape does not provably keep the axes after axis 0");
    if (!same_dims(zt, xt)) return reject("the last Reshape does not provably restore x's shape");
    if (!broadcasts_into(c->type, yt)) return reject("the constant widens the split tensor");
    if (c->constant->dtype() != xt.dtype) return reject("the constant's type is not x's");
    std::vector<int64_t> cs = c->constant->shape();
    while (cs.size() < static_cast<size_t>(yt.rank())) cs.insert(cs.begin(), 1);
    if (cs[0] != 1) return reject("the constant is not the same for every group (axis 0 is not 1)");
    cs.erase(cs.begin());
    auto period = c->constant->reshaped(cs);
    if (!period.ok()) return reject("the constant cannot be reshaped");
    return Match{r1, add, &r2, x, *period, cs[0] != 1, w.value, yd[0]};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const std::string base = m.add->name;
    const int64_t rank = m.x->type.rank();
    auto made = [&](const char* op, std::vector<Value*> ins, Attributes a = {}) {
      Node* n = g.insert_node_before(m.r1, op, g.unique_name(base + "_" + op), ins,
                                     {g.unique_name(base + "_" + op)});
      n->attrs = std::move(a);
      n->origin = ctx.pass;
      return n->output(0);
    };
    auto i64s = [&](const char* what, std::vector<int64_t> v) {
      const int64_t n = static_cast<int64_t>(v.size());
      return g.add_constant(g.unique_name(base + "_" + what), Tensor::from<int64_t>({n}, v));
    };
    Value* term = g.add_constant(g.unique_name(base + "_period"), m.period);
    if (m.tile) {
      Value* repeats = nullptr;
      const std::vector<int64_t> ones(static_cast<size_t>(rank - 1), 1);
      Attributes axis0;
      axis0.set("axis", Attribute::Int(0));
      if (m.groups.is_static()) {
        std::vector<int64_t> r = ones;
        r.insert(r.begin(), m.groups.value);
        repeats = i64s("repeats", r);
      } else {
        // G itself: a graph input's dim when it is one (detach_shapes' reasoning: no new
        // consumer of an activation), else Shape(x)[0] / W.
        Value* count = nullptr;
        for (Value* in : g.inputs()) {
          if (count || !in->type.has_rank()) continue;
          for (int64_t j = 0; j < in->type.rank() && !count; ++j)
            if (!m.groups.symbol.empty() &&
                same_dim((*in->type.dims)[static_cast<size_t>(j)], m.groups))
              count = made("Gather", {made("Shape", {in}), i64s("at", {j})}, axis0);
        }
        if (!count) {
          Value* n0 = made("Slice", {made("Shape", {m.x}), i64s("start", {0}), i64s("end", {1})});
          count = made("Div", {n0, i64s("period", {m.w})});
        }
        repeats = rank > 1 ? made("Concat", {count, i64s("ones", ones)}, axis0) : count;
      }
      term = made("Tile", {term, repeats});
    }
    return replace_with_layer(ctx, {m.add, m.r1, m.r2}, "", "Add", {m.x, term}, {}, m.r2->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fold_periodic_add(PassContext& ctx) { return apply_pattern<FoldPeriodicAdd>(ctx); }

}  // namespace kiln::passes
