// Trilu (keep the upper/lower triangle of the last two dims) and CumSum.
#include <cstring>
#include <type_traits>

#include "core/dispatch.h"
#include "ops/shape_util.h"

namespace kiln::shape_detail {
namespace {

// ---------------------------------------------------------------- Trilu
Status trilu_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (x.has_rank() && x.rank() < 2)
    return KILN_ERROR("{}: Trilu input must have rank >= 2, got {}", ctx.node().label(), x.str());
  return infer_same_as_input(ctx);
}

Status trilu_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->rank() < 2) return KILN_ERROR("{}: Trilu input must have rank >= 2, got {}", n.label(), x->desc());
  int64_t k = 0;
  if (const Tensor* kt = ctx.input(1)) {
    KILN_ASSIGN_OR_RETURN(auto v, int_values(*kt, n, "k"));
    if (v.size() != 1) return KILN_ERROR("{}: k must be a scalar, got {}", n.label(), kt->desc());
    k = v[0];
  }
  const bool upper = n.attrs.get_int("upper", 1) != 0;
  const int64_t rows = x->dim(-2), cols = x->dim(-1);
  const int64_t mats = rows * cols == 0 ? 0 : x->numel() / (rows * cols);
  const size_t es = dtype_size(x->dtype());
  Tensor y(x->dtype(), x->shape());  // zero-filled: all-zero bytes are 0 / false in every dtype
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  for (int64_t m = 0; m < mats; ++m) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) {
        // j - i compared with k; k may be huge, so compare without overflow.
        const int64_t diag = j - i;
        const bool keep = upper ? diag >= k : diag <= k;
        if (!keep) continue;
        const int64_t e = (m * rows + i) * cols + j;
        std::memcpy(dst + e * es, src + e * es, es);
      }
    }
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// ---------------------------------------------------------------- CumSum
Expected<int64_t> cumsum_axis(const Tensor* a, int64_t rank, const Node& n) {
  if (!a) return KILN_ERROR("{}: CumSum needs the axis input", n.label());
  if (a->dtype() != DataType::kInt32 && a->dtype() != DataType::kInt64)
    return KILN_ERROR("{}: axis must be int32 or int64, got {}", n.label(), a->desc());
  if (a->numel() != 1 || a->rank() > 1)
    return KILN_ERROR("{}: axis must be a scalar, got {}", n.label(), a->desc());
  return normalize_axis(a->at_int(0), rank, n);
}

Status cumsum_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (x.dtype == DataType::kBool)
    return KILN_ERROR("{}: CumSum does not support bool", ctx.node().label());
  if (const Tensor* a = ctx.input_const(1); a && x.has_rank()) {
    KILN_RETURN_IF_ERROR(cumsum_axis(a, x.rank(), ctx.node()).status());
  }
  return infer_same_as_input(ctx);
}

Status cumsum_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->dtype() == DataType::kBool) return KILN_ERROR("{}: CumSum does not support bool", n.label());
  if (x->rank() == 0) return KILN_ERROR("{}: CumSum input must have rank >= 1", n.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, cumsum_axis(ctx.input(1), x->rank(), n));
  const bool exclusive = n.attrs.get_int("exclusive", 0) != 0;
  const bool reverse = n.attrs.get_int("reverse", 0) != 0;
  std::span<const int64_t> s(x->shape());
  const int64_t outer = product(s.subspan(0, axis)), dim = s[axis], inner = product(s.subspan(axis + 1));
  Tensor y(x->dtype(), x->shape());
  visit_dtype(x->dtype(), [&](auto tag) {
    using T = decltype(tag);
    // Accumulator: float for the 16-bit floats; uint64 for integers (wraps like the type, no UB).
    using Acc = std::conditional_t<std::is_floating_point_v<T>, T,
                                   std::conditional_t<std::is_integral_v<T>, uint64_t, float>>;
    const T* src = x->data<T>();
    T* dst = y.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        Acc acc{};
        for (int64_t step = 0; step < dim; ++step) {
          const int64_t j = reverse ? dim - 1 - step : step;
          const int64_t e = (o * dim + j) * inner + i;
          const Acc v = convert<Acc>(src[e]);
          if (exclusive) {
            dst[e] = convert<T>(acc);
            acc = static_cast<Acc>(acc + v);
          } else {
            acc = static_cast<Acc>(acc + v);
            dst[e] = convert<T>(acc);
          }
        }
      }
    }
    return 0;
  });
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Trilu", trilu_infer, trilu_cpu, nullptr},
    {"", "CumSum", cumsum_infer, cumsum_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> scan_ops() { return kOps; }

}  // namespace kiln::shape_detail
