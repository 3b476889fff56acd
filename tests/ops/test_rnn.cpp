// LSTM, GRU and RNN: one-unit layers whose steps are written out here as formulas, sequence
// lengths (zeros past the end, the last valid state, length 0), reverse and bidirectional
// directions, layout 1 against layout 0, clip, peepholes, input_forget, activations with their
// alpha/beta, float16/float64, shape inference with symbolic dims, the opset-1 upgrade, and
// errors. tests/models/run_rnn_tests.py compares larger graphs with ONNX Runtime.
#include <cmath>

#include "op_test_util.h"

namespace kiln::test {
namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

Attribute F(float v) { return Attribute::Float(v); }
Attribute Strs(std::vector<std::string> v) { return Attribute::Strings(std::move(v)); }
Attribute Floats(std::vector<float> v) { return Attribute::Floats(std::move(v)); }

Tensor I32(std::vector<int64_t> shape, std::vector<int32_t> v) {
  return Tensor::from<int32_t>(std::move(shape), v);
}

// Transposes the first two axes of a 3-D or the [S, D, B, H] -> [B, S, D, H] axes of a 4-D
// tensor (layout 0 -> layout 1).
Tensor to_batch_first(const Tensor& t) {
  if (t.rank() == 3) {
    Tensor o(t.dtype(), {t.dim(1), t.dim(0), t.dim(2)});
    for (int64_t a = 0; a < t.dim(0); ++a)
      for (int64_t b = 0; b < t.dim(1); ++b)
        for (int64_t c = 0; c < t.dim(2); ++c)
          o.data<float>()[(b * t.dim(0) + a) * t.dim(2) + c] =
              static_cast<float>(t.at_double((a * t.dim(1) + b) * t.dim(2) + c));
    return o;
  }
  const int64_t S = t.dim(0), D = t.dim(1), B = t.dim(2), H = t.dim(3);
  Tensor o(t.dtype(), {B, S, D, H});
  for (int64_t s = 0; s < S; ++s)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          o.data<float>()[((b * S + s) * D + d) * H + h] =
              static_cast<float>(t.at_double(((s * D + d) * B + b) * H + h));
  return o;
}

TEST(Rnn, OneUnitTanhWithBiasAndInitialState) {
  // X [2, 1, 1]; h_t = tanh(0.5 x + 0.25 h + 0.1 - 0.2), h_0 = 0.3.
  Tensor x = F32({2, 1, 1}, {1, 2}), w = F32({1, 1, 1}, {0.5f}), r = F32({1, 1, 1}, {0.25f}),
         b = F32({1, 2}, {0.1f, -0.2f}), h0 = F32({1, 1, 1}, {0.3f});
  OpRun run = run_op("RNN", {&x, &w, &r, &b, nullptr, &h0}, attrs({{"hidden_size", Int(1)}}), 2);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  expect_inferred_matches(run);
  const double h1 = std::tanh(0.5 * 1 + 0.25 * 0.3f - 0.1f);
  const double h2 = std::tanh(0.5 * 2 + 0.25 * h1 - 0.1f);
  expect_values(run.outputs[0], {h1, h2});
  expect_values(run.outputs[1], {h2});
}

TEST(Rnn, GruOneUnitBothResetForms) {
  // z = sigmoid(x wz + h rz + bz), r = sigmoid(x wr + h rr + br),
  // h' = tanh(x wh + (r h) rh + rbh + wbh) or tanh(x wh + r (h rh + rbh) + wbh).
  Tensor x = F32({1, 1, 1}, {0.7f}), w = F32({1, 3, 1}, {0.4f, -0.3f, 0.9f}),
         r = F32({1, 3, 1}, {0.2f, 0.6f, -0.5f}),
         b = F32({1, 6}, {0.1f, 0.2f, 0.3f, -0.1f, 0.05f, 0.4f}), h0 = F32({1, 1, 1}, {0.8f});
  const double xv = 0.7f, h = 0.8f;
  const double z = sigmoid(xv * 0.4f + h * 0.2f + 0.1f - 0.1f);
  const double rr = sigmoid(xv * -0.3f + h * 0.6f + 0.2f + 0.05f);
  for (int lbr : {0, 1}) {
    SCOPED_TRACE(lbr);
    OpRun run = run_op("GRU", {&x, &w, &r, &b, nullptr, &h0},
                       attrs({{"hidden_size", Int(1)}, {"linear_before_reset", Int(lbr)}}), 2);
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    const double in = lbr ? xv * 0.9f + rr * (h * -0.5f + 0.4f) + 0.3f
                          : xv * 0.9f + (rr * h) * -0.5f + 0.4f + 0.3f;
    const double want = (1 - z) * std::tanh(in) + z * h;
    expect_values(run.outputs[0], {want});
    expect_values(run.outputs[1], {want});
  }
}

TEST(Rnn, LstmOneUnitPeepholesClipAndInputForget) {
  // Gates in W/R/B order i, o, f, c; peepholes i, o, f. clip bounds each activation's input.
  Tensor x = F32({1, 1, 1}, {1.5f}), w = F32({1, 4, 1}, {0.5f, -0.4f, 0.3f, 2.f}),
         r = F32({1, 4, 1}, {0.1f, 0.2f, -0.3f, 0.4f}),
         b = F32({1, 8}, {0.1f, 0, 0, 0.2f, 0, 0.1f, 0, 0}), h0 = F32({1, 1, 1}, {0.5f}),
         c0 = F32({1, 1, 1}, {-0.6f}), p = F32({1, 3}, {0.3f, -0.2f, 0.7f});
  const double xv = 1.5f, h = 0.5f, c = -0.6f, clip = 1.f;
  auto cl = [&](double v) { return std::min(std::max(v, -clip), clip); };
  for (int forget : {0, 1}) {
    SCOPED_TRACE(forget);
    OpRun run = run_op(
        "LSTM", {&x, &w, &r, &b, nullptr, &h0, &c0, &p},
        attrs({{"hidden_size", Int(1)}, {"clip", F(1.f)}, {"input_forget", Int(forget)}}), 3);
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    expect_inferred_matches(run);
    const double i = sigmoid(cl(xv * 0.5f + h * 0.1f + 0.1f + 0.3f * c));
    const double f = forget ? 1 - i : sigmoid(cl(xv * 0.3f + h * -0.3f + 0.7f * c));
    const double g = std::tanh(cl(xv * 2.f + h * 0.4f + 0.2f));
    const double cn = f * c + i * g;
    const double o = sigmoid(cl(xv * -0.4f + h * 0.2f + 0.1f + -0.2f * cn));
    const double hn = o * std::tanh(cn);  // C itself is not clipped
    expect_values(run.outputs[0], {hn});
    expect_values(run.outputs[1], {hn});
    expect_values(run.outputs[2], {cn});
  }
}

TEST(Rnn, ActivationsTakeAlphaBetaInOrder) {
  // RNN with Affine: alpha 2, beta -1 -> h = 2 (x w + h r) - 1; the second direction's
  // LeakyRelu takes the next alpha (0.5); its missing beta is not consumed.
  Tensor x = F32({1, 1, 1}, {-1.f}), w = F32({2, 1, 1}, {0.5f, 3.f}), r = F32({2, 1, 1}, {0, 0});
  OpRun run = run_op("RNN", {&x, &w, &r},
                     attrs({{"hidden_size", Int(1)},
                            {"direction", Str("bidirectional")},
                            {"activations", Strs({"Affine", "leakyrelu"})},
                            {"activation_alpha", Floats({2.f, 0.5f})},
                            {"activation_beta", Floats({-1.f})}}),
                     2);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  expect_values(run.outputs[0], {2 * -0.5 - 1, 0.5 * -3});
}

TEST(Rnn, SequenceLengthsZerosPastTheEndAndLastValidState) {
  // Bidirectional, S = 3, B = 3 with lengths 3, 1, 0: Y is zero past each length, Y_h holds the
  // forward state after the last valid step and the backward state after t = 0; length 0 gives
  // zeros (onnxruntime's rule), whatever the initial state.
  Tensor x = random_tensor({3, 3, 2}), w = random_tensor({2, 12, 2}), r = random_tensor({2, 12, 4}),
         h0 = random_tensor({2, 3, 4}), lens = I32({3}, {3, 1, 0});
  OpRun run = run_op("GRU", {&x, &w, &r, nullptr, &lens, &h0},
                     attrs({{"hidden_size", Int(4)}, {"direction", Str("bidirectional")}}), 2);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  const Tensor &y = run.outputs[0], &yh = run.outputs[1];
  auto Y = [&](int64_t t, int64_t d, int64_t b, int64_t u) {
    return y.at_double(((t * 2 + d) * 3 + b) * 4 + u);
  };
  for (int64_t u = 0; u < 4; ++u) {
    for (int64_t d = 0; d < 2; ++d) {
      for (int64_t t = 1; t < 3; ++t) EXPECT_EQ(Y(t, d, 1, u), 0.0);
      for (int64_t t = 0; t < 3; ++t) EXPECT_EQ(Y(t, d, 2, u), 0.0);
      EXPECT_EQ(yh.at_double((d * 3 + 2) * 4 + u), 0.0);
      // Entry 1 (length 1): both directions see only t = 0.
      EXPECT_EQ(yh.at_double((d * 3 + 1) * 4 + u), Y(0, d, 1, u));
    }
    EXPECT_EQ(yh.at_double((0 * 3 + 0) * 4 + u), Y(2, 0, 0, u));
    EXPECT_EQ(yh.at_double((1 * 3 + 0) * 4 + u), Y(0, 1, 0, u));
  }
  // Entry 1 alone, as a sequence of one step, gives the same numbers.
  Tensor x1(DataType::kFloat32, {1, 1, 2}), h01(DataType::kFloat32, {2, 1, 4});
  for (int k = 0; k < 2; ++k) x1.data<float>()[k] = static_cast<float>(x.at_double(1 * 2 + k));
  for (int d = 0; d < 2; ++d)
    for (int u = 0; u < 4; ++u)
      h01.data<float>()[d * 4 + u] = static_cast<float>(h0.at_double((d * 3 + 1) * 4 + u));
  OpRun one = run_op("GRU", {&x1, &w, &r, nullptr, nullptr, &h01},
                     attrs({{"hidden_size", Int(4)}, {"direction", Str("bidirectional")}}), 2);
  ASSERT_TRUE(one.status.ok()) << one.status.message();
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t u = 0; u < 4; ++u)
      EXPECT_NEAR(one.outputs[1].at_double(d * 4 + u), yh.at_double((d * 3 + 1) * 4 + u), 1e-6);
}

TEST(Rnn, ReverseIsForwardOnTheFlippedSequence) {
  Tensor x = random_tensor({4, 2, 3}), w = random_tensor({1, 8, 3}), r = random_tensor({1, 8, 2}),
         b = random_tensor({1, 16}), c0 = random_tensor({1, 2, 2});
  Tensor flipped(DataType::kFloat32, {4, 2, 3});
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t k = 0; k < 6; ++k)
      flipped.data<float>()[t * 6 + k] = static_cast<float>(x.at_double((3 - t) * 6 + k));
  OpRun rev = run_op("LSTM", {&x, &w, &r, &b, nullptr, nullptr, &c0},
                     attrs({{"hidden_size", Int(2)}, {"direction", Str("reverse")}}), 3);
  OpRun fwd = run_op("LSTM", {&flipped, &w, &r, &b, nullptr, nullptr, &c0},
                     attrs({{"hidden_size", Int(2)}}), 3);
  ASSERT_TRUE(rev.status.ok() && fwd.status.ok()) << rev.status.message();
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t k = 0; k < 4; ++k)
      EXPECT_NEAR(rev.outputs[0].at_double(t * 4 + k), fwd.outputs[0].at_double((3 - t) * 4 + k),
                  1e-6);
  expect_values(rev.outputs[1], values_d(fwd.outputs[1]));
  expect_values(rev.outputs[2], values_d(fwd.outputs[2]));
}

TEST(Rnn, LayoutOneIsLayoutZeroTransposed) {
  for (const char* op : {"LSTM", "GRU", "RNN"}) {
    SCOPED_TRACE(op);
    const int64_t G = std::string(op) == "LSTM" ? 4 : std::string(op) == "GRU" ? 3 : 1;
    const bool lstm = G == 4;
    Tensor x = random_tensor({3, 2, 4}), w = random_tensor({2, G * 5, 4}),
           r = random_tensor({2, G * 5, 5}), b = random_tensor({2, 2 * G * 5}),
           h0 = random_tensor({2, 2, 5}), c0 = random_tensor({2, 2, 5}), lens = I32({2}, {2, 3});
    const size_t outs = lstm ? 3 : 2;
    const Attributes a = attrs({{"hidden_size", Int(5)}, {"direction", Str("bidirectional")}});
    Attributes a1 = a;
    a1.set("layout", Int(1));
    std::vector<const Tensor*> in0 = {&x, &w, &r, &b, &lens, &h0};
    Tensor x1 = to_batch_first(x), h01 = to_batch_first(h0), c01 = to_batch_first(c0);
    std::vector<const Tensor*> in1 = {&x1, &w, &r, &b, &lens, &h01};
    if (lstm) in0.push_back(&c0), in1.push_back(&c01);
    OpRun r0 = run_op(op, in0, a, outs), r1 = run_op(op, in1, a1, outs);
    ASSERT_TRUE(r0.status.ok()) << r0.status.message();
    ASSERT_TRUE(r1.status.ok()) << r1.status.message();
    expect_inferred_matches(r1);
    for (size_t o = 0; o < outs; ++o) {
      EXPECT_EQ(r1.outputs[o].shape(), to_batch_first(r0.outputs[o]).shape());
      expect_values(r1.outputs[o], values_d(to_batch_first(r0.outputs[o])));
    }
  }
}

TEST(Rnn, Float16AndFloat64) {
  Tensor x = random_tensor({2, 2, 3}), w = random_tensor({1, 12, 3}), r = random_tensor({1, 12, 4});
  const Attributes a = attrs({{"hidden_size", Int(4)}});
  OpRun ref = run_op("GRU", {&x, &w, &r}, a, 2);
  ASSERT_TRUE(ref.status.ok()) << ref.status.message();
  for (DataType t : {DataType::kFloat16, DataType::kFloat64}) {
    Tensor xt = x.cast(t), wt = w.cast(t), rt = r.cast(t);
    OpRun run = run_op("GRU", {&xt, &wt, &rt}, a, 2);
    ASSERT_TRUE(run.status.ok()) << run.status.message();
    EXPECT_EQ(run.outputs[0].dtype(), t);
    expect_values(run.outputs[0], values_d(ref.outputs[0]), t == DataType::kFloat16 ? 1e-2 : 1e-6,
                  t == DataType::kFloat16 ? 1e-2 : 1e-6);
  }
}

TEST(Rnn, InferenceKeepsSymbolicDims) {
  auto types = infer("LSTM",
                     {TensorType(DataType::kFloat32, {Dim::sym("S"), Dim::sym("N"), Dim(5)}),
                      TensorType(DataType::kFloat32, {Dim(2), Dim(28), Dim(5)}),
                      TensorType(DataType::kFloat32, {Dim(2), Dim(28), Dim(7)})},
                     attrs({{"direction", Str("bidirectional")}}), 3);
  ASSERT_TRUE(types.ok()) << types.status().message();
  EXPECT_EQ((*types)[0].str(), "float32[S,2,N,7]");
  EXPECT_EQ((*types)[1].str(), "float32[2,N,7]");
  EXPECT_EQ((*types)[2].str(), "float32[2,N,7]");
  auto bf = infer("RNN",
                  {TensorType(DataType::kFloat16, {Dim::sym("N"), Dim::sym("S"), Dim(5)}),
                   TensorType(DataType::kFloat16, {Dim(1), Dim(3), Dim(5)}),
                   TensorType(DataType::kFloat16, {Dim(1), Dim(3), Dim(3)})},
                  attrs({{"layout", Int(1)}, {"hidden_size", Int(3)}}), 2);
  ASSERT_TRUE(bf.ok()) << bf.status().message();
  EXPECT_EQ((*bf)[0].str(), "float16[N,S,1,3]");
  EXPECT_EQ((*bf)[1].str(), "float16[N,1,3]");
}

TEST(Rnn, OpsetOneUpgradeDropsOutputSequence) {
  Tensor x = random_tensor({2, 1, 3}), w = random_tensor({1, 8, 3}), r = random_tensor({1, 8, 2});
  OpRun run = run_imported("LSTM", {&x, &w, &r},
                           attrs({{"hidden_size", Int(2)}, {"output_sequence", Int(1)}}), 1, 2,
                           {false, true, true}, 2);
  ASSERT_TRUE(run.status.ok()) << run.status.message();
  EXPECT_EQ(run.outputs[0].shape(), (std::vector<int64_t>{2, 1, 1, 2}));
}

TEST(Rnn, BadInputsAreErrorsNamingTheNode) {
  Tensor x = random_tensor({2, 1, 3}), w = random_tensor({1, 8, 3}), r = random_tensor({1, 8, 2});
  Tensor x2 = random_tensor({2, 3}), r_bad = random_tensor({1, 8, 3}),
         b_bad = random_tensor({1, 8});
  Tensor lens = I32({1}, {3}), neg = I32({1}, {-1}), h0_bad = random_tensor({1, 2, 2});
  Tensor lens64 = I64({1}, {2}), lens_f = F32({1}, {2});
  const Attributes a = attrs({{"hidden_size", Int(2)}});
  expect_error(run_op("LSTM", {&x2, &w, &r}, a, 3), "X must be 3-D");
  expect_error(run_op("LSTM", {&x, &w, &r_bad}, a, 3), "R must be");
  expect_error(run_op("LSTM", {&x, &w, &r, &b_bad}, a, 3), "B must be");
  expect_error(run_op("LSTM", {&x, &w, &r, nullptr, nullptr, &h0_bad}, a, 3), "initial_h must be");
  expect_error(run_op("LSTM", {&x, &w, &r, nullptr, &lens}, a, 3), "sequence_lens[0] = 3");
  expect_error(run_op("LSTM", {&x, &w, &r, nullptr, &neg}, a, 3), "outside [0, 2]");
  expect_error(run_op("LSTM", {&x, &w, &r, nullptr, &lens_f}, a, 3), "sequence_lens must be");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"hidden_size", Int(3)}}), 3), "W must be");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"hidden_size", Int(-1)}}), 3), "hidden_size");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"direction", Str("sideways")}}), 3),
               "direction");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"direction", Str("bidirectional")}}), 3),
               "W must be");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"layout", Int(2)}}), 3), "layout");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"clip", F(-1.f)}}), 3), "clip");
  expect_error(run_op("LSTM", {&x, &w, &r}, attrs({{"activations", Strs({"Tanh"})}}), 3),
               "activations given");
  expect_error(
      run_op("LSTM", {&x, &w, &r}, attrs({{"activations", Strs({"Sigmoid", "Tanh", "Cosh"})}}), 3),
      "unknown activation 'Cosh'");
  Tensor wg = random_tensor({1, 6, 3}), rg = random_tensor({1, 6, 2});
  expect_error(run_op("GRU", {&x, &wg, &rg, nullptr, nullptr, nullptr, &x}, a, 2),
               "at most 6 inputs");
  expect_error(run_op("GRU", {&x, &wg, &rg}, a, 3), "at most 2 outputs");
  Tensor wh = random_tensor({1, 8, 3}).cast(DataType::kFloat16);
  expect_error(run_op("LSTM", {&x, &wh, &r}, a, 3), "W must have X's type");
  OpRun ok64 = run_op("LSTM", {&x, &w, &r, nullptr, &lens64}, a, 3);
  EXPECT_TRUE(ok64.status.ok()) << ok64.status.message();
  OpRun no_r = run_op("LSTM", {&x, &w}, a, 3);
  ASSERT_FALSE(no_r.status.ok());
  EXPECT_NE(no_r.status.message().find("node 'n0'"), std::string::npos) << no_r.status.message();
}

}  // namespace
}  // namespace kiln::test
