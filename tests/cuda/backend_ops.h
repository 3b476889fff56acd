// test-backend-ops: every GPU layer is checked against the CPU reference backend. A case is a
// one-node graph (op, attributes, inputs); the harness builds it for the cuda backend at each
// listed mode, runs both backends on the same random inputs and compares every output.
//
// Each tactic family lists its cases in tests/cuda/cases_<family>.cpp; test_backend_ops.cpp
// joins them. Tolerances (relative L2 over the output, NaN/Inf must match): fp32 (strict FP32,
// --no-tf32) 1e-5, tf32 1e-3, fp16 1e-2, unless a case says otherwise; integer and bool
// outputs must be exact, float8 and int4/uint4 outputs bit for bit.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kiln/tensor.h"

namespace kiln::gpu::test {

struct CaseInput {
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  bool constant = false;          // an initializer of the graph (weights, axes, shapes, ...)
  std::optional<Tensor> value;    // fixed value (indices, axes, ...); else random in [lo, hi]
  double lo = -1, hi = 1;         // integers: uniform integers in [lo, hi]; bool: random bits
  double step = 0;                // > 0: random floats rounded to multiples of it (values that
                                  // float16 stores exactly: coordinates whose rounding would
                                  // move a sample, not just perturb a value)
  bool absent = false;            // an omitted optional input ("" in ONNX)
};

struct OpCase {
  std::string name;               // unique within the family, [A-Za-z0-9_]
  std::string op_type;
  std::string domain;             // "" (ai.onnx) or "kiln"
  Attributes attrs;
  std::vector<CaseInput> inputs;
  int num_outputs = 1;
  // Modes to build: "fp32" (strict), "tf32", "fp16", "nhwc16" (fp16 with NHWC preferred for
  // 4-D tensors), "nhwc32" (tf32 with NHWC preferred: float32 NHWC kernels). Float64/integer
  // cases use "fp32" only.
  std::vector<std::string> modes = {"fp32", "fp16"};
  double tolerance = 0;           // relative L2 override for float outputs (0: per-mode default)
  // The engine's workspace limit in bytes (--mem-pool-size workspace:N; 0: the default, 1 GiB):
  // small limits make the attention layers run their scores in chunks (the *_chunked cases).
  size_t workspace_limit = 0;
  // INT8 layers (int8 = 1, cases_int8.cpp; modes "int8" and "int8fp16", the latter with float16
  // storage for float tensors): the scales put on the case's values (input slot -> scales, the
  // weights' per output channel; Y's scale, empty: Y float). Such a case runs only the tactics
  // that take int8 storage; an output with a scale must be within one int8 code (±sy) of the
  // reference everywhere (the fraction off by one is printed; in mode int8 at most 0.1%), a
  // float output within the mode's relative L2 tolerance (int8: 1e-5, int8fp16: 1e-3).
  std::map<int, std::vector<float>> in_scales;
  std::vector<float> out_scale;
  bool int8() const { return !in_scales.empty(); }
};

// Helpers for writing cases compactly.
CaseInput in(std::vector<int64_t> shape, DataType t = DataType::kFloat32, double lo = -1, double hi = 1);
CaseInput konst(Tensor value);                         // a constant input with a fixed value
CaseInput ints(std::vector<int64_t> values);           // constant int64 1-D tensor
CaseInput absent();
// A constant float32 input of random values uniform in [-scale, scale] (weights).
CaseInput konst_random(std::vector<int64_t> shape, double scale);
Attribute ints_attr(std::vector<int64_t> v);
Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> kv);
// A case from its parts.
OpCase make_case(std::string name, std::string op, Attributes a, std::vector<CaseInput> ins,
                 std::vector<std::string> modes, std::string domain = "");
// A non-constant input with fixed values of type t (given as doubles).
CaseInput fixed(std::vector<int64_t> shape, std::vector<double> values, DataType t = DataType::kFloat32);

// The families' case lists (tests/cuda/cases_*.cpp).
std::vector<OpCase> elementwise_cases();
std::vector<OpCase> movement_cases();
std::vector<OpCase> reduce_cases();
std::vector<OpCase> conv_cases();       // conv family (Conv, ConvTranspose, FusedConv)
std::vector<OpCase> gemm_pool_cases();  // pooling, Gemm, MatMul, FusedGemm, Attention
std::vector<OpCase> types_cases();      // float8/int4 Cast and Q/DQ, Einsum, RotaryEmbedding
std::vector<OpCase> attention_cases();  // ONNX Attention (layers/attention_onnx.cu)
std::vector<OpCase> int8_cases();       // INT8 FusedConv / FusedGemm (layers/conv_int8.cu)
std::vector<OpCase>
transformer_cases();  // MultiHeadAttention, SkipLayerNorm, LayerNorm rows, GEMM epilogues
std::vector<OpCase> dynamic_cases();  // NonZero, NonMaxSuppression (data-dependent sizes)
std::vector<OpCase> rnn_cases();  // LSTM, GRU, RNN (layers/rnn.cu)
std::vector<OpCase> sampling_cases();   // GridSample, RoiAlign (layers/grid_sample.cu, roi_align.cu)

}  // namespace kiln::gpu::test
