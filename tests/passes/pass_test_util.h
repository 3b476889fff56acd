// Helpers for optimizer pass tests: build graphs in code, run passes, and compare the CPU
// backend's outputs before and after on random inputs.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backends/cpu/cpu_executor.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

namespace kiln::test {

inline Tensor rand_t(std::vector<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

inline Tensor scalar_f(float v) { return Tensor::scalar<float>(v); }
inline Tensor ints(std::vector<int64_t> v) {
  return Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
}

// A small graph builder: every op gets a fresh output name.
struct G {
  Graph g;
  int counter = 0;
  Value* in(const std::string& name, std::vector<int64_t> shape) {
    Value* v = g.add_value(name, TensorType(DataType::kFloat32, {shape.begin(), shape.end()}));
    g.add_input(v);
    return v;
  }
  Value* c(Tensor t) { return g.add_constant("c" + std::to_string(counter++), std::move(t)); }
  Value* cf(float v) { return c(scalar_f(v)); }
  Node* node(const std::string& op, std::vector<Value*> ins, Attributes a = {}, size_t nout = 1) {
    std::vector<std::string> outs;
    for (size_t i = 0; i < nout; ++i) outs.push_back("t" + std::to_string(counter++));
    Node* n = g.add_node(op, op + "_" + std::to_string(counter++), ins, outs);
    n->attrs = std::move(a);
    n->onnx_nodes = {n->name};
    return n;
  }
  Value* op(const std::string& op, std::vector<Value*> ins, Attributes a = {}) {
    return node(op, std::move(ins), std::move(a))->output(0);
  }
  void out(Value* v) { g.add_output(v); }
};

inline Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

// A kiln.MultiHeadAttention node (scale 0.5) on q, k, v and an optional additive mask, its
// output a graph output.
inline Node* add_mha(G& b, Value* q, Value* k, Value* v, Value* mask, int64_t heads) {
  Node* n = b.g.add_node("MultiHeadAttention", "mha", {q, k, v, mask}, {"y"}, "kiln");
  n->attrs.set("num_heads", Attribute::Int(heads));
  n->attrs.set("scale", Attribute::Float(0.5f));
  n->onnx_nodes = {n->name};
  b.out(n->output(0));
  return n;
}

// Runs one pass once on g (shapes inferred first; verbose, so its notes are kept): the notes,
// and in *changed whether it rewrote g.
inline std::set<std::string> pass_notes(Graph& g, const std::string& name,
                                        Expected<bool> (*pass)(passes::PassContext&),
                                        bool* changed, OptimizeOptions o = {}) {
  o.verbose = true;
  EXPECT_TRUE(infer_shapes(g).ok());
  passes::PassContext ctx{g, o, name, {}, 0};
  auto r = pass(ctx);
  EXPECT_TRUE(r.ok()) << r.status().message();
  *changed = r.ok() && *r;
  return ctx.notes;
}
inline bool has_note(const std::set<std::string>& notes, const std::string& text) {
  for (const std::string& n : notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}
inline std::string dump_notes(const std::set<std::string>& notes) {
  std::string s;
  for (const std::string& n : notes) s += n + "\n";
  return s;
}
// The first kiln-domain node of this type, or nullptr.
inline const Node* find_kiln(const Graph& g, const std::string& op) {
  for (const Node* n : g.nodes())
    if (n->op_type == op && n->domain == "kiln") return n;
  return nullptr;
}

// The first node of this type, or nullptr.
inline const Node* find_op(const Graph& g, const std::string& op_type) {
  for (const Node* n : g.nodes())
    if (n->op_type == op_type) return n;
  return nullptr;
}

inline int count(const Graph& g, const std::string& op_type) {
  int n = 0;
  for (const Node* x : g.nodes()) n += x->op_type == op_type;
  return n;
}

inline std::vector<Tensor> random_inputs(const Graph& g) {
  std::vector<Tensor> ins;
  for (const Value* v : g.inputs()) {
    Tensor t = rand_t(*v->type.static_shape());
    ins.push_back(v->type.dtype == DataType::kFloat32 ? std::move(t) : t.cast(v->type.dtype));
  }
  return ins;
}

inline std::vector<Tensor> run_cpu(const Graph& g, const std::vector<Tensor>& ins) {
  auto ex = CpuExecutor::create(g);
  EXPECT_TRUE(ex.ok()) << ex.status().message();
  if (!ex.ok()) return {};
  auto r = (*ex)->run(ins);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::vector<Tensor>{};
}

inline double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = a.at_double(i) - b.at_double(i);
    num += d * d;
    den += b.at_double(i) * b.at_double(i);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline OptimizeOptions only(std::vector<std::string> passes, bool verbose = false) {
  OptimizeOptions o;
  o.only_passes = std::move(passes);
  o.verbose = verbose;
  return o;
}

// Runs `passes` to their fixed point on a copy of g, checks that a second run changes nothing
// (idempotence) and that outputs match the original on random inputs. Returns the result.
// The CPU backend's outputs of two graphs on the same random inputs agree (relative L2).
inline void expect_same_outputs(const Graph& g, const Graph& opt, double tol = 1e-6) {
  const auto ins = random_inputs(g);
  const auto a = run_cpu(g, ins), b = run_cpu(opt, ins);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(rel_l2(b[i], a[i]), tol) << "output " << i;
}

inline std::unique_ptr<Graph> optimize_checked(const Graph& g, std::vector<std::string> passes,
                                               double tol = 1e-5) {
  auto opt = g.clone();
  const OptimizeOptions o = only(passes);
  Status st = optimize_graph(*opt, o);
  EXPECT_TRUE(st.ok()) << st.message();
  const std::string once = graph_to_text(*opt);
  for (const std::string& p : passes) {
    auto changed = run_pass(*opt, p, o);
    EXPECT_TRUE(changed.ok()) << changed.status().message();
    EXPECT_FALSE(changed.ok() && *changed) << p << " changed the graph on a second run";
  }
  EXPECT_EQ(once, graph_to_text(*opt)) << "not idempotent";
  const auto ins = random_inputs(g);
  const auto before = run_cpu(g, ins);
  const auto after = run_cpu(*opt, ins);
  EXPECT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    EXPECT_EQ(before[i].shape(), after[i].shape());
    if (before[i].shape() == after[i].shape()) {
      EXPECT_LT(rel_l2(after[i], before[i]), tol) << "output " << i;
    }
  }
  return opt;
}

}  // namespace kiln::test
