// CUTLASS 3 Hopper INT8 GEMMs (TMA + int8 wgmma, warp-specialized, persistent) with a float16
// result (cutlass_gemm_i8f16.h): CUTLASS's PerColLinCombPerColBiasEltAct epilogue,
// D = act(alpha[n] * acc + bias[n] + beta * C), alpha the per-column dequantization scale
// sx * sw[n], C the float16 residual (beta 1, or 0 when there is none: C is then never read).
// A [M, K] int8 row-major, W [N, K] int8 row-major (column-major K x N: the layer's transposed
// copy of the weight), C and D [M, N] float16 row-major. Tiles: ping-pong 128 x 128 x 128 and
// 128 x 64 x 128 (one warp group's epilogue under the other's math), cooperative 256 x 128 x 128
// (both warp groups on one tile, for large M). Built only when CUTLASS's headers are found
// (src/backends/cuda/CMakeLists.txt).
#include <array>
#include <cstdint>

// Grid dependency control compiled into these kernels, as in cutlass_sm90_gemm_f16.cu: the
// producer warps wait for the kernel before them ahead of their first load.
#define CUTLASS_ENABLE_GDC_FOR_SM90 1

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
#include "check.h"
#include "cutlass_gelu.h"
#include "cutlass_gemm_i8f16.h"
#include "cutlass_gemm_extents.h"
#include "cutlass_int8_epilogue.h"
// clang-format on

namespace kiln::cuda {
namespace {

using namespace cute;

template <class TileShape, class KernelSchedule, class EpiSchedule, template <class> class Act>
struct Config {
  using H = cutlass::half_t;
  static constexpr int kAlignA = 16;  // 16-byte rows for TMA: K a multiple of 16 int8s
  static constexpr int kAlignC = 8;   // and N a multiple of 8 halves
  using Cluster = Shape<_1, _1, _1>;
  using Fusion =
      cutlass::epilogue::fusion::PerColLinCombPerColBiasEltAct<Act, H, float, float, H, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, int32_t, float, H,
      cutlass::layout::RowMajor, kAlignC, H, cutlass::layout::RowMajor, kAlignC, EpiSchedule,
      Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, cutlass::layout::RowMajor,
      kAlignA, int8_t, cutlass::layout::ColumnMajor, kAlignA, int32_t, TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Cfg>
class GemmI8F16 final : public I8F16Gemm {
  using Gemm = typename Cfg::Gemm;
  using H = typename Cfg::H;

 public:
  Status configure(int m, int n, int k, size_t* workspace) override {
    KILN_TRY(x_.set(m, n, k));
    auto args = arguments(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
    KILN_TRY(cutlass_status(Gemm::can_implement(args), "can_implement"));
    *workspace = Gemm::get_workspace_size(args);
    last_ = {};
    return {};
  }

  Status run(const void* a, const void* w, const float* alpha, const float* bias, const void* r,
             void* y, void* ws, cudaStream_t stream, bool pdl) override {
    // initialize() builds TMA descriptors on the host: only when a pointer changed.
    const Pointers now{a, w, alpha, bias, r, y, ws};
    if (now != last_) {
      auto args = arguments(a, w, alpha, bias, r, y);
      KILN_TRY(cutlass_status(gemm_.initialize(args, ws, stream), "initialize"));
      last_ = now;
    }
    KILN_TRY(cutlass_status(gemm_.run(stream, nullptr, pdl), "run"));
    KILN_CUDA(cudaGetLastError());
    return {};
  }

 private:
  using Pointers = std::array<const void*, 7>;  // a, w, alpha, bias, r, y, workspace

  typename Gemm::Arguments arguments(const void* a, const void* w, const float* alpha,
                                     const float* bias, const void* r, void* y) const {
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {x_.m, x_.n, x_.k, 1},
        {static_cast<const int8_t*>(a), x_.a, static_cast<const int8_t*>(w), x_.b},
        {{}, static_cast<const H*>(r ? r : y), x_.c, static_cast<H*>(y), x_.d},
        x_.hw};
    args.epilogue.thread.alpha_ptr = alpha;
    args.epilogue.thread.beta = r ? 1.f : 0.f;  // beta 0: C is never read
    args.epilogue.thread.bias_ptr = bias;
    return args;
  }

  CutlassGemmExtents<Gemm> x_;
  Gemm gemm_;
  Pointers last_{};
};

template <template <class> class Act>
std::unique_ptr<I8F16Gemm> make(const std::string& tile) {
  using Coop256x128 = Config<Shape<_256, _128, _128>, Coop, CoopEpi, Act>;
  using PingPong128x128 = Config<Shape<_128, _128, _128>, PingPong, PingPongEpi, Act>;
  using PingPong128x64 = Config<Shape<_128, _64, _128>, PingPong, PingPongEpi, Act>;
  if (tile == "coop256x128") return std::make_unique<GemmI8F16<Coop256x128>>();
  if (tile == "pp128x128") return std::make_unique<GemmI8F16<PingPong128x128>>();
  if (tile == "pp128x64") return std::make_unique<GemmI8F16<PingPong128x64>>();
  return nullptr;
}

}  // namespace

const std::vector<std::string>& i8f16_gemm_tiles() {
  static const std::vector<std::string> k = {"coop256x128", "pp128x128", "pp128x64"};
  return k;
}

std::unique_ptr<I8F16Gemm> make_i8f16_gemm(F16GemmAct act, const std::string& tile) {
  switch (act) {
    case F16GemmAct::kNone:
      return make<cutlass::epilogue::thread::Identity>(tile);
    case F16GemmAct::kGelu:
      return make<GeluErfTanh>(tile);
    case F16GemmAct::kGeluTanh:
      return make<cutlass::epilogue::thread::GELU_taylor>(tile);
    case F16GemmAct::kSwish:
      return nullptr;
  }
  return nullptr;
}

}  // namespace kiln::cuda
