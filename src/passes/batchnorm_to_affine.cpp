// A BatchNormalization that no producer took (fold_batchnorm) is a per-channel affine map:
//   BatchNormalization(x [N, C, ...], scale, B, mean, var)  =>  Add(Mul(x, s), t)
// with s = scale / sqrt(var + eps) and t = B - mean * s as constants of shape [C, 1, ...] (the
// channel axis broadcast over the rest). As elementwise ops it joins the chains around it
// (fuse_elementwise): DenseNet's and FastViT's BatchNorm -> ReLU in front of a convolution, a
// RepVGG identity branch, run as one layer where they were two. Inference mode with constant
// parameters only, per-channel statistics (not spatial=0), float x.
#include <cmath>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct BatchNormToAffine {
  struct Match {
    Node* bn;
  };

  static std::optional<Match> match(PassContext& ctx, Node& bn) {
    if (!is_op(&bn, "BatchNormalization")) return std::nullopt;
    auto reject = [&](const char* why) {
      ctx.note(fmt::format("{}: {}", bn.label(), why));
      return std::nullopt;
    };
    const Value* x = bn.input(0);
    if (!x || !x->type.has_rank() || x->type.rank() < 2 || !is_float_type(x->type.dtype))
      return reject("X is not a float tensor of rank >= 2");
    if (bn.attrs.get_int("training_mode", 0) != 0) return reject("training mode");
    if (bn.attrs.get_int("kiln_per_activation", 0) != 0) return reject("per-activation statistics");
    for (size_t i = 1; i <= 4; ++i)
      if (!bn.input(i) || !bn.input(i)->is_constant()) return reject("parameters are not constant");
    for (size_t i = 1; i < bn.num_outputs(); ++i)
      if (bn.output(i) && (!bn.output(i)->uses().empty() || ctx.g.is_graph_output(bn.output(i))))
        return reject("running statistics are used");
    const int64_t c = bn.input(1)->constant->numel();
    for (size_t i = 2; i <= 4; ++i)
      if (bn.input(i)->constant->numel() != c) return reject("parameter sizes differ");
    const Dim& ch = (*x->type.dims)[1];
    if (ch.is_static() && ch.value != c) return reject("channel count differs");
    return Match{&bn};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& bn = *m.bn;
    Graph& g = ctx.g;
    const double eps = bn.attrs.get_float("epsilon", 1e-5f);
    const Tensor& scale = *bn.input(1)->constant;
    const int64_t c = scale.numel();
    std::vector<double> s(static_cast<size_t>(c)), t(static_cast<size_t>(c));
    for (int64_t k = 0; k < c; ++k) {
      const size_t i = static_cast<size_t>(k);
      s[i] = scale.at_double(k) / std::sqrt(bn.input(4)->constant->at_double(k) + eps);
      t[i] = bn.input(2)->constant->at_double(k) - bn.input(3)->constant->at_double(k) * s[i];
    }
    std::vector<int64_t> shape(static_cast<size_t>(bn.input(0)->type.rank() - 1), 1);
    shape[0] = c;
    const DataType dt = bn.input(0)->type.dtype;
    Value* sv =
        g.add_constant(g.unique_name(bn.name + "_scale"), Tensor::from<double>(shape, s).cast(dt));
    Value* tv =
        g.add_constant(g.unique_name(bn.name + "_shift"), Tensor::from<double>(shape, t).cast(dt));
    const std::string mul_name = g.unique_name(bn.name + "_mul");
    Node* mul = g.insert_node_before(&bn, "Mul", mul_name, {bn.input(0), sv}, {mul_name});
    mul->output(0)->type = bn.output(0)->type;
    mul->origin = ctx.pass;
    mul->onnx_nodes = bn.onnx_nodes;
    KILN_ASSIGN_OR_RETURN(Node * add, replace_with_layer(ctx, {&bn}, "", "Add",
                                                         {mul->output(0), tv}, {}, bn.output(0)));
    (void)add;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> batchnorm_to_affine(PassContext& ctx) {
  return apply_pattern<BatchNormToAffine>(ctx);
}

}  // namespace kiln::passes
