// LRN (AlexNet, GoogLeNet, CaffeNet) with a static channel count becomes ops every backend runs:
//   LRN(x [N, C, ...]; size, alpha, beta, bias)  =>
//     z = x * sqrt(alpha / size); s = Conv(z * z, band W [C, C, 1, ...]);  y = x / (bias + s)^beta
// W[o, i] = 1 for the channels i in o's window. Scaling before squaring keeps z * z within
// float16 for activations float16 holds (an FP16 build).
#include <fmt/format.h>

#include <cmath>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct LrnToConv {
  struct Match {
    Node* n = nullptr;
    int64_t channels = 0, rank = 0;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "LRN")) return std::nullopt;
    const Value* x = n.input(0);
    if (!x || !is_float_type(x->type.dtype) || x->type.rank() < 3 || !(*x->type.dims)[1].is_static() ||
        n.attrs.get_int("size", 0) < 1) {
      ctx.note(fmt::format("{}: not a float [N, C, ...] input with a static channel count", n.label()));
      return std::nullopt;
    }
    return Match{&n, (*x->type.dims)[1].value, x->type.rank()};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node& n = *m.n;
    const std::string base = n.name;
    const DataType dt = n.input(0)->type.dtype;
    const int64_t size = n.attrs.get_int("size", 1), lo = (size - 1) / 2, hi = size - 1 - lo;
    const double alpha = n.attrs.get_float("alpha", 1e-4f), beta = n.attrs.get_float("beta", 0.75f),
                 bias = n.attrs.get_float("bias", 1.0f);
    auto scalar = [&](const char* what, double v) {
      return g.add_constant(g.unique_name(base + "/" + what), Tensor::scalar<double>(v).cast(dt));
    };
    auto add = [&](const char* op, std::vector<Value*> ins, const char* what) {
      Node* p = g.insert_node_before(&n, op, g.unique_name(base + "/" + what), ins,
                                     {g.unique_name(base + "/" + what)});
      p->origin = ctx.pass;
      merge_onnx_nodes(*p, n);
      return p;
    };
    Value* x = n.input(0);
    Value* z = add("Mul", {x, scalar("scale", std::sqrt(alpha / static_cast<double>(size)))}, "scaled")->output(0);
    Value* sq = add("Mul", {z, z}, "squares")->output(0);
    std::vector<int64_t> wshape = {m.channels, m.channels};
    wshape.resize(static_cast<size_t>(m.rank), 1);
    Tensor w(DataType::kFloat64, wshape);
    double* p = w.data<double>();
    for (int64_t o = 0; o < m.channels; ++o)
      for (int64_t i = 0; i < m.channels; ++i) p[o * m.channels + i] = i >= o - lo && i <= o + hi ? 1.0 : 0.0;
    Value* band = g.add_constant(g.unique_name(base + "/window"), w.cast(dt));
    Value* s = add("Conv", {sq, band}, "window_sums")->output(0);
    Value* d = add("Pow", {add("Add", {s, scalar("bias", bias)}, "biased")->output(0), scalar("beta", beta)},
                   "denominator")->output(0);
    Node* div = g.insert_node_before(&n, "Div", g.unique_name(base + "/normalized"), {x, d}, {});
    div->origin = ctx.pass;
    merge_onnx_nodes(*div, n);
    Value* out = n.output(0);  // its name and a graph output's place stay
    KILN_RETURN_IF_ERROR(g.remove_node(&n, /*force=*/true));
    g.set_node_output(div, 0, out);
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> lrn_to_conv(PassContext& ctx) { return apply_pattern<LrnToConv>(ctx); }

}  // namespace kiln::passes
