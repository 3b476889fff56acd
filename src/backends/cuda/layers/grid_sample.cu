// Sampling family: GridSample (src/ops/sampling.cpp is the spec) for 4-D and 5-D X, every mode,
// padding and align_corners; RoiAlign (roi_align.cu) and AffineGrid (affine_grid.cu) join its
// table.
//
// A thread takes one output point of one image and a run of `cpt` channels: it reads the point's
// coordinates once, makes each axis' taps and weights (ops/sampling_math.h, the reference's own
// code, in float — double for float64 tensors) and sums the taps of each channel of the run.
// Adjacent threads take adjacent output points of the same channels, so the grid is read and Y
// written in whole lines, and neighbouring points read neighbouring pixels. RAFT's correlation
// lookup, 48 GridSamples of C = 1 maps (one small map per pixel of the flow field, 81 points
// each), is then a thread per output element over ~2.3 * 10^5 points; wide feature maps share
// each point's weights over up to `cpt` channels (chosen at configure so the launch still fills
// the GPU).
//
// Row-major X, grid and Y only: an NHWC candidate would also store the grid, a 4-D tensor, as
// NHWC, splitting each point's coordinates apart. A non-finite coordinate gives NaN, as on the
// CPU.
#include <algorithm>
#include <string>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "ops/sampling_math.h"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> roi_align_tactics();    // roi_align.cu
std::span<const TacticDef> affine_grid_tactics();  // affine_grid.cu

namespace {

using namespace sampling;

constexpr int kMaxSpatial = 3;

struct GsParams {
  int64_t C = 0, points = 0;      // channels; output points per image
  int64_t cpt = 1, runs = 1;      // channels per thread; runs of them per image
  int64_t in[kMaxSpatial] = {};   // X's spatial lengths, outermost first
  int64_t str[kMaxSpatial] = {};  // their strides within one channel
  int64_t in_size = 0;            // X elements per channel
  int pad = kGsZeros;
  bool align = false;
};

// Taps per axis of each mode.
template <int kMode>
constexpr int kTaps = kMode == kGsNearest  ? 1
                      : kMode == kGsLinear ? 2
                                           : 4;

// The sum over the taps of axes K.. of one sample, innermost axis first within each outer tap,
// as the reference's sum_taps (src/ops/sampling.cpp) adds them.
template <int K, int kNd, int kNt, typename Cp, typename T>
__device__ __forceinline__ Cp gs_sum(const T* __restrict__ x, const GsTaps<Cp>* t,
                                     const GsParams& p, int64_t off) {
  Cp s = 0;
#pragma unroll
  for (int a = 0; a < kNt; ++a) {
    const int64_t idx = t[K].idx[a];
    if (idx < 0) continue;  // zero padding
    Cp v;
    if constexpr (K + 1 == kNd)
      v = static_cast<Cp>(load(x, off + idx));
    else
      v = gs_sum<K + 1, kNd, kNt>(x, t, p, off + idx * p.str[K]);
    s += t[K].w[a] * v;
  }
  return s;
}

template <typename T, int kNd, int kMode>
__global__ void grid_sample_kernel(const T* __restrict__ x, const T* __restrict__ grid,
                                   T* __restrict__ y, int64_t n,
                                   const __grid_constant__ GsParams p) {
  using Cp = std::conditional_t<std::is_same_v<T, double>, double, float>;
  KILN_GRID_STRIDE(i, n) {
    const int64_t pt = i % p.points, rest = i / p.points;
    const int64_t run = rest % p.runs, b = rest / p.runs;
    GsTaps<Cp> t[kNd];
    bool finite = true;
    const T* g = grid + (b * p.points + pt) * kNd;
#pragma unroll
    for (int k = 0; k < kNd; ++k)  // the grid lists the innermost axis first
      finite &=
          gs_axis_taps(static_cast<Cp>(load(g, kNd - 1 - k)), p.in[k], kMode, p.pad, p.align, t[k]);
    const int64_t c0 = run * p.cpt, c1 = c0 + p.cpt < p.C ? c0 + p.cpt : p.C;
    for (int64_t c = c0; c < c1; ++c) {
      const Cp v = finite ? gs_sum<0, kNd, kTaps<kMode>>(x + (b * p.C + c) * p.in_size, t, p, 0)
                          : static_cast<Cp>(__int_as_float(0x7fc00000));
      store(y, (b * p.C + c) * p.points + pt, v);
    }
  }
}

int lookup(const std::string& s, std::initializer_list<const char*> names) {
  int i = 0;
  for (const char* nm : names) {
    if (s == nm) return i;
    ++i;
  }
  return -1;
}

class GridSampleLayer final : public Layer {
 public:
  explicit GridSampleLayer(const Node* n) : node_(n) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const DeviceTensor &x = in[0], &grid = in[1], &y = out[0];
    // The node is in canonical (opset 20) form: the upgrade renamed opset 16's modes.
    mode_ = lookup(n.attrs.get_string("mode", "linear"), {"linear", "nearest", "cubic"});
    const int pad =
        lookup(n.attrs.get_string("padding_mode", "zeros"), {"zeros", "border", "reflection"});
    if (mode_ < 0 || pad < 0) return KILN_ERROR("{}: unknown mode or padding_mode", n.label());
    const int64_t r = x.rank() - 2;
    if ((r != 2 && r != 3) || grid.rank() != r + 2 || grid.shape.back() != r ||
        grid.shape[0] != x.shape[0])
      return KILN_ERROR("{}: X {} and grid {} are not [N, C, (D,) H, W] and [N, (D,) H, W, {}]",
                        n.label(), shape_str(x.shape), shape_str(grid.shape), r);
    if (mode_ == kGsCubic && r != 2)
      return KILN_ERROR("{}: cubic mode takes 4-D X only", n.label());
    std::vector<int64_t> want = {x.shape[0], x.shape[1]};
    for (int64_t k = 1; k <= r; ++k) want.push_back(grid.shape[k]);
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    GsParams p;
    p.C = x.shape[1];
    p.points = 1;
    for (int64_t k = 1; k <= r; ++k) p.points *= grid.shape[k];
    p.in_size = 1;
    for (int64_t k = r - 1; k >= 0; --k) {
      p.in[k] = x.shape[2 + k];
      p.str[k] = p.in_size;
      p.in_size *= p.in[k];
    }
    if (y.numel() > 0 && p.in_size == 0)
      return KILN_ERROR("{}: X {} has nothing to sample from", n.label(), shape_str(x.shape));
    p.pad = pad;
    p.align = n.attrs.get_int("align_corners", 0) != 0;
    // Channels per thread: 1 while the points alone fill the GPU (~2^17 threads in flight on an
    // H100), else enough to keep about that many threads, each reusing its point's weights.
    const int64_t elements = y.numel();
    p.cpt = std::clamp<int64_t>(elements >> 17, 1, std::max<int64_t>(p.C, 1));
    p.runs = p.C > 0 ? (p.C + p.cpt - 1) / p.cpt : 0;
    nd_ = static_cast<int>(r);
    p_ = p;
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].shape[0] * p_.runs * p_.points;
    if (out[0].numel() == 0 || n == 0) return Status::Ok();
    bool launched = false;
    dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* x = static_cast<const T*>(in[0].data);
      const T* g = static_cast<const T*>(in[1].data);
      T* y = static_cast<T*>(out[0].data);
      auto go = [&](auto nd, auto mode) {
        grid_sample_kernel<T, decltype(nd)::value, decltype(mode)::value>
            <<<grid_for(n), kBlock, 0, rc.stream>>>(x, g, y, n, p_);
        launched = true;
      };
      using I2 = std::integral_constant<int, 2>;
      using I3 = std::integral_constant<int, 3>;
      using L = std::integral_constant<int, kGsLinear>;
      using Nn = std::integral_constant<int, kGsNearest>;
      using Cb = std::integral_constant<int, kGsCubic>;
      if (nd_ == 2 && mode_ == kGsLinear)
        go(I2{}, L{});
      else if (nd_ == 2 && mode_ == kGsNearest)
        go(I2{}, Nn{});
      else if (nd_ == 2 && mode_ == kGsCubic)
        go(I2{}, Cb{});
      else if (nd_ == 3 && mode_ == kGsLinear)
        go(I3{}, L{});
      else if (nd_ == 3 && mode_ == kGsNearest)
        go(I3{}, Nn{});
    });
    if (!launched)
      return KILN_ERROR("{}: no kernel for {} X of rank {} in this mode", node_->label(),
                        dtype_name(in[0].dtype), nd_ + 2);
    KILN_CUDA_LAUNCH_CHECK("grid_sample kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  GsParams p_;
  int nd_ = 2, mode_ = kGsLinear;
};

bool supports_grid_sample(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16 &&
      t != DataType::kFloat64)
    return *why = "X must be a float tensor", false;
  if (d.in.size() < 2 || d.in[1].dtype != t || d.out[0].dtype != t)
    return *why = "the grid and Y must be stored in X's type", false;
  if (d.in[0].layout != Layout::kLinear || d.in[1].layout != Layout::kLinear ||
      d.out[0].layout != Layout::kLinear)
    return *why = "row-major tensors only", false;
  const int64_t rank = d.in_type(0).rank();
  if (rank != 4 && rank != 5) return *why = "X must be 4-D or 5-D", false;
  if (rank == 5 && d.node->attrs.get_string("mode", "linear") == "cubic")
    return *why = "cubic mode is 4-D only", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_grid_sample(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new GridSampleLayer(d.node));
}

}  // namespace

std::span<const TacticDef> sampling_tactics() {
  static const std::vector<TacticDef> table = [] {
    std::vector<TacticDef> t = {
        {"", "GridSample", "sampling.grid_sample", kF32 | kF16 | kF64, 0, supports_grid_sample,
         create_grid_sample},
    };
    for (const TacticDef& d : roi_align_tactics()) t.push_back(d);
    for (const TacticDef& d : affine_grid_tactics()) t.push_back(d);
    return t;
  }();
  return table;
}

}  // namespace kiln::gpu
