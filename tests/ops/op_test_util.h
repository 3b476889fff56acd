// Helpers for op tests: run one node through shape inference and the CPU reference kernel.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"

namespace kiln::test {

struct OpRun {
  Status status;                    // first error (inference or kernel)
  std::vector<Tensor> outputs;      // kernel outputs
  std::vector<TensorType> inferred; // inferred output types (inputs given as non-constants)
};

// Builds a one-node graph (inputs listed as graph inputs; `const_inputs` marks which of them are
// constants instead), runs shape inference and the CPU kernel. nullptr input = omitted optional.
inline OpRun run_op(const std::string& op_type, const std::vector<const Tensor*>& inputs,
                    const Attributes& attrs, size_t num_outputs = 1,
                    std::vector<bool> const_inputs = {}, const std::string& domain = "") {
  OpRun r;
  Graph g;
  std::vector<Value*> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) { ins.push_back(nullptr); continue; }
    const bool c = i < const_inputs.size() && const_inputs[i];
    Value* v = c ? g.add_constant("in" + std::to_string(i), *inputs[i])
                 : g.add_value("in" + std::to_string(i), TensorType::of(*inputs[i]));
    if (!c) g.add_input(v);
    ins.push_back(v);
  }
  std::vector<std::string> outs;
  for (size_t i = 0; i < num_outputs; ++i) outs.push_back("out" + std::to_string(i));
  Node* n = g.add_node(op_type, "n0", ins, outs, domain);
  n->attrs = attrs;
  const OpDef* def = find_op(domain, op_type);
  if (!def) { r.status = Status::Error("unknown op " + op_type); return r; }
  r.inferred.resize(num_outputs);
  if (def->infer) {
    InferContext ictx(*n, r.inferred);
    r.status = def->infer(ictx);
    if (!r.status.ok()) return r;
  }
  r.outputs.resize(num_outputs);
  KernelContext kctx(*n, inputs, r.outputs);
  r.status = def->cpu ? def->cpu(kctx) : Status::Error("no cpu kernel");
  return r;
}

// Random float tensor with fresh seed per call (never zeros).
inline Tensor random_tensor(std::vector<int64_t> shape, float lo = -1.f, float hi = 1.f) {
  static std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(lo, hi);
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(rng);
  return t;
}

inline std::vector<float> values_f(const Tensor& t) {
  std::vector<float> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<float>(t.at_double(i)));
  return v;
}

// Checks that the inferred type matches the kernel output's dtype and (where known) dims.
inline void expect_inferred_matches(const OpRun& r) {
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const TensorType& t = r.inferred[i];
    if (r.outputs[i].empty_storage()) continue;
    EXPECT_EQ(t.dtype, r.outputs[i].dtype()) << "output " << i;
    if (!t.dims) continue;
    ASSERT_EQ(t.dims->size(), r.outputs[i].shape().size()) << "output " << i;
    for (size_t k = 0; k < t.dims->size(); ++k)
      if ((*t.dims)[k].is_static()) EXPECT_EQ((*t.dims)[k].value, r.outputs[i].shape()[k]);
  }
}

}  // namespace kiln::test
