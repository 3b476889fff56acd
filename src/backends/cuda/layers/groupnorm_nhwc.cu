// GroupNormalization and kiln.FusedGroupNorm (ops/fused.h: act(GroupNorm(X + addend))) on
// channels-last float16 or float32 data, so that the convolutions around a norm keep NHWC with no reformat
// between them (a diffusion UNet or VAE: every convolution is followed by a GroupNorm and SiLU).
// norm.group runs row-major rows; in NHWC a group's elements are strided (cpg channels of every
// pixel), so this layer works on pixel tiles of all channels instead, in two kernels:
//   gn_stats  a block per (pixel tile, image) reads its tile once, 16-byte vectors of channels
//             a thread, and sums each group's elements shifted by one of them (K_g, the group's
//             first element: sum(x - K) and sum((x - K)^2) keep the variance exact to rounding
//             however far the mean is from 0). The sums meet per group in fixed order (no float
//             atomics: the result does not change from run to run); the block writes them to the
//             workspace and counts itself done, and the image's last block adds its tiles' sums
//             (again in fixed order) into each group's mean and 1/stddev and sets the count back
//             to 0 for the next run (the counts belong to the layer, zeroed when made).
//   gn_apply  the same tiles: per channel y = act(x * s + t) with s = gamma / stddev and
//             t = beta + (addend - mean) * s, read from cache where the tile still is.
// The addend (a [N or 1, C or 1, 1, 1] term) joins the element as it is read. Both kernels keep
// kernels/pdl.cuh's rule: gn_apply is launched programmatically after gn_stats (its blocks are
// scheduled while gn_stats' last wave runs, and wait for it), and the layer after this one may be
// launched so after gn_apply.
#include <algorithm>

#include "device_util_host.h"
#include "kernels/activation.cuh"
#include "kernels/device_util.cuh"
#include "kernels/pdl.cuh"
#include "ops/op.h"
#include "tactics.h"

namespace kiln::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxV = 8;          // float16 values in a 16-byte vector
constexpr int kMaxGroups = 2048;  // the block's group sums in shared memory (16 KiB)

// The layer's geometry, set at configure.
struct GnGeom {
  int64_t add_n = 0;  // the addend's element stride between images (0: one for all)
  int add_c = 0;      // between channels (0 or 1)
  int HW = 0, C = 0, G = 0, cpg = 0;
  int tiles = 0, tile_p = 0;  // pixel tiles an image, pixels a tile
  int cvb = 0, lanes = 0;     // a block's threads: cvb channel vectors x lanes pixel lanes
  float eps = 1e-5f;
  ActParams act;
};

template <typename T>
struct GnArgs : GnGeom {
  const T* x;
  T* y;
  const T* add;  // the addend, or nullptr
  ParamPtr scale, bias;
  float2* part;    // [N][tiles][G] shifted sums (workspace)
  float2* stats;   // [N][G] mean, 1/stddev (workspace)
  unsigned* done;  // [N] tiles done (the layer's, 0 between runs)
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

template <typename T>
__device__ __forceinline__ float addend_at(const GnArgs<T>& a, int n, int c) {
  return a.add ? static_cast<float>(load(a.add, n * a.add_n + static_cast<int64_t>(c) * a.add_c))
               : 0.f;
}

// K_g: the group's first element (pixel 0, its first channel) of image n, addend included.
template <typename T>
__device__ __forceinline__ float shift_of(const GnArgs<T>& a, int n, int g) {
  const int c = g * a.cpg;
  return static_cast<float>(load(a.x, static_cast<int64_t>(n) * a.HW * a.C + c)) +
         addend_at(a, n, c);
}

// V consecutive values at p as floats: one 16-byte vector (p aligned) when V fills one.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    const Vec16<T> q = *reinterpret_cast<const Vec16<T>*>(p);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = static_cast<float>(load(q.v, j));
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = static_cast<float>(load(p, j));
  }
}
template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[V]) {
  if constexpr (V * sizeof(T) == 16) {
    Vec16<T> q;
#pragma unroll
    for (int j = 0; j < V; ++j) store(q.v, j, v[j]);
    *reinterpret_cast<Vec16<T>*>(p) = q;
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) store(p, j, v[j]);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) gn_stats(GnArgs<T> a) {
  __shared__ float e1[kThreads * kMaxV], e2[kThreads * kMaxV];  // each thread's element sums
  __shared__ float gs1[kMaxGroups], gs2[kMaxGroups];             // the block's group sums
  __shared__ unsigned last;
  pdl_wait();
  pdl_launch_dependents();
  const int n = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int p0 = tile * a.tile_p, p1 = min(a.HW, p0 + a.tile_p);
  const int lc = tid % a.cvb, pl = tid / a.cvb;
  const int cvs = a.C / V;  // channel vectors a pixel
  const T* xn = a.x + static_cast<int64_t>(n) * a.HW * a.C;
  for (int g = tid; g < a.G; g += kThreads) gs1[g] = gs2[g] = 0.f;
  __syncthreads();
  for (int c_lo = 0; c_lo < a.C; c_lo += a.cvb * V) {  // passes of cvb vectors
    const int cv = c_lo / V + lc;
    float s1[V], s2[V];
#pragma unroll
    for (int j = 0; j < V; ++j) s1[j] = s2[j] = 0.f;
    if (pl < a.lanes && cv < cvs) {
      float off[V];  // addend - K_g of each channel
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int c = cv * V + j;
        off[j] = addend_at(a, n, c) - shift_of(a, n, c / a.cpg);
      }
#pragma unroll 4
      for (int p = p0 + pl; p < p1; p += a.lanes) {
        float v[V];
        load_vec<T, V>(xn + static_cast<int64_t>(p) * a.C + cv * V, v);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float d = v[j] + off[j];
          s1[j] += d;
          s2[j] = fmaf(d, d, s2[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) e1[tid * V + j] = s1[j], e2[tid * V + j] = s2[j];
    __syncthreads();
    // Each group of this pass's channels: a warp adds its elements' sums (lane by lane in a
    // fixed order, then the butterfly), then its pass total to the block's.
    const int c_hi = min(a.C, c_lo + a.cvb * V);
    const int g_lo = c_lo / a.cpg, g_hi = (c_hi - 1) / a.cpg;
    for (int g = g_lo + warp; g <= g_hi; g += kThreads / 32) {
      const int cb = max(g * a.cpg, c_lo), cnt = min((g + 1) * a.cpg, c_hi) - cb;
      float t1 = 0.f, t2 = 0.f;
      for (int i = lane; i < a.lanes * cnt; i += 32) {
        const int l = i / cnt, c = cb + i % cnt - c_lo;
        const int k = (l * a.cvb + c / V) * V + c % V;
        t1 += e1[k];
        t2 += e2[k];
      }
      t1 = warp_sum(t1);
      t2 = warp_sum(t2);
      if (lane == 0) gs1[g] += t1, gs2[g] += t2;
    }
    __syncthreads();
  }
  float2* part = a.part + (static_cast<int64_t>(n) * a.tiles + tile) * a.G;
  for (int g = tid; g < a.G; g += kThreads) part[g] = make_float2(gs1[g], gs2[g]);
  __threadfence();  // the sums reach memory before the block counts itself done
  __syncthreads();
  if (tid == 0) last = atomicAdd(a.done + n, 1u) == static_cast<unsigned>(a.tiles - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float count = static_cast<float>(a.HW) * static_cast<float>(a.cpg);
  for (int g = warp; g < a.G; g += kThreads / 32) {
    float t1 = 0.f, t2 = 0.f;
    for (int t = lane; t < a.tiles; t += 32) {
      const float2 q = __ldcg(a.part + (static_cast<int64_t>(n) * a.tiles + t) * a.G + g);
      t1 += q.x;
      t2 += q.y;
    }
    t1 = warp_sum(t1);
    t2 = warp_sum(t2);
    if (lane == 0) {
      const float d = t1 / count, var = fmaxf(t2 / count - d * d, 0.f);
      a.stats[static_cast<int64_t>(n) * a.G + g] =
          make_float2(shift_of(a, n, g) + d, 1.f / sqrtf(var + a.eps));
    }
  }
  if (tid == 0) a.done[n] = 0;
}

// kAct: 0 none, 1 Swish (SiLU), 2 any other (apply_act's switch).
template <typename T, int V, int kAct>
__global__ void __launch_bounds__(kThreads) gn_apply(GnArgs<T> a) {
  pdl_wait();
  pdl_launch_dependents();
  const int n = blockIdx.y, tile = blockIdx.x, tid = threadIdx.x;
  const int p0 = tile * a.tile_p, p1 = min(a.HW, p0 + a.tile_p);
  const int lc = tid % a.cvb, pl = tid / a.cvb;
  if (pl >= a.lanes) return;
  const int cvs = a.C / V;
  const int64_t base = static_cast<int64_t>(n) * a.HW * a.C;
  for (int cv = lc; cv < cvs; cv += a.cvb) {
    float s[V], t[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int c = cv * V + j;
      const float2 st = a.stats[static_cast<int64_t>(n) * a.G + c / a.cpg];
      s[j] = st.y * a.scale.template get<float>(c);
      t[j] = fmaf(addend_at(a, n, c) - st.x, s[j], a.bias.template get<float>(c));
    }
#pragma unroll 4
    for (int p = p0 + pl; p < p1; p += a.lanes) {
      const int64_t off = base + static_cast<int64_t>(p) * a.C + cv * V;
      float v[V];
      load_vec<T, V>(a.x + off, v);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float z = fmaf(v[j], s[j], t[j]);
        if constexpr (kAct == 1) v[j] = z / (1.f + __expf(-a.act.alpha * z));
        else if constexpr (kAct == 2) v[j] = apply_act(z, a.act);
        else v[j] = z;
      }
      store_vec<T, V>(a.y + off, v);
    }
  }
}

template <typename T, int V>
cudaError_t launch(const GnArgs<T>& a, int N, const RunContext& rc) {
  const dim3 grid(static_cast<unsigned>(a.tiles), static_cast<unsigned>(N));
  cudaError_t e = launch_kernel(rc, gn_stats<T, V>, grid, dim3(kThreads), 0, a);
  if (e != cudaSuccess) return e;
  RunContext apply = rc;  // after this layer's own gn_stats, which triggers
  apply.pdl = pdl_available();
  if (a.act.act == Act::kNone) return launch_kernel(apply, gn_apply<T, V, 0>, grid, dim3(kThreads), 0, a);
  if (a.act.act == Act::kSwish) return launch_kernel(apply, gn_apply<T, V, 1>, grid, dim3(kThreads), 0, a);
  return launch_kernel(apply, gn_apply<T, V, 2>, grid, dim3(kThreads), 0, a);
}

// V: a 16-byte vector of T where the channels and addresses allow, else one value.
template <typename T>
cudaError_t launch_any(GnArgs<T> a, int N, const RunContext& rc) {
  constexpr int kV = 16 / sizeof(T);
  const bool vec = a.C % kV == 0 && aligned16(a.x) && aligned16(a.y);
  a.cvb = std::min(a.C / (vec ? kV : 1), kThreads);
  a.lanes = kThreads / a.cvb;
  return vec ? launch<T, kV>(a, N, rc) : launch<T, 1>(a, N, rc);
}

// The addend's strides over (image, channel) from its shape, right-aligned against
// [N, C, H, W]; false unless it is one value per image and channel.
bool addend_strides(const std::vector<int64_t>& s, int64_t N, int64_t C, int64_t* sn, int* sc) {
  if (s.size() > 4) return false;
  int64_t d[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < s.size(); ++i) d[4 - s.size() + i] = s[i];
  if (d[2] != 1 || d[3] != 1 || (d[1] != 1 && d[1] != C) || (d[0] != 1 && d[0] != N))
    return false;
  *sc = d[1] == C && C > 1 ? 1 : 0;
  *sn = d[0] == N && N > 1 ? d[1] : 0;
  return true;
}

bool gn_supports(const LayerDesc& d, std::string* why) {
  const Node& n = *d.node;
  if (d.in.empty() || d.out.empty() ||
      (d.in[0].dtype != DataType::kFloat16 && d.in[0].dtype != DataType::kFloat32) ||
      d.out[0].dtype != d.in[0].dtype)
    return *why = "float16 or float32 X and Y of one type only", false;
  if (d.in[0].layout != Layout::kNHWC || d.out[0].layout != Layout::kNHWC)
    return *why = "NHWC storage only (norm.group runs row-major rows)", false;
  if (n.attrs.get_int("kiln_per_group", 0) != 0)
    return *why = "scale and bias per channel only (not the opset-18 per-group form)", false;
  const TensorType& x = d.in_type(0);
  if (x.rank() != 4 || !x.dims->at(1).is_static()) return *why = "a 4-D X of static channels", false;
  const int64_t C = x.dims->at(1).value, G = n.attrs.get_int("num_groups", 0);
  if (G <= 0 || C % G != 0 || G > kMaxGroups)
    return *why = "num_groups must divide the channels (and be at most 2048)", false;
  for (size_t i = 1; i < 3; ++i)
    if (d.in.size() <= i || !dtype_is_float(d.in[i].dtype))
      return *why = "scale and bias must be float tensors", false;
  if (d.in.size() > 3 && d.in[3].present()) {
    const TensorType& t = d.in_type(3);
    if (d.in[3].dtype != d.in[0].dtype) return *why = "the addend in X's type only", false;
    if (!t.dims || t.rank() > 4) return *why = "the addend's shape is unknown", false;
    for (int64_t i = 0; i < t.rank(); ++i) {
      const Dim& dim = t.dims->at(i);
      const int64_t axis = 4 - t.rank() + i;
      if (axis >= 2 && !(dim.is_static() && dim.value == 1))
        return *why = "the addend must be one value per image and channel", false;
    }
  }
  ActParams act;
  if (!read_activation(n.attrs, &act)) return *why = "unknown activation", false;
  return true;
}

class GroupNormNhwcLayer final : public Layer {
 public:
  explicit GroupNormNhwcLayer(const LayerDesc& d) : node_(d.node) {
    read_activation(d.node->attrs, &geo_.act);
    geo_.eps = d.node->attrs.get_float("epsilon", 1e-5f);
    G_ = d.node->attrs.get_int("num_groups", 0);
  }

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor& x = in[0];
    if (x.rank() != 4 || out[0].shape != x.shape)
      return KILN_ERROR("{}: X must be 4-D and Y of its shape", n.label());
    N_ = x.shape[0];
    const int64_t C = x.shape[1], HW = x.shape[2] * x.shape[3];
    if (G_ <= 0 || C % G_ != 0 || G_ > kMaxGroups)
      return KILN_ERROR("{}: num_groups {} must divide the {} channels", n.label(), G_, C);
    if (N_ > 65535 || HW * C >= (int64_t(1) << 31))
      return KILN_ERROR("{}: {} images of {} values are beyond the kernel's range", n.label(),
                        N_, HW * C);
    for (size_t i = 1; i < 3; ++i)
      if (in[i].numel() != C)
        return KILN_ERROR("{}: input {} has shape {}, expected {} values", n.label(), i,
                          shape_str(in[i].shape), C);
    addend_ = in.size() > 3 && in[3].present();
    if (addend_ && !addend_strides(in[3].shape, N_, C, &geo_.add_n, &geo_.add_c))
      return KILN_ERROR("{}: the addend {} is not one value per image and channel of {}",
                        n.label(), shape_str(in[3].shape), shape_str(x.shape));
    geo_.HW = static_cast<int>(HW);
    geo_.C = static_cast<int>(C);
    geo_.G = static_cast<int>(G_);
    geo_.cpg = static_cast<int>(C / G_);
    // Enough blocks for four a multiprocessor, tiles of at least 8 pixels.
    const int64_t sms = std::max(sm_count(), 1);
    const int64_t want = (4 * sms + N_ - 1) / std::max<int64_t>(N_, 1);
    const int64_t tiles = std::clamp<int64_t>(want, 1, std::max<int64_t>((HW + 7) / 8, 1));
    geo_.tile_p = static_cast<int>((HW + tiles - 1) / tiles);
    geo_.tiles = static_cast<int>((HW + geo_.tile_p - 1) / geo_.tile_p);
    const size_t counts = static_cast<size_t>(N_) * sizeof(unsigned);
    if (counts > done_bytes_) {
      KILN_RETURN_IF_ERROR(done_.reserve(counts, "GroupNorm tile counts"));
      if (cudaMemset(done_.get(), 0, counts) != cudaSuccess)
        return KILN_ERROR("{}: cannot zero the tile counts", n.label());
      done_bytes_ = counts;
    }
    part_bytes_ = (static_cast<size_t>(N_) * geo_.tiles * G_ * sizeof(float2) + 255) / 256 * 256;
    return part_bytes_ + static_cast<size_t>(N_) * G_ * sizeof(float2);
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    if (N_ == 0 || geo_.HW == 0 || geo_.C == 0) return Status::Ok();
    cudaError_t err = cudaSuccess;
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, float>) {
        GnArgs<T> a;
        static_cast<GnGeom&>(a) = geo_;
        a.x = static_cast<const T*>(in[0].data);
        a.y = static_cast<T*>(out[0].data);
        a.add = addend_ ? static_cast<const T*>(in[3].data) : nullptr;
        a.scale = {in[1].data, in[1].dtype};
        a.bias = {in[2].data, in[2].dtype};
        a.part = static_cast<float2*>(rc.workspace);
        a.stats = reinterpret_cast<float2*>(static_cast<char*>(rc.workspace) + part_bytes_);
        a.done = static_cast<unsigned*>(done_.get());
        err = launch_any(a, static_cast<int>(N_), rc);
      }
    });
    if (!ok || (in[0].dtype != DataType::kFloat16 && in[0].dtype != DataType::kFloat32))
      return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_CHECK(err);
    return Status::Ok();
  }

  bool programmatic() const override { return true; }  // kernels/pdl.cuh

 private:
  const Node* node_;
  GnGeom geo_;
  int64_t G_ = 0, N_ = 0;
  bool addend_ = false;
  size_t part_bytes_ = 0;
  DeviceMemory done_;  // the images' tile counts, done_bytes_ of them zeroed
  size_t done_bytes_ = 0;
};

Expected<std::unique_ptr<Layer>> create_gn(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GroupNormNhwcLayer(d));
}

const TacticDef kGroupNormTactics[] = {
    {"", "GroupNormalization", "groupnorm.nhwc", kF32 | kF16 | kNHWC, 0, gn_supports, create_gn},
    {"kiln", "FusedGroupNorm", "groupnorm.nhwc.fused", kF32 | kF16 | kNHWC, 0, gn_supports, create_gn},
};

}  // namespace

std::span<const TacticDef> groupnorm_tactics() { return kGroupNormTactics; }

}  // namespace kiln::gpu
