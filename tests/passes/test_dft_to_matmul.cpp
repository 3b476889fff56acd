// dft_to_matmul: a DFT of static sizes is a MatMul with a constant basis, an STFT a strided Conv;
// each form the ONNX spec allows (real or complex input, forward or inverse, onesided RFFT and
// IRFFT, dft_length padding or cutting the signal, any signal axis) agrees with the CPU op.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* dft(G& b, Value* x, int64_t axis, int64_t len, int64_t inverse, int64_t onesided) {
  Value* n = len > 0 ? b.c(Tensor::scalar<int64_t>(len)) : nullptr;
  return b.op(
      "DFT", {x, n, b.c(Tensor::scalar<int64_t>(axis))},
      attrs({{"inverse", Attribute::Int(inverse)}, {"onesided", Attribute::Int(onesided)}}));
}

TEST(DftToMatmul, EveryFormBecomesAMatMul) {
  G b;
  b.out(dft(b, b.in("real", {2, 6, 3, 1}), 1, 0, 0, 0));      // real, the first signal axis
  b.out(dft(b, b.in("complex", {2, 3, 5, 2}), -2, 0, 1, 0));  // complex inverse, the last
  b.out(dft(b, b.in("rfft", {1, 6, 1}), 1, 8, 0, 1));         // RFFT, padded to 8
  b.out(dft(b, b.in("irfft", {2, 4, 2}), 1, 6, 1, 1));        // IRFFT of 4 bins to 6 samples
  b.out(dft(b, b.in("cut", {3, 6, 2}), 1, 4, 0, 0));          // the first 4 samples only
  b.out(dft(b, b.in("odd", {2, 5, 2}), 1, 0, 1, 1));          // IRFFT, default length 8
  auto opt = optimize_checked(b.g, {"dft_to_matmul"}, 1e-5);
  EXPECT_EQ(count(*opt, "DFT"), 0);
  EXPECT_EQ(count(*opt, "MatMul"), 6);
}

TEST(DftToMatmul, StftBecomesAStridedConv) {
  G b;
  Tensor window(DataType::kFloat32, {16});
  for (int64_t i = 0; i < 16; ++i) window.data<float>()[i] = 0.5f + 0.03f * static_cast<float>(i);
  Value* x = b.in("signal", {2, 70, 1});
  b.out(b.op("STFT",
             {x, b.c(Tensor::scalar<int64_t>(6)), b.c(window), b.c(Tensor::scalar<int64_t>(16))}));
  // Complex, two-sided, no window: frames as long as frame_length.
  b.out(b.op("STFT",
             {b.in("complex", {1, 33, 2}), b.c(Tensor::scalar<int64_t>(5)), nullptr,
              b.c(Tensor::scalar<int64_t>(8))},
             attrs({{"onesided", Attribute::Int(0)}})));
  auto opt = optimize_checked(b.g, {"dft_to_matmul"}, 1e-5);
  EXPECT_EQ(count(*opt, "STFT"), 0);
  EXPECT_EQ(count(*opt, "Conv"), 2);
}

TEST(DftToMatmul, LongTransformsAndUnevenWindowsStay) {
  G b;
  b.out(dft(b, b.in("long", {1, 4096, 2}), 1, 0, 0, 0));  // a basis of 8192 x 8192
  Value* x = b.in("signal", {1, 64, 1});
  b.out(b.op("STFT", {x, b.c(Tensor::scalar<int64_t>(4)), b.c(rand_t({12})),
                      b.c(Tensor::scalar<int64_t>(16))}));  // a window shorter than a frame
  bool changed = false;
  auto notes = pass_notes(b.g, "dft_to_matmul", passes::dft_to_matmul, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "is over")) << dump_notes(notes);
  EXPECT_TRUE(has_note(notes, "not as long as a frame")) << dump_notes(notes);
  auto opt = optimize_checked(b.g, {"dft_to_matmul"}, 1e-5);
  EXPECT_EQ(count(*opt, "DFT"), 1);
  EXPECT_EQ(count(*opt, "STFT"), 1);
}

}  // namespace
}  // namespace kiln::test
