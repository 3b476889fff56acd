// RotaryEmbedding (opset 23): rotates the first rotary_embedding_dim features of each head by
// position-dependent angles given as cos/sin caches.
//
//   X: [batch, heads, seq, head] or [batch, seq, heads * head] (then num_heads is required)
//   cos_cache, sin_cache: [max_pos, R/2] indexed by position_ids [batch, seq], or without
//     position_ids [batch, seq, R/2] (batch may be 1) or [seq, R/2]
//   pairs (x1, x2) are (x[k], x[k + R/2]), or (x[2k], x[2k+1]) with interleaved = 1:
//     x1' = cos * x1 - sin * x2,   x2' = sin * x1 + cos * x2
// Features past R pass through. kiln's attributes kiln_head_begin and kiln_head_end (default 0
// and the head count) rotate only the heads in that range; the others pass through (one rotary
// over the Q and K heads of a packed Q | K | V projection: fuse_rotary's RotaryOverSplit).
// The kernel rounds to the input type after each product and
// sum, as the onnx reference does.
#include <functional>

#include "core/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

double round_to(DataType t, double x) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<float>(x);
    case DataType::kFloat16:
      return static_cast<float>(Half(static_cast<float>(x)));
    case DataType::kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(x)));
    default:
      return x;
  }
}

// `kernel`: the CPU kernel also takes float64, which only the float64 reference mode of the CPU
// executor feeds it (ONNX's RotaryEmbedding has no float64; inference refuses it).
Status check_types(const Node& n, DataType x, DataType c, DataType s, bool kernel = false) {
  if (x != DataType::kUndefined && x != DataType::kFloat32 && x != DataType::kFloat16 &&
      x != DataType::kBFloat16 && !(kernel && x == DataType::kFloat64))
    return KILN_ERROR("{}: RotaryEmbedding takes float32, float16 or bfloat16, got {}", n.label(),
                      dtype_name(x));
  for (DataType t : {c, s})
    if (t != DataType::kUndefined && x != DataType::kUndefined && t != x)
      return KILN_ERROR("{}: the caches must have X's type {}, got {}", n.label(), dtype_name(x),
                        dtype_name(t));
  return Status::Ok();
}

Status infer_rotary(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  KILN_RETURN_IF_ERROR(check_types(n, x.dtype, ctx.input_type(1).dtype, ctx.input_type(2).dtype));
  if (x.has_rank() && x.rank() != 3 && x.rank() != 4)
    return KILN_ERROR("{}: X must be 3-D or 4-D, got {}", n.label(), x.str());
  if (x.rank() == 3 && n.attrs.get_int("num_heads", 0) <= 0)
    return KILN_ERROR("{}: 3-D X needs num_heads", n.label());
  const int64_t hb = n.attrs.get_int("kiln_head_begin", 0), he = n.attrs.get_int("kiln_head_end", -1);
  if (hb < 0 || (he != -1 && he < hb))
    return KILN_ERROR("{}: bad head range [{}, {})", n.label(), hb, he);
  return infer_same_as_input(ctx);
}

Status cpu_rotary(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *cosc = ctx.input(1), *sinc = ctx.input(2);
  const Tensor* pos = ctx.input(3);
  if (!x || !cosc || !sinc)
    return KILN_ERROR("{}: X, cos_cache and sin_cache are required", n.label());
  KILN_RETURN_IF_ERROR(check_types(n, x->dtype(), cosc->dtype(), sinc->dtype(), /*kernel=*/true));
  if (x->rank() != 3 && x->rank() != 4)
    return KILN_ERROR("{}: X must be 3-D or 4-D, got {}", n.label(), x->desc());
  const bool packed = x->rank() == 3;
  const int64_t B = x->dim(0), S = packed ? x->dim(1) : x->dim(2);
  int64_t H = packed ? n.attrs.get_int("num_heads", 0) : x->dim(1);
  if (H <= 0 || (packed && x->dim(2) % H != 0))
    return KILN_ERROR("{}: num_heads {} must divide X's hidden size {}", n.label(), H, x->dim(-1));
  const int64_t D = packed ? x->dim(2) / H : x->dim(3);
  int64_t R = n.attrs.get_int("rotary_embedding_dim", 0);
  if (R == 0) R = D;
  if (R < 0 || R > D || R % 2 != 0)
    return KILN_ERROR("{}: rotary_embedding_dim {} must be even and at most the head size {}",
                      n.label(), R, D);
  const int64_t half = R / 2;
  if (cosc->shape() != sinc->shape() || cosc->dim(-1) != half)
    return KILN_ERROR("{}: cos_cache {} and sin_cache {} must end in rotary_embedding_dim/2 = {}",
                      n.label(), cosc->desc(), sinc->desc(), half);
  // Row of the caches for (b, s).
  std::function<Expected<int64_t>(int64_t, int64_t)> cache_row;
  if (pos) {
    if (pos->rank() != 2 || (pos->dim(0) != B && pos->dim(0) != 1) || pos->dim(1) != S ||
        cosc->rank() != 2)
      return KILN_ERROR("{}: position_ids {} needs caches [max_pos, {}] and shape [{},{}]",
                        n.label(), pos->desc(), half, B, S);
    cache_row = [&, B1 = pos->dim(0) == 1](int64_t b, int64_t s) -> Expected<int64_t> {
      const int64_t p = pos->at_int((B1 ? 0 : b) * S + s);
      if (p < 0 || p >= cosc->dim(0))
        return KILN_ERROR("{}: position id {} is outside the caches' {} rows", n.label(), p,
                          cosc->dim(0));
      return p;
    };
  } else {
    const bool ok =
        (cosc->rank() == 2 && cosc->dim(0) == S) ||
        (cosc->rank() == 3 && (cosc->dim(0) == B || cosc->dim(0) == 1) && cosc->dim(1) == S);
    if (!ok)
      return KILN_ERROR("{}: without position_ids the caches must be [{},{},{}] or [{},{}], got {}",
                        n.label(), B, S, half, S, half, cosc->desc());
    cache_row = [&, B1 = cosc->rank() == 2 || cosc->dim(0) == 1](
                    int64_t b, int64_t s) -> Expected<int64_t> { return (B1 ? 0 : b) * S + s; };
  }
  const int64_t hb = n.attrs.get_int("kiln_head_begin", 0), he = n.attrs.get_int("kiln_head_end", H);
  if (hb < 0 || he < hb || he > H)
    return KILN_ERROR("{}: head range [{}, {}) is not within the {} heads", n.label(), hb, he, H);
  const bool inter = n.attrs.get_int("interleaved", 0) != 0;
  const DataType t = x->dtype();
  auto r = [&](double v) { return round_to(t, v); };
  Tensor y(DataType::kFloat64, x->shape());
  double* out = y.data<double>();
  for (int64_t i = 0; i < x->numel(); ++i) out[i] = x->at_double(i);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      KILN_ASSIGN_OR_RETURN(int64_t row, cache_row(b, s));
      for (int64_t h = hb; h < he; ++h) {
        const int64_t base = packed ? ((b * S + s) * H + h) * D : ((b * H + h) * S + s) * D;
        for (int64_t k = 0; k < half; ++k) {
          const int64_t i1 = base + (inter ? 2 * k : k), i2 = base + (inter ? 2 * k + 1 : k + half);
          const double c = cosc->at_double(row * half + k), sn = sinc->at_double(row * half + k);
          const double x1 = x->at_double(i1), x2 = x->at_double(i2);
          out[i1] = r(r(c * x1) - r(sn * x2));
          out[i2] = r(r(sn * x1) + r(c * x2));
        }
      }
    }
  ctx.set_output(0, y.cast(t));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "RotaryEmbedding", infer_rotary, cpu_rotary, nullptr},
};

}  // namespace

std::span<const OpDef> rotary_ops() { return kOps; }

}  // namespace kiln
