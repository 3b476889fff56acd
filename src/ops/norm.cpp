// Normalisation ops: BatchNormalization (inference only), InstanceNormalization,
// LayerNormalization. Kernels compute in double and round to the input type at the end.
#include <cmath>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

Status check_float(const Node& n, DataType t, const char* what) {
  if (t != DataType::kUndefined && !dtype_is_float(t))
    return KILN_ERROR("{}: {} must be a float tensor, got {}", n.label(), what, dtype_name(t));
  return Status::Ok();
}

// True when an extra (training-mode) output of BatchNormalization is consumed.
bool extra_outputs_used(Graph& g, const Node& n) {
  for (size_t i = 1; i < n.num_outputs(); ++i) {
    const Value* v = n.output(i);
    if (v && (!v->uses().empty() || g.is_graph_output(v))) return true;
  }
  return false;
}

// --- BatchNormalization -----------------------------------------------------------------------
// Opsets 1-5 carry consumed_inputs, 1-6 is_test, 1-8 spatial; 14+ training_mode. spatial=0
// (statistics per activation, i.e. scale/B/mean/var of shape X.shape[1:]) is kept as
// kiln_per_activation=1. training_mode=1 normalizes Y with the batch's own statistics (the
// reference kernel below; GPU tactics refuse it): models that standardize constant weights this
// way (timm's NFNets) fold it at build time. Its running-statistics outputs are refused.
Status upgrade_batchnorm(ImportContext& ctx) {
  Node& n = ctx.node();
  n.attrs.erase("consumed_inputs");
  n.attrs.erase("is_test");
  if (n.attrs.has("spatial")) {
    if (n.attrs.get_int("spatial", 1) == 0) n.attrs.set("kiln_per_activation", Attribute::Int(1));
    n.attrs.erase("spatial");
  }
  if (extra_outputs_used(ctx.graph(), n))
    return KILN_ERROR(
        "{}: BatchNormalization's running mean/var outputs (training) are not supported; export "
        "the model in eval/inference mode",
        n.label());
  return Status::Ok();
}

Status check_batchnorm_mode(const Node& n) {
  if (n.attrs.get_int("training_mode", 0) != 0 && n.attrs.get_int("kiln_per_activation", 0) != 0)
    return KILN_ERROR("{}: BatchNormalization training mode with per-activation statistics "
                      "(spatial=0) is not supported", n.label());
  return Status::Ok();
}

Status infer_batchnorm(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_batchnorm_mode(n));
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_float(n, x.dtype, "X"));
  if (x.has_rank() && x.rank() < 2)
    return KILN_ERROR("{}: X must have rank >= 2 (N, C, ...), got rank {}", n.label(), x.rank());
  for (size_t i = 1; i < 5; ++i) {
    if (!ctx.has_input(i)) return KILN_ERROR("{}: input {} is required", n.label(), i);
    KILN_RETURN_IF_ERROR(check_float(n, ctx.input_type(i).dtype, "scale/B/mean/var"));
  }
  // Unconsumed extra outputs (old opsets list them even in inference) echo the running stats.
  for (size_t i = 1; i < ctx.num_outputs(); ++i) ctx.set_output(i, ctx.input_type(i % 2 ? 3 : 4));
  return infer_same_as_input(ctx);
}

Status cpu_batchnorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_batchnorm_mode(n));
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input X", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  if (x->rank() < 2)
    return KILN_ERROR("{}: X must have rank >= 2 (N, C, ...), got {}", n.label(), x->desc());
  const bool per_act = n.attrs.get_int("kiln_per_activation", 0) != 0;
  const int64_t N = x->dim(0), C = x->dim(1);
  int64_t inner = 1;
  for (int64_t i = 2; i < x->rank(); ++i) inner *= x->dim(i);
  const int64_t params = per_act ? C * inner : C;
  Tensor p[4];
  for (size_t i = 0; i < 4; ++i) {
    const Tensor* t = ctx.input(i + 1);
    if (!t) return KILN_ERROR("{}: input {} is required", n.label(), i + 1);
    KILN_RETURN_IF_ERROR(check_float(n, t->dtype(), "scale/B/mean/var"));
    if (t->numel() != params || (!per_act && t->rank() != 1))
      return KILN_ERROR("{}: input {} has shape {}, expected {} values{}", n.label(), i + 1,
                        t->desc(), params, per_act ? " (per activation, spatial=0)" : " ([C])");
    p[i] = t->cast(DataType::kFloat64);
  }
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  const Tensor xd = x->cast(DataType::kFloat64);
  const double* in = xd.data<double>();
  if (n.attrs.get_int("training_mode", 0) != 0) {
    // The batch's statistics per channel over N and the spatial axes (population variance), in
    // place of the running mean and variance.
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0, sq = 0;
      const double count = static_cast<double>(N * inner);
      for (int64_t b = 0; b < N; ++b)
        for (int64_t i = 0; i < inner; ++i) sum += in[(b * C + c) * inner + i];
      const double m = count > 0 ? sum / count : 0.0;
      for (int64_t b = 0; b < N; ++b)
        for (int64_t i = 0; i < inner; ++i) {
          const double d = in[(b * C + c) * inner + i] - m;
          sq += d * d;
        }
      p[2].data<double>()[c] = m;
      p[3].data<double>()[c] = count > 0 ? sq / count : 0.0;
    }
  }
  const double *scale = p[0].data<double>(), *bias = p[1].data<double>(),
               *mean = p[2].data<double>(), *var = p[3].data<double>();
  Tensor y(DataType::kFloat64, x->shape());
  double* out = y.data<double>();
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = per_act ? c * inner + i : c;
        const int64_t e = (b * C + c) * inner + i;
        out[e] = (in[e] - mean[k]) / std::sqrt(var[k] + eps) * scale[k] + bias[k];
      }
  ctx.set_output(0, y.cast(x->dtype()));
  for (size_t i = 1; i < ctx.num_outputs(); ++i)
    ctx.set_output(i, ctx.input(i % 2 ? 3 : 4)->clone());
  return Status::Ok();
}

// --- InstanceNormalization --------------------------------------------------------------------
Status upgrade_instancenorm(ImportContext& ctx) {
  ctx.node().attrs.erase("consumed_inputs");  // opset 1 only; has no meaning for inference
  return Status::Ok();
}

Status infer_instancenorm(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_float(n, x.dtype, "input"));
  if (x.has_rank() && x.rank() < 2)
    return KILN_ERROR("{}: input must have rank >= 2 (N, C, ...), got rank {}", n.label(),
                      x.rank());
  if (!ctx.has_input(1) || !ctx.has_input(2))
    return KILN_ERROR("{}: scale and B are required", n.label());
  return infer_same_as_input(ctx);
}

Status cpu_instancenorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: input, scale and B are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "input"));
  if (x->rank() < 2)
    return KILN_ERROR("{}: input must have rank >= 2 (N, C, ...), got {}", n.label(), x->desc());
  const int64_t N = x->dim(0), C = x->dim(1);
  for (size_t i = 1; i < 3; ++i) {
    KILN_RETURN_IF_ERROR(check_float(n, ctx.input(i)->dtype(), "scale/B"));
    if (ctx.input(i)->rank() != 1 || ctx.input(i)->dim(0) != C)
      return KILN_ERROR("{}: input {} has shape {}, expected [{}]", n.label(), i,
                        ctx.input(i)->desc(), C);
  }
  const Tensor sd = ctx.input(1)->cast(DataType::kFloat64);
  const Tensor bd = ctx.input(2)->cast(DataType::kFloat64);
  int64_t inner = 1;
  for (int64_t i = 2; i < x->rank(); ++i) inner *= x->dim(i);
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, x->shape());
  const double* in = xd.data<double>();
  double* out = y.data<double>();
  for (int64_t b = 0; b < N; ++b)
    for (int64_t c = 0; c < C; ++c) {
      const double* xi = in + (b * C + c) * inner;
      double* yi = out + (b * C + c) * inner;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < inner; ++i) mean += xi[i];
      mean /= static_cast<double>(std::max<int64_t>(inner, 1));
      for (int64_t i = 0; i < inner; ++i) var += (xi[i] - mean) * (xi[i] - mean);
      var /= static_cast<double>(std::max<int64_t>(inner, 1));
      const double s = sd.data<double>()[c] / std::sqrt(var + eps);
      for (int64_t i = 0; i < inner; ++i) yi[i] = (xi[i] - mean) * s + bd.data<double>()[c];
    }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// --- LayerNormalization (opset 17) ------------------------------------------------------------
Expected<DataType> stash_dtype(const Node& n) {
  const int64_t s = n.attrs.get_int("stash_type", 1);
  const DataType t = static_cast<DataType>(s);
  if (!dtype_is_float(t)) return KILN_ERROR("{}: stash_type {} is not a float type", n.label(), s);
  return t;
}

Status infer_layernorm(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_float(n, x.dtype, "X"));
  if (!ctx.has_input(1)) return KILN_ERROR("{}: Scale is required", n.label());
  KILN_ASSIGN_OR_RETURN(DataType st, stash_dtype(n));
  ctx.set_output(0, x);
  if (!x.has_rank()) {
    ctx.set_output(1, TensorType::unknown_rank(st));
    ctx.set_output(2, TensorType::unknown_rank(st));
    return Status::Ok();
  }
  if (x.rank() == 0) return KILN_ERROR("{}: X must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x.rank(), n));
  std::vector<Dim> d = *x.dims;
  for (int64_t i = axis; i < x.rank(); ++i) d[i] = Dim(1);
  ctx.set_output(1, TensorType(st, d));
  ctx.set_output(2, TensorType(st, d));
  return Status::Ok();
}

// Strides of `p` broadcast (unidirectionally) onto `target`, or an error.
Expected<std::vector<int64_t>> param_strides(const Node& n, const Tensor& p,
                                             const std::vector<int64_t>& target, const char* what) {
  bool ok = p.rank() <= static_cast<int64_t>(target.size());
  for (int64_t k = 0; ok && k < p.rank(); ++k) {
    const int64_t d = p.shape()[k], t = target[target.size() - p.rank() + k];
    ok = d == t || d == 1;
  }
  if (!ok)
    return KILN_ERROR("{}: {} of shape {} cannot be broadcast to the normalised shape {}",
                      n.label(), what, shape_str(p.shape()), shape_str(target));
  return broadcast_strides(p.shape(), target);
}

Status cpu_layernorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  const Tensor* scale = ctx.input(1);
  const Tensor* bias = ctx.input(2);
  if (!x || !scale) return KILN_ERROR("{}: X and Scale are required", n.label());
  KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "X"));
  KILN_RETURN_IF_ERROR(check_float(n, scale->dtype(), "Scale"));
  if (bias) KILN_RETURN_IF_ERROR(check_float(n, bias->dtype(), "B"));
  KILN_ASSIGN_OR_RETURN(DataType st, stash_dtype(n));
  if (x->rank() == 0) return KILN_ERROR("{}: X must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(n.attrs.get_int("axis", -1), x->rank(), n));
  const std::vector<int64_t> norm_shape(x->shape().begin() + axis, x->shape().end());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x->dim(i);
  for (int64_t d : norm_shape) inner *= d;
  KILN_ASSIGN_OR_RETURN(auto s_str, param_strides(n, *scale, norm_shape, "Scale"));
  std::vector<int64_t> b_str;
  if (bias) {
    KILN_ASSIGN_OR_RETURN(b_str, param_strides(n, *bias, norm_shape, "B"));
  }
  const Tensor sd = scale->cast(DataType::kFloat64);
  const Tensor bd = bias ? bias->cast(DataType::kFloat64) : Tensor();
  // Offset of inner element i in a broadcast parameter.
  auto offset = [&](int64_t i, const std::vector<int64_t>& str) {
    int64_t off = 0;
    for (int64_t k = static_cast<int64_t>(norm_shape.size()) - 1; k >= 0; --k) {
      off += (i % norm_shape[k]) * str[k];
      i /= norm_shape[k];
    }
    return off;
  };
  std::vector<int64_t> s_off(inner), b_off(bias ? inner : 0);
  for (int64_t i = 0; i < inner; ++i) {
    s_off[i] = offset(i, s_str);
    if (bias) b_off[i] = offset(i, b_str);
  }
  std::vector<int64_t> stat_shape = x->shape();
  for (int64_t i = axis; i < x->rank(); ++i) stat_shape[i] = 1;
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, x->shape()), mean_t(DataType::kFloat64, stat_shape),
      inv_t(DataType::kFloat64, stat_shape);
  const double eps = n.attrs.get_float("epsilon", 1e-5f);
  for (int64_t o = 0; o < outer; ++o) {
    const double* xi = xd.data<double>() + o * inner;
    double* yi = y.data<double>() + o * inner;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < inner; ++i) mean += xi[i];
    mean /= static_cast<double>(std::max<int64_t>(inner, 1));
    for (int64_t i = 0; i < inner; ++i) var += (xi[i] - mean) * (xi[i] - mean);
    var /= static_cast<double>(std::max<int64_t>(inner, 1));
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < inner; ++i)
      yi[i] = (xi[i] - mean) * inv * sd.data<double>()[s_off[i]] +
              (bias ? bd.data<double>()[b_off[i]] : 0.0);
    mean_t.data<double>()[o] = mean;
    inv_t.data<double>()[o] = inv;
  }
  ctx.set_output(0, y.cast(x->dtype()));
  ctx.set_output(1, mean_t.cast(st));
  ctx.set_output(2, inv_t.cast(st));
  return Status::Ok();
}

constexpr OpDef kNormOps[] = {
    {"", "BatchNormalization", infer_batchnorm, cpu_batchnorm, upgrade_batchnorm},
    {"", "InstanceNormalization", infer_instancenorm, cpu_instancenorm, upgrade_instancenorm},
    {"", "LayerNormalization", infer_layernorm, cpu_layernorm, nullptr},
};

}  // namespace

std::span<const OpDef> norm_ops() { return kNormOps; }

}  // namespace kiln
