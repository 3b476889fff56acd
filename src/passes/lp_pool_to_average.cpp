// LpPool and GlobalLpPool are sums of |x|^p, which every backend's pooling and reductions run:
//   LpPool(x; p, kernel, strides, dilations, pads/auto_pad, ceil_mode)  [static spatial dims]  =>
//     (AveragePool(|x|^p; explicit pads, count_include_pad 1) * kernel area)^(1/p)
//   GlobalLpPool(x; p)  =>  ReduceSum(|x|^p, spatial axes, keepdims 1)^(1/p)
// |x|^p is Abs for p = 1 and x * x for p = 2, the root nothing and Sqrt. The end pads are
// widened (or narrowed) to exactly what the last window reaches, so ceil_mode and SAME windows
// all count the whole kernel area and the average times that area is the window's sum.
#include <fmt/format.h>

#include "ops/conv_util.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct LpPoolToAverage {
  struct Match {
    Node* n = nullptr;
    double p = 2;
    int64_t rank = 0;
    WindowAttrs a;
    std::vector<int64_t> pads;  // explicit begins then ends (LpPool)
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    const bool global = is_op(&n, "GlobalLpPool");
    if (!global && !is_op(&n, "LpPool")) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value* x = n.input(0);
    if (!x || !is_float_type(x->type.dtype) || !x->type.has_rank() || x->type.rank() < 2)
      return why("not a float input of known rank");
    Match m;
    m.n = &n;
    m.rank = x->type.rank();
    const Attribute* pa = n.attrs.find("p");
    m.p = !pa ? 2.0 : pa->kind == Attribute::Kind::kFloat ? pa->f : static_cast<double>(pa->i);
    if (!(m.p >= 1.0) || m.p > 1e6) return why("p is below 1 (the op says why)");
    if (global) return m;
    if (m.rank < 3 || !n.attrs.has("kernel_shape"))
      return why("not [N, C, spatial...] with a kernel");
    const size_t nsp = static_cast<size_t>(m.rank - 2);
    auto a = read_window_attrs(n, nsp, {});
    if (!a.ok()) return why("bad window attributes (the op says why)");
    m.a = *a;
    std::vector<int64_t> ends;
    for (size_t d = 0; d < nsp; ++d) {
      const Dim& in = (*x->type.dims)[d + 2];
      if (!in.is_static()) return why("a spatial size is not static");
      auto g = resolve_window_axis(m.a, d, in.value, true, n);
      if (!g.ok()) return why("the window does not fit (the op says why)");
      const int64_t dk = (m.a.kernel[d] - 1) * m.a.dilations[d] + 1;
      m.pads.push_back(g->pad_begin);
      ends.push_back(
          std::max<int64_t>(0, (g->out - 1) * m.a.strides[d] + dk - in.value - g->pad_begin));
    }
    m.pads.insert(m.pads.end(), ends.begin(), ends.end());
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    auto scalar = [&](const char* what, double v) {
      return r.constant(what, Tensor::scalar<double>(v).cast(dt));
    };
    Value* x = n.input(0);
    Value* t =
        m.p == 2.0 ? r.add_value("Mul", {x, x}, "squares") : r.add_value("Abs", {x}, "magnitudes");
    if (m.p != 1.0 && m.p != 2.0) t = r.add_value("Pow", {t, scalar("p", m.p)}, "powers");
    const bool last = m.p == 1.0;  // the sum is the result
    Node* sum = nullptr;
    if (n.op_type == "GlobalLpPool") {
      std::vector<int64_t> axes;
      for (int64_t d = 2; d < m.rank; ++d) axes.push_back(d);
      if (axes.empty()) {  // [N, C]: each window is one element
        sum = r.add("Identity", {t}, "sums", last ? 0 : 1);
      } else {
        sum = r.add("ReduceSum",
                    {t, r.constant("axes", Tensor::from<int64_t>(
                                               {static_cast<int64_t>(axes.size())}, axes))},
                    "sums", last ? 0 : 1);
        sum->attrs.set("keepdims", Attribute::Int(1));
      }
    } else {
      Node* avg = r.add("AveragePool", {t}, "averages");
      avg->attrs.set("kernel_shape", Attribute::Ints(m.a.kernel));
      avg->attrs.set("strides", Attribute::Ints(m.a.strides));
      avg->attrs.set("dilations", Attribute::Ints(m.a.dilations));
      avg->attrs.set("pads", Attribute::Ints(m.pads));
      avg->attrs.set("count_include_pad", Attribute::Int(1));
      int64_t area = 1;
      for (int64_t k : m.a.kernel) area *= k;
      sum = r.add("Mul", {avg->output(0), scalar("area", static_cast<double>(area))}, "sums",
                  last ? 0 : 1);
    }
    if (last) return r.finish(sum);
    if (m.p == 2.0) return r.finish(r.add("Sqrt", {sum->output(0)}, "norms", 0));
    return r.finish(r.add("Pow", {sum->output(0), scalar("root", 1.0 / m.p)}, "norms", 0));
  }
};

}  // namespace

Expected<bool> lp_pool_to_average(PassContext& ctx) { return apply_pattern<LpPoolToAverage>(ctx); }

}  // namespace kiln::passes
