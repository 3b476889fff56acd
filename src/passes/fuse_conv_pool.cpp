// A CNN's stem joins the max-pool that follows it:
//   kiln.FusedConv(X, W, B?) (no residual) -> MaxPool  =>  kiln.FusedConvPool(X, W, B?)
// with MaxPool's attributes stored prefixed "pool_". The pooled layer never writes the full
// convolution output (ResNet-50 at batch 256: 411 MB in FP16 written and read back). Only when
// MaxPool is 2-D with one output (no Indices), the convolution's output has no other consumer,
// and the target backend has a kernel that takes this very layer (the capability query sees the
// layer's weights and shapes, since kernels for it exist only for some: cuda's stem kernel takes
// few input channels in FP16).
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseConvPool {
  struct Match {
    Node* conv;
    Node* pool;
    std::vector<Value*> inputs;  // X, W, B?: the convolution's, without the residual slot
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& pool) {
    if (!is_op(&pool, "MaxPool") || !pool.input(0) || pool.num_outputs() != 1) return std::nullopt;
    Value* y = pool.input(0);
    Node* conv = y->producer;
    if (!is_kiln_op(conv, "FusedConv")) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", conv->label(), pool.label(), why));
      return std::nullopt;
    };
    if (conv->num_inputs() > 3 && conv->input(3)) return reject("the convolution adds a residual");
    if (has_post_steps(*conv)) return reject("the convolution has post steps");
    if (!single_use(ctx.g, y)) return reject("the convolution's output has another consumer");
    if (y->type.rank() != 4 || !pool.output(0)) return reject("not a 2-D max-pool");
    Attributes a = conv->attrs;
    copy_attrs_prefixed(pool.attrs, a, "pool_");
    std::vector<Value*> ins(conv->inputs().begin(), conv->inputs().end());
    ins.resize(std::min<size_t>(ins.size(), 3));
    auto layer = scratch_layer("kiln", "FusedConvPool", ins, a, pool.output(0));
    if (!ctx.backend_supports("kiln", "FusedConvPool", a, y->type.dtype, layer->nodes()[0]))
      return std::nullopt;
    return Match{conv, &pool, std::move(ins), std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, {m.conv, m.pool}, "kiln", "FusedConvPool", m.inputs, m.attrs,
                              m.pool->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_conv_pool(PassContext& ctx) { return apply_pattern<FuseConvPool>(ctx); }

}  // namespace kiln::passes
