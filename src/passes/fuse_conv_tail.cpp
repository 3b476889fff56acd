// An elementwise op with a scalar constant after a convolution joins the convolution's epilogue
// as a post step (ops/fused.h):
//   Conv|kiln.FusedConv(...) -> op(., c)  =>  kiln.FusedConv(..., post_ops += op, post_values += c)
// op: post_op_supported (Add, Sub, Mul, Div, Pow, Max, Min with a scalar constant, second for
// Sub, Div and Pow, either side for the others; the unary Relu, Sigmoid, Tanh, Neg, Abs, Exp,
// Sqrt, Erf). Applied again, a tail of several such ops joins step by step: MetaFormer's
// StarReLU, s * relu(x)^2 + b with learned scalars s and b, after a bias-free 1x1 convolution
// (the ReLU is the layer's activation, fuse_conv_act), or NFNet's gain after its activation.
// Without it the tail is an elementwise layer that reads and writes the convolution's whole
// output once more. Only on the cuda backend (on the CPU nothing is saved), never in INT8 builds
// (whose epilogues are kiln's INT8 arithmetic), and only where the backend has a tactic for the
// very layer (cuDNN's graph API computes the steps in its fused epilogue; the cuBLASLt 1x1
// tactic runs them as a pass over its output, so the tuner keeps the faster).
#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct FuseConvTail {
  struct Match {
    Node* conv;
    Node* op;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& op) {
    if (!op.domain.empty() || !post_op_supported(op.op_type) || !op.output(0) ||
        op.num_outputs() != 1)
      return std::nullopt;
    const bool binary = post_op_binary(op.op_type);
    if (op.num_inputs() != (binary ? 2u : 1u)) return std::nullopt;
    // Which input is the convolution's output: the first, or for a commutative op either.
    const bool commutative = op.op_type == "Add" || op.op_type == "Mul" || op.op_type == "Max" ||
                             op.op_type == "Min";
    int xi = 0;
    if (binary && commutative && op.input(1) && op.input(1)->producer &&
        !(op.input(0) && op.input(0)->producer))
      xi = 1;
    Value* y = op.input(xi);
    Node* conv = y ? y->producer : nullptr;
    if (!is_op(conv, "Conv") && !is_kiln_op(conv, "FusedConv")) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", conv->label(), op.label(), why));
      return std::nullopt;
    };
    if (ctx.opts.backend != "cuda") return reject("only the cuda backend computes post steps");
    if (ctx.opts.precision == "int8") return reject("INT8 builds keep the op a layer");
    if (!single_use(ctx.g, y)) return reject("the convolution's output has another consumer");
    if (!is_float_type(y->type.dtype) || y->type.rank() != 4) return reject("not a 2-D float map");
    if (!same_dims(op.output(0)->type, y->type) || op.output(0)->type.dtype != y->type.dtype)
      return reject("the op changes the shape or type");
    Attributes a = conv->attrs;
    auto ops = a.get_strings("post_ops");
    auto values = a.get_floats("post_values");
    float value = 0.f;
    if (binary) {
      const auto c = scalar_const(op.input(1 - xi));
      if (!c) return reject("the other operand is not a scalar constant");
      value = static_cast<float>(*c);
    }
    if (ops.size() >= 8) return reject("eight post steps already");
    ops.push_back(op.op_type);
    values.push_back(value);
    a.set("post_ops", Attribute::Strings(ops));
    a.set("post_values", Attribute::Floats(values));
    auto layer = scratch_layer("kiln", "FusedConv", conv->inputs(), a, op.output(0));
    if (!ctx.backend_supports("kiln", "FusedConv", a, y->type.dtype, layer->nodes()[0]))
      return reject("the backend has no kernel for this layer with its post steps");
    return Match{conv, &op, std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    std::vector<Value*> ins(m.conv->inputs().begin(), m.conv->inputs().end());
    return replace_with_layer(ctx, {m.conv, m.op}, "kiln", "FusedConv", ins, m.attrs,
                              m.op->output(0))
        .status();
  }
};

}  // namespace

Expected<bool> fuse_conv_tail(PassContext& ctx) { return apply_pattern<FuseConvTail>(ctx); }

}  // namespace kiln::passes
