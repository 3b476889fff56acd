// Spectral ops (opsets 17 and 20): DFT, STFT, the Hann, Hamming and Blackman windows and
// MelWeightMatrix. The CPU reference computes in double and writes the input's type (a window's
// or matrix's output_datatype). passes/dft_to_matmul.cpp turns a DFT or STFT of static sizes into
// a MatMul or Conv with a constant basis, which every backend runs on its GEMMs.
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "ops/op.h"
#include "ops/spectral_math.h"

namespace kiln {
namespace {

using spectral::DftSpec;

// A scalar (or one-element) integer input: its value, nullopt when absent; an error when present
// and not a known integer.
Expected<std::optional<int64_t>> scalar_int(const Node& n, const Tensor* t, bool present,
                                            const char* what) {
  if (!present) return std::optional<int64_t>();
  if (!t) return KILN_ERROR("{}: {} must be a constant", n.label(), what);
  if (t->numel() != 1 || !dtype_is_integer(t->dtype()))
    return KILN_ERROR("{}: {} must be one integer, got {}", n.label(), what, t->desc());
  return std::optional<int64_t>(t->at_int(0));
}

// ---------------------------------------------------------------- DFT
// DFT-17 takes the axis as an attribute (default 1); DFT-20 as input 2 (default -2).
Status upgrade_dft(ImportContext& ctx) {
  if (ctx.opset() >= 20) return Status::Ok();
  Node& n = ctx.node();
  if (!n.attrs.find("axis")) n.attrs.set("axis", Attribute::Int(1));
  ctx.attr_to_input("axis", 2, true);
  return Status::Ok();
}

// The spec from the input's rank, signal length and parts, and the node's dft_length and axis
// (nullptr: absent, or not known at inference: then the default).
Expected<DftSpec> dft_spec(const Node& n, int64_t rank, int64_t in_len, int64_t cin,
                           const Tensor* length, const Tensor* axis_t) {
  const int64_t inverse = n.attrs.get_int("inverse", 0), onesided = n.attrs.get_int("onesided", 0);
  if ((inverse != 0 && inverse != 1) || (onesided != 0 && onesided != 1))
    return KILN_ERROR("{}: inverse and onesided are 0 or 1, got {} and {}", n.label(), inverse,
                      onesided);
  if (rank < 2) return KILN_ERROR("{}: DFT input must have rank >= 2, got {}", n.label(), rank);
  if (cin != 1 && cin != 2 && cin >= 0)
    return KILN_ERROR("{}: the last dim holds the real part (1) or real and imaginary (2), got {}",
                      n.label(), cin);
  KILN_ASSIGN_OR_RETURN(auto ax, scalar_int(n, axis_t, axis_t != nullptr, "axis"));
  int64_t axis = ax.value_or(-2);
  if (axis < -rank || axis > rank - 2 || axis == -1)
    return KILN_ERROR("{}: axis {} is not a signal axis of a rank-{} input ([-{}, -2] or [0, {}])",
                      n.label(), axis, rank, rank, rank - 2);
  if (axis < 0) axis += rank;
  KILN_ASSIGN_OR_RETURN(auto len, scalar_int(n, length, length != nullptr, "dft_length"));
  if (len && (*len < 1 || *len > spectral::kMaxDftLength))
    return KILN_ERROR("{}: dft_length must be in [1, {}], got {}", n.label(),
                      spectral::kMaxDftLength, *len);
  if (inverse && onesided && cin == 1)
    return KILN_ERROR("{}: an inverse onesided DFT (IRFFT) takes a complex spectrum", n.label());
  DftSpec s = spectral::make_dft_spec(axis, in_len, cin, len.value_or(0), inverse, onesided);
  if (in_len >= 0 && (s.n < 1 || s.n > spectral::kMaxDftLength))
    return KILN_ERROR("{}: the signal axis has {} values: no DFT length in [1, {}]", n.label(),
                      in_len, spectral::kMaxDftLength);
  return s;
}

Status dft_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (x.dtype != DataType::kUndefined && !dtype_is_float(x.dtype))
    return KILN_ERROR("{}: DFT input must be a float tensor, got {}", n.label(),
                      dtype_name(x.dtype));
  if (!x.has_rank()) {
    ctx.set_output(0, TensorType::unknown_rank(x.dtype));
    return Status::Ok();
  }
  const std::vector<Dim>& d = *x.dims;
  const int64_t rank = x.rank();
  if (rank < 2) return KILN_ERROR("{}: DFT input must have rank >= 2, got {}", n.label(), x.str());
  if (ctx.has_input(2) && !ctx.input_const(2)) {
    // An axis known at run time only: any signal dim may change.
    std::vector<Dim> out(d.size());
    const bool irfft = n.attrs.get_int("inverse", 0) == 1 && n.attrs.get_int("onesided", 0) == 1;
    if (!out.empty()) out.back() = Dim(irfft ? 1 : 2);
    ctx.set_output(0, TensorType(x.dtype, std::move(out)));
    return Status::Ok();
  }
  // The axis first, to know which dim is the signal's.
  KILN_ASSIGN_OR_RETURN(auto ax, scalar_int(n, ctx.input_const(2), ctx.has_input(2), "axis"));
  const int64_t a = ax.value_or(-2) < 0 ? ax.value_or(-2) + rank : *ax;
  const int64_t in_len = a >= 0 && a < rank ? d[static_cast<size_t>(a)].value : -1;
  KILN_ASSIGN_OR_RETURN(
      DftSpec s, dft_spec(n, rank, in_len, d.back().value, ctx.input_const(1), ctx.input_const(2)));
  // The output's length is known from dft_length, or from the axis's size without it.
  const bool known = s.n > 0 && (!ctx.has_input(1) || ctx.input_const(1));
  std::vector<Dim> out = d;
  out[static_cast<size_t>(s.axis)] = known ? Dim(s.out_len) : Dim();
  out.back() = Dim(s.cout);
  ctx.set_output(0, TensorType(x.dtype, std::move(out)));
  return Status::Ok();
}

// y = DFT(x) along s.axis of x, in double: x [pre, in_len, post, cin] -> y [pre, out_len, post,
// cout]. `scale` multiplies each input sample j (STFT's window), nullptr for none.
// (A direct sum over a table of the n twiddles, not an FFT: the reference.)
void dft_lines(const DftSpec& s, const double* x, double* y, int64_t pre, int64_t post,
               const double* scale) {
  const int64_t in_row = s.in_len * post * s.cin, out_row = s.out_len * post * s.cout;
  std::vector<double> cs(static_cast<size_t>(s.n)), sn(static_cast<size_t>(s.n));
  for (int64_t m = 0; m < s.n; ++m) {
    const double theta = 2.0 * std::numbers::pi * static_cast<double>(m) / static_cast<double>(s.n);
    cs[static_cast<size_t>(m)] = std::cos(theta), sn[static_cast<size_t>(m)] = std::sin(theta);
  }
  for (int64_t p = 0; p < pre; ++p)
    for (int64_t q = 0; q < post; ++q)
      for (int64_t k = 0; k < s.out_len; ++k) {
        double re = 0, im = 0;
        for (int64_t j = 0; j < s.used; ++j) {
          const double* in = x + p * in_row + (j * post + q) * s.cin;
          const double w = scale ? scale[j] : 1.0;
          const double xr = in[0] * w, xi = s.cin == 2 ? in[1] * w : 0.0;
          const auto m = static_cast<size_t>((j * k) % s.n);
          double c[2][2];
          spectral::dft_coef_cs(s, j, cs[m], sn[m], c);
          re += c[0][0] * xr + c[0][1] * xi;
          im += c[1][0] * xr + c[1][1] * xi;
        }
        double* out = y + p * out_row + (k * post + q) * s.cout;
        out[0] = re;
        if (s.cout == 2) out[1] = im;
      }
}

Status dft_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor* x = ctx.input(0);
  if (!x) return KILN_ERROR("{}: DFT needs an input", n.label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: DFT input must be a float tensor, got {}", n.label(), x->desc());
  const int64_t rank = x->rank();
  KILN_ASSIGN_OR_RETURN(auto ax, scalar_int(n, ctx.input(2), ctx.input(2) != nullptr, "axis"));
  const int64_t a = ax.value_or(-2) < 0 ? ax.value_or(-2) + rank : *ax;
  const int64_t in_len = a >= 0 && a < rank ? x->dim(a) : -1;
  KILN_ASSIGN_OR_RETURN(DftSpec s, dft_spec(n, rank, in_len, rank ? x->dim(rank - 1) : 0,
                                            ctx.input(1), ctx.input(2)));
  int64_t pre = 1, post = 1;
  for (int64_t i = 0; i < s.axis; ++i) pre *= x->dim(i);
  for (int64_t i = s.axis + 1; i < rank - 1; ++i) post *= x->dim(i);
  std::vector<int64_t> shape = x->shape();
  shape[static_cast<size_t>(s.axis)] = s.out_len;
  shape.back() = s.cout;
  // A direct sum: its work grows with n^2 (no FFT here), bounded so that a run cannot stall.
  const double work = static_cast<double>(pre * post) * static_cast<double>(s.used) *
                      static_cast<double>(s.out_len);
  if (work > 6.9e10 || static_cast<double>(pre * post) * static_cast<double>(s.out_len) > 2.1e9)
    return KILN_ERROR(
        "{}: a DFT of {} lines of {} samples into {} bins is past what the CPU "
        "reference computes (2^36 products, 2^31 outputs)",
        n.label(), pre * post, s.used, s.out_len);
  const Tensor xd = x->cast(DataType::kFloat64);
  Tensor y(DataType::kFloat64, shape);
  dft_lines(s, xd.data<double>(), y.data<double>(), pre, post, nullptr);
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// ---------------------------------------------------------------- STFT
// signal [batch, length, 1|2], frame_step, window [W]?, frame_length? -> [batch, frames, bins, 2]:
// frame f is the W samples from f * frame_step (zeros past the end) times the window, its DFT of
// length frame_length (onesided: the n/2 + 1 first bins; the attribute's default is 1).
struct StftSpec {
  DftSpec dft;
  int64_t step = 0, window = 0, frames = 0, batch = 0, length = 0;
};

Expected<StftSpec> stft_spec(const Node& n, const std::vector<Dim>& x, const Tensor* step_t,
                             bool has_window, int64_t window_len, const Tensor* frame_t) {
  if (x.size() != 3)
    return KILN_ERROR("{}: STFT signal must be [batch, length, 1 or 2], got rank {}", n.label(),
                      x.size());
  const int64_t onesided = n.attrs.get_int("onesided", 1);
  if (onesided != 0 && onesided != 1)
    return KILN_ERROR("{}: onesided is 0 or 1, got {}", n.label(), onesided);
  KILN_ASSIGN_OR_RETURN(auto step, scalar_int(n, step_t, true, "frame_step"));
  if (*step < 1) return KILN_ERROR("{}: frame_step must be >= 1, got {}", n.label(), *step);
  KILN_ASSIGN_OR_RETURN(auto frame, scalar_int(n, frame_t, n.input(3) != nullptr, "frame_length"));
  StftSpec s;
  s.step = *step;
  s.batch = x[0].value;
  s.length = x[1].value;
  const int64_t cin = x[2].value;
  if (cin != 1 && cin != 2 && cin >= 0)
    return KILN_ERROR(
        "{}: the signal's last dim holds the real part (1) or real and imaginary "
        "(2), got {}",
        n.label(), cin);
  const int64_t flen = frame ? *frame : has_window ? window_len : s.length;
  if (frame && *frame < 1)
    return KILN_ERROR("{}: frame_length must be >= 1, got {}", n.label(), *frame);
  s.window = has_window ? window_len : flen;
  if (s.length >= 0 && flen >= 0) {
    if (flen > s.length)
      return KILN_ERROR("{}: frame_length {} is longer than the signal ({})", n.label(), flen,
                        s.length);
    s.frames = 1 + (s.length - flen) / s.step;
  } else {
    s.frames = -1;
  }
  s.dft = spectral::make_dft_spec(2, s.window, cin, flen, false, onesided == 1);
  return s;
}

Status stft_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  if (x.dtype != DataType::kUndefined && !dtype_is_float(x.dtype))
    return KILN_ERROR("{}: STFT signal must be a float tensor, got {}", n.label(),
                      dtype_name(x.dtype));
  if (!x.has_rank() || !ctx.input_const(1) || (ctx.has_input(3) && !ctx.input_const(3))) {
    ctx.set_output(0, TensorType(x.dtype, std::vector<Dim>(4)));  // the sizes wait for the values
    return Status::Ok();
  }
  const TensorType& w = ctx.input_type(2);
  const bool has_window = ctx.has_input(2);
  const int64_t wlen = has_window && w.has_rank() && w.rank() == 1 ? (*w.dims)[0].value : -1;
  if (has_window && w.has_rank() && w.rank() != 1)
    return KILN_ERROR("{}: the window must be 1-D, got {}", n.label(), w.str());
  KILN_ASSIGN_OR_RETURN(
      StftSpec s, stft_spec(n, *x.dims, ctx.input_const(1), has_window, wlen, ctx.input_const(3)));
  const bool known = s.dft.n > 0;
  ctx.set_output(0, TensorType(x.dtype, {(*x.dims)[0], s.frames >= 0 ? Dim(s.frames) : Dim(),
                                         known ? Dim(s.dft.out_len) : Dim(), Dim(2)}));
  return Status::Ok();
}

Status stft_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *x = ctx.input(0), *w = ctx.input(2);
  if (!x || !ctx.input(1)) return KILN_ERROR("{}: STFT needs a signal and frame_step", n.label());
  if (!dtype_is_float(x->dtype()))
    return KILN_ERROR("{}: STFT signal must be a float tensor, got {}", n.label(), x->desc());
  if (w && (w->rank() != 1 || !dtype_is_float(w->dtype())))
    return KILN_ERROR("{}: the window must be a 1-D float tensor, got {}", n.label(), w->desc());
  std::vector<Dim> dims(x->shape().begin(), x->shape().end());
  KILN_ASSIGN_OR_RETURN(
      StftSpec s, stft_spec(n, dims, ctx.input(1), w != nullptr, w ? w->dim(0) : 0, ctx.input(3)));
  const int64_t cin = s.dft.cin, win = s.window;
  // The frames, windowed: [batch * frames, win, cin] (zeros past the signal's end).
  std::vector<double> window(static_cast<size_t>(win), 1.0);
  if (w) {
    const Tensor wd = w->cast(DataType::kFloat64);
    for (int64_t j = 0; j < win; ++j) window[static_cast<size_t>(j)] = wd.data<double>()[j];
  }
  const Tensor xd = x->cast(DataType::kFloat64);
  std::vector<double> frames(static_cast<size_t>(s.batch * s.frames * win * cin), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t f = 0; f < s.frames; ++f)
      for (int64_t j = 0; j < win && f * s.step + j < s.length; ++j)
        for (int64_t c = 0; c < cin; ++c)
          frames[static_cast<size_t>(((b * s.frames + f) * win + j) * cin + c)] =
              xd.data<double>()[(b * s.length + f * s.step + j) * cin + c];
  Tensor y(DataType::kFloat64, {s.batch, s.frames, s.dft.out_len, 2});
  dft_lines(s.dft, frames.data(), y.data<double>(), s.batch * s.frames, 1, window.data());
  ctx.set_output(0, y.cast(x->dtype()));
  return Status::Ok();
}

// ---------------------------------------------------------------- windows, MelWeightMatrix
Expected<DataType> output_datatype(const Node& n) {
  const int64_t t = n.attrs.get_int("output_datatype", 1);
  const auto dt = static_cast<DataType>(t);
  if (!(dtype_is_float(dt) || dtype_is_integer(dt)) || dtype_is_float8(dt))
    return KILN_ERROR("{}: output_datatype {} is not a float or integer type kiln stores",
                      n.label(), t);
  return dt;
}

Status window_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(n));
  Dim len;  // known when the size is a constant
  if (const Tensor* t = ctx.input_const(0)) {
    KILN_ASSIGN_OR_RETURN(auto size, scalar_int(n, t, true, "size"));
    if (*size >= 0) len = Dim(*size);
  }
  ctx.set_output(0, TensorType(dt, {len}));
  return Status::Ok();
}

template <int kKind>  // 0 Hann, 1 Hamming, 2 Blackman (ONNX's reference formulas)
Status window_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(n));
  KILN_ASSIGN_OR_RETURN(auto size, scalar_int(n, ctx.input(0), true, "size"));
  if (*size < 0 || *size > spectral::kMaxDftLength)
    return KILN_ERROR("{}: window size {} is outside [0, {}]", n.label(), *size,
                      spectral::kMaxDftLength);
  const int64_t periodic = n.attrs.get_int("periodic", 1);
  const double den = static_cast<double>(periodic == 1 ? *size : *size - 1);
  const double pi = std::numbers::pi;
  Tensor y(DataType::kFloat64, {*size});
  for (int64_t i = 0; i < *size; ++i) {
    const double t = static_cast<double>(i) / den;
    double v;
    if constexpr (kKind == 0) {
      v = std::pow(std::sin(pi * t), 2.0);
    } else if constexpr (kKind == 1) {
      v = 25.0 / 46.0 - std::cos(2 * pi * t) * (21.0 / 46.0);
    } else {
      v = 0.42 - 0.5 * std::cos(2 * pi * t) + 0.08 * std::cos(4 * pi * t);
    }
    y.data<double>()[i] = v;
  }
  ctx.set_output(0, y.cast(dt));
  return Status::Ok();
}

Status mel_infer(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(n));
  const Tensor *bins = ctx.input_const(0), *len = ctx.input_const(1);
  ctx.set_output(0, TensorType(dt, {len ? Dim(len->at_int(0) / 2 + 1) : Dim(),
                                    bins ? Dim(bins->at_int(0)) : Dim()}));
  return Status::Ok();
}

Status mel_cpu(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(DataType dt, output_datatype(n));
  KILN_ASSIGN_OR_RETURN(auto bins, scalar_int(n, ctx.input(0), true, "num_mel_bins"));
  KILN_ASSIGN_OR_RETURN(auto len, scalar_int(n, ctx.input(1), true, "dft_length"));
  KILN_ASSIGN_OR_RETURN(auto rate, scalar_int(n, ctx.input(2), true, "sample_rate"));
  const Tensor *lo_t = ctx.input(3), *hi_t = ctx.input(4);
  if (!lo_t || !hi_t || lo_t->numel() != 1 || hi_t->numel() != 1)
    return KILN_ERROR("{}: lower_edge_hertz and upper_edge_hertz must be one value each",
                      n.label());
  if (*bins < 1 || *len < 1 || *rate < 1 || *bins > (1 << 20) || *len > (1 << 24) ||
      (*len / 2 + 1) * *bins > (int64_t{1} << 26))
    return KILN_ERROR(
        "{}: num_mel_bins {}, dft_length {}, sample_rate {}: each must be >= 1, and "
        "the matrix at most 2^26 values",
        n.label(), *bins, *len, *rate);
  const double lo = lo_t->cast(DataType::kFloat64).data<double>()[0];
  const double hi = hi_t->cast(DataType::kFloat64).data<double>()[0];
  const int64_t spec_bins = *len / 2 + 1;
  // ONNX's reference: num_mel_bins + 2 points evenly spaced in mel (its step divides by their
  // count), back to hertz, then to a DFT bin.
  auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double mlo = mel(lo), step = (mel(hi) - mlo) / static_cast<double>(*bins + 2);
  std::vector<int64_t> f(static_cast<size_t>(*bins + 2));
  for (int64_t i = 0; i < *bins + 2; ++i) {
    const double hz =
        700.0 * std::expm1((static_cast<double>(i) * step + mlo) / 2595.0 * std::log(10.0));
    f[static_cast<size_t>(i)] = static_cast<int64_t>(
        std::floor(static_cast<double>(*len + 1) * hz / static_cast<double>(*rate)));
  }
  Tensor y(DataType::kFloat64, {spec_bins, *bins});
  double* o = y.data<double>();
  std::fill(o, o + y.numel(), 0.0);
  auto at = [&](int64_t j, int64_t i) -> double* {
    return j >= 0 && j < spec_bins ? &o[j * *bins + i] : nullptr;
  };
  for (int64_t i = 0; i < *bins; ++i) {
    const int64_t l = f[static_cast<size_t>(i)], c = f[static_cast<size_t>(i + 1)],
                  h = f[static_cast<size_t>(i + 2)];
    if (c - l == 0) {
      if (double* p = at(c, i)) *p = 1.0;
    } else {
      for (int64_t j = l; j <= c; ++j)
        if (double* p = at(j, i)) *p = static_cast<double>(j - l) / static_cast<double>(c - l);
    }
    if (h - c > 0)
      for (int64_t j = c; j < h; ++j)
        if (double* p = at(j, i)) *p = static_cast<double>(h - j) / static_cast<double>(h - c);
  }
  ctx.set_output(0, y.cast(dt));
  return Status::Ok();
}

const OpDef kOps[] = {
    {"", "DFT", dft_infer, dft_cpu, upgrade_dft},
    {"", "STFT", stft_infer, stft_cpu, nullptr},
    {"", "HannWindow", window_infer, window_cpu<0>, nullptr},
    {"", "HammingWindow", window_infer, window_cpu<1>, nullptr},
    {"", "BlackmanWindow", window_infer, window_cpu<2>, nullptr},
    {"", "MelWeightMatrix", mel_infer, mel_cpu, nullptr},
};

}  // namespace

std::span<const OpDef> spectral_ops() { return kOps; }

}  // namespace kiln
