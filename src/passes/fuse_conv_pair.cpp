// Two INT8 convolutions whose sum feeds one activation become one layer:
//   A = kiln.FusedConv(X, W, B?) [int8, no residual, no activation] -> y
//   B = kiln.FusedConv(X2, W2, B2?, y) [int8, activation]
//   =>  kiln.FusedConvPair(X, W, B?, X2, W2, B2?)  (B's activation, B's output)
// with A's convolution attributes unprefixed and B's prefixed "conv2_". This is ResNet's first
// block of a stage: the block's last 1x1 conv (A) and the downsample (B: fuse_residual_add gave
// the Add to the later conv) summed before the ReLU. As one layer, y (a full-size activation that
// B reads back in INT8) is never written: the sum of the two int32-accumulated convolutions is
// formed in float and only the activated result is stored.
//
// An INT8 pass (pipeline.cpp's kInt8Pipeline): it needs to know which layers run in INT8, so it
// runs after quant::mark_int8_layers, on the marked graph with its scales. --layer-precisions
// and --accuracy-budget pins name the layers before pairing: a layer pinned to float is not INT8
// and does not pair; the pair is named after A (replace_with_layer names it after the group's
// first node), so a later pin of that name moves A back to float, and B then runs alone.
//
// Only where the target backend has a kernel for this very layer: the capability query gets the
// would-be layer (scratch_layer, with the inputs' scales), as its kernels take only some shapes
// (cuda's: both convolutions 1x1); the CPU backend never asks for it (its reference kernel is
// what other backends are checked against).
#include "passes/passes.h"
#include "quant/int8.h"

namespace kiln::passes {
namespace {

// A's and B's attributes that belong to the layer as a whole, not to one convolution.
bool layer_attr(const std::string& name) {
  return name == "int8" || name == "activation" || name.rfind("act_", 0) == 0;
}

}  // namespace

ConvPairLayer conv_pair_layer(const Node& a, const Node& b) {
  ConvPairLayer l;
  l.inputs = {a.input(0), a.input(1), a.input(2), b.input(0), b.input(1), b.input(2)};
  for (const auto& [k, v] : a.attrs.all())
    if (!layer_attr(k)) l.attrs.set(k, v);
  for (const auto& [k, v] : b.attrs.all()) l.attrs.set(layer_attr(k) ? k : "conv2_" + k, v);
  l.attrs.set("int8", Attribute::Int(1));
  return l;
}

namespace {

struct FuseConvPair {
  struct Match {
    Node* first;   // A: its output is the residual of B
    Node* second;  // B
    ConvPairLayer layer;
  };

  static std::optional<Match> match(PassContext& ctx, Node& b) {
    if (!is_kiln_op(&b, "FusedConv") || !b.input(3)) return std::nullopt;
    Value* y = b.input(3);
    Node* a = y->producer;
    if (!is_kiln_op(a, "FusedConv")) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} + {}: {}", a->label(), b.label(), why));
      return std::nullopt;
    };
    if (!quant::runs_int8(*a)) return reject("the first convolution does not run in INT8");
    if (!quant::runs_int8(b)) return reject("the second convolution does not run in INT8");
    if (a->input(3)) return reject("the first convolution adds a residual");
    if (!a->attrs.get_string("activation", "").empty())
      return reject("the first convolution has an activation");
    if (!single_use(ctx.g, y))
      return reject("the first convolution's output has another consumer or is a graph output");
    Value* out = b.output(0);
    if (y->type.rank() != 4 || !out || out->type.rank() != 4 || !b.input(0) ||
        b.input(0)->type.rank() != 4)
      return reject("not 2-D convolutions");
    if (!same_dims(y->type, out->type))
      return reject("the two convolutions' outputs differ in shape");
    ConvPairLayer l = conv_pair_layer(*a, b);
    auto layer = scratch_layer("kiln", "FusedConvPair", l.inputs, l.attrs, out);
    if (!ctx.backend_supports("kiln", "FusedConvPair", l.attrs, out->type.dtype, layer->nodes()[0]))
      return std::nullopt;
    return Match{a, &b, std::move(l)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, {m.first, m.second}, "kiln", "FusedConvPair", m.layer.inputs,
                              m.layer.attrs, m.second->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_conv_pair(PassContext& ctx) { return apply_pattern<FuseConvPair>(ctx); }

}  // namespace kiln::passes
