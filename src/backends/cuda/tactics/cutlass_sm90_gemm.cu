// CUTLASS 3 Hopper GEMMs (TMA + wgmma, warp-specialized, persistent) for INT8 1x1 stride-1
// convolutions, with kiln's INT8 epilogue fused (cutlass_int8_epilogue.h). In NHWC a 1x1
// convolution is the GEMM Y[M = N*H*W][K] = X[M][C] * W[K][C]^T: A = X row-major, B = the KRSC
// weights as a column-major C x K matrix (both K-major, as int8 wgmma requires), C = the int8
// residual and D = Y, row-major.
//
// Why a GEMM beside the implicit-GEMM conv (cutlass_sm90_conv.cu): CUTLASS's sm90 conv kernels
// are not persistent (its dispatch policy refuses the cooperative and ping-pong schedules), so a
// CTA loads, multiplies and stores one tile, and with 1x1 layers' short reductions (K = 64 to
// 2048) the store and the next tile's first loads do not overlap. The GEMM kernels here are
// persistent: ping-pong runs two consumer warp groups on alternate tiles, so one's epilogue
// overlaps the other's math; cooperative splits a 256-row tile over both.
// Built only when CUTLASS's headers are found (see src/backends/cuda/CMakeLists.txt).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// clang-format off
#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cute/tensor.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "cutlass_int8_tactic.h"
// clang-format on

namespace kiln::cuda {
namespace {

using namespace cute;

// EpiTile: the epilogue's subtile (CutlassInt8Epilogue, cutlass_int8_tactic.h).
template <class TileShape, class Cluster, class KernelSchedule, class EpilogueSchedule,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
struct Int8Gemm {
  using Element = int8_t;
  static constexpr int kAlign = 16;  // TMA: 16-byte aligned rows, so C and K multiples of 16
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using Epilogue = CutlassInt8Epilogue<TileShape, Cluster, EpilogueSchedule, EpiTile>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element,
      LayoutB, kAlign, int32_t, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using PingPong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using PingPongEpi = cutlass::epilogue::TmaWarpSpecialized;
using CoopEpi = cutlass::epilogue::TmaWarpSpecializedCooperative;
using C1x1 = Shape<_1, _1, _1>;
using PingPong128x128x128 = Int8Gemm<Shape<_128, _128, _128>, C1x1, PingPong, PingPongEpi>;
using PingPong128x64x128 = Int8Gemm<Shape<_128, _64, _128>, C1x1, PingPong, PingPongEpi>;
// The residual expands' tile (thirteenth session): 256 x 128 over both warp groups, the epilogue
// in 128 x 64 subtiles (CUTLASS's default for cooperative int8 is 128 x 32: twice as many
// residual loads and stores, 0.070 against 0.062 ms on ResNet-50's stage-3 expand at b256).
using Coop256x128x128Epi128x64 =
    Int8Gemm<Shape<_256, _128, _128>, C1x1, Cooperative, CoopEpi, Shape<_128, _64>>;
// Not built, as no ResNet-50 layer at batch 256 took them (twelfth and thirteenth sessions): a
// 64-deep k-block for C = 64, ping-pong with 64 x 128 epilogue subtiles, cooperative with
// CUTLASS's default or 128 x 128 subtiles, cooperative 128 x 256; and clusters of two CTAs
// sharing the weights (2x1) or the activations (1x2) by TMA multicast.

template <class Config>
class GemmTactic final : public CutlassInt8GemmTactic<typename Config::Gemm> {
  using Base = CutlassInt8GemmTactic<typename Config::Gemm>;
  using StrideA = typename Config::Gemm::GemmKernel::StrideA;
  using StrideB = typename Config::Gemm::GemmKernel::StrideB;

 public:
  explicit GemmTactic(const std::string& tile)
      : Base("cutlass_sm90_gemm.int8." + tile, "cutlass_sm90_gemm") {}

  Status init(const ConvProblem& p, const LibraryHandles&, cudaStream_t) override {
    const ConvShape& s = p.shape;
    const int m = int(int64_t(s.n) * s.h * s.w);
    stride_a_ = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(m, s.c, 1));
    stride_b_ = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(s.k, s.c, 1));
    return this->init_gemm(p, m, s.k, s.c);
  }

 private:
  typename Base::MainloopArguments mainloop(const void* x) const override {
    return {static_cast<const int8_t*>(x), stride_a_, this->weights(), stride_b_};
  }

  StrideA stride_a_{};
  StrideB stride_b_{};
};

class CutlassSm90GemmSource final : public ConvTacticSource {
 public:
  std::string family() const override { return "cutlass_sm90_gemm"; }
  bool supports(const ConvProblem& p, std::string* why) const override {
    if (!plain_problem(p, why)) return false;
    if (!p.shape.is_1x1_s1()) {
      *why = "not a 1x1 stride-1 convolution";
      return false;
    }
    if (int64_t(p.shape.n) * p.shape.h * p.shape.w > INT32_MAX) {
      *why = "more than 2^31 pixels";
      return false;
    }
    *why = cutlass_int8_refusal(p);
    return why->empty();
  }
  std::vector<std::unique_ptr<ConvTactic>> candidates(const ConvProblem&, const LibraryHandles&,
                                                      std::string*) override {
    std::vector<std::unique_ptr<ConvTactic>> out;
    out.push_back(std::make_unique<GemmTactic<PingPong128x128x128>>("pp.128x128x128"));
    out.push_back(std::make_unique<GemmTactic<PingPong128x64x128>>("pp.128x64x128"));
    out.push_back(
        std::make_unique<GemmTactic<Coop256x128x128Epi128x64>>("coop.256x128x128.epi128x64"));
    return out;
  }
};

}  // namespace

std::unique_ptr<ConvTacticSource> make_cutlass_sm90_gemm_source() {
  return std::make_unique<CutlassSm90GemmSource>();
}

}  // namespace kiln::cuda
