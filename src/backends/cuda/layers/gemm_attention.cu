// kiln.Attention(Q, Kt, V, mask?): Y = Softmax(Q @ Kt * scale + mask, axis=-1) @ V (ops/fused.h),
// as batched GEMM (scores into the workspace, in float; double for float64) -> a row softmax
// kernel that adds the mask (and with nan_to_zero turns NaN probabilities into 0) -> batched
// GEMM with V. Batch dims broadcast as the unfused MatMul / Add / MatMul do. Where the scores
// would outgrow the workspace limit, the three steps run over chunks of the batch (or of the
// query rows), each chunk's scores in the same workspace (layers/attention_chunks.h).
// Float16/bfloat16 round after each step where the CPU reference (ops/fused_chain.cpp) rounds, so
// the 16-bit results differ from it only by the order of the GEMM sums: the product, the scaled
// scores, the biased scores and each softmax step.
#include <algorithm>
#include <cmath>

#include "kernels/device_util.cuh"
#include "layers/attention_chunks.h"
#include "layers/gemm_common.h"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Reduces over the blockDim.x threads of one row (a warp, or a whole block with blockDim.y == 1).
template <bool kMax, typename A>
__device__ __forceinline__ A row_reduce(A v, A* smem) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if (blockDim.x <= 32) return v;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();  // smem may still be read from the previous reduction
  if (lane == 0) smem[w] = v;
  __syncthreads();
  v = lane < nw ? smem[lane] : (kMax ? A(-INFINITY) : A(0));
  return kMax ? warp_max(v) : warp_sum(v);
}

// x rounded to T (float16/bfloat16), back in float.
template <typename T>
__device__ __forceinline__ float round16(float x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(__float2half_rn(x));
  else return __bfloat162float(__float2bfloat16_rn(x));
}

// The row's broadcast from lane/thread 0 (a warp, or a whole block with blockDim.y == 1).
template <typename A>
__device__ __forceinline__ A row_broadcast(A v, A* smem) {
  if (blockDim.x <= 32) return __shfl_sync(0xffffffffu, v, 0);
  __syncthreads();
  if (threadIdx.x == 0) smem[0] = v;
  __syncthreads();
  return smem[0];
}

// One row of T scores per blockDim.x threads: p = softmax(s * scale + mask). NaN anywhere in a
// row (or a row of -inf, fully masked) makes the whole row NaN, as the reference's max-then-exp
// does; nan_to_zero then writes 0 for NaN. `s` and `p` may alias (same type).
// For float16/bfloat16 (kRound) the steps round to T as the CPU reference's MatMul, Mul, Add and
// Softmax do (s arrives unscaled; the softmax rounds after each step; bfloat16 sums in order,
// rounding after every element), so the results are the reference's; float and double take
// `s` already scaled by the GEMM.
template <typename A, typename T>
__global__ void attention_softmax(const A* s, T* p, const T* __restrict__ mask, StridedIndex mix,
                                  int64_t rows, int64_t len, bool nan_to_zero, float scale) {
  constexpr bool kRound = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
  using R = std::conditional_t<kRound, double, A>;  // the reference's softmax runs in double
  __shared__ R smem[32];
  for (int64_t row = blockIdx.x * int64_t(blockDim.y) + threadIdx.y;
       row - threadIdx.y < rows; row += int64_t(gridDim.x) * blockDim.y) {
    const bool live = row < rows;
    const A* sr = s + (live ? row : 0) * len;
    auto at = [&](int64_t t) -> R {
      if constexpr (kRound) {
        float v = round16<T>(sr[t]);
        if (scale != 1.f) v = round16<T>(v * scale);
        if (mask) v = round16<T>(v + load(mask, mix.offset(row * len + t)));
        return v;
      } else {
        A v = sr[t];
        if (mask) v += static_cast<A>(load(mask, mix.offset(row * len + t)));
        return v;
      }
    };
    auto r = [](R x) -> R {
      if constexpr (kRound) return round16<T>(static_cast<float>(x));
      else return x;
    };
    R mx = -INFINITY;
    if (live)
      for (int64_t t = threadIdx.x; t < len; t += blockDim.x) mx = fmax(mx, at(t));
    mx = row_reduce<true>(mx, smem);
    R sum = 0;
    if (live)
      for (int64_t t = threadIdx.x; t < len; t += blockDim.x) {
        const R e = r(exp(r(at(t) - mx)));
        if constexpr (kRound) store(p, row * len + t, e);  // exact: e is rounded to T
        sum += e;
      }
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // in order, as numpy's bfloat16 sum
      if (blockDim.x <= 32) __syncwarp();
      else __syncthreads();
      R seq = 0;
      if (live && threadIdx.x == 0)
        for (int64_t t = 0; t < len; ++t) seq = r(seq + load(p, row * len + t));
      sum = row_broadcast(seq, smem);
    } else {
      sum = row_reduce<false>(sum, smem);
    }
    sum = r(sum);
    // fmax skips NaN, but the sum carries it (exp(NaN - mx)), so the whole row becomes NaN.
    if (live)
      for (int64_t t = threadIdx.x; t < len; t += blockDim.x) {
        R v;
        if constexpr (kRound) v = r(load(p, row * len + t) / sum);
        else v = exp(at(t) - mx) / sum;
        if (nan_to_zero && isnan(v)) v = 0;
        store(p, row * len + t, v);
      }
  }
}

bool float_type(DataType t) { return dtype_is_float(t); }

}  // namespace

bool attention_supports(const LayerDesc& d, std::string* why) {
  for (size_t i = 0; i < 3; ++i) {
    if (d.in.size() <= i || !float_type(d.in[i].dtype)) return *why = "float Q, Kt and V only", false;
    const TensorType& t = d.in_type(i);
    if (t.has_rank() && t.rank() < 2) return *why = "Q, Kt and V must have rank >= 2", false;
  }
  if (d.in[1].dtype != d.in[0].dtype || d.in[2].dtype != d.in[0].dtype)
    return *why = "Q, Kt and V differ in type", false;
  if (d.in.size() > 3 && d.in[3].dtype != DataType::kUndefined && d.in[3].dtype != d.in[0].dtype)
    return *why = "the mask differs in type", false;
  return true;
}

namespace {

class AttentionLayer final : public Layer {
 public:
  explicit AttentionLayer(const LayerDesc& d) : node_(d.node), precision_(d.precision) {
    scale_ = d.node->attrs.get_float("scale", 1.f);
    nan_to_zero_ = d.node->attrs.get_int("nan_to_zero", 0) != 0;
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor &q = in[0], &k = in[1], &v = in[2];
    const DeviceTensor* mask = in.size() > 3 && in[3].present() ? &in[3] : nullptr;
    if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2)
      return KILN_ERROR("{}: Q, Kt and V must have rank >= 2", n.label());
    dtype_ = q.dtype;
    const int64_t D = q.shape.back(), T = k.shape.back();
    if (k.shape[k.rank() - 2] != D || v.shape[v.rank() - 2] != T)
      return KILN_ERROR("{}: Q {}, Kt {} and V {} do not chain", n.label(), shape_str(q.shape),
                        shape_str(k.shape), shape_str(v.shape));
    AttentionShapes whole{q.shape, k.shape, v.shape, {}, out[0].shape, mask != nullptr};
    if (mask) whole.mask = mask->shape;
    std::vector<int64_t> want;
    KILN_ASSIGN_OR_RETURN(full_, plan_piece(whole, &want));
    if (out[0].shape != want)
      return KILN_ERROR("{}: output shape {} differs from {}", n.label(), shape_str(out[0].shape),
                        shape_str(want));
    len_ = T;
    numel_ = out[0].numel();
    acc_ = dtype_ == DataType::kFloat64 ? DataType::kFloat64 : DataType::kFloat32;
    const size_t prob_size = acc_ == dtype_ ? 0 : dtype_size(dtype_);
    KILN_ASSIGN_OR_RETURN(chunks_, plan_attention_chunks(whole, dtype_size(acc_), prob_size,
                                                         rc.workspace_limit, n.label()));
    if (chunks_.chunked()) {  // the pieces' own plans (the whole's, above, only checked it)
      KILN_ASSIGN_OR_RETURN(full_, plan_piece(chunks_.full, nullptr));
      if (chunks_.last != chunks_.step) {
        KILN_ASSIGN_OR_RETURN(tail_, plan_piece(chunks_.tail, nullptr));
      }
    }
    scores_bytes_ = attention_workspace(chunks_.full_cells, dtype_size(acc_), 0);
    probs_bytes_ = prob_size ? attention_workspace(chunks_.full_cells, prob_size, 0) : 0;
    return chunks_.workspace;
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (numel_ == 0) return Status::Ok();
    const int64_t es = static_cast<int64_t>(dtype_size(dtype_));
    auto at = [es](const void* p, int64_t off) -> const void* {
      return p ? static_cast<const uint8_t*>(p) + off * es : nullptr;
    };
    const void* mask = in.size() > 3 && in[3].present() ? in[3].data : nullptr;
    auto* y = static_cast<uint8_t*>(out[0].data);
    for (int64_t i = 0; i < chunks_.count(); ++i) {
      const AttentionChunks::Offsets o = chunks_.at(i);
      KILN_RETURN_IF_ERROR(run_piece(rc, o.tail ? tail_ : full_, at(in[0].data, o.q),
                                     at(in[1].data, o.k), at(in[2].data, o.v), at(mask, o.mask),
                                     y + o.y * es));
    }
    return Status::Ok();
  }

 private:
  // The plan of one piece (attention_chunks.h): the whole problem, or a chunk of it.
  struct Piece {
    BatchedGemm qk, pv;
    StridedIndex mix;  // the mask's offset of each score, over the piece's scores
    int64_t rows = 0;  // score rows (softmax rows)
  };

  // The piece's products and mask broadcast from its shapes; `y_shape` (if not null) gets the
  // output shape they make. Errors name the node.
  Expected<Piece> plan_piece(const AttentionShapes& s, std::vector<int64_t>* y_shape) const {
    const Node& n = *node_;
    const int64_t S = s.q[s.q.size() - 2], D = s.q.back();
    const int64_t T = s.k.back(), Dv = s.v.back();
    const std::vector<int64_t> qb(s.q.begin(), s.q.end() - 2);
    const std::vector<int64_t> kb(s.k.begin(), s.k.end() - 2);
    const std::vector<int64_t> vb(s.v.begin(), s.v.end() - 2);
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sb, broadcast_shapes({qb, kb}, n));
    std::vector<int64_t> scores = sb;
    scores.push_back(S);
    scores.push_back(T);
    if (s.masked) {  // the mask may widen the batch, never the [S, T] rows
      KILN_ASSIGN_OR_RETURN(std::vector<int64_t> wide, broadcast_shapes({scores, s.mask}, n));
      if (wide[wide.size() - 2] != S || wide.back() != T)
        return KILN_ERROR("{}: mask {} would broadcast the scores {} to {}", n.label(),
                          shape_str(s.mask), shape_str(scores), shape_str(wide));
      scores = wide;
      sb.assign(scores.begin(), scores.end() - 2);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> yb, broadcast_shapes({sb, vb}, n));
    if (sb.size() > static_cast<size_t>(kMaxDims) || yb.size() > static_cast<size_t>(kMaxDims))
      return KILN_ERROR("{}: more than {} batch dims", n.label(), kMaxDims);
    if (y_shape) {
      *y_shape = yb;
      y_shape->push_back(S);
      y_shape->push_back(Dv);
    }
    Piece p;
    p.qk = plan_batched_gemm(qb, kb, sb, S, T, D);
    p.pv = plan_batched_gemm(sb, vb, yb, S, Dv, T);
    KILN_RETURN_IF_ERROR(check_gemm_dims(p.qk, n));
    KILN_RETURN_IF_ERROR(check_gemm_dims(p.pv, n));
    p.rows = S;
    for (int64_t d : sb) p.rows *= d;
    if (s.masked) {
      const StridedIndex bi = broadcast_index(s.mask, scores);
      std::vector<int64_t> dims(bi.dims, bi.dims + bi.rank);
      std::vector<std::vector<int64_t>> st = {
          std::vector<int64_t>(bi.strides, bi.strides + bi.rank), row_major_strides(scores)};
      coalesce_dims(dims, st);
      if (dims.size() > static_cast<size_t>(kMaxDims))
        return KILN_ERROR("{}: the mask's broadcast has too many dims", n.label());
      p.mix.rank = static_cast<int>(dims.size());
      for (size_t d = 0; d < dims.size(); ++d) {
        p.mix.dims[d] = dims[d];
        p.mix.strides[d] = st[0][d];
      }
    }
    return p;
  }

  // GEMM -> softmax (with the mask) -> GEMM over one piece, its scores at the workspace's start.
  Status run_piece(const RunContext& rc, const Piece& p, const void* q, const void* k,
                   const void* v, const void* mask, void* y) const {
    void* scores = rc.workspace;
    void* probs = probs_bytes_ ? static_cast<uint8_t*>(rc.workspace) + scores_bytes_ : scores;
    if (p.rows * len_ > 0) {
      // 16-bit types scale in the softmax kernel, after rounding the product (as the reference).
      const bool round_steps = dtype_ == DataType::kFloat16 || dtype_ == DataType::kBFloat16;
      KILN_RETURN_IF_ERROR(run_batched_gemm(rc, p.qk, dtype_, acc_, precision_,
                                            round_steps ? 1.f : scale_, q, k, scores));
      const bool wide = len_ > 1024;  // a block per row; else a warp per row
      const dim3 block = wide ? dim3(256, 1) : dim3(32, 8);
      const int64_t blocks = (p.rows + block.y - 1) / block.y;
      const unsigned grid = static_cast<unsigned>(std::min<int64_t>(blocks, 65535 * 8));
      dispatch_float(dtype_, [&](auto tag) {
        using T = decltype(tag);
        using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
        attention_softmax<A, T><<<grid, block, 0, rc.stream>>>(
            static_cast<const A*>(scores), static_cast<T*>(probs), static_cast<const T*>(mask),
            p.mix, p.rows, len_, nan_to_zero_, round_steps ? scale_ : 1.f);
      });
      KILN_CUDA_LAUNCH_CHECK("attention softmax");
    }
    return run_batched_gemm(rc, p.pv, dtype_, dtype_, precision_, 1.0, probs, v, y);
  }

  const Node* node_;
  Precision precision_;
  float scale_ = 1.f;
  bool nan_to_zero_ = false;
  DataType dtype_ = DataType::kUndefined, acc_ = DataType::kFloat32;
  AttentionChunks chunks_;
  Piece full_, tail_;  // a chunk of chunks_.step entries, and the last, shorter one
  int64_t len_ = 0, numel_ = 0;
  size_t scores_bytes_ = 0, probs_bytes_ = 0;
};

}  // namespace

Expected<std::unique_ptr<Layer>> create_attention(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new AttentionLayer(d));
}

}  // namespace kiln::gpu
