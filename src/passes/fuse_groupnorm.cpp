// GroupNormalization recognised from the form PyTorch's TorchScript exporter writes for
// nn.GroupNorm (before opset 18 ONNX had no GroupNormalization):
//   r = Reshape(x [N, C, ...], [N, G, -1]); n = InstanceNormalization(r, ones[G], zeros[G], eps);
//   y = Reshape(n, x's shape); [y * g[C, 1, ...]] [+ b[C, 1, ...]]
//     =>  GroupNormalization(x, g, b, num_groups = G, epsilon = eps)   (opset 21: per channel)
// (PoolFormer, ConvFormer, BiT's ResNetV2; torchvision's FCOS and RetinaNet v2 heads, whose
// batch dim the view back reads from Shape(x)). One layer with the affine fused where there were an
// instance norm over a view and an elementwise chain after it. g and b constants of C values
// (a missing g becomes ones, a missing b zeros); every intermediate read inside the pattern only.
#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool all_equal(const Tensor& t, double v) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.at_double(i) != v) return false;
  return true;
}

struct FuseGroupNorm {
  struct Match {
    std::vector<Node*> nodes;
    Value* x;
    Value* out;
    Tensor scale, bias;
    int64_t groups;
    float eps;
  };

  static std::optional<Match> match(PassContext& ctx, Node& in) {
    if (!is_op(&in, "InstanceNormalization") || !in.input(0)) return std::nullopt;
    Node* r1 = producer_if(in.input(0), "Reshape");
    Node* r2 = sole_consumer(ctx.g, in.output(0));
    if (!r1 || !is_op(r2, "Reshape") || !r1->input(0)) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("GroupNorm pattern at {}: {}", in.label(), why));
      return std::nullopt;
    };
    Value* x = r1->input(0);
    const TensorType &xt = x->type, &rt = in.input(0)->type;
    if (!xt.dims || xt.dims->size() < 3 || !rt.dims || rt.dims->size() != 3 ||
        !is_float_type(xt.dtype))
      return reject("not a float [N, C, ...] tensor viewed as [N, G, -1]");
    const Dim &c = (*xt.dims)[1], &g = (*rt.dims)[1];
    if (!c.is_static() || !g.is_static() || g.value < 1 || c.value % g.value != 0 ||
        !((*xt.dims)[0] == (*rt.dims)[0]))
      return reject("the view does not split the channels into groups");
    // Viewed back as x: the dims provably x's, or the target x's own Shape (a detector head's
    // batch dim is unknown until later rounds, and its dims cannot be compared before then).
    const Node* target = r2->num_inputs() > 1 ? producer_if(r2->input(1), "Shape") : nullptr;
    const bool own_shape = target && target->input(0) == x &&
                           target->attrs.get_int("start", 0) == 0 && !target->attrs.has("end");
    if (!own_shape && !same_dims(r2->output(0)->type, xt))
      return reject("the result is not viewed back as x");
    const Value *s = in.input(1), *b = in.input(2);
    if (!s || !b || !s->is_constant() || !b->is_constant() || !all_equal(*s->constant, 1.0) ||
        !all_equal(*b->constant, 0.0))
      return reject("the instance norm has its own scale or bias");
    std::vector<int64_t> norm = {c.value};
    for (size_t i = 2; i < xt.dims->size(); ++i) norm.push_back(1);
    std::vector<Node*> nodes = {r1, &in, r2};
    Value* out = r2->output(0);
    std::optional<Tensor> scale = absorb_affine(ctx.g, "Mul", norm, nodes, out);
    std::optional<Tensor> bias = absorb_affine(ctx.g, "Add", norm, nodes, out);
    if (!group_is_closed(ctx.g, nodes, out))
      return reject("an intermediate has another consumer");
    const std::vector<int64_t> flat = {c.value};
    Tensor sc = scale ? *scale->reshaped(flat) : ones(flat, xt.dtype);
    Tensor bi = bias ? *bias->reshaped(flat)
                     : Tensor::from<float>(flat, std::vector<float>(size_t(c.value), 0.f))
                           .cast(xt.dtype);
    if (sc.dtype() != xt.dtype || bi.dtype() != xt.dtype) return reject("parameter types differ");
    Attributes a;
    a.set("num_groups", Attribute::Int(g.value));
    if (!ctx.backend_supports("", "GroupNormalization", a, xt.dtype)) return std::nullopt;
    return Match{nodes, x, out, std::move(sc), std::move(bi), g.value,
                 in.attrs.get_float("epsilon", 1e-5f)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Attributes a;
    a.set("num_groups", Attribute::Int(m.groups));
    a.set("epsilon", Attribute::Float(m.eps));
    const std::string base = m.nodes[1]->name;
    std::vector<Value*> ins = {m.x, g.add_constant(g.unique_name(base + "_scale"), m.scale),
                               g.add_constant(g.unique_name(base + "_bias"), m.bias)};
    return replace_with_layer(ctx, m.nodes, "", "GroupNormalization", ins, std::move(a), m.out)
        .status();
  }
};

}  // namespace

Expected<bool> fuse_groupnorm(PassContext& ctx) { return apply_pattern<FuseGroupNorm>(ctx); }

}  // namespace kiln::passes
