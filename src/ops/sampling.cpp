// GridSample (canonical form: opset 20+, modes linear/nearest/cubic) and AffineGrid (below). X is [N, C, d1..dr],
// grid [N, D1..Dr, r] with the normalized coordinates of each output point, last axis first
// (grid[..., 0] is the x of the innermost axis, as in PyTorch); Y is [N, C, D1..Dr]. Linear and
// nearest take any r >= 1 (opset 20's N-D form; onnxruntime and the GPU do r = 2 and 3), cubic
// r = 2 only, as the spec says.
//
// The taps and weights of each axis come from ops/sampling_math.h, shared with the CUDA kernel,
// and follow onnxruntime: padding applies to each tap, nearest rounds half to even, and the
// arithmetic is float for float32 and 16-bit tensors, double where X or the grid is float64 (the
// CPU backend's float64 mode).
#include <limits>
#include <type_traits>
#include <vector>

#include "core/dispatch.h"
#include "ops/op.h"
#include "ops/sampling_math.h"

namespace kiln {
namespace {

using namespace sampling;

// GridSample-16 names the modes bilinear/nearest/bicubic; opset 20 renamed them.
Status upgrade_grid_sample(ImportContext& ctx) {
  Node& n = ctx.node();
  if (ctx.opset() >= 20) return Status::Ok();
  const std::string mode = n.attrs.get_string("mode", "bilinear");
  const std::string canon = mode == "bilinear" ? "linear" : mode == "bicubic" ? "cubic" : mode;
  if (mode != "bilinear" && mode != "nearest" && mode != "bicubic")
    return KILN_ERROR("{}: mode must be bilinear, nearest or bicubic at opset {}, got '{}'",
                      n.label(), ctx.opset(), mode);
  n.attrs.set("mode", Attribute::String(canon));
  return Status::Ok();
}

struct GsAttrs {
  int mode = kGsLinear, pad = kGsZeros;
  bool align = false;
};

Expected<GsAttrs> parse_attrs(const Node& n) {
  GsAttrs a;
  const std::string mode = n.attrs.get_string("mode", "linear");
  const std::string pad = n.attrs.get_string("padding_mode", "zeros");
  if (mode == "linear")
    a.mode = kGsLinear;
  else if (mode == "nearest")
    a.mode = kGsNearest;
  else if (mode == "cubic")
    a.mode = kGsCubic;
  else
    return KILN_ERROR("{}: mode must be linear, nearest or cubic, got '{}'", n.label(), mode);
  if (pad == "zeros")
    a.pad = kGsZeros;
  else if (pad == "border")
    a.pad = kGsBorder;
  else if (pad == "reflection")
    a.pad = kGsReflection;
  else
    return KILN_ERROR("{}: padding_mode must be zeros, border or reflection, got '{}'", n.label(),
                      pad);
  const int64_t ac = n.attrs.get_int("align_corners", 0);
  if (ac != 0 && ac != 1)
    return KILN_ERROR("{}: align_corners must be 0 or 1, got {}", n.label(), ac);
  a.align = ac == 1;
  return a;
}

Status check_float(const Node& n, DataType t, const char* what) {
  if (t == DataType::kUndefined || dtype_is_float(t)) return Status::Ok();
  return KILN_ERROR("{}: {} must be a float tensor, got {}", n.label(), what, dtype_name(t));
}

// The checks shared by inference (dims may be unknown: -1) and the kernel.
Status check_shapes(const Node& n, const GsAttrs& a, const std::vector<int64_t>& x,
                    const std::vector<int64_t>& grid) {
  if (x.size() < 3)
    return KILN_ERROR("{}: X must be [N, C, d1, ...] of rank >= 3, got rank {}", n.label(),
                      x.size());
  const size_t r = x.size() - 2;
  if (grid.size() != r + 2 || (grid.back() >= 0 && grid.back() != static_cast<int64_t>(r)))
    return KILN_ERROR("{}: grid must be [N, D1..D{}, {}] for X of rank {}, got {}", n.label(), r, r,
                      x.size(), shape_str(grid));
  if (x[0] >= 0 && grid[0] >= 0 && x[0] != grid[0])
    return KILN_ERROR("{}: grid's batch {} differs from X's {}", n.label(), grid[0], x[0]);
  if (a.mode == kGsCubic && r != 2)
    return KILN_ERROR("{}: cubic mode takes 4-D X only (the spec's bicubic), got rank {}",
                      n.label(), x.size());
  return Status::Ok();
}

std::vector<int64_t> dims_or_unknown(const TensorType& t) {
  std::vector<int64_t> d;
  for (const Dim& k : *t.dims) d.push_back(k.is_static() ? k.value : -1);
  return d;
}

Status infer_grid_sample(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(GsAttrs a, parse_attrs(n));
  const TensorType& x = ctx.input_type(0);
  const TensorType& grid = ctx.input_type(1);
  KILN_RETURN_IF_ERROR(check_float(n, x.dtype, "X"));
  KILN_RETURN_IF_ERROR(check_float(n, grid.dtype, "grid"));
  if (!x.has_rank() || !grid.has_rank()) {
    // The output has the grid's rank (X's when the grid's is unknown).
    const int64_t rank = grid.has_rank() ? grid.rank() : x.rank();
    if (rank < 0)
      ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    else
      ctx.set_output(0, TensorType(x.dtype, std::vector<Dim>(rank)));
    return Status::Ok();
  }
  KILN_RETURN_IF_ERROR(check_shapes(n, a, dims_or_unknown(x), dims_or_unknown(grid)));
  std::vector<Dim> out = {(*x.dims)[0].is_static() ? (*x.dims)[0] : (*grid.dims)[0], (*x.dims)[1]};
  for (size_t k = 1; k + 1 < grid.dims->size(); ++k) out.push_back((*grid.dims)[k]);
  ctx.set_output(0, TensorType(x.dtype, std::move(out)));
  return Status::Ok();
}

// The sum over the taps of axes k.. of the sample, innermost axis first within each outer tap
// (onnxruntime's order: dy2 * (dx2 * p11 + dx1 * p12) + ...).
template <typename Cp>
Cp sum_taps(const Cp* x, const std::vector<GsTaps<Cp>>& taps, const std::vector<int64_t>& str,
            size_t k, int64_t off) {
  Cp s = 0;
  for (int t = 0; t < taps[k].n; ++t) {
    if (taps[k].idx[t] < 0) continue;  // zero padding
    const int64_t o = off + taps[k].idx[t] * str[k];
    s += taps[k].w[t] * (k + 1 == taps.size() ? x[o] : sum_taps(x, taps, str, k + 1, o));
  }
  return s;
}

// T: X's (and Y's) type; Cp: the compute type, double where X or the grid is float64.
template <typename T, typename Cp>
void grid_sample(const GsAttrs& a, const Tensor& x, const Tensor& grid, Tensor& y) {
  const int64_t N = x.dim(0), C = x.dim(1), r = x.rank() - 2;
  std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
  const std::vector<int64_t> str(contiguous_strides(in));
  int64_t in_size = 1, out_size = 1;
  for (int64_t d : in) in_size *= d;
  for (int64_t k = 1; k <= r; ++k) out_size *= grid.dim(k);
  std::vector<Cp> xv(x.numel()), gv(grid.numel());
  for (int64_t i = 0; i < x.numel(); ++i) xv[i] = static_cast<Cp>(x.at_double(i));
  for (int64_t i = 0; i < grid.numel(); ++i) gv[i] = static_cast<Cp>(grid.at_double(i));
  T* out = y.data<T>();
  std::vector<GsTaps<Cp>> taps(r);
  for (int64_t b = 0; b < N; ++b)
    for (int64_t p = 0; p < out_size; ++p) {
      bool finite = true;
      for (int64_t k = 0; k < r; ++k)  // grid's last axis lists the innermost axis first
        finite &= gs_axis_taps(gv[(b * out_size + p) * r + (r - 1 - k)], in[k], a.mode, a.pad,
                               a.align, taps[k]);
      for (int64_t c = 0; c < C; ++c) {
        const Cp v = finite ? sum_taps(xv.data() + (b * C + c) * in_size, taps, str, 0, 0)
                            : std::numeric_limits<Cp>::quiet_NaN();
        out[(b * C + c) * out_size + p] = convert<T>(v);
      }
    }
}

Status cpu_grid_sample(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(GsAttrs a, parse_attrs(n));
  const Tensor* x = ctx.input(0);
  const Tensor* grid = ctx.input(1);
  if (!x || !grid) return KILN_ERROR("{}: X and grid are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  KILN_RETURN_IF_ERROR(check_float(n, grid->dtype(), "grid"));
  KILN_RETURN_IF_ERROR(check_shapes(n, a, x->shape(), grid->shape()));
  std::vector<int64_t> shape = {x->dim(0), x->dim(1)};
  for (int64_t k = 1; k + 1 < grid->rank(); ++k) shape.push_back(grid->dim(k));
  Tensor y(x->dtype(), shape);
  if (y.numel() > 0)
    for (int64_t k = 2; k < x->rank(); ++k)
      if (x->dim(k) == 0)
        return KILN_ERROR("{}: X {} has nothing to sample from", n.label(), x->desc());
  const bool wide = x->dtype() == DataType::kFloat64 || grid->dtype() == DataType::kFloat64;
  if (y.numel() > 0)
    visit_dtype(x->dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_integral_v<T>) {  // floats only (check_float)
        if (wide)
          grid_sample<T, double>(a, *x, *grid, y);
        else
          grid_sample<T, float>(a, *x, *grid, y);
      }
    });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- AffineGrid(theta [N, r, r + 1], size [N, C, (D,) H, W]) -> grid [N, (D,) H, W, r] ------------
// Each point's normalized coordinates (x, y, (z,) 1), innermost axis first, times theta: the grid
// GridSample reads (a spatial transformer). r = 2 or 3; coordinates from affine_base.
Status check_theta(const Node& n, const std::vector<int64_t>& theta) {
  if (theta.size() != 3 || (theta[1] >= 0 && theta[1] != 2 && theta[1] != 3) ||
      (theta[1] >= 0 && theta[2] >= 0 && theta[2] != theta[1] + 1))
    return KILN_ERROR("{}: theta must be [N, 2, 3] or [N, 3, 4], got {}", n.label(),
                      shape_str(theta));
  return Status::Ok();
}

Status check_align(const Node& n) {
  const int64_t ac = n.attrs.get_int("align_corners", 0);
  if (ac != 0 && ac != 1)
    return KILN_ERROR("{}: align_corners must be 0 or 1, got {}", n.label(), ac);
  return Status::Ok();
}

Status infer_affine_grid(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_align(n));
  const TensorType &theta = ctx.input_type(0), &size = ctx.input_type(1);
  KILN_RETURN_IF_ERROR(check_float(n, theta.dtype, "theta"));
  if (theta.has_rank()) KILN_RETURN_IF_ERROR(check_theta(n, dims_or_unknown(theta)));
  if (size.dtype != DataType::kUndefined && size.dtype != DataType::kInt64)
    return KILN_ERROR("{}: size must be int64, got {}", n.label(), size.str());
  // The spatial rank: from size's length, else theta's rows.
  int64_t r = -1;
  if (size.has_rank() && size.rank() == 1 && (*size.dims)[0].is_static())
    r = (*size.dims)[0].value - 2;
  else if (theta.has_rank() && (*theta.dims)[1].is_static())
    r = (*theta.dims)[1].value;
  if (r == -1) {
    ctx.set_output(0, TensorType::unknown_rank(theta.dtype));
    return Status::Ok();
  }
  if (r != 2 && r != 3)
    return KILN_ERROR("{}: size must hold 4 or 5 values (N, C, (D,) H, W), got {}", n.label(),
                      size.str());
  if (theta.has_rank() && (*theta.dims)[1].is_static() && (*theta.dims)[1].value != r)
    return KILN_ERROR("{}: theta {} does not fit a size of {} values", n.label(), theta.str(), r + 2);
  std::vector<Dim> out(static_cast<size_t>(r) + 2);
  if (theta.has_rank()) out[0] = (*theta.dims)[0];
  if (const auto v = ctx.input_value(1); v && static_cast<int64_t>(v->size()) == r + 2) {
    if (!out[0].is_static()) out[0] = (*v)[0].dim();
    for (int64_t k = 0; k < r; ++k) out[1 + k] = (*v)[2 + k].dim();
  }
  out.back() = Dim(r);
  ctx.set_output(0, TensorType(theta.dtype, std::move(out)));
  return Status::Ok();
}

Status cpu_affine_grid(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_align(n));
  const Tensor *theta = ctx.input(0), *size = ctx.input(1);
  if (!theta || !size) return KILN_ERROR("{}: theta and size are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, theta->dtype(), "theta"));
  KILN_RETURN_IF_ERROR(check_theta(n, theta->shape()));
  const int64_t r = theta->dim(1);
  if (size->dtype() != DataType::kInt64 || size->rank() != 1 || size->numel() != r + 2)
    return KILN_ERROR("{}: size must be int64 [{}] for theta {}, got {}", n.label(), r + 2,
                      theta->desc(), size->desc());
  const int64_t* sz = size->data<int64_t>();
  if (sz[0] != theta->dim(0))
    return KILN_ERROR("{}: size's batch {} differs from theta's {}", n.label(), sz[0], theta->dim(0));
  std::vector<int64_t> shape = {sz[0]};
  int64_t points = 1;
  for (int64_t k = 0; k < r; ++k) {
    if (sz[2 + k] < 0) return KILN_ERROR("{}: size has a negative dim {}", n.label(), sz[2 + k]);
    shape.push_back(sz[2 + k]);
    points *= sz[2 + k];
  }
  shape.push_back(r);
  Tensor y(theta->dtype(), shape);
  const bool align = n.attrs.get_int("align_corners", 0) == 1;
  std::vector<double> th(theta->numel());
  for (int64_t i = 0; i < theta->numel(); ++i) th[i] = theta->at_double(i);
  visit_dtype(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_integral_v<T>) {
      T* out = y.data<T>();
      for (int64_t b = 0; b < sz[0]; ++b)
        for (int64_t p = 0; p < points; ++p) {
          double c[4] = {0, 0, 0, 1};  // x, y, (z,) 1: the innermost axis first
          for (int64_t k = 0, rest = p; k < r; ++k) {
            const int64_t len = sz[1 + r - k];
            c[k] = affine_base<double>(rest % len, len, align);
            rest /= len;
          }
          c[r] = 1;
          for (int64_t i = 0; i < r; ++i) {
            double v = 0;
            for (int64_t j = 0; j <= r; ++j) v += th[(b * r + i) * (r + 1) + j] * c[j];
            out[(b * points + p) * r + i] = convert<T>(v);
          }
        }
    }
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "GridSample", infer_grid_sample, cpu_grid_sample, upgrade_grid_sample},
    {"", "AffineGrid", infer_affine_grid, cpu_affine_grid, nullptr},
};

}  // namespace

std::span<const OpDef> sampling_ops() { return kOps; }

}  // namespace kiln
