// What the INT8 tactics over CUTLASS's persistent GEMM kernels share (cutlass_sm90_gemm.cu: 1x1
// stride-1 convolutions as GEMMs; cutlass_sm90_pconv.cu: the other convolutions as implicit
// GEMMs): the GEMM view Y[M = N*P*Q][K] with Y and the int8 residual row-major, kiln's fused INT8
// epilogue (cutlass_int8_epilogue.h), the device's SM count for the persistent grid, the KRSC
// weights' own copy and the run. A tactic gives its name and the GEMM extents in init() and the
// mainloop's arguments for an input pointer.
// Include only from a .cu that includes CUTLASS's GEMM and epilogue headers first.
#pragma once

#include <cstdint>
#include <string>

#include "check.h"
#include "conv_sources.h"
#include "cutlass_int8_epilogue.h"
#include "device_buffer.h"

namespace kiln::cuda {

// The fused INT8 epilogue as a CUTLASS sm90 collective over a row-major int8 Y (and residual C):
// PerColLinCombPerColBiasEltAct<Clamp> with CutlassInt8Constants' values. EpiTile: the subtile
// (CUTLASS's default: 64 x 64 for ping-pong int8, 128 x 32 for cooperative); a larger one loads
// the residual and stores Y in fewer, larger TMA transfers.
template <class TileShape, class Cluster, class EpilogueSchedule,
          class EpiTile = cutlass::epilogue::collective::EpilogueTileAuto>
using CutlassInt8Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, Cluster, EpiTile, int32_t,
    float, int8_t, cutlass::layout::RowMajor, 16, int8_t, cutlass::layout::RowMajor, 16,
    EpilogueSchedule,
    cutlass::epilogue::fusion::PerColLinCombPerColBiasEltAct<
        cutlass::epilogue::thread::Clamp, int8_t, float, float, int8_t, float>>::CollectiveOp;

template <class Gemm>
class CutlassInt8GemmTactic : public ConvTactic {
 public:
  CutlassInt8GemmTactic(std::string name, std::string family)
      : name_(std::move(name)), family_(std::move(family)) {}
  std::string name() const override { return name_; }
  std::string family() const override { return family_; }
  size_t workspace_size() const override { return workspace_; }

  Status prepare_weights(const void* w, cudaStream_t stream) override {
    return copy_weights_krsc(weights_, problem_, w, stream);
  }

  Status run(const ConvBuffers& b, cudaStream_t stream) override {
    return runner_.run(
        gemm_, problem_, b, &constants_, stream,
        [this](const void* x, const void* c, void* y) { return arguments(x, c, y); });
  }

 protected:
  using E = int8_t;
  using MainloopArguments = typename Gemm::GemmKernel::MainloopArguments;

  // The epilogue's constants, then the GEMM extents (m x n, a k-deep reduction) and the checks.
  Status init_gemm(const ConvProblem& p, int m, int n, int k) {
    problem_ = p;
    KILN_TRY(constants_.init(p));
    m_ = m;
    n_ = n;
    k_ = k;
    stride_c_ = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(m_, n_, 1));
    stride_d_ = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(m_, n_, 1));
    int device = 0;
    KILN_CUDA(cudaGetDevice(&device));
    hw_.device_id = device;
    hw_.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
    auto args = arguments(nullptr, nullptr, nullptr);
    KILN_TRY(cutlass_status(Gemm::can_implement(args), "can_implement"));
    workspace_ = Gemm::get_workspace_size(args);
    return {};
  }

  // The mainloop's arguments for input x, with the weights at weights().
  virtual MainloopArguments mainloop(const void* x) const = 0;
  const E* weights() const { return static_cast<const E*>(weights_.get()); }

 private:
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;

  typename Gemm::Arguments arguments(const void* x, const void* c, void* y) const {
    typename Gemm::Arguments a{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m_, n_, k_, 1},
        mainloop(x),
        {{}, static_cast<const E*>(c), stride_c_, static_cast<E*>(y), stride_d_},
        hw_};
    constants_.fill(a.epilogue.thread);
    return a;
  }

  std::string name_, family_;
  ConvProblem problem_;
  int m_ = 0, n_ = 0, k_ = 0;
  StrideC stride_c_{};
  StrideD stride_d_{};
  cutlass::KernelHardwareInfo hw_{};
  size_t workspace_ = 0;
  DeviceBuffer weights_;
  CutlassInt8Constants constants_;
  Gemm gemm_;
  CutlassRunner runner_;
};

}  // namespace kiln::cuda
