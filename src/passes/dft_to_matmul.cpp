// A DFT or STFT of static sizes is a product with a constant basis (ops/spectral_math.h), which
// every backend runs on its GEMMs and convolutions instead of a spectral kernel of its own:
//   DFT(x [.., L, .., cin])  =>  Slice to the samples read -> Transpose the signal axis next to
//     the parts -> Reshape [.., used * cin] -> MatMul(basis [used * cin, out * cout]) ->
//     Reshape [.., out, cout] -> Transpose back
//   STFT(x [B, L, cin], step, window) with the window as long as a frame  =>  Transpose
//     [B, cin, L] -> Conv(basis * window [out * 2, cin, frame], stride step) -> Reshape
//     [B, out, 2, frames] -> Transpose [B, frames, out, 2]
// (FNet's token mixing, in-graph spectrograms.) Not taken: dynamic sizes, or a basis over
// kMaxBasis elements (a long transform; the op runs as itself there).
#include <fmt/format.h>

#include <numeric>

#include "ops/spectral_math.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr int64_t kMaxBasis = int64_t{1} << 22;  // 16 MB at float32

std::optional<int64_t> const_int(const Value* v) {
  if (!v || !v->constant || v->constant->numel() != 1 || !dtype_is_integer(v->constant->dtype()))
    return std::nullopt;
  return v->constant->at_int(0);
}

// The basis [used * cin, out * cout] (row j * cin + c, column k * cout + o), each sample's row
// scaled by `window` (STFT's; empty: none), in `dt`.
Tensor basis(const spectral::DftSpec& s, const std::vector<double>& window, DataType dt) {
  Tensor b(DataType::kFloat64, {s.used * s.cin, s.out_len * s.cout});
  double* p = b.data<double>();
  for (int64_t j = 0; j < s.used; ++j)
    for (int64_t k = 0; k < s.out_len; ++k) {
      double c[2][2];
      spectral::dft_coef(s, j, k, c);
      const double w = window.empty() ? 1.0 : window[static_cast<size_t>(j)];
      for (int64_t ci = 0; ci < s.cin; ++ci)
        for (int64_t o = 0; o < s.cout; ++o)
          p[(j * s.cin + ci) * s.out_len * s.cout + k * s.cout + o] = c[o][ci] * w;
    }
  return b.cast(dt);
}

struct DftToMatmul {
  struct Match {
    Node* n = nullptr;
    spectral::DftSpec s;
    std::vector<int64_t> shape;  // the input's, -1 where dynamic
    bool stft = false;
    int64_t step = 0, frames = 0;
    std::vector<double> window;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    const bool stft = is_op(&n, "STFT");
    if (!is_op(&n, "DFT") && !stft) return std::nullopt;
    auto why = [&](const std::string& w) {
      ctx.note(fmt::format("{}: {}", n.label(), w));
      return std::nullopt;
    };
    const Value* x = n.input(0);
    if (!x || !x->type.has_rank() || !is_float_type(x->type.dtype) || x->type.rank() < 2)
      return why("not a float input of known rank");
    // The dims the basis depends on must be static (the others, a batch say, may be dynamic:
    // -1 in `shape`).
    std::vector<int64_t> shape;
    for (const Dim& d : *x->type.dims) shape.push_back(d.is_static() ? d.value : -1);
    const int64_t rank = static_cast<int64_t>(shape.size()), cin = shape.back();
    if (cin != 1 && cin != 2) return why("the last dim is not 1 or 2 parts");
    Match m;
    m.n = &n;
    m.shape = shape;
    if (!stft) {
      const auto axis = n.input(2) ? const_int(n.input(2)) : std::optional<int64_t>(-2);
      const auto len = n.input(1) ? const_int(n.input(1)) : std::optional<int64_t>(0);
      if (!axis || !len) return why("axis or dft_length is not a constant");
      const int64_t a = *axis < 0 ? *axis + rank : *axis;
      if (a < 0 || a > rank - 2 || *len < 0) return why("axis or dft_length out of range");
      if (shape[static_cast<size_t>(a)] < 0) return why("the signal axis is dynamic");
      const int64_t inverse = n.attrs.get_int("inverse", 0),
                    onesided = n.attrs.get_int("onesided", 0);
      if (inverse == 1 && onesided == 1 && cin == 1)
        return why("an IRFFT of a real input (an error)");
      m.s = spectral::make_dft_spec(a, shape[static_cast<size_t>(a)], cin, *len, inverse == 1,
                                    onesided == 1);
    } else {
      const auto step = const_int(n.input(1));
      const Value* w = n.input(2);
      int64_t flen = -1;  // none given
      if (n.input(3)) {
        const auto f = const_int(n.input(3));
        if (!f) return why("frame_length is not a constant");
        flen = *f;
      }
      if (!step || *step < 1 || (w && !w->constant) || rank != 3)
        return why("frame_step or the window is not a constant");
      if (shape[1] < 0) return why("the signal's length is dynamic");
      const int64_t win = w ? w->constant->numel() : flen >= 0 ? flen : shape[1];
      if (w && w->constant->rank() != 1) return why("the window is not 1-D");
      if (flen >= 0 && flen != win) return why("the window is not as long as a frame");
      if (win < 1 || win > shape[1]) return why("the frame is longer than the signal");
      m.stft = true;
      m.step = *step;
      m.frames = 1 + (shape[1] - win) / *step;
      m.s = spectral::make_dft_spec(2, win, cin, win, false, n.attrs.get_int("onesided", 1) == 1);
      if (w) m.window = tensor_values(*w->constant);
    }
    if (m.s.n < 1 || m.s.used < 1) return why("no samples to transform");
    if (m.s.used * m.s.cin * m.s.out_len * m.s.cout > kMaxBasis)
      return why(fmt::format("a basis of {} x {} is over {} elements", m.s.used * m.s.cin,
                             m.s.out_len * m.s.cout, kMaxBasis));
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.n;
    Replacement r(ctx, n);
    const DataType dt = n.input(0)->type.dtype;
    auto add = [&](const char* op, std::vector<Value*> ins, const char* what) {
      return r.add(op, ins, what);
    };
    auto ints = [&](const char* what, std::vector<int64_t> v) {
      const auto len = static_cast<int64_t>(v.size());
      return r.constant(what, Tensor::from<int64_t>({len}, v));
    };
    auto transpose = [&](Value* v, std::vector<int64_t> perm, const char* what) {
      Node* t = add("Transpose", {v}, what);
      t->attrs.set("perm", Attribute::Ints(std::move(perm)));
      return t->output(0);
    };
    const spectral::DftSpec& s = m.s;
    Value* x = n.input(0);
    Value* y = nullptr;
    if (m.stft) {
      // [B, L, cin] -> [B, cin, L] -> Conv -> [B, out * 2, frames] -> [B, frames, out, 2]
      Value* xt = transpose(x, {0, 2, 1}, "channels");
      // [win * cin, out * 2] -> [out * 2, cin, win]
      const Tensor wd = basis(s, m.window, DataType::kFloat64);
      Tensor wc(DataType::kFloat64, {s.out_len * 2, s.cin, s.used});
      for (int64_t j = 0; j < s.used; ++j)
        for (int64_t c = 0; c < s.cin; ++c)
          for (int64_t col = 0; col < s.out_len * 2; ++col)
            wc.data<double>()[(col * s.cin + c) * s.used + j] =
                wd.data<double>()[(j * s.cin + c) * s.out_len * 2 + col];
      Value* wv = r.constant("basis", wc.cast(dt));
      Node* conv = add("Conv", {xt, wv}, "frames");
      conv->attrs.set("strides", Attribute::Ints({m.step}));
      conv->attrs.set("kernel_shape", Attribute::Ints({s.used}));
      // (0: the batch as it is, static or not)
      Value* bins =
          add("Reshape", {conv->output(0), ints("split", {0, s.out_len, 2, m.frames})}, "bins")
              ->output(0);
      y = transpose(bins, {0, 3, 1, 2}, "spectrum");
    } else {
      const int64_t rank = static_cast<int64_t>(m.shape.size());
      if (s.used < s.in_len) {
        Node* sl =
            add("Slice", {x, ints("start", {0}), ints("end", {s.used}), ints("axis", {s.axis})},
                "samples");
        x = sl->output(0);
      }
      // The signal axis next to the parts: perm keeps the other axes in order.
      // The other axes stay as they are in the Reshapes (0: copied, static or not).
      std::vector<int64_t> perm, others;
      for (int64_t i = 0; i < rank - 1; ++i)
        if (i != s.axis) perm.push_back(i), others.push_back(0);
      perm.push_back(s.axis);
      perm.push_back(rank - 1);
      const bool moved = s.axis != rank - 2;
      if (moved) x = transpose(x, perm, "signal_last");
      std::vector<int64_t> flat = others, split = others;
      flat.push_back(s.used * s.cin);
      split.push_back(s.out_len);
      split.push_back(s.cout);
      Value* rows = add("Reshape", {x, ints("rows", flat)}, "rows")->output(0);
      Value* b = r.constant("basis", basis(s, {}, dt));
      Value* prod = add("MatMul", {rows, b}, "transform")->output(0);
      y = add("Reshape", {prod, ints("bins", split)}, "bins")->output(0);
      if (moved) {
        std::vector<int64_t> inv(perm.size());
        for (size_t i = 0; i < perm.size(); ++i)
          inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
        y = transpose(y, inv, "axis_back");
      }
    }
    return r.finish(y->producer);
  }
};

}  // namespace

Expected<bool> dft_to_matmul(PassContext& ctx) { return apply_pattern<DftToMatmul>(ctx); }

}  // namespace kiln::passes
