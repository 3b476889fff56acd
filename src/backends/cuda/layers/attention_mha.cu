// kiln.MultiHeadAttention (ops/fused.h): Q [B, Sq, H*D], K [B, Sk, H*D], V [B, Sk, H*Dv] (or
// packed: Q, K and V side by side in one [B, S, 3*H*D] tensor), an additive mask broadcast to
// [B, H, Sq, Sk], Y [B, Sq, H*Dv]. Two tactics:
//   mha.flash    FP16, head sizes that are multiples of 8 up to 256 (kernels in
//                attention_flash.cuh; heads other than 32, 64 and 128 run at the padded width
//                padded_head() with zero columns, in attention_flash_wide.cu, and are gated
//                until run on a GPU): FlashAttention-2's forward pass on mma.sync
//                m16n8k16 with float accumulation. A block takes 64 query rows of one (batch,
//                head), 16 per warp (16 rows in one warp where 64-row blocks would leave SMs
//                idle: batch 1; 32 per warp in the w32 variant), and walks the keys in tiles of
//                64 through a double-buffered cp.async ring (K and V tiles with 16-byte chunks
//                XOR-swizzled by row, so that ldmatrix reads them without bank conflicts), 32
//                keys per softmax step. Scores stay in registers (16 per thread and 16-row tile,
//                Q's fragments reread from shared memory, so that five 4-warp blocks fit an SM):
//                a row's running maximum and sum rescale the output as keys arrive (the online
//                softmax), the probabilities are rounded to float16 for P.V, which reuses the
//                score fragments as its A operand. Q, K, V and Y are read and written in the
//                projections' own layout through row strides: the head split and merge cost
//                nothing. The mask is read as MaskRead says (below). With the rotary (inputs
//                4 to 6), Q's tile and each K tile are rotated in shared memory once their
//                copies land (rotate_tile: the same float16 roundings as rotary_half8_kernel),
//                before any warp reads them; K is rotated again by every query block.
//   mha.unfused  any float type and head size, no rotary: the heads are copied out into
//                [B, H, S, D] tensors (K as [B, H, D, S]), kiln.Attention's batched-GEMM
//                layer runs on them (layers/gemm_attention.cu), and the result is copied back.
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/device_util.cuh"
#include "kernels/mma.cuh"
#include "layers/attention_flash.cuh"
#include "kernels/pdl.cuh"
#include "layers/attention_mha.h"
#include "layers/gemm_common.h"
#include "layers/movement_copy.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {

Expected<std::unique_ptr<Layer>> create_attention(const LayerDesc& d);  // gemm_attention.cu

Expected<MhaShape> mha_shape(const Node& n, std::span<const DeviceTensor> in,
                             const DeviceTensor& y) {
  MhaShape s;
  s.packed = n.attrs.get_int("packed", 0) != 0;
  s.seq_first = n.attrs.get_int("seq_first", 0) != 0;
  const int bx = s.seq_first ? 1 : 0, sx = 1 - bx;  // the batch's and the sequence's axes
  s.H = n.attrs.get_int("num_heads", 0);
  s.Hkv = n.attrs.get_int("kv_heads", s.H);
  const DeviceTensor& q = in[0];
  if (q.rank() != 3 || s.H <= 0 || s.Hkv <= 0 || s.H % s.Hkv != 0)
    return KILN_ERROR("{}: Q must be 3-D, num_heads positive and a multiple of kv_heads",
                      n.label());
  s.B = q.shape[bx];
  s.Sq = q.shape[sx];
  if (s.packed) {  // Q | K | V: H + 2 Hkv heads of one size
    if (q.shape[2] % (s.H + 2 * s.Hkv) != 0)
      return KILN_ERROR("{}: packed Q's last dim {} is not {} + 2 x {} heads", n.label(),
                        q.shape[2], s.H, s.Hkv);
    s.D = s.Dv = q.shape[2] / (s.H + 2 * s.Hkv);
    s.Sk = s.Sq;
    s.q_row = s.k_row = s.v_row = q.shape[2];
    s.k_off = s.H * s.D;
    s.v_off = (s.H + s.Hkv) * s.D;
  } else if (n.attrs.get_int("kv_head_major", 0) != 0) {  // K [B, Hkv, Sk, D], V [.., Dv]
    const DeviceTensor &k = in[1], &v = in[2];
    const auto [q_start, q_cols] = mha_col_slice(n, 0);  // Q: a column range, or all of it
    const int64_t qw = q_cols > 0 ? q_cols : q.shape[2];
    if (s.seq_first || k.rank() != 4 || v.rank() != 4 || k.shape[0] != s.B || v.shape[0] != s.B ||
        k.shape[1] != s.Hkv || v.shape[1] != s.Hkv || k.shape[2] != v.shape[2] ||
        qw != s.H * k.shape[3] || q_start < 0 || q_start + qw > q.shape[2])
      return KILN_ERROR("{}: Q {}, K {} and V {} do not fit {} heads ({} for K and V, head-major)",
                        n.label(), shape_str(q.shape), shape_str(k.shape), shape_str(v.shape), s.H,
                        s.Hkv);
    s.kv_head_major = true;
    s.Sk = k.shape[2];
    s.D = k.shape[3];
    s.Dv = v.shape[3];
    s.q_row = q.shape[2];
    s.q_off = q_cols > 0 ? q_start : 0;
    s.k_row = s.D;  // a position's row of one head
    s.v_row = s.Dv;
  } else {
    const DeviceTensor &k = in[1], &v = in[2];
    if (k.rank() != 3 || v.rank() != 3)
      return KILN_ERROR("{}: K and V must be 3-D", n.label());
    // Each input's columns (col_slices: a part of a wider tensor read in place).
    int64_t width[3], off[3];
    for (int i = 0; i < 3; ++i) {
      const auto [start, w] = mha_col_slice(n, i);
      width[i] = w > 0 ? w : in[i].shape[2];
      off[i] = w > 0 ? start : 0;
      if (off[i] < 0 || off[i] + width[i] > in[i].shape[2])
        return KILN_ERROR("{}: columns [{}, {}) of input {} are past its {} columns", n.label(),
                          off[i], off[i] + width[i], i, in[i].shape[2]);
    }
    if (k.shape[bx] != s.B || v.shape[bx] != s.B || k.shape[sx] != v.shape[sx] ||
        width[0] % s.H || width[1] * s.H != width[0] * s.Hkv || width[2] % s.Hkv)
      return KILN_ERROR("{}: Q {}, K {} and V {} do not fit {} heads ({} for K and V)", n.label(),
                        shape_str(q.shape), shape_str(k.shape), shape_str(v.shape), s.H, s.Hkv);
    s.Sk = k.shape[sx];
    s.D = width[0] / s.H;
    s.Dv = width[2] / s.Hkv;
    s.q_row = q.shape[2];
    s.k_row = k.shape[2];
    s.v_row = v.shape[2];
    s.q_off = off[0], s.k_off = off[1], s.v_off = off[2];
  }
  std::vector<int64_t> want = {s.B, s.Sq, s.H * s.Dv};
  if (s.seq_first) std::swap(want[0], want[1]);
  if (y.shape != want)
    return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(y.shape),
                      shape_str(want));
  return s;
}

Expected<std::array<int64_t, 4>> mask_strides(const Node& n, const DeviceTensor& m,
                                              const MhaShape& s) {
  const std::vector<int64_t> full = {s.B, s.H, s.Sq, s.Sk};
  if (m.rank() > 4) return KILN_ERROR("{}: the mask has rank {} (at most 4)", n.label(), m.rank());
  std::array<int64_t, 4> st{};
  const auto rs = row_major_strides(m.shape);
  const int64_t off = 4 - m.rank();
  for (int64_t i = 0; i < m.rank(); ++i) {
    const int64_t d = m.shape[i], want = full[off + i];
    if (d != 1 && d != want)
      return KILN_ERROR("{}: mask {} does not broadcast to the scores [{}, {}, {}, {}]", n.label(),
                        shape_str(m.shape), s.B, s.H, s.Sq, s.Sk);
    st[off + i] = d == 1 ? 0 : rs[i];
  }
  return st;
}

bool mha_f16_head_sizes(const LayerDesc& d, int64_t* dq, int64_t* dv, std::string* why) {
  const Node& n = *d.node;
  if (d.precision != Precision::kFP16 || d.in.empty() || d.in[0].dtype != DataType::kFloat16)
    return *why = "float16 only", false;
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  for (size_t i = 1; i < 3 && !packed; ++i)
    if (d.in.size() <= i || d.in[i].dtype != DataType::kFloat16)
      return *why = "float16 only", false;
  const TensorType& q = d.in_type(0);
  const int64_t h = n.attrs.get_int("num_heads", 0), hkv = n.attrs.get_int("kv_heads", h);
  if (q.rank() != 3 || !q.dims->back().is_static() || h <= 0 || hkv <= 0 || h % hkv)
    return *why = "Q's head size is unknown", false;
  // A column slice (col_slices) is as wide as it says.
  const int64_t qw = packed ? 0 : mha_col_slice(n, 0).second;
  *dq = *dv = (qw > 0 ? qw : q.dims->back().value) / (packed ? h + 2 * hkv : h);
  if (!packed) {
    const TensorType& v = d.in_type(2);
    const int64_t vw = mha_col_slice(n, 2).second;
    const bool major = n.attrs.get_int("kv_head_major", 0) != 0;  // V [B, Hkv, Sk, Dv]
    if (vw <= 0 && (v.rank() != (major ? 4 : 3) || !v.dims->back().is_static()))
      return *why = "V's head size is unknown", false;
    *dv = major ? v.dims->back().value : (vw > 0 ? vw : v.dims->back().value) / hkv;
  }
  if (d.in.size() > 3 && d.in[3].present() && d.in[3].dtype != DataType::kFloat16 &&
      d.in[3].dtype != DataType::kFloat32)
    return *why = "a float16 or float32 mask only", false;
  return true;
}

namespace {

using namespace flash;

template <bool kRot>
FlashKernel pick_flash(int d, int warps, DataType mask, int read) {
  if (d == 32)
    return warps == 8   ? flash_kernel<32, 8, 1, kRot>(mask, read)
           : warps == 4 ? flash_kernel<32, 4, 1, kRot>(mask, read)
                        : flash_kernel<32, 1, 1, kRot>(mask, read);
  if (d == 64)
    return warps == 8   ? flash_kernel<64, 8, 1, kRot>(mask, read)
           : warps == 4 ? flash_kernel<64, 4, 1, kRot>(mask, read)
                        : flash_kernel<64, 1, 1, kRot>(mask, read);
  return warps == 8   ? flash_kernel<128, 8, 1, kRot>(mask, read)
         : warps == 4 ? flash_kernel<128, 4, 1, kRot>(mask, read)
                      : flash_kernel<128, 1, 1, kRot>(mask, read);
}

// Variants: "" sizes blocks by the grid (below); "rows128": 128 query rows a block (8 warps), so
// a head's K and V are read once per 128 rows instead of per 64, where that still fills the SMs;
// "split": 16 query rows a block, the keys split over its 4 warps (mha_flash_split_kernel), for
// grids that do not fill the SMs; "w32" (head size 64): 128 query rows a block as four warps of
// 32 rows, two 16-row tiles that share each K and V fragment read from shared memory. Where
// every warp takes 16 rows, BERT's batch 32 (384 heads of 128 rows) needs 3072 warps, more than
// the 20 a multiprocessor's registers hold (2640): 1.16 waves; at 32 rows a warp, three blocks
// an SM hold them all.
// Head sizes other than 32, 64 and 128 (padded tiles: no rows128 or w32 kernels; the split
// kernel up to kMaxSplitHead) have "" and "split".
std::vector<std::string> flash_variants(const LayerDesc& d) {
  int64_t dq = 0, dv = 0;
  std::string why;
  if (!mha_f16_head_sizes(d, &dq, &dv, &why)) return {""};
  const int dp = padded_head(static_cast<int>(dq));
  if (dq == 64) return {"", "rows128", "split", "w32"};
  if (dp == 32) return {"", "rows128"};  // (the split kernel: 64 and up)
  if (!swizzled(dp)) return dp <= kMaxSplitHead ? std::vector<std::string>{"", "split"}
                                                : std::vector<std::string>{""};
  return {"", "rows128", "split"};
}

bool flash_supports(const LayerDesc& d, std::string* why) {
  int64_t dq = 0, dv = 0;
  if (!mha_f16_head_sizes(d, &dq, &dv, why)) return false;
  if (dq % 8 != 0 || dq < 8 || dq > 256 || dv != dq)
    return *why = "head sizes that are multiples of 8 up to 256 only", false;
  if (mha_has_rotary(*d.node) && dq != 32 && dq != 64 && dq != 128)
    return *why = "the rotary at head sizes 32, 64 and 128 only", false;
  if (mha_has_rotary(*d.node)) {  // the rotary's caches float16, its position ids int64
    if (d.node->attrs.get_int("seq_first", 0) != 0)
      return *why = "the rotary is not applied with seq_first", false;
    if (d.in.size() < 6 || d.in[4].dtype != DataType::kFloat16 ||
        d.in[5].dtype != DataType::kFloat16)
      return *why = "the rotary's caches in float16 only", false;
    if (d.in.size() > 6 && d.in[6].present() && d.in[6].dtype != DataType::kInt64)
      return *why = "int64 position ids only", false;
    for (size_t i = 4; i < d.in.size(); ++i)
      if (d.in[i].present() && d.in[i].layout != Layout::kLinear)
        return *why = "the rotary's inputs in linear layout only", false;
  }
  return true;
}

class MhaFlashLayer final : public Layer {
 public:
  explicit MhaFlashLayer(const LayerDesc& d)
      : node_(d.node),
        rows128_(d.variant == "rows128"),
        split_(d.variant == "split"),
        w32_(d.variant == "w32") {
    scale_ = d.node->attrs.get_float("scale", 1.f);
    nan_to_zero_ = d.node->attrs.get_int("nan_to_zero", 0) != 0;
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    KILN_ASSIGN_OR_RETURN(s_, mha_shape(n, in, out[0]));
    if (s_.D % 8 != 0 || s_.D < 8 || s_.D > 256 || s_.Dv != s_.D)
      return KILN_ERROR("{}: mha.flash takes head sizes that are multiples of 8 up to 256, got {}",
                        n.label(), s_.D);
    const int dp = padded_head(static_cast<int>(s_.D));  // the kernels' tile width
    for (int64_t st : {s_.q_row, s_.k_row, s_.v_row})
      if (st % 8 != 0)
        return KILN_ERROR("{}: rows of {} elements are not 16-byte aligned", n.label(), st);
    if (s_.B > 65535 || s_.H > 65535 || s_.Sq > INT32_MAX || s_.Sk > INT32_MAX)
      return KILN_ERROR("{}: batch {} or heads {} beyond the grid", n.label(), s_.B, s_.H);
    mask_ = in.size() > 3 && in[3].present() ? in[3].dtype : DataType::kUndefined;
    if (mask_ != DataType::kUndefined) {
      KILN_ASSIGN_OR_RETURN(mstride_, mask_strides(n, in[3], s_));
      if ((s_.Sq - 1) * mstride_[2] + (s_.Sk - 1) * mstride_[3] > INT32_MAX)
        return KILN_ERROR("{}: the mask's rows span more than 2^31 elements", n.label());
    }
    // 64 query rows a block (4 warps) where that gives the GPU two blocks per SM at least; else
    // 16 (one warp): short sequences at batch 1 spread over more SMs.
    int device = 0, sms = 0;
    KILN_CUDA_CHECK(cudaGetDevice(&device));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    warps_ = s_.B * s_.H * ((s_.Sq + 63) / 64) >= 2 * sms ? 4 : 1;
    if (rows128_ && swizzled(dp) && s_.Sq > 64 && s_.B * s_.H * ((s_.Sq + 127) / 128) >= sms)
      warps_ = 8;
    rows_ = 16 * warps_;
    smem_ = flash_smem(dp, rows_);
    // A mask the same for every query row (a key-padding mask) is staged in shared memory; one
    // with contiguous keys, rows of even length and even offsets is read two keys a load (w32).
    int read = kMaskElems;
    if (mask_ != DataType::kUndefined) {
      const bool even = mstride_[0] % 2 == 0 && mstride_[1] % 2 == 0 && mstride_[2] % 2 == 0;
      if (mstride_[2] == 0) read = kMaskStaged;
      else if (mstride_[3] == 1 && s_.Sk % 2 == 0 && even) read = kMaskPairs;
    }
    KILN_RETURN_IF_ERROR(configure_rotary(in));
    if (rot_ && dp != s_.D)
      return KILN_ERROR("{}: mha.flash applies the rotary at head sizes 32, 64 and 128 only",
                        n.label());
    kernel_ = !swizzled(dp) ? pick_flash_wide(dp, warps_, mask_, read)
              : rot_        ? pick_flash<true>(dp, warps_, mask_, read)
                            : pick_flash<false>(dp, warps_, mask_, read);
    if (w32_) {
      if (s_.D != 64)
        return KILN_ERROR("{}: mha.flash/w32 takes head size 64, got {}", n.label(), s_.D);
      warps_ = 4;
      rows_ = 128;
      smem_ = flash_smem(64, rows_);
      kernel_ =
          rot_ ? flash_kernel<64, 4, 2, true>(mask_, read) : flash_kernel<64, 4, 2>(mask_, read);
    }
    if (split_) {
      if (dp == 32 || dp > kMaxSplitHead)
        return KILN_ERROR("{}: mha.flash/split takes head sizes 33 to {}, got {}", n.label(),
                          kMaxSplitHead, s_.D);
      warps_ = kSplitWarps;
      rows_ = 16;
      smem_ = flash_split_smem(dp);
      if (!swizzled(dp))
        kernel_ = flash_split_wide(dp, mask_);
      else if (rot_)
        kernel_ =
            dp == 64 ? flash_split_kernel<64, true>(mask_) : flash_split_kernel<128, true>(mask_);
      else
        kernel_ = dp == 64 ? flash_split_kernel<64, false>(mask_)
                           : flash_split_kernel<128, false>(mask_);
    }
    if (!kernel_) return KILN_ERROR("{}: no mha.flash kernel for head size {}", n.label(), s_.D);
    KILN_CUDA_CHECK(cudaFuncSetAttribute(kernel_, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_)));
    return size_t{0};
  }

  // The rotary's geometry (rot_, rot_b_, rot_max_) from its caches' and position ids' shapes,
  // which RotaryEmbedding's rules bound (ops/rotary.cpp); Sq = Sk.
  Status configure_rotary(std::span<const DeviceTensor> in) {
    const Node& n = *node_;
    rot_ = 0;
    if (!mha_has_rotary(n)) return Status::Ok();
    if (in.size() < 6 || !in[4].present() || !in[5].present())
      return KILN_ERROR("{}: the rotary needs cos_cache and sin_cache", n.label());
    if (s_.seq_first || s_.Sq != s_.Sk)
      return KILN_ERROR("{}: the rotary needs batch-first Q and K of one length", n.label());
    const DeviceTensor &c = in[4], &sn = in[5];
    const int64_t half = s_.D / 2, S = s_.Sq;
    if (c.shape != sn.shape || c.rank() < 2 || c.shape.back() != half)
      return KILN_ERROR("{}: the rotary's caches {} and {} must end in D/2 = {}", n.label(),
                        shape_str(c.shape), shape_str(sn.shape), half);
    if (in.size() > 6 && in[6].present()) {
      const DeviceTensor& p = in[6];
      if (p.rank() != 2 || (p.shape[0] != s_.B && p.shape[0] != 1) || p.shape[1] != S ||
          c.rank() != 2)
        return KILN_ERROR("{}: position_ids {} needs caches [max_pos, {}] and shape [{},{}]",
                          n.label(), shape_str(p.shape), half, s_.B, S);
      rot_b_ = p.shape[0] == 1 ? 0 : S;
      rot_max_ = c.shape[0];
    } else {
      const bool ok = (c.rank() == 2 && c.shape[0] == S) ||
                      (c.rank() == 3 && (c.shape[0] == s_.B || c.shape[0] == 1) && c.shape[1] == S);
      if (!ok)
        return KILN_ERROR(
            "{}: without position_ids the rotary's caches must be [{},{},{}] or [{},{}], got {}",
            n.label(), s_.B, S, half, S, half, shape_str(c.shape));
      rot_b_ = c.rank() == 2 || c.shape[0] == 1 ? 0 : S;
      rot_max_ = c.shape[c.rank() - 2] * (rot_b_ ? s_.B : 1);
    }
    rot_ = n.attrs.get_int("rotary_interleaved", 0) != 0 ? 2 : 1;
    return Status::Ok();
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (s_.B == 0 || s_.Sq == 0) return Status::Ok();
    FlashArgs a{};
    const auto* base = static_cast<const __half*>(in[0].data);
    a.q = base + s_.q_off;
    a.k = (s_.packed ? base : static_cast<const __half*>(in[1].data)) + s_.k_off;
    a.v = (s_.packed ? base : static_cast<const __half*>(in[2].data)) + s_.v_off;
    a.y = static_cast<__half*>(out[0].data);
    a.q_s = s_.stride_s(0), a.k_s = s_.stride_s(1);
    a.v_s = s_.stride_s(2), a.y_s = s_.seq_stride(s_.H * s_.Dv);
    a.q_b = s_.stride_b(0), a.k_b = s_.stride_b(1);
    a.v_b = s_.stride_b(2), a.y_b = s_.batch_stride(s_.Sq, s_.H * s_.Dv);
    a.k_h = s_.stride_h(1), a.v_h = s_.stride_h(2);
    a.sq = static_cast<int>(s_.Sq);
    a.sk = static_cast<int>(s_.Sk);
    a.d = static_cast<int>(s_.D);
    a.scale_log2 = scale_ * kLog2e;
    a.nan_to_zero = nan_to_zero_;
    a.group = static_cast<int>(s_.H / s_.Hkv);
    if (mask_ != DataType::kUndefined) {
      a.mask = in[3].data;
      a.m_b = mstride_[0], a.m_h = mstride_[1], a.m_q = mstride_[2];
      a.m_k = static_cast<int>(mstride_[3]);
    }
    if (rot_) {
      a.rot = rot_;
      a.cosc = static_cast<const __half*>(in[4].data);
      a.sinc = static_cast<const __half*>(in[5].data);
      a.pos = in.size() > 6 && in[6].present() ? static_cast<const int64_t*>(in[6].data) : nullptr;
      a.r_b = rot_b_;
      a.r_max = rot_max_;
    }
    for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k),
                          static_cast<const void*>(a.v), static_cast<const void*>(a.y),
                          static_cast<const void*>(a.cosc), static_cast<const void*>(a.sinc)})
      if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
        return KILN_ERROR("{}: an operand is not 16-byte aligned", node_->label());
    const int rows = rows_;
    const dim3 grid(static_cast<unsigned>((s_.Sq + rows - 1) / rows), static_cast<unsigned>(s_.H),
                    static_cast<unsigned>(s_.B));
    if (s_.Sk == 0) return KILN_ERROR("{}: no keys (sequence length 0)", node_->label());
    KILN_CUDA_CHECK(launch_kernel(rc, kernel_, grid, dim3(32 * warps_), smem_, a));
    return Status::Ok();
  }

 private:
  const Node* node_;
  float scale_ = 1.f;
  bool nan_to_zero_ = false;
  bool rows128_ = false, split_ = false, w32_ = false;
  MhaShape s_;
  DataType mask_ = DataType::kUndefined;
  std::array<int64_t, 4> mstride_{};
  int rot_ = 0;  // FlashArgs::rot
  int64_t rot_b_ = 0, rot_max_ = 0;
  int warps_ = 4;
  int rows_ = 64;  // query rows a block
  size_t smem_ = 0;
  FlashKernel kernel_ = nullptr;
};

// --- mha.unfused ----------------------------------------------------------------------------

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

bool unfused_supports(const LayerDesc& d, std::string* why) {
  if (mha_has_rotary(*d.node)) return *why = "the rotary is applied only by mha.flash", false;
  const bool packed = d.node->attrs.get_int("packed", 0) != 0;
  for (size_t i = 0; i < (packed ? 1u : 3u); ++i)
    if (d.in.size() <= i || !dtype_is_float(d.in[i].dtype) || d.in[i].dtype != d.in[0].dtype)
      return *why = "float Q, K and V of one type only", false;
  if (d.in.size() > 3 && d.in[3].present() && d.in[3].dtype != d.in[0].dtype)
    return *why = "the mask differs in type", false;
  return true;
}

// The heads of Q, K and V copied into [B, H, S, D] (K: [B, H, D, S]) workspace tensors, the
// batched-GEMM attention over them, and its [B, H, Sq, Dv] result merged into Y.
class MhaUnfusedLayer final : public Layer {
 public:
  explicit MhaUnfusedLayer(const LayerDesc& d) : desc_(d) {}

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *desc_.node;
    KILN_ASSIGN_OR_RETURN(s_, mha_shape(n, in, out[0]));
    dtype_ = in[0].dtype;
    const size_t es = dtype_size(dtype_);
    // [B, H, S, D] of rows with stride `row`, as dims (b, head group, head in group, s, d):
    // Q's groups are of one head; K's and V's of H / Hkv, each reading its group's head.
    auto split = [&](int i, int64_t S, int64_t D, int64_t off, bool kt, int64_t g) {
      const std::vector<int64_t> src = {s_.stride_b(i), s_.stride_h(i), g == 1 ? s_.stride_h(i) : 0,
                                        s_.stride_s(i), 1};
      const std::vector<int64_t> dst =
          kt ? std::vector<int64_t>{s_.H * D * S, g * D * S, D * S, 1, S}
             : std::vector<int64_t>{s_.H * S * D, g * S * D, S * D, D, 1};
      return movement_detail::plan_copy({s_.B, s_.H / g, g, S, D}, src, dst, off, 0, es);
    };
    const int64_t group = s_.H / s_.Hkv;
    KILN_ASSIGN_OR_RETURN(cq_, split(0, s_.Sq, s_.D, s_.q_off, false, 1));
    KILN_ASSIGN_OR_RETURN(ck_, split(1, s_.Sk, s_.D, s_.k_off, true, group));
    KILN_ASSIGN_OR_RETURN(cv_, split(2, s_.Sk, s_.Dv, s_.v_off, false, group));
    KILN_ASSIGN_OR_RETURN(
        cy_, movement_detail::plan_copy({s_.B, s_.H, s_.Sq, s_.Dv},
                                        {s_.H * s_.Sq * s_.Dv, s_.Sq * s_.Dv, s_.Dv, 1},
                                        {s_.batch_stride(s_.Sq, s_.H * s_.Dv), s_.Dv,
                                         s_.seq_stride(s_.H * s_.Dv), 1},
                                        0, 0, es));
    q4_ = tensor({s_.B, s_.H, s_.Sq, s_.D});
    kt4_ = tensor({s_.B, s_.H, s_.D, s_.Sk});
    v4_ = tensor({s_.B, s_.H, s_.Sk, s_.Dv});
    y4_ = tensor({s_.B, s_.H, s_.Sq, s_.Dv});
    mask_ = in.size() > 3 && in[3].present() ? in[3] : DeviceTensor{};
    if (mask_.present()) {  // as [B, H, Sq, Sk] scores see it (rank 4, leading 1s)
      KILN_RETURN_IF_ERROR(mask_strides(n, mask_, s_).status());
      while (mask_.rank() < 4) mask_.shape.insert(mask_.shape.begin(), 1);
    }
    if (!attention_) {
      LayerDesc d = desc_;
      d.in = {desc_.in[0], desc_.in[0], desc_.in[0],
              mask_.present() ? desc_.in[3] : TensorFormat{}};
      d.out = {desc_.out[0]};
      KILN_ASSIGN_OR_RETURN(attention_, create_attention(d));
    }
    bytes_ = 0;
    for (const DeviceTensor* t : {&q4_, &kt4_, &v4_, &y4_}) bytes_ += align256(t->nbytes());
    if (bytes_ > rc.workspace_limit)
      return KILN_ERROR(
          "{}: the heads copied out for mha.unfused need {} bytes of workspace, "
          "over the limit of {} bytes",
          n.label(), bytes_, rc.workspace_limit);
    // The attention's scores share the limit with the copies: it chunks them to fit the rest.
    RunContext arc = rc;
    arc.workspace_limit = rc.workspace_limit - bytes_;
    std::vector<DeviceTensor> ain = {q4_, kt4_, v4_, mask_};
    KILN_ASSIGN_OR_RETURN(attention_ws_, attention_->configure(arc, ain, std::span(&y4_, 1)));
    return bytes_ + attention_ws_;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (out[0].numel() == 0) return Status::Ok();
    auto* ws = static_cast<uint8_t*>(rc.workspace);
    for (DeviceTensor* t : {&q4_, &kt4_, &v4_, &y4_}) {
      t->data = ws;
      ws += align256(t->nbytes());
    }
    const void* base = in[0].data;
    KILN_RETURN_IF_ERROR(movement_detail::run_copy(cq_, base, q4_.data, rc.stream));
    KILN_RETURN_IF_ERROR(
        movement_detail::run_copy(ck_, s_.packed ? base : in[1].data, kt4_.data, rc.stream));
    KILN_RETURN_IF_ERROR(
        movement_detail::run_copy(cv_, s_.packed ? base : in[2].data, v4_.data, rc.stream));
    if (mask_.present()) mask_.data = in[3].data;
    RunContext arc = rc;
    arc.pdl = false;  // after the copies above, which do not trigger
    arc.workspace = ws;
    arc.workspace_bytes = attention_ws_;
    std::vector<DeviceTensor> ain = {q4_, kt4_, v4_, mask_};
    KILN_RETURN_IF_ERROR(attention_->run(arc, ain, std::span(&y4_, 1)));
    return movement_detail::run_copy(cy_, y4_.data, out[0].data, rc.stream);
  }

 private:
  DeviceTensor tensor(std::vector<int64_t> shape) const {
    DeviceTensor t;
    t.dtype = dtype_;
    t.shape = std::move(shape);
    return t;
  }

  LayerDesc desc_;
  MhaShape s_;
  DataType dtype_ = DataType::kUndefined;
  movement_detail::CopyPlan cq_, ck_, cv_, cy_;
  DeviceTensor q4_, kt4_, v4_, y4_, mask_;
  std::unique_ptr<Layer> attention_;
  size_t attention_ws_ = 0, bytes_ = 0;
};

}  // namespace

bool mha_flash_supports(const LayerDesc& d, std::string* why) { return flash_supports(d, why); }
std::vector<std::string> mha_flash_variants(const LayerDesc& d) { return flash_variants(d); }
Expected<std::unique_ptr<Layer>> create_mha_flash(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new MhaFlashLayer(d));
}
bool mha_unfused_supports(const LayerDesc& d, std::string* why) { return unfused_supports(d, why); }
Expected<std::unique_ptr<Layer>> create_mha_unfused(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new MhaUnfusedLayer(d));
}

}  // namespace kiln::gpu
