// keep_fp32.h on the host (no GPU): an FP16 build keeps a positional encoding's Sin and Cos, and
// the chain computing their argument from an integer input, at FP32; a Sin of an activation and
// the layers after the encoding take FP16 as usual; a --layer-precisions pin still decides.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backends/cuda/keep_fp32.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/plan.h"
#include "ops/op.h"

namespace kiln::gpu {
namespace {

// t int64 [N] -> Cast -> Unsqueeze -> Mul(freqs [1, 64]) -> Sin, Cos -> Concat -> MatMul(W) -> y
// x float [N, 64] -> Relu -> Sin -> z
std::unique_ptr<Graph> timestep_net() {
  auto g = std::make_unique<Graph>();
  Value* t = g->add_value("t", TensorType(DataType::kInt64, {Dim::sym("N")}));
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 64}));
  g->add_input(t);
  g->add_input(x);
  std::vector<float> f(64), w(128 * 32);
  for (int i = 0; i < 64; ++i) f[i] = std::exp(-9.21f * i / 64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 7);
  Node* cast = g->add_node("Cast", "cast", {t}, {"tf"});
  cast->attrs.set("to", Attribute::Int(1));
  Node* unsq = g->add_node(
      "Unsqueeze", "unsq",
      {cast->output(0), g->add_constant("ax", Tensor::from<int64_t>({1}, {1}))}, {"t2"});
  Node* mul = g->add_node(
      "Mul", "mul", {unsq->output(0), g->add_constant("freqs", Tensor::from<float>({1, 64}, f))},
      {"arg"});
  Node* sin = g->add_node("Sin", "sin", {mul->output(0)}, {"s"});
  Node* cos = g->add_node("Cos", "cos", {mul->output(0)}, {"c"});
  Node* cat = g->add_node("Concat", "cat", {sin->output(0), cos->output(0)}, {"emb"});
  cat->attrs.set("axis", Attribute::Int(1));
  Node* mm =
      g->add_node("MatMul", "proj",
                  {cat->output(0), g->add_constant("w", Tensor::from<float>({128, 32}, w))}, {"y"});
  Node* relu = g->add_node("Relu", "relu", {x}, {"r"});
  Node* sin2 = g->add_node("Sin", "sin_act", {relu->output(0)}, {"z"});
  g->add_output(mm->output(0));
  g->add_output(sin2->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

Precision precision_of(const Graph& g, const Plan& p, const std::string& name) {
  for (size_t k = 0; k < g.nodes().size(); ++k)
    if (g.nodes()[k]->name == name) {
      EXPECT_FALSE(p.layers[k].is_host()) << name << " runs on the host";
      return p.layers[k].precision;
    }
  ADD_FAILURE() << "no layer " << name;
  return Precision::kFP32;
}

TEST(KeepFp32, PositionalEncodingChainOnly) {
  auto g = timestep_net();
  auto keep = keep_fp32_nodes(*g);
  std::set<std::string> names;
  for (const auto& [n, why] : keep) {
    names.insert(n->name);
    EXPECT_FALSE(why.empty());
  }
  EXPECT_EQ(names, (std::set<std::string>{"cast", "unsq", "mul", "sin", "cos"}));
}

TEST(KeepFp32, Fp16BuildKeepsTheEncodingAtFp32UnlessPinned) {
  for (bool pinned : {false, true}) {
    auto g = timestep_net();
    GpuBuildOptions o;
    o.fp16 = true;
    o.tune = false;
    if (pinned) o.layer_precisions = {{"sin", "fp16"}};
    auto p = lower_for_gpu(*g, {{512}, {512, 64}}, o);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(precision_of(*g, *p, "mul") == Precision::kFP16, false);
    EXPECT_EQ(precision_of(*g, *p, "cos") == Precision::kFP16, false);
    EXPECT_EQ(precision_of(*g, *p, "sin") == Precision::kFP16, pinned);
    EXPECT_EQ(precision_of(*g, *p, "proj"), Precision::kFP16);
    EXPECT_EQ(precision_of(*g, *p, "sin_act"), Precision::kFP16);
  }
}

}  // namespace
}  // namespace kiln::gpu
