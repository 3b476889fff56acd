// Conv (N-d, grouped, dilated, auto_pad) and the conv family table; ConvTranspose lives in
// conv_transpose.cpp. The reference kernel is im2col + the shared GEMM.
#include "ops/conv.h"

#include <algorithm>
#include <vector>

#include "ops/conv_util.h"
#include "ops/gemm.h"
#include "ops/op.h"

namespace kiln {

Expected<ConvParams> conv_params(const Node& n, const std::vector<int64_t>& x,
                                 const std::vector<int64_t>& w) {
  KILN_ASSIGN_OR_RETURN(ConvParams p, read_conv_params_prologue(n, x, w));
  p.M = w[0];
  if (p.group < 1 || p.C % p.group != 0 || p.M % p.group != 0 || w[1] * p.group != p.C)
    return KILN_ERROR("{}: group {} does not fit X {} and W {}", n.label(), p.group,
                      shape_str(x), shape_str(w));
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_conv_window(n, x, w, p));
  for (size_t i = 0; i < p.in.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(AxisGeometry g, resolve_window_axis(a, i, p.in[i], false, n));
    p.out.push_back(g.out);
    p.pads_begin.push_back(g.pad_begin);
  }
  return p;
}

namespace {

// Fills col [Cg * prod(kernel), prod(out)] from x [Cg, in...]; padding reads as zero.
template <typename T>
void im2col(const ConvParams& p, int64_t Cg, const T* x, T* col) {
  const size_t nsp = p.in.size(), last = nsp - 1;
  const int64_t kprod = shape_product(p.kernel), P = shape_product(p.out);
  const int64_t inP = shape_product(p.in), Wout = p.out[last], Win = p.in[last];
  if (P == 0) return;
  const int64_t outer = P / Wout;
  std::vector<int64_t> istr(nsp, 1), kidx(nsp), oidx(nsp);
  for (int64_t d = static_cast<int64_t>(nsp) - 2; d >= 0; --d) istr[d] = istr[d + 1] * p.in[d + 1];
  for (int64_t c = 0; c < Cg; ++c) {
    const T* xc = x + c * inP;
    for (int64_t kk = 0; kk < kprod; ++kk) {
      for (int64_t d = static_cast<int64_t>(nsp) - 1, r = kk; d >= 0; --d) {
        kidx[d] = r % p.kernel[d];
        r /= p.kernel[d];
      }
      T* dst = col + (c * kprod + kk) * P;
      const int64_t kofs = kidx[last] * p.dilations[last] - p.pads_begin[last];
      const int64_t s = p.strides[last];
      for (int64_t o = 0; o < outer; ++o) {
        bool valid = true;
        int64_t off = 0;
        for (int64_t d = static_cast<int64_t>(last) - 1, r = o; d >= 0; --d) {
          const int64_t od = r % p.out[d];
          r /= p.out[d];
          const int64_t id = od * p.strides[d] - p.pads_begin[d] + kidx[d] * p.dilations[d];
          if (id < 0 || id >= p.in[d]) valid = false;
          off += id * istr[d];
        }
        T* drow = dst + o * Wout;
        if (!valid) {
          std::fill(drow, drow + Wout, T(0));
          continue;
        }
        const T* xr = xc + off;
        for (int64_t ow = 0; ow < Wout; ++ow) {
          const int64_t iw = ow * s + kofs;
          drow[ow] = (iw >= 0 && iw < Win) ? xr[iw] : T(0);
        }
      }
    }
  }
}

bool is_pointwise(const ConvParams& p) {
  for (size_t i = 0; i < p.in.size(); ++i)
    if (p.kernel[i] != 1 || p.strides[i] != 1 || p.pads_begin[i] != 0 || p.out[i] != p.in[i])
      return false;
  return true;
}

}  // namespace

template <typename T>
void conv_forward(const ConvParams& p, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = p.C / p.group, Mg = p.M / p.group;
  const int64_t kprod = shape_product(p.kernel), P = shape_product(p.out);
  const int64_t inP = shape_product(p.in), K = Cg * kprod;
  const bool pointwise = is_pointwise(p);
  std::vector<T> col(pointwise ? 0 : static_cast<size_t>(K * P));
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      const T* xg = x + (n * p.C + g * Cg) * inP;
      T* yg = y + (n * p.M + g * Mg) * P;
      if (!pointwise) im2col(p, Cg, xg, col.data());
      gemm<T>(false, false, Mg, P, K, T(1), w + g * Mg * K, pointwise ? xg : col.data(), T(0), yg);
      if (b)
        for (int64_t m = 0; m < Mg; ++m)
          for (int64_t j = 0; j < P; ++j) yg[m * P + j] += b[g * Mg + m];
    }
}

template void conv_forward<float>(const ConvParams&, const float*, const float*, const float*,
                                  float*);
template void conv_forward<double>(const ConvParams&, const double*, const double*,
                                   const double*, double*);

Expected<std::vector<Dim>> conv_infer_out_dims(const Node& n, const ConvInferDims& d) {
  const std::vector<Dim>& xd = d.x;
  const std::vector<Dim>& wd = d.w;
  int64_t in_channels = 0;  // W's channels x group, checked: group is the model's attribute
  if (xd[1].is_static() && wd[1].is_static() &&
      (__builtin_mul_overflow(wd[1].value, d.group, &in_channels) || xd[1].value != in_channels))
    return KILN_ERROR("{}: X has {} channels but W expects {} x group {}", n.label(),
                      xd[1].value, wd[1].value, d.group);
  if (wd[0].is_static() && wd[0].value % d.group != 0)
    return KILN_ERROR("{}: {} output channels are not divisible by group {}", n.label(),
                      wd[0].value, d.group);
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_conv_infer_window(n, d));
  std::vector<Dim> out = {xd[0], wd[0]};
  for (size_t i = 0; i < d.nsp; ++i) {
    if (!xd[i + 2].is_static() || a.kernel[i] < 0) {
      out.push_back(Dim());
      continue;
    }
    KILN_ASSIGN_OR_RETURN(AxisGeometry g, resolve_window_axis(a, i, xd[i + 2].value, false, n));
    out.push_back(g.out);
  }
  return out;
}

namespace {

Status infer_conv(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ConvInferDims d, read_conv_infer_dims(ctx));
  if (!d.ranked) return Status::Ok();
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> out, conv_infer_out_dims(ctx.node(), d));
  set_conv_output_type(ctx, std::move(out));
  return Status::Ok();
}

}  // namespace

Status check_conv_inputs(const Node& n, const Tensor* x, const Tensor* w, const Tensor* b,
                         int64_t bias_len) {
  if (!x || !w) return KILN_ERROR("{}: inputs X and W are required", n.label());
  const DataType dt = x->dtype();
  if (!dtype_is_float(dt))
    return KILN_ERROR("{}: unsupported type {} (float types only)", n.label(), dtype_name(dt));
  if (w->dtype() != dt || (b && b->dtype() != dt))
    return KILN_ERROR("{}: X, W and B must have the same type", n.label());
  if (b && (b->rank() != 1 || b->dim(0) != bias_len))
    return KILN_ERROR("{}: B has shape {}, expected [{}]", n.label(), shape_str(b->shape()),
                      bias_len);
  return Status::Ok();
}

namespace {

Status conv_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *w = ctx.input(1), *b = ctx.input(2);
  if (!x || !w) return KILN_ERROR("{}: inputs X and W are required", n.label());
  KILN_ASSIGN_OR_RETURN(ConvParams p, conv_params(n, x->shape(), w->shape()));
  KILN_RETURN_IF_ERROR(check_conv_inputs(n, x, w, b, p.M));
  KILN_RETURN_IF_ERROR(check_workspace(
      n, p.C / p.group * shape_product(p.kernel) * shape_product(p.out)));
  return run_conv_forward(ctx, p, {conv_forward<float>, conv_forward<double>});
}

const OpDef kConvOps[] = {
    {"", "Conv", infer_conv, conv_cpu, nullptr},
    {"", "ConvTranspose", infer_conv_transpose, conv_transpose_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> conv_ops() { return kConvOps; }

}  // namespace kiln
