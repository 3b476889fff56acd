// The cuda backend's dynamic region on the host (no GPU): lowering plans control flow with a plan
// per subgraph and data-dependent layers untimed, the plan's JSON keeps both, and a static graph
// stays without a dynamic region; the prefix (the layers before any size the data decides) is
// known from the plan and recorded for kiln inspect.
#include <gtest/gtest.h>

#include "dynamic.h"
#include "lower.h"
#include "onnx/importer.h"
#include "onnx/onnx.pb.h"
#include "plan.h"

namespace kiln::gpu {
namespace {

void add_io(onnx::ValueInfoProto* vi, const std::string& name, int elem, std::vector<int64_t> dims) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elem);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, std::vector<std::string> in,
                          std::vector<std::string> out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(op + "_" + std::to_string(g->node_size()));
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

// x [64, 32] -> NonZero(x) -> If(ReduceSum(x) > 0) { then: Relu(x) } { else: Neg(x) }
std::unique_ptr<Graph> dynamic_model() {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("dyn");
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {64, 32});
  add_node(g, "NonZero", {"x"}, {"nz"});
  auto* sum = add_node(g, "ReduceSum", {"x"}, {"s"});
  auto* keep = sum->add_attribute();
  keep->set_name("keepdims");
  keep->set_type(onnx::AttributeProto::INT);
  keep->set_i(0);
  auto* zero = g->add_initializer();
  zero->set_name("zero");
  zero->set_data_type(onnx::TensorProto::FLOAT);
  zero->add_float_data(0.f);
  add_node(g, "Greater", {"s", "zero"}, {"c"});
  auto* iff = add_node(g, "If", {"c"}, {"y"});
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto* a = iff->add_attribute();
    a->set_name(branch);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* b = a->mutable_g();
    b->set_name(branch);
    add_node(b, std::string(branch) == "then_branch" ? "Relu" : "Neg", {"x"}, {"r"});
    add_io(b->add_output(), "r", onnx::TensorProto::FLOAT, {64, 32});
  }
  add_io(g->add_output(), "nz", onnx::TensorProto::INT64, {});
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {64, 32});
  std::string bytes;
  m.SerializeToString(&bytes);
  auto r = import_onnx_bytes(bytes, ".", "dyn.onnx");
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : nullptr;
}

GpuBuildOptions untuned(bool fp16) {
  GpuBuildOptions o;
  o.tune = false;
  o.fp16 = fp16;
  return o;
}

TEST(DynamicHost, ControlFlowAndDataDependentLayersArePlanned) {
  for (bool fp16 : {false, true}) {
    auto g = dynamic_model();
    ASSERT_TRUE(g);
    auto plan = lower_for_gpu(*g, {{64, 32}}, untuned(fp16));
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    bool saw_if = false, saw_nonzero = false;
    for (size_t k = 0; k < g->nodes().size(); ++k) {
      const Node* n = g->nodes()[k];
      const LayerChoice& c = plan->layers[k];
      if (n->op_type == "If") {
        saw_if = true;
        EXPECT_EQ(c.tactic->name, "control.if");
        ASSERT_EQ(c.subplans.size(), 2u);
        for (const auto& [name, sub] : c.subplans) {
          const Graph* sg = n->attrs.get_graph(name);
          ASSERT_TRUE(sg);
          EXPECT_EQ(sub->layers.size(), sg->nodes().size());
        }
        EXPECT_TRUE(c.dynamic);
      }
      if (n->op_type == "NonZero") {
        saw_nonzero = true;
        EXPECT_EQ(c.tactic->name, "data.nonzero");  // 2048 values: not a host node
        EXPECT_TRUE(c.tactic->caps & kDataDependent);
        EXPECT_TRUE(c.dynamic);
      }
    }
    EXPECT_TRUE(saw_if && saw_nonzero);
    // The engine's copy of the plan keeps the subgraphs' plans and the region.
    const nlohmann::json j = plan_to_json(*plan, *g);
    EXPECT_TRUE(j.value("dynamic_region", false));
    auto back = plan_from_json(*g, j);
    ASSERT_TRUE(back.ok()) << back.status().message();
    for (size_t k = 0; k < g->nodes().size(); ++k) {
      EXPECT_EQ(back->layers[k].subplans.size(), plan->layers[k].subplans.size());
      EXPECT_EQ(back->layers[k].dynamic, plan->layers[k].dynamic);
    }
  }
}

// The prefix: ReduceSum reads the graph input on the device and Greater reads ReduceSum's output,
// before any size the data decides; NonZero decides one and If is control flow.
TEST(DynamicHost, ThePrefixHoldsTheLayersBeforeTheDataDecides) {
  auto g = dynamic_model();
  ASSERT_TRUE(g);
  auto plan = lower_for_gpu(*g, {{64, 32}}, untuned(false));  // float32: x read as it comes
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::vector<bool> prefix = prefix_layers(*g, *plan);
  ASSERT_EQ(prefix.size(), g->nodes().size());
  for (size_t k = 0; k < prefix.size(); ++k) {
    const std::string& op = g->nodes()[k]->op_type;
    if (op == "NonZero" || op == "If") {
      EXPECT_FALSE(prefix[k]) << op;
    }
    if (op == "ReduceSum") {
      EXPECT_TRUE(prefix[k]) << op;
    }
  }
  // A host layer that reads the graph input's values (not its shape) keeps every layer out: the
  // prefix's work would then depend on the data.
  Plan host = *plan;
  for (size_t k = 0; k < host.layers.size(); ++k)
    if (g->nodes()[k]->op_type == "ReduceSum") {
      host.layers[k].tactic = nullptr;  // on the host, its input read there
      for (TensorFormat& f : host.layers[k].in) f = TensorFormat{};
    }
  const std::vector<bool> none = prefix_layers(*g, host);
  for (size_t k = 0; k < none.size(); ++k) EXPECT_FALSE(none[k]) << g->nodes()[k]->op_type;
}

TEST(DynamicHost, APlanOfASubgraphItLacksIsRefused) {
  auto g = dynamic_model();
  ASSERT_TRUE(g);
  auto plan = lower_for_gpu(*g, {{64, 32}}, untuned(false));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  nlohmann::json j = plan_to_json(*plan, *g);
  for (auto& r : j["layers"])
    if (r.contains("subplans")) r["subplans"].erase("else_branch");
  auto back = plan_from_json(*g, j);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("a subgraph has no plan"), std::string::npos)
      << back.status().message();
}

TEST(DynamicHost, AStaticGraphHasNoDynamicRegion) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("static");
  add_io(g->add_input(), "x", onnx::TensorProto::FLOAT, {4, 8});
  add_node(g, "Relu", {"x"}, {"y"});
  add_io(g->add_output(), "y", onnx::TensorProto::FLOAT, {4, 8});
  std::string bytes;
  m.SerializeToString(&bytes);
  auto graph = import_onnx_bytes(bytes, ".", "static.onnx");
  ASSERT_TRUE(graph.ok());
  auto plan = lower_for_gpu(**graph, {{4, 8}}, untuned(false));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const nlohmann::json j = plan_to_json(*plan, **graph);
  EXPECT_FALSE(j.contains("dynamic_region"));
  for (const LayerChoice& c : plan->layers) EXPECT_FALSE(c.dynamic);
}

}  // namespace
}  // namespace kiln::gpu
