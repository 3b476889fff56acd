// A constant bias added to a matrix product becomes the product's bias:
//   MatMul(a, b) -> Add(., bias)  =>  kiln.FusedGemm[base=MatMul](a, b, bias)
//   Gemm(a, b)   -> Add(., bias)  =>  kiln.FusedGemm[base=Gemm, beta=1](a, b, bias)  (no C)
// Only when the bias broadcasts into the product without changing its shape, and the product
// has no other consumer.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseMatMulAdd {
  struct Match {
    Node* mm;
    Node* add;
    Value* bias;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& add) {
    if (!is_op(&add, "Add") || add.num_inputs() != 2) return std::nullopt;
    for (int side = 0; side < 2; ++side) {
      Value* y = add.input(static_cast<size_t>(side));
      Value* bias = add.input(static_cast<size_t>(1 - side));
      Node* mm = y ? y->producer : nullptr;
      const bool gemm = is_op(mm, "Gemm") && !mm->input(2);
      if (!is_op(mm, "MatMul") && !gemm) continue;
      auto reject = [&](const char* why) {
        ctx.note(fmt::format("{} -> {}: {}", mm->label(), add.label(), why));
        return std::nullopt;
      };
      if (!bias || !bias->is_constant()) return reject("the addend is not a constant bias");
      if (!single_use(ctx.g, y))
        return reject("the product has another consumer or is a graph output");
      if (!broadcasts_into(bias->type, y->type))
        return reject("the bias broadcast may change the shape");
      if (!is_float_type(y->type.dtype) || bias->type.dtype != y->type.dtype)
        return reject("not a float type");
      Attributes a;
      if (gemm) {
        a = mm->attrs;
        a.set("beta", Attribute::Float(1.f));
      }
      a.set("base", Attribute::String(mm->op_type));
      if (!ctx.backend_supports("kiln", "FusedGemm", a, y->type.dtype)) return std::nullopt;
      return Match{mm, &add, bias, std::move(a)};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, {m.mm, m.add}, "kiln", "FusedGemm",
                              {m.mm->input(0), m.mm->input(1), m.bias}, m.attrs, m.add->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_matmul_add(PassContext& ctx) { return apply_pattern<FuseMatMulAdd>(ctx); }

}  // namespace kiln::passes
