// ConvTranspose (N-d, grouped, dilated, output_padding / output_shape / auto_pad): the reference
// kernel is the shared GEMM (W^T X) followed by a col2im scatter-add.
#include <algorithm>
#include <vector>

#include "ops/conv.h"
#include "ops/conv_util.h"
#include "ops/gemm.h"
#include "ops/op.h"

namespace kiln {
namespace {

// output_padding (default 0) and output_shape (empty when absent; its last nsp values count, as
// some exporters include N and C) of a ConvTranspose node.
Status read_transpose_attrs(const Node& n, size_t nsp, std::vector<int64_t>& output_padding,
                            std::vector<int64_t>& output_shape) {
  output_padding = n.attrs.get_ints("output_padding", std::vector<int64_t>(nsp, 0));
  if (output_padding.size() != nsp)
    return KILN_ERROR("{}: output_padding has {} values, expected {}", n.label(),
                      output_padding.size(), nsp);
  for (int64_t v : output_padding)
    if (v < 0) return KILN_ERROR("{}: negative output_padding {}", n.label(), v);
  output_shape = n.attrs.get_ints("output_shape");
  if (!output_shape.empty()) {
    if (output_shape.size() == nsp + 2) output_shape.erase(output_shape.begin(), output_shape.begin() + 2);
    if (output_shape.size() != nsp)
      return KILN_ERROR("{}: output_shape has {} values, expected {}", n.label(),
                        output_shape.size(), nsp);
    for (int64_t v : output_shape)
      if (v < 1) return KILN_ERROR("{}: output_shape value {} must be >= 1", n.label(), v);
  }
  return Status::Ok();
}

}  // namespace

Expected<ConvParams> conv_transpose_params(const Node& n, const std::vector<int64_t>& x,
                                           const std::vector<int64_t>& w) {
  KILN_ASSIGN_OR_RETURN(ConvParams p, read_conv_params_prologue(n, x, w));
  p.M = w[1] * p.group;
  if (p.group < 1 || w[0] != p.C || p.C % p.group != 0)
    return KILN_ERROR("{}: group {} does not fit X {} and W {}", n.label(), p.group,
                      shape_str(x), shape_str(w));
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_conv_window(n, x, w, p));
  const size_t nsp = p.in.size();
  std::vector<int64_t> opad, oshape;
  KILN_RETURN_IF_ERROR(read_transpose_attrs(n, nsp, opad, oshape));
  for (size_t i = 0; i < nsp; ++i) {
    KILN_ASSIGN_OR_RETURN(AxisGeometry g, resolve_transpose_axis(a, i, p.in[i], opad[i],
                                                                 oshape.empty() ? 0 : oshape[i], n));
    p.out.push_back(g.out);
    p.pads_begin.push_back(g.pad_begin);
  }
  return p;
}

namespace {

// y [Mg, out...] += scatter of col [Mg * prod(kernel), prod(in)].
template <typename T>
void col2im(const ConvParams& p, int64_t Mg, const T* col, T* y) {
  const size_t nsp = p.in.size(), last = nsp - 1;
  const int64_t kprod = shape_product(p.kernel), inP = shape_product(p.in);
  const int64_t P = shape_product(p.out), Win = p.in[last], Wout = p.out[last];
  if (inP == 0 || P == 0) return;
  const int64_t outer = inP / Win;
  std::vector<int64_t> ostr(nsp, 1), kidx(nsp);
  for (int64_t d = static_cast<int64_t>(nsp) - 2; d >= 0; --d)
    ostr[d] = ostr[d + 1] * p.out[d + 1];
  for (int64_t m = 0; m < Mg; ++m) {
    T* ym = y + m * P;
    for (int64_t kk = 0; kk < kprod; ++kk) {
      for (int64_t d = static_cast<int64_t>(nsp) - 1, r = kk; d >= 0; --d) {
        kidx[d] = r % p.kernel[d];
        r /= p.kernel[d];
      }
      const T* src = col + (m * kprod + kk) * inP;
      const int64_t kofs = kidx[last] * p.dilations[last] - p.pads_begin[last];
      const int64_t s = p.strides[last];
      for (int64_t o = 0; o < outer; ++o) {
        bool valid = true;
        int64_t off = 0;
        for (int64_t d = static_cast<int64_t>(last) - 1, r = o; d >= 0; --d) {
          const int64_t id = r % p.in[d];
          r /= p.in[d];
          const int64_t od = id * p.strides[d] - p.pads_begin[d] + kidx[d] * p.dilations[d];
          if (od < 0 || od >= p.out[d]) valid = false;
          off += od * ostr[d];
        }
        if (!valid) continue;
        const T* srow = src + o * Win;
        T* yr = ym + off;
        for (int64_t iw = 0; iw < Win; ++iw) {
          const int64_t ow = iw * s + kofs;
          if (ow >= 0 && ow < Wout) yr[ow] += srow[iw];
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void conv_transpose_forward(const ConvParams& p, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = p.C / p.group, Mg = p.M / p.group;
  const int64_t kprod = shape_product(p.kernel), P = shape_product(p.out);
  const int64_t inP = shape_product(p.in);
  std::vector<T> col(static_cast<size_t>(Mg * kprod * inP));
  std::fill(y, y + p.N * p.M * P, T(0));
  for (int64_t n = 0; n < p.N; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      const T* xg = x + (n * p.C + g * Cg) * inP;
      const T* wg = w + g * Cg * Mg * kprod;
      T* yg = y + (n * p.M + g * Mg) * P;
      gemm<T>(true, false, Mg * kprod, inP, Cg, T(1), wg, xg, T(0), col.data());
      col2im(p, Mg, col.data(), yg);
      if (b)
        for (int64_t m = 0; m < Mg; ++m)
          for (int64_t j = 0; j < P; ++j) yg[m * P + j] += b[g * Mg + m];
    }
}

template void conv_transpose_forward<float>(const ConvParams&, const float*, const float*,
                                            const float*, float*);
template void conv_transpose_forward<double>(const ConvParams&, const double*, const double*,
                                             const double*, double*);

Status infer_conv_transpose(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(ConvInferDims d, read_conv_infer_dims(ctx));
  if (!d.ranked) return Status::Ok();
  const std::vector<Dim>& xd = d.x;
  const std::vector<Dim>& wd = d.w;
  if (xd[1].is_static() && wd[0].is_static() && xd[1].value != wd[0].value)
    return KILN_ERROR("{}: X has {} channels but W has {} input channels", n.label(),
                      xd[1].value, wd[0].value);
  KILN_ASSIGN_OR_RETURN(WindowAttrs a, read_conv_infer_window(n, d));
  std::vector<int64_t> opad, oshape;
  KILN_RETURN_IF_ERROR(read_transpose_attrs(n, d.nsp, opad, oshape));
  int64_t out_channels = 0;
  if (wd[1].is_static() && __builtin_mul_overflow(wd[1].value, d.group, &out_channels))
    return KILN_ERROR("{}: W's {} channels x group {} overflows int64", n.label(), wd[1].value,
                      d.group);
  std::vector<Dim> out = {xd[0], wd[1].is_static() ? Dim(out_channels) : Dim()};
  for (size_t i = 0; i < d.nsp; ++i) {
    if (!oshape.empty()) {
      out.push_back(oshape[i]);
    } else if (!xd[i + 2].is_static() || a.kernel[i] < 0) {
      out.push_back(Dim());
    } else {
      KILN_ASSIGN_OR_RETURN(AxisGeometry g,
                            resolve_transpose_axis(a, i, xd[i + 2].value, opad[i], 0, n));
      out.push_back(g.out);
    }
  }
  set_conv_output_type(ctx, std::move(out));
  return Status::Ok();
}

Status conv_transpose_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *w = ctx.input(1), *b = ctx.input(2);
  if (!x || !w) return KILN_ERROR("{}: inputs X and W are required", n.label());
  KILN_ASSIGN_OR_RETURN(ConvParams p, conv_transpose_params(n, x->shape(), w->shape()));
  KILN_RETURN_IF_ERROR(check_conv_inputs(n, x, w, b, p.M));
  KILN_RETURN_IF_ERROR(check_workspace(
      n, p.M / p.group * shape_product(p.kernel) * shape_product(p.in)));
  return run_conv_forward(ctx, p, {conv_transpose_forward<float>, conv_transpose_forward<double>});
}

}  // namespace kiln
