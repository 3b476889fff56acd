// Control flow: import of If/Loop subgraphs (captures of outer values, also from two levels up;
// constants shared into subgraphs), the CPU executor's subgraph runs, fold_if, and the engine
// file's nested graphs. tests/models/run_control_flow_tests.py checks the same ops against ONNX
// Runtime on more forms.
#include <gtest/gtest.h>

#include "backends/cpu/cpu_executor.h"
#include "engine/plan_format.h"
#include "onnx/importer.h"
#include "onnx/onnx.pb.h"
#include "onnx/tensor_proto.h"
#include "ops/control_flow.h"
#include "ops/op.h"
#include "passes/pipeline.h"

namespace kiln {
namespace {

void add_io(onnx::ValueInfoProto* vi, const std::string& name, int elem,
            const std::vector<int64_t>& dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  auto* shape = tt->mutable_shape();
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out, const std::string& name) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

void add_float_init(onnx::GraphProto* g, const std::string& name, std::vector<float> v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (float f : v) t->add_float_data(f);
}

onnx::GraphProto* add_graph_attr(onnx::NodeProto* n, const std::string& name) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::GRAPH);
  a->mutable_g()->set_name(name);
  return a->mutable_g();
}

// main: x[3], c (bool scalar), w (initializer). Loop(M = 2) over a body whose If reads x (two
// levels up), w (a constant: shared, not captured) and the body's carried value.
//   then: acc + x * w      else: acc - x
std::unique_ptr<Graph> import_nested() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* os = m.add_opset_import();
  os->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("main");
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {3});
  add_io(g->add_input(), "c", onnx::TensorProto::BOOL, {});
  add_float_init(g, "w", {1.f, 2.f, 3.f});
  add_float_init(g, "acc0", {0.f, 0.f, 0.f});
  auto* trip = g->add_initializer();
  trip->set_name("M");
  trip->set_data_type(onnx::TensorProto::INT64);
  trip->add_int64_data(2);
  auto* loop = add_node(g, "Loop", {"M", "", "acc0"}, {"acc"}, "loop");
  auto* body = add_graph_attr(loop, "body");
  add_io(body->add_input(), "i", onnx::TensorProto::INT64, {});
  add_io(body->add_input(), "cond_in", onnx::TensorProto::BOOL, {});
  add_io(body->add_input(), "acc_in", onnx::TensorProto::FLOAT, {3});
  add_node(body, "Identity", {"cond_in"}, {"cond_out"}, "keep");
  auto* iff = add_node(body, "If", {"c"}, {"acc_out"}, "if");
  auto* then_g = add_graph_attr(iff, "then_branch");
  add_node(then_g, "Mul", {"x", "w"}, {"xw"}, "mul");
  add_node(then_g, "Add", {"acc_in", "xw"}, {"t"}, "add");
  add_io(then_g->add_output(), "t", onnx::TensorProto::FLOAT, {3});
  auto* else_g = add_graph_attr(iff, "else_branch");
  add_node(else_g, "Sub", {"acc_in", "x"}, {"e"}, "sub");
  add_io(else_g->add_output(), "e", onnx::TensorProto::FLOAT, {3});
  add_io(body->add_output(), "cond_out", onnx::TensorProto::BOOL, {});
  add_io(body->add_output(), "acc_out", onnx::TensorProto::FLOAT, {3});
  add_io(g->add_output(), "acc", onnx::TensorProto::FLOAT, {3});
  std::string bytes;
  m.SerializeToString(&bytes);
  auto r = import_onnx_bytes(bytes, ".", "nested.onnx");
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : nullptr;
}

std::vector<float> run_cpu(const Graph& g, bool cond) {
  auto ex = CpuExecutor::create(g);
  EXPECT_TRUE(ex.ok()) << ex.status().message();
  if (!ex.ok()) return {};
  std::vector<Tensor> ins{Tensor::from<float>({3}, {1.f, 10.f, 100.f}),
                          Tensor::scalar<bool>(cond)};
  auto out = (*ex)->run(ins);
  EXPECT_TRUE(out.ok()) << out.status().message();
  if (!out.ok()) return {};
  const Tensor& t = (*out)[0];
  return {t.data<float>(), t.data<float>() + t.numel()};
}

TEST(ControlFlow, OuterValuesBecomeCapturesAtEveryLevel) {
  auto g = import_nested();
  ASSERT_TRUE(g);
  const Node* loop = g->nodes().back();
  ASSERT_EQ(loop->op_type, "Loop");
  // The Loop captures x and c for its body (w is a constant: shared into the subgraphs).
  EXPECT_EQ(capture_count(*loop), 2);
  ASSERT_EQ(loop->num_inputs(), 5u);
  // In the order the body first reads them: the If's condition, then x in its branch.
  EXPECT_EQ(loop->input(3)->name, "c");
  EXPECT_EQ(loop->input(4)->name, "x");
  const Graph* body = loop->attrs.get_graph("body");
  ASSERT_TRUE(body);
  ASSERT_EQ(body->inputs().size(), 5u);  // i, cond_in, acc_in, then the captures
  const Node* iff = nullptr;
  for (const Node* n : body->nodes())
    if (n->op_type == "If") iff = n;
  ASSERT_TRUE(iff);
  // The If captures acc_in and x; its condition c is its own first input.
  EXPECT_EQ(capture_count(*iff), 2);
  EXPECT_EQ(iff->input(0), body->inputs()[3]);
  const Graph* then_g = iff->attrs.get_graph("then_branch");
  ASSERT_TRUE(then_g);
  EXPECT_EQ(then_g->inputs().size(), 2u);
  const Value* w = then_g->find_value("w");
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->is_constant());
  // Inference typed the outputs through both levels.
  EXPECT_EQ(g->outputs()[0]->type.str(), "float32[3]");
}

TEST(ControlFlow, CpuExecutorRunsNestedSubgraphs) {
  auto g = import_nested();
  ASSERT_TRUE(g);
  // Two iterations of acc += x * w, or of acc -= x.
  EXPECT_EQ(run_cpu(*g, true), (std::vector<float>{2.f, 40.f, 600.f}));
  EXPECT_EQ(run_cpu(*g, false), (std::vector<float>{-2.f, -20.f, -200.f}));
}

TEST(ControlFlow, EngineFileKeepsSubgraphs) {
  auto g = import_nested();
  ASSERT_TRUE(g);
  EngineMetadata meta;
  meta.backend = "cpu";
  auto bytes = serialize_plan(*g, meta);
  ASSERT_TRUE(bytes.ok()) << bytes.status().message();
  auto loaded = deserialize_plan(std::make_shared<const std::vector<uint8_t>>(std::move(*bytes)), "t.kiln");
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Graph& h = *loaded->graph;
  const Graph* body = h.nodes().back()->attrs.get_graph("body");
  ASSERT_TRUE(body);
  EXPECT_EQ(body->inputs().size(), 5u);
  EXPECT_EQ(run_cpu(h, true), (std::vector<float>{2.f, 40.f, 600.f}));
  EXPECT_EQ(run_cpu(h, false), (std::vector<float>{-2.f, -20.f, -200.f}));
}

TEST(ControlFlow, FoldIfInlinesTheTakenBranch) {
  auto g = import_nested();
  ASSERT_TRUE(g);
  // Make the condition a constant: the body's If then folds into its then-branch.
  Value* c = g->inputs()[1];
  Value* k = g->add_constant("c_true", Tensor::scalar<bool>(true));
  g->replace_all_uses(c, k);
  ASSERT_TRUE(infer_shapes(*g).ok());
  // The If sits in the body: the pass runs on the body graph itself (as optimize_subgraphs
  // runs the pipeline on it).
  Graph* body = g->nodes().back()->attrs.get_graph("body");
  ASSERT_TRUE(body);
  // The body reads the capture for c: give it the constant in the body too.
  Value* cap = body->inputs()[3];
  Value* kb = body->add_constant("c_true", Tensor::scalar<bool>(true));
  body->replace_all_uses(cap, kb);
  OptimizeOptions opts;
  opts.only_passes = {"fold_if"};
  Status st = optimize_graph(*body, opts);
  ASSERT_TRUE(st.ok()) << st.message();
  for (const Node* n : body->nodes()) EXPECT_NE(n->op_type, "If") << n->label();
  ASSERT_TRUE(infer_shapes(*g).ok());
  EXPECT_EQ(run_cpu(*g, false), (std::vector<float>{2.f, 40.f, 600.f}));
}

// The optimizer runs on the branches and bodies too (optimize_subgraphs), at any depth: the
// then-branch's Mul and Add, two levels down, become one fused layer, and the model computes
// what it did.
TEST(ControlFlow, OptimizerReachesNestedSubgraphs) {
  auto g = import_nested();
  ASSERT_TRUE(g);
  OptimizeOptions opts;
  Status st = optimize_graph(*g, opts);
  ASSERT_TRUE(st.ok()) << st.message();
  Graph* body = g->nodes().back()->attrs.get_graph("body");
  ASSERT_TRUE(body);
  const Node* iff = nullptr;
  for (const Node* n : body->nodes())
    if (n->op_type == "If") iff = n;
  ASSERT_TRUE(iff);
  const Graph* then_g = iff->attrs.get_graph("then_branch");
  ASSERT_TRUE(then_g);
  ASSERT_EQ(then_g->nodes().size(), 1u);
  EXPECT_EQ(then_g->nodes()[0]->domain, "kiln") << then_g->nodes()[0]->label();
  EXPECT_EQ(run_cpu(*g, true), (std::vector<float>{2.f, 40.f, 600.f}));
  EXPECT_EQ(run_cpu(*g, false), (std::vector<float>{-2.f, -20.f, -200.f}));
}

// main: x[3], c (bool). If(c){ Reshape(x, [2, 2]) }{ Neg(x) } (AffineGrid's function: a branch
// that cannot run at these shapes, its condition unknown until it folds). Also the then branch's
// Reshape in both branches when `both_broken`.
Expected<std::unique_ptr<Graph>> import_if_with_broken_branch(bool both_broken) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("main");
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {3});
  add_io(g->add_input(), "c", onnx::TensorProto::BOOL, {});
  auto* shape = g->add_initializer();
  shape->set_name("s");
  shape->set_data_type(onnx::TensorProto::INT64);
  shape->add_dims(2);
  shape->add_int64_data(2);
  shape->add_int64_data(2);
  auto* iff = add_node(g, "If", {"c"}, {"y"}, "if");
  auto* then_g = add_graph_attr(iff, "then_branch");
  add_node(then_g, "Reshape", {"x", "s"}, {"t"}, "square");
  add_io(then_g->add_output(), "t", onnx::TensorProto::FLOAT, {});
  auto* else_g = add_graph_attr(iff, "else_branch");
  if (both_broken)
    add_node(else_g, "Reshape", {"x", "s"}, {"e"}, "square_too");
  else
    add_node(else_g, "Neg", {"x"}, {"e"}, "neg");
  add_io(else_g->add_output(), "e", onnx::TensorProto::FLOAT, {});
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {});
  std::string bytes;
  m.SerializeToString(&bytes);
  return import_onnx_bytes(bytes, ".", "broken_branch.onnx");
}

// A branch that cannot run at the inputs' shapes is not an error until it is taken; both such
// branches are one at import.
TEST(ControlFlow, ABranchThatCannotRunIsAnErrorOnlyWhenTaken) {
  auto g = import_if_with_broken_branch(false);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_EQ((*g)->outputs()[0]->type.str(), "float32[3]");  // the else branch's
  auto ex = CpuExecutor::create(**g);
  ASSERT_TRUE(ex.ok()) << ex.status().message();
  const Tensor x = Tensor::from<float>({3}, {1.f, 2.f, 3.f});
  auto taken_else = (*ex)->run({x, Tensor::scalar<bool>(false)});
  ASSERT_TRUE(taken_else.ok()) << taken_else.status().message();
  EXPECT_EQ((*taken_else)[0].data<float>()[2], -3.f);
  auto taken_then = (*ex)->run({x, Tensor::scalar<bool>(true)});
  ASSERT_FALSE(taken_then.ok());
  EXPECT_NE(taken_then.status().message().find("square"), std::string::npos)
      << taken_then.status().message();
  // The optimizer leaves the branch that cannot run as it is and optimizes the rest.
  auto opt = (*g)->clone();
  Status st = optimize_graph(*opt, OptimizeOptions{});
  ASSERT_TRUE(st.ok()) << st.message();
  auto ex2 = CpuExecutor::create(*opt);
  ASSERT_TRUE(ex2.ok()) << ex2.status().message();
  auto opt_else = (*ex2)->run({x, Tensor::scalar<bool>(false)});
  ASSERT_TRUE(opt_else.ok()) << opt_else.status().message();
  EXPECT_EQ((*opt_else)[0].data<float>()[2], -3.f);
  EXPECT_FALSE((*ex2)->run({x, Tensor::scalar<bool>(true)}).ok());
  auto both = import_if_with_broken_branch(true);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("Reshape"), std::string::npos) << both.status().message();
}

}  // namespace
}  // namespace kiln
