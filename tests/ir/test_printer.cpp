#include <gtest/gtest.h>

#include "ir/graph.h"
#include "ir/printer.h"

namespace kiln {
namespace {

TensorType f32(std::vector<Dim> d) { return TensorType(DataType::kFloat32, std::move(d)); }

struct Sample {
  Graph g;
  Node *q, *d, *f;
  Sample() {
    g.name = "sample \"net\"";
    g.opset = 17;
    Value* x = g.add_value("x", f32({Dim::sym("N"), 3}));
    g.add_input(x);
    Value* scale = g.add_constant("scale", Tensor::from<float>({3}, {0.5f, 0.25f, 2.f}));
    Value* w = g.add_constant("w", Tensor::from<float>({2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
    Value* axes = g.add_constant("axes", Tensor::from<int64_t>({2}, {1, -1}));
    q = g.add_node("QuantizeLinear", "q", {x, scale, nullptr}, {"xq"});
    q->attrs.set("axis", Attribute::Int(1));
    q->attrs.set("saturate", Attribute::Int(1));
    q->onnx_nodes = {"q_onnx"};
    q->output(0)->type = TensorType(DataType::kUInt8, {Dim::sym("N"), 3});
    d = g.add_node("DequantizeLinear", "d", {q->output(0), scale}, {"y"});
    d->output(0)->type = f32({Dim::sym("N"), 3});
    d->origin = "fold_qdq";
    d->onnx_nodes = {"d1", "d2"};
    f = g.add_node("FusedThing", "f", {d->output(0), w, axes}, {"z", ""}, "kiln");
    f->attrs.set("mode", Attribute::String("fast"));
    f->output(0)->type = TensorType::unknown_rank(DataType::kFloat32);
    g.add_output(f->output(0));
    g.add_output(q->output(0));
  }
};

void expect_contains(const std::string& text, const std::string& line) {
  EXPECT_NE(text.find(line), std::string::npos) << "missing:\n" << line << "\nin:\n" << text;
}

TEST(Printer, TextListsEverything) {
  Sample s;
  const std::string t = graph_to_text(s.g);
  expect_contains(t, "graph 'sample \"net\"' (opset 17)\n");
  expect_contains(t, "inputs:\n  %x: float32[N,3]\nconstants:\n");
  expect_contains(t, "  %scale: float32[3] = [0.5, 0.25, 2]\n");
  expect_contains(t, "  %w: float32[2,5] = [1, 2, 3, 4, ...] (10 values)\n");
  expect_contains(t, "  %axes: int64[2] = [1, -1]\n");
  expect_contains(t,
                  "nodes:\n  %xq: uint8[N,3] = QuantizeLinear[axis=1, saturate=1](%x, %scale, _)"
                  "  # q, import, covers: q_onnx\n");
  expect_contains(
      t, "  %y: float32[N,3] = DequantizeLinear(%xq, %scale)  # d, fold_qdq, covers: d1, d2\n");
  expect_contains(
      t, "  %z: float32[?...], _ = kiln.FusedThing[mode=\"fast\"](%y, %w, %axes)  # f, import\n");
  expect_contains(t, "outputs:\n  %z: float32[?...]\n  %xq: uint8[N,3]\n");
  // Sections come in order, and the dump is stable.
  EXPECT_LT(t.find("inputs:"), t.find("constants:"));
  EXPECT_LT(t.find("constants:"), t.find("nodes:"));
  EXPECT_LT(t.find("nodes:"), t.find("outputs:"));
  EXPECT_EQ(t, graph_to_text(s.g));
  auto c = s.g.clone();
  EXPECT_EQ(t, graph_to_text(*c));
}

TEST(Printer, ConstantSummaries) {
  Graph g;
  EXPECT_EQ(constant_summary(*g.add_constant("b", Tensor::from<bool>({2}, {true, false}))),
            "bool[2] = [true, false]");
  EXPECT_EQ(constant_summary(*g.add_constant("s", Tensor::scalar<int8_t>(-3))), "int8[] = [-3]");
  EXPECT_EQ(constant_summary(*g.add_constant("e", Tensor(DataType::kFloat32, {0, 4}))),
            "float32[0,4] = []");
  EXPECT_EQ(constant_summary(*g.add_constant("u", Tensor::scalar<uint64_t>(~uint64_t{0}))),
            "uint64[] = [18446744073709551615]");
  Tensor h = Tensor::from<float>({9}, {1.5f, 2, 3, 4, 5, 6, 7, 8, 9}).cast(DataType::kFloat16);
  EXPECT_EQ(constant_summary(*g.add_constant("h", h)),
            "float16[9] = [1.5, 2, 3, 4, ...] (9 values)");
  EXPECT_EQ(constant_summary(*g.add_value("v", f32({2}))), "float32[2]");
  // float32 prints at float precision, float64 at double precision.
  EXPECT_EQ(constant_summary(*g.add_constant("f", Tensor::scalar<float>(0.1f))),
            "float32[] = [0.1]");
  EXPECT_EQ(constant_summary(*g.add_constant("d", Tensor::scalar<double>(0.1))),
            "float64[] = [0.1]");
  EXPECT_EQ(constant_summary(*g.add_constant("d2", Tensor::scalar<double>(1.0 / 3))),
            "float64[] = [0.3333333333333333]");
}

TEST(Printer, DotHasBoxesEdgesAndFoldedConstants) {
  Sample s;
  const std::string d = graph_to_dot(s.g);
  expect_contains(d, "digraph \"sample \\\"net\\\"\" {\n");
  expect_contains(d, "  in0 [shape=ellipse, label=\"x\\nfloat32[N,3]\"];\n");
  expect_contains(d, "  n0 [shape=box, label=\"QuantizeLinear\\nq\\nscale: float32[3]\"];\n");
  expect_contains(
      d, "  n2 [shape=box, label=\"kiln.FusedThing\\nf\\nw: float32[2,5]\\naxes: int64[2]\"];\n");
  expect_contains(d, "  in0 -> n0 [label=\"float32[N,3]\"];\n");
  expect_contains(d, "  n0 -> n1 [label=\"uint8[N,3]\"];\n");
  expect_contains(d, "  n1 -> n2 [label=\"float32[N,3]\"];\n");
  expect_contains(d, "  out0 [shape=ellipse, label=\"z\\nfloat32[?...]\"];\n");
  expect_contains(d, "  n2 -> out0 [label=\"float32[?...]\"];\n");
  expect_contains(d, "  n0 -> out1 [label=\"uint8[N,3]\"];\n");
  EXPECT_EQ(d.find("-> n0 [label=\"float32[3]\"]"), std::string::npos);  // constants: no edges
  EXPECT_EQ(d.substr(d.size() - 2), "}\n");
  // Every quote inside a label is escaped: no line has an odd number of unescaped quotes.
  size_t start = 0;
  while (start < d.size()) {
    size_t end = d.find('\n', start);
    int quotes = 0;
    for (size_t i = start; i < end; ++i)
      if (d[i] == '"' && (i == 0 || d[i - 1] != '\\')) ++quotes;
    EXPECT_EQ(quotes % 2, 0) << d.substr(start, end - start);
    start = end + 1;
  }
}

TEST(Printer, DotNamesWithQuotesAndBackslashes) {
  Graph g;
  Value* x = g.add_value("a\"b\\c", f32({1}));
  g.add_input(x);
  Node* n = g.add_node("ReduceSum", "n\"1", {x}, {"y"});
  g.add_output(n->output(0));
  const std::string d = graph_to_dot(g);
  expect_contains(d, "label=\"a\\\"b\\\\c\\nfloat32[1]\"");
  expect_contains(d, "label=\"ReduceSum\\nn\\\"1\"");
}

}  // namespace
}  // namespace kiln
