// A GroupNorm takes the elementwise work next to it that its kernel can do while it passes over
// the data anyway (one read for the statistics, one read and one write to normalize):
//   GroupNormalization(x, s, b) -> Act
//       =>  kiln.FusedGroupNorm(x, s, b)[activation = Act]
//   Add(x, t) -> GroupNormalization | kiln.FusedGroupNorm(., s, b)
//       =>  kiln.FusedGroupNorm(x, s, b, t)
// Act: any activation fused layers apply (SiLU as fuse_swish makes it: every GroupNorm of a
// diffusion UNet or VAE, and of GroupNorm CNNs, is followed by one). t: a term per image and
// channel, [N or 1, C or 1, 1, ...] (a diffusion UNet's timestep embedding, added to each ResNet
// block's first convolution before its second norm); x of the norm's input shape. The
// intermediate is read by the pattern only; scale and bias per channel (not the opset-18 per-group
// form). Asked with the would-be layer: on the cuda backend kiln's NHWC GroupNorm kernel
// (FP16) takes it, so convolutions and their norms stay channels-last with nothing between them.
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// A norm these patterns extend: an opset-21 GroupNormalization, or a FusedGroupNorm without
// `what` yet ("activation" or "addend").
bool extendable(const Node* n, const char* what) {
  if (is_op(n, "GroupNormalization")) return n->attrs.get_int("kiln_per_group", 0) == 0;
  if (!is_kiln_op(n, "FusedGroupNorm")) return false;
  if (std::string(what) == "activation") return !n->attrs.has("activation");
  return n->num_inputs() < 4 || !n->input(3);
}

Attributes base_attrs(const Node& norm) {
  if (norm.domain == "kiln") return norm.attrs;
  Attributes a;
  a.set("num_groups", Attribute::Int(norm.attrs.get_int("num_groups", 0)));
  a.set("epsilon", Attribute::Float(norm.attrs.get_float("epsilon", 1e-5f)));
  return a;
}

struct Match {
  std::vector<Node*> nodes;
  std::vector<Value*> inputs;
  Attributes attrs;
  Value* out;
};

bool ask(PassContext& ctx, const Match& m) {
  auto scratch = scratch_layer("kiln", "FusedGroupNorm", m.inputs, m.attrs, m.out);
  return ctx.backend_supports("kiln", "FusedGroupNorm", m.attrs, m.out->type.dtype,
                              scratch->nodes().back());
}

struct NormAct {
  using Match = passes::Match;
  static std::optional<Match> match(PassContext& ctx, Node& act) {
    if (!act.domain.empty() || !fused_activation_supported(act.op_type) || !act.input(0))
      return std::nullopt;
    Node* norm = act.input(0)->producer;
    if (!extendable(norm, "activation")) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", norm->label(), act.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, act.input(0)))
      return reject("the norm's output has another consumer or is a graph output");
    Match m{{norm, &act}, {norm->inputs().begin(), norm->inputs().end()}, base_attrs(*norm),
            act.output(0)};
    std::string why;
    if (!activation_attrs(act, m.attrs, &why)) return reject(why);
    if (!ask(ctx, m)) return reject("the backend has no kernel for the norm with its activation");
    return m;
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, m.nodes, "kiln", "FusedGroupNorm", m.inputs, m.attrs, m.out)
        .status();
  }
};

// Whether t adds one value per image and channel to x [N, C, d...]: right-aligned, its spatial
// dims 1, its channel dim C or 1, its batch dim x's or 1.
bool per_image_channel(const TensorType& t, const TensorType& x) {
  if (!t.dims || !x.dims || t.rank() > x.rank() || x.rank() < 3) return false;
  const int64_t off = x.rank() - t.rank();
  for (int64_t i = 0; i < t.rank(); ++i) {
    const Dim &d = (*t.dims)[i], &xd = (*x.dims)[off + i];
    const bool one = d.is_static() && d.value == 1;
    if (off + i >= 2 && !one) return false;
    if (off + i < 2 && !one && !(d == xd)) return false;
  }
  return true;
}

struct NormAddend {
  using Match = passes::Match;
  static std::optional<Match> match(PassContext& ctx, Node& norm) {
    if (!extendable(&norm, "addend") || !norm.input(0)) return std::nullopt;
    Node* add = producer_if(norm.input(0), "Add");
    if (!add || !add->input(0) || !add->input(1)) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", add->label(), norm.label(), why));
      return std::nullopt;
    };
    if (!single_use(ctx.g, norm.input(0)))
      return reject("the sum has another consumer or is a graph output");
    const TensorType& s = norm.input(0)->type;
    Value *x = nullptr, *t = nullptr;
    for (int k = 0; k < 2 && !x; ++k) {
      Value *a = add->input(k), *b = add->input(1 - k);
      if (same_dims(a->type, s) && a->type.dtype == s.dtype && b->type.dtype == s.dtype &&
          per_image_channel(b->type, s))
        x = a, t = b;
    }
    if (!x) return reject("no operand is one value per image and channel");
    std::vector<Value*> ins = {x, norm.input(1), norm.input(2), t};
    Match m{{add, &norm}, ins, base_attrs(norm), norm.output(0)};
    if (!ask(ctx, m)) return reject("the backend has no kernel for the norm with an addend");
    return m;
  }
  static Status rewrite(PassContext& ctx, const Match& m) {
    return replace_with_layer(ctx, m.nodes, "kiln", "FusedGroupNorm", m.inputs, m.attrs, m.out)
        .status();
  }
};

}  // namespace

Expected<bool> fuse_groupnorm_act(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool act, apply_pattern<NormAct>(ctx));
  KILN_ASSIGN_OR_RETURN(bool addend, apply_pattern<NormAddend>(ctx));
  return act || addend;
}

}  // namespace kiln::passes
