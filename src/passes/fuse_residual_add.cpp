// A residual Add joins the convolution or matrix product that produces one of its operands:
//   Conv(x, W, b) -> Add(., z)  =>  kiln.FusedConv(x, W, b, z)        (z: the other operand)
//   FusedGemm(a, B, c) -> Add(., z)  =>  kiln.FusedGemm(a, B, c, z)  (also MatMul with a
//                                        constant B: a transformer's projection + residual)
//   FusedGemm(a, B, c) -> Transpose(p) -> Add(., z)
//     =>  Transpose(kiln.FusedGemm(a, B, c, Transpose(z, p^-1)), p)
//                                        (p a rank-4 channels-last/first swap. ConvNeXt: the
//                                        MLP on [N, H, W, C] permuted back to NCHW plus the
//                                        block's input, stored channels-last: both Transposes
//                                        are relabels)
// Only when the product's output has no other consumer and carries no activation yet (the
// layer computes act(conv + z)); z must not broadcast the result to a bigger shape (for
// FusedGemm it has the result's shape exactly: the GEMM epilogue reads it as a matrix).
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A Conv, or a FusedConv without residual and activation.
bool plain_conv(const Node* n) {
  if (is_op(n, "Conv")) return true;
  return is_kiln_op(n, "FusedConv") && !n->input(3) &&
         n->attrs.get_string("activation", "").empty() && !has_post_steps(*n);
}

struct FuseResidualAdd {
  struct Match {
    Node* conv;
    Node* add;
    Value* z;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& add) {
    if (!is_op(&add, "Add") || add.num_inputs() != 2 || add.input(0) == add.input(1))
      return std::nullopt;
    // Prefer the operand whose producer comes last: the other one is then ready earlier.
    std::vector<int> sides = {0, 1};
    auto index_of = [&](int s) {
      Value* v = add.input(static_cast<size_t>(s));
      return v && v->producer ? v->producer->index : -1;
    };
    if (index_of(1) > index_of(0)) std::swap(sides[0], sides[1]);
    for (int side : sides) {
      Value* y = add.input(static_cast<size_t>(side));
      Value* z = add.input(static_cast<size_t>(1 - side));
      Node* conv = y ? y->producer : nullptr;
      if (!is_op(conv, "Conv") && !is_kiln_op(conv, "FusedConv")) continue;
      auto reject = [&](const char* why) {
        ctx.note(fmt::format("{} -> {}: {}", conv->label(), add.label(), why));
      };
      if (!plain_conv(conv)) {
        reject("the convolution already has a residual or activation");
        continue;
      }
      if (!z) continue;
      if (!single_use(ctx.g, y)) {
        reject("the convolution output has another consumer or is a graph output");
        continue;
      }
      if (!broadcasts_into(z->type, y->type)) {
        reject("the residual broadcast may change the shape");
        continue;
      }
      if (!is_float_type(y->type.dtype) || z->type.dtype != y->type.dtype) {
        reject("not a float type");
        continue;
      }
      Attributes a = conv->attrs;
      if (!ctx.backend_supports("kiln", "FusedConv", a, y->type.dtype)) continue;
      return Match{conv, &add, z, std::move(a)};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins = {m.conv->input(0), m.conv->input(1), m.conv->input(2), m.z};
    return replace_with_layer(ctx, {m.conv, m.add}, "kiln", "FusedConv", ins, m.attrs,
                              m.add->output(0))
        .status();
  }
};

// A FusedGemm without activation or residual, or a MatMul by a constant 2-D weight.
bool plain_gemm(const Node* n) {
  if (is_op(n, "MatMul"))
    return n->input(1) && n->input(1)->is_constant() && n->input(1)->type.rank() == 2;
  return is_kiln_op(n, "FusedGemm") && !n->input(3) &&
         n->attrs.get_string("activation", "").empty() && n->attrs.get_int("int8", 0) == 0;
}

// A rank-4 Transpose between channels-last and channels-first (perm 0,3,1,2 or 0,2,3,1): what
// lowering can run as a relabel of channels-last memory (movement.transpose_relabel). Only
// through such a Transpose does the residual go into the product: through another, its two
// Transposes would be copies, one more kernel than the Add they replace.
bool channels_swap(const Node& t) {
  const std::vector<int64_t> p = transpose_perm(t);
  return p == std::vector<int64_t>{0, 3, 1, 2} || p == std::vector<int64_t>{0, 2, 3, 1};
}

struct FuseGemmResidual {
  struct Match {
    Node* gemm;
    Node* add;
    Value* z;
    Attributes attrs;
    Node* transpose = nullptr;  // between the product and the Add
  };

  static std::optional<Match> match(PassContext& ctx, Node& add) {
    if (!is_op(&add, "Add") || add.num_inputs() != 2 || add.input(0) == add.input(1))
      return std::nullopt;
    std::vector<int> sides = {0, 1};  // the later producer takes the Add, as for convolutions
    auto index_of = [&](int s) {
      Value* v = add.input(static_cast<size_t>(s));
      return v && v->producer ? v->producer->index : -1;
    };
    if (index_of(1) > index_of(0)) std::swap(sides[0], sides[1]);
    for (int side : sides) {
      Value* y = add.input(static_cast<size_t>(side));
      Value* z = add.input(static_cast<size_t>(1 - side));
      Node* gemm = y ? y->producer : nullptr;
      Node* t = nullptr;
      if (is_op(gemm, "Transpose") && single_use(ctx.g, y) && gemm->input(0) &&
          channels_swap(*gemm)) {
        t = gemm;
        gemm = t->input(0)->producer;
      }
      Value* product = t ? t->input(0) : y;
      if (!plain_gemm(gemm) || !z || z->is_constant() || !single_use(ctx.g, product)) continue;
      if (!same_dims(z->type, y->type) || !is_float_type(y->type.dtype) ||
          z->type.dtype != y->type.dtype) {
        ctx.note(fmt::format("{} -> {}: the residual does not provably have the product's shape",
                             gemm->label(), add.label()));
        continue;
      }
      Attributes a = gemm->attrs;
      if (is_op(gemm, "MatMul")) a.set("base", Attribute::String("MatMul"));
      if (!ctx.backend_supports("kiln", "FusedGemm", a, y->type.dtype)) continue;
      return Match{gemm, &add, z, std::move(a), t};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins = {m.gemm->input(0), m.gemm->input(1), m.gemm->input(2), m.z};
    if (!m.transpose)
      return replace_with_layer(ctx, {m.gemm, m.add}, "kiln", "FusedGemm", ins, m.attrs,
                                m.add->output(0))
          .status();
    // At the Add's place, in order: z transposed back, the product with it, the Transpose.
    Graph& g = ctx.g;
    const std::vector<int64_t> perm = transpose_perm(*m.transpose);
    std::vector<int64_t> inverse(perm.size());
    for (size_t i = 0; i < perm.size(); ++i) inverse[static_cast<size_t>(perm[i])] = int64_t(i);
    const TensorType product_type = m.transpose->input(0)->type;
    auto place = [&](const std::string& op, const std::string& base, std::vector<Value*> in,
                     const std::string& domain) {
      const std::string name = g.unique_name(base);
      Node* n = g.insert_node_before(m.add, op, name, in, {name}, domain);
      n->origin = ctx.pass;
      n->output(0)->type = product_type;
      return n;
    };
    Node* zt = place("Transpose", m.z->name + "/untransposed", {m.z}, "");
    zt->attrs.set("perm", Attribute::Ints(inverse));
    zt->onnx_nodes = m.add->onnx_nodes;
    ins[3] = zt->output(0);
    Node* f = place("FusedGemm", m.gemm->name, ins, "kiln");
    f->attrs = m.attrs;
    f->onnx_nodes = m.gemm->onnx_nodes;
    merge_onnx_nodes(*f, *m.add);
    Node* t = place("Transpose", m.transpose->name, {f->output(0)}, "");
    t->attrs = m.transpose->attrs;
    t->output(0)->type = m.add->output(0)->type;
    t->onnx_nodes = m.transpose->onnx_nodes;
    Value* out = m.add->output(0);
    KILN_RETURN_IF_ERROR(g.remove_node(m.add, /*force=*/true));
    KILN_RETURN_IF_ERROR(g.remove_node(m.transpose, /*force=*/true));
    KILN_RETURN_IF_ERROR(g.remove_node(m.gemm, /*force=*/true));
    g.set_node_output(t, 0, out);
    g.remove_dead_values();
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fuse_residual_add(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool conv, apply_pattern<FuseResidualAdd>(ctx));
  KILN_ASSIGN_OR_RETURN(bool gemm, apply_pattern<FuseGemmResidual>(ctx));
  return conv || gemm;
}

}  // namespace kiln::passes
