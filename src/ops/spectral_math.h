// The DFT as a linear map, shared by the CPU reference (src/ops/spectral.cpp) and the optimizer's
// canonical form (passes/dft_to_matmul.cpp), which writes the same coefficients into a constant
// basis. ONNX's DFT (opsets 17 and 20; numpy.fft's definitions): forward y[k] = sum_j x[j]
// e^(-2 pi i jk / n); inverse y[k] = (1/n) sum_j x[j] e^(+2 pi i jk / n); onesided forward keeps
// the n/2 + 1 first bins (RFFT); onesided inverse reads n/2 + 1 bins of a Hermitian spectrum and
// returns the real signal of length n (IRFFT).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace kiln::spectral {

struct DftSpec {
  int64_t axis = 0;  // the signal axis, in [0, rank - 2]
  int64_t n = 0;     // dft_length
  bool inverse = false, onesided = false;
  int64_t in_len = 0;   // the input's size along the axis
  int64_t used = 0;     // input samples (bins, for IRFFT) read: the rest is cut, the missing zero
  int64_t out_len = 0;  // the output's size along the axis
  int64_t cin = 1, cout = 2;  // real (1) or complex (2) input and output
  bool irfft() const { return inverse && onesided; }
};

// The spec of a DFT over `in_len` samples of `cin` parts; `n` <= 0: the default length.
inline DftSpec make_dft_spec(int64_t axis, int64_t in_len, int64_t cin, int64_t n, bool inverse,
                             bool onesided) {
  DftSpec s;
  s.axis = axis;
  s.inverse = inverse;
  s.onesided = onesided;
  s.in_len = in_len;
  s.cin = cin;
  s.n = n > 0 ? n : (inverse && onesided ? 2 * (in_len - 1) : in_len);
  if (s.irfft()) {
    s.used = in_len < s.n / 2 + 1 ? in_len : s.n / 2 + 1;
    s.out_len = s.n;
    s.cout = 1;
  } else {
    s.used = in_len < s.n ? in_len : s.n;
    s.out_len = onesided ? s.n / 2 + 1 : s.n;
    s.cout = 2;
  }
  return s;
}

// The longest transform kiln computes (its CPU kernel keeps a table of n cosines and sines).
inline constexpr int64_t kMaxDftLength = int64_t{1} << 26;

// c[o][i]: what input part i (0 real, 1 imaginary) of sample j adds to output part o, given
// co = cos(theta) and si = sin(theta), theta = 2 pi ((j k) mod n) / n for bin k.
inline void dft_coef_cs(const DftSpec& s, int64_t j, double co, double si, double c[2][2]) {
  if (!s.inverse) {  // e^(-i theta)
    c[0][0] = co, c[0][1] = si, c[1][0] = -si, c[1][1] = co;
    return;
  }
  double w = 1.0 / static_cast<double>(s.n);  // e^(+i theta) / n
  // IRFFT: sample j is bin j of a Hermitian spectrum: bins 1 .. (n-1)/2 stand for two.
  if (s.irfft() && j > 0 && 2 * j != s.n) w *= 2.0;
  c[0][0] = w * co, c[0][1] = -w * si, c[1][0] = w * si, c[1][1] = w * co;
}

inline void dft_coef(const DftSpec& s, int64_t j, int64_t k, double c[2][2]) {
  const double theta =
      2.0 * std::numbers::pi * static_cast<double>((j * k) % s.n) / static_cast<double>(s.n);
  dft_coef_cs(s, j, std::cos(theta), std::sin(theta), c);
}

}  // namespace kiln::spectral
