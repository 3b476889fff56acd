// CUTLASS 3 Hopper GEMMs (TMA + wgmma, warp-specialized, persistent) in FP16 with the bias, the
// residual (as C, beta = 1) and the activation in the epilogue: CUTLASS's
// LinCombPerColBiasEltAct, D = act(acc + bias[n] + beta * C). A [M, K] row-major (K-major), W
// [K, N] row-major (N-major: the engine's own copy of the weight, no repacking), C and D [M, N]
// row-major. Tiles: cooperative 256 x 128 x 64 (both consumer warp groups on one tile, for
// large M) and 128 x 192 x 64 (N = 768, a transformer's hidden size, in four columns of tiles:
// at M = 4096 its 128 tiles are one wave on the H100's 132 SMs, where 128 x 128 tiles make 1.45
// waves), ping-pong 128 x 128 x 64 and 128 x 64 x 64 (one warp group's epilogue under the
// other's math; the narrow one for N = 768 at small M). Built only when CUTLASS's headers are
// found (src/backends/cuda/CMakeLists.txt).
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

// Grid dependency control compiled into these kernels (they may be launched with programmatic
// dependent launch, kernels/pdl.cuh): in every block the producer warps wait for the kernel
// before them ahead of their first load of A, W or the residual, and the output is written only
// from what those loads brought. Only this file's kernels: kiln's other CUTLASS kernels are
// launched without it.
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
#include "cutlass_gemm_f16.h"
#include "cutlass_gemm_extents.h"
#include "cutlass_int8_epilogue.h"
// clang-format on

namespace kiln::cuda {
namespace {

using namespace cute;

// Swish x * sigmoid(alpha x), alpha a run-time argument of the epilogue (CUTLASS passes a
// functor's Arguments to it): SiLU (1), CLIP's quick GELU (1.702).
__host__ __device__ inline float swish(float x, float alpha) {
#ifdef __CUDA_ARCH__
  return x / (1.f + __expf(-alpha * x));
#else
  return x / (1.f + std::exp(-alpha * x));
#endif
}
template <class T>
struct SwishAlpha {
  struct Arguments {
    float alpha = 1.f;
  };
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& a = Arguments()) const {
    return T(swish(float(x), a.alpha));
  }
};
template <int N>
struct SwishAlpha<cutlass::Array<float, N>> {
  using Arguments = typename SwishAlpha<float>::Arguments;
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& x,
                                                          Arguments const& a = Arguments()) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = swish(x[i], a.alpha);
    return y;
  }
};

// Whether an epilogue's activation arguments carry an alpha (SwishAlpha's).
template <class A, class = void>
struct HasAlpha : std::false_type {};
template <class A>
struct HasAlpha<A, std::void_t<decltype(std::declval<A&>().alpha)>> : std::true_type {};

template <class TileShape, class KernelSchedule, class EpiSchedule, template <class> class Act>
struct Config {
  using E = cutlass::half_t;
  static constexpr int kAlign = 8;  // 16-byte rows for TMA: N and K multiples of 8
  using Row = cutlass::layout::RowMajor;
  using Cluster = Shape<_1, _1, _1>;
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<Act, E, float, E, E, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, E, Row, kAlign, E, Row, kAlign,
      EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, Row, kAlign, E, Row, kAlign, float,
      TileShape, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Cfg>
class GemmF16 final : public F16Gemm {
 public:
  explicit GemmF16(float alpha = 1.f) : alpha_(alpha) {}

 private:
  using Gemm = typename Cfg::Gemm;
  using E = typename Cfg::E;

 public:
  Status configure(int m, int n, int k, size_t* workspace) override {
    KILN_TRY(x_.set(m, n, k));
    auto args = arguments(nullptr, nullptr, nullptr, nullptr, nullptr);
    KILN_TRY(cutlass_status(Gemm::can_implement(args), "can_implement"));
    *workspace = Gemm::get_workspace_size(args);
    a_ = w_ = bias_ = r_ = nullptr;
    y_ = ws_ = nullptr;
    return {};
  }

  Status run(const void* a, const void* w, const void* bias, const void* r, void* y, void* ws,
             cudaStream_t stream, bool pdl) override {
    // initialize() builds TMA descriptors on the host: only when a pointer changed.
    if (a != a_ || w != w_ || bias != bias_ || r != r_ || y != y_ || ws != ws_) {
      auto args = arguments(a, w, bias, r, y);
      KILN_TRY(cutlass_status(gemm_.initialize(args, ws, stream), "initialize"));
      a_ = a, w_ = w, bias_ = bias, r_ = r, y_ = y, ws_ = ws;
    }
    KILN_TRY(cutlass_status(gemm_.run(stream, nullptr, pdl), "run"));
    KILN_CUDA(cudaGetLastError());
    return {};
  }

 private:
  typename Gemm::Arguments arguments(const void* a, const void* w, const void* bias, const void* r,
                                     void* y) const {
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {x_.m, x_.n, x_.k, 1},
        {static_cast<const E*>(a), x_.a, static_cast<const E*>(w), x_.b},
        {{}, static_cast<const E*>(r ? r : y), x_.c, static_cast<E*>(y), x_.d},
        x_.hw};
    args.epilogue.thread.alpha = 1.f;
    args.epilogue.thread.beta = r ? 1.f : 0.f;  // beta 0: C is never read
    args.epilogue.thread.bias_ptr = static_cast<const E*>(bias);
    if constexpr (HasAlpha<decltype(args.epilogue.thread.activation)>::value)
      args.epilogue.thread.activation.alpha = alpha_;
    return args;
  }

  float alpha_ = 1.f;  // SwishAlpha's
  CutlassGemmExtents<Gemm> x_;
  Gemm gemm_;
  const void *a_ = nullptr, *w_ = nullptr, *bias_ = nullptr, *r_ = nullptr;
  void *y_ = nullptr, *ws_ = nullptr;
};

template <template <class> class Act>
std::unique_ptr<F16Gemm> make(const std::string& tile, float alpha = 1.f) {
  if (tile == "coop256x128")
    return std::make_unique<GemmF16<Config<Shape<_256, _128, _64>, Coop, CoopEpi, Act>>>(alpha);
  if (tile == "coop128x192")
    return std::make_unique<GemmF16<Config<Shape<_128, _192, _64>, Coop, CoopEpi, Act>>>(alpha);
  if (tile == "pp128x128")
    return std::make_unique<GemmF16<Config<Shape<_128, _128, _64>, PingPong, PingPongEpi, Act>>>(
        alpha);
  if (tile == "pp128x64")
    return std::make_unique<GemmF16<Config<Shape<_128, _64, _64>, PingPong, PingPongEpi, Act>>>(
        alpha);
  return nullptr;
}

}  // namespace

const std::vector<std::string>& f16_gemm_tiles() {
  static const std::vector<std::string> k = {"coop256x128", "pp128x128", "pp128x64",
                                             "coop128x192"};
  return k;
}

std::unique_ptr<F16Gemm> make_f16_gemm(F16GemmAct act, const std::string& tile, float alpha) {
  switch (act) {
    case F16GemmAct::kNone:
      return make<cutlass::epilogue::thread::Identity>(tile);
    case F16GemmAct::kGelu:
      return make<GeluErfTanh>(tile);
    case F16GemmAct::kGeluTanh:
      return make<cutlass::epilogue::thread::GELU_taylor>(tile);
    case F16GemmAct::kSwish:
      return make<SwishAlpha>(tile, alpha);
  }
  return nullptr;
}

}  // namespace kiln::cuda
