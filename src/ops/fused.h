// kiln's fused layers (domain "kiln"), produced by the optimizer (src/passes) and run by every
// backend that declares them (backends/capabilities.h):
//
//   kiln.FusedConv(X, W, B?, Z?)        Y = post(act(Conv(X, W, B) + Z))   Conv's attributes;
//                                       post: the steps post_ops (strings) with post_values
//                                       (floats, one a step) in order, y = op(y, value) for a
//                                       binary op, op(y) for a unary one (post_op_supported):
//                                       an elementwise tail with scalar constants (StarReLU's
//                                       square, scale and bias) computed in the epilogue
//   kiln.FusedConvPool(X, W, B?)        Y = MaxPool(act(Conv(X, W, B)))   Conv's attributes, and
//                                       MaxPool's prefixed "pool_" (pool_kernel_shape,
//                                       pool_strides, pool_pads): a CNN's stem with its max-pool
//   kiln.FusedConvPair(X, W, B?, X2, W2, B2?)
//                                       Y = act(Conv(X, W, B) + Conv(X2, W2, B2))   the first
//                                       Conv's attributes, the second's prefixed "conv2_"
//                                       (conv2_strides, conv2_pads, ...); both outputs must have
//                                       the same shape (no broadcasting): ResNet's first block
//                                       of a stage, its last 1x1 conv and the downsample, with
//                                       the Add and ReLU. Made only from INT8 layers
//                                       (passes/fuse_conv_pair.cpp); int8 = 1: both convs in INT8
//   kiln.FusedGemm(A, B, C?, R?)        base = "Gemm":   Y = act(Gemm(A, B, C) + R)  Gemm's
//   attributes
//                                       base = "MatMul": Y = act(MatMul(A, B) + C + R)
//                                       R: a residual of Y's shape (no broadcasting)
//   kiln.ElementwiseChain(x0, x1, ...)  a straight program of elementwise ops (see below)
//   kiln.Attention(Q, Kt, V, mask?)     Y = Softmax(Q @ Kt * scale + mask, axis=-1) @ V
//                                       (nan_to_zero = 1: NaN probabilities, from fully
//                                       masked rows, count as 0, as SDPA's export does)
//   kiln.MultiHeadAttention(Q, K?, V?, mask?, cos_cache?, sin_cache?, position_ids?)
//                                       Y = merge(Attention(split(Q), split(K)^T, split(V), mask))
//                                       Q [B, Sq, H*D], K [B, Sk, Hkv*D], V [B, Sk, Hkv*Dv],
//                                       Y [B, Sq, H*Dv]: split makes [B, H, S, D] of [B, S, H*D]
//                                       (Reshape + Transpose), merge undoes it; attributes
//                                       num_heads (H), kv_heads (Hkv, default H, dividing H:
//                                       grouped-query attention, query head h reads K/V head
//                                       h / (H/Hkv)), scale, nan_to_zero as kiln.Attention;
//                                       packed = 1: Q holds Q, K and V side by side
//                                       ([B, S, (H+2*Hkv)*D], one projection's output) and K, V
//                                       are absent; seq_first = 1: Q, K, V and Y are
//                                       [S, B, ..] (nn.MultiheadAttention's sequence-first
//                                       layout). The mask is added to the [B, H, Sq, Sk] scores.
//                                       With cos_cache and sin_cache (both or neither): the
//                                       rotary embedding on Q and K first, as RotaryEmbedding
//                                       (opset 23, its float16 roundings) computes it with these
//                                       caches, position_ids and interleaved = attribute
//                                       rotary_interleaved, over the whole head (R = D):
//                                       packed, RotaryEmbedding(Q, num_heads = H + 2*Hkv,
//                                       kiln_head_begin = 0, kiln_head_end = H + Hkv), i.e. Q's
//                                       and K's heads; else RotaryEmbedding(Q, num_heads = H)
//                                       and RotaryEmbedding(K, num_heads = Hkv). Not with
//                                       seq_first (fuse_rotary's RotaryIntoAttention makes it).
//                                       col_slices (ints, two per Q, K, V: start, width; not
//                                       packed, no rotary): input i is read as its last axis'
//                                       columns [start, start + width) (width 0: all of it), a
//                                       part of a wider tensor read in place (pack_qkv's
//                                       ReadPartsInPlace: cross-attention K and V of one GEMM
//                                       packing every layer's K and V projections);
//                                       kv_head_major = 1 (not packed, seq_first, rotary or
//                                       K's and V's col_slices): K [B, Hkv, Sk, D] and V [B, Hkv,
//                                       Sk, Dv] already split into heads, a KV cache's layout
//                                       (Concat(past, new) of a decoder exported with its cache)
//   kiln.SkipLayerNorm(X, Skip, Scale, B?) -> (Y, Sum?)
//                                       Sum = X + Skip (same shape); Y = LayerNormalization(Sum,
//                                       Scale, B) over the last axis (epsilon, stash_type as
//                                       LayerNormalization); Sum is an output only when the
//                                       graph reads it (a pre-norm transformer's residual)
//   kiln.Relayout(x0, x1, ...)          a region of layout ops (Transpose, Reshape, Squeeze,
//                                       Unsqueeze, Flatten, Slice, Concat, Pad, Expand) with one
//                                       result, as one layer (see below)
//   kiln.FusedGroupNorm(X, scale, bias, addend?)
//                                       Y = act(GroupNormalization(X + addend, scale, bias))
//                                       num_groups, epsilon (scale and bias per channel, as
//                                       opset 21); the addend broadcasts over the spatial axes
//                                       only ([N or 1, C or 1, 1, ...]: a diffusion UNet's
//                                       timestep embedding); activation as below (fused_norm.cpp)
//   kiln.Reformat(X)                    Y = X; placed by a backend where the storage format
//                                       (type, layout) changes between layers
//
// Activation: attribute `activation` holds the ONNX op type ("" = none; one of
// fused_activation_names()), and its attributes are stored with the prefix "act_" (act_alpha
// for LeakyRelu, act_approximate for Gelu). Clip's bounds are the floats act_min / act_max.
//
// ElementwiseChain: `ops` (strings) lists the steps; `arity` (ints) the number of operands of
// each; `operands` (ints, flattened) says where each operand comes from: k >= 0 is external
// input k, -1 the previous step's result, -2 an absent optional input. Step i's attributes are
// stored with the prefix "s<i>_". The result is the last step's. With `concat_parts` = m >= 2
// (and `concat_axis`), inputs 0..m-1 are the parts of a concatenation along that axis, which
// operand 0 reads (a Concat absorbed into the chain: its parts are read in place, the
// concatenation never written); operands 1..m-1 are then invalid and k >= m is input k.
// With `col_slices` (ints, two per input: start, width), input k is read as its columns
// [start, start + width) of the last axis (width 0: the whole input): the chain reads a column
// range of a wider tensor in place (a part of pack_gemm's packed GEMM, fuse_elementwise's
// AbsorbSplit). Not on a concatenation's parts.
//
// Relayout: `ops`, `arity` and `operands` as ElementwiseChain's, but the steps form a DAG: an
// operand k >= 0 is input k, k <= -2 the result of (earlier) step -2 - k, and -1 the step's
// constant, the tensor attribute s<i>_c<j> for operand j of step i (a Slice's starts, a
// Reshape's shape, a Pad's pads), or an absent optional input where there is none. Step i's
// other attributes are prefixed "s<i>_". The result is the last step's. Swin's cyclic shift
// (Slice, Slice, Concat twice) and window partition (Reshape, Transpose, Reshape) make one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

// Activations fused layers apply (ONNX op types).
const std::vector<std::string>& fused_activation_names();
bool fused_activation_supported(const std::string& op_type);
// Ops a FusedConv's post step may be: the first kPostOpsBinary take a scalar operand
// (post_values). The GPU tactics number their steps by position in this table (cuda::PostOp).
inline constexpr std::string_view kPostOps[] = {"Add",  "Sub",     "Mul",  "Div", "Pow",
                                                "Max",  "Min",     "Relu", "Sigmoid", "Tanh",
                                                "Neg",  "Abs",     "Exp",  "Sqrt", "Erf"};
inline constexpr int kPostOpsBinary = 7;
// op_type's position in kPostOps, or -1 where a post step cannot be that op.
int post_op_index(std::string_view op_type);
bool post_op_supported(const std::string& op_type);
bool post_op_binary(const std::string& op_type);
// Whether n (a kiln.FusedConv) has post steps: nothing more joins its epilogue after them.
inline bool has_post_steps(const Node& n) { return n.attrs.has("post_ops"); }
// Ops an ElementwiseChain step may be.
bool chain_op_supported(const std::string& op_type);
// The most parts a chain's absorbed concatenation may have (ElementwiseChain's concat_parts).
constexpr int64_t kMaxChainConcatParts = 64;
// Ops a Relayout step may be.
bool relayout_op_supported(const std::string& op_type);
// The types of a kiln.Relayout's steps: ops/relayout_types.h.
// Whether kiln's CPU kernels run this fused layer with these attributes.
bool fused_layer_supported(const std::string& op_type, const Attributes& attrs);

// Whether kiln.MultiHeadAttention `n` applies the rotary embedding to Q and K (its cos_cache
// and sin_cache, inputs 4 and 5, are present).
bool mha_has_rotary(const Node& n);
// kiln.MultiHeadAttention `n`'s columns of input `slot` (0 Q, 1 K, 2 V): {start, width} from
// its col_slices, or {0, 0} (the whole input).
std::pair<int64_t, int64_t> mha_col_slice(const Node& n, int slot);

// Splits a float kiln.FusedConv or kiln.FusedGemm back into the ops it fuses, in its CPU
// kernel's order (Conv | MatMul [+ Add(C)] | Gemm, then Add(Z or R), then the activation), in its
// place; the last op writes the layer's output value. A kiln.MultiHeadAttention with the rotary
// (mha_has_rotary) becomes the RotaryEmbedding(s) on Q and K and the attention without it; a
// kiln.FusedConvMean the FusedConv and a GlobalAveragePool of its output; a kiln.FusedGroupNorm
// its Add, GroupNormalization and activation. For a
// backend that has no kernel for the fused form (a residual that broadcasts, an activation no
// epilogue computes, a rotary only one attention kernel applies).
Status unfuse_layer(Graph& g, Node* n);

}  // namespace kiln
