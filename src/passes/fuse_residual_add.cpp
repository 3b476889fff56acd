// A residual Add joins the convolution or matrix product that produces one of its operands:
//   Conv(x, W, b) -> Add(., z)  =>  kiln.FusedConv(x, W, b, z)        (z: the other operand)
//   FusedGemm(a, B, c) -> Add(., z)  =>  kiln.FusedGemm(a, B, c, z)  (also MatMul with a
//                                        constant B: a transformer's projection + residual)
// Only when the product's output has no other consumer and carries no activation yet (the
// layer computes act(conv + z)); z must not broadcast the result to a bigger shape (for
// FusedGemm it has the result's shape exactly: the GEMM epilogue reads it as a matrix).
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A Conv, or a FusedConv without residual and activation.
bool plain_conv(const Node* n) {
  if (is_op(n, "Conv")) return true;
  return is_kiln_op(n, "FusedConv") && !n->input(3) &&
         n->attrs.get_string("activation", "").empty();
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

struct FuseGemmResidual {
  struct Match {
    Node* gemm;
    Node* add;
    Value* z;
    Attributes attrs;
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
      if (!plain_gemm(gemm) || !z || z->is_constant() || !single_use(ctx.g, y)) continue;
      if (!same_dims(z->type, y->type) || !is_float_type(y->type.dtype) ||
          z->type.dtype != y->type.dtype) {
        ctx.note(fmt::format("{} -> {}: the residual does not provably have the product's shape",
                             gemm->label(), add.label()));
        continue;
      }
      Attributes a = gemm->attrs;
      if (is_op(gemm, "MatMul")) a.set("base", Attribute::String("MatMul"));
      if (!ctx.backend_supports("kiln", "FusedGemm", a, y->type.dtype)) continue;
      return Match{gemm, &add, z, std::move(a)};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins = {m.gemm->input(0), m.gemm->input(1), m.gemm->input(2), m.z};
    return replace_with_layer(ctx, {m.gemm, m.add}, "kiln", "FusedGemm", ins, m.attrs,
                              m.add->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_residual_add(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool conv, apply_pattern<FuseResidualAdd>(ctx));
  KILN_ASSIGN_OR_RETURN(bool gemm, apply_pattern<FuseGemmResidual>(ctx));
  return conv || gemm;
}

}  // namespace kiln::passes
