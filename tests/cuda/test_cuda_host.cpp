// The CUDA backend's host-side pieces, which need no GPU: plan records, host-node classification,
// shape evaluation, format conversion and the timing cache.
#include <cublas_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "backends/backend.h"
#include "backends/cuda/device_util_host.h"
#include "backends/cuda/kernels/fast_div.cuh"
#include "backends/cuda/kernels/gelu_erf.cuh"
#include "backends/cuda/kernels/int8.cuh"
#include "backends/cuda/format_choice.h"
#include "backends/cuda/layer.h"
#include "backends/cuda/layers/gemm_common.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/memory_check.h"
#include "backends/cuda/plan.h"
#include "backends/cuda/rtc.h"
#include "backends/cuda/shape_eval.h"
#include "backends/cuda/timing_cache.h"
#include "backends/cuda/tuner.h"
#include "engine/describe.h"
#include "engine/profile.h"
#include "ops/op.h"
#include "passes/pipeline.h"
#include "quant/int8.h"

namespace kiln::gpu {
namespace {

// x [N,4,3] -> Reshape(x, Concat(Shape(x)[0], [12])) -> Relu: the Reshape target comes from shapes.
// The name of a tactic for `op` (ai.onnx).
std::string_view find_tactic_for_op(std::string_view op) {
  const auto t = tactics_for("", op);
  return t.empty() ? std::string_view("none") : t[0]->name;
}

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

// cuBLAS and cuBLASLt are opened at their first call, not with libkiln (this program links it
// and makes no GPU context): cuBLASLt's initialisers would cost every process ~150 ms.
TEST(CudaHost, LoadingKilnLeavesCublasUnopened) {
  for (const char* base : {"libcublasLt.so.", "libcublas.so."}) {
    const std::string name = base + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
    EXPECT_EQ(h, nullptr) << name << " was loaded with libkiln";
    if (h) dlclose(h);
  }
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

// The format choice. Formats: F = float16/nhwc, Q = int8/nhwc, L = float32/linear.
const TensorFormat kF{DataType::kFloat16, Layout::kNHWC}, kQ{DataType::kInt8, Layout::kNHWC},
    kL{DataType::kFloat32, Layout::kLinear};

// A chain input -> stem (FP16 only) -> n layers (candidate 0 FP16, candidate 1 INT8) -> output.
// Values: 0 the input, k+1 the output of layer k.
FormatChoice chain(size_t n, double f16_ms, double i8_ms, double reformat_ms, std::vector<size_t>* pick) {
  std::vector<FormatLayer> layers;
  std::vector<FormatValue> values(n + 2);
  values[0].fixed = kL;
  values[n + 1].wanted = {kL};
  FormatLayer stem;
  stem.time_ms = {0.5};
  stem.in = {{kF}};
  stem.out = {{kF}};
  stem.inputs = {0};
  stem.outputs = {1};
  layers.push_back(stem);
  for (size_t k = 1; k <= n; ++k) {
    FormatLayer l;
    l.time_ms = {f16_ms, i8_ms};
    l.in = {{kF}, {kQ}};
    l.out = {{kF}, {kQ}};
    l.inputs = {static_cast<int>(k)};
    l.outputs = {static_cast<int>(k + 1)};
    layers.push_back(l);
  }
  pick->assign(layers.size(), 0);
  return FormatChoice(std::move(layers), std::move(values),
                      [=](int, const TensorFormat&, const TensorFormat&) { return reformat_ms; });
}

// Greedy in node order would keep FP16 (each INT8 layer alone pays a quantizing reformat that is
// more than it saves); starting from the fastest candidates, the INT8 chain stays whole.
TEST(FormatChoice, KeepsAnInt8ChainThatPaysForItsReformats) {
  std::vector<size_t> pick;
  FormatChoice fc = chain(4, 1.0, 0.6, 0.5, &pick);
  EXPECT_DOUBLE_EQ(fc.total_ms(pick), 0.5 + 4 * 1.0 + 2 * 0.5);  // input and output reformats
  pick = {0, 1, 1, 1, 1};                                          // the fastest of each layer
  EXPECT_TRUE(fc.refine(pick).empty());
  EXPECT_EQ(pick, (std::vector<size_t>{0, 1, 1, 1, 1}));
  // in: L->F; stem F->Q (quantize); output: Q->L.
  EXPECT_NEAR(fc.total_ms(pick), 0.5 + 4 * 0.6 + 3 * 0.5, 1e-12);
}

// A single INT8 layer that saves less than the two reformats it causes goes back to FP16.
TEST(FormatChoice, MovesALoneLayerBackWhenItsReformatsCostMore) {
  std::vector<size_t> pick;
  FormatChoice fc = chain(1, 1.0, 0.8, 0.5, &pick);
  pick = {0, 1};
  const double before = fc.total_ms(pick);
  const auto moves = fc.refine(pick);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0].layer, 1u);
  EXPECT_EQ(moves[0].from, 1u);
  EXPECT_EQ(moves[0].to, 0u);
  // INT8: 0.8 + quantize 0.5 + Q->L 0.5; FP16: 1.0 + F->L 0.5.
  EXPECT_NEAR(moves[0].saved_ms, 0.3, 1e-12);
  EXPECT_EQ(pick, (std::vector<size_t>{0, 0}));
  EXPECT_NEAR(before - fc.total_ms(pick), moves[0].saved_ms, 1e-12);
}

// An INT8 layer between FP16 ones: its neighbours join it where that saves more than they lose
// (each saves 0.2 and a reformat), and the whole chain ends up INT8.
TEST(FormatChoice, GrowsAChainWhereThatSaves) {
  std::vector<size_t> pick;
  FormatChoice fc = chain(3, 1.0, 0.8, 0.5, &pick);
  pick = {0, 0, 1, 0};
  const double before = fc.total_ms(pick);
  const auto moves = fc.refine(pick);
  EXPECT_EQ(moves.size(), 2u);
  EXPECT_EQ(pick, (std::vector<size_t>{0, 1, 1, 1}));
  EXPECT_NEAR(before - fc.total_ms(pick), 0.9, 1e-12);  // 5.3 ms -> 4.4 ms
}

// Failed candidates (time < 0) are never picked, however many reformats they would save; one
// reformat serves every consumer that wants the same format.
TEST(FormatChoice, NeverPicksAFailedCandidateAndSharesReformats) {
  std::vector<FormatLayer> layers(3);
  std::vector<FormatValue> values(4);
  values[0].fixed = kL;
  layers[0] = {{0.1}, {{kL}}, {{kF}}, {0}, {1}};            // producer of value 1 (F)
  layers[1] = {{1.0, -1}, {{kQ}, {kF}}, {{kL}, {kL}}, {1}, {2}};  // reads 1 as Q; F failed
  layers[2] = {{1.0}, {{kQ}}, {{kL}}, {1}, {3}};            // reads 1 as Q too
  int timed = 0;
  FormatChoice fc(layers, values, [&](int, const TensorFormat&, const TensorFormat&) {
    ++timed;
    return 0.25;
  });
  std::vector<size_t> pick = {0, 0, 0};
  EXPECT_TRUE(fc.refine(pick).empty());
  EXPECT_EQ(pick[1], 0u);
  // value 0: L->L none; value 1: F->Q once for both readers; values 2, 3: nothing.
  EXPECT_NEAR(fc.total_ms(pick), 0.1 + 1.0 + 1.0 + 0.25, 1e-12);
  EXPECT_GT(timed, 0);
}

// Gated tactics stay out of every build unless KILN_UNVERIFIED_TACTICS=1: the fused stem +
// max-pool (slower than the unfused pair on the H100) is gated, with its reason; with the gate
// open it takes ResNet's 7x7/2 RGB stem and 3x3/2 pool in FP16 NHWC and refuses what it cannot
// run. The plain stem takes the same convolution ungated.
TEST(CudaHost, GatedTacticsAreOffByDefault) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {2, 3, 224, 224}));
  g.add_input(x);
  Value* w = g.add_constant("w", Tensor(DataType::kFloat32, {64, 3, 7, 7}));
  Value* b = g.add_constant("b", Tensor(DataType::kFloat32, {64}));
  auto stem_node = [&](const char* op, const char* name) {
    Node* n = g.add_node(op, name, {x, w, b}, {std::string(name) + "_y"}, "kiln");
    n->attrs.set("pads", Attribute::Ints({3, 3, 3, 3}));
    n->attrs.set("strides", Attribute::Ints({2, 2}));
    n->attrs.set("activation", Attribute::String("Relu"));
    g.add_output(n->output(0));
    return n;
  };
  Node* plain = stem_node("FusedConv", "stem");
  Node* pooled = stem_node("FusedConvPool", "stem_pool");
  pooled->attrs.set("pool_kernel_shape", Attribute::Ints({3, 3}));
  pooled->attrs.set("pool_strides", Attribute::Ints({2, 2}));
  pooled->attrs.set("pool_pads", Attribute::Ints({1, 1, 1, 1}));
  ASSERT_TRUE(infer_shapes(g).ok());
  const TacticDef* t = find_tactic("kiln.convpool.stem");
  const TacticDef* tp = find_tactic("kiln.conv.stem");
  ASSERT_TRUE(t && t->supports && tp && tp->supports);
  const TensorFormat f16{DataType::kFloat16, Layout::kNHWC};
  LayerDesc d;
  d.node = pooled;
  d.in = {f16, TensorFormat{DataType::kFloat16, Layout::kNHWC}, TensorFormat{DataType::kFloat16}};
  d.out = {f16};
  d.precision = Precision::kFP16;
  LayerDesc dp = d;
  dp.node = plain;
  const char* old = std::getenv("KILN_UNVERIFIED_TACTICS");
  const std::string saved = old ? old : "";
  unsetenv("KILN_UNVERIFIED_TACTICS");
  std::string why;
  EXPECT_FALSE(t->supports(d, &why));
  EXPECT_NE(why.find("KILN_UNVERIFIED_TACTICS"), std::string::npos) << why;
  EXPECT_NE(why.find("slower"), std::string::npos) << why;
  why.clear();
  EXPECT_TRUE(tp->supports(dp, &why)) << why;
  setenv("KILN_UNVERIFIED_TACTICS", "1", 1);
  why.clear();
  EXPECT_TRUE(t->supports(d, &why)) << why;
  d.precision = Precision::kTF32;
  EXPECT_FALSE(t->supports(d, &why));
  if (old) setenv("KILN_UNVERIFIED_TACTICS", saved.c_str(), 1);
  else unsetenv("KILN_UNVERIFIED_TACTICS");
}

// kiln.convpool.s2d (kRawIn0): its candidates read input 0 as the model stores it (float32 NCHW:
// no reformat of the images) and write float16 NHWC, or int8 codes in its .quantize form where
// the output has a scale; it takes RGB images of an even width in FP16 layers under a 3x3/2 pool.
TEST(CudaHost, PooledStemReadsTheModelsImagesItself) {
  auto stem = [](Graph& g, int64_t width, int64_t pool) {
    Value* x = g.add_value("x", TensorType(DataType::kFloat32, {2, 3, 224, width}));
    g.add_input(x);
    Value* w = g.add_constant("w", Tensor(DataType::kFloat32, {64, 3, 7, 7}));
    Value* b = g.add_constant("b", Tensor(DataType::kFloat32, {64}));
    Node* n = g.add_node("FusedConvPool", "stem", {x, w, b}, {"y"}, "kiln");
    n->attrs.set("pads", Attribute::Ints({3, 3, 3, 3}));
    n->attrs.set("strides", Attribute::Ints({2, 2}));
    n->attrs.set("activation", Attribute::String("Relu"));
    n->attrs.set("pool_kernel_shape", Attribute::Ints({pool, pool}));
    n->attrs.set("pool_strides", Attribute::Ints({2, 2}));
    n->attrs.set("pool_pads", Attribute::Ints({1, 1, 1, 1}));
    g.add_output(n->output(0));
    EXPECT_TRUE(infer_shapes(g).ok());
    return n;
  };
  const TacticDef* t = find_tactic("kiln.convpool.s2d");
  const TacticDef* tq = find_tactic("kiln.convpool.s2d.quantize");
  ASSERT_TRUE(t && t->supports && tq && (t->caps & kRawIn0) && (tq->caps & kQuantOut));
  Graph g;
  Node* n = stem(g, 224, 3);
  LayerChoice c = float_choice(*n, *t, Precision::kFP16, /*nhwc=*/true);
  EXPECT_EQ(c.in[0].dtype, DataType::kFloat32);
  EXPECT_EQ(c.in[0].layout, Layout::kLinear);
  EXPECT_EQ(c.out[0].dtype, DataType::kFloat16);
  EXPECT_EQ(c.out[0].layout, Layout::kNHWC);
  std::string why;
  EXPECT_TRUE(t->supports(c.desc(n), &why)) << why;
  // The .quantize form: int8 codes only where the output has a scale.
  LayerChoice q = float_choice(*n, *tq, Precision::kFP16, true);
  q.out[0].dtype = DataType::kInt8;  // what lowering does for a kQuantOut tactic
  EXPECT_FALSE(tq->supports(q.desc(n), &why));
  EXPECT_NE(why.find("scale"), std::string::npos) << why;
  n->output(0)->quant_scales = {0.05f};
  why.clear();
  EXPECT_TRUE(tq->supports(q.desc(n), &why)) << why;
  // Not a float32 TF32 layer, not an odd width, not another pool window.
  EXPECT_FALSE(t->supports(float_choice(*n, *t, Precision::kTF32, true).desc(n), &why));
  Graph odd;
  Node* no = stem(odd, 223, 3);
  EXPECT_FALSE(t->supports(float_choice(*no, *t, Precision::kFP16, true).desc(no), &why));
  EXPECT_NE(why.find("even"), std::string::npos) << why;
  Graph wide;
  Node* nw = stem(wide, 224, 5);
  EXPECT_FALSE(t->supports(float_choice(*nw, *t, Precision::kFP16, true).desc(nw), &why));
  EXPECT_NE(why.find("3x3/2"), std::string::npos) << why;
}

// A FusedConv with post steps (fuse_conv_tail) is offered only to the tactics that compute them
// (kPostSteps: cuDNN's graph API, cuBLASLt's 1x1); every other conv tactic would drop them, so
// tactic_supports() refuses it there whatever that tactic's own supports() says. cuDNN's graph
// takes Pow only as a square.
TEST(CudaHost, PostStepsReachOnlyTheTacticsThatComputeThem) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {2, 16, 8, 8}));
  g.add_input(x);
  Value* w = g.add_constant("w", Tensor(DataType::kFloat32, {32, 16, 1, 1}));
  Node* n = g.add_node("FusedConv", "pw", {x, w}, {"y"}, "kiln");
  n->attrs.set("activation", Attribute::String("Relu"));
  n->attrs.set("post_ops", Attribute::Strings({"Pow", "Mul", "Add"}));
  n->attrs.set("post_values", Attribute::Floats({2.f, 0.8f, -0.25f}));
  g.add_output(n->output(0));
  ASSERT_TRUE(infer_shapes(g).ok());
  int takers = 0;
  for (const TacticDef* t : tactics_for("kiln", "FusedConv")) {
    const LayerChoice c = float_choice(*n, *t, Precision::kFP16, /*nhwc=*/true);
    std::string why;
    const bool takes = tactic_supports(*t, c.desc(n), &why);
    if (!(t->caps & kPostSteps)) {
      EXPECT_FALSE(takes) << t->name;
      EXPECT_NE(why.find("post"), std::string::npos) << t->name << ": " << why;
    }
    takers += takes;
  }
  EXPECT_EQ(takers, 2);  // cudnn_graph.fused and cublaslt.conv1x1
  const TacticDef* graph = find_tactic("cudnn_graph.fused");
  const TacticDef* lt = find_tactic("cublaslt.conv1x1");
  ASSERT_TRUE(graph && lt);
  auto takes = [&](const TacticDef* t, std::string* why) {
    return tactic_supports(*t, float_choice(*n, *t, Precision::kFP16, true).desc(n), why);
  };
  n->attrs.set("post_values", Attribute::Floats({3.f, 0.8f, -0.25f}));
  std::string why;
  EXPECT_FALSE(takes(graph, &why));
  EXPECT_NE(why.find("square"), std::string::npos) << why;
  EXPECT_TRUE(takes(lt, &why)) << why;
  n->attrs.set("post_ops", Attribute::Strings({"Pow", "Mul", "Floor"}));
  EXPECT_FALSE(takes(lt, &why));
  EXPECT_NE(why.find("Floor"), std::string::npos) << why;
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
  const nlohmann::json j = plan_to_json(p, *g);
  EXPECT_EQ(j.value("kernel_layers", -1), 0);  // host layers launch nothing
  EXPECT_FALSE(j["layers"][0].value("launches", true));
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
  // A damaged generated-kernel entry (rtc.h) is refused at load, naming its key.
  nlohmann::json bad_kernel = j;
  bad_kernel["kernels"] = {{"rtc:00000000000000c0", "not base64!"}};
  const std::string k = plan_from_json(*g, bad_kernel).status().message();
  EXPECT_NE(k.find("backend plan: generated kernel 'rtc:00000000000000c0'"), std::string::npos)
      << k;
  bad_kernel["kernels"] = "x";
  EXPECT_FALSE(plan_from_json(*g, bad_kernel).ok());
}

// A dynamic profile's further tuning points and the layers' alternates survive the engine's
// plan record; an alternate for a point the plan lacks, or of another op, is refused.
TEST(CudaHost, PlanAlternatesRoundTripAndAreValidated) {
  auto g = reshape_by_shape_graph();
  Plan p;
  for (size_t k = 0; k < g->nodes().size(); ++k) p.layers.push_back(LayerChoice{});
  const auto relu_tactics = tactics_for("", "Relu");
  ASSERT_FALSE(relu_tactics.empty());
  Node* relu = g->nodes()[4];
  p.layers[4] = float_choice(*relu, *relu_tactics[0], Precision::kFP32, false);
  p.layers[4].alternates.push_back({1, relu_tactics[0], "other", 0.25});
  p.points = {{{32, 4, 3}}, {{1, 4, 3}}};
  const nlohmann::json j = plan_to_json(p, *g);
  auto back = plan_from_json(*g, j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->points, p.points);
  ASSERT_EQ(back->layers[4].alternates.size(), 1u);
  EXPECT_EQ(back->layers[4].alternates[0].point, 1u);
  EXPECT_EQ(back->layers[4].alternates[0].tactic, relu_tactics[0]);
  EXPECT_EQ(back->layers[4].alternates[0].variant, "other");
  EXPECT_DOUBLE_EQ(back->layers[4].alternates[0].time_ms, 0.25);
  nlohmann::json bad_point = j;
  bad_point["layers"][4]["alternates"][0]["point"] = 2;
  std::string m = plan_from_json(*g, bad_point).status().message();
  EXPECT_NE(m.find("alternate for tuning point 2 of 2"), std::string::npos) << m;
  nlohmann::json other_op = j;
  other_op["layers"][4]["alternates"][0]["tactic"] = std::string(find_tactic_for_op("Sigmoid"));
  m = plan_from_json(*g, other_op).status().message();
  EXPECT_NE(m.find("cannot stand in for"), std::string::npos) << m;
  nlohmann::json bad_shapes = j;
  bad_shapes["points"][1] = {{1, -4, 3}};
  EXPECT_FALSE(plan_from_json(*g, bad_shapes).ok());
  // kiln inspect --json: the points, and each layer's alternates
  const nlohmann::json d = describe_graph(*g, "engine", nlohmann::json::object(), j);
  EXPECT_EQ(d["tuning_points"], j["points"]);
  ASSERT_TRUE(d["layers"][4].contains("alternates"));
  EXPECT_EQ(d["layers"][4]["alternates"][0]["variant"], "other");
  EXPECT_FALSE(d["layers"][3].contains("alternates"));
}

// The executor runs each layer's tactic of the tuning point nearest the input shapes (log
// distance per dimension); a static engine has no points and runs its one choice.
TEST(CudaHost, NearestTuningPoint) {
  const std::vector<InputShapes> points = {{{32, 128}, {32, 128}}, {{1, 128}, {1, 128}}};
  EXPECT_EQ(nearest_point(points, {{32, 128}, {32, 128}}), 0u);
  EXPECT_EQ(nearest_point(points, {{1, 128}, {1, 128}}), 1u);
  EXPECT_EQ(nearest_point(points, {{2, 128}, {2, 128}}), 1u);
  EXPECT_EQ(nearest_point(points, {{8, 128}, {8, 128}}), 0u);   // log 8 > log 4
  EXPECT_EQ(nearest_point(points, {{1, 512}, {1, 512}}), 1u);
  EXPECT_EQ(nearest_point({}, {{4, 16}}), 0u);
  EXPECT_EQ(tuning_points({{1, 1}, {1, 1}}, {{32, 128}, {32, 128}}),
            (std::vector<InputShapes>{{{1, 128}, {1, 128}}}));
  EXPECT_TRUE(tuning_points({{32, 1}}, {{32, 128}}).empty());  // batch fixed: one point
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

// A constant stored as float16 for an FP16 layer keeps a finite value past float16's range
// finite (+-65504, as TensorRT clamps weights: a float32-max sentinel would otherwise be inf and
// turn into NaN); inf and NaN stay; in-range values round as a cast does.
TEST(CudaHost, Float16StorageClampsFiniteValuesPastItsRange) {
  const float big = 3.4028234e38f, inf = std::numeric_limits<float>::infinity();
  for (DataType from : {DataType::kFloat32, DataType::kFloat64}) {
    const Tensor t = Tensor::from<float>({6}, {big, -1e6f, inf, -inf, 1.5f, 65519.f}).cast(from);
    auto d = to_device_format(t, TensorFormat{DataType::kFloat16, Layout::kLinear});
    ASSERT_TRUE(d.ok());
    const std::vector<double> want = {65504, -65504, inf, -inf, 1.5, 65504};
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(d->at_double(i), want[i]) << i;
    const Tensor n = Tensor::from<float>({1}, {std::nanf("")}).cast(from);
    EXPECT_TRUE(std::isnan(to_device_format(n, {DataType::kFloat16, Layout::kLinear})->at_double(0)));
  }
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

// Generated kernels' cubins (rtc.h) travel as base64 in engines and timing caches: every byte
// value and every padding length survives the round trip, and what is not base64 is refused
// with the kernel's key.
TEST(CudaHost, GeneratedKernelCubinsRoundTripThroughTheTimingCache) {
  EXPECT_FALSE(rtc::import_cubins(nlohmann::json{{"rtc:0000000000000008", ""}}).ok());  // empty
  EXPECT_EQ(rtc::export_cubins({}).value(), nlohmann::json::object());  // nothing asked
  // "TWFu" is "Man"; "TWE=" "Ma"; "TQ==" "M".
  nlohmann::json small = {{"rtc:0000000000000001", "TWFu"},
                          {"rtc:0000000000000002", "TWE="},
                          {"rtc:0000000000000003", "TQ=="}};
  ASSERT_TRUE(rtc::import_cubins(small).ok());
  auto back = rtc::export_cubins({"rtc:0000000000000001", "rtc:0000000000000002",
                                  "rtc:0000000000000003", "not-a-key"});
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, small);
  for (const char* bad : {"TWF", "TW=u", "T@Fu", "TWFu===="}) {
    auto s = rtc::import_cubins(nlohmann::json{{"rtc:0000000000000009", bad}});
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("rtc:0000000000000009"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(rtc::import_cubins(nlohmann::json{{"conv|x", "TWFu"}}).ok());  // not an rtc key
  EXPECT_FALSE(rtc::kernel("rtc:00000000000000ff", "kiln_ew").ok());  // unknown: an error

  // A timing cache keeps every cubin the process has, and gives them back when opened.
  const std::string path = (std::filesystem::temp_directory_path() / "kiln_tc_rtc.json").string();
  {
    auto c = TimingCache::open(path, "gpu A");
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->save().ok());
  }
  std::ifstream f(path);
  const nlohmann::json saved = nlohmann::json::parse(f);
  ASSERT_TRUE(saved.contains("kernels"));
  EXPECT_EQ(saved["kernels"]["rtc:0000000000000002"], "TWE=");
  nlohmann::json corrupt = saved;
  corrupt["kernels"]["rtc:0000000000000004"] = "!!!!";
  std::ofstream(path) << corrupt.dump();
  auto c = TimingCache::open(path, "gpu A");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rtc:0000000000000004"), std::string::npos);
  std::filesystem::remove(path);
}

// The kernels generated for elementwise chains (ew.*.gen) compile for sm_90 with NVRTC, which
// needs no GPU: chains through every step the generator writes, at each float storage type, a
// chain reading a concatenation in place, and a lone Mul. The GPU tests (test-backend-ops) check
// what they compute.
TEST(CudaHost, GeneratedElementwiseKernelsCompile) {
  std::string why;
  if (!rtc::compiler_available(&why)) GTEST_SKIP() << why;
  const std::vector<std::string> unary = {
      "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor", "Ceil", "Round", "Sign", "Sin",
      "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Erf",
      "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
      "Softplus", "Softsign", "Gelu", "ThresholdedRelu", "Shrink", "Mish", "Swish"};
  const std::vector<std::string> binary = {"Add", "Sub", "Mul", "Div", "Mod", "Pow", "Max", "Min",
                                           "PRelu"};
  Graph g;
  auto input = [&](const char* name, std::vector<Dim> dims) {
    Value* v = g.add_value(name, TensorType(DataType::kFloat32, std::move(dims)));
    g.add_input(v);
    return v;
  };
  Value* x = input("x", {2, 16, 4, 4});
  Value* c = input("c", {1, 16, 1, 1});
  Value* lo = g.add_constant("lo", Tensor::from<float>({}, {-0.5f}));
  Value* hi = g.add_constant("hi", Tensor::from<float>({}, {0.7f}));
  // One chain per up to 30 steps: unary steps on the running value, binary ones with the
  // per-channel input, Clip with the two scalar constants (immediates), Gelu's tanh form too.
  std::vector<Node*> chains;
  std::vector<std::string> all = unary;
  all.insert(all.end(), binary.begin(), binary.end());
  all.push_back("Clip");
  all.push_back("Gelu");  // again, approximate = tanh
  for (size_t begin = 0; begin < all.size(); begin += 30) {
    std::vector<std::string> ops;
    std::vector<int64_t> arity, operands;
    Node* n = g.add_node("ElementwiseChain", "chain" + std::to_string(begin), {x, c, lo, hi},
                         {"y" + std::to_string(begin)}, "kiln");
    for (size_t i = begin; i < std::min(all.size(), begin + 30); ++i) {
      const std::string& op = all[i];
      const int64_t first = ops.empty() ? 0 : -1;
      const std::string pre = "s" + std::to_string(ops.size()) + "_";
      ops.push_back(op);
      if (op == "Clip") {
        arity.push_back(3);
        operands.insert(operands.end(), {first, 2, 3});
      } else if (std::find(binary.begin(), binary.end(), op) != binary.end()) {
        arity.push_back(2);
        operands.insert(operands.end(), {first, 1});
      } else {
        arity.push_back(1);
        operands.push_back(first);
      }
      if (op == "Gelu" && i + 1 == all.size()) n->attrs.set(pre + "approximate", Attribute::String("tanh"));
    }
    n->attrs.set("ops", Attribute::Strings(ops));
    n->attrs.set("arity", Attribute::Ints(arity));
    n->attrs.set("operands", Attribute::Ints(operands));
    chains.push_back(n);
  }
  // BatchNorm and ReLU over a concatenation of three parts, read in place.
  Value* p0 = input("p0", {2, 8, 4, 4});
  Value* p1 = input("p1", {2, 16, 4, 4});
  Value* p2 = input("p2", {2, 8, 4, 4});
  Value* s = input("s", {1, 32, 1, 1});
  Node* cat = g.add_node("ElementwiseChain", "bn_relu", {p0, p1, p2, s, s}, {"z"}, "kiln");
  cat->attrs.set("ops", Attribute::Strings({"Mul", "Add", "Relu"}));
  cat->attrs.set("arity", Attribute::Ints({2, 2, 1}));
  cat->attrs.set("operands", Attribute::Ints({0, 3, -1, 4, -1}));
  cat->attrs.set("concat_parts", Attribute::Int(3));
  cat->attrs.set("concat_axis", Attribute::Int(1));
  chains.push_back(cat);
  Node* mul = g.add_node("Mul", "se_scale", {x, c}, {"m"});
  chains.push_back(mul);

  const TacticDef* chain_gen = find_tactic("ew.chain.gen");
  const TacticDef* mul_gen = find_tactic("ew.mul.gen");
  ASSERT_TRUE(chain_gen && chain_gen->variants && mul_gen && mul_gen->variants);
  std::set<std::string> keys;
  for (DataType t : {DataType::kFloat16, DataType::kFloat32, DataType::kBFloat16}) {
    for (Node* n : chains) {
      LayerDesc d;
      d.node = n;
      d.in.assign(n->num_inputs(), TensorFormat{t, Layout::kNHWC});
      d.out = {TensorFormat{t, Layout::kNHWC}};
      d.precision = t == DataType::kFloat32 ? Precision::kFP32 : Precision::kFP16;
      const TacticDef* tactic = n == mul ? mul_gen : chain_gen;
      const std::vector<std::string> v = tactic->variants(d);
      ASSERT_EQ(v.size(), 1u) << n->name;
      ASSERT_EQ(v[0].rfind("rtc:", 0), 0u) << v[0];
      keys.insert(v[0]);
      auto size = rtc::compile_check(v[0], 90);
      EXPECT_TRUE(size.ok()) << n->name << " " << dtype_name(t) << ": " << size.status().message();
      if (size.ok()) {
        EXPECT_GT(*size, 0u);
      }
    }
  }
  EXPECT_EQ(keys.size(), 3 * chains.size());  // a source per chain and storage type
}

// The INT8 epilogues quantize by multiplying with 1 / scale and divide only near a rounding
// boundary (kernels/int8.cuh): every code must equal the CPU reference's division. Random values
// over many magnitudes, and values a few ulps around every half-integer boundary, where the
// multiply alone would round the other way.
TEST(CudaHost, QuantizeByInverseGivesTheReferenceCodes) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-12, 6);
  int64_t checked = 0, divided_near_boundary = 0;
  for (int si = 0; si < 200; ++si) {
    const float scale = std::ldexp(mant(rng), expo(rng));
    const float inv = 1.f / scale;
    for (int i = 0; i < 2000; ++i) {
      const float v = std::ldexp(mant(rng), expo(rng)) * scale * (i % 2 ? -1.f : 1.f);
      ASSERT_EQ(quantize_code_inv(v, scale, inv), quant::quantize_value(v, scale))
          << "v " << v << " scale " << scale;
      ++checked;
    }
    for (int n = -130; n <= 130; ++n) {
      float v = (static_cast<float>(n) + 0.5f) * scale;
      for (int k = 0; k < 8; ++k) v = std::nextafter(v, -INFINITY);
      for (int k = 0; k < 17; ++k, v = std::nextafter(v, INFINITY)) {
        const int8_t by_mul = static_cast<int8_t>(
            std::fmin(std::fmax(std::rint(v * inv), -128.f), 127.f));
        divided_near_boundary += by_mul != quant::quantize_value(v, scale);
        ASSERT_EQ(quantize_code_inv(v, scale, inv), quant::quantize_value(v, scale))
            << "v " << v << " scale " << scale;
        ++checked;
      }
    }
  }
  EXPECT_EQ(quantize_code_inv(NAN, 0.5f, 2.f), 0);
  EXPECT_EQ(quantize_code_inv(INFINITY, 0.5f, 2.f), 127);
  EXPECT_EQ(quantize_code_inv(-1e30f, 0.5f, 2.f), -128);
  // The multiply alone does get some boundary cases wrong: the division fallback is needed.
  EXPECT_GT(divided_near_boundary, 0) << checked;
}

// The pointwise epilogue quantizes two values at once with a fixed margin around half-integers
// and ReLU folded into the clamp (quantize_pair_inv): each code must equal the CPU reference's
// quantize_value of v (or of ReLU(v)), for random values over many magnitudes and values a few
// ulps around every half-integer, NaN and infinities included.
TEST(CudaHost, QuantizePairGivesTheReferenceCodes) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-12, 6);
  auto check = [](float v0, float v1, float scale, float inv) {
    const uint32_t plain = quantize_pair_inv<false>(v0, v1, scale, inv);
    const uint32_t relu = quantize_pair_inv<true>(v0, v1, scale, inv);
    auto r = [](float v) { return v > 0.f ? v : 0.f; };
    ASSERT_EQ(static_cast<int8_t>(plain & 0xff), quant::quantize_value(v0, scale)) << v0 << " " << scale;
    ASSERT_EQ(static_cast<int8_t>(plain >> 8 & 0xff), quant::quantize_value(v1, scale)) << v1;
    ASSERT_EQ(static_cast<int8_t>(relu & 0xff), quant::quantize_value(r(v0), scale)) << v0;
    ASSERT_EQ(static_cast<int8_t>(relu >> 8 & 0xff), quant::quantize_value(r(v1), scale)) << v1;
  };
  int64_t checked = 0;
  for (int si = 0; si < 200; ++si) {
    const float scale = std::ldexp(mant(rng), expo(rng));
    const float inv = 1.f / scale;
    for (int i = 0; i < 2000; ++i, ++checked) {
      const float v0 = std::ldexp(mant(rng), expo(rng)) * scale * (i % 2 ? -1.f : 1.f);
      const float v1 = std::ldexp(mant(rng), expo(rng)) * scale * (i % 3 ? 1.f : -1.f);
      ASSERT_NO_FATAL_FAILURE(check(v0, v1, scale, inv));
    }
    for (int n = -130; n <= 130; ++n) {
      float v = (static_cast<float>(n) + 0.5f) * scale;
      for (int k = 0; k < 8; ++k) v = std::nextafter(v, -INFINITY);
      for (int k = 0; k < 17; ++k, v = std::nextafter(v, INFINITY), ++checked) {
        ASSERT_NO_FATAL_FAILURE(check(v, 3.f * scale, scale, inv));
        ASSERT_NO_FATAL_FAILURE(check(-2.f * scale, v, scale, inv));
      }
    }
  }
  for (float odd : {NAN, INFINITY, -INFINITY, -0.f, 0.f, 1e30f, -1e30f})
    for (float other : {0.7f, -127.5f, 127.5f, -128.5f})
      ASSERT_NO_FATAL_FAILURE(check(odd, other, 1.f, 1.f));
  EXPECT_GT(checked, 400000);
}

// FastDiv (kernels/fast_div.cuh) divides by multiply-high: the exact quotient for dividends below
// 2^31, for small, power-of-two, odd and large divisors, around each multiple and at the top.
TEST(CudaHost, FastDivGivesExactQuotients) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> any(0, (1u << 31) - 1);
  for (uint32_t d : {1u, 2u, 3u, 7u, 14u, 28u, 56u, 64u, 196u, 784u, 3136u, 12544u, 65535u,
                     1000003u, (1u << 30) + 1, (1u << 31) - 1}) {
    const FastDiv f(d);
    for (int i = 0; i < 20000; ++i) {
      const uint32_t n = any(rng);
      ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
    }
    for (uint64_t k = 0; k * d < (1u << 31) && k < 5000; ++k)
      for (int64_t off : {-1, 0, 1}) {
        const int64_t n = static_cast<int64_t>(k * d) + off;
        if (n < 0 || n >= (int64_t{1} << 31)) continue;
        ASSERT_EQ(f.div(static_cast<uint32_t>(n)), static_cast<uint32_t>(n) / d) << n << " / " << d;
      }
    ASSERT_EQ(f.div((1u << 31) - 1), ((1u << 31) - 1) / d) << d;
  }
}

// The INT8 epilogues convert accumulators of at most 256 products (|acc| <= 2^22) and codes by
// adding and subtracting 1.5 * 2^23 (kernels/int8.cuh): exact over the whole range, both ends
// included.
TEST(CudaHost, SmallIntToFloatIsExactUpTo2To22) {
  for (int32_t i = -(1 << 22); i <= (1 << 22); ++i)
    ASSERT_EQ(small_int_to_float(i), static_cast<float>(i)) << i;
  // Just past the bound the trick no longer holds, which is why the kernels check the bound.
  EXPECT_NE(small_int_to_float((1 << 22) + 1), static_cast<float>((1 << 22) + 1));
}

// ResNet's first block of a stage after INT8 marking, with the downsample at stride 2: A = the
// block's expand (1x1, c1 -> 512) and B = the downsample (1x1 stride 2, c2 -> 512) with A's
// output as its residual and ReLU. On the cuda backend the INT8 stage pairs them where a pair
// kernel takes (c1, c2): (64, 64) (conv_int8.pair), stage 2's (128, 256) (conv_int8.pair.wgmma);
// with (64, 256) it does not (no kernel for that pair).
std::unique_ptr<Graph> int8_block_graph(int64_t c2, int64_t c1 = 64) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, c1, 14, 14}));
  Value* x2 = g->add_value("x2", TensorType(DataType::kFloat32, {2, c2, 28, 28}));
  g->add_input(x);
  g->add_input(x2);
  auto conv = [&](const std::string& name, Value* in, int64_t c, std::vector<Value*> extra) {
    Tensor w(DataType::kFloat32, {512, c, 1, 1});
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = 0.01f * static_cast<float>(i % 7 - 3);
    std::vector<Value*> ins = {in, g->add_constant(name + "_w", std::move(w)),
                               g->add_constant(name + "_b", Tensor(DataType::kFloat32, {512}))};
    for (Value* v : extra) ins.push_back(v);
    Node* n = g->add_node("FusedConv", name, ins, {name + "_y"}, "kiln");
    n->attrs.set("int8", Attribute::Int(1));
    n->input(1)->quant_scales = quant::weight_scales(*n->input(1)->constant, 0);
    n->input(1)->quant_axis = 0;
    return n;
  };
  Node* a = conv("expand", x, c1, {});
  Node* b = conv("downsample", x2, c2, {a->output(0)});
  b->attrs.set("strides", Attribute::Ints({2, 2}));
  b->attrs.set("activation", Attribute::String("Relu"));
  Node* next = g->add_node("Relu", "next", {b->output(0)}, {"out"});
  g->add_output(next->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  x->quant_scales = {0.02f};
  x2->quant_scales = {0.03f};
  a->output(0)->quant_scales = {0.05f};
  b->output(0)->quant_scales = {0.04f};
  return g;
}

TEST(CudaHost, Int8StagePairsResNetsBlockZeroWhereTheKernelTakesIt) {
  OptimizeOptions o;
  o.backend = "cuda";
  o.precision = "int8";
  o.opt_level = 2;
  auto g = int8_block_graph(64);
  ASSERT_TRUE(optimize_int8_graph(*g, o).ok());
  ASSERT_EQ(g->nodes().size(), 2u);
  const Node* pair = g->nodes()[0];
  EXPECT_EQ(pair->op_type, "FusedConvPair");
  EXPECT_EQ(pair->name, "expand");
  EXPECT_EQ(pair->input(3)->name, "x2");
  EXPECT_EQ(pair->attrs.get_ints("conv2_strides", {}), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(pair->attrs.get_string("activation", ""), "Relu");
  // Its INT8 candidate reads X and X2 as int8 codes and writes int8 codes.
  const TacticDef* t = find_tactic("conv_int8.pair");
  ASSERT_TRUE(t && t->supports);
  LayerChoice c = make_int8_choice(*pair, *t, DataType::kFloat16);
  EXPECT_EQ(c.in[0].dtype, DataType::kInt8);
  EXPECT_EQ(c.in[3].dtype, DataType::kInt8);
  EXPECT_EQ(c.out[0].dtype, DataType::kInt8);
  std::string why;
  EXPECT_TRUE(t->supports(c.desc(pair), &why)) << why;
  // A downsample from 256 channels beside an expand from 64: no kernel, no pair.
  auto other = int8_block_graph(256);
  ASSERT_TRUE(optimize_int8_graph(*other, o).ok());
  EXPECT_EQ(other->nodes().size(), 3u);
  EXPECT_EQ(other->nodes()[0]->op_type, "FusedConv");
  // Stage 2's (128, 256): the wgmma pair kernel takes it (and the mma.sync one does not).
  auto stage2 = int8_block_graph(256, 128);
  ASSERT_TRUE(optimize_int8_graph(*stage2, o).ok());
  ASSERT_EQ(stage2->nodes().size(), 2u);
  const Node* pair2 = stage2->nodes()[0];
  ASSERT_EQ(pair2->op_type, "FusedConvPair");
  const TacticDef* tw = find_tactic("conv_int8.pair.wgmma");
  ASSERT_TRUE(tw && tw->supports);
  LayerChoice c2 = make_int8_choice(*pair2, *tw, DataType::kFloat16);
  EXPECT_TRUE(tw->supports(c2.desc(pair2), &why)) << why;
  LayerChoice c1 = make_int8_choice(*pair2, *t, DataType::kFloat16);
  EXPECT_FALSE(t->supports(c1.desc(pair2), &why));
  EXPECT_NE(why.find("(64, 64)"), std::string::npos) << why;
}

// pool.global_avg.codes (kQuantIn0) takes GlobalAveragePool's input as int8 codes of its scale:
// NHWC, channels a multiple of 16.
TEST(CudaHost, GlobalAveragePoolReadsInt8Codes) {
  const TacticDef* t = find_tactic("pool.global_avg.codes");
  ASSERT_TRUE(t && t->supports && (t->caps & kQuantIn0));
  for (int64_t C : {2048, 40}) {
    Graph g;
    Value* x = g.add_value("x", TensorType(DataType::kFloat32, {4, C, 7, 7}));
    g.add_input(x);
    Node* n = g.add_node("GlobalAveragePool", "gap", {x}, {"y"});
    g.add_output(n->output(0));
    ASSERT_TRUE(infer_shapes(g).ok());
    x->quant_scales = {0.1f};
    LayerChoice c = float_choice(*n, *t, Precision::kFP16, /*nhwc=*/true);
    c.in[0].dtype = DataType::kInt8;  // what lowering does for a kQuantIn0 tactic
    std::string why;
    EXPECT_EQ(t->supports(c.desc(n), &why), C % 16 == 0) << C << ": " << why;
  }
}

}  // namespace
}  // namespace kiln::gpu

namespace kiln::gpu {
namespace {

// x [N,64] -> MatMul(W [64,256]) -> Relu: the estimate counts W once and the larger layer's
// inputs and outputs at the build's smallest float size; graph inputs and outputs keep theirs.
TEST(BuildMemory, EstimateCountsWeightsOnceAndTheLargestLayer) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 64}));
  g->add_input(x);
  Value* w = g->add_constant("w", Tensor::from<float>({64, 256}, std::vector<float>(64 * 256, 0.5f)));
  Node* mm = g->add_node("MatMul", "mm", {x, w}, {"h"});
  Node* relu = g->add_node("Relu", "relu", {mm->output(0)}, {"y"});
  g->add_output(relu->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  const std::vector<bool> host = host_nodes(*g);
  auto shapes = evaluate_shapes(*g, host, {{1000, 64}});
  ASSERT_TRUE(shapes.ok()) << shapes.status().message();
  const BuildMemoryEstimate fp32 = estimate_build_memory(*g, host, *shapes, 4);
  EXPECT_EQ(fp32.weight_bytes, 64u * 256 * 4);
  EXPECT_EQ(fp32.layer_bytes, 1000u * 256 * 4 * 2);  // relu: h in, y out
  EXPECT_NE(fp32.layer.find("relu"), std::string::npos) << fp32.layer;
  const BuildMemoryEstimate fp16 = estimate_build_memory(*g, host, *shapes, 2);
  EXPECT_EQ(fp16.weight_bytes, 64u * 256 * 2);
  EXPECT_EQ(fp16.layer_bytes, 1000u * 256 * (2 + 4));  // h in FP16, the graph output y in FP32

  EXPECT_TRUE(check_build_memory(fp32, {fp32.total(), fp32.total() * 2}, "x:1000x64").ok());
  const Status s = check_build_memory(fp32, {fp32.total() - 1, fp32.total() + 100}, "x:1000x64");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out of GPU memory: building at x:1000x64 needs at least"),
            std::string::npos) << s.message();
  EXPECT_NE(s.message().find("smaller --shapes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2.0 MiB of inputs and outputs for node 'relu'"), std::string::npos)
      << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
  // A GPU another process has nearly filled: the message says so.
  const Status crowded = check_build_memory(fp32, {1024, size_t(80) << 30}, "x:1000x64");
  EXPECT_NE(crowded.message().find("other processes hold the rest"), std::string::npos)
      << crowded.message();
}

TEST(BuildMemory, OutOfMemoryMessagesAreRecognised) {
  EXPECT_TRUE(is_out_of_memory("cudaMalloc(&p, n): out of memory"));
  EXPECT_TRUE(is_out_of_memory("out of GPU memory: tuning buffers needs 12.0 MiB"));
  EXPECT_TRUE(is_out_of_memory("cublasLtMatmul: CUBLAS_STATUS_ALLOC_FAILED"));
  EXPECT_TRUE(is_out_of_memory("cudnn: CUDNN_STATUS_ALLOC_FAILED"));
  EXPECT_FALSE(is_out_of_memory("needs 2048 MiB of workspace, over the limit of 1024 MiB"));
  EXPECT_FALSE(is_out_of_memory("CUDNN_STATUS_NOT_SUPPORTED"));
}

// The whole GPU build step refuses, before any timing, activations that cannot fit: the check
// runs with the memory a test says the GPU has (BuildConfig::gpu_memory_*), so no GPU is needed.
TEST(BuildMemory, BuildRefusesShapesThatCannotFit) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), 64}));
  g->add_input(x);
  Node* relu = g->add_node("Relu", "relu", {x}, {"y"});
  g->add_output(relu->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  BuildConfig c;
  c.backend = "cuda";
  c.tune = false;
  c.gpu_memory_free = size_t(1) << 20;
  c.gpu_memory_total = size_t(2) << 20;
  c.shapes["x"] = {100000, 64};  // 2 x 24.4 MiB
  auto profile = Profile::from_config(*g, c);
  ASSERT_TRUE(profile.ok()) << profile.status().message();
  ASSERT_TRUE(profile->apply_static_shapes(*g).ok());
  auto plan = build_cuda_plan(*g, c, *profile);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("out of GPU memory: building at x:100000x64"),
            std::string::npos) << plan.status().message();
  c.shapes["x"] = {1000, 64};  // 0.5 MiB fits in 1 MiB
  auto g2 = std::make_unique<Graph>();
  Value* x2 = g2->add_value("x", TensorType(DataType::kFloat32, {1000, 64}));
  g2->add_input(x2);
  Node* relu2 = g2->add_node("Relu", "relu", {x2}, {"y"});
  g2->add_output(relu2->output(0));
  ASSERT_TRUE(infer_shapes(*g2).ok());
  BuildConfig c2 = c;
  c2.shapes.clear();
  auto profile2 = Profile::from_config(*g2, c2);
  ASSERT_TRUE(profile2.ok()) << profile2.status().message();
  EXPECT_TRUE(build_cuda_plan(*g2, c2, *profile2).ok());
}

// A channels-last FP16 build keeps a convolution, its GroupNorm (with SiLU and the per-image
// term of a UNet's timestep embedding) and the next convolution NHWC with no reformat between
// them: groupnorm.nhwc.fused takes the norm, and the [N, C, 1, 1] term, row-major from its
// GEMM, reaches it through reformat.relabel (both layouts the same bytes), which launches
// nothing. With scale and bias per group (opset 18's form, which groupnorm.nhwc does not take)
// lowering splits the norm back into its ops.
TEST(CudaHost, ChannelsLastGroupNormTakesItsTimestepTermWithoutReformats) {
  auto build = [](bool per_group) {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 16, 8, 8}));
    Value* e = g->add_value("e", TensorType(DataType::kFloat32, {2, 32}));
    g->add_input(x);
    g->add_input(e);
    Value* w = g->add_constant("w", Tensor(DataType::kFloat32, {16, 16, 3, 3}));
    Value* b = g->add_constant("b", Tensor(DataType::kFloat32, {16}));
    Node* c1 = g->add_node("Conv", "c1", {x, w, b}, {"h"});
    c1->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
    Value* pw = g->add_constant("pw", Tensor(DataType::kFloat32, {16, 32}));
    Node* proj = g->add_node("Gemm", "proj", {e, pw, b}, {"t2"});
    proj->attrs.set("transB", Attribute::Int(1));
    Value* axes = g->add_constant("axes", Tensor::from<int64_t>({2}, {2, 3}));
    Node* un = g->add_node("Unsqueeze", "un", {proj->output(0), axes}, {"t"});
    Value* gb = per_group ? g->add_constant("gb", Tensor(DataType::kFloat32, {4})) : b;
    Node* gn = g->add_node("FusedGroupNorm", "gn", {c1->output(0), gb, gb, un->output(0)}, {"n"},
                           "kiln");
    gn->attrs.set("num_groups", Attribute::Int(4));
    if (per_group) gn->attrs.set("kiln_per_group", Attribute::Int(1));
    gn->attrs.set("activation", Attribute::String("Swish"));
    Node* c2 = g->add_node("Conv", "c2", {gn->output(0), w, b}, {"y"});
    c2->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
    g->add_output(c2->output(0));
    EXPECT_TRUE(infer_shapes(*g).ok());
    BuildConfig c;
    c.backend = "cuda";
    c.tune = false;
    c.fp16 = true;
    c.gpu_memory_free = size_t(1) << 30;
    c.gpu_memory_total = size_t(2) << 30;
    auto profile = Profile::from_config(*g, c);
    EXPECT_TRUE(profile.ok());
    auto plan = build_cuda_plan(*g, c, *profile);
    EXPECT_TRUE(plan.ok()) << plan.status().message();
    std::map<std::string, std::string> tactic;  // op type (last of its kind) -> tactic
    std::vector<std::string> reformats;
    for (size_t k = 0; plan.ok() && k < g->nodes().size(); ++k) {
      const Node* n = g->nodes()[k];
      const std::string t = (*plan)["layers"][k].value("tactic", "");
      tactic[n->op_type] = t;
      if (n->op_type == "Reformat") reformats.push_back(t);
    }
    return std::make_pair(tactic, reformats);
  };
  auto [on, on_reformats] = build(false);
  EXPECT_EQ(on["FusedGroupNorm"], "groupnorm.nhwc.fused");
  // x and e in, y out convert type; the term only relabels.
  EXPECT_EQ(std::count(on_reformats.begin(), on_reformats.end(), "reformat.relabel"), 1);
  EXPECT_EQ(on_reformats.size(), 4u);
  auto [off, off_reformats] = build(true);
  EXPECT_EQ(off.count("FusedGroupNorm"), 0u);  // split: Add, GroupNormalization, Swish
  EXPECT_EQ(off.count("GroupNormalization"), 1u);
}

}  // namespace
}  // namespace kiln::gpu

// matmul.cublaslt's row groups (layers/gemm_lt.cpp): every group's rows start 16-byte aligned at
// its first column, its product covers a multiple of 8 columns inside the row, and the edge
// columns are fewer than a 16-byte step plus 8 (or the whole row when it is that short).
TEST(CudaHost, RowGroupsAlignEachGroupsProduct) {
  for (int64_t y_size : {2, 4})
    for (int64_t n : {1, 2, 3, 7, 9, 12, 13, 37, 301, 50257}) {
      const kiln::gpu::EdgeColumns e = kiln::gpu::plan_row_groups(n, y_size);
      SCOPED_TRACE(fmt::format("N {} of {} bytes", n, y_size));
      ASSERT_GE(e.groups, 1);
      ASSERT_LE(e.groups, 16);
      EXPECT_EQ(e.groups * n * y_size % 16, 0);
      if (e.groups > 1) {
        EXPECT_NE(e.groups / 2 * n * y_size % 16, 0) << "not the fewest groups";
      }
      for (int j = 0; j < e.groups; ++j) {
        EXPECT_LE(0, e.first[j]);
        EXPECT_LE(e.first[j], e.end[j]);
        EXPECT_LE(e.end[j], n);
        EXPECT_EQ((e.end[j] - e.first[j]) % 8, 0);
        if (e.end[j] > e.first[j]) {
          EXPECT_EQ((j * n + e.first[j]) * y_size % 16, 0);
        }
        EXPECT_LT(e.first[j] + (n - e.end[j]), 16 / y_size + 8);
      }
    }
}

// The erf GELU of CUTLASS's FFN1 epilogue (kernels/gelu_erf.cuh) against x * Phi(x) in double:
// within 3e-5 everywhere, exact far out (x past 6 keeps x, far below -6 gives 0).
TEST(CudaHost, GeluErfFormIsWithinItsBound) {
  double worst = 0, at = 0;
  for (int i = -120000; i <= 120000; ++i) {
    const double x = i * 1e-4;
    const double want = 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    const double err = std::abs(kiln::gpu::gelu_erf_tanh(static_cast<float>(x)) - want);
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LT(worst, 3.2e-5) << "at x = " << at;
  EXPECT_FLOAT_EQ(kiln::gpu::gelu_erf_tanh(100.f), 100.f);
  EXPECT_NEAR(kiln::gpu::gelu_erf_tanh(-100.f), 0.f, 2e-8);  // 0 in FP16
  EXPECT_NEAR(kiln::gpu::gelu_erf_tanh(-65504.f), 0.f, 2e-8);
  EXPECT_FLOAT_EQ(kiln::gpu::gelu_erf_tanh(0.f), 0.f);
}
