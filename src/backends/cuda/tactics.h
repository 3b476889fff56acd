// The tactic families: each layers/<family>.cu defines one table of TacticDefs; tactic_table.cpp
// joins them into the backend's one table (as src/ops/registry.cpp does for ops).
#pragma once

#include <span>

#include "layer.h"

namespace kiln::gpu {

std::span<const TacticDef> reformat_tactics();     // layers/reformat.cu: layout/type conversion
std::span<const TacticDef> elementwise_tactics();  // layers/elementwise*.cu: unary, binary,
                                                   // variadic, Where, Clip, Cast, activations,
                                                   // kiln.ElementwiseChain
std::span<const TacticDef> movement_tactics();     // layers/movement*.cu: Reshape family,
                                                   // Transpose, Slice, Concat, Split, Gather*,
                                                   // Pad, Tile, Expand, Resize, DepthToSpace, ...
std::span<const TacticDef> relayout_tactics();     // layers/relayout.cu: kiln.Relayout (a region
                                                   // of layout ops as one gather)
std::span<const TacticDef> reduce_tactics();       // layers/reduce*.cu: Reduce*, ArgMax/Min,
                                                   // Softmax family, norms, TopK, CumSum, Q/DQ
std::span<const TacticDef> groupnorm_tactics();  // layers/groupnorm_nhwc.cu: GroupNormalization
                                                 // and kiln.FusedGroupNorm in NHWC
std::span<const TacticDef> layernorm_rows_tactics();  // layers/layernorm_rows.cu: LayerNorm
                                                      // over the last axis, kiln.SkipLayerNorm
std::span<const TacticDef> conv_tactics();         // layers/conv*.cpp: Conv, ConvTranspose,
                                                   // kiln.FusedConv (cuDNN, cuBLASLt)
std::span<const TacticDef> int8_library_conv_tactics();  // layers/conv_int8_lib.cpp: the
                                                   // library INT8 convs (after kiln's own)
std::span<const TacticDef> pool_tactics();         // layers/pool.cu
std::span<const TacticDef> data_dependent_tactics();  // layers/data_dependent.cu: NonZero
                                                   // (sizes read back), If, Loop, Scan
std::span<const TacticDef> gemm_tactics();         // layers/gemm.cpp: Gemm, MatMul, FusedGemm,
                                                   // kiln.Attention, ONNX Attention
std::span<const TacticDef> rnn_tactics();          // layers/rnn.cu: LSTM, GRU, RNN
std::span<const TacticDef> sampling_tactics();     // layers/grid_sample.cu, roi_align.cu:
                                                   // GridSample, RoiAlign

}  // namespace kiln::gpu
