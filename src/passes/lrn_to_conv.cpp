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
    if (!x || !is_float_type(x->type.dtype) || x->type.rank() < 3 ||
        !(*x->type.dims)[1].is_static() || n.attrs.get_int("size", 0) < 1) {
      ctx.note(
          fmt::format("{}: not a float [N, C, ...] input with a static channel count", n.label()));
      return std::nullopt;
    }
    return Match{&n, (*x->type.dims)[1].value, x->type.rank()};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    const int64_t size = n.attrs.get_int("size", 1), lo = (size - 1) / 2, hi = size - 1 - lo;
    const double alpha = n.attrs.get_float("alpha", 1e-4f), beta = n.attrs.get_float("beta", 0.75f),
                 bias = n.attrs.get_float("bias", 1.0f);
    auto scalar = [&](const char* what, double v) {
      return r.constant(what, Tensor::scalar<double>(v).cast(dt));
    };
    Value* x = n.input(0);
    Value* z = r.add_value(
        "Mul", {x, scalar("scale", std::sqrt(alpha / static_cast<double>(size)))}, "scaled");
    Value* sq = r.add_value("Mul", {z, z}, "squares");
    std::vector<int64_t> wshape = {m.channels, m.channels};
    wshape.resize(static_cast<size_t>(m.rank), 1);
    Tensor w(DataType::kFloat64, wshape);
    double* p = w.data<double>();
    for (int64_t o = 0; o < m.channels; ++o)
      for (int64_t i = 0; i < m.channels; ++i)
        p[o * m.channels + i] = i >= o - lo && i <= o + hi ? 1.0 : 0.0;
    Value* s = r.add_value("Conv", {sq, r.constant("window", w.cast(dt))}, "window_sums");
    Value* d = r.add_value(
        "Pow", {r.add_value("Add", {s, scalar("bias", bias)}, "biased"), scalar("beta", beta)},
        "denominator");
    return r.finish(r.add("Div", {x, d}, "normalized", 0));
  }
};

}  // namespace

Expected<bool> lrn_to_conv(PassContext& ctx) { return apply_pattern<LrnToConv>(ctx); }

}  // namespace kiln::passes
