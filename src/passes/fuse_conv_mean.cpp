// A global average pool of a depthwise convolution's output becomes the convolution's second
// output:
//   Conv|kiln.FusedConv(X, W, B?, Z?) -> Y;  GlobalAveragePool(Y) -> M
//     =>  kiln.FusedConvMean(X, W, B?, Z?) -> (Y, M)
// Squeeze-excitation blocks (EfficientNet, MobileNetV3, GhostNet, MnasNet, MixNet) pool the
// output of their depthwise convolution and scale it by the result: the pool read Y back in full
// (9% of EfficientNet-B3's time at batch 32), where the convolution's kernel can sum each output
// as it writes it. Y keeps its other consumers (the scale). Only depthwise convolutions
// (group = C = M), whose kernel is kiln's own, at a float precision (the INT8 stage has no such
// layer), and only where the backend has a kernel for this very layer (the capability query sees
// the filter and strides); a layer no kernel takes at the formats lowering picks is split back
// (unfuse_layer).
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseConvMean {
  struct Match {
    Node* conv;
    Node* pool;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& pool) {
    if (!is_op(&pool, "GlobalAveragePool") || !pool.input(0) || !pool.output(0))
      return std::nullopt;
    Value* y = pool.input(0);
    Node* conv = y->producer;
    if (!is_op(conv, "Conv") && !is_kiln_op(conv, "FusedConv")) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", conv->label(), pool.label(), why));
      return std::nullopt;
    };
    if (ctx.opts.precision == "int8") return reject("INT8 builds keep the pool a layer");
    if (y->producer_index != 0 || conv->num_outputs() != 1) return reject("not the conv's output");
    if (is_kiln_op(conv, "FusedConv") && has_post_steps(*conv))
      return reject("the convolution has post steps");
    if (!is_float_type(y->type.dtype) || y->type.rank() != 4) return reject("not a 2-D float map");
    const Value* w = conv->input(1);
    const int64_t group = conv->attrs.get_int("group", 1);
    if (!w || !w->is_constant() || w->type.rank() != 4 || !w->type.dims ||
        (*w->type.dims)[0].value != group || (*w->type.dims)[1].value != 1 || group < 2)
      return reject("not a depthwise convolution (group = C = M, constant filter)");
    Attributes a = conv->attrs;
    auto layer = scratch_layer("kiln", "FusedConvMean", conv->inputs(), a, y);
    if (!ctx.backend_supports("kiln", "FusedConvMean", a, y->type.dtype, layer->nodes()[0]))
      return std::nullopt;
    return Match{conv, &pool, std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const std::vector<Value*> ins(m.conv->inputs().begin(), m.conv->inputs().end());
    // In the convolution's place: every reader of Y comes after it.
    Node* fused = g.insert_node_before(m.conv, "FusedConvMean", g.unique_name(m.conv->name), ins,
                                       {}, "kiln");
    fused->attrs = m.attrs;
    fused->origin = ctx.pass;
    merge_onnx_nodes(*fused, *m.conv);
    merge_onnx_nodes(*fused, *m.pool);
    Value* y = m.conv->output(0);
    Value* mean = m.pool->output(0);
    const std::string name = m.conv->name;
    KILN_RETURN_IF_ERROR(g.remove_node(m.pool, /*force=*/true));
    KILN_RETURN_IF_ERROR(g.remove_node(m.conv, /*force=*/true));
    g.set_node_output(fused, 0, y);
    g.set_node_output(fused, 1, mean);
    fused->name = name;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fuse_conv_mean(PassContext& ctx) { return apply_pattern<FuseConvMean>(ctx); }

}  // namespace kiln::passes
