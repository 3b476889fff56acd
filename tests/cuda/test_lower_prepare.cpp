// prepare_for_gpu (lower_prepare.cpp) on the host, no GPU: float inputs of mixed types that no
// GPU kernel takes are cast to input 0's type ahead of the layer; what a kernel takes as it is
// stays as it is.
#include <gtest/gtest.h>

#include "backends/cuda/lower.h"
#include "backends/cuda/plan.h"
#include "ops/op.h"

namespace kiln::gpu {
namespace {

// x [1, 3, 7, 9] (x_type) -> GridSample(grid [1, 4, 5, 2] of grid_type) -> y
std::unique_ptr<Graph> sampler(DataType x_type, DataType grid_type) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(x_type, {1, 3, 7, 9}));
  Value* grid = g->add_value("grid", TensorType(grid_type, {1, 4, 5, 2}));
  g->add_input(x);
  g->add_input(grid);
  Node* gs = g->add_node("GridSample", "sample", {x, grid}, {"y"});
  g->add_output(gs->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

TEST(LowerPrepare, AFloat64GridIsCastToTheImagesType) {
  for (bool fp16 : {false, true}) {
    auto g = sampler(DataType::kFloat32, DataType::kFloat64);
    GpuBuildOptions o;
    o.fp16 = fp16;
    const Node* gs = g->find_node("sample");
    ASSERT_FALSE(some_tactic_takes(*gs, o));
    ASSERT_TRUE(prepare_for_gpu(*g, o).ok());
    const Node* cast = gs->input(1)->producer;
    ASSERT_NE(cast, nullptr);
    EXPECT_EQ(cast->op_type, "Cast");
    EXPECT_EQ(cast->input(0)->name, "grid");
    EXPECT_EQ(gs->input(1)->type.dtype, DataType::kFloat32);
    EXPECT_EQ(gs->output(0)->type.dtype, DataType::kFloat32);
    EXPECT_TRUE(some_tactic_takes(*gs, o));
    // The Cast comes first in the node order.
    EXPECT_EQ(g->nodes().front(), cast);
  }
}

TEST(LowerPrepare, MatchingTypesStayAsTheyAre) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat64}) {
    auto g = sampler(t, t);
    GpuBuildOptions o;
    ASSERT_TRUE(prepare_for_gpu(*g, o).ok());
    EXPECT_EQ(g->nodes().size(), 1u);
  }
  // A float64 image with a float32 grid: the grid is widened (exactly).
  auto g = sampler(DataType::kFloat64, DataType::kFloat32);
  GpuBuildOptions o;
  ASSERT_TRUE(prepare_for_gpu(*g, o).ok());
  ASSERT_EQ(g->nodes().size(), 2u);
  EXPECT_EQ(g->find_node("sample")->input(1)->type.dtype, DataType::kFloat64);
}

}  // namespace
}  // namespace kiln::gpu
