// RoiAlign (src/ops/detection.cpp is the spec: onnxruntime's sampling, its max mode included),
// joined into the sampling family by grid_sample.cu.
//
// A thread per output element, in Y's storage order: row-major Y is [R, C, oh, ow], NHWC Y is
// [R, oh, ow, C] — then the 32 threads of a warp are 32 channels of one bin, which walk the same
// samples and read adjacent channels of each tap (X NHWC too, as the CNN backbone before it
// leaves it in an FP16 engine): whole cache lines per tap. The roi's geometry, the sample range
// and each sample's taps are the reference's own code (ops/sampling_math.h), computed in double,
// as the CPU's float64 mode does, whatever the storage type; only the samples that can fall on
// the map are visited, so a huge roi costs what a map-sized one does.
//
// Bad indices: a batch index outside [0, N) or a roi whose geometry is not finite makes the CPU
// reference fail; a kernel cannot, so it writes NaN over that roi's outputs and reads nothing
// for it. Where batch_indices are known on the host (a constant) configure refuses them instead.
#include <string>

#include "kernels/device_util.cuh"
#include "ops/op.h"
#include "ops/sampling_math.h"
#include "tactics.h"

namespace kiln::gpu {

std::span<const TacticDef> roi_align_tactics();

namespace {

using namespace sampling;

struct RoiParams {
  int64_t N = 0, C = 0, H = 0, W = 0, oh = 1, ow = 1, ratio = 0;
  int64_t xs[4] = {};     // X's strides (n, c, h, w) in its layout
  bool nhwc_out = false;  // Y stored [R, oh, ow, C], else [R, C, oh, ow]
  bool half_pixel = true, max = false;
  double scale = 1;
};

template <typename T>
__global__ void roi_align_kernel(const T* __restrict__ x, const T* __restrict__ rois,
                                 const int64_t* __restrict__ batch, T* __restrict__ y, int64_t n,
                                 const __grid_constant__ RoiParams p) {
  KILN_GRID_STRIDE(i, n) {
    int64_t r, c, ph, pw, rest;
    if (p.nhwc_out) {
      c = i % p.C, rest = i / p.C;
      pw = rest % p.ow, rest /= p.ow;
      ph = rest % p.oh, r = rest / p.oh;
    } else {
      pw = i % p.ow, rest = i / p.ow;
      ph = rest % p.oh, rest /= p.oh;
      c = rest % p.C, r = rest / p.C;
    }
    const int64_t b = batch[r];
    RoiGeom<double> g;
    const T* box = rois + 4 * r;
    if (b < 0 || b >= p.N ||
        !roi_geometry<double>(load(box, 0), load(box, 1), load(box, 2), load(box, 3), p.scale,
                              p.half_pixel, p.oh, p.ow, p.ratio, g)) {
      store(y, i, __int_as_float(0x7fc00000));
      continue;
    }
    const double base_h = g.start_h + static_cast<double>(ph) * g.bin_h;
    const double base_w = g.start_w + static_cast<double>(pw) * g.bin_w;
    int64_t iy0, iy1, ix0, ix1;
    roi_sample_range(base_h, g.bin_h, g.grid_h, p.H, iy0, iy1);
    roi_sample_range(base_w, g.bin_w, g.grid_w, p.W, ix0, ix1);
    const T* v = x + b * p.xs[0] + c * p.xs[1];
    double acc = 0;
    int64_t taken = 0;  // samples on the map (the others count as 0)
    for (int64_t iy = iy0; iy <= iy1; ++iy) {
      const double sy = roi_sample_pos(base_h, g.bin_h, iy, g.grid_h);
      for (int64_t ix = ix0; ix <= ix1; ++ix) {
        RoiTaps<double> t;
        if (!roi_bilinear(sy, roi_sample_pos(base_w, g.bin_w, ix, g.grid_w), p.H, p.W, p.xs[2],
                          p.xs[3], t))
          continue;
        const double v1 = load(v, t.p1), v2 = load(v, t.p2), v3 = load(v, t.p3), v4 = load(v, t.p4);
        if (!p.max) {
          acc += t.w1 * v1 + t.w2 * v2 + t.w3 * v3 + t.w4 * v4;
        } else {
          // std::max's order, as the reference (and onnxruntime) take it.
          double m = t.w1 * v1 < t.w2 * v2 ? t.w2 * v2 : t.w1 * v1;
          m = m < t.w3 * v3 ? t.w3 * v3 : m;
          m = m < t.w4 * v4 ? t.w4 * v4 : m;
          acc = taken == 0 ? m : (acc < m ? m : acc);
        }
        ++taken;
      }
    }
    const int64_t total = g.grid_h * g.grid_w;
    double out;
    if (p.max)
      out = taken > 0 && taken < total && acc < 0 ? 0.0 : acc;
    else
      out = acc / static_cast<double>(total > 1 ? total : 1);
    store(y, i, out);
  }
}

class RoiAlignLayer final : public Layer {
 public:
  explicit RoiAlignLayer(const Node* n) : node_(n) {}

  Expected<size_t> configure(const RunContext&, std::span<const DeviceTensor> in,
                             std::span<const DeviceTensor> out) override {
    const Node& n = *node_;
    const Attributes& a = n.attrs;
    const DeviceTensor &x = in[0], &rois = in[1], &bi = in[2], &y = out[0];
    const std::string mode = a.get_string("mode", "avg");
    const std::string ctm = a.get_string("coordinate_transformation_mode", "half_pixel");
    if ((mode != "avg" && mode != "max") || (ctm != "half_pixel" && ctm != "output_half_pixel"))
      return KILN_ERROR("{}: unknown mode '{}' or coordinate_transformation_mode '{}'", n.label(),
                        mode, ctm);
    RoiParams p;
    p.max = mode == "max";
    p.half_pixel = ctm == "half_pixel";
    p.oh = a.get_int("output_height", 1);
    p.ow = a.get_int("output_width", 1);
    p.ratio = a.get_int("sampling_ratio", 0);
    p.scale = a.get_float("spatial_scale", 1.f);
    if (p.oh < 1 || p.ow < 1 || p.ratio < 0)
      return KILN_ERROR("{}: output size {}x{} or sampling_ratio {} is not valid", n.label(), p.oh,
                        p.ow, p.ratio);
    if (x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != 4 || bi.rank() != 1 ||
        bi.shape[0] != rois.shape[0])
      return KILN_ERROR(
          "{}: X {}, rois {} and batch_indices {} are not [N, C, H, W], [R, 4] "
          "and [R]",
          n.label(), shape_str(x.shape), shape_str(rois.shape), shape_str(bi.shape));
    const std::vector<int64_t> want = {rois.shape[0], x.shape[1], p.oh, p.ow};
    if (y.shape != want)
      return KILN_ERROR("{}: output shape {} should be {}", n.label(), shape_str(y.shape),
                        shape_str(want));
    p.N = x.shape[0], p.C = x.shape[1], p.H = x.shape[2], p.W = x.shape[3];
    if (y.numel() > 0 && (p.H == 0 || p.W == 0))
      return KILN_ERROR("{}: X {} has nothing to sample from", n.label(), shape_str(x.shape));
    if (x.layout == Layout::kNHWC) {
      p.xs[0] = p.H * p.W * p.C, p.xs[1] = 1, p.xs[2] = p.W * p.C, p.xs[3] = p.C;
    } else {
      p.xs[0] = p.C * p.H * p.W, p.xs[1] = p.H * p.W, p.xs[2] = p.W, p.xs[3] = 1;
    }
    p.nhwc_out = y.layout == Layout::kNHWC;
    // Indices known now are checked now (the kernel can only write NaN for a bad one).
    if (bi.host) {
      const std::vector<int64_t> v = bi.host->to_int64_vector();
      for (size_t k = 0; k < v.size(); ++k)
        if (v[k] < 0 || v[k] >= p.N)
          return KILN_ERROR("{}: batch_indices[{}] = {} is out of range for X's batch of {}",
                            n.label(), k, v[k], p.N);
    }
    p_ = p;
    return size_t{0};
  }

  Status run(const RunContext& rc, std::span<const DeviceTensor> in,
             std::span<const DeviceTensor> out) override {
    const int64_t n = out[0].numel();
    if (n == 0) return Status::Ok();
    const auto* batch = static_cast<const int64_t*>(in[2].data);
    const bool ok = dispatch_float(in[0].dtype, [&](auto tag) {
      using T = decltype(tag);
      roi_align_kernel<T><<<grid_for(n), kBlock, 0, rc.stream>>>(
          static_cast<const T*>(in[0].data), static_cast<const T*>(in[1].data), batch,
          static_cast<T*>(out[0].data), n, p_);
    });
    if (!ok) return KILN_ERROR("{}: unsupported type {}", node_->label(), dtype_name(in[0].dtype));
    KILN_CUDA_LAUNCH_CHECK("roi_align kernel");
    return Status::Ok();
  }

 private:
  const Node* node_;
  RoiParams p_;
};

bool supports_roi_align(const LayerDesc& d, std::string* why) {
  const DataType t = d.in[0].dtype;
  if (t != DataType::kFloat32 && t != DataType::kFloat16 && t != DataType::kBFloat16 &&
      t != DataType::kFloat64)
    return *why = "X must be a float tensor", false;
  if (d.in.size() < 3 || d.in[1].dtype != t || d.out[0].dtype != t)
    return *why = "rois and Y must be stored in X's type", false;
  if (d.in[2].dtype != DataType::kInt64) return *why = "batch_indices must be int64", false;
  if (d.in[1].layout != Layout::kLinear) return *why = "rois must be row-major", false;
  if (d.in_type(0).rank() != 4) return *why = "X must be 4-D", false;
  return true;
}

Expected<std::unique_ptr<Layer>> create_roi_align(const LayerDesc& d) {
  return std::unique_ptr<Layer>(new RoiAlignLayer(d.node));
}

}  // namespace

std::span<const TacticDef> roi_align_tactics() {
  static const TacticDef table[] = {
      {"", "RoiAlign", "detection.roi_align", kF32 | kF16 | kF64 | kNHWC, 0, supports_roi_align,
       create_roi_align},
  };
  return table;
}

}  // namespace kiln::gpu
