// fuse_matmul_add, fuse_conv_act, fuse_residual_add, fuse_elementwise and the capability query.
#include "pass_test_util.h"

#include <cstdlib>
#include <limits>

namespace kiln::test {
namespace {

const std::vector<std::string> kFusions = {"fuse_matmul_add", "fuse_residual_add", "fuse_conv_act",
                                           "fuse_elementwise"};

Attributes conv3x3() {
  return attrs(
      {{"kernel_shape", Attribute::Ints({3, 3})}, {"pads", Attribute::Ints({1, 1, 1, 1})}});
}

Value* conv(G& b, Value* x, int64_t cin, int64_t cout) {
  return b.op("Conv", {x, b.c(rand_t({cout, cin, 3, 3})), b.c(rand_t({cout}))}, conv3x3());
}

TEST(FuseMatMulAdd, BiasBecomesPartOfTheProduct) {
  G b;
  Value* a = b.in("a", {2, 3, 5});
  b.out(b.op("Add", {b.c(rand_t({7})), b.op("MatMul", {a, b.c(rand_t({5, 7}))})}));
  auto opt = optimize_checked(b.g, {"fuse_matmul_add"});
  ASSERT_EQ(opt->nodes().size(), 1u);
  const Node* n = opt->nodes()[0];
  EXPECT_EQ(n->domain + "." + n->op_type, "kiln.FusedGemm");
  EXPECT_EQ(n->attrs.get_string("base", ""), "MatMul");
  EXPECT_EQ(n->origin, "fuse_matmul_add");
  EXPECT_EQ(n->onnx_nodes.size(), 2u);
}

TEST(FuseMatMulAdd, GemmWithoutC) {
  G b;
  Value* g = b.op("Gemm", {b.in("a", {3, 5}), b.c(rand_t({4, 5}))},
                  attrs({{"transB", Attribute::Int(1)}, {"beta", Attribute::Float(0.f)}}));
  b.out(b.op("Add", {g, b.c(rand_t({1, 4}))}));
  auto opt = optimize_checked(b.g, {"fuse_matmul_add"});
  EXPECT_EQ(count(*opt, "FusedGemm"), 1);
}

TEST(FuseMatMulAdd, ShapeChangingBiasOrSharedProductDoesNotFuse) {
  G b;
  Value* a = b.in("a", {3, 5});
  Value* m = b.op("MatMul", {a, b.c(rand_t({5, 7}))});
  b.out(b.op("Add", {m, b.c(rand_t({2, 3, 7}))}));  // broadcast makes [2,3,7] from [3,7]
  Value* m2 = b.op("MatMul", {a, b.c(rand_t({5, 7}))});
  b.out(b.op("Add", {m2, b.c(rand_t({7}))}));
  b.out(m2);  // m2 is a graph output
  Value* m3 = b.op("MatMul", {a, b.c(rand_t({5, 7}))});
  b.out(b.op("Add", {m3, b.in("nonconst", {7})}));  // not a constant bias
  auto opt = optimize_checked(b.g, {"fuse_matmul_add"});
  EXPECT_EQ(count(*opt, "FusedGemm"), 0);
}

TEST(FuseConvAct, EveryActivation) {
  struct Case {
    const char* op;
    Attributes a;
  };
  std::vector<Case> cases = {{"Relu", {}},
                             {"Sigmoid", {}},
                             {"Tanh", {}},
                             {"LeakyRelu", attrs({{"alpha", Attribute::Float(0.2f)}})},
                             {"HardSwish", {}},
                             {"Gelu", {}},
                             {"Gelu", attrs({{"approximate", Attribute::String("tanh")}})}};
  for (const auto& c : cases) {
    G b;
    Value* x = b.in("x", {1, 3, 6, 6});
    b.out(b.op(c.op, {conv(b, x, 3, 4)}, c.a));
    b.out(b.op(c.op, {b.op("Gemm", {b.in("a", {2, 5}), b.c(rand_t({5, 3})), b.c(rand_t({3}))})},
               c.a));
    b.out(b.op(c.op, {b.op("MatMul", {b.in("m", {2, 2, 5}), b.c(rand_t({5, 3}))})}, c.a));
    auto opt = optimize_checked(b.g, {"fuse_conv_act"});
    EXPECT_EQ(opt->nodes().size(), 3u) << c.op;
    EXPECT_EQ(count(*opt, "FusedConv"), 1) << c.op;
    EXPECT_EQ(count(*opt, "FusedGemm"), 2) << c.op;
    for (const Node* n : opt->nodes()) EXPECT_EQ(n->attrs.get_string("activation", ""), c.op);
  }
}

TEST(FuseConvAct, ClipAsRelu6AndNonConstantClip) {
  G b;
  Value* x = b.in("x", {1, 3, 6, 6});
  b.out(b.op("Clip", {conv(b, x, 3, 4), b.cf(0.f), b.cf(6.f)}));
  b.out(b.op("Clip", {conv(b, x, 3, 4), b.cf(-0.5f)}));                 // min only
  b.out(b.op("Clip", {conv(b, x, 3, 4), b.in("lo", {}), b.cf(0.5f)}));  // runtime bound
  auto opt = optimize_checked(b.g, {"fuse_conv_act"});
  EXPECT_EQ(count(*opt, "FusedConv"), 2);
  EXPECT_EQ(count(*opt, "Clip"), 1);
}

TEST(FuseConvAct, SharedOrOutputIntermediateDoesNotFuse) {
  G b;
  Value* x = b.in("x", {1, 3, 6, 6});
  Value* c1 = conv(b, x, 3, 4);
  b.out(b.op("Relu", {c1}));
  b.out(b.op("Sigmoid", {c1}));  // another consumer
  Value* c2 = conv(b, x, 3, 4);
  b.out(b.op("Relu", {c2}));
  b.out(c2);  // graph output
  auto opt = optimize_checked(b.g, {"fuse_conv_act"});
  EXPECT_EQ(count(*opt, "FusedConv"), 0);
  EXPECT_EQ(count(*opt, "Conv"), 2);
}

TEST(FuseResidualAdd, ResNetBlockBecomesOneLayerPerConv) {
  G b;
  Value* x = b.in("x", {1, 4, 6, 6});
  Value* h = b.op("Relu", {conv(b, x, 4, 4)});
  Value* y = b.op("Relu", {b.op("Add", {conv(b, h, 4, 4), x})});
  Value* down = conv(b, y, 4, 4);  // a projection shortcut: both Add operands are convs
  b.out(b.op("Relu", {b.op("Add", {conv(b, y, 4, 4), down})}));
  auto opt = optimize_checked(b.g, kFusions);
  EXPECT_EQ(opt->nodes().size(), 4u);
  EXPECT_EQ(count(*opt, "FusedConv"), 3);
  int with_residual = 0;
  for (const Node* n : opt->nodes())
    if (n->op_type == "FusedConv" && n->input(3)) {
      ++with_residual;
      EXPECT_EQ(n->attrs.get_string("activation", ""), "Relu");
      EXPECT_EQ(n->onnx_nodes.size(), 3u);
    }
  EXPECT_EQ(with_residual, 2);
}

TEST(FuseResidualAdd, ActivationBeforeAddOrBroadcastingAddDoesNotFuse) {
  G b;
  Value* x = b.in("x", {1, 4, 6, 6});
  b.out(b.op("Add", {b.op("Relu", {conv(b, x, 4, 4)}), x}));  // act(conv) + x: not act(conv + x)
  b.out(b.op("Add", {conv(b, b.in("s", {1, 4, 1, 6}), 4, 4), x}));  // [1,4,1,6] + [1,4,6,6]
  auto opt = optimize_checked(b.g, {"fuse_residual_add", "fuse_conv_act"});
  EXPECT_EQ(count(*opt, "Add"), 2);
  EXPECT_EQ(count(*opt, "FusedConv"), 1);  // conv + Relu only
}

// ConvNeXt's block end: the MLP on [N, H, W, C] permuted back to NCHW, plus the block's input.
// The residual goes into the GEMM's epilogue, permuted the other way; the result is permuted
// back. Not when the permuted product is read elsewhere too.
TEST(FuseResidualAdd, ThroughThePermuteAfterTheProduct) {
  for (bool shared : {false, true}) {
    G b;
    Value* x = b.in("x", {2, 6, 3, 4});
    Value* y = b.op("MatMul", {b.in("h", {2, 3, 4, 8}), b.c(rand_t({8, 6}))});
    Value* t = b.op("Transpose", {y}, attrs({{"perm", Attribute::Ints({0, 3, 1, 2})}}));
    b.out(b.op("Add", {t, x}));
    if (shared) b.out(t);
    auto opt = optimize_checked(b.g, {"fuse_matmul_add", "fuse_residual_add"});
    EXPECT_EQ(count(*opt, "Add"), shared ? 1 : 0) << shared;
    if (shared) continue;
    const Node* f = find_op(*opt, "FusedGemm");
    ASSERT_NE(f, nullptr);
    ASSERT_NE(f->input(3), nullptr);
    EXPECT_EQ(f->input(3)->producer->op_type, "Transpose");
    EXPECT_EQ(f->input(3)->producer->attrs.get_ints("perm", {}),
              (std::vector<int64_t>{0, 2, 3, 1}));
    EXPECT_EQ(count(*opt, "Transpose"), 2);
  }
}

TEST(FuseElementwise, ChainBecomesOneLayer) {
  G b;
  Value* x = b.in("x", {2, 3, 4, 4});
  Value* v = b.op("Add", {x, b.c(rand_t({3, 1, 1}))});
  v = b.op("Mul", {v, b.cf(0.5f)});
  v = b.op("Sigmoid", {v});
  v = b.op("Sub", {b.in("y", {2, 3, 4, 4}), v});
  v = b.op("LeakyRelu", {v}, attrs({{"alpha", Attribute::Float(0.3f)}}));
  b.out(b.op("Mul", {v, x}));
  auto opt = optimize_checked(b.g, {"fuse_elementwise"});
  ASSERT_EQ(opt->nodes().size(), 1u);
  const Node* n = opt->nodes()[0];
  EXPECT_EQ(n->op_type, "ElementwiseChain");
  EXPECT_EQ(n->attrs.get_strings("ops").size(), 6u);
  EXPECT_EQ(n->num_inputs(), 4u);  // x (read twice, passed once), bias, 0.5, y
  EXPECT_EQ(n->onnx_nodes.size(), 6u);
}

TEST(FuseElementwise, ShapeChangingBroadcastEndsTheChain) {
  G b;
  Value* v = b.op("Relu", {b.in("x", {1, 4})});
  v = b.op("Add", {v, b.in("y", {3, 4})});  // [1,4] -> [3,4]: not an elementwise link
  b.out(b.op("Sigmoid", {v}));
  auto opt = optimize_checked(b.g, {"fuse_elementwise"});
  EXPECT_EQ(count(*opt, "Relu"), 1);
  EXPECT_EQ(count(*opt, "ElementwiseChain"), 1);  // Add -> Sigmoid
}

TEST(FuseElementwise, SharedOrOutputLinkSplitsTheChain) {
  G b;
  Value* x = b.in("x", {5});
  Value* a = b.op("Exp", {x});
  Value* c = b.op("Neg", {a});
  b.out(b.op("Abs", {c}));
  b.out(a);  // a is a graph output: Exp cannot hide inside the chain
  auto opt = optimize_checked(b.g, {"fuse_elementwise"});
  EXPECT_EQ(count(*opt, "Exp"), 1);
  EXPECT_EQ(count(*opt, "ElementwiseChain"), 1);
}

// DenseNet's dense layer: Concat -> BatchNorm (as an affine map) -> ReLU reads the parts in place.
TEST(FuseElementwise, ConcatJoinsTheChainThatReadsIt) {
  G b;
  Value* x0 = b.in("x0", {2, 4, 3, 3});
  Value* y1 = b.op("Relu", {b.in("y1", {2, 2, 3, 3})});
  Value* y2 = b.in("y2", {2, 3, 3, 3});
  Value* cat = b.op("Concat", {x0, y1, y2}, attrs({{"axis", Attribute::Int(1)}}));
  Value* v = b.op("Mul", {b.c(rand_t({9, 1, 1})), cat});
  v = b.op("Add", {v, b.c(rand_t({9, 1, 1}))});
  b.out(b.op("Relu", {v}));
  auto opt = optimize_checked(b.g, {"fuse_elementwise"});
  EXPECT_EQ(count(*opt, "Concat"), 0);
  ASSERT_EQ(count(*opt, "ElementwiseChain"), 1);
  for (const Node* n : opt->nodes()) {
    if (n->op_type != "ElementwiseChain") continue;
    EXPECT_EQ(n->attrs.get_int("concat_parts", 0), 3);
    EXPECT_EQ(n->attrs.get_int("concat_axis", 0), 1);
    EXPECT_EQ(n->num_inputs(), 5u);  // three parts, scale, shift
  }
}

// diffusers' GEGLU: the projection chunked in two by last-axis Slices (torch.chunk as the
// TorchScript exporter writes it), hidden * gelu(gate): the chain reads both halves in place.
TEST(FuseElementwise, ChainReadsLastAxisSlicesInPlace) {
  G b;
  Value* p = b.op("Relu", {b.in("x", {2, 5, 12})});
  Value* h = b.op("Slice", {p, b.c(ints({0})), b.c(ints({6})), b.c(ints({-1}))});
  Value* gate = b.op("Slice", {p, b.c(ints({6})), b.c(ints({std::numeric_limits<int64_t>::max()})), b.c(ints({2}))});
  b.out(b.op("Mul", {h, b.op("Gelu", {gate})}));
  Value* odd = b.op("Slice", {p, b.c(ints({0})), b.c(ints({12})), b.c(ints({2})), b.c(ints({2}))});
  b.out(b.op("Sigmoid", {odd}));  // step 2: a real copy, not a column range
  b.out(b.op("Tanh", {b.op("Slice", {p, b.c(ints({1})), b.c(ints({2})), b.c(ints({1}))})}));
  auto opt = optimize_checked(b.g, {"fuse_elementwise", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Slice"), 2);  // the step-2 one and the one of another axis
  bool found = false;
  for (const Node* n : opt->nodes()) {
    if (n->op_type != "ElementwiseChain" || n->attrs.get_strings("ops").size() != 2) continue;
    found = true;
    const auto cols = n->attrs.get_ints("col_slices");
    EXPECT_TRUE(cols == (std::vector<int64_t>{0, 6, 6, 6}) || cols == (std::vector<int64_t>{6, 6, 0, 6}))
        << cols.size();
    EXPECT_EQ(n->input(0), n->input(1));
  }
  EXPECT_TRUE(found);
}

TEST(FuseElementwise, ConcatWithAnotherReaderStays) {
  G b;
  Value* cat =
      b.op("Concat", {b.in("a", {2, 3}), b.in("c", {2, 5})}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* v = b.op("Sigmoid", {cat});
  b.out(b.op("Mul", {v, b.cf(2.f)}));
  b.out(b.op("Neg", {cat}));  // a second reader: the concatenation is written once anyway
  auto opt = optimize_checked(b.g, {"fuse_elementwise"});
  EXPECT_EQ(count(*opt, "Concat"), 1);
  EXPECT_EQ(count(*opt, "ElementwiseChain"), 1);
}

TEST(Capability, BackendWithoutFusedKernelsGetsNoFusion) {
  G b;
  Value* x = b.in("x", {1, 3, 6, 6});
  b.out(b.op("Sigmoid", {b.op("Relu", {conv(b, x, 3, 4)})}));
  auto opt = b.g.clone();
  OptimizeOptions o = only(kFusions);
  o.backend = "none";  // a backend that declares no fused kernels
  ASSERT_TRUE(optimize_graph(*opt, o).ok());
  EXPECT_EQ(opt->nodes().size(), 3u);
  o.backend = "cpu";
  ASSERT_TRUE(optimize_graph(*opt, o).ok());
  EXPECT_EQ(opt->nodes().size(), 2u);  // FusedConv(Relu) + Sigmoid
}

TEST(FusedOps, Float64ModeRunsFusedLayers) {
  G b;
  Value* x = b.in("x", {1, 4, 6, 6});
  Value* y = b.op("Relu", {b.op("Add", {conv(b, x, 4, 4), x})});
  b.out(b.op("Tanh", {b.op("Mul", {y, b.cf(2.f)})}));
  auto opt = optimize_checked(b.g, kFusions);
  EXPECT_EQ(opt->nodes().size(), 2u);
  auto ins = random_inputs(b.g);
  auto ex32 = CpuExecutor::create(*opt);
  auto ex64 = CpuExecutor::create(*opt, /*float64=*/true);
  ASSERT_TRUE(ex32.ok() && ex64.ok());
  auto r32 = (*ex32)->run(ins);
  auto r64 = (*ex64)->run(ins);
  ASSERT_TRUE(r32.ok()) << r32.status().message();
  ASSERT_TRUE(r64.ok()) << r64.status().message();
  EXPECT_LT(rel_l2((*r32)[0], (*r64)[0]), 1e-5);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// A small ResNet-style network through the whole pipeline: level 1 folds the BatchNorms,
// level 2 leaves one layer per convolution; outputs match the unoptimized graph.
TEST(Pipeline, ResNetLikeNetworkEndToEnd) {
  G b;
  auto bn = [&](Value* x, int64_t c) {
    return b.op("BatchNormalization", {x, b.c(rand_t({c}, 0.5f, 1.f)), b.c(rand_t({c})),
                                       b.c(rand_t({c})), b.c(rand_t({c}, 0.5f, 2.f))});
  };
  auto conv_bn = [&](Value* x, int64_t cin, int64_t cout) {
    return bn(b.op("Conv", {x, b.c(rand_t({cout, cin, 3, 3}))}, conv3x3()), cout);
  };
  Value* x = b.in("x", {2, 3, 8, 8});
  Value* h = b.op("Relu", {conv_bn(x, 3, 8)});
  Value* r = b.op("Relu", {b.op("Add", {conv_bn(b.op("Relu", {conv_bn(h, 8, 8)}), 8, 8), h})});
  Value* p = b.op("Flatten", {b.op("Identity", {b.op("GlobalAveragePool", {r})})});
  b.out(b.op("Gemm", {p, b.c(rand_t({10, 8})), b.c(rand_t({10}))},
             attrs({{"transB", Attribute::Int(1)}})));
  const auto ins = random_inputs(b.g);
  const auto ref = run_cpu(b.g, ins);
  const size_t expected_layers[] = {b.g.nodes().size(), 10, 6};
  for (int level : {0, 1, 2}) {
    auto g = b.g.clone();
    OptimizeOptions o;
    o.opt_level = level;
    ASSERT_TRUE(optimize_graph(*g, o).ok());
    EXPECT_EQ(g->nodes().size(), expected_layers[level]) << "level " << level;
    const auto got = run_cpu(*g, ins);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_LT(rel_l2(got[0], ref[0]), 1e-5) << "level " << level;
    if (level == 2) {
      EXPECT_EQ(count(*g, "FusedConv"), 3);
      for (const Node* n : g->nodes())
        if (n->op_type == "FusedConv") {
          EXPECT_EQ(n->attrs.get_string("activation", ""), "Relu");
        }
    }
  }
}

TEST(Pipeline, DumpGraphWritesTextAndDotPerPass) {
  G b;
  Value* x = b.in("x", {1, 3, 6, 6});
  b.out(b.op("Relu", {conv(b, b.op("Identity", {x}), 3, 4)}));
  const std::string dir = ::testing::TempDir() + "/kiln_dump_test";
  OptimizeOptions o;
  o.dump_dir = dir;
  ASSERT_TRUE(optimize_graph(b.g, o).ok());
  for (const char* f :
       {"/00_import.txt", "/00_import.dot", "/01_remove_noops.txt", "/02_fuse_conv_act.dot"}) {
    FILE* fp = std::fopen((dir + f).c_str(), "r");
    EXPECT_NE(fp, nullptr) << f;
    if (fp) std::fclose(fp);
  }
}

// fuse_conv_pool: a stem's max-pool joins it for the cuda backend in FP16 builds, where a stem
// kernel takes the layer (its capability query sees the weights and the input's shape: the
// space-to-depth kernel kiln.convpool.s2d wants RGB images of an even width); the fused layer's
// CPU kernel computes exactly what the two layers did. Not for the CPU backend, not in FP32 builds
// (the fallback tactic never justifies the fusion), not for a 64-channel input or an odd width
// (only the gated kiln.convpool.stem would take those).
TEST(FuseConvPool, StemAndMaxPoolBecomeOneLayerForTheGpuStemKernel) {
#ifndef KILN_WITH_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  auto stem = [](int64_t cin, int64_t width) {
    G b;
    Value* x = b.in("x", {2, cin, 33, width});
    Value* y = b.op("Conv", {x, b.c(rand_t({64, cin, 7, 7})), b.c(rand_t({64}))},
                    attrs({{"kernel_shape", Attribute::Ints({7, 7})},
                           {"pads", Attribute::Ints({3, 3, 3, 3})},
                           {"strides", Attribute::Ints({2, 2})}}));
    y = b.op("Relu", {y});
    b.out(b.op("MaxPool", {y}, attrs({{"kernel_shape", Attribute::Ints({3, 3})},
                                      {"pads", Attribute::Ints({1, 1, 1, 1})},
                                      {"strides", Attribute::Ints({2, 2})}})));
    return b.g.clone();
  };
  const char* old = std::getenv("KILN_UNVERIFIED_TACTICS");
  const std::string saved = old ? old : "";
  unsetenv("KILN_UNVERIFIED_TACTICS");  // the gated kiln.convpool.stem stays out of this
  auto fuse = [](const Graph& g, const std::string& backend, const std::string& precision) {
    auto opt = g.clone();
    OptimizeOptions o = only({"fuse_conv_act", "fuse_conv_pool"});
    o.backend = backend;
    o.precision = precision;
    EXPECT_TRUE(optimize_graph(*opt, o).ok());
    return opt;
  };
  const std::unique_ptr<Graph> rgb_graph = stem(3, 30);
  const Graph& rgb = *rgb_graph;
  auto opt = fuse(rgb, "cuda", "fp16");
  ASSERT_EQ(opt->nodes().size(), 1u);
  const Node* n = opt->nodes()[0];
  EXPECT_EQ(n->domain + "." + n->op_type, "kiln.FusedConvPool");
  EXPECT_EQ(n->attrs.get_string("activation", ""), "Relu");
  EXPECT_EQ(n->attrs.get_ints("pool_kernel_shape", {}), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(n->onnx_nodes.size(), 3u);
  const auto ins = random_inputs(rgb);
  const auto before = run_cpu(rgb, ins), after = run_cpu(*opt, ins);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].shape(), (std::vector<int64_t>{2, 64, 9, 8}));
  EXPECT_EQ(rel_l2(after[0], before[0]), 0.0);
  EXPECT_EQ(count(*fuse(rgb, "cpu", "fp32"), "FusedConvPool"), 0);
  EXPECT_EQ(count(*fuse(rgb, "cuda", "fp32"), "FusedConvPool"), 0);
  EXPECT_EQ(count(*fuse(*stem(64, 30), "cuda", "fp16"), "FusedConvPool"), 0);
  EXPECT_EQ(count(*fuse(*stem(3, 29), "cuda", "fp16"), "FusedConvPool"), 0);  // odd width
  if (old) setenv("KILN_UNVERIFIED_TACTICS", saved.c_str(), 1);
#endif
}

}  // namespace
}  // namespace kiln::test
