// Detection ops: RoiAlign (canonical form: opset 16+, with coordinate_transformation_mode) and
// NonMaxSuppression (opset 10/11, one form).
//
// RoiAlign follows onnxruntime's CPU kernel, sample for sample (ops/sampling_math.h, shared with
// the CUDA kernel). Its max mode is onnxruntime's, not the spec text's: the spec says the max of
// the bilinearly interpolated samples; onnxruntime (1.32, and the ONNX reference implementation
// with it) takes, per sample, the largest of the four weighted neighbours w_i * x_i, then the max
// over the bin's samples. A sample at (1.5, 1.5) of [[6, 7], [10, 11]] gives 2.75, not 8.5.
// Exporters (torchvision has no max mode) produce avg; kiln matches the runtime models are
// checked against.
//
// NonMaxSuppression's output length depends on the data: inference gives [?, 3] (as NonZero,
// src/ops/scatter.cpp), and the CUDA backend runs it on the host where its inputs are small
// (lower.cpp), else refuses to build it.
#include <algorithm>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "ops/op.h"
#include "ops/sampling_math.h"

namespace kiln {
namespace {

using namespace sampling;

Status check_float(const Node& n, DataType t, const char* what) {
  if (t == DataType::kUndefined || dtype_is_float(t)) return Status::Ok();
  return KILN_ERROR("{}: {} must be a float tensor, got {}", n.label(), what, dtype_name(t));
}

// A static dim of a typed input, or -1.
int64_t dim_of(const TensorType& t, size_t k) {
  return t.dims && k < t.dims->size() && (*t.dims)[k].is_static() ? (*t.dims)[k].value : -1;
}

// --- RoiAlign(X [N,C,H,W], rois [R,4] as (x1,y1,x2,y2), batch_indices [R]) -> [R,C,oh,ow] -----
// RoiAlign-10 has no coordinate_transformation_mode and behaves as output_half_pixel (opset 16
// added the attribute with half_pixel as its default).
Status upgrade_roi_align(ImportContext& ctx) {
  if (ctx.opset() < 16)
    ctx.node().attrs.set("coordinate_transformation_mode", Attribute::String("output_half_pixel"));
  return Status::Ok();
}

// The largest sampling_ratio kiln takes. Models use 0 (adaptive) to 4; the cost is ratio^2
// samples per output element (one GPU thread walks them), so an absurd ratio is refused rather
// than left to run for hours.
constexpr int64_t kMaxSamplingRatio = 64;

struct RoiAttrs {
  bool max = false, half_pixel = true;
  int64_t oh = 1, ow = 1, ratio = 0;
  float scale = 1.f;
};

Expected<RoiAttrs> parse_roi_attrs(const Node& n) {
  RoiAttrs a;
  const std::string mode = n.attrs.get_string("mode", "avg");
  const std::string ctm = n.attrs.get_string("coordinate_transformation_mode", "half_pixel");
  if (mode != "avg" && mode != "max")
    return KILN_ERROR("{}: mode must be avg or max, got '{}'", n.label(), mode);
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    return KILN_ERROR(
        "{}: coordinate_transformation_mode must be half_pixel or "
        "output_half_pixel, got '{}'",
        n.label(), ctm);
  a.max = mode == "max";
  a.half_pixel = ctm == "half_pixel";
  a.oh = n.attrs.get_int("output_height", 1);
  a.ow = n.attrs.get_int("output_width", 1);
  a.ratio = n.attrs.get_int("sampling_ratio", 0);
  a.scale = n.attrs.get_float("spatial_scale", 1.f);
  if (a.oh < 1 || a.ow < 1 || a.oh > (int64_t{1} << 20) || a.ow > (int64_t{1} << 20))
    return KILN_ERROR("{}: output_height {} and output_width {} must be in [1, 2^20]", n.label(),
                      a.oh, a.ow);
  if (a.ratio < 0 || a.ratio > kMaxSamplingRatio)
    return KILN_ERROR("{}: sampling_ratio must be in [0, {}], got {}", n.label(), kMaxSamplingRatio,
                      a.ratio);
  if (!finite_c(a.scale))
    return KILN_ERROR("{}: spatial_scale must be finite, got {}", n.label(), a.scale);
  return a;
}

// Shapes of X, rois and batch_indices (-1: unknown dim) for inference and the kernel alike.
Status check_roi_shapes(const Node& n, const std::vector<int64_t>& x,
                        const std::vector<int64_t>& rois, const std::vector<int64_t>& bi) {
  if (x.size() != 4)
    return KILN_ERROR("{}: X must be 4-D [N, C, H, W], got rank {}", n.label(), x.size());
  if (rois.size() != 2 || (rois[1] >= 0 && rois[1] != 4))
    return KILN_ERROR("{}: rois must be [num_rois, 4], got {}", n.label(), shape_str(rois));
  if (bi.size() != 1)
    return KILN_ERROR("{}: batch_indices must be 1-D [num_rois], got {}", n.label(), shape_str(bi));
  if (rois[0] >= 0 && bi[0] >= 0 && rois[0] != bi[0])
    return KILN_ERROR("{}: {} rois but {} batch_indices", n.label(), rois[0], bi[0]);
  return Status::Ok();
}

std::vector<int64_t> known_dims(const TensorType& t) {
  std::vector<int64_t> d;
  for (size_t k = 0; k < t.dims->size(); ++k) d.push_back(dim_of(t, k));
  return d;
}

Status infer_roi_align(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(RoiAttrs a, parse_roi_attrs(n));
  const TensorType& x = ctx.input_type(0);
  const TensorType& rois = ctx.input_type(1);
  const TensorType& bi = ctx.input_type(2);
  KILN_RETURN_IF_ERROR(check_float(n, x.dtype, "X"));
  KILN_RETURN_IF_ERROR(check_float(n, rois.dtype, "rois"));
  if (bi.dtype != DataType::kUndefined && bi.dtype != DataType::kInt64)
    return KILN_ERROR("{}: batch_indices must be int64, got {}", n.label(), dtype_name(bi.dtype));
  Dim r, c;
  if (x.has_rank() && rois.has_rank() && bi.has_rank())
    KILN_RETURN_IF_ERROR(check_roi_shapes(n, known_dims(x), known_dims(rois), known_dims(bi)));
  if (x.has_rank() && x.rank() == 4) c = (*x.dims)[1];
  if (rois.has_rank() && rois.rank() == 2) r = (*rois.dims)[0];
  if (!r.is_static() && bi.has_rank() && bi.rank() == 1 && (*bi.dims)[0].is_static())
    r = (*bi.dims)[0];
  ctx.set_output(0, TensorType(x.dtype, {r, c, Dim(a.oh), Dim(a.ow)}));
  return Status::Ok();
}

// T: X's (and Y's) type; Cp: the compute type, double where X or rois are float64.
template <typename T, typename Cp>
Status roi_align(const Node& n, const RoiAttrs& a, const Tensor& x, const Tensor& rois,
                 const Tensor& bi, Tensor& y) {
  const int64_t N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3), R = rois.dim(0);
  std::vector<Cp> xv(x.numel()), box(rois.numel());
  for (int64_t i = 0; i < x.numel(); ++i) xv[i] = static_cast<Cp>(x.at_double(i));
  for (int64_t i = 0; i < rois.numel(); ++i) box[i] = static_cast<Cp>(rois.at_double(i));
  const std::vector<int64_t> batch = bi.to_int64_vector();
  T* out = y.data<T>();
  std::vector<RoiTaps<Cp>> taps;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t b = batch[r];
    if (b < 0 || b >= N)
      return KILN_ERROR("{}: batch_indices[{}] = {} is out of range for X's batch of {}", n.label(),
                        r, b, N);
    const Cp* bx = box.data() + 4 * r;
    RoiGeom<Cp> g;
    if (!roi_geometry(bx[0], bx[1], bx[2], bx[3], static_cast<Cp>(a.scale), a.half_pixel, a.oh,
                      a.ow, a.ratio, g))
      return KILN_ERROR("{}: roi {} ({}, {}, {}, {}) is not finite at spatial_scale {}", n.label(),
                        r, bx[0], bx[1], bx[2], bx[3], a.scale);
    // Samples beyond the map count as 0 in the average's sum and in the max (onnxruntime zeroes
    // their weights); the divisor is every sample of the bin.
    const int64_t total = g.grid_h * g.grid_w;
    const Cp count = static_cast<Cp>(std::max<int64_t>(total, 1));
    for (int64_t ph = 0; ph < a.oh; ++ph)
      for (int64_t pw = 0; pw < a.ow; ++pw) {
        const Cp base_h = g.start_h + static_cast<Cp>(ph) * g.bin_h;
        const Cp base_w = g.start_w + static_cast<Cp>(pw) * g.bin_w;
        int64_t iy0, iy1, ix0, ix1;
        roi_sample_range(base_h, g.bin_h, g.grid_h, H, iy0, iy1);
        roi_sample_range(base_w, g.bin_w, g.grid_w, W, ix0, ix1);
        taps.clear();
        for (int64_t iy = iy0; iy <= iy1; ++iy)
          for (int64_t ix = ix0; ix <= ix1; ++ix) {
            RoiTaps<Cp> t;
            if (roi_bilinear(roi_sample_pos(base_h, g.bin_h, iy, g.grid_h),
                             roi_sample_pos(base_w, g.bin_w, ix, g.grid_w), H, W, W, 1, t))
              taps.push_back(t);
          }
        const bool some_outside = static_cast<int64_t>(taps.size()) < total;
        for (int64_t c = 0; c < C; ++c) {
          const Cp* v = xv.data() + (b * C + c) * H * W;
          Cp acc = 0;
          bool first = true;
          for (const RoiTaps<Cp>& t : taps) {
            if (!a.max) {
              acc += t.w1 * v[t.p1] + t.w2 * v[t.p2] + t.w3 * v[t.p3] + t.w4 * v[t.p4];
              continue;
            }
            const Cp m = std::max(
                std::max(std::max(t.w1 * v[t.p1], t.w2 * v[t.p2]), t.w3 * v[t.p3]), t.w4 * v[t.p4]);
            acc = first ? m : std::max(acc, m);
            first = false;
          }
          if (a.max && some_outside && !first) acc = std::max(acc, Cp(0));
          out[((r * C + c) * a.oh + ph) * a.ow + pw] = convert<T>(a.max ? acc : acc / count);
        }
      }
  }
  return Status::Ok();
}

Status cpu_roi_align(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(RoiAttrs a, parse_roi_attrs(n));
  const Tensor* x = ctx.input(0);
  const Tensor* rois = ctx.input(1);
  const Tensor* bi = ctx.input(2);
  if (!x || !rois || !bi)
    return KILN_ERROR("{}: X, rois and batch_indices are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  KILN_RETURN_IF_ERROR(check_float(n, rois->dtype(), "rois"));
  if (bi->dtype() != DataType::kInt64)
    return KILN_ERROR("{}: batch_indices must be int64, got {}", n.label(), bi->desc());
  KILN_RETURN_IF_ERROR(check_roi_shapes(n, x->shape(), rois->shape(), bi->shape()));
  const double size = static_cast<double>(rois->dim(0)) * static_cast<double>(x->dim(1)) *
                      static_cast<double>(a.oh) * static_cast<double>(a.ow);
  if (size > double(int64_t{1} << 32))
    return KILN_ERROR("{}: an output of {} x {} x {} x {} is beyond the supported size", n.label(),
                      rois->dim(0), x->dim(1), a.oh, a.ow);
  Tensor y(x->dtype(), {rois->dim(0), x->dim(1), a.oh, a.ow});
  if (y.numel() > 0 && (x->dim(2) == 0 || x->dim(3) == 0))
    return KILN_ERROR("{}: X {} has nothing to sample from", n.label(), x->desc());
  const bool wide = x->dtype() == DataType::kFloat64 || rois->dtype() == DataType::kFloat64;
  if (y.numel() > 0)
    KILN_RETURN_IF_ERROR(visit_dtype(x->dtype(), [&](auto tag) -> Status {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>)
        return Status::Ok();  // excluded by check_float
      else if (wide)
        return roi_align<T, double>(n, a, *x, *rois, *bi, y);
      else
        return roi_align<T, float>(n, a, *x, *rois, *bi, y);
    }));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- NonMaxSuppression(boxes [B,N,4], scores [B,C,N], max_output_boxes_per_class?,
//     iou_threshold?, score_threshold?) -> selected_indices int64 [num_selected, 3] -----------
// Per batch and class, boxes by descending score (equal scores: lower index first), each kept
// unless it overlaps a kept one by IoU > iou_threshold, at most max_output_boxes_per_class.
// As onnxruntime: a box whose score is NaN is never selected; a box with a NaN coordinate takes
// the IoU arithmetic of sampling::suppresses (ops/sampling_math.h), whose comparisons are then
// false (it neither suppresses nor is suppressed); a negative max_output_boxes_per_class selects
// nothing.
Status infer_nms(InferContext& ctx) {
  const Node& n = ctx.node();
  const int64_t cpb = n.attrs.get_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1)
    return KILN_ERROR("{}: center_point_box must be 0 or 1, got {}", n.label(), cpb);
  const TensorType& boxes = ctx.input_type(0);
  const TensorType& scores = ctx.input_type(1);
  KILN_RETURN_IF_ERROR(check_float(n, boxes.dtype, "boxes"));
  KILN_RETURN_IF_ERROR(check_float(n, scores.dtype, "scores"));
  if (boxes.has_rank() && (boxes.rank() != 3 || (dim_of(boxes, 2) >= 0 && dim_of(boxes, 2) != 4)))
    return KILN_ERROR("{}: boxes must be [batches, boxes, 4], got {}", n.label(), boxes.str());
  if (scores.has_rank() && scores.rank() != 3)
    return KILN_ERROR("{}: scores must be [batches, classes, boxes], got {}", n.label(),
                      scores.str());
  const DataType mt = ctx.input_type(2).dtype;
  if (mt != DataType::kUndefined && mt != DataType::kInt64)
    return KILN_ERROR("{}: max_output_boxes_per_class must be int64, got {}", n.label(),
                      dtype_name(mt));
  // The count is known only at run time.
  ctx.set_output(0, TensorType(DataType::kInt64, {Dim(), Dim(3)}));
  return Status::Ok();
}

// At most max_output_boxes_per_class (where it is a constant; else every box) of each batch and
// class.
Status bound_nms(InferContext& ctx) {
  const auto boxes = ctx.input_type(0).static_shape();
  const auto scores = ctx.input_type(1).static_shape();
  if (!boxes || !scores || boxes->size() != 3 || scores->size() != 3)
    return KILN_ERROR("{}: the shapes of boxes and scores are not known", ctx.node().label());
  int64_t per = (*boxes)[1];
  if (!ctx.has_input(2)) per = 0;  // absent: no boxes
  else if (const Tensor* m = ctx.input_const(2); m && m->numel() > 0)
    per = std::clamp<int64_t>(m->at_int(0), 0, per);
  ctx.set_output(0, TensorType(DataType::kInt64, {Dim((*boxes)[0] * (*scores)[1] * per), Dim(3)}));
  return Status::Ok();
}

template <typename Cp>
Status nms(const Node& n, const Tensor& boxes, const Tensor& scores, int64_t max_out,
           Cp iou_threshold, const Tensor* score_threshold, std::vector<int64_t>& out) {
  const int64_t B = boxes.dim(0), N = boxes.dim(1), C = scores.dim(1);
  const bool center = n.attrs.get_int("center_point_box", 0) == 1;
  std::vector<Cp> bv(boxes.numel()), sv(scores.numel());
  for (int64_t i = 0; i < boxes.numel(); ++i) bv[i] = static_cast<Cp>(boxes.at_double(i));
  for (int64_t i = 0; i < scores.numel(); ++i) sv[i] = static_cast<Cp>(scores.at_double(i));
  const Cp st = score_threshold ? static_cast<Cp>(score_threshold->at_double(0)) : Cp(0);
  std::vector<int64_t> order, kept;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t c = 0; c < C; ++c) {
      const Cp* s = sv.data() + (b * C + c) * N;
      order.clear();
      for (int64_t i = 0; i < N; ++i)
        if (s[i] == s[i] && (!score_threshold || s[i] > st)) order.push_back(i);  // NaN: never
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t i, int64_t j) { return s[i] > s[j]; });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        const Cp* bi = bv.data() + (b * N + i) * 4;
        const bool drop = std::any_of(kept.begin(), kept.end(), [&](int64_t k) {
          return sampling::suppresses(bi, bv.data() + (b * N + k) * 4, center, iou_threshold);
        });
        if (drop) continue;
        kept.push_back(i);
        out.insert(out.end(), {b, c, i});
      }
    }
  return Status::Ok();
}

// An optional scalar input: absent or empty reads as not given.
const Tensor* given(const Tensor* t) { return t && t->numel() > 0 ? t : nullptr; }

Status cpu_nms(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* boxes = ctx.input(0);
  const Tensor* scores = ctx.input(1);
  if (!boxes || !scores) return KILN_ERROR("{}: boxes and scores are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, boxes->dtype(), "boxes"));
  KILN_RETURN_IF_ERROR(check_float(n, scores->dtype(), "scores"));
  if (boxes->rank() != 3 || boxes->dim(2) != 4)
    return KILN_ERROR("{}: boxes must be [batches, boxes, 4], got {}", n.label(), boxes->desc());
  if (scores->rank() != 3 || scores->dim(0) != boxes->dim(0) || scores->dim(2) != boxes->dim(1))
    return KILN_ERROR(
        "{}: scores must be [batches, classes, boxes] = [{}, C, {}] for boxes {}, "
        "got {}",
        n.label(), boxes->dim(0), boxes->dim(1), boxes->desc(), scores->desc());
  const int64_t cpb = n.attrs.get_int("center_point_box", 0);
  if (cpb != 0 && cpb != 1)
    return KILN_ERROR("{}: center_point_box must be 0 or 1, got {}", n.label(), cpb);
  int64_t max_out = 0;  // absent: no boxes, as the spec's default 0
  if (const Tensor* m = given(ctx.input(2))) {
    if (m->dtype() != DataType::kInt64)
      return KILN_ERROR("{}: max_output_boxes_per_class must be int64, got {}", n.label(),
                        m->desc());
    max_out = std::max<int64_t>(m->at_int(0), 0);
  }
  double iou = 0;
  if (const Tensor* t = given(ctx.input(3))) {
    if (!dtype_is_float(t->dtype()))
      return KILN_ERROR("{}: iou_threshold must be float, got {}", n.label(), t->desc());
    iou = t->at_double(0);
    if (!(iou >= 0 && iou <= 1))
      return KILN_ERROR("{}: iou_threshold must be in [0, 1], got {}", n.label(), iou);
  }
  const Tensor* st = given(ctx.input(4));
  if (st && !dtype_is_float(st->dtype()))
    return KILN_ERROR("{}: score_threshold must be float, got {}", n.label(), st->desc());
  std::vector<int64_t> sel;
  if (max_out > 0) {
    if (boxes->dtype() == DataType::kFloat64 || scores->dtype() == DataType::kFloat64)
      KILN_RETURN_IF_ERROR(nms<double>(n, *boxes, *scores, max_out, iou, st, sel));
    else
      KILN_RETURN_IF_ERROR(
          nms<float>(n, *boxes, *scores, max_out, static_cast<float>(iou), st, sel));
  }
  const int64_t count = static_cast<int64_t>(sel.size()) / 3;
  ctx.set_output(0, Tensor::from<int64_t>({count, 3}, sel));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "RoiAlign", infer_roi_align, cpu_roi_align, upgrade_roi_align},
    {"", "NonMaxSuppression", infer_nms, cpu_nms, nullptr, 0, bound_nms},
};

}  // namespace

std::span<const OpDef> detection_ops() { return kOps; }

}  // namespace kiln
