// Transformer layers: kiln.MultiHeadAttention (layers/attention_mha.cu: packed and separate Q, K,
// V, or K and V head-major as a KV cache holds them; grouped-query attention; head sizes that are multiples of 8 up to 256 for mha.flash (other
// than 32, 64 and 128 gated until run on a GPU), others for mha.unfused;
// no mask, a padding mask, a full [B, 1, Sq, Sk] mask, causal -inf masks, fully masked rows; the
// rotary on Q and K (mha.flash only); sequence tails and several key
// tiles; cross attention; mha.unfused's scores in chunks under small workspace limits),
// kiln.SkipLayerNorm and the last-axis LayerNorm and RMSNorm
// (layers/layernorm_rows.cu), and kiln.FusedGemm with a residual and MatMul by a constant weight
// (layers/gemm_lt.cpp, and the cuBLAS layer with its epilogue; CUTLASS's layers/gemm_cutlass.cpp
// with the erf GELU).
#include <limits>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

using Modes = std::vector<std::string>;
const Modes kModes = {"fp32", "tf32", "fp16"};

Attribute I(int64_t v) { return Attribute::Int(v); }
Attribute F(float v) { return Attribute::Float(v); }
Attribute S(const char* v) { return Attribute::String(v); }

struct Mha {
  std::string name;
  int64_t B = 2, Sq = 5, Sk = 5, H = 2, D = 64;
  int64_t Hkv = 0;  // key/value heads (grouped-query attention); 0: H
  bool packed = false;
  bool seq_first = false;  // Q, K, V and Y [S, B, ..]
  bool head_major = false;  // K and V [B, Hkv, Sk, D]: a KV cache (kv_head_major)
  CaseInput mask = absent();
  int nan_to_zero = 0;
  // The rotary on Q and K (inputs 4 to 6): caches [S, D/2] (cache_batch 0) or [cache_batch, S,
  // D/2], or with position ids [B, S] caches of S + 9 rows; interleaved pairs.
  bool rotary = false;
  int64_t cache_batch = 0;
  bool pos = false;
  bool interleaved = false;
  // The engine's workspace limit (0: the default): mha.unfused's copies of the heads plus less
  // than its scores need, so that they run in chunks (layers/attention_chunks.h).
  size_t workspace = 0;
};

OpCase mha(const Mha& m) {
  std::vector<CaseInput> ins;
  const int64_t hkv = m.Hkv ? m.Hkv : m.H;
  auto rows = [&](int64_t s, int64_t n) {
    return m.seq_first ? std::vector<int64_t>{s, m.B, n} : std::vector<int64_t>{m.B, s, n};
  };
  if (m.packed) {
    ins = {in(rows(m.Sq, (m.H + 2 * hkv) * m.D)), absent(), absent()};
  } else if (m.head_major) {
    ins = {in(rows(m.Sq, m.H * m.D)), in({m.B, hkv, m.Sk, m.D}), in({m.B, hkv, m.Sk, m.D})};
  } else {
    ins = {in(rows(m.Sq, m.H * m.D)), in(rows(m.Sk, hkv * m.D)), in(rows(m.Sk, hkv * m.D))};
  }
  if (!m.mask.absent || m.rotary) ins.push_back(m.mask);
  if (m.rotary) {
    const int64_t half = m.D / 2, rows = m.pos ? m.Sq + 9 : m.Sq;
    std::vector<int64_t> cache = {rows, half};
    if (!m.pos && m.cache_batch) cache.insert(cache.begin(), m.cache_batch);
    ins.push_back(in(cache));  // cos and sin: values in [-1, 1]
    ins.push_back(in(cache));
    if (m.pos) {  // positions scattered over the caches' rows, batch by batch
      std::vector<double> ids;
      for (int64_t b = 0; b < m.B; ++b)
        for (int64_t s = 0; s < m.Sq; ++s)
          ids.push_back(static_cast<double>((5 * s + 3 * b) % rows));
      ins.push_back(fixed({m.B, m.Sq}, ids, DataType::kInt64));
    }
  }
  Attributes a = attrs({{"num_heads", I(m.H)},
                        {"scale", F(1.f / std::sqrt(static_cast<float>(m.D)))},
                        {"nan_to_zero", I(m.nan_to_zero)}});
  if (m.packed) a.set("packed", I(1));
  if (m.Hkv) a.set("kv_heads", I(m.Hkv));
  if (m.seq_first) a.set("seq_first", I(1));
  if (m.head_major) a.set("kv_head_major", I(1));
  if (m.interleaved) a.set("rotary_interleaved", I(1));
  // Inputs in [-2, 2]: scores wide enough that the softmax is not near uniform (the caches stay
  // in [-1, 1]).
  for (size_t i = 0; i < ins.size() && i < 4; ++i)
    if (!ins[i].absent && !ins[i].value) ins[i].lo = -2, ins[i].hi = 2;
  // With the rotary only mha.flash runs the layer (FP16); the others refuse it.
  OpCase c = make_case("mha_" + m.name, "MultiHeadAttention", std::move(a), std::move(ins),
                       m.rotary ? Modes{"fp16"} : Modes{"fp32", "fp16"}, "kiln");
  c.workspace_limit = m.workspace;
  return c;
}

// A key-padding mask [B, 1, 1, S] as BERT's export adds it, random in [-6, 0].
CaseInput padding(int64_t b, int64_t s) { return in({b, 1, 1, s}, DataType::kFloat32, -6, 0); }

// A causal mask [1, 1, S, S] (0 on and below the diagonal, -inf above), as GPT-2's export
// computes it; `full_row` also masks every key of that row.
CaseInput causal(int64_t s, int64_t full_row = -1) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<double> m(static_cast<size_t>(s * s), 0.0);
  for (int64_t i = 0; i < s; ++i)
    for (int64_t j = 0; j < s; ++j)
      if (j > i || i == full_row) m[static_cast<size_t>(i * s + j)] = ninf;
  return fixed({1, 1, s, s}, m);
}

// The rotary applied by the attention (fuse_attention_rotary's form): grouped-query and plain
// heads, head sizes 32, 64 and 128, lengths that are not a multiple of a tile, caches with and
// without a batch axis, position ids, interleaved pairs, packed and separate Q, K, V.
void mha_rotary_cases(std::vector<OpCase>& v) {
  v.push_back(mha({.name = "rope_gqa_d64_s37",
                   .B = 2,
                   .Sq = 37,
                   .Sk = 37,
                   .H = 4,
                   .D = 64,
                   .Hkv = 2,
                   .packed = true,
                   .mask = padding(2, 37),
                   .rotary = true}));
  v.push_back(mha({.name = "rope_gqa_d128_s130_pos",
                   .B = 2,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 4,
                   .D = 128,
                   .Hkv = 1,
                   .packed = true,
                   .rotary = true,
                   .pos = true}));
  v.push_back(mha({.name = "rope_mha_d64_s130_batch_caches",
                   .B = 2,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 3,
                   .D = 64,
                   .packed = true,
                   .mask = causal(130),
                   .rotary = true,
                   .cache_batch = 2}));
  v.push_back(mha({.name = "rope_mha_d128_s37_pos_interleaved",
                   .B = 2,
                   .Sq = 37,
                   .Sk = 37,
                   .H = 2,
                   .D = 128,
                   .packed = true,
                   .rotary = true,
                   .pos = true,
                   .interleaved = true}));
  v.push_back(mha({.name = "rope_gqa_d64_s130_interleaved",
                   .B = 2,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 4,
                   .D = 64,
                   .Hkv = 2,
                   .packed = true,
                   .mask = padding(2, 130),
                   .rotary = true,
                   .cache_batch = 1,
                   .interleaved = true}));
  v.push_back(mha({.name = "rope_gqa_d64_s37_separate",
                   .B = 2,
                   .Sq = 37,
                   .Sk = 37,
                   .H = 4,
                   .D = 64,
                   .Hkv = 2,
                   .mask = causal(37),
                   .rotary = true,
                   .pos = true}));
  v.push_back(mha({.name = "rope_d32_s37",
                   .B = 2,
                   .Sq = 37,
                   .Sk = 37,
                   .H = 2,
                   .D = 32,
                   .packed = true,
                   .rotary = true}));
  // Enough (batch, head) blocks that the default variant takes 64 rows a block (4 warps) and
  // rows128 takes 128 (8 warps) on an H100.
  v.push_back(mha({.name = "rope_gqa_d64_s260_wide",
                   .B = 4,
                   .Sq = 260,
                   .Sk = 260,
                   .H = 24,
                   .D = 64,
                   .Hkv = 8,
                   .packed = true,
                   .mask = padding(4, 260),
                   .rotary = true}));
}

void mha_cases(std::vector<OpCase>& v) {
  v.push_back(
      mha({.name = "d64_packed_nomask", .B = 2, .Sq = 77, .Sk = 77, .H = 3, .packed = true}));
  v.push_back(mha({.name = "d64_padding",
                   .B = 3,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 2,
                   .mask = padding(3, 130)}));
  v.push_back(mha({.name = "d128_full_mask",
                   .B = 2,
                   .Sq = 64,
                   .Sk = 64,
                   .H = 2,
                   .D = 128,
                   .mask = in({2, 1, 64, 64})}));
  v.push_back(mha({.name = "d64_causal_long",
                   .B = 1,
                   .Sq = 300,
                   .Sk = 300,
                   .H = 2,
                   .packed = true,
                   .mask = causal(300)}));
  // Enough heads x 128-row blocks to fill an H100 (132 SMs): the "rows128" variant runs 8 warps.
  v.push_back(mha({.name = "d64_rows128_padding",
                   .B = 12,
                   .Sq = 200,
                   .Sk = 200,
                   .H = 12,
                   .packed = true,
                   .mask = padding(12, 200)}));
  v.push_back(mha(
      {.name = "d128_rows128", .B = 10, .Sq = 129, .Sk = 129, .H = 14, .D = 128, .packed = true}));
  v.push_back(mha({.name = "d64_one_token", .B = 4, .Sq = 1, .Sk = 1, .H = 4, .packed = true}));
  // BERT's and GPT-2's shapes at a small batch, and a key count that is no multiple of 16 with
  // a padding mask.
  v.push_back(mha({.name = "d64_bert_s128",
                   .B = 4,
                   .Sq = 128,
                   .Sk = 128,
                   .H = 12,
                   .packed = true,
                   .mask = padding(4, 128)}));
  v.push_back(mha({.name = "d64_causal_s128",  // GPT-2's shape: whole key groups masked
                   .B = 2,
                   .Sq = 128,
                   .Sk = 128,
                   .H = 4,
                   .packed = true,
                   .mask = causal(128)}));
  v.push_back(mha({.name = "d64_short_tail",
                   .B = 3,
                   .Sq = 100,
                   .Sk = 100,
                   .H = 2,
                   .mask = padding(3, 100)}));
  v.push_back(
      mha({.name = "d64_cross", .B = 2, .Sq = 9, .Sk = 70, .H = 2, .mask = in({2, 2, 9, 70})}));
  // Swin's windows: head size 32, a constant relative-position bias per head [1, H, 49, 49]
  // without nan_to_zero (finite, so no row is removed: mha.cudnn takes it).
  v.push_back(mha({.name = "d32_window_bias",
                   .B = 64,
                   .Sq = 49,
                   .Sk = 49,
                   .H = 3,
                   .D = 32,
                   .packed = true,
                   .mask = konst_random({1, 3, 49, 49}, 3.0)}));
  // An odd number of keys: mha.flash reads the mask key by key, not in pairs.
  v.push_back(
      mha({.name = "d64_cross_odd", .B = 2, .Sq = 9, .Sk = 71, .H = 2, .mask = in({2, 2, 9, 71})}));
  v.push_back(mha(
      {.name = "d128_packed_tail", .B = 1, .Sq = 65, .Sk = 65, .H = 1, .D = 128, .packed = true}));
  for (int nz : {0, 1})
    v.push_back(mha({.name = nz ? "masked_row_nan_to_zero" : "masked_row_nan",
                     .B = 2,
                     .Sq = 6,
                     .Sk = 6,
                     .H = 2,
                     .packed = true,
                     .mask = causal(6, 2),
                     .nan_to_zero = nz}));
  // Head size 32 (Swin, small hierarchical ViTs): a padding mask on 7 keys, a causal mask over
  // three key tiles, and enough 128-row blocks to fill an H100 (rows128).
  v.push_back(mha({.name = "d32_padding_short",
                   .B = 2,
                   .Sq = 7,
                   .Sk = 7,
                   .H = 4,
                   .D = 32,
                   .mask = in({2, 1, 1, 7})}));
  v.push_back(mha({.name = "d32_causal_long",
                   .B = 2,
                   .Sq = 150,
                   .Sk = 150,
                   .H = 2,
                   .D = 32,
                   .mask = causal(150)}));
  v.push_back(mha(
      {.name = "d32_rows128_nomask", .B = 16, .Sq = 140, .Sk = 140, .H = 8, .D = 32, .packed = true}));
  // Grouped-query attention: K and V with fewer heads, each read by H / Hkv query heads
  // (a Llama-style decoder's causal mask; packed Q | K | V of H + 2 Hkv heads; multi-query).
  v.push_back(mha({.name = "gqa_d64_causal",
                   .B = 2,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 6,
                   .Hkv = 2,
                   .mask = causal(130)}));
  v.push_back(mha({.name = "gqa_d128_packed_padding",
                   .B = 3,
                   .Sq = 70,
                   .Sk = 70,
                   .H = 4,
                   .D = 128,
                   .Hkv = 2,
                   .packed = true,
                   .mask = padding(3, 70)}));
  v.push_back(mha({.name = "mqa_d32_cross", .B = 2, .Sq = 9, .Sk = 40, .H = 4, .D = 32, .Hkv = 1}));
  v.push_back(mha({.name = "gqa_d48_unfused", .B = 2, .Sq = 11, .Sk = 11, .H = 4, .D = 48, .Hkv = 2}));
  // Head sizes other than 32, 64 and 128 (mha.flash at the padded width: 24 in 32, 40 in 48,
  // 56 in 64, 80, 104 in 128, 160, 200 in 256, 256): Stable Diffusion's self-attention (packed,
  // several key tiles and a tail) and cross-attention over 77 tokens, masks read element by
  // element and staged, grouped-query heads, a grid small enough for one-warp blocks, and the
  // split kernel (a variant of every case).
  v.push_back(mha({.name = "d40_sd_self", .B = 2, .Sq = 300, .Sk = 300, .H = 3, .D = 40, .packed = true}));
  v.push_back(mha({.name = "d40_sd_cross", .B = 2, .Sq = 130, .Sk = 77, .H = 2, .D = 40}));
  v.push_back(mha({.name = "d80_sd_self", .B = 2, .Sq = 150, .Sk = 150, .H = 2, .D = 80, .packed = true}));
  v.push_back(mha({.name = "d80_cross_padding",
                   .B = 2,
                   .Sq = 70,
                   .Sk = 77,
                   .H = 2,
                   .D = 80,
                   .mask = padding(2, 77)}));
  v.push_back(mha({.name = "d160_sd_self", .B = 2, .Sq = 70, .Sk = 70, .H = 2, .D = 160, .packed = true}));
  v.push_back(mha({.name = "d160_cross", .B = 2, .Sq = 64, .Sk = 77, .H = 2, .D = 160}));
  v.push_back(mha({.name = "d96_causal", .B = 2, .Sq = 90, .Sk = 90, .H = 2, .D = 96, .mask = causal(90)}));
  v.push_back(mha({.name = "d24_packed", .B = 2, .Sq = 37, .Sk = 37, .H = 3, .D = 24, .packed = true}));
  v.push_back(mha({.name = "d56_full_mask",
                   .B = 2,
                   .Sq = 33,
                   .Sk = 33,
                   .H = 2,
                   .D = 56,
                   .mask = in({2, 1, 33, 33})}));
  v.push_back(mha({.name = "d104_cross", .B = 2, .Sq = 20, .Sk = 45, .H = 2, .D = 104}));
  v.push_back(mha({.name = "d200_packed", .B = 2, .Sq = 70, .Sk = 70, .H = 2, .D = 200, .packed = true}));
  v.push_back(mha({.name = "d256_padding", .B = 2, .Sq = 65, .Sk = 65, .H = 2, .D = 256, .mask = padding(2, 65)}));
  v.push_back(mha({.name = "d8_packed", .B = 2, .Sq = 19, .Sk = 19, .H = 2, .D = 8, .packed = true}));
  v.push_back(mha({.name = "gqa_d40", .B = 2, .Sq = 67, .Sk = 67, .H = 4, .D = 40, .Hkv = 2}));
  v.push_back(mha({.name = "d80_one_warp_blocks", .B = 1, .Sq = 20, .Sk = 20, .H = 1, .D = 80}));
  v.push_back(mha({.name = "seq_first_d80_cross", .B = 2, .Sq = 9, .Sk = 40, .H = 2, .D = 80, .seq_first = true}));
  // K and V of a KV cache, [B, Hkv, past + new, D] (fold_attention_heads' kv_head_major): one
  // token's decoding step, a prefill after a past with the causal mask's last rows, grouped and
  // plain heads, the tiny decoders' head size 16 and long caches over several key tiles.
  v.push_back(mha({.name = "kv_cache_decode_gqa_d64",
                   .B = 3,
                   .Sq = 1,
                   .Sk = 65,
                   .H = 4,
                   .D = 64,
                   .Hkv = 2,
                   .head_major = true,
                   .mask = padding(3, 65)}));
  v.push_back(mha({.name = "kv_cache_prefill_d128",
                   .B = 2,
                   .Sq = 16,
                   .Sk = 80,
                   .H = 2,
                   .D = 128,
                   .head_major = true,
                   .mask = in({1, 1, 16, 80}, DataType::kFloat32, -6, 0)}));
  v.push_back(mha({.name = "kv_cache_decode_d16", .B = 2, .Sq = 1, .Sk = 9, .H = 4, .D = 16, .Hkv = 2, .head_major = true}));
  v.push_back(mha({.name = "kv_cache_decode_mqa_d64_long",
                   .B = 2,
                   .Sq = 1,
                   .Sk = 300,
                   .H = 8,
                   .D = 64,
                   .Hkv = 1,
                   .head_major = true}));
  v.push_back(mha({.name = "kv_cache_d48_unfused", .B = 2, .Sq = 3, .Sk = 21, .H = 4, .D = 48, .Hkv = 2, .head_major = true}));
  // col_slices: Q, K and V read as column ranges of wider tensors (pack_qkv's
  // ReadPartsInPlace: cross-attention K and V in one GEMM's result, every layer's side by side).
  auto cols = [&](const char* name, int64_t sq, int64_t sk, int64_t h, int64_t d, int64_t qw,
                  int64_t kvw, std::vector<int64_t> slices, CaseInput mask) {
    Attributes a = attrs({{"num_heads", I(h)},
                          {"scale", F(1.f / std::sqrt(static_cast<float>(d)))},
                          {"nan_to_zero", I(0)},
                          {"col_slices", Attribute::Ints(std::move(slices))}});
    std::vector<CaseInput> ins = {in({2, sq, qw}, DataType::kFloat32, -2, 2),
                                  in({2, sk, kvw}, DataType::kFloat32, -2, 2),
                                  in({2, sk, kvw}, DataType::kFloat32, -2, 2)};
    if (!mask.absent) ins.push_back(mask);
    v.push_back(make_case(name, "MultiHeadAttention", std::move(a), std::move(ins),
                          Modes{"fp32", "fp16"}, "kiln"));
  };
  cols("mha_cols_cross_d40", 50, 77, 2, 40, 80, 320, {0, 0, 80, 80, 240, 80}, absent());
  cols("mha_cols_qkv_d64_padding", 33, 40, 2, 64, 256, 256, {128, 128, 0, 128, 128, 128},
       padding(2, 40));
  // Q a column range of a decoder's packed Q|K|V beside its KV cache (kv_head_major).
  for (int64_t sq : {1, 5}) {
    Attributes a = attrs({{"num_heads", I(4)},
                          {"kv_heads", I(2)},
                          {"scale", F(0.125f)},
                          {"nan_to_zero", I(0)},
                          {"kv_head_major", I(1)},
                          {"col_slices", Attribute::Ints({0, 256, 0, 0, 0, 0})}});
    v.push_back(make_case(sq == 1 ? "mha_cols_q_kv_cache_decode" : "mha_cols_q_kv_cache_s5",
                          "MultiHeadAttention", std::move(a),
                          {in({2, sq, 512}, DataType::kFloat32, -2, 2),
                           in({2, 2, 37, 64}, DataType::kFloat32, -2, 2),
                           in({2, 2, 37, 64}, DataType::kFloat32, -2, 2)},
                          Modes{"fp32", "fp16"}, "kiln"));
  }
  // Sequence-first (nn.MultiheadAttention's layout): packed with a padding mask, separate
  // cross attention at head size 32, and the unfused tactic's copies at head size 48.
  v.push_back(mha({.name = "seq_first_d64_packed_padding",
                   .B = 3,
                   .Sq = 70,
                   .Sk = 70,
                   .H = 2,
                   .packed = true,
                   .seq_first = true,
                   .mask = padding(3, 70)}));
  v.push_back(mha(
      {.name = "seq_first_d32_cross", .B = 2, .Sq = 9, .Sk = 40, .H = 4, .D = 32, .seq_first = true}));
  v.push_back(mha(
      {.name = "seq_first_d48_unfused", .B = 2, .Sq = 7, .Sk = 7, .H = 2, .D = 48, .seq_first = true}));
}

// mha.unfused's scores over a workspace limit they exceed (what failed SD 1.5's FP32 UNet: its
// heads' copies and 1 GiB of scores over a 1 GiB limit). Each limit is the copies of Q, K, V and
// Y (4 tensors of B·H·S·D elements, 256-byte aligned) plus the scores' share noted.
void mha_chunked_cases(std::vector<OpCase>& v) {
  // SD's head size 40 at 96 tokens, 2 x 8 heads; 4 heads' float32 scores (fp32: 4 heads a
  // piece; fp16, whose copies are half the size: 8).
  v.push_back(mha({.name = "chunked_d40_sd",
                   .B = 2,
                   .Sq = 96,
                   .Sk = 96,
                   .H = 8,
                   .D = 40,
                   .workspace = 4 * 245760 + 4 * 36864}));
  // A key-padding mask over 300 keys, 8 KiB for the scores: 6 query rows a piece (fp16: 100).
  v.push_back(mha({.name = "chunked_rows_padding",
                   .B = 2,
                   .Sq = 300,
                   .Sk = 300,
                   .H = 2,
                   .D = 24,
                   .mask = padding(2, 300),
                   .workspace = 4 * 115200 + (8 << 10)}));
  // Causal with row 60 fully masked (0 by nan_to_zero): 44 query rows a piece (fp16: a head).
  v.push_back(mha({.name = "chunked_causal_nan_to_zero",
                   .B = 1,
                   .Sq = 130,
                   .Sk = 130,
                   .H = 3,
                   .D = 40,
                   .mask = causal(130, 60),
                   .nan_to_zero = 1,
                   .workspace = 4 * 62464 + (32 << 10)}));
  // Grouped-query heads with a full [B, H, Sq, Sk] mask: 2 heads a piece (fp16: 4).
  v.push_back(mha({.name = "chunked_gqa_full_mask",
                   .B = 2,
                   .Sq = 33,
                   .Sk = 47,
                   .H = 4,
                   .D = 20,
                   .Hkv = 2,
                   .mask = in({2, 4, 33, 47}),
                   .workspace = 2 * 21248 + 2 * 30208 + 12800}));
}

void norm_cases(std::vector<OpCase>& v) {
  // 96, 192 and 384 (ConvNeXt's and Swin's channels): rows of 4, 8 and 16 lanes in FP16, with
  // row counts that leave a warp's last groups past the end.
  for (auto [name, n] : {std::pair{"768", int64_t{768}}, std::pair{"128", int64_t{128}},
                         std::pair{"4096", int64_t{4096}}, std::pair{"40", int64_t{40}},
                         std::pair{"96", int64_t{96}}, std::pair{"192", int64_t{192}},
                         std::pair{"384", int64_t{384}}}) {
    v.push_back(make_case(
        std::string("skip_layernorm_") + name, "SkipLayerNorm", attrs({{"epsilon", F(1e-5f)}}),
        {in({3, 7, n}, DataType::kFloat32, -3, 3), in({3, 7, n}, DataType::kFloat32, -3, 3),
         konst_random({n}, 1.0), konst_random({n}, 0.5)},
        kModes, "kiln"));
    OpCase sum = v.back();
    sum.name += "_sum";
    sum.num_outputs = 2;
    v.push_back(sum);
    v.push_back(make_case(
        std::string("layernorm_rows_") + name, "LayerNormalization",
        attrs({{"axis", I(-1)}, {"epsilon", F(1e-12f)}}),
        {in({5, n}, DataType::kFloat32, -3, 3), konst_random({n}, 1.0), konst_random({n}, 0.5)},
        kModes));
    v.push_back(make_case(std::string("rmsnorm_rows_") + name, "RMSNormalization",
                          attrs({{"axis", I(-1)}, {"epsilon", F(1e-6f)}}),
                          {in({2, 5, n}, DataType::kFloat32, -3, 3), konst_random({n}, 1.0)},
                          kModes));
  }
  // A residual stream's large values in FP16 (the mean square stays in float32).
  v.push_back(make_case("rmsnorm_rows_large", "RMSNormalization", attrs({{"epsilon", F(1e-5f)}}),
                        {in({3, 256}, DataType::kFloat32, -300, 300), konst_random({256}, 1.0)},
                        kModes));
  // No bias, large values (a residual stream in FP16: the statistics stay in float32).
  v.push_back(make_case("skip_layernorm_no_bias_large", "SkipLayerNorm", attrs({}),
                        {in({2, 3, 256}, DataType::kFloat32, -300, 300),
                         in({2, 3, 256}, DataType::kFloat32, -300, 300), konst_random({256}, 1.0)},
                        kModes, "kiln"));
}

void gemm_cases(std::vector<OpCase>& v) {
  // Projections with a residual (BERT's output dense, GPT-2's c_proj), with and without bias.
  for (const char* act : {"", "Relu", "GeluTanh", "Gelu"}) {
    const std::string a = act;
    Attributes at = attrs({{"base", S("MatMul")}});
    if (!a.empty()) at.set("activation", S(a == "GeluTanh" ? "Gelu" : act));
    if (a == "GeluTanh") at.set("act_approximate", S("tanh"));
    v.push_back(make_case(
        "fused_matmul_residual_" + (a.empty() ? std::string("none") : a), "FusedGemm", at,
        {in({2, 9, 64}), konst_random({64, 48}, 0.2), konst_random({48}, 0.5), in({2, 9, 48})},
        kModes, "kiln"));
  }
  v.push_back(make_case(
      "fused_matmul_residual_no_bias", "FusedGemm", attrs({{"base", S("MatMul")}}),
      {in({3, 5, 32}), konst_random({32, 40}, 0.2), absent(), in({3, 5, 40})}, kModes, "kiln"));
  v.push_back(make_case(
      "fused_gemm_transb_residual", "FusedGemm", attrs({{"base", S("Gemm")}, {"transB", I(1)}}),
      {in({17, 24}), konst_random({40, 24}, 0.2), konst_random({40}, 0.5), in({17, 40})}, kModes,
      "kiln"));
  // GELU (tanh) with a bias, as GPT-2's MLP; MatMul by a constant weight (GPT-2's LM head, whose
  // FP16 output can be written in float32).
  v.push_back(make_case(
      "fused_matmul_gelu_tanh_bias", "FusedGemm",
      attrs({{"base", S("MatMul")}, {"activation", S("Gelu")}, {"act_approximate", S("tanh")}}),
      {in({4, 16, 64}), konst_random({64, 256}, 0.2), konst_random({256}, 0.5)}, kModes, "kiln"));
  // GELU (erf) with a bias, as BERT's and ViT's MLP (fused_gemm.cutlass_sm90's erf epilogue),
  // over inputs wide enough for both tails.
  v.push_back(make_case(
      "fused_matmul_gelu_erf_bias", "FusedGemm",
      attrs({{"base", S("MatMul")}, {"activation", S("Gelu")}}),
      {in({4, 16, 64}, DataType::kFloat32, -3, 3), konst_random({64, 256}, 0.3),
       konst_random({256}, 1.0)},
      kModes, "kiln"));
  // Swish in the epilogue (fused_gemm.cutlass_sm90): CLIP's quick GELU x * sigmoid(1.702 x),
  // and SiLU with a residual; values wide enough for both tails.
  v.push_back(make_case(
      "fused_matmul_quick_gelu_bias", "FusedGemm",
      attrs({{"base", S("MatMul")}, {"activation", S("Swish")}, {"act_alpha", F(1.702f)}}),
      {in({2, 77, 64}, DataType::kFloat32, -3, 3), konst_random({64, 256}, 0.3),
       konst_random({256}, 1.0)},
      kModes, "kiln"));
  v.push_back(make_case(
      "fused_matmul_silu_residual", "FusedGemm",
      attrs({{"base", S("MatMul")}, {"activation", S("Swish")}}),
      {in({3, 40, 96}, DataType::kFloat32, -3, 3), konst_random({96, 128}, 0.3),
       konst_random({128}, 1.0), in({3, 40, 128})},
      kModes, "kiln"));
  v.push_back(make_case("matmul_const_weight", "MatMul", attrs({}),
                        {in({2, 33, 64}), konst_random({64, 100}, 0.2)}, kModes));
  // N = 37 is not a 16-byte multiple in either type: matmul.cublaslt runs the GEMM at N padded
  // (its own zero-padded [N', K] copy of W) and packs the product (GPT-2's vocabulary of 50257).
  v.push_back(make_case("matmul_const_weight_odd_n", "MatMul", attrs({}),
                        {in({2, 33, 64}), konst_random({64, 37}, 0.2)}, kModes));
  // From 1024 rows an FP16 product of such rows runs as row groups (every 4th row for float32
  // output), each written in place from its first 16-byte boundary, the edge columns apart.
  v.push_back(make_case("matmul_const_weight_odd_n_row_groups", "MatMul", attrs({}),
                        {in({4, 300, 520}), konst_random({520, 301}, 0.1)}, kModes));
  // Rows shorter than a 16-byte step: no product, the edge columns are the whole row.
  v.push_back(make_case("matmul_const_weight_n3_row_groups", "MatMul", attrs({}),
                        {in({2, 600, 64}), konst_random({64, 3}, 0.2)}, kModes));
}

}  // namespace

std::vector<OpCase> transformer_cases() {
  std::vector<OpCase> v;
  mha_cases(v);
  mha_rotary_cases(v);
  mha_chunked_cases(v);
  norm_cases(v);
  gemm_cases(v);
  return v;
}

}  // namespace kiln::gpu::test
