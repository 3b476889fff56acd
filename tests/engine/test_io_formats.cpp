// Build-time input and output types (--input-io-formats / --output-io-formats, trtexec's
// --inputIOFormats / --outputIOFormats) on the CPU backend: the engine's tensors take the types
// asked for under their own names and compute what the model computes on them; bad specs are
// refused in one line that names the option and the tensor.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/engine.h"
#include "ops/op.h"

namespace kiln {
namespace {

// x float32 [N, 4], ids int64 [N] -> y = x * 3 + 0.1 (float32), n = ids (int64) -> Identity
std::unique_ptr<Graph> model() {
  auto g = std::make_unique<Graph>();
  Value* x = g->add_value("x", TensorType(DataType::kFloat32, {Dim::sym("N"), Dim(4)}));
  Value* ids = g->add_value("ids", TensorType(DataType::kInt64, {Dim::sym("N")}));
  g->add_input(x);
  g->add_input(ids);
  Value* three = g->add_constant("three", Tensor::scalar<float>(3.f));
  Value* tenth = g->add_constant("tenth", Tensor::scalar<float>(0.1f));
  Node* mul = g->add_node("Mul", "mul", {x, three}, {"xs"});
  Node* add = g->add_node("Add", "add", {mul->output(0), tenth}, {"y"});
  Node* id = g->add_node("Identity", "id", {ids}, {"n"});
  g->add_output(add->output(0));
  g->add_output(id->output(0));
  EXPECT_TRUE(infer_shapes(*g).ok());
  return g;
}

Expected<std::unique_ptr<Engine>> build(std::vector<std::string> in, std::vector<std::string> out) {
  BuildConfig c;
  c.backend = "cpu";
  c.shapes = {{"x", {2, 4}}, {"ids", {2}}};
  c.input_io_formats = std::move(in);
  c.output_io_formats = std::move(out);
  return Engine::build_from_graph(model(), c, "io_model");
}

TEST(IoFormats, Fp16InputsAndOutputsKeepTheirNames) {
  auto e = build({"fp16"}, {"fp16:chw"});
  ASSERT_TRUE(e.ok()) << e.status().message();
  const Engine& eng = **e;
  ASSERT_EQ(eng.inputs().size(), 2u);
  EXPECT_EQ(eng.inputs()[0].name, "x");
  EXPECT_EQ(eng.inputs()[0].dtype, DataType::kFloat16);
  EXPECT_EQ(eng.inputs()[1].dtype, DataType::kInt64);  // one spec: float tensors only
  ASSERT_EQ(eng.outputs().size(), 2u);
  EXPECT_EQ(eng.outputs()[0].name, "y");
  EXPECT_EQ(eng.outputs()[0].dtype, DataType::kFloat16);
  EXPECT_EQ(eng.outputs()[1].name, "n");
  EXPECT_EQ(eng.outputs()[1].dtype, DataType::kInt64);

  Tensor x(DataType::kFloat16, {2, 4});
  for (int i = 0; i < 8; ++i) x.data<uint16_t>()[i] = float_to_half(0.37f * static_cast<float>(i) - 1.f);
  Tensor ids(DataType::kInt64, {2});
  ids.data<int64_t>()[0] = 7, ids.data<int64_t>()[1] = -2;
  auto ctx = eng.create_context();
  ASSERT_TRUE(ctx.ok()) << ctx.status().message();
  auto out = (*ctx)->execute({{"x", x}, {"ids", ids}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  ASSERT_EQ((*out)[0].dtype(), DataType::kFloat16);
  for (int i = 0; i < 8; ++i) {
    // The model's float32 arithmetic on the float16 input, rounded to float16 once at the end.
    const float want = half_to_float(x.data<uint16_t>()[i]) * 3.f + 0.1f;
    EXPECT_EQ((*out)[0].data<uint16_t>()[i], float_to_half(want)) << i;
  }
  EXPECT_EQ((*out)[1].data<int64_t>()[0], 7);
  EXPECT_EQ((*out)[1].data<int64_t>()[1], -2);
}

TEST(IoFormats, OneSpecPerTensorInOrder) {
  auto e = build({"fp32", "int64"}, {"fp16", "int64"});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->inputs()[0].dtype, DataType::kFloat32);
  EXPECT_EQ((*e)->outputs()[0].dtype, DataType::kFloat16);
  EXPECT_EQ((*e)->outputs()[1].dtype, DataType::kInt64);
}

TEST(IoFormats, NoSpecsKeepTheModelsTypes) {
  auto e = build({}, {});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->inputs()[0].dtype, DataType::kFloat32);
  EXPECT_EQ((*e)->outputs()[0].dtype, DataType::kFloat32);
}

TEST(IoFormats, BadSpecsAreRefusedByName) {
  struct Case {
    std::vector<std::string> in, out;
    const char* says;
  };
  const Case cases[] = {
      {{"fp16", "fp16"}, {}, "input 'ids' is int64"},
      {{}, {"fp16", "fp32", "fp16"}, "3 specs for 2 outputs"},
      {{}, {"fp16:hwc"}, "row-major"},
      {{}, {"fp8"}, "'fp8' is not a type"},
      {{}, {"fp16", "fp32"}, "output 'n' is int64: its spec can only be int64"},
      {{"int64", "int64"}, {}, "input 'x' is float32: its spec can only be fp32 or fp16"},
  };
  for (const Case& c : cases) {
    auto e = build(c.in, c.out);
    ASSERT_FALSE(e.ok()) << c.says;
    EXPECT_NE(e.status().message().find(c.says), std::string::npos) << e.status().message();
    EXPECT_EQ(e.status().message().find('\n'), std::string::npos) << e.status().message();
  }
}

TEST(IoFormats, SpecsTakeSpacesAndTrtexecsFormats) {
  auto e = build({" fp16:CHW "}, {"fp16:linear ", " int64"});
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->inputs()[0].dtype, DataType::kFloat16);
  EXPECT_EQ((*e)->outputs()[0].dtype, DataType::kFloat16);
  EXPECT_EQ((*e)->outputs()[1].dtype, DataType::kInt64);
}

}  // namespace
}  // namespace kiln
