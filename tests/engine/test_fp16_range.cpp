// The FP16 range report (--fp16 --verbose): names the layers whose FP32 outputs reach beyond
// float16's range, and only those. Runs through the CPU reference here (the cuda backend runs the
// same check on the GPU).
#include <gtest/gtest.h>

#include <sstream>

#include "engine/fp16_range.h"
#include "ops/op.h"

namespace kiln {
namespace {

// x [2,8] (or [N,8]) -> Mul(x, k) "scale" -> Relu "relu" -> y
std::unique_ptr<Graph> scaled_graph(float k, bool dynamic_batch = false) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value(
      "x", dynamic_batch ? TensorType(DataType::kFloat32, {Dim::sym("N"), 8})
                         : TensorType(DataType::kFloat32, {2, 8}));
  g->add_input(x);
  Value* kv = g->add_constant("k", Tensor::scalar<float>(k));
  Node* mul = g->add_node("Mul", "scale", {x, kv}, {"scaled"});
  Node* relu = g->add_node("Relu", "relu", {mul->output(0)}, {"y"});
  g->add_output(relu->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

// The report for scaled_graph(k), run through the CPU reference.
std::string report_for(float k) {
  auto g = scaled_graph(k);
  auto profile = Profile::from_config(*g, BuildConfig{});
  EXPECT_TRUE(profile.ok());
  std::ostringstream log;
  if (profile.ok()) report_fp16_range(*g, *profile, "cpu", log);
  return log.str();
}

TEST(Fp16Range, NamesTheLayersBeyondFloat16) {
  const std::string log = report_for(1e6f);  // |N(0,1)| * 1e6: far beyond 65504 for most values
  EXPECT_NE(log.find("'scale'"), std::string::npos) << log;
  EXPECT_NE(log.find("--layer-precisions scale:fp32"), std::string::npos) << log;
}

TEST(Fp16Range, QuietWhenEverythingFits) {
  const std::string log = report_for(2.f);
  EXPECT_NE(log.find("stays within"), std::string::npos) << log;
  EXPECT_EQ(log.find("beyond"), std::string::npos) << log;
}

// A batch range: the check runs at the opt shapes with the batch at its minimum.
TEST(Fp16Range, RunsAtTheSmallestBatch) {
  auto g = scaled_graph(2.f, true);
  BuildConfig c;
  c.min_shapes = {{"x", {1, 8}}};
  c.opt_shapes = {{"x", {16, 8}}};
  c.max_shapes = {{"x", {32, 8}}};
  auto profile = Profile::from_config(*g, c);
  ASSERT_TRUE(profile.ok()) << profile.status().message();
  std::ostringstream log;
  report_fp16_range(*g, *profile, "cpu", log);
  EXPECT_NE(log.str().find("(x:1x8)"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace kiln
