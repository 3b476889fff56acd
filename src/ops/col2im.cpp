// Col2Im (opset 18; torch's F.fold): the columns of sliding blocks back into an image, sums where
// the blocks overlap. x [N, C * prod(block), L] -> y [N, C, image...], L the number of block
// positions for the image, block, strides, dilations and pads. The CPU reference in double;
// passes/col2im_to_conv_transpose.cpp makes a 2-D one a ConvTranspose for the GPU.
#include <fmt/format.h>

#include "ops/op.h"

namespace kiln {
namespace {

struct Col2ImParams {
  std::vector<int64_t> image, block, strides, dilations, pads;  // pads: begins, then ends
  std::vector<int64_t> blocks;  // block positions along each spatial axis
  int64_t kprod = 1, positions = 1;
};

Expected<Col2ImParams> col2im_params(const Node& n, const Tensor* image, const Tensor* block) {
  if (!image || !block)
    return KILN_ERROR("{}: image_shape and block_shape must be constants", n.label());
  Col2ImParams p;
  p.image = image->to_int64_vector();
  p.block = block->to_int64_vector();
  const size_t nsp = p.image.size();
  if (nsp == 0 || p.block.size() != nsp)
    return KILN_ERROR(
        "{}: image_shape ({} values) and block_shape ({}) must name the same spatial "
        "axes",
        n.label(), p.image.size(), p.block.size());
  p.strides = n.attrs.get_ints("strides");
  p.dilations = n.attrs.get_ints("dilations");
  p.pads = n.attrs.get_ints("pads");
  if (p.strides.empty()) p.strides.assign(nsp, 1);
  if (p.dilations.empty()) p.dilations.assign(nsp, 1);
  if (p.pads.empty()) p.pads.assign(2 * nsp, 0);
  if (p.strides.size() != nsp || p.dilations.size() != nsp || p.pads.size() != 2 * nsp)
    return KILN_ERROR(
        "{}: strides, dilations ({} values each) and pads ({}) do not match {} "
        "spatial axes",
        n.label(), p.strides.size(), p.pads.size(), nsp);
  for (size_t d = 0; d < nsp; ++d) {
    if (p.image[d] < 1 || p.block[d] < 1 || p.strides[d] < 1 || p.dilations[d] < 1 ||
        p.pads[d] < 0 || p.pads[d + nsp] < 0 || p.image[d] > (1 << 24) || p.block[d] > (1 << 16))
      return KILN_ERROR(
          "{}: image {}, block {}, strides, dilations >= 1 and pads >= 0 along axis "
          "{}",
          n.label(), p.image[d], p.block[d], d);
    const int64_t span = p.dilations[d] * (p.block[d] - 1) + 1;
    const int64_t room = p.image[d] + p.pads[d] + p.pads[d + nsp] - span;
    if (room < 0)
      return KILN_ERROR(
          "{}: a block of {} (dilated) does not fit the padded image ({}) along axis "
          "{}",
          n.label(), span, p.image[d] + p.pads[d] + p.pads[d + nsp], d);
    p.blocks.push_back(room / p.strides[d] + 1);
    p.kprod *= p.block[d];
    p.positions *= p.blocks.back();
  }
  return p;
}

Status col2im_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (x.has_rank() && x.rank() != 3)
    return KILN_ERROR("{}: Col2Im input must be [N, C * prod(block_shape), L], got {}", n.label(),
                      x.str());
  if (!ctx.input_const(1) || !ctx.input_const(2)) {
    const TensorType& image = ctx.input_type(1);
    const int64_t nsp =
        image.rank() == 1 && (*image.dims)[0].is_static() ? (*image.dims)[0].value : -1;
    ctx.set_output(0, nsp < 0
                          ? TensorType::unknown_rank(x.dtype)
                          : TensorType(x.dtype, std::vector<Dim>(static_cast<size_t>(nsp + 2))));
    return Status::Ok();
  }
  KILN_ASSIGN_OR_RETURN(Col2ImParams p, col2im_params(n, ctx.input_const(1), ctx.input_const(2)));
  std::vector<Dim> out = {Dim(), Dim()};
  if (x.has_rank()) {
    const std::vector<Dim>& d = *x.dims;
    out[0] = d[0];
    if (d[1].is_static()) {
      if (d[1].value % p.kprod != 0)
        return KILN_ERROR("{}: {} channels of columns are not a multiple of the block's {} values",
                          n.label(), d[1].value, p.kprod);
      out[1] = Dim(d[1].value / p.kprod);
    }
    if (d[2].is_static() && d[2].value != p.positions)
      return KILN_ERROR(
          "{}: {} columns, but the image, block, strides, dilations and pads make {} "
          "block positions",
          n.label(), d[2].value, p.positions);
  }
  for (int64_t v : p.image) out.push_back(Dim(v));
  ctx.set_output(0, TensorType(x.dtype, std::move(out)));
  return Status::Ok();
}

Status col2im_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x || x->rank() != 3)
    return KILN_ERROR("{}: Col2Im input must be [N, C * prod(block_shape), L]", n.label());
  KILN_ASSIGN_OR_RETURN(Col2ImParams p, col2im_params(n, ctx.input(1), ctx.input(2)));
  const int64_t N = x->dim(0), CK = x->dim(1), L = x->dim(2);
  if (CK % p.kprod != 0 || L != p.positions)
    return KILN_ERROR("{}: input {} does not hold C * {} channels of {} block positions", n.label(),
                      x->desc(), p.kprod, p.positions);
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: Col2Im input must be a float tensor, got {}", n.label(), x->desc());
  const int64_t C = CK / p.kprod;
  const size_t nsp = p.image.size();
  int64_t pixels = 1;
  for (int64_t v : p.image) pixels *= v;
  if (static_cast<double>(pixels) * static_cast<double>(N * C) > 2.1e9)
    return KILN_ERROR("{}: an output of {} x {} x {} values is over 2^31", n.label(), N, C, pixels);
  std::vector<int64_t> shape = {N, C};
  shape.insert(shape.end(), p.image.begin(), p.image.end());
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, shape);
  double* out = y.data<double>();
  std::fill(out, out + y.numel(), 0.0);
  std::vector<int64_t> pos(nsp), k(nsp);
  for (int64_t b = 0; b < N * C; ++b) {
    for (int64_t kk = 0; kk < p.kprod; ++kk) {
      for (int64_t r = kk, d = static_cast<int64_t>(nsp) - 1; d >= 0; --d) {
        k[static_cast<size_t>(d)] = r % p.block[static_cast<size_t>(d)];
        r /= p.block[static_cast<size_t>(d)];
      }
      const double* col = xd.data<double>() + (b * p.kprod + kk) * L;
      for (int64_t l = 0; l < L; ++l) {
        int64_t at = 0;
        bool inside = true;
        for (int64_t r = l, d = static_cast<int64_t>(nsp) - 1; d >= 0; --d) {
          const auto u = static_cast<size_t>(d);
          pos[u] = r % p.blocks[u];
          r /= p.blocks[u];
        }
        for (size_t d = 0; d < nsp && inside; ++d) {
          const int64_t i = pos[d] * p.strides[d] - p.pads[d] + k[d] * p.dilations[d];
          inside = i >= 0 && i < p.image[d];
          at = at * p.image[d] + i;
        }
        if (inside) out[b * pixels + at] += col[l];
      }
    }
  }
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "Col2Im", col2im_infer, col2im_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> col2im_ops() { return kOps; }

}  // namespace kiln
