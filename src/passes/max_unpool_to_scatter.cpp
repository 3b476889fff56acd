// MaxUnpool (SegNet-style decoders, MaxPool's partial inverse) is a scatter of the values into
// zeros at MaxPool's flat indices:
//   MaxUnpool(X [static], I[, output_shape])  =>  s = the unpooled shape (a constant);
//     z = Reshape(ScatterElements(Reshape(Expand(0, s), [-1]), Reshape(I, [-1]),
//     Reshape(X, [-1]), axis 0), s);  with output_shape: Pad(z, [0..., output_shape - s])
// so the GPU runs it on its movement layers. Two invalid inputs the CPU op refuses pass here: an
// index below 0 wraps (ScatterElements takes -size..size-1) and an output_shape computed at run
// time below s crops (Pad's negative pads; a constant one leaves the op as it is).
#include <fmt/format.h>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct MaxUnpoolToScatter {
  struct Match {
    Node* n = nullptr;
    std::vector<int64_t> inferred;  // N, C and the unpooled spatial sizes
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "MaxUnpool")) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value *x = n.input(0), *ind = n.input(1), *s = n.input(2);
    if (!x || !is_float_type(x->type.dtype) || !x->type.is_static() || x->type.rank() < 3 || !ind ||
        ind->type.dtype != DataType::kInt64)
      return why("not a float X of static shape (rank >= 3) and int64 indices");
    if (s && s->type.dtype != DataType::kInt64) return why("output_shape is not int64");
    const size_t nsp = static_cast<size_t>(x->type.rank() - 2);
    const auto k = n.attrs.get_ints("kernel_shape");
    auto st = n.attrs.get_ints("strides"), p = n.attrs.get_ints("pads");
    if (st.empty()) st.assign(nsp, 1);
    if (p.empty()) p.assign(2 * nsp, 0);
    if (k.size() != nsp || st.size() != nsp || p.size() != 2 * nsp)
      return why("kernel_shape, strides or pads do not match X's rank (the op says why)");
    Match m{&n, {(*x->type.dims)[0].value, (*x->type.dims)[1].value}};
    for (size_t d = 0; d < nsp; ++d) {
      const int64_t o = ((*x->type.dims)[d + 2].value - 1) * st[d] + k[d] - p[d] - p[nsp + d];
      if (o < 0) return why("a spatial size unpools to below 0 (the op says why)");
      m.inferred.push_back(o);
    }
    if (s && s->constant) {  // a constant output_shape below s: the op's error, not a crop
      const std::vector<int64_t> want = s->constant->to_int64_vector();
      if (want.size() != m.inferred.size()) return why("output_shape has another rank");
      for (size_t d = 0; d < want.size(); ++d)
        if (want[d] < m.inferred[d]) return why("output_shape is below the unpooled shape");
    }
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    const int64_t rank = static_cast<int64_t>(m.inferred.size());
    Value* inferred = r.constant("inferred", Tensor::from<int64_t>({rank}, m.inferred));
    Value* flat = r.constant("flat", Tensor::from<int64_t>({1}, {-1}));
    Value* zero = r.constant("zero", Tensor::scalar<double>(0.0).cast(dt));
    Value* zeros = r.add_value("Expand", {zero, inferred}, "zeros");
    Value* data = r.add_value("Reshape", {zeros, flat}, "zeros_flat");
    Value* idx = r.add_value("Reshape", {n.input(1), flat}, "indices_flat");
    Value* upd = r.add_value("Reshape", {n.input(0), flat}, "values_flat");
    Node* sc = r.add("ScatterElements", {data, idx, upd}, "scattered");
    sc->attrs.set("axis", Attribute::Int(0));
    if (!n.input(2)) return r.finish(r.add("Reshape", {sc->output(0), inferred}, "unpooled", 0));
    // output_shape: the unpooled tensor at the start of a zero tensor of that shape.
    Value* z = r.add_value("Reshape", {sc->output(0), inferred}, "unpooled");
    Value* extra = r.add_value("Sub", {n.input(2), inferred}, "extra");
    Value* begins = r.constant(
        "begins", Tensor::from<int64_t>({rank}, std::vector<int64_t>(m.inferred.size(), 0)));
    Node* pads = r.add("Concat", {begins, extra}, "pads");
    pads->attrs.set("axis", Attribute::Int(0));
    return r.finish(r.add("Pad", {z, pads->output(0)}, "padded", 0));
  }
};

}  // namespace

Expected<bool> max_unpool_to_scatter(PassContext& ctx) {
  return apply_pattern<MaxUnpoolToScatter>(ctx);
}

}  // namespace kiln::passes
