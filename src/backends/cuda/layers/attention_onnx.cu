// ONNX's Attention (opset 23-24) on the GPU, every form the CPU reference takes
// (src/ops/attention_onnx.cpp): 3-D or 4-D Q/K/V, grouped-query heads, boolean or additive masks
// (also shorter than the keys: the rest is masked), is_causal, past key/value with the
// present_key/present_value outputs, softcap, left/right windows, nonpad_kv_seqlen,
// softmax_precision and the qk_matmul_output of every qk_matmul_output_mode. The plain forms
// are mapped onto kiln.Attention by the optimizer (passes/map_onnx_attention.cpp); this layer
// runs the rest.
//
// Correct first: one block per query row (batch, head, row) computes its scores over all keys in
// double, rounding to the input type after every step the reference rounds at (Q and K each
// scaled by sqrt(scale), the scores, softcap, the biased scores, each softmax step in
// softmax_precision, bfloat16 sums element by element in order), so float16/bfloat16 results
// are those of the CPU reference. The row's scores live in the workspace (one row per block of
// the grid). present_key/present_value are a separate copy kernel (past ++ current).
#include <algorithm>
#include <cmath>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 128;
constexpr int64_t kMaxBlocks = 4096;

// A float tensor of any storage type, read and written as double.
struct AnyPtr {
  void* p = nullptr;
  DataType t = DataType::kUndefined;
  __device__ double get(int64_t i) const {
    switch (t) {
      case DataType::kFloat16:
        return __half2float(static_cast<const __half*>(p)[i]);
      case DataType::kBFloat16:
        return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
      case DataType::kFloat64:
        return static_cast<const double*>(p)[i];
      case DataType::kBool:
        return static_cast<const bool*>(p)[i] ? 1.0 : 0.0;
      default:
        return static_cast<const float*>(p)[i];
    }
  }
  __device__ void set(int64_t i, double v) const {
    switch (t) {
      case DataType::kFloat16:
        static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v));
        break;
      case DataType::kBFloat16:
        static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v));
        break;
      case DataType::kFloat64:
        static_cast<double*>(p)[i] = v;
        break;
      default:
        static_cast<float*>(p)[i] = static_cast<float>(v);
        break;
    }
  }
};

AnyPtr ptr_of(const DeviceTensor& t) {
  return AnyPtr{t.data, t.present() ? t.dtype : DataType::kUndefined};
}

// round_to of the CPU reference: through float, then to the 16-bit type.
__device__ double round_to(DataType t, double x) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<float>(x);
    case DataType::kFloat16:
      return __half2float(__float2half_rn(static_cast<float>(x)));
    case DataType::kBFloat16:
      return __bfloat162float(__float2bfloat16_rn(static_cast<float>(x)));
    default:
      return x;
  }
}

// Everything one launch needs, by value.
struct Params {
  AnyPtr q, k, v, pk, pv, mask, y, qk;
  const void* nonpad = nullptr;
  bool nonpad64 = true;
  bool packed = false, causal = false, mask_bool = false;
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Skv = 0, P = 0, D = 0, Dv = 0, L = 0;
  int64_t Lm = 0, ms[4] = {};  // mask's last dim and broadcast strides over [B, Hq, Sq, Lm]
  int64_t mode = 0, left = -1, right = -1;
  double scale_sqrt = 1, softcap = 0;
  DataType t = DataType::kFloat32, sp = DataType::kFloat32;  // logical type; softmax precision
  __host__ __device__ bool has_past() const { return pk.p != nullptr; }
};

// Element d of head h's row s of a 3-D (packed) or 4-D input with S rows and H heads.
__device__ __forceinline__ int64_t in_index(bool packed, int64_t b, int64_t h, int64_t s, int64_t d,
                                            int64_t H, int64_t S, int64_t D) {
  return packed ? ((b * S + s) * H + h) * D + d : ((b * H + h) * S + s) * D + d;
}

// Key/value j (of L = P + Skv) of kv head h: from the past for j < P, else the current input.
__device__ __forceinline__ double kv_at(const Params& p, bool value, int64_t b, int64_t h,
                                        int64_t j, int64_t d) {
  const int64_t D = value ? p.Dv : p.D;
  if (j < p.P) return (value ? p.pv : p.pk).get(((b * p.Hkv + h) * p.P + j) * D + d);
  return (value ? p.v : p.k).get(in_index(p.packed, b, h, j - p.P, d, p.Hkv, p.Skv, D));
}

__device__ int64_t nonpad_len(const Params& p, int64_t b) {
  return p.nonpad64 ? static_cast<const int64_t*>(p.nonpad)[b]
                    : static_cast<const int32_t*>(p.nonpad)[b];
}

// The additive bias of score (b, h, i, j), as the reference's Bias::at.
__device__ double bias_at(const Params& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  double bias = 0;
  if (p.mask.p) {
    if (j >= p.Lm) return -INFINITY;
    const double m = p.mask.get(b * p.ms[0] + h * p.ms[1] + i * p.ms[2] + j * p.ms[3]);
    bias = p.mask_bool ? (m != 0 ? 0.0 : -INFINITY) : round_to(p.t, m);
  }
  const bool has_nonpad = p.nonpad != nullptr;
  const int64_t offset = p.has_past() ? p.P : has_nonpad ? nonpad_len(p, b) - p.Sq : 0;
  if (p.causal && j > i + offset) return -INFINITY;
  const int64_t diff = i + offset - j;
  if ((p.left >= 0 && diff > p.left) || (p.right >= 0 && -diff > p.right)) return -INFINITY;
  if (has_nonpad && j >= nonpad_len(p, b)) return -INFINITY;
  return bias;
}

template <bool kMax>
__device__ double block_reduce(double v, double* smem) {
  for (int o = 16; o > 0; o /= 2) {
    const double w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmax(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();  // smem may still be read from the previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = kMax ? -INFINITY : 0.0;
  for (int w = 0; w < nw; ++w) v = kMax ? fmax(v, smem[w]) : v + smem[w];
  return v;
}

// One block per query row; `rows` is the block's scratch of L doubles per row in flight.
__global__ void attention_onnx_kernel(Params p, double* scratch) {
  extern __shared__ double qrow[];  // the row of Q, scaled and rounded
  __shared__ double red[32];
  __shared__ double bsum;
  double* row = scratch + blockIdx.x * p.L;
  const double ss = round_to(p.t, p.scale_sqrt);  // sqrt(scale) in the input type
  const int64_t rows = p.B * p.Hq * p.Sq;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % p.Sq, h = (r / p.Sq) % p.Hq, b = r / (p.Sq * p.Hq);
    const int64_t kvh = h / (p.Hq / p.Hkv);
    __syncthreads();  // the previous row is done with qrow and row
    for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x)
      qrow[d] = round_to(p.t, p.q.get(in_index(p.packed, b, h, i, d, p.Hq, p.Sq, p.D)) * ss);
    __syncthreads();
    // Scores, softcap, bias.
    bool live = false;  // some key is not masked out by the bias
    for (int64_t j = threadIdx.x; j < p.L; j += blockDim.x) {
      double acc = 0;
      for (int64_t d = 0; d < p.D; ++d)
        acc += qrow[d] * round_to(p.t, kv_at(p, false, b, kvh, j, d) * ss);
      double x = round_to(p.t, acc);
      if (p.softcap > 0)
        x = round_to(p.t, round_to(p.t, tanh(round_to(p.t, x / p.softcap))) * p.softcap);
      const double bias = bias_at(p, b, h, i, j);
      live = live || bias != -INFINITY;
      row[j] = round_to(p.t, x + bias);
      if (p.qk.p && p.mode < 3) p.qk.set(r * p.L + j, p.mode == 2 ? row[j] : x);
    }
    const bool all_masked = !__syncthreads_or(live);
    // Softmax in softmax_precision (rs), as the reference's softmax_row.
    double mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < p.L; j += blockDim.x) mx = fmax(mx, round_to(p.sp, row[j]));
    mx = block_reduce<true>(mx, red);
    if (mx == -INFINITY) mx = 0;
    double sum = 0;
    for (int64_t j = threadIdx.x; j < p.L; j += blockDim.x) {
      row[j] = round_to(p.sp, exp(round_to(p.sp, round_to(p.sp, row[j]) - mx)));
      sum += row[j];
    }
    if (p.sp == DataType::kBFloat16) {  // numpy's bfloat16 sum rounds after every element
      __syncthreads();
      if (threadIdx.x == 0) {
        double s = 0;
        for (int64_t j = 0; j < p.L; ++j) s = round_to(p.sp, s + row[j]);
        bsum = s;
      }
      __syncthreads();
      sum = bsum;
    } else {
      sum = block_reduce<false>(sum, red);
    }
    sum = round_to(p.sp, sum);
    if (sum == 0) sum = 1;
    for (int64_t j = threadIdx.x; j < p.L; j += blockDim.x) {
      row[j] = all_masked ? 0.0 : round_to(p.t, round_to(p.sp, row[j] / sum));
      if (p.qk.p && p.mode == 3) p.qk.set(r * p.L + j, row[j]);
    }
    __syncthreads();
    // Y = probabilities @ V.
    for (int64_t d = threadIdx.x; d < p.Dv; d += blockDim.x) {
      double acc = 0;
      for (int64_t j = 0; j < p.L; ++j) acc += row[j] * kv_at(p, true, b, kvh, j, d);
      p.y.set(p.packed ? ((b * p.Sq + i) * p.Hq + h) * p.Dv + d : r * p.Dv + d, round_to(p.t, acc));
    }
  }
}

// present = past ++ current along the sequence, [B, Hkv, L, D].
__global__ void attention_present_kernel(Params p, bool value, AnyPtr out) {
  const int64_t D = value ? p.Dv : p.D, n = p.B * p.Hkv * p.L * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, j = (e / D) % p.L, h = (e / (D * p.L)) % p.Hkv,
                  b = e / (D * p.L * p.Hkv);
    out.set(e, kv_at(p, value, b, h, j, d));
  }
}

bool is_f(DataType t) { return dtype_is_float(t); }

bool supports(const LayerDesc& d, std::string* why) {
  for (size_t i : {0, 1, 2})
    if (d.in.size() <= i || !is_f(d.in[i].dtype)) return *why = "float Q, K and V only", false;
  for (size_t i : {4, 5})
    if (d.in.size() > i && d.in[i].dtype != DataType::kUndefined && !is_f(d.in[i].dtype))
      return *why = "float past key/value only", false;
  if (d.in.size() > 3 && d.in[3].dtype != DataType::kUndefined && !is_f(d.in[3].dtype) &&
      d.in[3].dtype != DataType::kBool)
    return *why = "the mask must be boolean or float", false;
  if (d.in.size() > 6 && d.in[6].dtype != DataType::kUndefined &&
      d.in[6].dtype != DataType::kInt64 && d.in[6].dtype != DataType::kInt32)
    return *why = "nonpad_kv_seqlen must be int64 or int32", false;
  for (const TensorFormat& f : d.in)
    if (f.layout != Layout::kLinear) return *why = "linear layouts only", false;
  const int64_t sp = d.node->attrs.get_int("softmax_precision", 0);
  if (sp != 0 && (!dtype_code_is_valid(sp) || !is_f(static_cast<DataType>(sp))))
    return *why = "softmax_precision is not a float type", false;
  return true;
}

class AttentionOnnxLayer final : public Layer {
 public:
  explicit AttentionOnnxLayer(const LayerDesc& d) : node_(d.node) {
    const Attributes& a = d.node->attrs;
    p_.t = d.in_type(0).dtype;
    const int64_t sp = a.get_int("softmax_precision", 0);
    p_.sp = sp == 0 ? p_.t : static_cast<DataType>(sp);
    scale_ = a.get_float("scale", 0.f);
    p_.softcap = a.get_float("softcap", 0.f);
    p_.causal = a.get_int("is_causal", 0) != 0;
    p_.mode = a.get_int("qk_matmul_output_mode", 0);
    p_.left = a.get_int("left_window_size", -1);
    p_.right = a.get_int("right_window_size", -1);
  }

  Expected<size_t> configure(const RunContext& rc, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override;
  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override;

 private:
  const Node* node_;
  Params p_;
  double scale_ = 0;
  int64_t blocks_ = 0;
};

Expected<size_t> AttentionOnnxLayer::configure(const RunContext& rc,
                                               std::span<const DeviceTensor> in,
                                               std::span<const DeviceTensor> out) {
  const Node& n = *node_;
  auto opt = [&](size_t i) { return in.size() > i && in[i].present() ? &in[i] : nullptr; };
  const DeviceTensor &q = in[0], &k = in[1], &v = in[2];
  const DeviceTensor *mask = opt(3), *pk = opt(4), *pv = opt(5), *nonpad = opt(6);
  if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
    return KILN_ERROR("{}: Q, K and V must all be 3-D or all 4-D", n.label());
  if (!pk != !pv) return KILN_ERROR("{}: past_key and past_value go together", n.label());
  if (pk && nonpad)
    return KILN_ERROR("{}: nonpad_kv_seqlen cannot be combined with past_key", n.label());
  if (p_.mode < 0 || p_.mode > 3 || p_.left < -1 || p_.right < -1)
    return KILN_ERROR("{}: bad qk_matmul_output_mode or window size", n.label());
  Params& p = p_;
  p.packed = q.rank() == 3;
  p.B = q.shape[0];
  if (p.packed) {
    p.Hq = n.attrs.get_int("q_num_heads", 0), p.Hkv = n.attrs.get_int("kv_num_heads", 0);
    if (p.Hq <= 0 || p.Hkv <= 0 || q.shape[2] % p.Hq || k.shape[2] % p.Hkv || v.shape[2] % p.Hkv)
      return KILN_ERROR(
          "{}: 3-D inputs need q_num_heads and kv_num_heads dividing the hidden "
          "sizes",
          n.label());
    p.Sq = q.shape[1], p.Skv = k.shape[1], p.D = q.shape[2] / p.Hq, p.Dv = v.shape[2] / p.Hkv;
    if (k.shape[2] / p.Hkv != p.D) return KILN_ERROR("{}: Q and K head sizes differ", n.label());
  } else {
    p.Hq = q.shape[1], p.Sq = q.shape[2], p.D = q.shape[3];
    p.Hkv = k.shape[1], p.Skv = k.shape[2], p.Dv = v.shape[3];
    if (k.shape[3] != p.D) return KILN_ERROR("{}: Q and K head sizes differ", n.label());
  }
  if (p.Hkv <= 0 || p.Hq % p.Hkv)
    return KILN_ERROR("{}: q heads ({}) must be a multiple of kv heads ({})", n.label(), p.Hq,
                      p.Hkv);
  if (k.shape[0] != p.B || v.shape[0] != p.B || (p.packed ? v.shape[1] : v.shape[2]) != p.Skv ||
      (!p.packed && v.shape[1] != p.Hkv))
    return KILN_ERROR("{}: Q, K and V do not fit", n.label());
  p.P = pk ? pk->shape[2] : 0;
  if (pk && (pk->rank() != 4 || pv->rank() != 4 ||
             pk->shape != std::vector<int64_t>{p.B, p.Hkv, p.P, p.D} ||
             pv->shape != std::vector<int64_t>{p.B, p.Hkv, p.P, p.Dv}))
    return KILN_ERROR("{}: past_key / past_value do not fit K and V", n.label());
  p.L = p.P + p.Skv;
  if (nonpad && nonpad->numel() != p.B)
    return KILN_ERROR("{}: nonpad_kv_seqlen must hold {} values", n.label(), p.B);
  const std::vector<int64_t> scores = {p.B, p.Hq, p.Sq, p.L};
  p.mask_bool = mask && mask->dtype == DataType::kBool;
  if (mask) {
    if (mask->rank() < 1 || mask->rank() > 4 || mask->shape.back() > p.L)
      return KILN_ERROR("{}: attn_mask {} does not fit scores {}", n.label(),
                        shape_str(mask->shape), shape_str(scores));
    std::vector<int64_t> full = scores;
    full[3] = p.Lm = mask->shape.back();
    for (int64_t d = 0; d < mask->rank(); ++d) {
      const int64_t md = mask->shape[d], fd = full[static_cast<size_t>(4 - mask->rank() + d)];
      if (md != 1 && md != fd)
        return KILN_ERROR("{}: attn_mask {} does not broadcast to scores {}", n.label(),
                          shape_str(mask->shape), shape_str(scores));
    }
    const std::vector<int64_t> st = broadcast_strides(mask->shape, full);
    std::copy(st.begin(), st.end(), p.ms);
  }
  const std::vector<int64_t> y = p.packed ? std::vector<int64_t>{p.B, p.Sq, p.Hq * p.Dv}
                                          : std::vector<int64_t>{p.B, p.Hq, p.Sq, p.Dv};
  const std::vector<int64_t> want[4] = {y, {p.B, p.Hkv, p.L, p.D}, {p.B, p.Hkv, p.L, p.Dv}, scores};
  for (size_t o = 0; o < out.size() && o < 4; ++o)
    if (out[o].present() && out[o].shape != want[o])
      return KILN_ERROR("{}: output {} has shape {}, expected {}", n.label(), o,
                        shape_str(out[o].shape), shape_str(want[o]));
  if (static_cast<size_t>(p.D) * sizeof(double) > 48 * 1024)
    return KILN_ERROR("{}: head size {} is too large for this kernel", n.label(), p.D);
  // The kernel rounds it to the input type, as the reference does.
  p.scale_sqrt = std::sqrt(scale_ != 0 ? scale_ : 1.0 / std::sqrt(double(p.D)));
  blocks_ = std::min<int64_t>(p.B * p.Hq * p.Sq, kMaxBlocks);
  const size_t need = static_cast<size_t>(blocks_ * p.L) * sizeof(double);
  if (need > rc.workspace_limit)
    return KILN_ERROR("{}: the attention rows need {} MiB of workspace, over the limit of {} MiB",
                      n.label(), need >> 20, rc.workspace_limit >> 20);
  return need;
}

Status AttentionOnnxLayer::run(const RunContext& rc, std::span<const DeviceTensor> in,
                               std::span<const DeviceTensor> out) {
  auto opt_in = [&](size_t i) { return in.size() > i ? ptr_of(in[i]) : AnyPtr{}; };
  auto opt_out = [&](size_t i) { return out.size() > i ? ptr_of(out[i]) : AnyPtr{}; };
  Params p = p_;
  p.q = ptr_of(in[0]), p.k = ptr_of(in[1]), p.v = ptr_of(in[2]);
  p.mask = opt_in(3), p.pk = opt_in(4), p.pv = opt_in(5);
  p.nonpad = in.size() > 6 && in[6].present() ? in[6].data : nullptr;
  p.nonpad64 = !p.nonpad || in[6].dtype == DataType::kInt64;
  p.y = opt_out(0), p.qk = opt_out(3);
  for (size_t o : {1, 2}) {
    const AnyPtr pres = opt_out(o);
    const int64_t n = p.B * p.Hkv * p.L * (o == 1 ? p.D : p.Dv);
    if (!pres.p || n == 0) continue;
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65535));
    attention_present_kernel<<<grid, 256, 0, rc.stream>>>(p, o == 2, pres);
    KILN_CUDA_LAUNCH_CHECK("attention present key/value");
  }
  if (blocks_ == 0) return Status::Ok();
  const size_t smem = static_cast<size_t>(p.D) * sizeof(double);
  attention_onnx_kernel<<<static_cast<unsigned>(blocks_), kThreads, smem, rc.stream>>>(
      p, static_cast<double*>(rc.workspace));
  KILN_CUDA_LAUNCH_CHECK("attention_onnx");
  return Status::Ok();
}

}  // namespace

bool attention_onnx_supports(const LayerDesc& d, std::string* why) { return supports(d, why); }

Expected<std::unique_ptr<Layer>> create_attention_onnx(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new AttentionOnnxLayer(d));
}

}  // namespace kiln::gpu
