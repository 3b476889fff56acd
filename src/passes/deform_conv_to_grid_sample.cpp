// DeformConv (torchvision's deform_conv2d) is a bilinear gather of every kernel tap followed by a
// 1x1 convolution over the gathered columns:
//   DeformConv(X [N, C, H, W], W [oC, C/group, kh, kw], offset, B, mask)  =>
//     grid   = Gather(Transpose(Reshape(offset, [N*og, K, 2, oh, ow])), (dx, dy)) * (2/W, 2/H) + T
//     cols   = GridSample(Reshape(X, [N*og, C/og, H, W]), Reshape(grid, [N*og, K*oh, ow, 2]))
//              (bilinear, zeros, align_corners 0) [* Reshape(mask, [N, og, 1, K, oh, ow])]
//     Y      = Conv(Reshape(cols, [N, C*K, oh, ow]), Reshape(W, [oC, C/group*K, 1, 1]), B, group)
// with K = kh*kw taps, og offset groups, and T the taps' undeformed positions (i*sH - pad + ky*dH,
// j*sW - pad + kx*dW) in GridSample's normalised coordinates ((2p + 1) / size - 1: align_corners
// 0 holds every size, 1 included). A sample's four neighbours outside the image count 0 in both
// ops. So the GPU runs it on its GridSample and convolution kernels. Needs static C, H, W and
// output size; the batch may be symbolic.
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct DeformConvToGridSample {
  struct Match {
    Node* n = nullptr;
    int64_t C = 0, H = 0, W = 0, OC = 0, cg = 0, kh = 0, kw = 0, oh = 0, ow = 0;
    int64_t sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0, group = 1, og = 1;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "DeformConv")) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value *x = n.input(0), *w = n.input(1), *y = n.output(0);
    if (!x || !w || !y || !is_float_type(x->type.dtype) || x->type.rank() != 4 ||
        w->type.rank() != 4 || y->type.rank() != 4)
      return why("not a float 2-D deformable convolution");
    auto dim = [](const Value* v, size_t i) {
      const Dim& d = (*v->type.dims)[i];
      return d.is_static() ? d.value : -1;
    };
    Match m;
    m.n = &n;
    m.C = dim(x, 1), m.H = dim(x, 2), m.W = dim(x, 3);
    m.OC = dim(w, 0), m.cg = dim(w, 1), m.kh = dim(w, 2), m.kw = dim(w, 3);
    m.oh = dim(y, 2), m.ow = dim(y, 3);
    for (int64_t v : {m.C, m.H, m.W, m.OC, m.cg, m.kh, m.kw, m.oh, m.ow})
      if (v < 1) return why("channels, image, kernel and output sizes are not all static");
    const std::vector<int64_t> s = n.attrs.get_ints("strides"), d = n.attrs.get_ints("dilations"),
                               p = n.attrs.get_ints("pads");
    if (s.size() == 2) m.sh = s[0], m.sw = s[1];
    if (d.size() == 2) m.dh = d[0], m.dw = d[1];
    if (p.size() == 4) m.pt = p[0], m.pl = p[1];
    m.group = n.attrs.get_int("group", 1);
    m.og = n.attrs.get_int("offset_group", 1);
    if (m.group < 1 || m.og < 1 || m.C % m.og != 0 || m.C != m.cg * m.group)
      return why("the channels do not divide into the groups");
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement rep(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    const int64_t K = m.kh * m.kw, cpo = m.C / m.og;
    auto shape = [&](const std::string& what, std::vector<int64_t> v) {
      const auto r = static_cast<int64_t>(v.size());
      return rep.constant(what, Tensor::from<int64_t>({r}, v));
    };
    // The sampling grid from the offsets: (dy, dx) per tap and position, to GridSample's (x, y).
    Value* off = rep.add_value(
        "Reshape", {n.input(2), shape("offset_shape", {-1, K, 2, m.oh, m.ow})}, "offsets");
    Node* tr = rep.add("Transpose", {off}, "offsets_last");
    tr->attrs.set("perm", Attribute::Ints({0, 1, 3, 4, 2}));
    Node* ga = rep.add(
        "Gather", {tr->output(0), rep.constant("x_then_y", Tensor::from<int64_t>({2}, {1, 0}))},
        "offsets_xy");
    ga->attrs.set("axis", Attribute::Int(4));
    Value* xy = ga->output(0);
    Tensor scale(DataType::kFloat64, {2});
    scale.data<double>()[0] = 2.0 / static_cast<double>(m.W);
    scale.data<double>()[1] = 2.0 / static_cast<double>(m.H);
    Value* scaled = rep.add_value("Mul", {xy, rep.constant("to_unit", scale.cast(dt))}, "scaled");
    Tensor base(DataType::kFloat64, {K, m.oh, m.ow, 2});
    double* b = base.data<double>();
    for (int64_t k = 0; k < K; ++k)
      for (int64_t i = 0; i < m.oh; ++i)
        for (int64_t j = 0; j < m.ow; ++j, b += 2) {
          const double px = static_cast<double>(j * m.sw - m.pl + (k % m.kw) * m.dw);
          const double py = static_cast<double>(i * m.sh - m.pt + (k / m.kw) * m.dh);
          b[0] = (2 * px + 1) / static_cast<double>(m.W) - 1;
          b[1] = (2 * py + 1) / static_cast<double>(m.H) - 1;
        }
    Value* grid = rep.add_value("Add", {scaled, rep.constant("taps", base.cast(dt))}, "grid");
    grid = rep.add_value("Reshape", {grid, shape("grid_shape", {-1, K * m.oh, m.ow, 2})}, "grid");
    // Every tap of every channel, sampled.
    Value* xg =
        rep.add_value("Reshape", {n.input(0), shape("image_shape", {-1, cpo, m.H, m.W})}, "images");
    Node* gs = rep.add("GridSample", {xg, grid}, "sample");
    gs->attrs.set("mode", Attribute::String("linear"));
    gs->attrs.set("padding_mode", Attribute::String("zeros"));
    gs->attrs.set("align_corners", Attribute::Int(0));
    Value* cols = gs->output(0);
    if (Value* mask = n.input(4)) {  // DCNv2's modulation, per offset group, tap and position
      Value* c6 = rep.add_value("Reshape",
                                {cols, shape("tap_shape", {-1, m.og, cpo, K, m.oh, m.ow})}, "taps");
      Value* m6 = rep.add_value("Reshape",
                                {mask, shape("mask_shape", {-1, m.og, 1, K, m.oh, m.ow})}, "mask");
      cols = rep.add_value("Mul", {c6, m6}, "modulated");
    }
    cols = rep.add_value("Reshape", {cols, shape("cols_shape", {-1, m.C * K, m.oh, m.ow})}, "cols");
    Value* w =
        rep.add_value("Reshape", {n.input(1), shape("w_shape", {m.OC, m.cg * K, 1, 1})}, "weights");
    std::vector<Value*> conv_in = {cols, w};
    if (Value* bias = n.input(3)) conv_in.push_back(bias);
    Node* conv = rep.add("Conv", conv_in, "conv", 0);
    conv->attrs.set("group", Attribute::Int(m.group));
    conv->attrs.set("kernel_shape", Attribute::Ints({1, 1}));
    return rep.finish(conv);
  }
};

}  // namespace

Expected<bool> deform_conv_to_grid_sample(PassContext& ctx) {
  return apply_pattern<DeformConvToGridSample>(ctx);
}

}  // namespace kiln::passes
