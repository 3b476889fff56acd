// Persistent CUTLASS sm90 implicit-GEMM convolutions for INT8 (3x3, strided 1x1, any filter but
// 1x1 stride 1, which cutlass_sm90_gemm.cu takes as a plain GEMM), with kiln's INT8 epilogue
// fused (cutlass_int8_epilogue.h). The mainloop is CUTLASS's conv collective (TMA im2col loads of
// the NHWC activations, KRSC filters, wgmma), run by CUTLASS's persistent GEMM kernels through
// cutlass_persistent_conv.h; the epilogue is the GEMM one over Y as a row-major N*P*Q x K matrix.
//
// Why: CUTLASS's own conv kernel is not persistent: a CTA loads, multiplies and stores one tile.
// ResNet-50's 3x3 layers (a 576- to 4608-deep reduction) ran at about a third of the int8 rate
// with it (twelfth session). Ping-pong runs two consumer warp groups on alternate tiles, so one's
// epilogue and the next tile's first loads overlap the other's math; cooperative splits a
// 256-row tile over both, halving the filter traffic per pixel.
// Built only when CUTLASS's headers are found (see src/backends/cuda/CMakeLists.txt).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// clang-format off
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cute/tensor.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/conv/convnd_problem_shape.hpp"
#include "cutlass/conv/convolution.h"
#include "cutlass/conv/dispatch_policy.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "cutlass_int8_tactic.h"
#include "cutlass_persistent_conv.h"
// clang-format on

namespace kiln::cuda {
namespace {

using namespace cute;

// GemmSchedule / EpilogueSchedule: the persistent kernel; WarpGroups: those sharing a tile's MMA.
// EpiTile: the epilogue's subtile (CutlassInt8Epilogue, cutlass_int8_tactic.h).
template <class TileShape, class GemmSchedule, class EpilogueSchedule, int WarpGroups,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Int8PersistentFprop {
  using Element = int8_t;
  static constexpr int kAlign = 16;  // TMA: 16-byte aligned rows, so C and K multiples of 16
  using Cluster = Shape<_1, _1, _1>;
  using Epilogue = CutlassInt8Epilogue<TileShape, Cluster, EpilogueSchedule, EpiTile>;
  // The persistent kernels' own shared memory (barriers, the tile scheduler) beside the
  // epilogue's, left out of the stage count.
  static constexpr int kKernelCarveout = 1024;
  using Conv = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop, Element,
      cutlass::layout::TensorNHWC, kAlign, Element, cutlass::layout::TensorNHWC, kAlign, int32_t,
      TileShape, Cluster,
      cutlass::conv::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage)) + kKernelCarveout>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
  using Mainloop = PersistentConvMainloop<Conv, GemmSchedule, WarpGroups>;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  static_assert(sizeof(typename Kernel::SharedStorage) <= 232448, "over sm90's shared memory");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  static constexpr int kBlockK = size<2>(TileShape{});
};

using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using PingPongEpi = cutlass::epilogue::TmaWarpSpecialized;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
// The K mode of a conv tile is itself a tuple (it spans C, S and R).
using PingPong128x128x128 =
    Int8PersistentFprop<Shape<_128, _128, Shape<_128>>, PingPong, PingPongEpi, 1>;
using Coop256x128x128Epi128x64 =
    Int8PersistentFprop<Shape<_256, _128, Shape<_128>>, Cooperative, CoopEpi, 2, Shape<_128, _64>>;
using PingPong128x64x64 =
    Int8PersistentFprop<Shape<_128, _64, Shape<_64>>, PingPong, PingPongEpi, 1>;
// Tried and not built (thirteenth session, ResNet-50 at b256): 64-deep k-blocks lose to 128-deep
// ones where C allows (stage 2's 3x3: 0.078 against 0.055 ms) and gained nothing with two k-blocks'
// MMAs in flight (the dispatch policy's PipelineAsyncMmaStages = 2); ping-pong with 64 x 128
// epilogue subtiles and cooperative with CUTLASS's default or 128 x 128 ones lost or tied.

template <class Config>
class PersistentConvTactic final : public CutlassInt8GemmTactic<typename Config::Gemm> {
  using Base = CutlassInt8GemmTactic<typename Config::Gemm>;
  using ConvShape = typename Config::Mainloop::ConvShape;

 public:
  explicit PersistentConvTactic(const std::string& tile)
      : Base("cutlass_sm90_pconv.int8." + tile, "cutlass_sm90_pconv") {}

  Status init(const ConvProblem& p, const LibraryHandles&, cudaStream_t) override {
    const auto& s = p.shape;
    conv_ = ConvShape(cutlass::conv::Mode::kCrossCorrelation, {s.n, s.h, s.w, s.c},
                      {s.k, s.r, s.s, s.c}, {s.pad, s.pad}, {s.pad, s.pad}, {s.stride, s.stride},
                      {1, 1}, 1);
    // The kernels count k-blocks as K / block-K: C rounded up to whole blocks, times R*S.
    const int k = (s.c + Config::kBlockK - 1) / Config::kBlockK * Config::kBlockK * s.r * s.s;
    return this->init_gemm(p, int(int64_t(s.n) * s.p() * s.q()), s.k, k);
  }

 private:
  typename Base::MainloopArguments mainloop(const void* x) const override {
    return {conv_, {static_cast<const int8_t*>(x), this->weights()}};
  }

  ConvShape conv_;
};

class CutlassSm90PersistentConvSource final : public ConvTacticSource {
 public:
  std::string family() const override { return "cutlass_sm90_pconv"; }
  bool supports(const ConvProblem& p, std::string* why) const override {
    if (!plain_problem(p, why)) return false;
    if (p.shape.is_1x1_s1()) {
      *why = "a 1x1 stride-1 convolution (cutlass_sm90_gemm runs it as a plain GEMM)";
      return false;
    }
    if (int64_t(p.shape.n) * p.shape.p() * p.shape.q() > INT32_MAX) {
      *why = "more than 2^31 output pixels";
      return false;
    }
    *why = cutlass_int8_refusal(p);
    return why->empty();
  }
  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem&, const LibraryHandles&,
                                                      std::string*) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    auto add = [&](auto config, const char* tile) {
      using Config = decltype(config);
      out.push_back(std::make_unique<PersistentConvTactic<Config>>(tile));
    };
    add(PingPong128x128x128{}, "pp.128x128x128");
    add(Coop256x128x128Epi128x64{}, "coop.256x128x128.epi128x64");
    // For K = 64 (a 128-wide tile would waste half) and C = 64.
    add(PingPong128x64x64{}, "pp.128x64x64");
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cutlass_sm90_pconv_source() {
  return std::make_unique<CutlassSm90PersistentConvSource>();
}

}  // namespace kiln::cuda
