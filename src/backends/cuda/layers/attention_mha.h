// kiln.MultiHeadAttention's problem as the GPU tactics see it (layers/attention_mha.cu, and
// layers/attention_cudnn.cpp): batch, lengths, heads, head sizes, where each head's rows live in
// Q, K and V (separate or packed), and how the additive mask broadcasts over the scores.
#pragma once

#include <array>
#include <span>

#include "layer.h"

namespace kiln::gpu {

// The layer's problem: batch, lengths, heads, head sizes and where each head's rows live.
struct MhaShape {
  // Hkv: key/value heads (grouped-query attention: query head h reads key/value head
  // h / (H / Hkv); Hkv = H without it).
  int64_t B = 0, Sq = 0, Sk = 0, H = 0, Hkv = 0, D = 0, Dv = 0;
  // Element offsets of head 0's first element and the row strides of Q, K, V in their inputs
  // (packed: all three in input 0).
  int64_t q_off = 0, k_off = 0, v_off = 0;
  int64_t q_row = 0, k_row = 0, v_row = 0;
  bool packed = false;
  bool seq_first = false;      // Q, K, V and Y are [S, B, ..] (seq_first = 1)
  bool kv_head_major = false;  // K and V are [B, Hkv, Sk, D] and [B, Hkv, Sk, Dv] (a KV cache)
  // Element strides between batches and between positions of a tensor of rows of `row`
  // elements and S positions.
  int64_t batch_stride(int64_t S, int64_t row) const { return seq_first ? row : S * row; }
  int64_t seq_stride(int64_t row) const { return seq_first ? B * row : row; }
  // Element strides between batches, positions and heads of Q (i = 0), K (1) or V (2).
  int64_t stride_b(int i) const {
    return major(i) ? Hkv * Sk * width(i) : batch_stride(i ? Sk : Sq, row(i));
  }
  int64_t stride_s(int i) const { return major(i) ? width(i) : seq_stride(row(i)); }
  int64_t stride_h(int i) const { return major(i) ? Sk * width(i) : width(i); }

 private:
  bool major(int i) const { return i > 0 && kv_head_major; }
  int64_t row(int i) const { return i == 0 ? q_row : i == 1 ? k_row : v_row; }
  int64_t width(int i) const { return i == 2 ? Dv : D; }
};

// Reads the layer's shapes (Q, K, V or packed QKV, and Y) into an MhaShape; an error names the
// node and what does not fit.
Expected<MhaShape> mha_shape(const Node& n, std::span<const DeviceTensor> in,
                             const DeviceTensor& y);

// Element strides of the mask over [B, H, Sq, Sk] (0 where it broadcasts).
Expected<std::array<int64_t, 4>> mask_strides(const Node& n, const DeviceTensor& m,
                                              const MhaShape& s);

// The checks mha.flash and mha.cudnn share: FP16 Q, K, V (or packed QKV), a float16 or float32
// mask, head sizes known at build time (*dq for Q and K, *dv for V); false with `why` otherwise.
bool mha_f16_head_sizes(const LayerDesc& d, int64_t* dq, int64_t* dv, std::string* why);

}  // namespace kiln::gpu
