// The FP16 range report (--fp16 --verbose): names the layers whose FP32 outputs reach beyond
// float16's range, and only those. Runs through the CPU reference here (the cuda backend runs the
// same check on the GPU).
#include <gtest/gtest.h>

#include <sstream>

#include "engine/fp16_range.h"
#include "ops/op.h"

namespace kiln {
namespace {

// x [2,8] -> Mul(x, k) "scale" -> Relu "relu" -> y
std::unique_ptr<Graph> scaled_graph(float k) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 8}));
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

}  // namespace
}  // namespace kiln
