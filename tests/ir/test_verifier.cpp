#include <gtest/gtest.h>

#include "ir/graph.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

TensorType f32(std::vector<Dim> d) { return TensorType(DataType::kFloat32, std::move(d)); }

// x -> q(QuantizeLinear) -> d(DequantizeLinear) -> y
struct Small {
  Graph g;
  Value *x, *scale, *zp;
  Node *q, *d;
  Small() {
    g.name = "small";
    x = g.add_value("x", f32({2, 3}));
    g.add_input(x);
    scale = g.add_constant("scale", Tensor::scalar<float>(0.5f));
    zp = g.add_constant("zp", Tensor::scalar<uint8_t>(3));
    q = g.add_node("QuantizeLinear", "q", {x, scale, zp}, {"xq"});
    d = g.add_node("DequantizeLinear", "d", {q->output(0), scale, zp}, {"y"});
    g.add_output(d->output(0));
  }
};

void expect_error(const Graph& g, const std::vector<std::string>& fragments) {
  Status st = verify_graph(g);
  ASSERT_FALSE(st.ok()) << "graph verified but should not have";
  for (const auto& f : fragments)
    EXPECT_NE(st.message().find(f), std::string::npos)
        << "missing '" << f << "' in: " << st.message();
}

TEST(Verifier, AcceptsWellFormedGraphs) {
  Small s;
  EXPECT_TRUE(verify_graph(s.g).ok()) << verify_graph(s.g).message();
  // Omitted optional inputs, constants and inputs as graph outputs are fine.
  s.g.set_input(s.d, 2, nullptr);
  s.g.add_output(s.x);
  s.g.add_output(s.scale);
  EXPECT_TRUE(verify_graph(s.g).ok()) << verify_graph(s.g).message();
  Graph empty;
  EXPECT_TRUE(verify_graph(empty).ok());
}

TEST(Verifier, UseBeforeDefinition) {
  Graph g;
  Value* x = g.add_value("x", f32({4}));
  g.add_input(x);
  Value* later = g.add_value("later", f32({4}));
  g.add_node("ReduceSum", "early", {later}, {"y"});
  Node* p = g.add_node("ReduceMax", "producer", {x}, {});
  g.set_node_output(p, 0, later);
  g.add_output(g.find_value("y"));
  expect_error(
      g, {"node 'early' (ReduceSum, #0)", "'later'", "before it is defined", "node 'producer'"});
  ASSERT_TRUE(g.topo_sort().ok());
  EXPECT_TRUE(verify_graph(g).ok()) << verify_graph(g).message();
}

TEST(Verifier, InputWithoutProducer) {
  Small s;
  Value* ghost = s.g.add_value("ghost", f32({1}));
  s.g.set_input(s.d, 1, ghost);
  expect_error(s.g, {"node 'd'", "'ghost'", "no producer"});
}

TEST(Verifier, DanglingGraphOutput) {
  Small s;
  s.g.add_output(s.g.add_value("nowhere", f32({1})));
  expect_error(s.g, {"graph output 'nowhere' is dangling"});
  // The output of a force-removed node dangles as well.
  Small t;
  t.g.set_output(0, t.q->output(0));
  ASSERT_TRUE(t.g.remove_node(t.q, true).ok());
  ASSERT_TRUE(t.g.remove_node(t.d, true).ok());
  expect_error(t.g, {"'xq' is dangling"});
}

TEST(Verifier, DuplicateValueNames) {
  Small s;
  // A node output named like the graph input: add_node creates a second value "x".
  s.g.add_node("ReduceSum", "dup", {s.d->output(0)}, {"x"});
  expect_error(s.g, {"value name 'x' is used by 2 values"});
}

TEST(Verifier, DuplicateNodeNames) {
  Small s;
  s.g.add_node("ReduceSum", "q", {s.d->output(0)}, {"z"});
  expect_error(s.g, {"node name 'q' is used by 2 nodes"});
}

TEST(Verifier, UnknownOpsAreAllListed) {
  Small s;
  s.g.add_node("FancyOp", "f1", {s.x}, {"a"});
  s.g.add_node("Other", "f2", {s.x}, {"b"}, "com.example");
  expect_error(s.g, {"unknown ops", "FancyOp (node 'f1'", "com.example.Other (node 'f2'"});
}

TEST(Verifier, ValueProducedTwice) {
  Small s;
  Node* other = s.g.add_node("ReduceSum", "other", {s.x}, {"tmp"});
  // Make `other` claim xq as its output too (bypassing set_node_output's producer update).
  s.g.set_node_output(other, 0, s.q->output(0));
  expect_error(s.g, {"'xq' is an output of both node 'q'", "node 'other'"});
}

TEST(Verifier, ProducerDisagreesWithOutputs) {
  Small s;
  // q's output list no longer names xq, but xq still names q as producer.
  Value* fresh = s.g.add_value("fresh", f32({2, 3}));
  s.g.set_node_output(s.q, 0, fresh);
  Value* xq = s.g.find_value("xq");
  xq->producer = s.q;
  xq->producer_index = 0;  // a stale producer link, as a buggy rewriter would leave it
  expect_error(s.g, {"'xq' claims to be output 0 of node 'q'"});
}

TEST(Verifier, GraphInputWithProducer) {
  Small s;
  s.g.add_input(s.q->output(0));
  expect_error(s.g, {"graph input 'xq' is produced by node 'q'"});
}

// Graph keeps use lists right; break them by hand the way a buggy rewriter would.
std::vector<std::pair<Node*, int>>& uses_of(Value* v) {
  return const_cast<std::vector<std::pair<Node*, int>>&>(v->uses());
}

TEST(Verifier, UseListsMustMatchInputs) {
  Small s;
  uses_of(s.x).push_back({s.d, 0});  // d's input 0 is xq, not x
  expect_error(s.g, {"value 'x' lists a use as input 0 of node 'd'", "reads something else"});
  Small t;
  uses_of(t.scale).clear();
  expect_error(t.g, {"node 'q'", "input 1 'scale' appears 0 times"});
  Small u;
  uses_of(u.zp).push_back({u.q, 2});  // listed twice
  expect_error(u.g, {"input 2 'zp' appears 2 times"});
}

TEST(Verifier, StaleIndex) {
  Small s;
  s.d->index = 7;
  expect_error(s.g, {"sits at position 1", "renumber"});
}

TEST(Verifier, ErrorListIsCapped) {
  Graph g;
  for (int i = 0; i < 15; ++i) g.add_output(g.add_value("o" + std::to_string(i), f32({1})));
  Status st = verify_graph(g);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("and 5 more problems"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("graph '' is malformed"), std::string::npos);
}

}  // namespace
}  // namespace kiln
