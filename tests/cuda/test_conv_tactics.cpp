// Every convolution tactic on small problems against the naive reference kernel: FP16/TF32 within
// 1e-2 relative L2, INT8 bit-exact. Skips (with a message) when no GPU is present.
#include <cublasLt.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/conv_kernels.h"
#include "tactics/check.h"
#include "tactics/device_buffer.h"
#include "tactic_test_util.h"

namespace kiln::cuda {
namespace {

using test::Handles;
using test::have_gpu;

// Runs every candidate of every source on `p`; returns how many were checked.
int check_all_tactics(const ConvProblem& p, uint64_t seed) {
  Handles h;
  LibraryHandles lh{h.dnn, h.lt, size_t(64) << 20};
  const size_t es = element_size(p.precision);
  const auto& sh = p.shape;
  DeviceBuffer x, w, bias, res, y, ref, ws;
  EXPECT_TRUE(x.allocate(sh.x_elems() * es) && w.allocate(sh.w_elems() * es) &&
              bias.allocate(size_t(sh.k) * es) && res.allocate(sh.y_elems() * es) &&
              y.allocate(sh.y_elems() * es) &&
              ref.allocate(sh.y_elems() * (p.precision == Precision::kINT8 ? 1 : 4)));
  cudaStream_t s = nullptr;
  const bool int8 = p.precision == Precision::kINT8;
  const float a = std::sqrt(3.0f / float(sh.r * sh.s * sh.c));
  fill_random(x.get(), sh.x_elems(), p.precision, seed + 1, int8 ? -32 : -1, int8 ? 31 : 1, s);
  fill_random(w.get(), sh.w_elems(), p.precision, seed + 2, int8 ? -32 : -a, int8 ? 31 : a, s);
  if (!int8) {
    fill_random(bias.get(), sh.k, p.precision, seed + 3, -0.5f, 0.5f, s);
    fill_random(res.get(), sh.y_elems(), p.precision, seed + 4, -1, 1, s);
  }
  reference_conv(p, x.get(), w.get(), bias.get(), res.get(), ref.get(), s);
  int checked = 0;
  for (auto& src : make_conv_tactic_sources()) {
    std::string why, note;
    if (!src->supports(p, &why)) continue;
    for (auto& t : src->candidates(p, lh, &note)) {
      // A tactic may refuse a problem at init (no engine, workspace); a wrong result fails.
      if (!t->init(p, lh, s).ok() || !t->prepare_weights(w.get(), s).ok()) continue;
      if (!ws.allocate(t->workspace_size())) continue;
      fill_poison(y.get(), sh.y_elems(), p.precision, s);
      ConvBuffers b{x.get(), bias.get(), res.get(), y.get(), ws.get(), ws.bytes()};
      const Status st = t->run(b, s);
      if (!st.ok()) continue;
      const CheckResult c = check_output(p, y.get(), ref.get(), s);
      if (int8) {
        EXPECT_EQ(c.mismatches, 0) << t->name() << " max diff " << c.max_abs_diff;
      } else {
        EXPECT_EQ(c.nonfinite, 0) << t->name();
        EXPECT_LE(c.rel_l2, 1e-2) << t->name();
      }
      ++checked;
    }
  }
  return checked;
}

ConvProblem problem(int n, int c, int hw, int k, int rs, int stride, Precision p, Epilogue e) {
  ConvProblem pr;
  pr.shape = {n, c, hw, hw, k, rs, rs, stride, rs / 2};
  pr.precision = p;
  pr.epilogue = p == Precision::kINT8 ? Epilogue::kNone : e;
  pr.int8_scale = 1.0f / 256;
  return pr;
}

TEST(ConvTactics, Fp16Conv3x3BiasRelu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU: convolution tactics not run";
  EXPECT_GT(
      check_all_tactics(problem(2, 64, 14, 64, 3, 1, Precision::kFP16, Epilogue::kBiasRelu), 11),
      0);
}

TEST(ConvTactics, Fp16Conv1x1Residual) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU: convolution tactics not run";
  EXPECT_GT(check_all_tactics(
                problem(2, 64, 14, 256, 1, 1, Precision::kFP16, Epilogue::kBiasAddRelu), 12),
            0);
}

TEST(ConvTactics, Tf32Conv3x3Strided) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU: convolution tactics not run";
  EXPECT_GT(
      check_all_tactics(problem(2, 32, 14, 64, 3, 2, Precision::kTF32, Epilogue::kBiasRelu), 13),
      0);
}

TEST(ConvTactics, Int8Conv3x3AndGemmExact) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU: convolution tactics not run";
  EXPECT_GT(check_all_tactics(problem(2, 64, 14, 64, 3, 1, Precision::kINT8, Epilogue::kNone), 14),
            0);
  EXPECT_GT(check_all_tactics(problem(2, 128, 7, 256, 1, 1, Precision::kINT8, Epilogue::kNone), 15),
            0);
}

}  // namespace
}  // namespace kiln::cuda
