// Col2Im (torch's F.fold) is a transposed convolution with one-hot kernels: column channel
// c * K + p (p a position in the block) adds into channel c at that position of each block.
//   Col2Im(x [N, C * K, L], image, block; strides, dilations, pads)  =>
//     Reshape [N, C * K, L1, L2] -> ConvTranspose(one-hot W [C * K, 1, k1, k2], group C,
//     strides, dilations, pads)
// for two spatial axes with constant image and block shapes, so the GPU runs it on its
// transposed convolutions (MobileViT-v2's patch folding).
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::optional<std::vector<int64_t>> const_ints(const Value* v) {
  if (!v || !v->constant || v->constant->rank() != 1 || !dtype_is_integer(v->constant->dtype()))
    return std::nullopt;
  return v->constant->to_int64_vector();
}

struct Col2ImToConvTranspose {
  struct Match {
    Node* n = nullptr;
    int64_t channels = 0;
    std::vector<int64_t> block, blocks, strides, dilations, pads;
    std::vector<int64_t>
        tail;  // rows and columns past the last block: ConvTranspose's output_padding
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Col2Im")) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value* x = n.input(0);
    const auto image = const_ints(n.input(1)), block = const_ints(n.input(2));
    if (!image || !block || image->size() != 2 || block->size() != 2)
      return why("not two spatial axes of constant image and block shapes");
    if (!x || !is_float_type(x->type.dtype) || x->type.rank() != 3 ||
        !(*x->type.dims)[1].is_static())
      return why("not a float input with a static channel count");
    Match m;
    m.n = &n;
    m.block = *block;
    m.strides = n.attrs.get_ints("strides");
    m.dilations = n.attrs.get_ints("dilations");
    m.pads = n.attrs.get_ints("pads");
    if (m.strides.empty()) m.strides = {1, 1};
    if (m.dilations.empty()) m.dilations = {1, 1};
    if (m.pads.empty()) m.pads = {0, 0, 0, 0};
    const int64_t k = (*block)[0] * (*block)[1], ck = (*x->type.dims)[1].value;
    if (k < 1 || ck % k != 0) return why("the channels are not a multiple of the block's size");
    m.channels = ck / k;
    for (size_t d = 0; d < 2; ++d) {
      const int64_t span = m.dilations[d] * ((*block)[d] - 1) + 1;
      const int64_t room = (*image)[d] + m.pads[d] + m.pads[d + 2] - span;
      if (room < 0 || m.strides[d] < 1) return why("the block does not fit the image");
      m.blocks.push_back(room / m.strides[d] + 1);
      m.tail.push_back(room % m.strides[d]);
      if (m.tail.back() >= std::max(m.strides[d], m.dilations[d]))
        return why("the rows past the last block are more than output_padding can hold");
    }
    const Dim& l = (*x->type.dims)[2];
    if (l.is_static() && l.value != m.blocks[0] * m.blocks[1])
      return why("the column count does not match");
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement rep(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    const int64_t k = m.block[0] * m.block[1];
    Value* shape = rep.constant(
        "grid", Tensor::from<int64_t>({4}, {0, m.channels * k, m.blocks[0], m.blocks[1]}));
    Value* grid = rep.add_value("Reshape", {n.input(0), shape}, "grid");
    Tensor w(DataType::kFloat64, {m.channels * k, 1, m.block[0], m.block[1]});
    double* p = w.data<double>();
    std::fill(p, p + w.numel(), 0.0);
    for (int64_t c = 0; c < m.channels * k; ++c) p[c * k + c % k] = 1.0;  // position c % k
    Node* t = rep.add("ConvTranspose", {grid, rep.constant("one_hot", w.cast(dt))}, "fold", 0);
    t->attrs.set("group", Attribute::Int(m.channels));
    t->attrs.set("kernel_shape", Attribute::Ints(m.block));
    t->attrs.set("strides", Attribute::Ints(m.strides));
    t->attrs.set("dilations", Attribute::Ints(m.dilations));
    t->attrs.set("pads", Attribute::Ints(m.pads));
    t->attrs.set("output_padding", Attribute::Ints(m.tail));
    return rep.finish(t);
  }
};

}  // namespace

Expected<bool> col2im_to_conv_transpose(PassContext& ctx) {
  return apply_pattern<Col2ImToConvTranspose>(ctx);
}

}  // namespace kiln::passes
