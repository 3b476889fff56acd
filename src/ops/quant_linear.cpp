// ONNX Runtime's quantized operator format (QOperator): MatMulInteger, ConvInteger (opset 10),
// QLinearMatMul (opsets 10 and 21) and QLinearConv (opset 10), as ONNX's reference computes them:
//
//   MatMulInteger(A, B, azp, bzp) = matmul(A - azp, B - bzp)  (int32)
//   ConvInteger(x, w, xzp, wzp)   = conv(x - xzp, w - wzp)    (int32)
//   QLinearMatMul(a, as, azp, b, bs, bzp, ys, yzp)
//     = saturate(rint(matmul(a - azp, b - bzp) * (as * bs / ys) + yzp))
//   QLinearConv(x, xs, xzp, w, ws, wzp, ys, yzp, B)
//     = saturate(rint((conv(x - xzp, w - wzp) + B) * (xs * ws / ys) + yzp))
//
// Operands are int8 or uint8 in any mix; a zero point has its operand's type. Zero points and
// scales are per tensor (one element), per row of A ([M] or [..., M, 1]), per column of B ([N] or
// [..., 1, N]) or per output channel of W ([M]); x's and y's are per tensor. The products are
// exact: |a - azp| <= 255, so each product is below 2^16 and the sums, accumulated in double,
// are exact up to 2^37 terms; the int32 result wraps modulo 2^32 as the spec allows. The
// multiplier as * bs / ys is computed in the scales' type (float, or float16 / bfloat16 at
// opset 21), the rest in double; rint rounds half to even. float8 operands (opset 21) are refused.
#include <cmath>
#include <limits>

#include "ops/conv.h"
#include "ops/conv_util.h"
#include "ops/elementwise_util.h"
#include "ops/gemm.h"
#include "ops/op.h"

namespace kiln {
namespace {

using ew::for_each_broadcast;
using ew::numel_of;

bool is_8bit(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

Status check_8bit_type(const Node& n, DataType t, const char* what) {
  if (t == DataType::kUndefined || is_8bit(t)) return Status::Ok();
  if (dtype_is_float8(t))
    return KILN_ERROR("{}: {} of type {}: kiln runs {} on int8 and uint8 only", n.label(), what,
                      dtype_name(t), n.op_type);
  return KILN_ERROR("{}: {} must be int8 or uint8, got {}", n.label(), what, dtype_name(t));
}

// An operand and its zero point: both int8/uint8, the zero point of the operand's type.
Status check_operand_types(const Node& n, DataType x, DataType zp, const char* what) {
  KILN_RETURN_IF_ERROR(check_8bit_type(n, x, what));
  if (x != DataType::kUndefined && zp != DataType::kUndefined && zp != x)
    return KILN_ERROR("{}: zero point of {} has type {}, {} has type {}", n.label(), what,
                      dtype_name(zp), what, dtype_name(x));
  return Status::Ok();
}

Status check_scale_type(const Node& n, DataType t, DataType first, const char* what) {
  if (t == DataType::kUndefined) return Status::Ok();
  if (!dtype_is_float(t) || t == DataType::kFloat64)
    return KILN_ERROR("{}: {} must be float, float16 or bfloat16, got {}", n.label(), what,
                      dtype_name(t));
  if (first != DataType::kUndefined && t != first)
    return KILN_ERROR("{}: {} has type {}, the other scales {}", n.label(), what, dtype_name(t),
                      dtype_name(first));
  return Status::Ok();
}

// How a zero point or scale maps onto its operand.
enum class Per { kTensor, kRow, kColumn, kChannel };

// The parameter's shape, broadcastable onto the operand's shape `x` (empty: per tensor).
Expected<std::vector<int64_t>> param_shape(const Node& n, const Tensor& p,
                                           const std::vector<int64_t>& x, Per per,
                                           const std::string& what) {
  if (p.numel() == 1 && p.rank() <= 1) return std::vector<int64_t>{};
  const std::vector<int64_t>& s = p.shape();
  const size_t r = x.size();
  if (per == Per::kChannel) {
    if (s.size() == 1 && r >= 1 && s[0] == x[0]) {
      std::vector<int64_t> out(r, 1);
      out[0] = x[0];
      return out;
    }
    return KILN_ERROR("{}: {} has shape {}: expected one element or [{}] (one per output channel)",
                      n.label(), what, shape_str(s), r >= 1 ? x[0] : 0);
  }
  const char* form = per == Per::kRow ? "[M] or [..., M, 1] (one per row of A)"
                                      : "[N] or [..., 1, N] (one per column of B)";
  if (per == Per::kTensor || r < 2)
    return KILN_ERROR("{}: {} has shape {}: expected one element{}{}", n.label(), what,
                      shape_str(s), per == Per::kTensor ? "" : " or ",
                      per == Per::kTensor ? "" : form);
  std::vector<int64_t> q = s;
  if (q.size() == 1)
    q = per == Per::kRow ? std::vector<int64_t>{s[0], 1} : std::vector<int64_t>{1, s[0]};
  bool ok = q.size() <= r && q[q.size() - (per == Per::kRow ? 1 : 2)] == 1;
  for (size_t i = 0; ok && i < q.size(); ++i) {
    const int64_t want = x[r - q.size() + i];
    ok = q[i] == 1 || q[i] == want;
  }
  if (!ok)
    return KILN_ERROR(
        "{}: {} has shape {}, which does not fit operand {}: expected one element "
        "or {}",
        n.label(), what, shape_str(s), shape_str(x), form);
  return q;
}

// The parameter's elements as doubles, broadcast onto the shape `x`.
std::vector<double> expand(const Tensor& p, const std::vector<int64_t>& pshape,
                           const std::vector<int64_t>& x) {
  std::vector<double> out(static_cast<size_t>(numel_of(x)));
  for_each_broadcast(x, {pshape}, [&](int64_t o, const int64_t* off) {
    out[static_cast<size_t>(o)] = p.at_double(off[0]);
  });
  return out;
}

// x - zero point as doubles (exact), in x's shape.
Expected<std::vector<double>> centered(const Node& n, const Tensor& x, const Tensor* zp, Per per,
                                       const char* what) {
  std::vector<double> v(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) v[static_cast<size_t>(i)] = x.at_double(i);
  if (!zp) return v;
  if (zp->dtype() != x.dtype())
    return KILN_ERROR("{}: zero point of {} has type {}, {} has type {}", n.label(), what,
                      dtype_name(zp->dtype()), what, dtype_name(x.dtype()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> ps,
                        param_shape(n, *zp, x.shape(), per, fmt::format("zero point of {}", what)));
  const std::vector<double> z = expand(*zp, ps, x.shape());
  for (size_t i = 0; i < v.size(); ++i) v[i] -= z[i];
  return v;
}

// A scale and its zero point have the same shape (or one element each).
Status check_pair(const Node& n, const Tensor* scale, const Tensor* zp, const char* what) {
  if (!scale) return KILN_ERROR("{}: missing input '{}_scale'", n.label(), what);
  if (zp && zp->shape() != scale->shape() && !(zp->numel() == 1 && scale->numel() == 1))
    return KILN_ERROR("{}: {}_zero_point has shape {}, {}_scale {}", n.label(), what,
                      shape_str(zp->shape()), what, shape_str(scale->shape()));
  return Status::Ok();
}

float round_to(DataType t, float v) {
  if (t == DataType::kFloat16) return static_cast<float>(Half(v));
  if (t == DataType::kBFloat16) return static_cast<float>(BFloat16(v));
  return v;
}

// as * bs / ys in the scales' type, as ONNX's reference computes it.
double multiplier(DataType t, double as, double bs, double ys) {
  const float p = round_to(t, static_cast<float>(as) * static_cast<float>(bs));
  return round_to(t, p / static_cast<float>(ys));
}

int32_t wrap_int32(double exact) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(exact)));
}

// rint(acc * m + zp) saturated to the output type's range.
template <typename Q>
Q requantize(double acc, double m, double zp) {
  double r = std::nearbyint(acc * m + zp);  // default rounding mode: half to even
  if (std::isnan(r)) r = zp;
  constexpr double lo = std::numeric_limits<Q>::lowest(), hi = std::numeric_limits<Q>::max();
  return static_cast<Q>(r < lo ? lo : (r > hi ? hi : r));
}

// y = requantize(acc[i] * mult(i) + zp) into a tensor of type t (int8 or uint8).
template <typename MultFn>
Tensor requantize_all(DataType t, const std::vector<int64_t>& shape, const std::vector<double>& acc,
                      double zp, MultFn mult) {
  Tensor y(t, shape);
  for (size_t i = 0; i < acc.size(); ++i) {
    const double m = mult(static_cast<int64_t>(i));
    const double a = static_cast<double>(wrap_int32(acc[i]));
    if (t == DataType::kInt8)
      y.data<int8_t>()[i] = requantize<int8_t>(a, m, zp);
    else
      y.data<uint8_t>()[i] = requantize<uint8_t>(a, m, zp);
  }
  return y;
}

Tensor to_int32(const std::vector<int64_t>& shape, const std::vector<double>& acc) {
  Tensor y(DataType::kInt32, shape);
  for (size_t i = 0; i < acc.size(); ++i) y.data<int32_t>()[i] = wrap_int32(acc[i]);
  return y;
}

// Refuses sums past 2^37 terms (doubles stop being exact) and buffers past check_workspace's.
Status check_sizes(const Node& n, int64_t terms, std::initializer_list<int64_t> buffers) {
  if (terms > (int64_t{1} << 37))
    return KILN_ERROR("{}: {} products per output exceed what kiln sums exactly (2^37)", n.label(),
                      terms);
  for (int64_t b : buffers) KILN_RETURN_IF_ERROR(check_workspace(n, b));
  return Status::Ok();
}

// ------------------------------------------------------------------------------ matrix products
struct Product {
  std::vector<int64_t> a, b, out, batch, a_batch, b_batch;  // a and b with 1-D sides promoted
  int64_t M = 0, N = 0, K = 0;
};

Expected<Product> product_shape(const Node& n, const std::vector<int64_t>& as,
                                const std::vector<int64_t>& bs) {
  if (as.empty() || bs.empty())
    return KILN_ERROR("{}: inputs must have rank >= 1 (got {} and {})", n.label(), as.size(),
                      bs.size());
  Product p;
  p.a = as;
  p.b = bs;
  if (as.size() == 1) p.a.insert(p.a.begin(), 1);
  if (bs.size() == 1) p.b.push_back(1);
  p.M = p.a[p.a.size() - 2];
  p.K = p.a.back();
  p.N = p.b.back();
  if (p.b[p.b.size() - 2] != p.K)
    return KILN_ERROR("{}: inner dimensions differ: {} x {}", n.label(), shape_str(as),
                      shape_str(bs));
  p.a_batch.assign(p.a.begin(), p.a.end() - 2);
  p.b_batch.assign(p.b.begin(), p.b.end() - 2);
  KILN_ASSIGN_OR_RETURN(p.batch, broadcast_shapes({p.a_batch, p.b_batch}, n));
  p.out = p.batch;
  if (as.size() > 1) p.out.push_back(p.M);
  if (bs.size() > 1) p.out.push_back(p.N);
  return p;
}

// acc [batch, M, N] = A x B (exact, see the top); row(i) / col(i) give, for output element i,
// its row of A and its column of B as flat indices into A's rows [a_batch, M] and B's columns
// [b_batch, N].
struct ProductResult {
  std::vector<double> acc;
  std::vector<int64_t> a_row, b_col;
};

ProductResult multiply(const Product& p, const std::vector<double>& A,
                       const std::vector<double>& B) {
  const auto sa = broadcast_strides(p.a_batch, p.batch);
  const auto sb = broadcast_strides(p.b_batch, p.batch);
  const int64_t nb = numel_of(p.batch), MN = p.M * p.N;
  ProductResult r;
  r.acc.assign(static_cast<size_t>(nb * MN), 0.0);
  r.a_row.resize(r.acc.size());
  r.b_col.resize(r.acc.size());
  for (int64_t bi = 0; bi < nb; ++bi) {
    int64_t oa = 0, ob = 0;
    for (int64_t d = static_cast<int64_t>(p.batch.size()) - 1, rem = bi; d >= 0; --d) {
      const int64_t id = rem % p.batch[d];
      rem /= p.batch[d];
      oa += id * sa[d];
      ob += id * sb[d];
    }
    if (p.K > 0)
      gemm<double>(false, false, p.M, p.N, p.K, 1.0, A.data() + oa * p.M * p.K,
                   B.data() + ob * p.K * p.N, 0.0, r.acc.data() + bi * MN);
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t j = 0; j < p.N; ++j) {
        const auto i = static_cast<size_t>(bi * MN + m * p.N + j);
        r.a_row[i] = oa * p.M + m;
        r.b_col[i] = ob * p.N + j;
      }
  }
  return r;
}

// A's rows [a_batch, M, 1] and B's columns [b_batch, 1, N]: the shapes a per-row / per-column
// parameter expands onto.
std::vector<int64_t> with_dim(std::vector<int64_t> s, size_t from_end, int64_t v) {
  s[s.size() - from_end] = v;
  return s;
}

Status infer_matmul_integer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(0).dtype, ctx.input_type(2).dtype, "A"));
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(1).dtype, ctx.input_type(3).dtype, "B"));
  const TensorType& a = ctx.input_type(0);
  const TensorType& b = ctx.input_type(1);
  if (!a.has_rank() || !b.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(DataType::kInt32));
    return Status::Ok();
  }
  if (a.rank() < 1 || b.rank() < 1)
    return KILN_ERROR("{}: inputs must have rank >= 1 (got {} and {})", n.label(), a.rank(),
                      b.rank());
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, matmul_out_dims(n, *a.dims, *b.dims));
  ctx.set_output(0, TensorType(DataType::kInt32, std::move(out)));
  return Status::Ok();
}

Status matmul_integer_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *a = ctx.input(0), *b = ctx.input(1);
  if (!a || !b) return KILN_ERROR("{}: inputs A and B are required", n.label());
  KILN_RETURN_IF_ERROR(check_8bit_type(n, a->dtype(), "A"));
  KILN_RETURN_IF_ERROR(check_8bit_type(n, b->dtype(), "B"));
  KILN_ASSIGN_OR_RETURN(Product p, product_shape(n, a->shape(), b->shape()));
  KILN_RETURN_IF_ERROR(check_sizes(n, p.K, {a->numel(), b->numel(), numel_of(p.out)}));
  KILN_ASSIGN_OR_RETURN(const Tensor a2, a->reshaped(p.a));
  KILN_ASSIGN_OR_RETURN(const Tensor b2, b->reshaped(p.b));
  KILN_ASSIGN_OR_RETURN(std::vector<double> A, centered(n, a2, ctx.input(2), Per::kRow, "A"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> B, centered(n, b2, ctx.input(3), Per::kColumn, "B"));
  ctx.set_output(0, to_int32(p.out, multiply(p, A, B).acc));
  return Status::Ok();
}

Status infer_qlinear_matmul(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(0).dtype, ctx.input_type(2).dtype, "a"));
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(3).dtype, ctx.input_type(5).dtype, "b"));
  KILN_RETURN_IF_ERROR(check_8bit_type(n, ctx.input_type(7).dtype, "y_zero_point"));
  const DataType st = ctx.input_type(1).dtype;
  KILN_RETURN_IF_ERROR(check_scale_type(n, st, DataType::kUndefined, "a_scale"));
  KILN_RETURN_IF_ERROR(check_scale_type(n, ctx.input_type(4).dtype, st, "b_scale"));
  KILN_RETURN_IF_ERROR(check_scale_type(n, ctx.input_type(6).dtype, st, "y_scale"));
  const DataType yt = ctx.has_input(7) ? ctx.input_type(7).dtype : ctx.input_type(0).dtype;
  const TensorType& a = ctx.input_type(0);
  const TensorType& b = ctx.input_type(3);
  if (!a.has_rank() || !b.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(yt));
    return Status::Ok();
  }
  if (a.rank() < 1 || b.rank() < 1)
    return KILN_ERROR("{}: inputs must have rank >= 1 (got {} and {})", n.label(), a.rank(),
                      b.rank());
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, matmul_out_dims(n, *a.dims, *b.dims));
  ctx.set_output(0, TensorType(yt, std::move(out)));
  return Status::Ok();
}

// The output's scale (one element) and zero point (one element or absent: 0 of `fallback` type).
struct OutputQuant {
  DataType type;
  double scale, zp;
};

Expected<OutputQuant> output_quant(const Node& n, const Tensor* ys, const Tensor* yzp,
                                   DataType fallback) {
  if (!ys) return KILN_ERROR("{}: missing input 'y_scale'", n.label());
  if (ys->numel() != 1 || (yzp && yzp->numel() != 1))
    return KILN_ERROR(
        "{}: y_scale and y_zero_point must have one element (per tensor), got {} "
        "and {}",
        n.label(), shape_str(ys->shape()), yzp ? shape_str(yzp->shape()) : std::string("none"));
  if (yzp) KILN_RETURN_IF_ERROR(check_8bit_type(n, yzp->dtype(), "y_zero_point"));
  return OutputQuant{yzp ? yzp->dtype() : fallback, ys->at_double(0), yzp ? yzp->at_double(0) : 0};
}

Status qlinear_matmul_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *a = ctx.input(0), *as = ctx.input(1), *azp = ctx.input(2), *b = ctx.input(3),
               *bs = ctx.input(4), *bzp = ctx.input(5);
  if (!a || !b) return KILN_ERROR("{}: inputs a and b are required", n.label());
  KILN_RETURN_IF_ERROR(check_8bit_type(n, a->dtype(), "a"));
  KILN_RETURN_IF_ERROR(check_8bit_type(n, b->dtype(), "b"));
  KILN_RETURN_IF_ERROR(check_pair(n, as, azp, "a"));
  KILN_RETURN_IF_ERROR(check_pair(n, bs, bzp, "b"));
  const DataType st = as->dtype();
  KILN_RETURN_IF_ERROR(check_scale_type(n, st, DataType::kUndefined, "a_scale"));
  KILN_RETURN_IF_ERROR(check_scale_type(n, bs->dtype(), st, "b_scale"));
  if (ctx.input(6)) KILN_RETURN_IF_ERROR(check_scale_type(n, ctx.input(6)->dtype(), st, "y_scale"));
  KILN_ASSIGN_OR_RETURN(OutputQuant y, output_quant(n, ctx.input(6), ctx.input(7), a->dtype()));
  KILN_ASSIGN_OR_RETURN(Product p, product_shape(n, a->shape(), b->shape()));
  KILN_RETURN_IF_ERROR(check_sizes(n, p.K, {a->numel(), b->numel(), 3 * numel_of(p.out)}));
  KILN_ASSIGN_OR_RETURN(const Tensor a2, a->reshaped(p.a));
  KILN_ASSIGN_OR_RETURN(const Tensor b2, b->reshaped(p.b));
  KILN_ASSIGN_OR_RETURN(std::vector<double> A, centered(n, a2, azp, Per::kRow, "a"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> B, centered(n, b2, bzp, Per::kColumn, "b"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sas, param_shape(n, *as, p.a, Per::kRow, "a_scale"));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sbs,
                        param_shape(n, *bs, p.b, Per::kColumn, "b_scale"));
  const std::vector<double> sa = expand(*as, sas, with_dim(p.a, 1, 1));
  const std::vector<double> sb = expand(*bs, sbs, with_dim(p.b, 2, 1));
  const ProductResult r = multiply(p, A, B);
  ctx.set_output(0, requantize_all(y.type, p.out, r.acc, y.zp, [&](int64_t i) {
                   return multiplier(st, sa[static_cast<size_t>(r.a_row[i])],
                                     sb[static_cast<size_t>(r.b_col[i])], y.scale);
                 }));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------- convolutions
// Output dims of ConvInteger (X, W inputs 0, 1) and QLinearConv (0, 3), of type `out`.
Status infer_int_conv(InferContext& ctx, size_t wi, DataType out) {
  KILN_ASSIGN_OR_RETURN(ConvInferDims d, read_conv_infer_dims(ctx, 0, wi));
  if (!d.ranked) {
    ctx.set_output(0, TensorType::unknown_rank(out));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> dims, conv_infer_out_dims(ctx.node(), d));
  ctx.set_output(0, TensorType(out, std::move(dims)));
  return Status::Ok();
}

Status infer_conv_integer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(0).dtype, ctx.input_type(2).dtype, "x"));
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(1).dtype, ctx.input_type(3).dtype, "w"));
  return infer_int_conv(ctx, 1, DataType::kInt32);
}

// conv(x - xzp, w - wzp) + B, exact in double; the geometry and checks as Conv's.
Expected<std::vector<double>> int_conv(const Node& n, const ConvParams& p, const Tensor& x,
                                       const Tensor* xzp, const Tensor& w, const Tensor* wzp,
                                       const Tensor* bias) {
  KILN_RETURN_IF_ERROR(check_8bit_type(n, x.dtype(), "x"));
  KILN_RETURN_IF_ERROR(check_8bit_type(n, w.dtype(), "w"));
  const int64_t out_numel = p.N * p.M * shape_product(p.out);
  const int64_t terms = p.C / p.group * shape_product(p.kernel);
  KILN_RETURN_IF_ERROR(
      check_sizes(n, terms, {x.numel(), w.numel(), out_numel, terms * shape_product(p.out)}));
  KILN_ASSIGN_OR_RETURN(std::vector<double> X, centered(n, x, xzp, Per::kTensor, "x"));
  KILN_ASSIGN_OR_RETURN(std::vector<double> W, centered(n, w, wzp, Per::kChannel, "w"));
  std::vector<double> B;
  if (bias) {
    if (bias->dtype() != DataType::kInt32 || bias->rank() != 1 || bias->dim(0) != p.M)
      return KILN_ERROR("{}: B must be int32 of shape [{}], got {}", n.label(), p.M, bias->desc());
    for (int64_t i = 0; i < p.M; ++i) B.push_back(bias->at_double(i));
  }
  std::vector<double> y(static_cast<size_t>(out_numel));
  conv_forward<double>(p, X.data(), W.data(), bias ? B.data() : nullptr, y.data());
  return y;
}

std::vector<int64_t> conv_out_shape(const ConvParams& p) {
  std::vector<int64_t> s = {p.N, p.M};
  s.insert(s.end(), p.out.begin(), p.out.end());
  return s;
}

Status conv_integer_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *w = ctx.input(1);
  if (!x || !w) return KILN_ERROR("{}: inputs x and w are required", n.label());
  KILN_ASSIGN_OR_RETURN(ConvParams p, conv_params(n, x->shape(), w->shape()));
  KILN_ASSIGN_OR_RETURN(std::vector<double> y,
                        int_conv(n, p, *x, ctx.input(2), *w, ctx.input(3), nullptr));
  ctx.set_output(0, to_int32(conv_out_shape(p), y));
  return Status::Ok();
}

Status infer_qlinear_conv(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(0).dtype, ctx.input_type(2).dtype, "x"));
  KILN_RETURN_IF_ERROR(
      check_operand_types(n, ctx.input_type(3).dtype, ctx.input_type(5).dtype, "w"));
  KILN_RETURN_IF_ERROR(check_8bit_type(n, ctx.input_type(7).dtype, "y_zero_point"));
  for (size_t i : {1, 4, 6})
    if (ctx.input_type(i).dtype != DataType::kUndefined &&
        ctx.input_type(i).dtype != DataType::kFloat32)
      return KILN_ERROR("{}: scales must be float, got {}", n.label(),
                        dtype_name(ctx.input_type(i).dtype));
  const DataType bt = ctx.input_type(8).dtype;
  if (ctx.has_input(8) && bt != DataType::kUndefined && bt != DataType::kInt32)
    return KILN_ERROR("{}: B must be int32, got {}", n.label(), dtype_name(bt));
  return infer_int_conv(ctx, 3,
                        ctx.has_input(7) ? ctx.input_type(7).dtype : ctx.input_type(0).dtype);
}

Status qlinear_conv_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *xs = ctx.input(1), *xzp = ctx.input(2), *w = ctx.input(3),
               *ws = ctx.input(4), *wzp = ctx.input(5);
  if (!x || !w) return KILN_ERROR("{}: inputs x and w are required", n.label());
  KILN_RETURN_IF_ERROR(check_pair(n, xs, xzp, "x"));
  KILN_RETURN_IF_ERROR(check_pair(n, ws, wzp, "w"));
  for (const Tensor* s : {xs, ws, ctx.input(6)})
    if (s && s->dtype() != DataType::kFloat32)
      return KILN_ERROR("{}: scales must be float, got {}", n.label(), s->desc());
  KILN_ASSIGN_OR_RETURN(OutputQuant y, output_quant(n, ctx.input(6), ctx.input(7), x->dtype()));
  KILN_ASSIGN_OR_RETURN(ConvParams p, conv_params(n, x->shape(), w->shape()));
  if (xs->numel() != 1)
    return KILN_ERROR("{}: x_scale must have one element (per tensor), got {}", n.label(),
                      shape_str(xs->shape()));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> wss,
                        param_shape(n, *ws, {p.M}, Per::kChannel, "w_scale"));
  const std::vector<double> sw = expand(*ws, wss, {p.M});
  KILN_ASSIGN_OR_RETURN(std::vector<double> acc, int_conv(n, p, *x, xzp, *w, wzp, ctx.input(8)));
  const int64_t P = shape_product(p.out);
  const double sx = xs->at_double(0);
  ctx.set_output(0, requantize_all(y.type, conv_out_shape(p), acc, y.zp, [&](int64_t i) {
                   return multiplier(DataType::kFloat32, sx, sw[static_cast<size_t>(i / P % p.M)],
                                     y.scale);
                 }));
  return Status::Ok();
}

constexpr OpDef kQuantLinearOps[] = {
    {"", "MatMulInteger", infer_matmul_integer, matmul_integer_cpu, nullptr},
    {"", "ConvInteger", infer_conv_integer, conv_integer_cpu, nullptr},
    {"", "QLinearMatMul", infer_qlinear_matmul, qlinear_matmul_cpu, nullptr},
    {"", "QLinearConv", infer_qlinear_conv, qlinear_conv_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> quant_linear_ops() { return kQuantLinearOps; }

}  // namespace kiln
