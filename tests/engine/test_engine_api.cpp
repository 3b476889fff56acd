#include <gtest/gtest.h>

#include <filesystem>

#include "engine/plan_format.h"
#include "kiln/engine.h"

namespace kiln {
namespace {

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + name)).string();
}

std::unique_ptr<Graph> relu_graph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(4)}));
  g->add_input(x);
  Node* n = g->add_node("Relu", "relu", {x}, {"y"});
  n->output(0)->type = x->type;
  g->add_output(n->output(0));
  return g;
}

TEST(EngineApi, EngineForAnotherTargetIsRefused) {
  EngineMetadata meta;
  meta.backend = "cpu";
  meta.target = "cpu-someotherarch";
  meta.build_options = nlohmann::json::object();
  const std::string path = tmp("other_target.kiln");
  ASSERT_TRUE(write_plan_file(path, *relu_graph(), meta).ok());
  auto e = Engine::load(path);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("rebuild"), std::string::npos) << e.status().message();
  std::filesystem::remove(path);
}

TEST(EngineApi, CudaEngineWithoutUsableBackendIsRefused) {
  EngineMetadata meta;
  meta.backend = "cuda";
  meta.target = "cuda-sm_90-cudart13000";
  meta.build_options = nlohmann::json::object();
  const std::string path = tmp("cuda.kiln");
  ASSERT_TRUE(write_plan_file(path, *relu_graph(), meta).ok());
  auto e = Engine::load(path);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("cuda"), std::string::npos) << e.status().message();
  std::filesystem::remove(path);
}

TEST(EngineApi, RoundTripRunsAndChecksInputs) {
  EngineMetadata meta;
  meta.backend = "cpu";
  meta.target = current_target("cpu");
  meta.build_options = {{"profile", {{"x", {{"min", {1, 4}}, {"opt", {2, 4}}, {"max", {3, 4}}}}}}};
  const std::string path = tmp("rt.kiln");
  ASSERT_TRUE(write_plan_file(path, *relu_graph(), meta).ok());
  auto e = Engine::load(path);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->inputs()[0].str(), "x: float32[N,4]");
  auto ctx = (*e)->create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  Tensor x = Tensor::from<float>({2, 4}, {-1, 2, -3, 4, 5, -6, 7, -8});
  auto out = (*ctx)->execute({{"x", x}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].data<float>()[0], 0.f);
  EXPECT_EQ((*out)[0].data<float>()[1], 2.f);
  // Outside the profile, wrong static dim, wrong type, missing and unknown inputs.
  EXPECT_FALSE((*ctx)->execute({{"x", Tensor(DataType::kFloat32, {4, 4})}}).ok());
  EXPECT_FALSE((*ctx)->execute({{"x", Tensor(DataType::kFloat32, {2, 5})}}).ok());
  EXPECT_FALSE((*ctx)->execute({{"x", Tensor(DataType::kFloat64, {2, 4})}}).ok());
  EXPECT_FALSE((*ctx)->execute({}).ok());
  EXPECT_FALSE((*ctx)->execute({{"x", x}, {"z", x}}).ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln
