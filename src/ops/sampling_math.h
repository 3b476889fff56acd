// The per-sample arithmetic of GridSample, AffineGrid and RoiAlign, and NonMaxSuppression's overlap test,
// written once for the CPU reference (src/ops/sampling.cpp, detection.cpp) and the CUDA kernels
// (backends/cuda/layers/grid_sample.cu, roi_align.cu, nms.cu): every function is __host__ __device__ under nvcc, templated on the compute type
// C — float for float32 and 16-bit tensors, as onnxruntime computes, double in the CPU backend's
// float64 mode — so the GPU samples the same taps with the same weights as the reference.
//
// Both follow onnxruntime's CPU kernels (which the ONNX test data and PyTorch agree with), and
// keep every index small whatever the input holds, so no value can make a kernel read outside
// its tensor: a non-finite coordinate is reported to the caller, far-off coordinates are folded
// back before they become integers.
#pragma once

#include <math.h>

#include <cstdint>

#ifndef KILN_HD
#if defined(__CUDACC__)
#define KILN_HD __host__ __device__
#else
#define KILN_HD
#endif
#endif

namespace kiln::sampling {

// C's math functions by width (float or double), callable on the host and the device alike.
template <typename C>
KILN_HD inline C floor_c(C v) {
  if constexpr (sizeof(C) == 4)
    return floorf(v);
  else
    return floor(v);
}
template <typename C>
KILN_HD inline C ceil_c(C v) {
  if constexpr (sizeof(C) == 4)
    return ceilf(v);
  else
    return ceil(v);
}
// Round half to even (the default rounding mode; std::nearbyint in onnxruntime, numpy's rint).
template <typename C>
KILN_HD inline C rint_c(C v) {
  if constexpr (sizeof(C) == 4)
    return rintf(v);
  else
    return rint(v);
}
template <typename C>
KILN_HD inline C fmod_c(C a, C b) {
  if constexpr (sizeof(C) == 4)
    return fmodf(a, b);
  else
    return fmod(a, b);
}
template <typename C>
KILN_HD inline bool finite_c(C v) {
  return v - v == C(0);  // NaN - NaN and inf - inf are NaN
}

// --- GridSample ---------------------------------------------------------------------------------
enum GsMode : int { kGsLinear = 0, kGsNearest = 1, kGsCubic = 2 };
enum GsPad : int { kGsZeros = 0, kGsBorder = 1, kGsReflection = 2 };

// The pixel coordinate of normalized grid value g on an axis of `len` pixels: with align_corners
// -1 and 1 are the centres of the edge pixels, without it the outer edges of the edge pixels.
template <typename C>
KILN_HD inline C gs_denormalize(C g, int64_t len, bool align) {
  return align ? (g + 1) / 2 * C(len - 1) : ((g + 1) * C(len) - 1) / 2;
}

// Reflection padding of a tap index: the image mirrored at the borders, which are the edge
// pixels' centres with align_corners (period 2(len-1), edges not repeated) and their outer edges
// without (period 2 len, edges repeated) — onnxruntime's GsReflect of an integer index, exactly.
KILN_HD inline int64_t gs_reflect_index(int64_t i, int64_t len, bool align) {
  if (align && len == 1) return 0;
  const int64_t period = align ? 2 * (len - 1) : 2 * len;
  int64_t m = i % period;
  if (m < 0) m += period;
  if (align) return m <= len - 1 ? m : period - m;
  return m < len ? m : period - 1 - m;
}

// Keys' cubic convolution weights (A = -0.75, as the spec and PyTorch) of the four taps at
// distances t + 1, t, 1 - t, 2 - t, in onnxruntime's arithmetic.
template <typename C>
KILN_HD inline void gs_cubic_weights(C t, C w[4]) {
  const C a = C(-0.75);
  const C x = t < 0 ? -t : t;
  w[0] = ((a * (x + 1) - 5 * a) * (x + 1) + 8 * a) * (x + 1) - 4 * a;
  w[1] = ((a + 2) * x - (a + 3)) * x * x + 1;
  w[2] = ((a + 2) * (1 - x) - (a + 3)) * (1 - x) * (1 - x) + 1;
  w[3] = ((a * (2 - x) - 5 * a) * (2 - x) + 8 * a) * (2 - x) - 4 * a;
}

// The taps of one axis of one sample: index along the axis (-1: a zero-padded tap outside the
// image) and weight.
template <typename C>
struct GsTaps {
  int n = 0;
  int64_t idx[4] = {};
  C w[4] = {};
};

// Fills the taps of normalized coordinate g on an axis of `len` >= 1 pixels; false when g gives
// no finite coordinate (the sample is then NaN: onnxruntime converts NaN to an integer there,
// which is undefined behaviour). Padding applies to each tap, as in onnxruntime and PyTorch (for
// cubic + border this differs from the ONNX reference implementation, which clamps the
// coordinate first; the two agree for every other mode and padding).
template <typename C>
KILN_HD inline bool gs_axis_taps(C g, int64_t len, int mode, int pad, bool align, GsTaps<C>& t) {
  C x = gs_denormalize(g, len, align);
  if (!finite_c(x)) return false;
  // Fold far-off coordinates back before they become integers, changing no tap or weight:
  // reflection is periodic (fmod is exact), and beyond 3 pixels outside every tap of every mode
  // is zero-padded, or clamped to the edge pixel whose weights sum to 1.
  if (pad == kGsReflection) {
    const int64_t period = align ? 2 * (len - 1) : 2 * len;
    x = period == 0 ? C(0) : fmod_c(x, C(period));
  } else {
    x = x < C(-4) ? C(-4) : x > C(len + 3) ? C(len + 3) : x;
  }
  int64_t first;
  if (mode == kGsNearest) {
    first = static_cast<int64_t>(rint_c(x));
    t.n = 1;
    t.w[0] = 1;
  } else if (mode == kGsLinear) {
    first = static_cast<int64_t>(floor_c(x));
    t.n = 2;
    t.w[0] = C(first + 1) - x;
    t.w[1] = x - C(first);
  } else {
    first = static_cast<int64_t>(floor_c(x)) - 1;
    t.n = 4;
    gs_cubic_weights(x - C(first) - 1, t.w);
  }
  for (int k = 0; k < t.n; ++k) {
    const int64_t i = first + k;
    if (pad == kGsZeros)
      t.idx[k] = i >= 0 && i < len ? i : -1;
    else if (pad == kGsBorder)
      t.idx[k] = i < 0 ? 0 : i >= len ? len - 1 : i;
    else
      t.idx[k] = gs_reflect_index(i, len, align);
  }
  return true;
}

// --- RoiAlign
// ------------------------------------------------------------------------------------- The most
// samples a bin may take along one axis: an adaptive grid (sampling_ratio 0) is ceil(roi / output),
// so a huge roi would otherwise ask for billions (only the samples that fall on the map are
// visited: roi_sample_range; the cap changes the average's divisor of such a roi, whose average is
// 0 to within float rounding anyway).
inline constexpr int64_t kRoiMaxGrid = int64_t{1} << 30;

// One roi's sampling geometry: the first bin's corner, the bin sizes and samples per bin axis.
template <typename C>
struct RoiGeom {
  C start_h = 0, start_w = 0, bin_h = 0, bin_w = 0;
  int64_t grid_h = 0, grid_w = 0;
};

template <typename C>
KILN_HD inline int64_t roi_grid_count(C v) {
  const C c = ceil_c(v);
  if (!(c > 0)) return 0;  // an empty or inverted roi: no samples (onnxruntime's loops skip)
  return c >= C(kRoiMaxGrid) ? kRoiMaxGrid : static_cast<int64_t>(c);
}

// Box (x1, y1, x2, y2) in input coordinates; false when its geometry is not finite (onnxruntime
// refuses such rois). output_half_pixel (opset 10's behaviour) keeps the pixel shift out and
// makes a malformed roi at least 1x1; half_pixel shifts by half a pixel and keeps the size.
template <typename C>
KILN_HD inline bool roi_geometry(C x1, C y1, C x2, C y2, C scale, bool half_pixel, int64_t oh,
                                 int64_t ow, int64_t sampling_ratio, RoiGeom<C>& g) {
  const C off = half_pixel ? C(0.5) : C(0);
  g.start_w = x1 * scale - off;
  g.start_h = y1 * scale - off;
  C rw = (x2 * scale - off) - g.start_w;
  C rh = (y2 * scale - off) - g.start_h;
  if (!finite_c(g.start_w) || !finite_c(g.start_h) || !finite_c(rw) || !finite_c(rh)) return false;
  if (!half_pixel) {
    rw = rw > C(1) ? rw : C(1);
    rh = rh > C(1) ? rh : C(1);
  }
  g.bin_h = rh / C(oh);
  g.bin_w = rw / C(ow);
  g.grid_h = sampling_ratio > 0 ? sampling_ratio : roi_grid_count(rh / C(oh));
  g.grid_w = sampling_ratio > 0 ? sampling_ratio : roi_grid_count(rw / C(ow));
  return true;
}

// Sample i of a bin axis starting at `base`: base + (i + 0.5) * bin / grid, in onnxruntime's
// order of operations.
template <typename C>
KILN_HD inline C roi_sample_pos(C base, C bin, int64_t i, int64_t grid) {
  return base + C(i + 0.5) * bin / C(grid);
}

// The samples [first, last] of a bin axis that may fall within [-1, len] (samples further out
// count as 0): a superset — the caller checks each — so a huge roi visits only the few samples
// over the map instead of all of its grid.
template <typename C>
KILN_HD inline void roi_sample_range(C base, C bin, int64_t grid, int64_t len, int64_t& first,
                                     int64_t& last) {
  first = 0;
  last = grid - 1;
  if (grid <= 0) return;
  const C step = bin / C(grid);
  if (!(step != C(0)) || !finite_c(step)) return;
  C a = (C(-1) - base) / step - C(0.5), b = (C(len) - base) / step - C(0.5);
  if (a > b) {
    const C s = a;
    a = b;
    b = s;
  }
  a = floor_c(a) - 1;  // a sample's margin for rounding
  b = ceil_c(b) + 1;
  if (!(a <= b)) return;  // NaN: keep the whole grid
  if (a > C(first)) first = a >= C(grid) ? grid : static_cast<int64_t>(a);
  if (b < C(last)) last = b < C(0) ? -1 : static_cast<int64_t>(b);
}

// The bilinear taps of one sample at (y, x) on an H x W map (H, W >= 1): row-major offsets of
// its four neighbours and their weights; false when the sample lies beyond [-1, H] x [-1, W] and
// counts as 0. Within a pixel of the edge it reads the edge pixels, as onnxruntime does.
template <typename C>
struct RoiTaps {
  int64_t p1 = 0, p2 = 0, p3 = 0, p4 = 0;  // (y0, x0), (y0, x1), (y1, x0), (y1, x1)
  C w1 = 0, w2 = 0, w3 = 0, w4 = 0;
};

template <typename C>
KILN_HD inline bool roi_bilinear(C y, C x, int64_t H, int64_t W, int64_t row_stride,
                                 int64_t col_stride, RoiTaps<C>& t) {
  if (!(y >= C(-1) && y <= C(H) && x >= C(-1) && x <= C(W))) return false;
  if (y <= 0) y = 0;
  if (x <= 0) x = 0;
  int64_t y0 = static_cast<int64_t>(y), x0 = static_cast<int64_t>(x), y1, x1;
  if (y0 >= H - 1) {
    y1 = y0 = H - 1;
    y = C(y0);
  } else {
    y1 = y0 + 1;
  }
  if (x0 >= W - 1) {
    x1 = x0 = W - 1;
    x = C(x0);
  } else {
    x1 = x0 + 1;
  }
  const C ly = y - C(y0), lx = x - C(x0);
  const C hy = C(1) - ly, hx = C(1) - lx;
  t.w1 = hy * hx;
  t.w2 = hy * lx;
  t.w3 = ly * hx;
  t.w4 = ly * lx;
  t.p1 = y0 * row_stride + x0 * col_stride;
  t.p2 = y0 * row_stride + x1 * col_stride;
  t.p3 = y1 * row_stride + x0 * col_stride;
  t.p4 = y1 * row_stride + x1 * col_stride;
  return true;
}

// onnxruntime's std::max / std::min (first argument on ties and NaN), so NaN coordinates flow
// through the comparisons exactly as there.
template <typename Cp>
KILN_HD inline Cp max_of(Cp a, Cp b) {
  return a < b ? b : a;
}
template <typename Cp>
KILN_HD inline Cp min_of(Cp a, Cp b) {
  return b < a ? b : a;
}

// NonMaxSuppression (detection.cpp, backends/cuda/layers/nms.cu): whether kept box b2 removes
// candidate b1, IoU > threshold, in onnxruntime's arithmetic and order.
template <typename Cp>
KILN_HD inline bool suppresses(const Cp* b1, const Cp* b2, bool center, Cp threshold) {
  Cp x1_min, x1_max, x2_min, x2_max, y1_min, y1_max, y2_min, y2_max;
  auto min_max = [](Cp a, Cp b, Cp& lo, Cp& hi) {
    if (a >= b)
      lo = b, hi = a;
    else
      lo = a, hi = b;
  };
  if (!center) {  // [y1, x1, y2, x2], corners in either order
    min_max(b1[1], b1[3], x1_min, x1_max);
    min_max(b2[1], b2[3], x2_min, x2_max);
    min_max(b1[0], b1[2], y1_min, y1_max);
    min_max(b2[0], b2[2], y2_min, y2_max);
  } else {  // [x_center, y_center, width, height]
    x1_min = b1[0] - b1[2] / 2, x1_max = b1[0] + b1[2] / 2;
    x2_min = b2[0] - b2[2] / 2, x2_max = b2[0] + b2[2] / 2;
    y1_min = b1[1] - b1[3] / 2, y1_max = b1[1] + b1[3] / 2;
    y2_min = b2[1] - b2[3] / 2, y2_max = b2[1] + b2[3] / 2;
  }
  const Cp ix_min = max_of(x1_min, x2_min), ix_max = min_of(x1_max, x2_max);
  if (ix_max <= ix_min) return false;
  const Cp iy_min = max_of(y1_min, y2_min), iy_max = min_of(y1_max, y2_max);
  if (iy_max <= iy_min) return false;
  const Cp inter = (ix_max - ix_min) * (iy_max - iy_min);
  if (inter <= 0) return false;
  const Cp area1 = (x1_max - x1_min) * (y1_max - y1_min);
  const Cp area2 = (x2_max - x2_min) * (y2_max - y2_min);
  const Cp uni = area1 + area2 - inter;
  if (area1 <= 0 || area2 <= 0 || uni <= 0) return false;
  return inter / uni > threshold;
}

// AffineGrid's normalized coordinate of position i on an axis of n positions (ONNX's reference):
// the pixel centres (2i + 1) / n - 1, or with align_corners the corners -1 + 2i / (n - 1), -1
// where n = 1.
template <typename C>
KILN_HD inline C affine_base(int64_t i, int64_t n, bool align) {
  if (align) return n > 1 ? C(-1) + C(2) * C(i) / C(n - 1) : C(-1);
  return (C(2) * C(i) + C(1)) / C(n) - C(1);
}

}  // namespace kiln::sampling
