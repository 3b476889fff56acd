// The CUDA backend's host-side pieces, which need no GPU: plan records, host-node classification,
// shape evaluation, format conversion and the timing cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "backends/cuda/device_util_host.h"
#include "backends/cuda/layer.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/plan.h"
#include "backends/cuda/shape_eval.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuner.h"
#include "ops/op.h"

namespace kiln::gpu {
namespace {

// x [N,4,3] -> Reshape(x, Concat(Shape(x)[0], [12])) -> Relu: the Reshape target comes from shapes.
std::unique_ptr<Graph> reshape_by_shape_graph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 4, 3}));
  g->add_input(x);
  Node* shape = g->add_node("Shape", "shape", {x}, {"s"});
  Value* idx = g->add_constant("i0", Tensor::from<int64_t>({1}, {0}));
  Node* gather = g->add_node("Gather", "gather", {shape->output(0), idx}, {"n"});
  Value* twelve = g->add_constant("twelve", Tensor::from<int64_t>({1}, {12}));
  Node* cat = g->add_node("Concat", "cat", {gather->output(0), twelve}, {"target"});
  cat->attrs.set("axis", Attribute::Int(0));
  Node* reshape = g->add_node("Reshape", "reshape", {x, cat->output(0)}, {"r"});
  Node* relu = g->add_node("Relu", "relu", {reshape->output(0)}, {"y"});
  g->add_output(relu->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

// TF32 convolutions do not offer cuDNN's FFT and Winograd algorithms to the tuner (they round
// transformed values to TF32); strict FP32 and FP16 still do.
TEST(CudaHost, Tf32ConvolutionsLeaveOutFftAndWinograd) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {1, 8, 9, 9}));
  g.add_input(x);
  Value* w = g.add_constant("w", Tensor(DataType::kFloat32, {8, 8, 3, 3}));
  Node* n = g.add_node("Conv", "conv", {x, w}, {"y"});
  g.add_output(n->output(0));
  ASSERT_TRUE(infer_shapes(g).ok());
  const TacticDef* t = find_tactic("cudnn.conv");
  ASSERT_TRUE(t && t->variants);
  auto variants = [&](Precision p) {
    LayerDesc d;
    d.node = n;
    d.precision = p;
    return t->variants(d);
  };
  const std::vector<std::string> lossy = {"4", "5", "6", "7"};  // FFT, FFT_TILING, WINOGRAD(_NONFUSED)
  const std::vector<std::string> tf32 = variants(Precision::kTF32);
  const std::vector<std::string> strict = variants(Precision::kFP32);
  for (const std::string& a : lossy) {
    EXPECT_EQ(std::count(tf32.begin(), tf32.end(), a), 0) << a;
    EXPECT_EQ(std::count(strict.begin(), strict.end(), a), 1) << a;
  }
  EXPECT_EQ(tf32.size() + lossy.size(), strict.size());
}

// The tuner's pick: least layer time plus the reformats a candidate's input formats add; failed
// candidates (time -1) never win.
TEST(CudaHost, CheapestCountsReformatCosts) {
  std::vector<LayerChoice> c(3);
  c[0].time_ms = 0.10;  // e.g. an INT8 kernel whose input is already int8
  c[1].time_ms = 0.08;  // an FP16 kernel that needs the int8 input converted
  c[2].time_ms = -1;    // failed
  EXPECT_EQ(cheapest(c, {}), 1u);
  EXPECT_EQ(cheapest(c, {0.0, 0.05, 0.0}), 0u);
  EXPECT_EQ(cheapest(c, {0.0, 0.01, 0.0}), 1u);
  c[0].time_ms = c[1].time_ms = -1;
  EXPECT_EQ(cheapest(c, {}), 3u);
}

TEST(CudaHost, ShapeArithmeticRunsOnTheHost) {
  auto g = reshape_by_shape_graph();
  const std::vector<bool> host = host_nodes(*g);
  ASSERT_EQ(host.size(), 5u);
  EXPECT_EQ(host, (std::vector<bool>{true, true, true, false, false}));
  for (int64_t n : {1, 7}) {
    auto r = evaluate_shapes(*g, host, {{n, 4, 3}});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->shapes.at(g->outputs()[0]), (std::vector<int64_t>{n, 12}));
    const Tensor& target = *r->host.at(g->find_value("target"));
    EXPECT_EQ(target.to_int64_vector(), (std::vector<int64_t>{n, 12}));
  }
  auto bad = evaluate_shapes(*g, host, {{2, 5, 3}});
  EXPECT_FALSE(bad.ok());
}

// ONNX's Attention function at -O0: Pad(mask, pads, CastLike(-inf, mask)). CastLike reads the
// mask only for its type, so the fill value is computed on the host, as Pad needs it.
TEST(CudaHost, CastLikeOfAConstantRunsOnTheHost) {
  auto g = std::make_unique<Graph>();
  Value* m = g->add_value("mask", TensorType(DataType::kFloat16, {Dim::sym("N"), 4}));
  g->add_input(m);
  Value* neg = g->add_constant("neg", Tensor::scalar<float>(-2.5f));
  Node* like = g->add_node("CastLike", "like", {neg, m}, {"fill"});
  Value* pads = g->add_constant("pads", Tensor::from<int64_t>({4}, {0, 0, 0, 2}));
  Node* pad = g->add_node("Pad", "pad", {m, pads, like->output(0)}, {"y"});
  g->add_output(pad->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  const std::vector<bool> host = host_nodes(*g);
  EXPECT_EQ(host, (std::vector<bool>{true, false}));
  auto r = evaluate_shapes(*g, host, {{3, 4}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Tensor& fill = *r->host.at(g->find_value("fill"));
  EXPECT_EQ(fill.dtype(), DataType::kFloat16);
  EXPECT_EQ(fill.at_double(0), -2.5);
  EXPECT_EQ(r->shapes.at(g->outputs()[0]), (std::vector<int64_t>{3, 6}));
}

// Range(0, Cast(limit), 1): Range reads its limit on the host, so the graph input it is computed
// from is read on the host too and the Cast runs there. A limit computed from a large activation
// (ReduceMax of an image) is not: it stays a GPU value (and the lowering names it).
TEST(CudaHost, SmallValuesThatDecideShapesAreReadOnTheHost) {
  for (bool small : {true, false}) {
    auto g = std::make_unique<Graph>();
    Value* in = g->add_value("in", small ? TensorType(DataType::kInt32, std::vector<Dim>{})
                                         : TensorType(DataType::kFloat32, {1, 3, 224, 224}));
    g->add_input(in);
    Value* limit = in;
    if (!small) {
      Node* r = g->add_node("ReduceMax", "max", {in}, {"m"});
      r->attrs.set("keepdims", Attribute::Int(0));
      limit = r->output(0);
    }
    Node* cast = g->add_node("Cast", "cast", {limit}, {"limit"});
    cast->attrs.set("to", Attribute::Int(static_cast<int64_t>(DataType::kInt64)));
    Value* zero = g->add_constant("zero", Tensor::scalar<int64_t>(0));
    Value* one = g->add_constant("one", Tensor::scalar<int64_t>(1));
    Node* range = g->add_node("Range", "range", {zero, cast->output(0), one}, {"y"});
    g->add_output(range->output(0));
    ASSERT_TRUE(infer_shapes(*g).ok());
    const std::vector<bool> host_in = host_value_inputs(*g);
    EXPECT_EQ(host_in, std::vector<bool>{small});
    const std::vector<bool> host = host_nodes(*g, host_in);
    EXPECT_EQ(host.back(), small) << "Range";
  }
}

TEST(CudaHost, PlanRecordsRoundTripAndAreValidated) {
  auto g = reshape_by_shape_graph();
  Plan p;
  for (size_t k = 0; k < g->nodes().size(); ++k) p.layers.push_back(LayerChoice{});
  const nlohmann::json j = plan_to_json(p);
  auto back = plan_from_json(*g, j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers.size(), g->nodes().size());
  nlohmann::json short_plan = j;
  short_plan["layers"].erase(0);
  EXPECT_NE(plan_from_json(*g, short_plan).status().message().find("4 layer records for 5"),
            std::string::npos);
  nlohmann::json unknown = j;
  unknown["layers"][4] = {{"tactic", "no.such.tactic"}, {"precision", "fp32"}};
  const std::string m = plan_from_json(*g, unknown).status().message();
  EXPECT_NE(m.find("unknown tactic 'no.such.tactic'"), std::string::npos) << m;
  EXPECT_NE(m.find("relu"), std::string::npos) << m;
  EXPECT_FALSE(plan_from_json(*g, nlohmann::json::array()).ok());
}

TEST(CudaHost, NhwcConversionRoundTrips) {
  Tensor t(DataType::kFloat32, {2, 3, 4, 5});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i) * 0.5f - 7.f;
  const TensorFormat f{DataType::kFloat16, Layout::kNHWC};
  auto d = to_device_format(t, f);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->dtype(), DataType::kFloat16);
  // Element (n=1, c=2, h=3, w=4) sits at ((1*4+3)*5+4)*3+2 in N,H,W,C order.
  EXPECT_FLOAT_EQ(d->at_double(((1 * 4 + 3) * 5 + 4) * 3 + 2), t.at_double(((1 * 3 + 2) * 4 + 3) * 5 + 4));
  auto back = from_device_format(*d, f, DataType::kFloat32);
  ASSERT_TRUE(back.ok());
  for (int64_t i = 0; i < t.numel(); ++i) EXPECT_FLOAT_EQ(back->at_double(i), t.at_double(i));
}

TEST(CudaHost, TimingCacheKeepsEntriesPerDevice) {
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_tc_test.json").string();
  std::filesystem::remove(path);
  {
    auto c = TimingCache::open(path, "gpu A");
    ASSERT_TRUE(c.ok());
    c->put("conv|x", 0.25);
    ASSERT_TRUE(c->save().ok());
  }
  auto same = TimingCache::open(path, "gpu A");
  ASSERT_TRUE(same.ok());
  ASSERT_TRUE(same->find("conv|x").has_value());
  EXPECT_DOUBLE_EQ(*same->find("conv|x"), 0.25);
  auto other = TimingCache::open(path, "gpu B");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->device_mismatch());
  EXPECT_FALSE(other->find("conv|x").has_value());
  std::ofstream(path) << "not json";
  EXPECT_FALSE(TimingCache::open(path, "gpu A").ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kiln::gpu
