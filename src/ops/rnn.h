// LSTM, GRU and RNN: the attributes and sizes of one recurrent layer, read once for the CPU
// reference (ops/rnn.cpp) and the CUDA layer (backends/cuda/layers/rnn.cu), and the activation
// functions, __host__ __device__ under nvcc, so both sides agree on what a layer computes.
//
// Gate order of W, R and B (ONNX): LSTM i, o, f, c (peepholes P: i, o, f); GRU z, r, h; RNN one.
// B is [Wb | Rb] per direction. Direction d of a bidirectional layer runs backwards for d = 1.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "kiln/status.h"

#if defined(__CUDACC__)
#define KILN_RNN_HD __host__ __device__
#else
#define KILN_RNN_HD
#endif

namespace kiln {

enum class RnnCell : uint8_t { kRnn, kGru, kLstm };

// The activation functions the ONNX recurrent ops name (their `activations` attribute).
enum class RnnAct : uint8_t {
  kRelu,
  kTanh,
  kSigmoid,
  kAffine,
  kLeakyRelu,
  kThresholdedRelu,
  kScaledTanh,
  kHardSigmoid,
  kElu,
  kSoftsign,
  kSoftplus,
};

struct RnnActivation {
  RnnAct kind = RnnAct::kTanh;
  float alpha = 0.f, beta = 0.f;
};

// f(x) in the compute type A: double on the CPU, float on the GPU.
template <typename A>
KILN_RNN_HD inline A rnn_activate(const RnnActivation& f, A x) {
  const A alpha = static_cast<A>(f.alpha), beta = static_cast<A>(f.beta);
  switch (f.kind) {
    case RnnAct::kRelu:
      return x > A(0) ? x : A(0);
    case RnnAct::kTanh:
      return tanh(x);
    case RnnAct::kSigmoid:
      return A(1) / (A(1) + exp(-x));
    case RnnAct::kAffine:
      return alpha * x + beta;
    case RnnAct::kLeakyRelu:
      return x >= A(0) ? x : alpha * x;
    case RnnAct::kThresholdedRelu:
      return x > alpha ? x : A(0);
    case RnnAct::kScaledTanh:
      return alpha * tanh(beta * x);
    case RnnAct::kHardSigmoid: {
      const A y = alpha * x + beta;
      return y < A(0) ? A(0) : (y > A(1) ? A(1) : y);
    }
    case RnnAct::kElu:
      return x >= A(0) ? x : alpha * (exp(x) - A(1));
    case RnnAct::kSoftsign:
      return x / (A(1) + fabs(x));
    case RnnAct::kSoftplus:  // log(1 + e^x) without overflow for large x
      return x > A(0) ? x + log1p(exp(-x)) : log1p(exp(x));
  }
  return x;
}

// Far beyond any real layer; keeps G * hidden and its products within int64.
inline constexpr int64_t kRnnMaxHidden = int64_t(1) << 24;

// LSTM's f, g, h for each of two directions.
inline constexpr int kRnnMaxActivations = 6;

// A recurrent node's attributes, checked.
struct RnnSpec {
  RnnCell cell = RnnCell::kLstm;
  int64_t hidden_size = 0;  // 0: not given (R's last dim says)
  int num_dirs = 1;
  bool reverse = false;      // direction "reverse": direction 0 runs backwards
  bool batch_first = false;  // layout 1: X [batch, seq, input], Y [batch, seq, dirs, hidden]
  bool has_clip = false;
  float clip = 0.f;
  bool input_forget = false;               // LSTM: f = 1 - i
  bool linear_before_reset = false;        // GRU: r * (h R_h^T + Rb_h) instead of (r * h) R_h^T
  RnnActivation acts[kRnnMaxActivations];  // direction d's k-th at d * acts_per_dir() + k

  int gates() const { return cell == RnnCell::kLstm ? 4 : cell == RnnCell::kGru ? 3 : 1; }
  int acts_per_dir() const { return cell == RnnCell::kLstm ? 3 : cell == RnnCell::kGru ? 2 : 1; }
  bool dir_reverse(int d) const { return reverse || d == 1; }
  const RnnActivation& act(int d, int k) const { return acts[d * acts_per_dir() + k]; }
  int num_inputs() const { return cell == RnnCell::kLstm ? 8 : 6; }
  int num_outputs() const { return cell == RnnCell::kLstm ? 3 : 2; }
};

// The spec of an LSTM, GRU or RNN node; errors name the node and the attribute.
Expected<RnnSpec> read_rnn_spec(const Node& n);

// The sizes of one call. Inputs by slot: X, W, R, B, sequence_lens, initial_h, initial_c, P.
struct RnnSizes {
  Dim seq, batch, input, hidden;
};

// Checks the inputs' shapes against each other and the spec (every static dim; nullptr or an
// unknown rank: not checked) and returns the sizes. `shapes` has one entry per input slot.
Expected<RnnSizes> rnn_sizes(const Node& n, const RnnSpec& s,
                             const std::vector<const std::vector<Dim>*>& shapes);

// The same for concrete shapes (nullptr: an absent input); every size is static.
struct RnnShape {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0;
};
Expected<RnnShape> rnn_shape(const Node& n, const RnnSpec& s,
                             const std::vector<const std::vector<int64_t>*>& shapes);

// The output shapes: Y, then Y_h (and Y_c) for `seq`, `batch`, `hidden`.
template <typename D>
std::vector<D> rnn_y_shape(const RnnSpec& s, D seq, D batch, D hidden) {
  return s.batch_first ? std::vector<D>{batch, seq, D(s.num_dirs), hidden}
                       : std::vector<D>{seq, D(s.num_dirs), batch, hidden};
}
template <typename D>
std::vector<D> rnn_state_shape(const RnnSpec& s, D batch, D hidden) {
  return s.batch_first ? std::vector<D>{batch, D(s.num_dirs), hidden}
                       : std::vector<D>{D(s.num_dirs), batch, hidden};
}

}  // namespace kiln
