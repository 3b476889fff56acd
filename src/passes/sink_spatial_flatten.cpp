// A flattening of the spatial axes moves to where it is a view of channels-last memory:
//   Norm(Reshape(x [N, C, d1..dk], [N, C, d1*..*dk]))
//       =>  Reshape(Norm(x), [N, C, d1*..*dk])               Norm: GroupNorm, InstanceNorm
//   Transpose(Reshape(y [N, C, d1..dk], [N, C, P]), [0, 2, 1])
//       =>  Reshape(Transpose(y, [0, 2, .., k+1, 1]), [N, P, C])
//   Reshape(Transpose(z [N, P, C], [0, 2, 1]), [N, C, d1..dk])
//       =>  Transpose(Reshape(z, [N, d1..dk, C]), [0, k+1, 1, .., k])
// (P = d1*..*dk.) A norm's statistics do not depend on how its spatial axes are shaped, so it
// runs on the image itself (kiln's channels-last GroupNorm takes it); a 4-D channels-first <->
// channels-last transpose of an NHWC tensor relabels memory (movement.transpose_relabel) where
// the 3-D one after a flattening copies. diffusers' VAE attention flattens its GroupNorm's input
// and transposes it to [N, H*W, C] before the projections, and back after; DETR-style and Swin
// patch embeddings flatten and transpose a convolution's output (fold_patch_conv runs first and
// takes the ViT form). Every intermediate read by the pattern only; the merged dims provably the
// product (symbolic dims compared as in shape inference); C, and for the third form d1..dk,
// static.
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// y's dims from 2 on multiplied (nullopt without a rank of at least 4).
std::optional<Dim> spatial_product(const TensorType& t) {
  if (!t.dims || t.rank() < 4) return std::nullopt;
  Dim p(int64_t{1});
  for (size_t i = 2; i < t.dims->size(); ++i) p = mul_dims(p, (*t.dims)[i]);
  return p;
}

// Whether flat [N, C, P] is x [N, C, d1..dk] with its spatial axes merged.
bool flattens_spatial(const TensorType& x, const TensorType& flat) {
  const auto p = spatial_product(x);
  if (!p || flat.rank() != 3) return false;
  const Dim &c = (*x.dims)[1], &fc = (*flat.dims)[1];
  return c.is_static() && fc.is_static() && c.value == fc.value &&
         same_dim((*x.dims)[0], (*flat.dims)[0]) && same_dim(*p, (*flat.dims)[2]);
}

bool swaps_last_two(const Node* t) {
  return is_op(t, "Transpose") && t->attrs.get_ints("perm") == std::vector<int64_t>{0, 2, 1};
}

// A node before `pos` copying `like`'s provenance.
Node* add_before(PassContext& ctx, Node* pos, const Node& like, const std::string& op,
                 std::vector<Value*> ins) {
  Graph& g = ctx.g;
  const std::string name = g.unique_name(like.name + "_" + op);
  Node* n = g.insert_node_before(pos, op, name, ins, {g.unique_name(name + "_out")});
  n->origin = ctx.pass;
  n->onnx_nodes = like.onnx_nodes;
  return n;
}

// Replaces `a` (producer) and `b` (its sole reader) by the new pair ending in `last`, which
// takes over b's output value (its name and readers).
Status swap_pair(Graph& g, Node* a, Node* b, Node* last) {
  Value* out = b->output(0);
  KILN_RETURN_IF_ERROR(g.remove_node(b, /*force=*/true));
  KILN_RETURN_IF_ERROR(g.remove_node(a, /*force=*/true));
  g.set_node_output(last, 0, out);
  g.remove_dead_values();
  return Status::Ok();
}

struct NormOfFlattened {
  struct Match {
    Node *reshape, *norm;
  };
  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "GroupNormalization") && !is_op(&n, "InstanceNormalization"))
      return std::nullopt;
    Node* r = producer_if(n.input(0), "Reshape");
    if (!r || !r->input(0) || !single_use(ctx.g, n.input(0))) return std::nullopt;
    if (!flattens_spatial(r->input(0)->type, n.input(0)->type)) return std::nullopt;
    return Match{r, &n};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins(m.norm->inputs().begin(), m.norm->inputs().end());
    ins[0] = m.reshape->input(0);
    Node* norm = add_before(ctx, m.norm, *m.norm, m.norm->op_type, ins);
    norm->attrs = m.norm->attrs;
    Node* flat = add_before(ctx, m.norm, *m.reshape, "Reshape",
                            {norm->output(0), m.reshape->input(1)});
    flat->attrs = m.reshape->attrs;
    return swap_pair(ctx.g, m.reshape, m.norm, flat);
  }
};

struct TransposeOfFlattened {
  struct Match {
    Node *reshape, *transpose;
  };
  static std::optional<Match> match(PassContext& ctx, Node& t) {
    if (!swaps_last_two(&t)) return std::nullopt;
    Node* r = producer_if(t.input(0), "Reshape");
    if (!r || !r->input(0) || !single_use(ctx.g, t.input(0))) return std::nullopt;
    if (!flattens_spatial(r->input(0)->type, t.input(0)->type)) return std::nullopt;
    return Match{r, &t};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const TensorType& y = m.reshape->input(0)->type;
    const int64_t rank = y.rank(), c = (*y.dims)[1].value;
    std::vector<int64_t> perm = {0};
    for (int64_t i = 2; i < rank; ++i) perm.push_back(i);
    perm.push_back(1);
    Node* last = add_before(ctx, m.transpose, *m.transpose, "Transpose", {m.reshape->input(0)});
    last->attrs.set("perm", Attribute::Ints(perm));
    Value* shape = g.add_constant(g.unique_name(m.reshape->name + "_rows"),
                                  Tensor::from<int64_t>({3}, {0, -1, c}));
    Node* flat = add_before(ctx, m.transpose, *m.reshape, "Reshape", {last->output(0), shape});
    return swap_pair(g, m.reshape, m.transpose, flat);
  }
};

struct UnflattenOfTransposed {
  struct Match {
    Node *transpose, *reshape;
  };
  static std::optional<Match> match(PassContext& ctx, Node& r) {
    if (!is_op(&r, "Reshape") || !r.output(0)) return std::nullopt;
    Node* t = producer_if(r.input(0), "Transpose");
    if (!swaps_last_two(t) || !t->input(0) || !single_use(ctx.g, r.input(0))) return std::nullopt;
    const TensorType& y = r.output(0)->type;
    if (!flattens_spatial(y, r.input(0)->type)) return std::nullopt;
    for (size_t i = 2; i < y.dims->size(); ++i)
      if (!(*y.dims)[i].is_static()) return std::nullopt;
    return Match{t, &r};
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const TensorType& y = m.reshape->output(0)->type;
    const int64_t rank = y.rank();
    std::vector<int64_t> dims = {0}, perm = {0, rank - 1};
    for (int64_t i = 2; i < rank; ++i) dims.push_back((*y.dims)[i].value);
    dims.push_back((*y.dims)[1].value);
    for (int64_t i = 1; i < rank - 1; ++i) perm.push_back(i);
    Value* shape = g.add_constant(g.unique_name(m.reshape->name + "_image"),
                                  Tensor::from<int64_t>({rank}, dims));
    Node* img = add_before(ctx, m.reshape, *m.reshape, "Reshape", {m.transpose->input(0), shape});
    Node* last = add_before(ctx, m.reshape, *m.transpose, "Transpose", {img->output(0)});
    last->attrs.set("perm", Attribute::Ints(perm));
    return swap_pair(g, m.transpose, m.reshape, last);
  }
};

}  // namespace

Expected<bool> sink_spatial_flatten(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool norms, apply_pattern<NormOfFlattened>(ctx));
  KILN_ASSIGN_OR_RETURN(bool rows, apply_pattern<TransposeOfFlattened>(ctx));
  KILN_ASSIGN_OR_RETURN(bool images, apply_pattern<UnflattenOfTransposed>(ctx));
  return norms || rows || images;
}

}  // namespace kiln::passes
