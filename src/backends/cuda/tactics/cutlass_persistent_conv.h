// CUTLASS's sm90 implicit-GEMM conv mainloop (TMA im2col loads + wgmma) under CUTLASS's
// persistent GEMM kernels (ping-pong and cooperative), which CUTLASS 4.2 does not offer: its conv
// dispatch policy refuses the persistent schedules, and its persistent kernels take only a GEMM
// problem shape (rank-3 strides, an L mode on the loaded tiles). PersistentConvMainloop is the
// conv collective itself, rebound to a persistent GEMM schedule, with the few entry points those
// kernels call adapted:
//  - Arguments carry the conv problem shape beside the conv collective's own arguments; the
//    kernel's problem shape is the GEMM view (M = N*P*Q, N = K, K = the padded C*R*S, L = 1).
//  - Params keep the conv collective's (TMA descriptors) plus the linearized conv shape that its
//    load_init needs (its K mode is the (C, S, R) tuple the im2col TMA walks).
//  - load_init adds the L mode the kernels index (size 1) and keeps the conv tiles for load().
// Nothing else changes: the loads, the pipeline, the MMAs and the epilogue are CUTLASS's own.
// Device code; include only from a .cu that includes CUTLASS's conv and GEMM headers first.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/conv/collective/collective_conv.hpp"
#include "cutlass/conv/dispatch_policy.hpp"

namespace kiln::cuda {

// The same CollectiveConv with the persistent schedule in its dispatch policy and its MMA atom
// tiled over WarpGroups warp groups along M. It matches the policy's parameters without
// instantiating the policy, which refuses CUTLASS's own persistent conv schedule tags.
template <class Collective, class Schedule, int WarpGroups>
struct RebindConvSchedule;
template <cutlass::conv::Operator Op, int Stages, int Dims, class Cluster, class Old, int MmaStages,
          class TileShape, class ElementA, class ElementB, class TiledMma, class TraitsA,
          class TraitsB, class Schedule, int WarpGroups>
struct RebindConvSchedule<cutlass::conv::collective::CollectiveConv<
                              cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<
                                  Op, Stages, Dims, Cluster, Old, MmaStages>,
                              TileShape, ElementA, ElementB, TiledMma, TraitsA, TraitsB>,
                          Schedule, WarpGroups> {
  using Mma = decltype(cute::make_tiled_mma(
      typename TiledMma::Atom{},
      cute::Layout<cute::Shape<cute::Int<WarpGroups>, cute::_1, cute::_1>>{}));
  using type = cutlass::conv::collective::CollectiveConv<
      cutlass::conv::MainloopSm90TmaGmmaWarpSpecializedImplicitGemm<Op, Stages, Dims, Cluster,
                                                                    Schedule, MmaStages>,
      TileShape, ElementA, ElementB, Mma, TraitsA, TraitsB>;
};

// Conv: a CollectiveConv from CUTLASS's conv builder with KernelImplicitTmaWarpSpecializedSm90.
// Schedule: the persistent GEMM schedule whose kernel runs it; WarpGroups: the warp groups that
// share one tile's MMA (1 for ping-pong, 2 for cooperative).
template <class Conv, class Schedule, int WarpGroups>
struct PersistentConvMainloop : RebindConvSchedule<Conv, Schedule, WarpGroups>::type {
  using Base = typename RebindConvSchedule<Conv, Schedule, WarpGroups>::type;
  using ConvShape =
      cutlass::conv::ConvProblemShape<Base::DispatchPolicy::ConvOp, Base::NumSpatialDimensions>;
  using LinearShape = decltype(Base::get_problem_shape_MNKL(ConvShape{}));

  // What the GEMM kernels check of a mainloop: rank-3 strides (unused: the TMA descriptors carry
  // the real ones) and one producer thread event per stage.
  using StrideA = cute::Stride<int64_t, cute::_1, int64_t>;
  using StrideB = cute::Stride<int64_t, cute::_1, int64_t>;
  static constexpr int NumProducerThreadEvents = 1;

  struct Arguments {
    ConvShape problem;
    typename Base::Arguments conv;
  };
  struct Params : Base::Params {
    LinearShape shape;
  };

  template <class GemmShape>
  static Params to_underlying_arguments(GemmShape const&, Arguments const& a, void* workspace) {
    return {Base::to_underlying_arguments(a.problem, a.conv, workspace),
            Base::get_problem_shape_MNKL(a.problem)};
  }
  template <class GemmShape>
  static bool can_implement(GemmShape const&, Arguments const& a) {
    return Base::can_implement(a.problem, a.conv);
  }
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& p) {
    Base::prefetch_tma_descriptors(p);
  }

  // (A, B) with an L mode of size 1 for the kernel, then the conv tiles for load().
  template <class GemmShapeMNKL>
  CUTLASS_DEVICE auto load_init(GemmShapeMNKL const&, Params const& p) {
    auto conv_tiles = Base::load_init(p.shape, p);
    auto with_l = [](auto const& t) {
      return cute::make_tensor(t.data(),
                               cute::append<5>(t.layout(), cute::Layout<cute::_1, cute::_0>{}));
    };
    return cute::make_tuple(with_l(cute::get<0>(conv_tiles)), with_l(cute::get<1>(conv_tiles)),
                            cute::get<0>(conv_tiles), cute::get<1>(conv_tiles));
  }

  template <class Pipeline, class State, class Inputs, class BlockCoord, class KIter, class Storage>
  CUTLASS_DEVICE void load(Params const& p, Pipeline pipeline, State state, Inputs const& inputs,
                           BlockCoord const& blk_coord, KIter k_tile_iter, int k_tile_count,
                           int thread_idx, uint32_t block_rank_in_cluster, Storage& storage) {
    Base::load(p, pipeline, state, cute::make_tuple(cute::get<2>(inputs), cute::get<3>(inputs)),
               blk_coord, k_tile_iter, k_tile_count, thread_idx, block_rank_in_cluster, storage);
  }
};

}  // namespace kiln::cuda
