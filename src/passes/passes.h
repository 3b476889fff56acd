// Every optimizer pass, one file each (src/passes/<name>.cpp). Each returns whether it changed
// the graph; pipeline.cpp runs them in order.
#pragma once

#include "passes/rewrite.h"

namespace kiln::passes {

Expected<bool> fold_constants(PassContext& ctx);
Expected<bool> fold_if(PassContext& ctx);
Expected<bool> loop_concat_to_scan(PassContext& ctx);
Expected<bool> batch_select_topk(PassContext& ctx);
Expected<bool> remove_noops(PassContext& ctx);
Expected<bool> detach_shapes(PassContext& ctx);
Expected<bool> merge_duplicates(PassContext& ctx);
Expected<bool> cancel_transposes(PassContext& ctx);
Expected<bool> fold_reshape_transpose(PassContext& ctx);
Expected<bool> eliminate_dead_code(PassContext& ctx);
Expected<bool> fold_batchnorm(PassContext& ctx);
Expected<bool> fold_pad_into_conv(PassContext& ctx);
Expected<bool> reduce_to_global_pool(PassContext& ctx);
Expected<bool> dft_to_matmul(PassContext& ctx);
Expected<bool> col2im_to_conv_transpose(PassContext& ctx);
Expected<bool> deform_conv_to_grid_sample(PassContext& ctx);
Expected<bool> lrn_to_conv(PassContext& ctx);
Expected<bool> one_hot_to_equal(PassContext& ctx);
Expected<bool> qoperator_to_qdq(PassContext& ctx);
Expected<bool> max_unpool_to_scatter(PassContext& ctx);
Expected<bool> lp_pool_to_average(PassContext& ctx);
Expected<bool> compress_to_gather(PassContext& ctx);
Expected<bool> fuse_layernorm(PassContext& ctx);
Expected<bool> fuse_rmsnorm(PassContext& ctx);
Expected<bool> fuse_groupnorm(PassContext& ctx);
Expected<bool> fuse_gelu(PassContext& ctx);
Expected<bool> fuse_swish(PassContext& ctx);
Expected<bool> fuse_groupnorm_act(PassContext& ctx);
Expected<bool> fold_periodic_add(PassContext& ctx);
Expected<bool> unflatten_batched_matmul(PassContext& ctx);
Expected<bool> fuse_attention(PassContext& ctx);
Expected<bool> map_onnx_attention(PassContext& ctx);
Expected<bool> fold_gemm_reshape(PassContext& ctx);
Expected<bool> fold_patch_conv(PassContext& ctx);
Expected<bool> sink_spatial_flatten(PassContext& ctx);
Expected<bool> fuse_matmul_add(PassContext& ctx);
Expected<bool> fold_channel_scale(PassContext& ctx);
Expected<bool> regroup_head_parts(PassContext& ctx);
Expected<bool> fuse_rotary(PassContext& ctx);
Expected<bool> rotary_before_heads(PassContext& ctx);
Expected<bool> slices_to_split(PassContext& ctx);
Expected<bool> image_attention(PassContext& ctx);
Expected<bool> fold_attention_heads(PassContext& ctx);
Expected<bool> sink_transposes(PassContext& ctx);
Expected<bool> pack_gemm(PassContext& ctx);
Expected<bool> pack_qkv(PassContext& ctx);
Expected<bool> fuse_attention_rotary(PassContext& ctx);
Expected<bool> drop_zero_mask(PassContext& ctx);
Expected<bool> narrow_attention_mask(PassContext& ctx);
Expected<bool> fuse_residual_add(PassContext& ctx);
Expected<bool> fuse_skip_layernorm(PassContext& ctx);
Expected<bool> fuse_conv_act(PassContext& ctx);
Expected<bool> fuse_conv_pool(PassContext& ctx);  // after fuse_conv_act: the stem's activation first
Expected<bool> fuse_conv_mean(PassContext& ctx);  // after fuse_conv_act: the conv's activation first
Expected<bool> fuse_conv_tail(PassContext& ctx);  // after fuse_conv_act: the activation first
Expected<bool> batchnorm_to_affine(PassContext& ctx);
Expected<bool> fuse_elementwise(PassContext& ctx);
Expected<bool> fuse_relayout(PassContext& ctx);
// The INT8 stage (after the layers are marked INT8; optimize_int8_graph):
Expected<bool> fuse_conv_pair(PassContext& ctx);

// The kiln.FusedConvPair fuse_conv_pair makes of FusedConv A and FusedConv B (B's residual is
// A's output): inputs (A.X, A.W, A.B, B.X, B.W, B.B), A's convolution attributes unprefixed, B's
// prefixed "conv2_", B's activation and act_*, int8 = 1.
struct ConvPairLayer {
  std::vector<Value*> inputs;
  Attributes attrs;
};
ConvPairLayer conv_pair_layer(const Node& a, const Node& b);

}  // namespace kiln::passes
