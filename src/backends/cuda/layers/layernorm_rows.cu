// LayerNormalization and RMSNormalization over the last axis and kiln.SkipLayerNorm (ops/fused.h):
// a group of L lanes per row (a warp for rows of 32 vectors or more; 4, 8 or 16 lanes for
// shorter rows, so that ConvNeXt's and Swin's rows of 96 to 384 channels keep every lane busy),
// the row held in registers as 16-byte vectors (8 float16 or 4 float32 per load), statistics in
// float32 from the registers (mean, then the centred sum of squares), so an FP16 engine never
// overflows here whatever the residual stream holds. SkipLayerNorm adds Skip to X first and
// writes the sum as its second output when the graph reads it (a pre-norm transformer's
// residual), one pass over the three tensors. RMSNormalization scales by the root mean square
// instead (no mean subtracted, no B). norm.layer and norm.rms (layers/norm.cu) take the other
// shapes: rows longer than 16 vectors per lane, other axes, the Mean and InvStdDev outputs.
#include <cuda_fp16.h>

#include "kernels/device_util.cuh"
#include "kernels/pdl.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kRowsPerBlock = 4;
constexpr int kMaxChunks = 16;  // 16-byte vectors per lane: rows of up to 4096 float16 values
constexpr int kPrefetchChunks = 4;  // "prefetch": rows of up to 1024 float16 values

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void unpack(const uint4& u, float (&f)[kVec<T>]) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __half22float2(h[i]);
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  } else {
    const float* p = reinterpret_cast<const float*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = p[i];
  }
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float (&f)[kVec<T>]) {
  uint4 u;
  if constexpr (std::is_same_v<T, __half>) {
    __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
  } else {
    float* p = reinterpret_cast<float*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = f[i];
  }
  return u;
}

// The sum over each aligned group of L lanes (every lane of the warp takes part).
template <int L>
__device__ __forceinline__ float group_total(float v) {
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

struct RowsArgs {
  const void *x, *skip, *gamma, *beta;
  void *y, *sum;
  int64_t rows;
  int vectors;  // per row
  float eps;
};

// Y = LN(X [+ Skip]) per row of `vectors` 16-byte vectors; Sum = X + Skip when `sum` is set.
// kPrefetch (the "prefetch" variant, rows of up to 4 vectors a lane): every load of the row (X,
// Skip, Scale, B) is issued before the first is used, so that the loads of Scale and B do not
// wait behind the two reductions.
// kRms: y = x / sqrt(mean(x^2) + eps) * Scale (RMSNormalization).
// L lanes a row, 32 / L rows a warp: a group past the last row loads and stores nothing but
// stays for the warp's shuffles.
template <typename T, int CHUNKS, bool kSkip, bool kPrefetch, bool kRms, int L>
__global__ void __launch_bounds__(32 * kRowsPerBlock) layernorm_rows(RowsArgs a) {
  constexpr int E = kVec<T>;
  pdl_wait();  // kernels/pdl.cuh: launched with programmatic dependent launch
  pdl_launch_dependents();
  const int lane = threadIdx.x % L;
  const int64_t row =
      (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.y) * (32 / L) + threadIdx.x / L;
  if (L == 32 && row >= a.rows) return;
  const int vectors = row < a.rows ? a.vectors : 0;
  const uint4* x = static_cast<const uint4*>(a.x) + row * a.vectors;
  const uint4* skip = kSkip ? static_cast<const uint4*>(a.skip) + row * a.vectors : nullptr;
  const uint4* gamma = static_cast<const uint4*>(a.gamma);
  const uint4* beta = static_cast<const uint4*>(a.beta);
  uint4 px[CHUNKS], ps[CHUNKS], pg[CHUNKS], pb[CHUNKS];  // kPrefetch's loads
  if constexpr (kPrefetch) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < CHUNKS; ++j) {
      const int c = lane + L * j;
      const bool in = c < vectors;
      px[j] = in ? x[c] : zero;
      if constexpr (kSkip) ps[j] = in ? skip[c] : zero;
      pg[j] = in ? gamma[c] : zero;
      pb[j] = in && beta ? beta[c] : zero;
    }
  }
  float v[CHUNKS][E];
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c = lane + L * j;
    if (c >= vectors) break;
    unpack<T>(kPrefetch ? px[j] : x[c], v[j]);
    if constexpr (kSkip) {
      float w[E];
      unpack<T>(kPrefetch ? ps[j] : skip[c], w);
#pragma unroll
      for (int e = 0; e < E; ++e) v[j][e] += w[e];
      if (a.sum) (static_cast<uint4*>(a.sum) + row * a.vectors)[c] = pack<T>(v[j]);
    }
#pragma unroll
    for (int e = 0; e < E; ++e) s += v[j][e];
  }
  const float n = static_cast<float>(a.vectors * E);
  const float mean = kRms ? 0.f : group_total<L>(s) / n;
  float q = 0.f;
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    if (lane + L * j >= vectors) break;
#pragma unroll
    for (int e = 0; e < E; ++e) q += (v[j][e] - mean) * (v[j][e] - mean);
  }
  const float inv = rsqrtf(group_total<L>(q) / n + a.eps);
  uint4* y = static_cast<uint4*>(a.y) + row * a.vectors;
#pragma unroll
  for (int j = 0; j < CHUNKS; ++j) {
    const int c = lane + L * j;
    if (c >= vectors) break;
    float g[E], b[E];
    unpack<T>(kPrefetch ? pg[j] : gamma[c], g);
    if (a.beta) unpack<T>(kPrefetch ? pb[j] : beta[c], b);
#pragma unroll
    for (int e = 0; e < E; ++e) v[j][e] = (v[j][e] - mean) * inv * g[e] + (a.beta ? b[e] : 0.f);
    y[c] = pack<T>(v[j]);
  }
}

using RowsKernel = void (*)(RowsArgs);

// Lanes a row: the group of 4 to 32 lanes that leaves the fewest lanes idle over a row of
// `vectors` (ties: the wider group), shorter groups holding at most 4 vectors a lane. ConvNeXt's
// and Swin's 96, 192, 384 and 768 float16 channels: 4, 8, 16 and 32 lanes of 3 vectors each.
int lanes_for(int vectors) {
  int best = 32;
  double best_use = 0;
  for (int l : {32, 16, 8, 4}) {
    const int chunks = (vectors + l - 1) / l;
    if (l < 32 && chunks > kPrefetchChunks) continue;
    const double use = double(vectors) / (double(l) * chunks);
    if (use > best_use + 1e-9) best = l, best_use = use;
  }
  return best;
}

// The kernel with the fewest of 1 to 4 vectors a lane that hold the row: every group of fewer
// than 32 lanes, and a warp's prefetch variant.
template <typename T, bool kSkip, bool kRms, bool kPrefetch, int L>
RowsKernel pick_few(int chunks) {
  if (chunks <= 1) return layernorm_rows<T, 1, kSkip, kPrefetch, kRms, L>;
  if (chunks <= 2) return layernorm_rows<T, 2, kSkip, kPrefetch, kRms, L>;
  if (chunks <= 3) return layernorm_rows<T, 3, kSkip, kPrefetch, kRms, L>;
  return layernorm_rows<T, 4, kSkip, kPrefetch, kRms, L>;
}
template <typename T, bool kSkip, bool kRms, int L>
RowsKernel pick_few(int chunks, bool prefetch) {
  return prefetch ? pick_few<T, kSkip, kRms, true, L>(chunks)
                  : pick_few<T, kSkip, kRms, false, L>(chunks);
}

template <typename T, bool kSkip, bool kRms = false>
RowsKernel pick(int vectors, int lanes, bool prefetch) {
  const int chunks = (vectors + lanes - 1) / lanes;
  if (lanes == 4) return pick_few<T, kSkip, kRms, 4>(chunks, prefetch);
  if (lanes == 8) return pick_few<T, kSkip, kRms, 8>(chunks, prefetch);
  if (lanes == 16) return pick_few<T, kSkip, kRms, 16>(chunks, prefetch);
  if (prefetch && chunks <= kPrefetchChunks) return pick_few<T, kSkip, kRms, true, 32>(chunks);
  if (chunks <= 1) return layernorm_rows<T, 1, kSkip, false, kRms, 32>;
  if (chunks <= 2) return layernorm_rows<T, 2, kSkip, false, kRms, 32>;
  if (chunks <= 4) return layernorm_rows<T, 4, kSkip, false, kRms, 32>;
  if (chunks <= 8) return layernorm_rows<T, 8, kSkip, false, kRms, 32>;
  return layernorm_rows<T, kMaxChunks, kSkip, false, kRms, 32>;
}

bool skip_op(const Node& n) { return n.domain == "kiln" && n.op_type == "SkipLayerNorm"; }
bool rms_op(const Node& n) { return n.domain.empty() && n.op_type == "RMSNormalization"; }

bool rows_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  const bool skip = skip_op(n);
  const DataType t = d.in.empty() ? DataType::kUndefined : d.in[0].dtype;
  if (t != DataType::kFloat16 && t != DataType::kFloat32)
    return *why = "float16 or float32 only", false;
  const size_t params = skip ? 2 : 1;  // Scale's slot
  for (size_t i = 0; i < d.in.size(); ++i)
    if (d.in[i].present() && d.in[i].dtype != t) return *why = "inputs differ in type", false;
  const TensorType& x = d.in_type(0);
  const int64_t axis = n.attrs.get_int("axis", -1);
  if (!x.has_rank() || (axis != -1 && axis != x.rank() - 1))
    return *why = "the last axis only", false;
  const Dim& last = x.dims->back();
  const int64_t e = 16 / static_cast<int64_t>(dtype_size(t));
  if (!last.is_static() || last.value % e != 0 || last.value / e > 32 * kMaxChunks)
    return *why = "rows of a multiple of 16 bytes, at most " + std::to_string(32 * kMaxChunks) +
                  " vectors",
           false;
  for (size_t i = params; i < params + 2 && i < d.in.size(); ++i) {
    const Tensor* p = d.in_const(i);
    if (n.input(i) && (!p || p->numel() != last.value))
      return *why = "Scale and B must be constants of the row's length", false;
  }
  if (!d.in_const(params)) return *why = "Scale must be a constant", false;
  if (!skip)
    for (size_t o = 1; o < n.num_outputs(); ++o)
      if (n.output(o)) return *why = "the Mean and InvStdDev outputs are not written", false;
  return true;
}

class LayerNormRows final : public Layer {
 public:
  explicit LayerNormRows(const LayerDesc& d)
      : node_(d.node),
        skip_(skip_op(*d.node)),
        rms_(rms_op(*d.node)),
        prefetch_(d.variant == "prefetch") {
    eps_ = d.node->attrs.get_float("epsilon", 1e-5f);
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const DeviceTensor& x = in[0];
    if (x.rank() < 1) return KILN_ERROR("{}: X must have rank >= 1", node_->label());
    if (skip_ && in[1].shape != x.shape)
      return KILN_ERROR("{}: X {} and Skip {} differ in shape", node_->label(), shape_str(x.shape),
                        shape_str(in[1].shape));
    const int64_t len = x.shape.back(), e = 16 / static_cast<int64_t>(dtype_size(x.dtype));
    vectors_ = static_cast<int>(len / e);
    rows_ = len == 0 ? 0 : x.numel() / len;
    lanes_ = lanes_for(vectors_);
    const int v = vectors_, l = lanes_;
    const bool f16 = x.dtype == DataType::kFloat16;
    const bool p = prefetch_;
    kernel_ = skip_ ? (f16 ? pick<__half, true>(v, l, p) : pick<float, true>(v, l, p))
              : rms_ ? (f16 ? pick<__half, false, true>(v, l, p)
                            : pick<float, false, true>(v, l, p))
                     : (f16 ? pick<__half, false>(v, l, p) : pick<float, false>(v, l, p));
    return size_t{0};
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (rows_ == 0) return Status::Ok();
    const size_t p = skip_ ? 2 : 1;
    RowsArgs a{};
    a.x = in[0].data;
    a.skip = skip_ ? in[1].data : nullptr;
    a.gamma = in[p].data;
    a.beta = !rms_ && in.size() > p + 1 && in[p + 1].present() ? in[p + 1].data : nullptr;
    a.y = out[0].data;
    a.sum = skip_ && out.size() > 1 && out[1].present() ? out[1].data : nullptr;
    a.rows = rows_;
    a.vectors = vectors_;
    a.eps = eps_;
    for (const void* ptr : {a.x, a.skip, a.gamma, a.beta, static_cast<const void*>(a.y),
                            static_cast<const void*>(a.sum)})
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return KILN_ERROR("{}: a tensor is not 16-byte aligned", node_->label());
    const int64_t per_block = int64_t(kRowsPerBlock) * (32 / lanes_);
    const int64_t blocks = (rows_ + per_block - 1) / per_block;
    if (blocks > INT32_MAX) return KILN_ERROR("{}: too many rows", node_->label());
    const dim3 grid(static_cast<unsigned>(blocks)), block(32, kRowsPerBlock);
    KILN_CUDA_CHECK(launch_kernel(rc, kernel_, grid, block, 0, a));
    return Status::Ok();
  }

 private:
  const Node* node_;
  bool skip_;
  bool rms_;
  bool prefetch_;
  float eps_;
  int vectors_ = 0;
  int lanes_ = 32;  // a row's lanes (lanes_for)
  int64_t rows_ = 0;
  RowsKernel kernel_ = nullptr;
};

Expected<std::unique_ptr<Layer>> create_rows(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new LayerNormRows(d));
}

// "" and "prefetch" (rows of up to 4 vectors a lane; longer rows run the default kernel under
// that name).
std::vector<std::string> rows_variants(const LayerDesc&) { return {"", "prefetch"}; }

const TacticDef kRowsTactics[] = {
    {"", "LayerNormalization", "norm.layer.rows", kF32 | kF16, 0, rows_supports, create_rows,
     rows_variants},
    {"kiln", "SkipLayerNorm", "skip_layernorm.rows", kF32 | kF16, 0, rows_supports, create_rows,
     rows_variants},
    {"", "RMSNormalization", "norm.rms.rows", kF32 | kF16, 0, rows_supports, create_rows,
     rows_variants},
};

}  // namespace

std::span<const TacticDef> layernorm_rows_tactics() { return kRowsTactics; }

}  // namespace kiln::gpu
