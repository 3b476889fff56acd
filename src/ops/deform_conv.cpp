// DeformConv (opset 19; torchvision's deform_conv2d, DCNv1 and v2): a convolution whose kernel
// taps sample the image at learned offsets. X [N, C, H, W], W [oC, C / group, kH, kW], offset
// [N, offset_group * kH * kW * 2, oH, oW] ((dy, dx) per tap), optional B [oC] and mask
// [N, offset_group * kH * kW, oH, oW]. Tap (ky, kx) of output (i, j) reads channel c of offset
// group g = c / (C / offset_group) at (i * sH - pad_top + ky * dH + dy, j * sW - pad_left + kx * dW
// + dx), bilinearly, each of the four neighbours outside the image counting as 0; times the
// mask; then the grouped convolution's sum with W and the bias. The CPU reference in double, 2-D
// (every exporter's form; the spec's N-D generalisation is refused with one line);
// passes/deform_conv_to_grid_sample.cpp makes it GridSample + Conv for the GPU.
#include <fmt/format.h>

#include <cmath>

#include "ops/op.h"

namespace kiln {
namespace {

struct DeformParams {
  int64_t kh = 0, kw = 0, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0, pb = 0, pr = 0;
  int64_t group = 1, offset_group = 1;
  int64_t oh = -1, ow = -1;  // -1 where H or W is not known
};

// The attributes, checked against W's kernel when its dims are known (kh/kw from W otherwise).
Expected<DeformParams> deform_params(const Node& n, const std::vector<Dim>* w,
                                     const std::vector<Dim>* x) {
  DeformParams p;
  std::vector<int64_t> k = n.attrs.get_ints("kernel_shape");
  if (k.empty() && w && w->size() == 4 && (*w)[2].is_static() && (*w)[3].is_static())
    k = {(*w)[2].value, (*w)[3].value};
  if (k.size() != 2)
    return KILN_ERROR("{}: DeformConv needs a 2-D kernel (4-D X and W); kernel_shape has {} values",
                      n.label(), k.size());
  p.kh = k[0];
  p.kw = k[1];
  const std::vector<int64_t> s = n.attrs.get_ints("strides"), d = n.attrs.get_ints("dilations"),
                             pads = n.attrs.get_ints("pads");
  if ((!s.empty() && s.size() != 2) || (!d.empty() && d.size() != 2) ||
      (!pads.empty() && pads.size() != 4))
    return KILN_ERROR("{}: strides and dilations need 2 values and pads 4", n.label());
  if (!s.empty()) p.sh = s[0], p.sw = s[1];
  if (!d.empty()) p.dh = d[0], p.dw = d[1];
  if (!pads.empty()) p.pt = pads[0], p.pl = pads[1], p.pb = pads[2], p.pr = pads[3];
  p.group = n.attrs.get_int("group", 1);
  p.offset_group = n.attrs.get_int("offset_group", 1);
  if (p.kh < 1 || p.kw < 1 || p.sh < 1 || p.sw < 1 || p.dh < 1 || p.dw < 1 || p.pt < 0 ||
      p.pl < 0 || p.pb < 0 || p.pr < 0 || p.group < 1 || p.offset_group < 1 || p.kh > 4096 ||
      p.kw > 4096)
    return KILN_ERROR(
        "{}: kernel {}x{}, strides, dilations, group and offset_group must be >= 1 and pads >= 0",
        n.label(), p.kh, p.kw);
  if (w && w->size() == 4 && (*w)[2].is_static() && (*w)[3].is_static() &&
      ((*w)[2].value != p.kh || (*w)[3].value != p.kw))
    return KILN_ERROR("{}: kernel_shape {}x{} but W's kernel is {}x{}", n.label(), p.kh, p.kw,
                      (*w)[2].value, (*w)[3].value);
  if (x && x->size() == 4 && (*x)[2].is_static() && (*x)[3].is_static()) {
    const int64_t rh = (*x)[2].value + p.pt + p.pb - (p.dh * (p.kh - 1) + 1);
    const int64_t rw = (*x)[3].value + p.pl + p.pr - (p.dw * (p.kw - 1) + 1);
    if (rh < 0 || rw < 0)
      return KILN_ERROR("{}: the dilated {}x{} kernel does not fit the padded {}x{} image",
                        n.label(), p.kh, p.kw, (*x)[2].value + p.pt + p.pb,
                        (*x)[3].value + p.pl + p.pr);
    p.oh = rh / p.sh + 1;
    p.ow = rw / p.sw + 1;
  }
  return p;
}

// Checks one dim of an input against what it must be (skipped where either is unknown).
Status expect_dim(const Node& n, const char* what, const Dim& d, int64_t want, const char* as) {
  if (d.is_static() && want >= 0 && d.value != want)
    return KILN_ERROR("{}: {} has {} {}, expected {}", n.label(), what, d.value, as, want);
  return Status::Ok();
}

Status deform_conv_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType &x = ctx.input_type(0), &w = ctx.input_type(1), &off = ctx.input_type(2);
  for (const TensorType* t : {&x, &w, &off})
    if (t->has_rank() && t->rank() != 4)
      return KILN_ERROR("{}: DeformConv takes 4-D X, W and offset (2-D images); got {}", n.label(),
                        t->str());
  KILN_ASSIGN_OR_RETURN(DeformParams p, deform_params(n, w.has_rank() ? &*w.dims : nullptr,
                                                      x.has_rank() ? &*x.dims : nullptr));
  std::vector<Dim> out = {Dim(), Dim(), p.oh >= 0 ? Dim(p.oh) : Dim(),
                          p.ow >= 0 ? Dim(p.ow) : Dim()};
  if (x.has_rank()) out[0] = (*x.dims)[0];
  if (w.has_rank()) out[1] = (*w.dims)[0];
  if (x.has_rank() && w.has_rank() && (*x.dims)[1].is_static() && (*w.dims)[1].is_static()) {
    const int64_t c = (*x.dims)[1].value;
    if (c != (*w.dims)[1].value * p.group || c % p.offset_group != 0)
      return KILN_ERROR(
          "{}: X's {} channels are not W's {} per group times group {}, or not a "
          "multiple of offset_group {}",
          n.label(), c, (*w.dims)[1].value, p.group, p.offset_group);
  }
  if (w.has_rank() && (*w.dims)[0].is_static() && (*w.dims)[0].value % p.group != 0)
    return KILN_ERROR("{}: W's {} output channels are not a multiple of group {}", n.label(),
                      (*w.dims)[0].value, p.group);
  const int64_t taps = p.offset_group * p.kh * p.kw;
  if (off.has_rank()) {
    const std::vector<Dim>& d = *off.dims;
    KILN_RETURN_IF_ERROR(expect_dim(n, "offset", d[1], 2 * taps, "channels"));
    KILN_RETURN_IF_ERROR(expect_dim(n, "offset", d[2], p.oh, "rows"));
    KILN_RETURN_IF_ERROR(expect_dim(n, "offset", d[3], p.ow, "columns"));
    if (!out[2].is_static()) out[2] = d[2];
    if (!out[3].is_static()) out[3] = d[3];
  }
  if (ctx.has_input(4)) {
    const TensorType& m = ctx.input_type(4);
    if (m.has_rank() && m.rank() != 4)
      return KILN_ERROR("{}: mask must be 4-D, got {}", n.label(), m.str());
    if (m.has_rank()) KILN_RETURN_IF_ERROR(expect_dim(n, "mask", (*m.dims)[1], taps, "channels"));
  }
  ctx.set_output(0, TensorType(x.dtype, std::move(out)));
  return Status::Ok();
}

// Bilinear sample of one channel plane at (y, x), each neighbour outside the image 0.
double bilinear(const double* plane, int64_t h, int64_t w, double y, double x) {
  if (!(y > -1 && y < static_cast<double>(h) && x > -1 && x < static_cast<double>(w)))
    return std::isnan(y) || std::isnan(x) ? std::nan("") : 0.0;
  const double fy = std::floor(y), fx = std::floor(x);
  const auto y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  const double ly = y - fy, lx = x - fx;
  auto at = [&](int64_t r, int64_t c) {
    return r >= 0 && r < h && c >= 0 && c < w ? plane[r * w + c] : 0.0;
  };
  return (1 - ly) * ((1 - lx) * at(y0, x0) + lx * at(y0, x0 + 1)) +
         ly * ((1 - lx) * at(y0 + 1, x0) + lx * at(y0 + 1, x0 + 1));
}

Status deform_conv_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *w = ctx.input(1), *off = ctx.input(2);
  const Tensor* b = ctx.num_inputs() > 3 ? ctx.input(3) : nullptr;
  const Tensor* mk = ctx.num_inputs() > 4 ? ctx.input(4) : nullptr;
  if (!x || !w || !off || x->rank() != 4 || w->rank() != 4 || off->rank() != 4)
    return KILN_ERROR("{}: DeformConv takes 4-D X, W and offset", n.label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: X must be a float tensor, got {}", n.label(), x->desc());
  const std::vector<Dim> wd = {Dim(w->dim(0)), Dim(w->dim(1)), Dim(w->dim(2)), Dim(w->dim(3))};
  const std::vector<Dim> xd = {Dim(x->dim(0)), Dim(x->dim(1)), Dim(x->dim(2)), Dim(x->dim(3))};
  KILN_ASSIGN_OR_RETURN(DeformParams p, deform_params(n, &wd, &xd));
  const int64_t N = x->dim(0), C = x->dim(1), H = x->dim(2), Wd = x->dim(3), OC = w->dim(0);
  const int64_t cg = w->dim(1), K = p.kh * p.kw, OH = p.oh, OW = p.ow, L = OH * OW;
  if (C != cg * p.group || OC % p.group != 0 || C % p.offset_group != 0)
    return KILN_ERROR("{}: X {} and W {} do not fit group {} and offset_group {}", n.label(),
                      x->desc(), w->desc(), p.group, p.offset_group);
  if (off->dim(0) != N || off->dim(1) != 2 * p.offset_group * K || off->dim(2) != OH ||
      off->dim(3) != OW)
    return KILN_ERROR("{}: offset {} should be [{}, {}, {}, {}]", n.label(), off->desc(), N,
                      2 * p.offset_group * K, OH, OW);
  if (mk && (mk->rank() != 4 || mk->dim(0) != N || mk->dim(1) != p.offset_group * K ||
             mk->dim(2) != OH || mk->dim(3) != OW))
    return KILN_ERROR("{}: mask {} should be [{}, {}, {}, {}]", n.label(), mk->desc(), N,
                      p.offset_group * K, OH, OW);
  if (b && (b->rank() != 1 || b->dim(0) != OC))
    return KILN_ERROR("{}: B {} should be [{}]", n.label(), b->desc(), OC);
  // The columns (C * K values per output position) in double: bounded like a convolution's.
  if (static_cast<double>(N) * static_cast<double>(C * K) * static_cast<double>(L) > 1.0e9 ||
      static_cast<double>(N) * static_cast<double>(OC) * static_cast<double>(L) * (cg * K) > 1.0e12)
    return KILN_ERROR("{}: {} x {} columns of {} positions are too large for the CPU reference",
                      n.label(), N, C * K, L);
  const Tensor xf = x->cast(DataType::kFloat64), wf = w->cast(DataType::kFloat64),
               of = off->cast(DataType::kFloat64);
  const Tensor mf = mk ? mk->cast(DataType::kFloat64) : Tensor();
  const Tensor bf = b ? b->cast(DataType::kFloat64) : Tensor();
  Tensor y(DataType::kFloat64, {N, OC, OH, OW});
  double* out = y.data<double>();
  const int64_t cpo = C / p.offset_group, ocg = OC / p.group;
  std::vector<double> col(static_cast<size_t>(C * K * L));
  for (int64_t bn = 0; bn < N; ++bn) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t g = c / cpo;
      const double* plane = xf.data<double>() + (bn * C + c) * H * Wd;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t ky = k / p.kw, kx = k % p.kw;
        const double* dy = of.data<double>() + ((bn * p.offset_group + g) * K + k) * 2 * L;
        const double* dx = dy + L;
        const double* m =
            mk ? mf.data<double>() + ((bn * p.offset_group + g) * K + k) * L : nullptr;
        double* cl = col.data() + (c * K + k) * L;
        for (int64_t i = 0; i < OH; ++i)
          for (int64_t j = 0; j < OW; ++j) {
            const int64_t l = i * OW + j;
            const double yy = static_cast<double>(i * p.sh - p.pt + ky * p.dh) + dy[l];
            const double xx = static_cast<double>(j * p.sw - p.pl + kx * p.dw) + dx[l];
            cl[l] = bilinear(plane, H, Wd, yy, xx) * (m ? m[l] : 1.0);
          }
      }
    }
    for (int64_t oc = 0; oc < OC; ++oc) {
      const int64_t g = oc / ocg;
      double* yo = out + (bn * OC + oc) * L;
      const double bias = b ? bf.data<double>()[oc] : 0.0;
      for (int64_t l = 0; l < L; ++l) yo[l] = bias;
      for (int64_t ci = 0; ci < cg; ++ci)
        for (int64_t k = 0; k < K; ++k) {
          const double wv = wf.data<double>()[(oc * cg + ci) * K + k];
          const double* cl = col.data() + ((g * cg + ci) * K + k) * L;
          for (int64_t l = 0; l < L; ++l) yo[l] += wv * cl[l];
        }
    }
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "DeformConv", deform_conv_infer, deform_conv_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> deform_conv_ops() { return kOps; }

}  // namespace kiln
