// keep_fp32.h on the host (no GPU): an FP16 build keeps a positional encoding's Sin and Cos, and
// the chain computing their argument from an integer input, at FP32; a Sin of an activation and
// the layers after the encoding take FP16 as usual; a --layer-precisions pin still decides. Also
// sampling coordinates: a GridSample, the chain computing its grid from a convolution's output,
// and the flow computed from that chain alone, at FP32; the convolution and what reads the
// sampled values take FP16.
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

// RAFT's lookup in small: x [1, 8, 6, 10] -> Conv -> delta [1, 2, 6, 10];
// coords = Add(base, delta) -> Transpose [1, 6, 10, 2] -> Div -> Sub -> grid -> GridSample(x) ->
// Relu -> out; flow = Sub(coords, base) -> Mul(8) -> flow8 (the base grid a constant).
std::unique_ptr<Graph> lookup_net() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {1, 8, 6, 10}));
  g->add_input(x);
  std::vector<float> w(2 * 8 * 3 * 3), base(2 * 6 * 10);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 5);
  for (int y = 0; y < 6; ++y)
    for (int xx = 0; xx < 10; ++xx) base[y * 10 + xx] = float(xx), base[60 + y * 10 + xx] = float(y);
  auto scalar = [&](const char* name, float v) {
    return g->add_constant(name, Tensor::from<float>({1}, {v}));
  };
  Node* conv = g->add_node("Conv", "conv",
                           {x, g->add_constant("w", Tensor::from<float>({2, 8, 3, 3}, w))}, {"delta"});
  conv->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
  Node* add = g->add_node(
      "Add", "coords",
      {g->add_constant("base", Tensor::from<float>({1, 2, 6, 10}, base)), conv->output(0)}, {"c"});
  Node* tr = g->add_node("Transpose", "to_points", {add->output(0)}, {"ct"});
  tr->attrs.set("perm", Attribute::Ints({0, 2, 3, 1}));
  Node* div = g->add_node("Div", "scale", {tr->output(0), scalar("half", 4.5f)}, {"cd"});
  Node* sub = g->add_node("Sub", "shift", {div->output(0), scalar("one", 1.f)}, {"grid"});
  Node* gs = g->add_node("GridSample", "lookup", {x, sub->output(0)}, {"s"});
  gs->attrs.set("align_corners", Attribute::Int(1));
  Node* relu = g->add_node("Relu", "features", {gs->output(0)}, {"out"});
  Node* flow = g->add_node(
      "Sub", "flow",
      {add->output(0), g->add_constant("base2", Tensor::from<float>({1, 2, 6, 10}, base))}, {"f"});
  Node* up = g->add_node("Mul", "flow8", {flow->output(0), scalar("eight", 8.f)}, {"f8"});
  g->add_output(relu->output(0));
  g->add_output(up->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

TEST(KeepFp32, SamplingCoordinatesAndTheFlowFromThem) {
  auto g = lookup_net();
  std::set<std::string> names;
  for (const auto& [n, why] : keep_fp32_nodes(*g)) {
    names.insert(n->name);
    EXPECT_FALSE(why.empty());
  }
  EXPECT_EQ(names, (std::set<std::string>{"coords", "to_points", "scale", "shift", "lookup",
                                          "flow", "flow8"}));
  GpuBuildOptions o;
  o.fp16 = true;
  o.tune = false;
  auto p = lower_for_gpu(*g, {{1, 8, 6, 10}}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(precision_of(*g, *p, "conv"), Precision::kFP16);
  EXPECT_NE(precision_of(*g, *p, "lookup"), Precision::kFP16);
  EXPECT_NE(precision_of(*g, *p, "coords"), Precision::kFP16);
  EXPECT_NE(precision_of(*g, *p, "flow8"), Precision::kFP16);
  EXPECT_EQ(precision_of(*g, *p, "features"), Precision::kFP16);
}

// The coordinate updates fused into the convolutions computing them (the optimizer's residual
// add: c1 = Conv(x) + base, c2 = Conv(x) + c1) are kept with the grid's chain, and so are a last
// update no GridSample reads (c3 = Conv(x) + c2) and the flow computed from it.
TEST(KeepFp32, CoordinateUpdatesFusedAsResiduals) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {1, 8, 6, 10}));
  g->add_input(x);
  std::vector<float> w(2 * 8 * 3 * 3, 0.01f), b(2, 0.f), base(2 * 6 * 10, 3.f);
  Value* wv = g->add_constant("w", Tensor::from<float>({2, 8, 3, 3}, w));
  Value* bv = g->add_constant("b", Tensor::from<float>({2}, b));
  auto update = [&](const char* name, Value* from) {
    Node* c = g->add_node("FusedConv", name, {x, wv, bv, from}, {std::string(name) + "_y"}, "kiln");
    c->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
    return c->output(0);
  };
  Value* c1 = update("update1", g->add_constant("base", Tensor::from<float>({1, 2, 6, 10}, base)));
  Value* c2 = update("update2", c1);
  Node* tr = g->add_node("Transpose", "to_points", {c2}, {"ct"});
  tr->attrs.set("perm", Attribute::Ints({0, 2, 3, 1}));
  Node* gs = g->add_node("GridSample", "lookup", {x, tr->output(0)}, {"s"});
  Node* relu = g->add_node("Relu", "features", {gs->output(0)}, {"out"});
  // The last update, which no GridSample reads, and the flow from it.
  Node* flow = g->add_node(
      "Sub", "flow",
      {update("update3", c2), g->add_constant("base2", Tensor::from<float>({1, 2, 6, 10}, base))},
      {"f"});
  g->add_output(relu->output(0));
  g->add_output(flow->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  std::set<std::string> names;
  for (const auto& [n, why] : keep_fp32_nodes(*g)) names.insert(n->name);
  EXPECT_EQ(names, (std::set<std::string>{"update1", "update2", "to_points", "lookup", "update3",
                                          "flow"}));
}

}  // namespace
}  // namespace kiln::gpu
