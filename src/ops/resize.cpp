// Resize (canonical form: opset 19+; inputs X, roi?, scales?, sizes?; attribute axes) and the
// deprecated Upsample, which the importer rewrites into Resize. Resize is separable: every
// output coordinate on a resized axis maps to a few weighted input taps, computed once per axis
// (AxisPlan); linear/cubic apply the axes one after another in double precision, nearest
// gathers whole elements so every dtype stays exact.
//
// Output size with `scales` is floor(in * scale), as ONNX shape inference, the ONNX reference
// and ONNX Runtime compute it (the spec text also multiplies by the roi extent for
// tf_crop_and_resize; none of the implementations do). Like the ONNX reference, the
// coordinate transforms use the fractional output length `scale * in`.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {

std::span<const OpDef> pad_family_ops();  // src/ops/pad.cpp: Pad, DepthToSpace, SpaceToDepth

namespace {

// --- import ---------------------------------------------------------------------------------
// Upsample (opsets 7-9) and Resize-10 take (X, scales) and sample asymmetrically; their nearest
// mode truncates when upsampling and rounds up when downsampling (ONNX Runtime's behaviour and
// the opset-10 test data). The rewrite keeps that with kiln_nearest_legacy=1.
Status upgrade_resize(ImportContext& ctx) {
  Node& n = ctx.node();
  Graph& g = ctx.graph();
  const bool upsample = n.op_type == "Upsample";
  if (!upsample && ctx.opset() >= 11) return Status::Ok();
  if (const Attribute* a = n.attrs.find("scales"); upsample && a) {
    const auto& f = a->floats;
    Value* s = ctx.add_constant("scales", Tensor::from<float>({static_cast<int64_t>(f.size())}, f));
    g.set_input(&n, 2, s);
    n.attrs.erase("scales");
  } else if (n.num_inputs() == 2) {
    g.set_input(&n, 2, n.input(1));
    g.set_input(&n, 1, nullptr);
  } else {
    return KILN_ERROR("{}: expected inputs (X, scales)", n.label());
  }
  n.op_type = "Resize";
  std::string mode = n.attrs.get_string("mode", "nearest");
  if (mode == "bilinear") mode = "linear";
  if (mode != "nearest" && mode != "linear")
    return KILN_ERROR("{}: mode must be nearest or linear, got '{}'", n.label(), mode);
  n.attrs.set("mode", Attribute::String(mode));
  n.attrs.set("coordinate_transformation_mode", Attribute::String("asymmetric"));
  if (mode == "nearest") n.attrs.set("kiln_nearest_legacy", Attribute::Int(1));
  return Status::Ok();
}

// --- attributes -----------------------------------------------------------------------------
enum class Mode { kNearest, kLinear, kCubic };

struct ResizeAttrs {
  Mode mode = Mode::kNearest;
  std::string coord, nearest, policy;
  bool antialias = false, exclude_outside = false, legacy_nearest = false;
  double cubic_a = -0.75, extrapolation = 0;
};

Expected<ResizeAttrs> parse_attrs(const Node& n) {
  ResizeAttrs r;
  const Attributes& a = n.attrs;
  const std::string mode = a.get_string("mode", "nearest");
  if (mode == "nearest")
    r.mode = Mode::kNearest;
  else if (mode == "linear")
    r.mode = Mode::kLinear;
  else if (mode == "cubic")
    r.mode = Mode::kCubic;
  else
    return KILN_ERROR("{}: unknown mode '{}'", n.label(), mode);
  r.coord = a.get_string("coordinate_transformation_mode", "half_pixel");
  static const std::set<std::string> kCoord = {
      "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",  "align_corners",
      "asymmetric", "tf_crop_and_resize",   "tf_half_pixel_for_nn"};
  if (!kCoord.count(r.coord))
    return KILN_ERROR("{}: unknown coordinate_transformation_mode '{}'", n.label(), r.coord);
  r.nearest = a.get_string("nearest_mode", "round_prefer_floor");
  if (r.nearest != "round_prefer_floor" && r.nearest != "round_prefer_ceil" &&
      r.nearest != "floor" && r.nearest != "ceil")
    return KILN_ERROR("{}: unknown nearest_mode '{}'", n.label(), r.nearest);
  r.policy = a.get_string("keep_aspect_ratio_policy", "stretch");
  if (r.policy != "stretch" && r.policy != "not_larger" && r.policy != "not_smaller")
    return KILN_ERROR("{}: unknown keep_aspect_ratio_policy '{}'", n.label(), r.policy);
  r.antialias = a.get_int("antialias", 0) != 0;
  r.exclude_outside = a.get_int("exclude_outside", 0) != 0;
  r.legacy_nearest = a.get_int("kiln_nearest_legacy", 0) != 0;
  r.cubic_a = a.get_float("cubic_coeff_a", -0.75f);
  r.extrapolation = a.get_float("extrapolation_value", 0.f);
  return r;
}

// The resized axes (attribute `axes`, default all), normalised and checked.
Expected<std::vector<int64_t>> resize_axes(const Node& n, int64_t rank) {
  std::vector<int64_t> axes;
  if (!n.attrs.has("axes")) {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    return axes;
  }
  for (int64_t a : n.attrs.get_ints("axes")) {
    KILN_ASSIGN_OR_RETURN(int64_t na, normalize_axis(a, rank, n));
    if (std::find(axes.begin(), axes.end(), na) != axes.end())
      return KILN_ERROR("{}: axis {} is repeated in axes", n.label(), a);
    axes.push_back(na);
  }
  return axes;
}

// Reference kernels refuse outputs above this size instead of failing to allocate.
constexpr double kMaxOutputElements = double(int64_t{1} << 32);

// An input counts as given when present and non-empty (opset 11 passes empty tensors).
bool given(const Tensor* t) { return t && t->numel() > 0; }

// Output length and scale of every axis (unresized axes: same length, scale 1).
struct Geometry {
  std::vector<int64_t> out;
  std::vector<double> scale;
};

Expected<Geometry> geometry(const Node& n, const ResizeAttrs& ra, const std::vector<int64_t>& in,
                            const std::vector<int64_t>& axes, const Tensor* scales,
                            const Tensor* sizes) {
  Geometry g{in, std::vector<double>(in.size(), 1.0)};
  if (given(scales) == given(sizes))
    return KILN_ERROR("{}: exactly one of 'scales' and 'sizes' must be given", n.label());
  const Tensor* t = given(scales) ? scales : sizes;
  if (t->numel() != static_cast<int64_t>(axes.size()))
    return KILN_ERROR("{}: {} has {} values, expected {} (one per resized axis)", n.label(),
                      given(scales) ? "scales" : "sizes", t->numel(), axes.size());
  if (given(scales)) {
    if (!dtype_is_float(scales->dtype()))
      return KILN_ERROR("{}: scales must be float, got {}", n.label(), dtype_name(scales->dtype()));
    for (size_t i = 0; i < axes.size(); ++i) {
      const double s = static_cast<float>(scales->at_double(static_cast<int64_t>(i)));
      if (!(s > 0)) return KILN_ERROR("{}: scale {} must be > 0", n.label(), s);
      const double len = std::floor(s * static_cast<double>(in[axes[i]]));
      if (!(len <= kMaxOutputElements))
        return KILN_ERROR("{}: scale {} gives an output length beyond the supported size",
                          n.label(), s);
      g.scale[axes[i]] = s;
      g.out[axes[i]] = static_cast<int64_t>(len);
    }
    return g;
  }
  if (sizes->dtype() != DataType::kInt64)
    return KILN_ERROR("{}: sizes must be int64, got {}", n.label(), dtype_name(sizes->dtype()));
  const auto sz = sizes->to_int64_vector();
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sz[i] < 0) return KILN_ERROR("{}: sizes[{}] = {} is negative", n.label(), i, sz[i]);
    g.out[axes[i]] = sz[i];
    g.scale[axes[i]] = static_cast<double>(sz[i]) / static_cast<double>(in[axes[i]]);
  }
  if (ra.policy != "stretch") {
    double s = ra.policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
    for (int64_t a : axes)
      s = ra.policy == "not_larger" ? std::min(s, g.scale[a]) : std::max(s, g.scale[a]);
    for (int64_t a : axes) {
      const double len = std::floor(s * static_cast<double>(in[a]) + 0.5);  // round half up
      if (!(len >= 0 && len <= kMaxOutputElements))
        return KILN_ERROR("{}: keep_aspect_ratio_policy gives no valid length for axis {}",
                          n.label(), a);
      g.scale[a] = s;
      g.out[a] = static_cast<int64_t>(len);
    }
  }
  for (int64_t a : axes)
    if (static_cast<double>(g.out[a]) > kMaxOutputElements)
      return KILN_ERROR("{}: output length {} on axis {} is beyond the supported size", n.label(),
                        g.out[a], a);
  return g;
}

// --- inference --------------------------------------------------------------------------------
Status infer_resize(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ResizeAttrs ra, parse_attrs(n));
  const TensorType& x = ctx.input_type(0);
  if (!x.has_rank()) return infer_same_as_input(ctx);
  KILN_ASSIGN_OR_RETURN(auto axes, resize_axes(n, x.rank()));
  const Tensor* scales = ctx.input_const(2);
  const Tensor* sizes = ctx.input_const(3);
  // A non-constant scales/sizes input leaves the resized dims unknown.
  const bool known = (!ctx.has_input(2) || scales) && (!ctx.has_input(3) || sizes);
  std::vector<Dim> d = *x.dims;
  if (!known) {
    for (int64_t a : axes) d[a] = Dim();
    ctx.set_output(0, TensorType(x.dtype, std::move(d)));
    return Status::Ok();
  }
  // Compute with placeholder lengths of 1 for symbolic dims, then drop what depends on them.
  std::vector<int64_t> in(x.rank());
  for (int64_t i = 0; i < x.rank(); ++i) in[i] = d[i].is_static() ? d[i].value : 1;
  KILN_ASSIGN_OR_RETURN(Geometry geo, geometry(n, ra, in, axes, scales, sizes));
  bool any_symbolic = false;
  for (int64_t a : axes) any_symbolic |= !d[a].is_static();
  for (int64_t a : axes) {
    const bool from_sizes = given(sizes) && (ra.policy == "stretch" || !any_symbolic);
    if (from_sizes || d[a].is_static())
      d[a] = Dim(geo.out[a]);
    else if (geo.scale[a] != 1.0)
      d[a] = Dim();
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(d)));
  return Status::Ok();
}

// --- per-axis sampling plan ------------------------------------------------------------------
struct Tap {
  int64_t idx;
  double w;
};
struct AxisPlan {
  std::vector<std::vector<Tap>> taps;  // per output index; empty = extrapolation value
};

double source_coord(const ResizeAttrs& ra, int64_t o, double scale, int64_t in, int64_t out,
                    double roi_start, double roi_end) {
  const double x = static_cast<double>(o), len = static_cast<double>(in);
  const double width = scale * len;  // fractional output length
  const std::string& m = ra.coord;
  if (m == "asymmetric") return x / scale;
  if (m == "align_corners") return width == 1 ? 0.0 : x * (len - 1) / (width - 1);
  if (m == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (m == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(out) / width;
    const double offset = len / 2 * (1 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (m == "tf_crop_and_resize") {
    if (width == 1) return 0.5 * (roi_start + roi_end) * (len - 1);
    return roi_start * (len - 1) + x * (roi_end - roi_start) * (len - 1) / (width - 1);
  }
  return (x + 0.5) / scale - 0.5;  // half_pixel
}

double cubic_kernel(double d, double a) {
  d = std::abs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0;
}

int64_t nearest_index(const ResizeAttrs& ra, double x, double scale) {
  if (ra.legacy_nearest) return static_cast<int64_t>(scale < 1 ? std::ceil(x) : std::floor(x));
  const double f = std::floor(x);
  if (x == f) return static_cast<int64_t>(f);
  const double ratio = x - f;
  bool up = false;
  if (ra.nearest == "round_prefer_floor")
    up = ratio > 0.5;
  else if (ra.nearest == "round_prefer_ceil")
    up = ratio >= 0.5;
  else if (ra.nearest == "ceil")
    up = true;
  return static_cast<int64_t>(f) + (up ? 1 : 0);
}

AxisPlan plan_axis(const ResizeAttrs& ra, int64_t in, int64_t out, double scale, double roi_start,
                   double roi_end) {
  AxisPlan p;
  p.taps.resize(out);
  const bool crop = ra.coord == "tf_crop_and_resize";
  // Antialiasing stretches the filter by 1/scale when downsampling.
  const double s = ra.antialias && scale < 1 ? scale : 1.0;
  const double radius = (ra.mode == Mode::kCubic ? 2.0 : 1.0) / s;
  for (int64_t o = 0; o < out; ++o) {
    double x = source_coord(ra, o, scale, in, out, roi_start, roi_end);
    if (crop && !(x >= 0 && x <= static_cast<double>(in - 1))) continue;  // extrapolate (or NaN)
    // Far outside the input every tap clamps to the edge: bound x so indices stay small.
    x = std::isnan(x) ? 0.0 : std::clamp(x, -radius - 2, static_cast<double>(in) + radius + 2);
    auto& taps = p.taps[o];
    if (ra.mode == Mode::kNearest) {
      taps.push_back({std::clamp<int64_t>(nearest_index(ra, x, scale), 0, in - 1), 1.0});
      continue;
    }
    const auto lo = static_cast<int64_t>(std::floor(x - radius));
    const auto hi = static_cast<int64_t>(std::ceil(x + radius));
    double sum = 0;
    for (int64_t i = lo; i <= hi; ++i) {
      const double d = s * (static_cast<double>(i) - x);
      const double w =
          ra.mode == Mode::kCubic ? cubic_kernel(d, ra.cubic_a) : std::max(0.0, 1 - std::abs(d));
      if (w == 0) continue;
      taps.push_back({i, w});
      sum += w;
    }
    // Weights are normalised over the full window (the edge-padded neighbours included);
    // exclude_outside then drops the neighbours outside the input and renormalises.
    if (ra.exclude_outside) {
      double inside = 0;
      for (Tap& t : taps) {
        if (t.idx < 0 || t.idx >= in) t.w = 0;
        inside += t.w;
      }
      sum = inside;
    }
    for (Tap& t : taps) {
      t.w = sum != 0 ? t.w / sum : t.w;
      t.idx = std::clamp<int64_t>(t.idx, 0, in - 1);
    }
  }
  return p;
}

// --- kernel -------------------------------------------------------------------------------------
// Rounds (half to even) and saturates double results into an integer tensor of type `t`.
Tensor round_to(const Tensor& d, DataType t) {
  if (dtype_is_float(t)) return d.cast(t);
  Tensor out(t, d.shape());
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const double lo = static_cast<double>(std::numeric_limits<T>::min());
      const double hi = static_cast<double>(std::numeric_limits<T>::max());
      for (int64_t i = 0; i < d.numel(); ++i) {
        const double v = std::nearbyint(d.data<double>()[i]);
        out.data<T>()[i] = v <= lo   ? std::numeric_limits<T>::min()
                           : v >= hi ? std::numeric_limits<T>::max()
                                     : static_cast<T>(v);
      }
    }
  });
  return out;
}

// One separable pass: resamples axis `a` of `cur` with `plan`.
Tensor apply_axis(const Tensor& cur, int64_t a, int64_t out_len, const AxisPlan& plan,
                  double extrapolation) {
  std::vector<int64_t> shape = cur.shape();
  const int64_t in_len = shape[a];
  shape[a] = out_len;
  Tensor next(DataType::kFloat64, shape);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < a; ++i) outer *= shape[i];
  for (size_t i = a + 1; i < shape.size(); ++i) inner *= shape[i];
  const double* src = cur.data<double>();
  double* dst = next.data<double>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < out_len; ++j) {
      double* row = dst + (o * out_len + j) * inner;
      const auto& taps = plan.taps[j];
      if (taps.empty()) {
        std::fill(row, row + inner, extrapolation);
        continue;
      }
      for (int64_t k = 0; k < inner; ++k) row[k] = 0;
      for (const Tap& t : taps) {
        const double* in_row = src + (o * in_len + t.idx) * inner;
        for (int64_t k = 0; k < inner; ++k) row[k] += t.w * in_row[k];
      }
    }
  return next;
}

Status cpu_resize(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ResizeAttrs ra, parse_attrs(n));
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input X", n.label());
  const int64_t rank = x->rank();
  KILN_ASSIGN_OR_RETURN(auto axes, resize_axes(n, rank));
  KILN_ASSIGN_OR_RETURN(Geometry geo,
                        geometry(n, ra, x->shape(), axes, ctx.input(2), ctx.input(3)));
  double numel = 1;
  for (int64_t d : geo.out) numel *= static_cast<double>(d);
  if (numel > kMaxOutputElements)
    return KILN_ERROR("{}: output shape {} is too large", n.label(), shape_str(geo.out));
  std::vector<double> roi_start(rank, 0.0), roi_end(rank, 1.0);
  if (ra.coord == "tf_crop_and_resize") {
    const Tensor* roi = ctx.input(1);
    if (!given(roi)) return KILN_ERROR("{}: tf_crop_and_resize needs the roi input", n.label());
    if (roi->numel() != 2 * static_cast<int64_t>(axes.size()))
      return KILN_ERROR("{}: roi has {} values, expected {}", n.label(), roi->numel(),
                        2 * axes.size());
    for (size_t i = 0; i < axes.size(); ++i) {
      roi_start[axes[i]] = roi->at_double(static_cast<int64_t>(i));
      roi_end[axes[i]] = roi->at_double(static_cast<int64_t>(axes.size() + i));
    }
  }
  for (int64_t a : axes)
    if (x->dim(a) == 0 && geo.out[a] > 0)
      return KILN_ERROR("{}: cannot resize empty dimension {} of {} to {}", n.label(), a, x->desc(),
                        geo.out[a]);
  std::vector<AxisPlan> plans(rank);
  for (int64_t a : axes)
    plans[a] = plan_axis(ra, x->dim(a), geo.out[a], geo.scale[a], roi_start[a], roi_end[a]);
  Tensor y(x->dtype(), geo.out);
  if (y.numel() == 0) {
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }

  if (ra.mode == Mode::kNearest) {  // gather whole elements: exact for every dtype
    const size_t es = dtype_size(x->dtype());
    const Tensor e = Tensor::scalar<double>(ra.extrapolation).cast(x->dtype());
    const auto in_str = contiguous_strides(x->shape());
    const auto* src = static_cast<const char*>(x->raw());
    auto* dst = static_cast<char*>(y.raw());
    std::vector<int64_t> idx(rank, 0);
    std::vector<bool> resized(rank, false);
    for (int64_t a : axes) resized[a] = true;
    for (int64_t el = 0; el < y.numel(); ++el) {
      int64_t off = 0;
      bool extrapolate = false;
      for (int64_t k = 0; k < rank; ++k) {
        if (!resized[k]) {
          off += idx[k] * in_str[k];
          continue;
        }
        const auto& taps = plans[k].taps[idx[k]];
        if (taps.empty()) {
          extrapolate = true;
          break;
        }
        off += taps[0].idx * in_str[k];
      }
      std::memcpy(dst + el * es, extrapolate ? e.raw() : src + off * es, es);
      for (int64_t k = rank - 1; k >= 0; --k) {
        if (++idx[k] < geo.out[k]) break;
        idx[k] = 0;
      }
    }
    ctx.set_output(0, std::move(y));
    return Status::Ok();
  }
  if (x->dtype() == DataType::kBool)
    return KILN_ERROR("{}: linear/cubic resize of bool tensors is not defined", n.label());
  Tensor cur = x->cast(DataType::kFloat64);
  // Last axis first, like the ONNX reference's recursion.
  for (auto it = axes.rbegin(); it != axes.rend(); ++it)
    cur = apply_axis(cur, *it, geo.out[*it], plans[*it], ra.extrapolation);
  ctx.set_output(0, round_to(cur, x->dtype()));
  return Status::Ok();
}

}  // namespace

std::span<const OpDef> resize_ops() {
  static const std::vector<OpDef> table = [] {
    std::vector<OpDef> t = {
        {"", "Resize", infer_resize, cpu_resize, upgrade_resize},
        {"", "Upsample", infer_resize, cpu_resize, upgrade_resize},
    };
    for (const OpDef& d : pad_family_ops()) t.push_back(d);
    return t;
  }();
  return table;
}

}  // namespace kiln
