// Reduce* ops (opset 18/13 canonical form: axes is the optional int64 input 1).
//
// Semantics shared by all ten ops:
// - axes absent or empty: reduce every axis, unless noop_with_empty_axes=1, in which case no
//   axis is reduced and each output element is the reduction of the single input element at
//   the same position (so ReduceSumSquare squares, ReduceLogSum takes the log, ... as the ONNX
//   spec settled in onnx/onnx#7394).
// - Reducing an empty set gives the op's identity: Sum/L1/L2/SumSquare 0, Prod 1, Max the
//   lowest value (-inf, or the type's minimum, false), Min the highest value, LogSum and
//   LogSumExp -inf, Mean NaN (0 for integer types).
// - Float types accumulate in double and round once at the end (float16/bfloat16 included).
// - Integer Sum/Prod/SumSquare/L1 wrap around like the type's own arithmetic; integer Mean
//   truncates toward zero; integer L2/LogSum/LogSumExp are computed in double and converted
//   toward zero, saturating at the type's range (NaN gives 0).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

enum class Kind { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

template <typename T>
constexpr bool kIsFloat = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                          std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// What inference knows about the axes input: its values, or (when not constant) its length.
struct AxesSpec {
  bool known = true;
  std::vector<int64_t> axes;  // as given (may be negative)
  int64_t count = -1;         // number of axes when only the length is known, else -1
};

Status check_no_axes_attribute(const Node& n) {
  if (n.attrs.has("axes"))
    return KILN_ERROR(
        "{}: has an 'axes' attribute; the canonical (opset 18) form takes axes as input 1 "
        "(the node was not upgraded)",
        n.label());
  return Status::Ok();
}

// Builds the reduced-dimension mask from the axes; errors on out-of-range or repeated axes.
Expected<std::vector<bool>> reduce_mask(const std::vector<int64_t>& axes, int64_t rank,
                                        bool noop_with_empty_axes, const Node& n) {
  std::vector<bool> mask(static_cast<size_t>(rank), false);
  if (axes.empty()) {
    if (!noop_with_empty_axes) std::fill(mask.begin(), mask.end(), true);
    return mask;
  }
  for (int64_t a : axes) {
    if (a < -rank || a >= rank)
      return KILN_ERROR("{}: axis {} is out of range for rank {}", n.label(), a, rank);
    const int64_t k = a < 0 ? a + rank : a;
    if (mask[static_cast<size_t>(k)])
      return KILN_ERROR("{}: axis {} is listed more than once", n.label(), a);
    mask[static_cast<size_t>(k)] = true;
  }
  return mask;
}

Expected<std::vector<int64_t>> axes_from_tensor(const Tensor& t, const Node& n) {
  if (!dtype_is_integer(t.dtype()))
    return KILN_ERROR("{}: axes must be an integer tensor, got {}", n.label(), t.desc());
  if (t.rank() > 1) return KILN_ERROR("{}: axes must be 1-D, got {}", n.label(), t.desc());
  return t.to_int64_vector();
}

Status infer_reduce(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_no_axes_attribute(n));
  const TensorType& in = ctx.input_type(0);
  const bool keepdims = ctx.attrs().get_int("keepdims", 1) != 0;
  const bool noop = ctx.attrs().get_int("noop_with_empty_axes", 0) != 0;
  if (in.dtype == DataType::kBool && n.op_type != "ReduceMax" && n.op_type != "ReduceMin")
    return KILN_ERROR("{}: bool input is not supported by {}", n.label(), n.op_type);

  AxesSpec spec;
  if (ctx.has_input(1)) {
    if (const Tensor* c = ctx.input_const(1)) {
      KILN_ASSIGN_OR_RETURN(spec.axes, axes_from_tensor(*c, n));
    } else {
      spec.known = false;
      const TensorType& at = ctx.input_type(1);
      if (at.has_rank() && at.rank() == 1 && (*at.dims)[0].is_static())
        spec.count = (*at.dims)[0].value;
      if (at.has_rank() && at.rank() == 0) spec.count = 1;
      if (spec.count == 0) spec.known = true;  // an empty axes tensor, whatever its values
    }
  }
  if (!in.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(in.dtype));
    return Status::Ok();
  }
  const int64_t rank = in.rank();
  const auto& dims = *in.dims;
  if (!spec.known) {
    // The axes are data: each dim is either kept or reduced (to 1 or removed).
    if (keepdims) {
      std::vector<Dim> out;
      for (const Dim& d : dims) out.push_back(d.is_static() && d.value == 1 ? Dim(1) : Dim());
      ctx.set_output(0, TensorType(in.dtype, out));
    } else if (spec.count > 0 && spec.count <= rank) {
      ctx.set_output(0, TensorType(in.dtype, std::vector<Dim>(rank - spec.count, Dim())));
    } else {
      ctx.set_output(0, TensorType::unknown_rank(in.dtype));
    }
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(auto mask, reduce_mask(spec.axes, rank, noop, n));
  std::vector<Dim> out;
  for (size_t k = 0; k < dims.size(); ++k) {
    if (!mask[k])
      out.push_back(dims[k]);
    else if (keepdims)
      out.push_back(Dim(1));
  }
  ctx.set_output(0, TensorType(in.dtype, out));
  return Status::Ok();
}

// Converts a double result to T; integers truncate toward zero and saturate (NaN -> 0).
template <typename T>
T from_double(double v) {
  if constexpr (kIsFloat<T>) {
    return convert<T>(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    if (std::isnan(v)) return T(0);
    const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<T>::max());
    if (v <= lo) return std::numeric_limits<T>::lowest();
    if (v >= hi) return std::numeric_limits<T>::max();
    return static_cast<T>(v);
  }
}

// Visits every input element with the flat index of the output element it reduces into.
template <typename F>
void for_each_mapped(const std::vector<int64_t>& shape, const std::vector<int64_t>& ostride,
                     F&& f) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> idx(shape.size(), 0);
  int64_t o = 0;
  for (int64_t i = 0; i < total; ++i) {
    f(i, o);
    for (int64_t d = rank - 1; d >= 0; --d) {
      o += ostride[d];
      if (++idx[d] < shape[d]) break;
      o -= ostride[d] * shape[d];
      idx[d] = 0;
    }
  }
}

template <Kind K, typename T>
void reduce_float(const T* x, T* y, int64_t out_n, int64_t count, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& ostride) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double init = 0.0;
  if constexpr (K == Kind::kProd) init = 1.0;
  if constexpr (K == Kind::kMax || K == Kind::kLogSumExp) init = -kInf;
  if constexpr (K == Kind::kMin) init = kInf;
  std::vector<double> acc(static_cast<size_t>(out_n), init);
  for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
    const double v = to_double(x[i]);
    double& a = acc[static_cast<size_t>(o)];
    if constexpr (K == Kind::kSum || K == Kind::kMean || K == Kind::kLogSum) a += v;
    if constexpr (K == Kind::kProd) a *= v;
    if constexpr (K == Kind::kL1) a += std::fabs(v);
    if constexpr (K == Kind::kL2 || K == Kind::kSumSquare) a += v * v;
    if constexpr (K == Kind::kMax || K == Kind::kLogSumExp) {
      if (std::isnan(v) || v > a) a = std::isnan(a) ? a : v;
    }
    if constexpr (K == Kind::kMin) {
      if (std::isnan(v) || v < a) a = std::isnan(a) ? a : v;
    }
  });
  if constexpr (K == Kind::kLogSumExp) {
    // Second pass: sum of exp(x - max), so large inputs do not overflow.
    std::vector<double> sum(static_cast<size_t>(out_n), 0.0);
    for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
      const double m = acc[static_cast<size_t>(o)];
      if (std::isfinite(m)) sum[static_cast<size_t>(o)] += std::exp(to_double(x[i]) - m);
    });
    for (int64_t o = 0; o < out_n; ++o) {
      const double m = acc[static_cast<size_t>(o)];
      y[o] = convert<T>(std::isfinite(m) ? m + std::log(sum[static_cast<size_t>(o)]) : m);
    }
    return;
  }
  for (int64_t o = 0; o < out_n; ++o) {
    double a = acc[static_cast<size_t>(o)];
    if constexpr (K == Kind::kMean) a = a / static_cast<double>(count);
    if constexpr (K == Kind::kL2) a = std::sqrt(a);
    if constexpr (K == Kind::kLogSum) a = std::log(a);
    y[o] = convert<T>(a);
  }
}

template <Kind K, typename T>
void reduce_int(const T* x, T* y, int64_t out_n, int64_t count, const std::vector<int64_t>& shape,
                const std::vector<int64_t>& ostride) {
  if constexpr (K == Kind::kMax || K == Kind::kMin) {
    const T init =
        K == Kind::kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
    std::fill(y, y + out_n, init);
    for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
      if constexpr (K == Kind::kMax)
        y[o] = std::max(y[o], x[i]);
      else
        y[o] = std::min(y[o], x[i]);
    });
  } else if constexpr (K == Kind::kL2 || K == Kind::kLogSum || K == Kind::kLogSumExp) {
    std::vector<double> acc(static_cast<size_t>(out_n),
                            K == Kind::kLogSumExp ? -std::numeric_limits<double>::infinity() : 0.0);
    if constexpr (K == Kind::kLogSumExp) {
      for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
        acc[o] = std::max(acc[o], static_cast<double>(x[i]));
      });
      std::vector<double> sum(static_cast<size_t>(out_n), 0.0);
      for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
        sum[o] += std::exp(static_cast<double>(x[i]) - acc[o]);
      });
      for (int64_t o = 0; o < out_n; ++o)
        y[o] = from_double<T>(std::isfinite(acc[o]) ? acc[o] + std::log(sum[o]) : acc[o]);
    } else {
      for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
        const double v = static_cast<double>(x[i]);
        acc[o] += K == Kind::kL2 ? v * v : v;
      });
      for (int64_t o = 0; o < out_n; ++o)
        y[o] = from_double<T>(K == Kind::kL2 ? std::sqrt(acc[o]) : std::log(acc[o]));
    }
  } else {
    // Sum, Mean, Prod, L1, SumSquare: modular arithmetic in uint64, exact mod 2^bits of T.
    std::vector<uint64_t> acc(static_cast<size_t>(out_n), K == Kind::kProd ? 1u : 0u);
    for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
      const T v = x[i];
      uint64_t u = static_cast<uint64_t>(v);  // sign-extends signed values
      if constexpr (K == Kind::kL1 && std::is_signed_v<T>)
        if (v < 0) u = uint64_t{0} - u;
      if constexpr (K == Kind::kProd)
        acc[o] *= u;
      else if constexpr (K == Kind::kSumSquare)
        acc[o] += u * u;
      else
        acc[o] += u;
    });
    for (int64_t o = 0; o < out_n; ++o) {
      if constexpr (K == Kind::kMean) {
        if (count == 0) {
          y[o] = T(0);
          continue;
        }
        if constexpr (std::is_signed_v<T>)
          y[o] = static_cast<T>(static_cast<int64_t>(acc[o]) / count);
        else
          y[o] = static_cast<T>(acc[o] / static_cast<uint64_t>(count));
      } else {
        y[o] = static_cast<T>(acc[o]);
      }
    }
  }
}

template <Kind K>
void reduce_bool(const bool* x, bool* y, int64_t out_n, const std::vector<int64_t>& shape,
                 const std::vector<int64_t>& ostride) {
  // Max is "any", Min is "all" (False < True).
  std::fill(y, y + out_n, K == Kind::kMin);
  for_each_mapped(shape, ostride, [&](int64_t i, int64_t o) {
    if constexpr (K == Kind::kMax)
      y[o] = y[o] || x[i];
    else
      y[o] = y[o] && x[i];
  });
}

template <Kind K>
Status reduce_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(check_no_axes_attribute(n));
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input 'data'", n.label());
  const DataType dt = x->dtype();
  if (!dtype_is_float(dt) && !dtype_is_integer(dt) && dt != DataType::kBool)
    return KILN_ERROR("{}: unsupported input type {}", n.label(), dtype_name(dt));
  if (dt == DataType::kBool && K != Kind::kMax && K != Kind::kMin)
    return KILN_ERROR("{}: bool input is not supported by {}", n.label(), n.op_type);
  std::vector<int64_t> axes;
  if (const Tensor* a = ctx.input(1)) {
    KILN_ASSIGN_OR_RETURN(axes, axes_from_tensor(*a, n));
  }
  const bool keepdims = ctx.attrs().get_int("keepdims", 1) != 0;
  const bool noop = ctx.attrs().get_int("noop_with_empty_axes", 0) != 0;
  KILN_ASSIGN_OR_RETURN(auto mask, reduce_mask(axes, x->rank(), noop, n));

  const std::vector<int64_t>& shape = x->shape();
  std::vector<int64_t> kept_shape, out_shape;  // kept_shape: reduced dims as 1
  int64_t count = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    kept_shape.push_back(mask[k] ? 1 : shape[k]);
    if (mask[k]) count *= shape[k];
    if (!mask[k] || keepdims) out_shape.push_back(mask[k] ? 1 : shape[k]);
  }
  std::vector<int64_t> ostride = contiguous_strides(kept_shape);
  for (size_t k = 0; k < shape.size(); ++k)
    if (mask[k]) ostride[k] = 0;

  Tensor y(dt, out_shape);
  const int64_t out_n = y.numel();
  visit_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = x->data<T>();
    T* yp = y.data<T>();
    if constexpr (std::is_same_v<T, bool>) {
      if constexpr (K == Kind::kMax || K == Kind::kMin)
        reduce_bool<K>(xp, yp, out_n, shape, ostride);
    } else if constexpr (kIsFloat<T>) {
      reduce_float<K, T>(xp, yp, out_n, count, shape, ostride);
    } else {
      reduce_int<K, T>(xp, yp, out_n, count, shape, ostride);
    }
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// Opsets before 18 (ReduceSum: before 13) carry axes as an attribute.
template <int kAxesInputSince>
Status upgrade_reduce(ImportContext& ctx) {
  if (ctx.opset() < kAxesInputSince) {
    ctx.attr_to_input("axes", 1);
    ctx.node().attrs.erase("noop_with_empty_axes");  // did not exist yet: default behaviour
  }
  return Status::Ok();
}

constexpr OpDef kReduceOps[] = {
    {"", "ReduceSum", infer_reduce, reduce_cpu<Kind::kSum>, upgrade_reduce<13>},
    {"", "ReduceMean", infer_reduce, reduce_cpu<Kind::kMean>, upgrade_reduce<18>},
    {"", "ReduceMax", infer_reduce, reduce_cpu<Kind::kMax>, upgrade_reduce<18>},
    {"", "ReduceMin", infer_reduce, reduce_cpu<Kind::kMin>, upgrade_reduce<18>},
    {"", "ReduceProd", infer_reduce, reduce_cpu<Kind::kProd>, upgrade_reduce<18>},
    {"", "ReduceL1", infer_reduce, reduce_cpu<Kind::kL1>, upgrade_reduce<18>},
    {"", "ReduceL2", infer_reduce, reduce_cpu<Kind::kL2>, upgrade_reduce<18>},
    {"", "ReduceLogSum", infer_reduce, reduce_cpu<Kind::kLogSum>, upgrade_reduce<18>},
    {"", "ReduceLogSumExp", infer_reduce, reduce_cpu<Kind::kLogSumExp>, upgrade_reduce<18>},
    {"", "ReduceSumSquare", infer_reduce, reduce_cpu<Kind::kSumSquare>, upgrade_reduce<18>},
};

}  // namespace

std::span<const OpDef> reduce_ops() { return kReduceOps; }

}  // namespace kiln
