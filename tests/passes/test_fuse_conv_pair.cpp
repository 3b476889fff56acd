// fuse_conv_pair, the INT8 stage's pass: two INT8 FusedConvs whose sum feeds one activation
// (ResNet's bottleneck block 0: the last 1x1 conv and the downsample) become kiln.FusedConvPair
// where the backend has a kernel for it. The CPU backend never does, so here: it does not pair
// and says why, each rejection says its own reason, the layer the pass would make computes what
// the two layers did, and the INT8 stage's pipeline (levels, only_passes, --dump-graph).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "passes/pass_test_util.h"
#include "passes/passes.h"
#include "quant/int8.h"

namespace kiln::test {
namespace {

struct PairOptions {
  bool a_int8 = true, b_int8 = true;
  bool a_relu = false;       // A has an activation
  bool y_other_use = false;  // A's output is read by another node too
  bool y_scale = true;       // A's output has an INT8 scale (as calibration gives it)
};

struct PairGraph {
  G b;
  Node* a = nullptr;
  Node* second = nullptr;
};

// A = FusedConv(x, W[256,64,1,1], bA) -> y;  B = FusedConv(x2, W2[256,64,1,1], bB, y) + Relu.
// 1x1 convolutions with 64 input channels each: shapes cuda's pair kernel takes.
std::unique_ptr<PairGraph> pair_graph(const PairOptions& o) {
  auto p = std::make_unique<PairGraph>();
  G& b = p->b;
  Value* x = b.in("x", {1, 64, 4, 4});
  Value* x2 = b.in("x2", {1, 64, 8, 8});
  const Attributes k1 = attrs({{"kernel_shape", Attribute::Ints({1, 1})}});
  Attributes a_attrs = k1;
  if (o.a_relu) a_attrs.set("activation", Attribute::String("Relu"));
  if (o.a_int8) a_attrs.set("int8", Attribute::Int(1));
  p->a = b.node("Conv", {x, b.c(rand_t({256, 64, 1, 1})), b.c(rand_t({256}))}, a_attrs);
  Value* y = p->a->output(0);
  Attributes b_attrs = attrs({{"kernel_shape", Attribute::Ints({1, 1})},
                              {"strides", Attribute::Ints({2, 2})},
                              {"activation", Attribute::String("Relu")}});
  if (o.b_int8) b_attrs.set("int8", Attribute::Int(1));
  p->second = b.node("Conv", {x2, b.c(rand_t({256, 64, 1, 1})), b.c(rand_t({256})), y}, b_attrs);
  for (Node* n : {p->a, p->second}) {
    n->op_type = "FusedConv";
    n->domain = "kiln";
  }
  b.out(p->second->output(0));
  if (o.y_other_use) b.out(b.op("Neg", {y}));
  EXPECT_TRUE(infer_shapes(b.g).ok());
  x->quant_scales = {2.f / 127};
  x2->quant_scales = {3.f / 127};
  if (o.y_scale) y->quant_scales = {4.f / 127};
  for (Node* n : {p->a, p->second}) {
    Value* w = n->input(1);
    w->quant_scales = quant::weight_scales(*w->constant, 0);
    w->quant_axis = 0;
  }
  return p;
}

OptimizeOptions int8_options(const std::string& backend = "cpu") {
  OptimizeOptions o;
  o.backend = backend;
  o.precision = "int8";
  o.verbose = true;  // notes are kept only in verbose mode
  return o;
}

// Runs fuse_conv_pair once on g; returns its notes.
std::set<std::string> pair_notes(Graph& g, bool* changed) {
  return pass_notes(g, "fuse_conv_pair", passes::fuse_conv_pair, changed, int8_options());
}

TEST(FuseConvPair, CpuBackendDoesNotPairAndSaysWhy) {
  auto p = pair_graph({});
  bool changed = true;
  const auto notes = pair_notes(p->b.g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(p->b.g.nodes().size(), 2u);
  EXPECT_TRUE(has_note(notes,
                       "the cpu backend cannot run kiln.FusedConvPair (float32) as one "
                       "layer at int8"))
      << dump_notes(notes);

  // The INT8 stage and run_pass find it too, and leave the graph as it was.
  const std::string before = graph_to_text(p->b.g);
  ASSERT_TRUE(optimize_int8_graph(p->b.g, int8_options()).ok());
  EXPECT_EQ(graph_to_text(p->b.g), before);
  auto r = run_pass(p->b.g, "fuse_conv_pair", int8_options());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(*r);
}

TEST(FuseConvPair, RejectionsSayTheirReason) {
  struct Case {
    PairOptions o;
    const char* note;
  };
  PairOptions a_act, other_use, a_float, b_float;
  a_act.a_relu = true;
  other_use.y_other_use = true;
  a_float.a_int8 = false;
  b_float.b_int8 = false;
  for (const Case& c : {Case{a_act, "the first convolution has an activation"},
                        Case{other_use,
                             "the first convolution's output has another consumer or "
                             "is a graph output"},
                        Case{a_float, "the first convolution does not run in INT8"},
                        Case{b_float, "the second convolution does not run in INT8"}}) {
    auto p = pair_graph(c.o);
    bool changed = true;
    const auto notes = pair_notes(p->b.g, &changed);
    EXPECT_FALSE(changed) << c.note;
    ASSERT_EQ(notes.size(), 1u) << dump_notes(notes);
    EXPECT_EQ(*notes.begin(),
              fmt::format("{} + {}: {}", p->a->label(), p->second->label(), c.note));
  }
}

// The layer the pass makes (its inputs and attributes from conv_pair_layer, put in place as the
// rewrite does) computes exactly what the two INT8 layers did when A's output is not quantized
// (with a scale on it, the two layers round the intermediate to int8; the pair never does).
TEST(FuseConvPair, PairLayerEqualsTheTwoLayers) {
  PairOptions o;
  o.y_scale = false;
  auto p = pair_graph(o);
  const std::unique_ptr<Graph> original = p->b.g.clone();
  const std::string a_name = p->a->name;
  std::vector<std::string> covered = p->a->onnx_nodes;
  covered.insert(covered.end(), p->second->onnx_nodes.begin(), p->second->onnx_nodes.end());

  const passes::ConvPairLayer l = passes::conv_pair_layer(*p->a, *p->second);
  EXPECT_EQ(l.attrs.get_ints("kernel_shape"), (std::vector<int64_t>{1, 1}));
  EXPECT_FALSE(l.attrs.has("strides"));
  EXPECT_EQ(l.attrs.get_ints("conv2_kernel_shape"), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(l.attrs.get_ints("conv2_strides"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(l.attrs.get_string("activation", ""), "Relu");
  EXPECT_EQ(l.attrs.get_int("int8", 0), 1);
  for (const char* k : {"conv2_activation", "conv2_int8"}) EXPECT_FALSE(l.attrs.has(k)) << k;
  ASSERT_EQ(l.inputs.size(), 6u);
  EXPECT_EQ(l.inputs[0], p->a->input(0));
  EXPECT_EQ(l.inputs[3], p->second->input(0));
  EXPECT_EQ(l.inputs[5], p->second->input(2));

  const OptimizeOptions opts = int8_options();
  passes::PassContext ctx{p->b.g, opts, "fuse_conv_pair", {}, 0};
  auto fused = passes::replace_with_layer(ctx, {p->a, p->second}, "kiln", "FusedConvPair", l.inputs,
                                          l.attrs, p->second->output(0));
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  ASSERT_TRUE(p->b.g.topo_sort().ok());
  ASSERT_TRUE(infer_shapes(p->b.g).ok());
  ASSERT_EQ(p->b.g.nodes().size(), 1u);
  const Node* n = p->b.g.nodes()[0];
  EXPECT_EQ(n->name, a_name);
  EXPECT_EQ(n->onnx_nodes, covered);
  EXPECT_EQ(quant::int8_blocker(*n), "");

  const auto ins = random_inputs(*original);
  const auto before = run_cpu(*original, ins), after = run_cpu(p->b.g, ins);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  ASSERT_EQ(after[0].shape(), (std::vector<int64_t>{1, 256, 4, 4}));
  for (int64_t i = 0; i < before[0].numel(); ++i)
    ASSERT_EQ(after[0].data<float>()[i], before[0].data<float>()[i]) << "element " << i;
}

TEST(FuseConvPair, Int8StageLevelsAndDumps) {
  EXPECT_EQ(int8_pipeline_passes(2),
            (std::vector<std::string>{"fuse_conv_pair", "eliminate_dead_code"}));
  EXPECT_TRUE(int8_pipeline_passes(1).empty());
  const auto l2 = pipeline_passes(2);
  EXPECT_EQ(std::count(l2.begin(), l2.end(), "fuse_conv_pair"), 0);

  // The INT8 stage continues the float pipeline's --dump-graph numbering.
  const std::string dir = ::testing::TempDir() + "/kiln_int8_dump_test";
  std::filesystem::remove_all(dir);
  auto p = pair_graph({});
  OptimizeOptions o = int8_options();
  o.verbose = false;
  o.dump_dir = dir;
  o.only_passes = {"eliminate_dead_code"};
  ASSERT_TRUE(optimize_graph(p->b.g, o).ok());  // 00_import, 01_final
  o.only_passes.clear();
  ASSERT_TRUE(optimize_int8_graph(p->b.g, o).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/01_final.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/02_int8_final.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/02_int8_final.dot"));

  // Below level 2 the stage does nothing (no dump either).
  o.opt_level = 1;
  ASSERT_TRUE(optimize_int8_graph(p->b.g, o).ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/03_int8_final.txt"));
  o.opt_level = 3;
  EXPECT_FALSE(optimize_int8_graph(p->b.g, o).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::test
