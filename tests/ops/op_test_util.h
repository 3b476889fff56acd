// Helpers for op tests: run one node (optionally imported at an old opset) through shape
// inference and the CPU reference kernel; build attributes and tensors; check values.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ops/op.h"

namespace kiln::test {

struct OpRun {
  Status status;                    // first error (inference or kernel)
  std::vector<Tensor> outputs;      // kernel outputs
  std::vector<TensorType> inferred; // inferred output types (inputs given as non-constants)
  std::string op_type;              // run_imported: the node's op type after the upgrade
};

// --- attributes -------------------------------------------------------------------------------
inline Attributes attrs(std::initializer_list<std::pair<std::string, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}
inline Attribute Int(int64_t v) { return Attribute::Int(v); }
inline Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }
inline Attribute Str(std::string v) { return Attribute::String(std::move(v)); }

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

// Imports a one-node graph at `opset`: runs the op's upgrade (which may rewrite the op type or
// add constant inputs; the OpDef is looked up again after it), then inference and the CPU kernel
// on the node's inputs. nullptr input = omitted optional; `const_inputs` marks constants. The
// first `used_outputs` outputs are graph outputs (as a consumer would use them).
inline OpRun run_imported(const std::string& op_type, const std::vector<const Tensor*>& inputs,
                          const Attributes& attrs, int opset, size_t num_outputs = 1,
                          std::vector<bool> const_inputs = {}, size_t used_outputs = 1) {
  OpRun r;
  Graph g;
  std::vector<Value*> ins;
  std::map<const Value*, const Tensor*> feed;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) {
      ins.push_back(nullptr);
      continue;
    }
    const bool c = i < const_inputs.size() && const_inputs[i];
    Value* v = c ? g.add_constant("in" + std::to_string(i), *inputs[i])
                 : g.add_value("in" + std::to_string(i), TensorType::of(*inputs[i]));
    if (!c) g.add_input(v);
    feed[v] = inputs[i];
    ins.push_back(v);
  }
  std::vector<std::string> outs;
  for (size_t i = 0; i < num_outputs; ++i) outs.push_back("out" + std::to_string(i));
  Node* n = g.add_node(op_type, "n0", ins, outs);
  for (size_t i = 0; i < std::min(used_outputs, num_outputs); ++i) g.add_output(n->output(i));
  n->attrs = attrs;
  const OpDef* def = find_op("", op_type);
  if (!def) {
    r.status = Status::Error("unknown op " + op_type);
    return r;
  }
  if (def->upgrade) {
    ImportContext ictx(g, *n, opset);
    r.status = def->upgrade(ictx);
    if (!r.status.ok()) return r;
  }
  r.op_type = n->op_type;
  def = find_op("", n->op_type);
  if (!def) {
    r.status = Status::Error("unknown op " + n->op_type);
    return r;
  }
  r.inferred.resize(num_outputs);
  if (def->infer) {
    InferContext ictx(*n, r.inferred);
    r.status = def->infer(ictx);
    if (!r.status.ok()) return r;
  }
  std::vector<const Tensor*> kin;
  for (size_t i = 0; i < n->num_inputs(); ++i) {
    const Value* v = n->input(i);
    kin.push_back(!v ? nullptr : v->constant ? v->constant.get() : feed[v]);
  }
  r.outputs.resize(num_outputs);
  KernelContext kctx(*n, kin, r.outputs);
  r.status = def->cpu ? def->cpu(kctx) : Status::Error("no cpu kernel");
  return r;
}

// A typed input for inference only: a (possibly symbolic) type, or a tensor that becomes a
// constant.
struct TIn {
  TensorType type;
  std::optional<Tensor> value;
  TIn(TensorType t) : type(std::move(t)) {}                        // NOLINT
  TIn(Tensor t) : type(TensorType::of(t)), value(std::move(t)) {}  // NOLINT
};

// Runs only shape/type inference of one node on typed inputs.
inline Expected<std::vector<TensorType>> infer(const std::string& op_type,
                                               const std::vector<TIn>& ins, const Attributes& a,
                                               size_t num_outputs = 1) {
  Graph g;
  std::vector<Value*> vs;
  for (size_t i = 0; i < ins.size(); ++i)
    vs.push_back(ins[i].value ? g.add_constant("c" + std::to_string(i), *ins[i].value)
                              : g.add_value("v" + std::to_string(i), ins[i].type));
  std::vector<std::string> outs;
  for (size_t i = 0; i < num_outputs; ++i) outs.push_back("o" + std::to_string(i));
  Node* n = g.add_node(op_type, "n0", vs, outs);
  n->attrs = a;
  std::vector<TensorType> types(num_outputs);
  InferContext ctx(*n, types);
  KILN_RETURN_IF_ERROR(find_op("", op_type)->infer(ctx));
  return types;
}

// --- tensors ----------------------------------------------------------------------------------
inline Tensor F32(std::vector<int64_t> shape, std::vector<float> v) {
  return Tensor::from<float>(std::move(shape), v);
}
inline Tensor I64(std::vector<int64_t> shape, std::vector<int64_t> v) {
  return Tensor::from<int64_t>(std::move(shape), v);
}
// 1-D int64 tensor of `v` (shapes, axes, indices).
inline Tensor I64v(std::vector<int64_t> v) { return I64({static_cast<int64_t>(v.size())}, v); }

// float32 0, 1, 2, ... in row-major order.
inline Tensor iota_f(std::vector<int64_t> shape) {
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = static_cast<float>(i);
  return t;
}

// Deterministic float32 values ((i*7 % mod) - 5) * 0.25, as in the onnx.reference literal
// generator used for the conv and pool expectations.
inline Tensor pattern(std::vector<int64_t> shape, int mod = 11) {
  Tensor t(DataType::kFloat32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>((i * 7 % mod) - 5) * 0.25f;
  return t;
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

inline std::vector<double> values_d(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.at_double(i));
  return v;
}

inline std::vector<int64_t> values_i64(const Tensor& t) { return t.to_int64_vector(); }

// --- checks -----------------------------------------------------------------------------------
// Element-wise in double: |got - want| <= atol + rtol * max(floor, |want|). A NaN wanted must be
// NaN, an infinity wanted must be that infinity.
inline void expect_values_within(const Tensor& t, const std::vector<double>& want, double rtol,
                                 double atol, double floor) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << t.desc();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double got = t.at_double(i), w = want[i];
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(got)) << "element " << i << " got " << got;
    } else if (std::isinf(w)) {
      EXPECT_EQ(got, w) << "element " << i;
    } else {
      EXPECT_NEAR(got, w, atol + rtol * std::max(floor, std::fabs(w))) << "element " << i;
    }
  }
}

// numpy.isclose's rule: |got - want| <= atol + rtol * |want| (rtol = 0: absolute only). The
// defaults suit float32 arithmetic.
inline void expect_values(const Tensor& t, const std::vector<double>& want, double rtol = 1e-5,
                          double atol = 1e-5) {
  expect_values_within(t, want, rtol, atol, 0.0);
}

// Relative above 1, absolute below: |got - want| <= tol * max(1, |want|).
inline void expect_values_scaled(const Tensor& t, const std::vector<double>& want,
                                 double tol = 1e-6) {
  expect_values_within(t, want, tol, 0.0, 1.0);
}

inline void expect_error(const OpRun& r, const std::string& fragment) {
  ASSERT_FALSE(r.status.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_NE(r.status.message().find(fragment), std::string::npos) << r.status.message();
}

// Checks that the inferred type matches the kernel output's dtype and (where known) dims.
inline void expect_inferred_matches(const OpRun& r) {
  for (size_t i = 0; i < r.outputs.size(); ++i) {
    const TensorType& t = r.inferred[i];
    if (r.outputs[i].empty_storage()) continue;
    EXPECT_EQ(t.dtype, r.outputs[i].dtype()) << "output " << i;
    if (!t.dims) continue;
    ASSERT_EQ(t.dims->size(), r.outputs[i].shape().size()) << "output " << i;
    for (size_t k = 0; k < t.dims->size(); ++k) {
      if ((*t.dims)[k].is_static()) {
        EXPECT_EQ((*t.dims)[k].value, r.outputs[i].shape()[k]);
      }
    }
  }
}

// Tolerances per float type for expect_unary_formula.
struct FloatTolerances {
  double f64, f32, f16, bf16;
};

// Runs a one-input op on `x32` cast to each float type and compares with `fn` evaluated in double
// on the cast input, within tol * max(1, |want|) for that type.
inline void expect_unary_formula(const std::string& op_type, const Tensor& x32,
                                 const Attributes& attrs, const std::function<double(double)>& fn,
                                 FloatTolerances tol) {
  for (DataType dt :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor x = x32.cast(dt);
    OpRun r = run_op(op_type, {&x}, attrs);
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    std::vector<double> want;
    for (int64_t i = 0; i < x.numel(); ++i) want.push_back(fn(x.at_double(i)));
    const double t = dt == DataType::kFloat64   ? tol.f64
                     : dt == DataType::kFloat32 ? tol.f32
                     : dt == DataType::kFloat16 ? tol.f16
                                                : tol.bf16;
    expect_values_scaled(r.outputs[0], want, t);
  }
}

// Opset-1 models carry `consumed_inputs`: imports one node of each op at opset 1 and checks that
// its upgrade drops the attribute.
inline void expect_consumed_inputs_dropped(std::initializer_list<const char*> ops) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim(2)}));
  for (const char* op : ops) {
    Node* n = g.add_node(op, std::string("n_") + op, {x}, {std::string("y_") + op});
    n->attrs.set("consumed_inputs", Attribute::Ints({0}));
    ImportContext ctx(g, *n, 1);
    const OpDef* def = find_op("", op);
    ASSERT_TRUE(def && def->upgrade) << op;
    ASSERT_TRUE(def->upgrade(ctx).ok());
    EXPECT_FALSE(n->attrs.has("consumed_inputs")) << op;
  }
}

}  // namespace kiln::test
