// Recurrent layers (layers/rnn.cu): LSTM, GRU and RNN against the CPU reference on odd sizes
// (hidden 1, 7, 33, 128, 256; input 5; seq 1 and 13; batch 1 and 3), every direction, layout 1,
// sequence_lens (a zero length included) as a run-time input, initial states, GRU's
// linear_before_reset 0 and 1, LSTM's peepholes, clip, input_forget and activations with their
// alpha/beta, B absent, LSTM without Y_c. Weights are constants uniform in +-1/sqrt(hidden), as
// PyTorch initialises them. Hidden 33 keeps R in the persistent kernel's shared memory, 128 too
// in FP16 (over 48 KiB: the opt-in), 256 streams it from L2; hidden 7 and 33 pad R's rows. The
// cases without sequence_lens, peepholes, clip or other activations also run cuDNN's tactic.
#include <cmath>

#include "backend_ops.h"

namespace kiln::gpu::test {
namespace {

using Modes = std::vector<std::string>;
const Modes kAll = {"fp32", "tf32", "fp16"};

struct Spec {
  std::string name;
  std::string op = "LSTM";
  int64_t hidden = 7, seq = 13, batch = 3, input = 5;
  std::string direction = "forward";
  int layout = 0;
  std::vector<double> lens = {};  // sequence_lens, or none
  bool states = false, bias = true, peep = false;
  Attributes extra = {};
  int outputs = 0;  // 0: all of the op's
  Modes modes = kAll;
};

OpCase make(Spec s) {
  const int64_t G = s.op == "LSTM" ? 4 : s.op == "GRU" ? 3 : 1;
  const int64_t D = s.direction == "bidirectional" ? 2 : 1, H = s.hidden;
  const double k = 1.0 / std::sqrt(static_cast<double>(H));
  OpCase c;
  c.name = "rnn_" + s.name;
  c.op_type = s.op;
  c.attrs = s.extra;
  c.attrs.set("hidden_size", Attribute::Int(H));
  c.attrs.set("direction", Attribute::String(s.direction));
  if (s.layout) c.attrs.set("layout", Attribute::Int(s.layout));
  const std::vector<int64_t> x = s.layout ? std::vector<int64_t>{s.batch, s.seq, s.input}
                                          : std::vector<int64_t>{s.seq, s.batch, s.input};
  const std::vector<int64_t> state =
      s.layout ? std::vector<int64_t>{s.batch, D, H} : std::vector<int64_t>{D, s.batch, H};
  c.inputs = {in(x),
              konst_random({D, G * H, s.input}, k),
              konst_random({D, G * H, H}, k),
              s.bias ? konst_random({D, 2 * G * H}, k) : absent(),
              s.lens.empty() ? absent() : fixed({s.batch}, s.lens, DataType::kInt32),
              s.states ? in(state) : absent()};
  if (s.op == "LSTM") {
    c.inputs.push_back(s.states ? in(state) : absent());
    c.inputs.push_back(s.peep ? konst_random({D, 3 * H}, k) : absent());
  }
  while (c.inputs.back().absent) c.inputs.pop_back();
  c.num_outputs = s.outputs ? s.outputs : (s.op == "LSTM" ? 3 : 2);
  c.modes = s.modes;
  return c;
}

Attribute Strs(std::vector<std::string> v) { return Attribute::Strings(std::move(v)); }
Attribute Floats(std::vector<float> v) { return Attribute::Floats(std::move(v)); }

}  // namespace

std::vector<OpCase> rnn_cases() {
  std::vector<OpCase> v;
  const std::vector<double> lens3 = {13, 5, 0};
  // LSTM
  v.push_back(make({.name = "lstm_h1_s1_b1", .hidden = 1, .seq = 1, .batch = 1}));
  v.push_back(make({.name = "lstm_h7_bidir_lens_states_peep",
                    .direction = "bidirectional",
                    .lens = lens3,
                    .states = true,
                    .peep = true}));
  v.push_back(make({.name = "lstm_h33_reverse_layout1_lens_states",
                    .hidden = 33,
                    .direction = "reverse",
                    .layout = 1,
                    .lens = lens3,
                    .states = true}));
  v.push_back(make({.name = "lstm_h128_bidir_states",
                    .hidden = 128,
                    .direction = "bidirectional",
                    .states = true}));
  v.push_back(make({.name = "lstm_h256_bidir_lens_states",
                    .hidden = 256,
                    .direction = "bidirectional",
                    .lens = lens3,
                    .states = true}));
  v.push_back(make({.name = "lstm_h256_b1_layout1", .hidden = 256, .batch = 1, .layout = 1}));
  v.push_back(make(
      {.name = "lstm_h7_clip_input_forget_no_bias",
       .bias = false,
       .peep = true,
       .extra = attrs({{"clip", Attribute::Float(0.5f)}, {"input_forget", Attribute::Int(1)}})}));
  v.push_back(make({.name = "lstm_h33_activations_bidir",
                    .hidden = 33,
                    .direction = "bidirectional",
                    .lens = lens3,
                    .extra = attrs({{"activations", Strs({"HardSigmoid", "LeakyRelu", "ScaledTanh",
                                                          "Sigmoid", "Softsign", "Tanh"})},
                                    {"activation_alpha", Floats({0.3f, 0.05f, 0.9f})},
                                    {"activation_beta", Floats({0.45f, 1.1f})}})}));
  v.push_back(make({.name = "lstm_h33_y_and_y_h_only", .hidden = 33, .outputs = 2}));
  // What cuDNN's tactic takes (no sequence_lens): its transposed Y and states, no B.
  v.push_back(make({.name = "lstm_h33_bidir_layout1_states",
                    .hidden = 33,
                    .direction = "bidirectional",
                    .layout = 1,
                    .states = true}));
  v.push_back(make({.name = "lstm_h7_bidir_no_bias", .direction = "bidirectional", .bias = false}));
  // GRU
  v.push_back(make({.name = "gru_h1_s1_b1", .op = "GRU", .hidden = 1, .seq = 1, .batch = 1}));
  for (int lbr : {0, 1}) {
    const std::string l = "_lbr" + std::to_string(lbr);
    const Attributes a = attrs({{"linear_before_reset", Attribute::Int(lbr)}});
    v.push_back(make({.name = "gru_h7_bidir_lens_states" + l,
                      .op = "GRU",
                      .direction = "bidirectional",
                      .lens = lens3,
                      .states = true,
                      .extra = a}));
    v.push_back(make({.name = "gru_h33_reverse_layout1_lens" + l,
                      .op = "GRU",
                      .hidden = 33,
                      .direction = "reverse",
                      .layout = 1,
                      .lens = lens3,
                      .states = true,
                      .extra = a}));
    v.push_back(make({.name = "gru_h256_bidir_states" + l,
                      .op = "GRU",
                      .hidden = 256,
                      .direction = "bidirectional",
                      .states = true,
                      .extra = a}));
  }
  v.push_back(make({.name = "gru_h7_bidir_layout1_states_lbr1",
                    .op = "GRU",
                    .direction = "bidirectional",
                    .layout = 1,
                    .states = true,
                    .extra = attrs({{"linear_before_reset", Attribute::Int(1)}})}));
  v.push_back(make({.name = "gru_h7_clip_b1_lens",
                    .op = "GRU",
                    .batch = 1,
                    .lens = {9},
                    .extra = attrs({{"clip", Attribute::Float(0.4f)}})}));
  // RNN
  v.push_back(make({.name = "rnn_h1_s1_b1", .op = "RNN", .hidden = 1, .seq = 1, .batch = 1}));
  v.push_back(make({.name = "rnn_h33_relu_bidir_lens_states",
                    .op = "RNN",
                    .hidden = 33,
                    .direction = "bidirectional",
                    .lens = lens3,
                    .states = true,
                    .extra = attrs({{"activations", Strs({"Relu", "Relu"})}})}));
  v.push_back(make({.name = "rnn_h7_relu_bidir_states",
                    .op = "RNN",
                    .direction = "bidirectional",
                    .states = true,
                    .extra = attrs({{"activations", Strs({"Relu", "Relu"})}})}));
  v.push_back(
      make({.name = "rnn_h256_layout1_b1", .op = "RNN", .hidden = 256, .batch = 1, .layout = 1}));
  v.push_back(make({.name = "rnn_h7_no_bias_reverse_lens",
                    .op = "RNN",
                    .direction = "reverse",
                    .lens = lens3,
                    .bias = false}));
  return v;
}

}  // namespace kiln::gpu::test
