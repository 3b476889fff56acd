// kiln compare's pieces on the CPU backend: the metrics on known tensors, the jump rule on
// hand-made errors, debug tensors from an execution context, and the per-layer comparison
// naming the layer whose weights were corrupted (the GPU version is in tests/cuda).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "compare/compare.h"
#include "compare/compare_test_net.h"
#include "compare/dataset.h"

namespace kiln {
namespace {

TEST(CompareMetrics, KnownValues) {
  Tensor ref = Tensor::from<float>({2, 3}, {1, 2, 3, 3, 2, 1});
  Tensor got = Tensor::from<float>({2, 3}, {1, 2, 3.5f, 3, 3.5f, 1});
  auto m = compare_tensors(got, ref, "t");
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ(m->max_abs, 1.5);
  EXPECT_NEAR(m->rel_l2, std::sqrt(2.5 / 28.0), 1e-12);
  EXPECT_DOUBLE_EQ(m->top1, 0.5);  // row 0 agrees (index 2), row 1 does not (1 vs 0)
  EXPECT_GT(m->cosine, 0.9);
  EXPECT_LT(m->cosine, 1.0);
  auto same = compare_tensors(ref, ref, "t");
  EXPECT_DOUBLE_EQ(same->rel_l2, 0);
  EXPECT_DOUBLE_EQ(same->cosine, 1);
  Tensor nan = Tensor::from<float>({2, 3}, {1, 2, NAN, 3, 2, 1});
  EXPECT_FALSE(compare_tensors(nan, ref, "t")->finite);
  auto bad = compare_tensors(Tensor::from<float>({4}, {1, 2, 3, 4}), ref, "output 'y'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("output 'y'"), std::string::npos);
}

TEST(CompareLocalise, JumpRule) {
  auto g = testnet::small_cnn();
  auto make = [](float v) { return Tensor::from<float>({2}, {1.f + v, 1.f}); };
  std::map<std::string, Tensor> ref = {
      {"conv1_out", make(0)}, {"relu2_out", make(0)}, {"y", make(0)}};
  // Error growing 5x per layer from a start above the floor: only the first is a jump.
  std::map<std::string, Tensor> got = {
      {"conv1_out", make(0.02f)}, {"relu2_out", make(0.1f)}, {"y", make(0.5f)}};
  auto r = localise_error(*g, got, ref, 1e-2);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->layers.size(), 3u);
  EXPECT_EQ(r->first_jump, 0);
  EXPECT_FALSE(r->layers[1].jump);
  EXPECT_GT(r->layers[1].upstream, 0.0);  // reached through relu1/conv2, not compared
  // Small error, then a 100x jump at relu2_out: that one is named.
  got["conv1_out"] = make(1e-4f);
  got["relu2_out"] = make(0.05f);
  r = localise_error(*g, got, ref, 1e-2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first_jump, 1);
  EXPECT_EQ(r->layers[1].layer, "relu2");
}

TEST(CompareDebugTensors, CpuContextKeepsNamedValues) {
  BuildConfig c;
  c.backend = "cpu";
  c.opt_level = 0;
  auto e = Engine::build_from_graph(testnet::small_cnn(), c, "net");
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto ctx = (*e)->create_context();
  ASSERT_TRUE(ctx.ok());
  EXPECT_FALSE((*ctx)->set_debug_tensors({"no_such_value"}).ok());
  ASSERT_TRUE((*ctx)->set_debug_tensors({"conv2_out", "x"}).ok());
  Tensor x = testnet::random_tensor({2, 4, 12, 12}, 5, 1.f);
  ASSERT_TRUE((*ctx)->execute({{"x", x}}).ok());
  auto kept = (*ctx)->debug_tensors();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept["conv2_out"].shape(), (std::vector<int64_t>{2, 16, 12, 12}));
  EXPECT_EQ(kept["x"].at_double(7), x.at_double(7));
  ASSERT_TRUE((*ctx)->set_debug_tensors({}).ok());
  ASSERT_TRUE((*ctx)->execute({{"x", x}}).ok());
  EXPECT_TRUE((*ctx)->debug_tensors().empty());
}

// A tensor that one of a fused layer's own ONNX nodes reads is not compared: the layer may write
// another value under its name (a MatMul whose scale Mul folded in), and the model's is inside it.
TEST(CompareLocalise, SkipsATensorInsideAFusedLayer) {
  const TensorType t(DataType::kFloat32, {2, 8});
  Graph ref;
  Value* x = ref.add_value("x", t);
  ref.add_input(x);
  Node* mm = ref.add_node("MatMul", "mm", {x, x}, {"mm_out"});
  Node* mul = ref.add_node("Mul", "mul", {mm->output(0), x}, {"mul_out"});
  Node* relu = ref.add_node("Relu", "relu", {mul->output(0)}, {"y"});
  for (Node* n : {mm, mul, relu}) n->output(0)->type = t;
  ref.add_output(relu->output(0));
  auto engine = ref.clone();
  Node* fused = engine->find_value("mm_out")->producer;
  fused->onnx_nodes = {"mm", "mul"};
  EXPECT_EQ(common_tensors(*engine, ref), (std::vector<std::string>{"mul_out", "y"}));
}

// The acceptance test of per-layer localisation, on the cpu backend: the engine is built (and
// fused) from a graph whose conv2 weights were perturbed; the reference has the right ones.
TEST(ComparePerLayer, NamesTheCorruptedLayer) {
  for (const std::string bad : {"conv1", "conv2", "conv3"}) {
    BuildConfig c;
    c.backend = "cpu";
    auto e = Engine::build_from_graph(testnet::small_cnn(bad), c, "net");
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto ref = Reference::from_graph(testnet::small_cnn());
    ASSERT_TRUE(ref.ok()) << ref.status().message();
    const auto names = common_tensors((*e)->graph(), (*ref)->graph());
    ASSERT_GE(names.size(), 4u);  // the fused convs' outputs, pooling, flatten, fc
    Tensor x = testnet::random_tensor({2, 4, 12, 12}, 7, 1.f);
    std::map<std::string, Tensor> ref_kept;
    ASSERT_TRUE((*ref)->run({{"x", x}}, names, &ref_kept).ok());
    auto ctx = (*e)->create_context();
    ASSERT_TRUE((*ctx)->set_debug_tensors(names).ok());
    ASSERT_TRUE((*ctx)->execute({{"x", x}}).ok());
    auto rep =
        localise_error((*e)->graph(), (*ctx)->debug_tensors(), ref_kept, default_jump_floor(**e));
    ASSERT_TRUE(rep.ok()) << rep.status().message();
    ASSERT_GE(rep->first_jump, 0) << bad;
    const LayerError& j = rep->layers[rep->first_jump];
    EXPECT_EQ(j.layer, bad) << "tensor " << j.tensor << " rel_l2 " << j.m.rel_l2;
    EXPECT_EQ(j.op_type, "kiln.FusedConv");
    for (int i = 0; i < rep->first_jump; ++i) EXPECT_LT(rep->layers[i].m.rel_l2, 1e-5);
  }
}

// The float64 reference widens what kernels make in float32 from other types (a Cast from
// int64, as torchvision's exports do with shapes), so a later float op sees one type; and a Cast
// of a float64 value to float32 keeps the value unrounded.
TEST(CompareReference, Float64ThroughCasts) {
  auto g = std::make_unique<Graph>();
  Value* n = g->add_value("n", TensorType(DataType::kInt64, {3}));
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {3}));
  g->add_input(n);
  g->add_input(x);
  Node* c = g->add_node("Cast", "cast_n", {n}, {"nf"});
  c->attrs.set("to", Attribute::Int(1));  // FLOAT
  Value* three = g->add_constant("three", Tensor::from<float>({1}, {3.f}));
  Value* q = g->add_node("Div", "div", {c->output(0), three}, {"q"})->output(0);
  Value* s = g->add_node("Add", "add", {q, x}, {"s"})->output(0);
  Node* back = g->add_node("Cast", "cast_s", {s}, {"y"});
  back->attrs.set("to", Attribute::Int(1));
  g->add_output(back->output(0));
  ASSERT_TRUE(infer_shapes(*g).ok());
  auto ref = Reference::from_graph(std::move(g));
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  auto out = (*ref)->run({{"n", Tensor::from<int64_t>({3}, {1, 2, 4})},
                          {"x", Tensor::from<float>({3}, {0.f, 1e-9f, 0.f})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ((*out)[0].dtype(), DataType::kFloat64);
  EXPECT_EQ((*out)[0].at_double(0), 1.0 / 3.0);  // float32 would round 1/3
  EXPECT_EQ((*out)[0].at_double(1), 2.0 / 3.0 + static_cast<double>(1e-9f));
  EXPECT_EQ((*out)[0].at_double(2), 4.0 / 3.0);
}

TEST(CompareDataset, IdxFilesAndErrors) {
  const std::string dir = ::testing::TempDir() + "/kiln_idx";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, std::vector<unsigned char> bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  };
  std::vector<unsigned char> images = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2};
  for (int i = 0; i < 8; ++i) images.push_back(static_cast<unsigned char>(i * 30));
  write("t10k-images-idx3-ubyte", images);
  write("t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 2, 7, 3});
  auto ds = Dataset::open(dir);
  ASSERT_TRUE(ds.ok()) << ds.status().message();
  ASSERT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->label(1), 3);
  ImagePreprocess p;
  p.channels = 1;
  auto s = ds->sample(1, p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shape(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_FLOAT_EQ(s->data<float>()[3], 210.f / 255.f);
  auto b = stack_batch({*ds->sample(0, p), *s});
  EXPECT_EQ(b->shape(), (std::vector<int64_t>{2, 1, 2, 2}));
  write("t10k-labels-idx1-ubyte", {0, 0, 8, 1, 0, 0, 0, 3, 7, 3, 1});
  auto mismatch = Dataset::open(dir);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("2 images but 3 labels"), std::string::npos);
  images.pop_back();
  write("t10k-images-idx3-ubyte", images);
  EXPECT_NE(Dataset::open(dir).status().message().find("IDX header says"), std::string::npos);
  EXPECT_FALSE(Dataset::open(dir + "/nope").ok());
}

}  // namespace
}  // namespace kiln
