// Softmax, LogSoftmax and Hardmax (canonical form: opset 13+, one `axis`, default -1).
// Before opset 13 these ops flattened the input to 2-D at `axis` (default 1) and normalised
// over the whole second dimension; the upgrade keeps that meaning with `kiln_legacy_2d=1`.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

enum class SoftmaxKind { kSoftmax, kLogSoftmax, kHardmax };

Status upgrade_softmax(ImportContext& ctx) {
  if (ctx.opset() >= 13) return Status::Ok();
  Node& n = ctx.node();
  if (!n.attrs.has("axis")) n.attrs.set("axis", Attribute::Int(1));
  n.attrs.set("kiln_legacy_2d", Attribute::Int(1));
  return Status::Ok();
}

// The normalised block: `n` elements at stride `inner`, repeated `outer` x `inner` times.
struct SoftmaxLayout {
  int64_t outer = 1, n = 1, inner = 1;
};

Expected<SoftmaxLayout> layout_for(const Node& node, const std::vector<int64_t>& shape) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) return KILN_ERROR("{}: input must have rank >= 1, got a scalar", node.label());
  KILN_ASSIGN_OR_RETURN(int64_t axis, normalize_axis(node.attrs.get_int("axis", -1), rank, node));
  SoftmaxLayout l;
  for (int64_t i = 0; i < axis; ++i) l.outer *= shape[i];
  if (node.attrs.get_int("kiln_legacy_2d", 0) != 0) {
    for (int64_t i = axis; i < rank; ++i) l.n *= shape[i];
  } else {
    l.n = shape[axis];
    for (int64_t i = axis + 1; i < rank; ++i) l.inner *= shape[i];
  }
  return l;
}

Status infer_softmax(InferContext& ctx) {
  const TensorType& t = ctx.input_type(0);
  if (t.dtype != DataType::kUndefined && !dtype_is_float(t.dtype))
    return KILN_ERROR("{}: input must be a float tensor, got {}", ctx.node().label(),
                      dtype_name(t.dtype));
  if (t.has_rank()) {
    if (t.rank() == 0)
      return KILN_ERROR("{}: input must have rank >= 1, got a scalar", ctx.node().label());
    KILN_RETURN_IF_ERROR(
        normalize_axis(ctx.attrs().get_int("axis", -1), t.rank(), ctx.node()).status());
  }
  return infer_same_as_input(ctx);
}

template <SoftmaxKind kKind>
Status cpu_softmax(KernelContext& ctx) {
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: missing input", ctx.node().label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: input must be a float tensor, got {}", ctx.node().label(),
                      dtype_name(x->dtype()));
  KILN_ASSIGN_OR_RETURN(SoftmaxLayout l, layout_for(ctx.node(), x->shape()));
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, x->shape());
  const double* in = xd.data<double>();
  double* out = y.data<double>();
  for (int64_t o = 0; o < l.outer; ++o) {
    for (int64_t i = 0; i < l.inner; ++i) {
      const int64_t base = o * l.n * l.inner + i;
      auto at = [&](int64_t k) { return base + k * l.inner; };
      if (l.n == 0) continue;
      // Max first (first index wins ties; NaN propagates through the sums below).
      int64_t arg = 0;
      for (int64_t k = 1; k < l.n; ++k)
        if (in[at(k)] > in[at(arg)]) arg = k;
      const double mx = in[at(arg)];
      if constexpr (kKind == SoftmaxKind::kHardmax) {
        for (int64_t k = 0; k < l.n; ++k) out[at(k)] = k == arg ? 1.0 : 0.0;
      } else {
        double sum = 0;
        for (int64_t k = 0; k < l.n; ++k) sum += std::exp(in[at(k)] - mx);
        if (kKind == SoftmaxKind::kSoftmax &&
            (x->dtype() == DataType::kFloat16 || x->dtype() == DataType::kBFloat16)) {
          // 16-bit floats round after each step, as the ONNX reference computes in the type
          // (bfloat16 sums element by element in bfloat16; float16 sums in float32).
          const DataType t = x->dtype();
          auto r = [t](double v) {
            return t == DataType::kBFloat16 ? double(float(BFloat16(float(v))))
                                            : double(float(Half(float(v))));
          };
          sum = 0;
          for (int64_t k = 0; k < l.n; ++k) {
            out[at(k)] = r(std::exp(r(in[at(k)] - mx)));
            sum = t == DataType::kBFloat16 ? r(sum + out[at(k)]) : sum + out[at(k)];
          }
          sum = r(sum);
          for (int64_t k = 0; k < l.n; ++k) out[at(k)] = r(out[at(k)] / sum);
        } else if constexpr (kKind == SoftmaxKind::kSoftmax) {
          for (int64_t k = 0; k < l.n; ++k) out[at(k)] = std::exp(in[at(k)] - mx) / sum;
        } else {
          const double lse = std::log(sum);
          for (int64_t k = 0; k < l.n; ++k) out[at(k)] = in[at(k)] - mx - lse;
        }
      }
    }
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

constexpr OpDef kSoftmaxOps[] = {
    {"", "Softmax", infer_softmax, cpu_softmax<SoftmaxKind::kSoftmax>, upgrade_softmax},
    {"", "LogSoftmax", infer_softmax, cpu_softmax<SoftmaxKind::kLogSoftmax>, upgrade_softmax},
    {"", "Hardmax", infer_softmax, cpu_softmax<SoftmaxKind::kHardmax>, upgrade_softmax},
};

}  // namespace

std::span<const OpDef> softmax_ops() { return kSoftmaxOps; }

}  // namespace kiln
