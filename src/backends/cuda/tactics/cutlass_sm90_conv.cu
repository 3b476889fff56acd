// CUTLASS 3 Hopper implicit-GEMM convolution (TMA + wgmma, warp-specialized), INT8 in, int32
// accumulate, int8 out. One tactic per compiled kernel: two tiles with the scalar epilogue
// y = sat(rne(alpha * acc)) (int8_scalar_alpha problems), and one with kiln's INT8 epilogue as
// CUTLASS's PerColLinCombPerColBiasEltAct EVT: y = clamp(alpha[k] * acc + bias[k] + beta * z,
// lo, hi) -> int8 with alpha = cs / sy, beta = sz / sy (int8 residual as C), bias / sy (scaled
// by a small kernel here) and the clamp bounds giving none / ReLU / clipped ReLU; half outputs
// and half residuals are not compiled.
// Built only when CUTLASS's headers are found (see src/backends/cuda/CMakeLists.txt).
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/conv_kernels.h"
#include "check.h"
#include "conv_sources.h"
#include "cutlass_int8_epilogue.h"
#include "device_buffer.h"

// CUTLASS's conv headers need cutlass.h and kernel_hardware_info.hpp first.
// clang-format off
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cute/tensor.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
// clang-format on

namespace kiln::cuda {
namespace {

using namespace cute;

// GEMM view of fprop: M = N*P*Q output pixels, N = K output channels, K = R*S*C.
// The epilogue schedule matters most: EpilogueScheduleAuto picks the register-direct epilogue,
// whose int8 stores ran 5-10x slower than cuBLASLt on memory-bound layers; TmaWarpSpecialized
// stages the tile in shared memory and writes it with TMA. (Conv has no persistent schedules.)
template <class TileShape, class ClusterShape, class EpilogueSchedule>
struct Int8Fprop {
  static constexpr bool kFused = false;
  using Element = int8_t;
  static constexpr int kAlign = 16;  // TMA needs 16-byte aligned rows: C and K multiples of 16
  using Layout = cutlass::layout::TensorNHWC;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, void, Layout, kAlign,
      Element, Layout, kAlign, EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element,
      Layout, kAlign, Element, Layout, kAlign, int32_t, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// kiln's INT8 epilogue (see the top): int8 C (the residual) and D, per-column (= per output
// channel) float alpha and bias, and a Clamp "activation", whose bounds cover no activation,
// ReLU and clipped ReLU in one compiled kernel. Stages: mainloop stages, 0 = as many as fit
// (one CTA per SM); a small count leaves room for several CTAs per SM, whose epilogues then
// overlap each other's loads (the 1x1 layers have one or two k-blocks, so deep pipelines idle).
template <class TileShape, class ClusterShape, int Stages = 0>
struct Int8FpropFused {
  static constexpr bool kFused = true;
  using Element = int8_t;
  static constexpr int kAlign = 16;
  using Layout = cutlass::layout::TensorNHWC;
  using Fusion = cutlass::epilogue::fusion::PerColLinCombPerColBiasEltAct<
      cutlass::epilogue::thread::Clamp, Element, float, float, Element, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, Element, Layout, kAlign,
      Element, Layout, kAlign, cutlass::epilogue::TmaWarpSpecialized, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element,
      Layout, kAlign, Element, Layout, kAlign, int32_t, TileShape, ClusterShape,
      std::conditional_t<Stages == 0,
                         cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(
                             sizeof(typename Epilogue::SharedStorage))>,
                         cutlass::conv::collective::StageCount<Stages>>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 2>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

template <class Config>
class CutlassInt8ConvTactic final : public ConvTactic {
  using Conv = typename Config::Conv;
  using ProblemShape = typename Config::ProblemShape;

 public:
  explicit CutlassInt8ConvTactic(std::string tile) : tile_(std::move(tile)) {}
  std::string name() const override { return "cutlass_sm90.int8." + tile_; }
  std::string family() const override { return "cutlass_sm90"; }

  Status init(const ConvProblem& p, const LibraryHandles&, cudaStream_t) override {
    problem_ = p;
    if constexpr (Config::kFused) {
      KILN_TRY(constants_.init(p));
    } else {
      std::string why;
      if (!int8_scalar_alpha(p, &alpha_, &why)) return Status::Error(why);
    }
    const ConvShape& s = p.shape;
    shape_ = ProblemShape(cutlass::conv::Mode::kCrossCorrelation, {s.n, s.h, s.w, s.c},
                          {s.k, s.r, s.s, s.c}, {s.pad, s.pad}, {s.pad, s.pad},
                          {s.stride, s.stride}, {1, 1}, 1);
    // Output strides come from the problem shape's packed NHWC strides, innermost first.
    cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_c_) = shape_.stride_C[ProblemShape::RankT - 2 - i];
      cute::get<0, i>(stride_d_) = shape_.stride_C[ProblemShape::RankT - 2 - i];
    });
    auto args = arguments(nullptr, nullptr, nullptr);
    KILN_TRY(cutlass_status(Conv::can_implement(args), "can_implement"));
    workspace_ = Conv::get_workspace_size(args);
    return {};
  }

  size_t workspace_size() const override { return workspace_; }

  Status prepare_weights(const void* w, cudaStream_t stream) override {
    return copy_weights_krsc(weights_, problem_, w, stream);
  }

  Status run(const ConvBuffers& b, cudaStream_t stream) override {
    return runner_.run(
        conv_, problem_, b, Config::kFused ? &constants_ : nullptr, stream,
        [this](const void* x, const void* c, void* y) { return arguments(x, c, y); });
  }

 private:
  using StrideC = typename Conv::ConvKernel::StrideC;
  using StrideD = typename Conv::ConvKernel::StrideD;

  typename Conv::Arguments arguments(const void* x, const void* c, void* y) const {
    using E = typename Config::Element;
    if constexpr (Config::kFused) {
      typename Conv::Arguments a{
          shape_,
          {static_cast<const E*>(x), static_cast<const E*>(weights_.get())},
          {{}, static_cast<const E*>(c), stride_c_, static_cast<E*>(y), stride_d_}};
      constants_.fill(a.epilogue.thread);
      return a;
    } else {
      return typename Conv::Arguments{
          shape_,
          {static_cast<const E*>(x), static_cast<const E*>(weights_.get())},
          {{alpha_, 0.f}, nullptr, stride_c_, static_cast<E*>(y), stride_d_}};
    }
  }

  std::string tile_;
  ConvProblem problem_;
  float alpha_ = 1.f;
  ProblemShape shape_;
  StrideC stride_c_{};
  StrideD stride_d_{};
  size_t workspace_ = 0;
  DeviceBuffer weights_;
  CutlassInt8Constants constants_;  // the fused kernels only
  Conv conv_;
  CutlassRunner runner_;
};

// The K mode of a conv tile is itself a tuple (it spans C, R and S).
using Tile128x128 = Int8Fprop<Shape<_128, _128, Shape<_128>>, Shape<_1, _1, _1>,
                              cutlass::epilogue::TmaWarpSpecialized>;
using Tile128x256 = Int8Fprop<Shape<_128, _256, Shape<_64>>, Shape<_1, _1, _1>,
                              cutlass::epilogue::TmaWarpSpecialized>;
using Fused128x128 = Int8FpropFused<Shape<_128, _128, Shape<_128>>, Shape<_1, _1, _1>>;
// For the layers the big tile wastes (sixth session, ResNet-50 b256: stage 1's 3x3 64->64 ran
// 0.43 ms against FP16's 0.15, the residual 1x1 expands at 0.8x FP16): 64 output channels per
// tile, and a 64-deep k-block with few stages so that 2-4 CTAs share an SM.
using Fused128x64s4 = Int8FpropFused<Shape<_128, _64, Shape<_64>>, Shape<_1, _1, _1>, 4>;
using Fused128x128s3 = Int8FpropFused<Shape<_128, _128, Shape<_64>>, Shape<_1, _1, _1>, 3>;
// Clusters of two CTAs along M sharing the filter tiles by TMA multicast made ResNet-50's
// stage-2 3x3 slower (twelfth session, call 3: 0.097 against 0.087 ms) and are not built.

class CutlassSm90Source final : public ConvTacticSource {
 public:
  std::string family() const override { return "cutlass_sm90"; }
  bool supports(const ConvProblem& p, std::string* why) const override {
    if (!plain_problem(p, why)) return false;
    *why = cutlass_int8_refusal(p);
    return why->empty();
  }
  // The scalar-epilogue tiles where they apply (the kernel study's), else the fused kernel.
  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem& p, const LibraryHandles&,
                                                      std::string*) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    float alpha = 0.f;
    std::string why;
    if (int8_scalar_alpha(p, &alpha, &why)) {
      out.push_back(std::make_unique<CutlassInt8ConvTactic<Tile128x128>>("128x128x128.tma_epi"));
      out.push_back(std::make_unique<CutlassInt8ConvTactic<Tile128x256>>("128x256x64.tma_epi"));
    } else {
      out.push_back(
          std::make_unique<CutlassInt8ConvTactic<Fused128x128>>("128x128x128.tma_epi.fused"));
      out.push_back(
          std::make_unique<CutlassInt8ConvTactic<Fused128x64s4>>("128x64x64.s4.tma_epi.fused"));
      out.push_back(
          std::make_unique<CutlassInt8ConvTactic<Fused128x128s3>>("128x128x64.s3.tma_epi.fused"));
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cutlass_sm90_source() {
  return std::make_unique<CutlassSm90Source>();
}

}  // namespace kiln::cuda
