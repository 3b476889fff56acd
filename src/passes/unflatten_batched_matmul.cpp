// A batched product over merged leading dims is the product over the dims themselves:
//   Reshape(MatMul(Reshape(a [d.., m, k], [P, m, k]), Reshape(b [d.., k, n], [P, k, n])),
//           [d.., m, n])  =>  MatMul(a, b)            (P = the product of d..)
// PyTorch's matmul decomposition (torch 2.5's dynamo export: expand both operands to the common
// batch dims, fold them into one for bmm, unfold the result); unflattened, the attention's two
// products are the 4-D MatMuls fuse_attention matches. a and b have the same leading dims
// (compared symbolically, as every merge and split here); each flattening is read by its product
// alone.
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct UnflattenBatchedMatmul {
  struct Match {
    Node *unflatten, *mm;
    Value *a, *b;
  };

  // x [d.., r, c] flattened to [P, r, c] by Reshape node f: x, else nullptr.
  static Value* flattened(const Node* f, const std::vector<Dim>& lead) {
    if (!is_op(f, "Reshape") || !f->input(0)->type.has_rank() || !f->output(0)->type.has_rank())
      return nullptr;
    const TensorType &x = f->input(0)->type, &y = f->output(0)->type;
    if (y.rank() != 3 || x.rank() != static_cast<int64_t>(lead.size()) + 2) return nullptr;
    Dim p(1);
    for (size_t i = 0; i < lead.size(); ++i) {
      if (!same_dim((*x.dims)[i], lead[i])) return nullptr;
      p = mul_dims(p, lead[i]);
    }
    const auto& xd = *x.dims;
    const auto& yd = *y.dims;
    if (!same_dim(yd[0], p) || !same_dim(yd[1], xd[xd.size() - 2]) ||
        !same_dim(yd[2], xd.back()))
      return nullptr;
    return f->input(0);
  }

  static std::optional<Match> match(PassContext& ctx, Node& r) {
    if (!is_op(&r, "Reshape") || !r.output(0)->type.has_rank() || r.output(0)->type.rank() < 4)
      return std::nullopt;
    Node* mm = producer_if(r.input(0), "MatMul");
    if (!mm || !single_use(ctx.g, mm->output(0)) || mm->output(0)->type.rank() != 3)
      return std::nullopt;
    const std::vector<Dim>& out = *r.output(0)->type.dims;
    const std::vector<Dim> lead(out.begin(), out.end() - 2);
    Node* fa = mm->input(0)->producer;
    Node* fb = mm->input(1)->producer;
    Value* a = flattened(fa, lead);
    Value* b = flattened(fb, lead);
    if (!a || !b) {
      ctx.note(fmt::format("{}: the product's operands are not flattenings of [d.., r, c] tensors "
                           "with the result's leading dims",
                           r.label()));
      return std::nullopt;
    }
    if (!single_use(ctx.g, mm->input(0)) || !single_use(ctx.g, mm->input(1))) {
      ctx.note(fmt::format("{}: a flattened operand has another reader", r.label()));
      return std::nullopt;
    }
    const auto& od = *mm->output(0)->type.dims;
    if (!same_dim(out[out.size() - 2], od[1]) || !same_dim(out.back(), od[2])) return std::nullopt;
    return Match{&r, mm, a, b};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node* fa = m.mm->input(0)->producer;
    Node* fb = m.mm->input(1)->producer;
    std::vector<Node*> group = {m.mm, m.unflatten, fa};
    if (fb != fa) group.push_back(fb);
    return replace_with_layer(ctx, group, "", "MatMul", {m.a, m.b}, {}, m.unflatten->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> unflatten_batched_matmul(PassContext& ctx) {
  return apply_pattern<UnflattenBatchedMatmul>(ctx);
}

}  // namespace kiln::passes
