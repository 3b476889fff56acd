// Lowering of INT8 layers for the CUDA backend (host side, no GPU needed; untuned builds take
// the first supported candidate, which for a layer marked int8 = 1 is its INT8 one): formats of
// the INT8 candidate, the quantizing/dequantizing reformats and their scales, the float
// fallback of a layer no INT8 tactic takes, and float builds left as they were.
#include <gtest/gtest.h>

#include "../compare/compare_test_net.h"
#include "backends/cuda/lower.h"
#include "backends/cuda/plan.h"
#include "ops/op.h"
#include "passes/pipeline.h"
#include "quant/int8.h"

namespace kiln::gpu {
namespace {

Tensor ramp(std::vector<int64_t> shape, float step) {
  Tensor t(DataType::kFloat32, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = step * static_cast<float>(i % 13 - 6);
  return t;
}

// x [2,C,8,8] -> FusedConv(W [16,C,3,3], bias, int8 = 1, Relu) -> y, with scales on x, W and
// (when `y_scale`) y.
std::unique_ptr<Graph> int8_conv_graph(int64_t C, bool y_scale, bool int8 = true) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, C, 8, 8}));
  g->add_input(x);
  Value* w = g->add_constant("w", ramp({16, C, 3, 3}, 0.01f));
  Value* b = g->add_constant("b", ramp({16}, 0.1f));
  Node* n = g->add_node("FusedConv", "conv", {x, w, b}, {"y"}, "kiln");
  n->attrs.set("pads", Attribute::Ints({1, 1, 1, 1}));
  n->attrs.set("activation", Attribute::String("Relu"));
  if (int8) {
    n->attrs.set("int8", Attribute::Int(1));
    x->quant_scales = {0.02f};
    w->quant_scales = quant::weight_scales(*w->constant, 0);
    w->quant_axis = 0;
    if (y_scale) n->output(0)->quant_scales = {0.05f};
  }
  g->add_output(n->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

Expected<Plan> lower(Graph& g, bool fp16, int64_t C) {
  GpuBuildOptions o;
  o.fp16 = fp16;
  o.tune = false;
  return lower_for_gpu(g, {{2, C, 8, 8}}, o);
}

const LayerChoice& choice_of(const Graph& g, const Plan& p, const std::string& op_type) {
  for (size_t k = 0; k < g.nodes().size(); ++k)
    if (g.nodes()[k]->op_type == op_type) return p.layers[k];
  static const LayerChoice none;
  ADD_FAILURE() << "no " << op_type << " layer";
  return none;
}

TEST(CudaInt8Lowering, Int8LayerGetsInt8FormatsAndScaledReformats) {
  auto g = int8_conv_graph(8, /*y_scale=*/true);
  auto p = lower(*g, false, 8);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const LayerChoice& c = choice_of(*g, *p, "FusedConv");
  ASSERT_NE(c.tactic, nullptr);
  EXPECT_EQ(c.tactic->name, "conv_int8");
  EXPECT_EQ(c.precision, Precision::kINT8);
  EXPECT_EQ(c.in[0].str(), "int8/nhwc");
  EXPECT_EQ(c.in[1].dtype, DataType::kUndefined);  // the tactic quantizes W itself: not uploaded
  EXPECT_EQ(c.in[2].dtype, DataType::kUndefined);
  EXPECT_EQ(c.out[0].str(), "int8/nhwc");
  // x -> Reformat(float32/linear -> int8/nhwc) -> conv -> Reformat(int8/nhwc -> float32/linear).
  ASSERT_EQ(g->nodes().size(), 3u);
  const Node* q = g->nodes()[0];
  EXPECT_EQ(q->op_type, "Reformat");
  EXPECT_EQ(p->layers[0].out[0].str(), "int8/nhwc");
  ASSERT_EQ(q->output(0)->quant_scales.size(), 1u);  // the INT8 layer reads sx there
  EXPECT_FLOAT_EQ(q->output(0)->quant_scales[0], 0.02f);
  EXPECT_EQ(g->nodes()[1]->input(0), q->output(0));
  EXPECT_TRUE(quant::int8_blocker(*g->nodes()[1]).empty()) << quant::int8_blocker(*g->nodes()[1]);
  EXPECT_EQ(p->layers[2].in[0].str(), "int8/nhwc");
  EXPECT_EQ(p->layers[2].out[0].str(), "float32/linear");
  // The plan's precision survives the engine's JSON.
  auto back = plan_from_json(*g, plan_to_json(*p, *g));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->layers[1].precision, Precision::kINT8);
  EXPECT_STREQ(precision_name(back->layers[1].precision), "int8");
}

TEST(CudaInt8Lowering, FloatOutputTakesTheBuildsFloatStorage) {
  auto g = int8_conv_graph(8, /*y_scale=*/false);
  auto p = lower(*g, /*fp16=*/true, 8);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const LayerChoice& c = choice_of(*g, *p, "FusedConv");
  EXPECT_EQ(c.precision, Precision::kINT8);
  EXPECT_EQ(c.out[0].str(), "float16/nhwc");
}

TEST(CudaInt8Lowering, LayerNoInt8TacticTakesFallsBackToFloat) {
  auto g = int8_conv_graph(3, /*y_scale=*/true);  // C = 3: the INT8 kernel needs C % 4 == 0
  auto p = lower(*g, /*fp16=*/true, 3);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const LayerChoice& c = choice_of(*g, *p, "FusedConv");
  ASSERT_NE(c.tactic, nullptr);
  EXPECT_NE(c.tactic->name, "conv_int8");
  EXPECT_EQ(c.precision, Precision::kFP16);
  for (const LayerChoice& l : p->layers)
    for (const TensorFormat& f : l.out) EXPECT_NE(f.dtype, DataType::kInt8);
}

TEST(CudaInt8Lowering, FloatBuildsAreUnchanged) {
  for (bool fp16 : {false, true}) {
    auto g = int8_conv_graph(8, true, /*int8=*/false);
    auto p = lower(*g, fp16, 8);
    ASSERT_TRUE(p.ok()) << p.status().message();
    const LayerChoice& c = choice_of(*g, *p, "FusedConv");
    ASSERT_NE(c.tactic, nullptr);
    EXPECT_NE(c.tactic->name, "conv_int8");
    EXPECT_EQ(c.precision, fp16 ? Precision::kFP16 : Precision::kTF32);
    EXPECT_EQ(c.in[0].dtype, fp16 ? DataType::kFloat16 : DataType::kFloat32);
  }
}

// The small CNN optimized for cuda, every activation given a scale and its layers marked INT8:
// the three convolutions and the FC run INT8 tactics; consecutive INT8 convolutions pass int8
// NHWC tensors with no reformat between; values are quantized twice: the input before conv1 and
// the float GlobalAveragePool's (flattened) output before the FC.
TEST(CudaInt8Lowering, SmallCnnChainsInt8Layers) {
  auto g = testnet::small_cnn();
  OptimizeOptions opt;
  opt.backend = "cuda";
  ASSERT_TRUE(optimize_graph(*g, opt).ok());
  std::map<std::string, float> scales;
  for (const Value* v : quant::calibration_tensors(*g)) scales[v->name] = 0.05f;
  quant::apply_activation_scales(*g, scales);
  auto marked = quant::mark_int8_layers(*g, {}, false);
  ASSERT_TRUE(marked.ok()) << marked.status().message();
  EXPECT_EQ(marked->int8_layers.size(), 4u);
  GpuBuildOptions o;
  o.fp16 = true;
  o.tune = false;
  auto p = lower_for_gpu(*g, {{2, 4, 12, 12}}, o);
  ASSERT_TRUE(p.ok()) << p.status().message();
  int int8 = 0, quantizing = 0;
  std::string listing;
  for (size_t k = 0; k < g->nodes().size(); ++k) {
    const Node* n = g->nodes()[k];
    listing +=
        n->op_type + "(" + (p->layers[k].is_host() ? "host" : p->layers[k].out[0].str()) + ") ";
    if (n->op_type == "Reformat" && p->layers[k].out[0].dtype == DataType::kInt8) ++quantizing;
    if (p->layers[k].precision != Precision::kINT8) continue;
    ++int8;
    const Node* prev = n->input(0)->producer;
    if (n->op_type == "FusedConv" && prev && prev->op_type == "FusedConv") {
      EXPECT_EQ(p->layers[prev->index].out[0].str(), "int8/nhwc") << n->name;
    }
  }
  EXPECT_EQ(int8, 4);
  EXPECT_EQ(quantizing, 2) << listing;  // x before conv1, Flatten's output before the FC
}

// The library INT8 tactics (layers/conv_int8_lib.cpp) are candidates of the same layer: forced,
// the cuDNN graph one takes a 3x3 conv with int8 or half output and refuses a float32 one (no
// library writes float32 from INT8); cuBLASLt's takes only 1x1 stride-1 convolutions.
TEST(CudaInt8Lowering, LibraryTacticsAreCandidates) {
  auto forced = [](bool y_scale, bool fp16, const std::string& tactic) -> std::string {
    auto g = int8_conv_graph(8, y_scale);
    GpuBuildOptions o;
    o.fp16 = fp16;
    o.tune = false;
    o.force_tactic = tactic;
    auto p = lower_for_gpu(*g, {{2, 8, 8, 8}}, o);
    if (!p.ok()) return "error: " + p.status().message();
    const LayerChoice& c = choice_of(*g, *p, "FusedConv");
    return std::string(c.tactic->name) + " " + precision_name(c.precision) + " " + c.out[0].str();
  };
  EXPECT_EQ(forced(true, false, "cudnn_graph.int8"), "cudnn_graph.int8 int8 int8/nhwc");
  EXPECT_EQ(forced(false, true, "cudnn_graph.int8"), "cudnn_graph.int8 int8 float16/nhwc");
  // Forced alone, a refusal is the build error naming the tactic and its reason.
  const std::string f32 = forced(false, false, "cudnn_graph.int8");
  EXPECT_EQ(f32.rfind("error:", 0), 0u) << f32;
  EXPECT_NE(f32.find("no float32 kernel"), std::string::npos) << f32;
  const std::string lt = forced(true, false, "cublaslt.conv1x1.int8");
  EXPECT_EQ(lt.rfind("error:", 0), 0u) << lt;
  EXPECT_NE(lt.find("1x1"), std::string::npos) << lt;
}

// A FusedGemm marked INT8 keeps every float GEMM as its float candidate (what the tuner times
// against the INT8 ones, and what runs where an INT8 kernel is slower): cuBLASLt's and, in FP16,
// CUTLASS's take it as they take an unmarked one.
TEST(CudaInt8Lowering, Int8GemmKeepsTheFloatLibraryGemms) {
  auto forced = [](bool fp16, const std::string& tactic) -> std::string {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 16, 64}));
    g->add_input(x);
    Value* w = g->add_constant("w", ramp({64, 32}, 0.01f));
    Value* b = g->add_constant("b", ramp({32}, 0.1f));
    Node* n = g->add_node("FusedGemm", "fc", {x, w, b}, {"y"}, "kiln");
    n->attrs.set("base", Attribute::String("MatMul"));
    n->attrs.set("int8", Attribute::Int(1));
    x->quant_scales = {0.02f};
    w->quant_scales = quant::weight_scales(*w->constant, 1);
    w->quant_axis = 1;
    g->add_output(n->output(0));
    EXPECT_TRUE(infer_shapes(*g).ok());
    GpuBuildOptions o;
    o.fp16 = fp16;
    o.tune = false;
    o.force_tactic = tactic;
    auto p = lower_for_gpu(*g, {{2, 16, 64}}, o);
    if (!p.ok()) return "error: " + p.status().message();
    const LayerChoice& c = choice_of(*g, *p, "FusedGemm");
    return std::string(c.tactic->name) + " " + precision_name(c.precision);
  };
  EXPECT_EQ(forced(true, "fused_gemm.cublaslt"), "fused_gemm.cublaslt fp16");
  EXPECT_EQ(forced(false, "fused_gemm.cublaslt"), "fused_gemm.cublaslt tf32");
#if KILN_HAVE_CUTLASS
  EXPECT_EQ(forced(true, "fused_gemm.cutlass_sm90"), "fused_gemm.cutlass_sm90 fp16");
#endif
}

#if KILN_HAVE_CUTLASS
// A transformer's output projection marked INT8 (X, W and Y with scales, a residual): the CUTLASS
// INT8 GEMM takes it as the INT8 candidate that writes Y in float16 (not requantized) and reads
// the residual in float16; it writes no float32, so a build without --fp16 has no such candidate.
TEST(CudaInt8Lowering, Int8GemmWritesFloat16ForFloatReaders) {
  auto forced = [](bool fp16) -> std::string {
    auto g = std::make_unique<Graph>();
    Value* x = g->add_value("x", TensorType(DataType::kFloat32, {2, 16, 64}));
    Value* r = g->add_value("r", TensorType(DataType::kFloat32, {2, 16, 32}));
    g->add_input(x);
    g->add_input(r);
    Value* w = g->add_constant("w", ramp({64, 32}, 0.01f));
    Value* b = g->add_constant("b", ramp({32}, 0.1f));
    Node* n = g->add_node("FusedGemm", "proj", {x, w, b, r}, {"y"}, "kiln");
    n->attrs.set("base", Attribute::String("MatMul"));
    n->attrs.set("int8", Attribute::Int(1));
    x->quant_scales = {0.02f};
    r->quant_scales = {0.03f};
    w->quant_scales = quant::weight_scales(*w->constant, 1);
    w->quant_axis = 1;
    n->output(0)->quant_scales = {0.05f};
    Node* relu = g->add_node("Relu", "after", {n->output(0)}, {"z"});
    g->add_output(relu->output(0));
    EXPECT_TRUE(infer_shapes(*g).ok());
    GpuBuildOptions o;
    o.fp16 = fp16;
    o.tune = false;
    o.force_tactic = "gemm_int8.cutlass_sm90";
    auto p = lower_for_gpu(*g, {{2, 16, 64}, {2, 16, 32}}, o);
    if (!p.ok()) return "error: " + p.status().message();
    const LayerChoice& c = choice_of(*g, *p, "FusedGemm");
    return std::string(c.tactic->name) + " " + precision_name(c.precision) + " x " +
           c.in[0].str() + " r " + c.in[3].str() + " y " + c.out[0].str();
  };
  EXPECT_EQ(forced(true),
            "gemm_int8.cutlass_sm90 int8 x int8/linear r float16/linear y float16/linear");
  const std::string f32 = forced(false);
  EXPECT_NE(f32.find("no float32 kernel"), std::string::npos) << f32;
}
#endif

TEST(CudaInt8Lowering, ReformatIntoInt8NeedsAScale) {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("act", TensorType(DataType::kFloat32, {2, 8}));
  g->add_input(x);
  Node* r = g->add_node("Reformat", "r", {x}, {"q"}, "kiln");
  r->output(0)->type = x->type;
  LayerDesc d{r,
              {TensorFormat{DataType::kFloat32, Layout::kLinear}},
              {TensorFormat{DataType::kInt8, Layout::kLinear}},
              Precision::kFP32,
              ""};
  auto layer = find_tactic("reformat")->create(d);
  ASSERT_FALSE(layer.ok());
  EXPECT_NE(layer.status().message().find("'act'"), std::string::npos) << layer.status().message();
  x->quant_scales = {0.1f};
  EXPECT_TRUE(find_tactic("reformat")->create(d).ok());
}

}  // namespace
}  // namespace kiln::gpu
