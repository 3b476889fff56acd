// Normalizations added after kiln's first op set: RMSNormalization (opset 23), GroupNormalization
// (18/21), LpNormalization, MeanVarianceNormalization and LRN (AlexNet's and GoogLeNet's local
// response normalization across channels; passes/lrn_to_conv.cpp gives the GPU its form). All
// compute in float64 and round once to the input type, so one reference serves every float type
// (stash_type only ever asks for at least float32).

#include <cmath>
#include <set>

#include "ops/op.h"

namespace kiln {
namespace {

Status check_float(const Node& n, DataType t, const char* what) {
  if (t == DataType::kUndefined || dtype_is_float(t)) return Status::Ok();
  return KILN_ERROR("{}: {} must be float16, bfloat16, float32 or float64, got {}", n.label(), what,
                    dtype_name(t));
}

Status infer_float_same(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(check_float(ctx.node(), ctx.input_type(0).dtype, "X"));
  return infer_same_as_input(ctx);
}

// Group id of every element when the axes in `reduced` are collapsed: elements sharing the
// kept coordinates share a group. Returns the ids and the group count.
std::pair<std::vector<int64_t>, int64_t> group_ids(const std::vector<int64_t>& shape,
                                                   const std::set<int64_t>& reduced) {
  int64_t total = 1, groups = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    total *= shape[d];
    if (!reduced.count(static_cast<int64_t>(d))) groups *= shape[d];
  }
  std::vector<int64_t> ids(static_cast<size_t>(total));
  std::vector<int64_t> idx(shape.size(), 0);
  for (int64_t i = 0; i < total; ++i) {
    int64_t g = 0;
    for (size_t d = 0; d < shape.size(); ++d)
      if (!reduced.count(static_cast<int64_t>(d))) g = g * shape[d] + idx[d];
    ids[static_cast<size_t>(i)] = g;
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return {std::move(ids), groups};
}

// A parameter broadcast (numpy, right-aligned) onto x: its element for each x element.
Expected<std::vector<double>> broadcast_param(const Node& n, const Tensor& p,
                                              const std::vector<int64_t>& xs, const char* what) {
  bool ok = p.rank() <= static_cast<int64_t>(xs.size());
  for (int64_t k = 0; ok && k < p.rank(); ++k) {
    const int64_t d = p.shape()[k], t = xs[xs.size() - p.rank() + k];
    ok = d == t || d == 1;
  }
  if (!ok)
    return KILN_ERROR("{}: {} of shape {} cannot be broadcast to X {}", n.label(), what,
                      shape_str(p.shape()), shape_str(xs));
  const std::vector<int64_t> str = broadcast_strides(p.shape(), xs);
  std::vector<double> out;
  std::vector<int64_t> idx(xs.size(), 0);
  int64_t total = 1;
  for (int64_t d : xs) total *= d;
  for (int64_t i = 0; i < total; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < xs.size(); ++d) off += idx[d] * str[d];
    out.push_back(p.at_double(off));
    for (int64_t d = static_cast<int64_t>(xs.size()) - 1; d >= 0; --d) {
      if (++idx[d] < xs[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// --- RMSNormalization(X, scale): X / sqrt(mean(X^2 over axes [axis, rank)) + eps) * scale ----
Status cpu_rmsnorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* scale = ctx.input(1);
  if (!x || !scale) return KILN_ERROR("{}: X and scale are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  KILN_RETURN_IF_ERROR(check_float(n, scale->dtype(), "scale"));
  if (x->rank() == 0) return KILN_ERROR("{}: X must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x->rank(), n));
  std::set<int64_t> reduced;
  for (int64_t d = axis; d < x->rank(); ++d) reduced.insert(d);
  auto [ids, groups] = group_ids(x->shape(), reduced);
  KILN_ASSIGN_OR_RETURN(std::vector<double> s, broadcast_param(n, *scale, x->shape(), "scale"));
  std::vector<double> sum(static_cast<size_t>(groups), 0.0);
  const int64_t count = x->numel() / std::max<int64_t>(groups, 1);
  for (int64_t i = 0; i < x->numel(); ++i) sum[ids[i]] += x->at_double(i) * x->at_double(i);
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  Tensor y(DataType::kFloat64, x->shape());
  for (int64_t i = 0; i < x->numel(); ++i)
    y.data<double>()[i] =
        x->at_double(i) / std::sqrt(sum[ids[i]] / static_cast<double>(count) + eps) * s[i];
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// --- LpNormalization(X): X / ||X||_p along `axis` (p = 1 or 2); a zero norm gives 0 ----------
Status cpu_lpnorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  const int64_t p = n.attrs.get_int("p", 2);
  if (p != 1 && p != 2) return KILN_ERROR("{}: p must be 1 or 2, got {}", n.label(), p);
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x->rank(), n));
  auto [ids, groups] = group_ids(x->shape(), {axis});
  std::vector<double> norm(static_cast<size_t>(groups), 0.0);
  for (int64_t i = 0; i < x->numel(); ++i)
    norm[ids[i]] += p == 1 ? std::fabs(x->at_double(i)) : x->at_double(i) * x->at_double(i);
  Tensor y(DataType::kFloat64, x->shape());
  for (int64_t i = 0; i < x->numel(); ++i) {
    const double d = p == 1 ? norm[ids[i]] : std::sqrt(norm[ids[i]]);
    y.data<double>()[i] = d == 0 ? 0.0 : x->at_double(i) / d;
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// --- MeanVarianceNormalization(X): (X - mean) / sqrt(var + 1e-9) over `axes` (default 0,2,3) --
Status cpu_mvn(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  std::set<int64_t> reduced;
  for (int64_t a : n.attrs.get_ints("axes", {0, 2, 3})) {
    KILN_ASSIGN_OR_RETURN(int64_t ax, normalize_axis(a, x->rank(), n));
    reduced.insert(ax);
  }
  auto [ids, groups] = group_ids(x->shape(), reduced);
  const double count = static_cast<double>(x->numel()) / static_cast<double>(std::max<int64_t>(groups, 1));
  std::vector<double> mean(static_cast<size_t>(groups), 0.0), sq(static_cast<size_t>(groups), 0.0);
  for (int64_t i = 0; i < x->numel(); ++i) {
    mean[ids[i]] += x->at_double(i) / count;
    sq[ids[i]] += x->at_double(i) * x->at_double(i) / count;
  }
  Tensor y(DataType::kFloat64, x->shape());
  for (int64_t i = 0; i < x->numel(); ++i) {
    const double var = sq[ids[i]] - mean[ids[i]] * mean[ids[i]];
    y.data<double>()[i] = (x->at_double(i) - mean[ids[i]]) / std::sqrt(var + 1e-9);
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// --- GroupNormalization(X, scale, bias): opset 21 form, scale/bias per channel ---------------
// Opset 18 gave scale and bias per group; the upgrade marks that (kiln_per_group) so the kernel
// reads them per group.
Status upgrade_groupnorm(ImportContext& ctx) {
  if (ctx.opset() < 21) ctx.node().attrs.set("kiln_per_group", Attribute::Int(1));
  return Status::Ok();
}

Status cpu_groupnorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* scale = ctx.input(1);
  const Tensor* bias = ctx.input(2);
  if (!x || !scale || !bias) return KILN_ERROR("{}: X, scale and bias are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  if (x->rank() < 2) return KILN_ERROR("{}: X must have rank >= 2, got {}", n.label(), x->desc());
  const int64_t G = n.attrs.get_int("num_groups", 0), N = x->dim(0), C = x->dim(1);
  if (G <= 0 || C % G != 0)
    return KILN_ERROR("{}: num_groups {} must divide the {} channels", n.label(), G, C);
  const bool per_group = n.attrs.get_int("kiln_per_group", 0) != 0;
  const int64_t want = per_group ? G : C;
  if (scale->numel() != want || bias->numel() != want)
    return KILN_ERROR("{}: scale and bias must have {} elements, got {} and {}", n.label(), want,
                      scale->desc(), bias->desc());
  const int64_t inner = x->numel() / std::max<int64_t>(N * C, 1), per = C / G * inner;
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  Tensor y(DataType::kFloat64, x->shape());
  for (int64_t b = 0; b < N * G; ++b) {
    const int64_t base = b * per;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < per; ++i) mean += x->at_double(base + i);
    mean /= static_cast<double>(per);
    for (int64_t i = 0; i < per; ++i) var += std::pow(x->at_double(base + i) - mean, 2);
    var /= static_cast<double>(per);
    for (int64_t i = 0; i < per; ++i) {
      const int64_t c = (b % G) * (C / G) + i / inner;
      const int64_t k = per_group ? b % G : c;
      y.data<double>()[base + i] = (x->at_double(base + i) - mean) / std::sqrt(var + eps) *
                                       scale->at_double(k) + bias->at_double(k);
    }
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// LRN: y = x / (bias + alpha / size * sum of x^2 over the channels c - floor((size - 1) / 2) ..
// c + ceil((size - 1) / 2))^beta, over X [N, C, ...].
Status lrn_attrs(const Node& n, int64_t* size) {
  *size = n.attrs.get_int("size", 0);
  if (*size < 1) return KILN_ERROR("{}: LRN needs a size >= 1, got {}", n.label(), *size);
  return Status::Ok();
}

Status infer_lrn(InferContext& ctx) {
  int64_t size = 0;
  KILN_RETURN_IF_ERROR(lrn_attrs(ctx.node(), &size));
  const TensorType& x = ctx.input_type(0);
  if (x.has_rank() && x.rank() < 3)
    return KILN_ERROR("{}: LRN input must be [N, C, d1, ...], got {}", ctx.node().label(), x.str());
  return infer_float_same(ctx);
}

Status cpu_lrn(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  int64_t size = 0;
  KILN_RETURN_IF_ERROR(lrn_attrs(n, &size));
  if (!x || x->rank() < 3 || !dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: LRN input must be a float [N, C, d1, ...]", n.label());
  const double alpha = n.attrs.get_float("alpha", 1e-4f), beta = n.attrs.get_float("beta", 0.75f),
               bias = n.attrs.get_float("bias", 1.0f);
  const int64_t N = x->dim(0), C = x->dim(1), inner = C == 0 || N == 0 ? 0 : x->numel() / (N * C);
  const int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, x->shape());
  const double* in = xd.data<double>();
  double* out = y.data<double>();
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        double s = 0;
        for (int64_t k = std::max<int64_t>(0, c - lo); k <= std::min(C - 1, c + hi); ++k) {
          const double v = in[(b * C + k) * inner + i];
          s += v * v;
        }
        const int64_t at = (b * C + c) * inner + i;
        out[at] = in[at] / std::pow(bias + alpha / static_cast<double>(size) * s, beta);
      }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "LRN", infer_lrn, cpu_lrn, nullptr},
    {"", "RMSNormalization", infer_float_same, cpu_rmsnorm, nullptr},
    {"", "LpNormalization", infer_float_same, cpu_lpnorm, nullptr},
    {"", "MeanVarianceNormalization", infer_float_same, cpu_mvn, nullptr},
    {"", "GroupNormalization", infer_float_same, cpu_groupnorm, upgrade_groupnorm},
};

}  // namespace

std::span<const OpDef> norm_extra_ops() { return kOps; }

}  // namespace kiln
