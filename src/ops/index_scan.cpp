// Trilu (keep the upper/lower triangle of the last two dims), CumSum, CumProd and ReverseSequence
// (each batch entry's first sequence_lens[b] steps in reverse: tf2onnx's bidirectional and
// go_backwards recurrent layers).
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

// ---------------------------------------------------------------- CumSum / CumProd
// Inclusive or exclusive (the identity first: 0 or 1), forward or reverse, along a scalar axis
// input. Integers wrap like their type.
Expected<int64_t> cumsum_axis(const Tensor* a, int64_t rank, const Node& n) {
  if (!a) return KILN_ERROR("{}: {} needs the axis input", n.label(), n.op_type);
  if (a->dtype() != DataType::kInt32 && a->dtype() != DataType::kInt64)
    return KILN_ERROR("{}: axis must be int32 or int64, got {}", n.label(), a->desc());
  if (a->numel() != 1 || a->rank() > 1)
    return KILN_ERROR("{}: axis must be a scalar, got {}", n.label(), a->desc());
  return normalize_axis(a->at_int(0), rank, n);
}

Status cumsum_infer(InferContext& ctx) {
  const TensorType& x = ctx.input_type(0);
  if (x.dtype == DataType::kBool)
    return KILN_ERROR("{}: {} does not support bool", ctx.node().label(), ctx.node().op_type);
  if (const Tensor* a = ctx.input_const(1); a && x.has_rank()) {
    KILN_RETURN_IF_ERROR(cumsum_axis(a, x.rank(), ctx.node()).status());
  }
  return infer_same_as_input(ctx);
}

template <bool kProd>
Status cumulative_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", n.label());
  if (x->dtype() == DataType::kBool)
    return KILN_ERROR("{}: {} does not support bool", n.label(), n.op_type);
  if (x->rank() == 0) return KILN_ERROR("{}: {} input must have rank >= 1", n.label(), n.op_type);
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
    auto combine = [](Acc a, Acc v) { return static_cast<Acc>(kProd ? a * v : a + v); };
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        Acc acc = kProd ? Acc(1) : Acc{};
        for (int64_t step = 0; step < dim; ++step) {
          const int64_t j = reverse ? dim - 1 - step : step;
          const int64_t e = (o * dim + j) * inner + i;
          const Acc v = convert<Acc>(src[e]);
          if (exclusive) {
            dst[e] = convert<T>(acc);
            acc = combine(acc, v);
          } else {
            acc = combine(acc, v);
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

// ---------------------------------------------------------------- ReverseSequence
// y[t, b, ...] = x[len[b] - 1 - t, b, ...] for t < len[b], else x[t, b, ...] (time_axis and
// batch_axis are 0 and 1, either way round).
Status reverse_sequence_axes(const Node& n, int64_t* time_axis) {
  const int64_t t = n.attrs.get_int("time_axis", 0), b = n.attrs.get_int("batch_axis", 1);
  if (!((t == 0 && b == 1) || (t == 1 && b == 0)))
    return KILN_ERROR("{}: time_axis ({}) and batch_axis ({}) must be 0 and 1, one each",
                      n.label(), t, b);
  *time_axis = t;
  return Status::Ok();
}

Status reverse_sequence_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  int64_t time_axis = 0;
  KILN_RETURN_IF_ERROR(reverse_sequence_axes(n, &time_axis));
  const TensorType &x = ctx.input_type(0), &lens = ctx.input_type(1);
  if (x.has_rank() && x.rank() < 2)
    return KILN_ERROR("{}: ReverseSequence input must have rank >= 2, got {}", n.label(), x.str());
  if (!ctx.has_input(1) || (lens.dtype != DataType::kUndefined && lens.dtype != DataType::kInt64) ||
      (lens.has_rank() && lens.rank() != 1))
    return KILN_ERROR("{}: sequence_lens must be a 1-D int64 tensor, got {}", n.label(), lens.str());
  return infer_same_as_input(ctx);
}

Status reverse_sequence_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *lens = ctx.input(1);
  int64_t time_axis = 0;
  KILN_RETURN_IF_ERROR(reverse_sequence_axes(n, &time_axis));
  if (!x || !lens) return KILN_ERROR("{}: ReverseSequence needs input and sequence_lens", n.label());
  if (x->rank() < 2)
    return KILN_ERROR("{}: ReverseSequence input must have rank >= 2, got {}", n.label(), x->desc());
  const int64_t steps = x->dim(time_axis), batch = x->dim(1 - time_axis);
  if (lens->dtype() != DataType::kInt64 || lens->rank() != 1 || lens->numel() != batch)
    return KILN_ERROR("{}: sequence_lens must be int64 [{}] (the batch axis), got {}", n.label(),
                      batch, lens->desc());
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens->data<int64_t>()[b];
    if (len < 0 || len > steps)
      return KILN_ERROR("{}: sequence_lens[{}] is {}, outside [0, {}] (the time axis)", n.label(), b,
                        len, steps);
  }
  const int64_t inner = steps * batch == 0 ? 0 : x->numel() / (steps * batch);
  const size_t row = static_cast<size_t>(inner) * dtype_size(x->dtype());
  Tensor y(x->dtype(), x->shape());
  const auto* src = static_cast<const uint8_t*>(x->raw());
  auto* dst = static_cast<uint8_t*>(y.raw());
  auto at = [&](int64_t t, int64_t b) { return (time_axis == 0 ? t * batch + b : b * steps + t) * row; };
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = lens->data<int64_t>()[b];
    for (int64_t t = 0; t < steps && row; ++t)
      std::memcpy(dst + at(t, b), src + at(t < len ? len - 1 - t : t, b), row);
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Trilu", trilu_infer, trilu_cpu, nullptr},
    {"", "CumSum", cumsum_infer, cumulative_cpu<false>, nullptr},
    {"", "CumProd", cumsum_infer, cumulative_cpu<true>, nullptr},
    {"", "ReverseSequence", reverse_sequence_infer, reverse_sequence_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> scan_ops() { return kOps; }

}  // namespace kiln::shape_detail
