// fuse_layernorm, fuse_gelu, fuse_attention, and the whole pipeline on a small transformer
// block built the way PyTorch exports one.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* layernorm_decomposed(G& b, Value* x, int64_t h, bool pow_form = true, bool affine = true) {
  Value* axes = b.c(ints({-1}));
  Value* mean = b.op("ReduceMean", {x, axes});
  Value* d = b.op("Sub", {x, mean});
  Value* sq = pow_form ? b.op("Pow", {d, b.cf(2.f)}) : b.op("Mul", {d, d});
  Value* var = b.op("ReduceMean", {sq, axes});
  Value* n = b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.cf(1e-5f)})})});
  if (!affine) return n;
  return b.op("Add", {b.op("Mul", {n, b.c(rand_t({h}))}), b.c(rand_t({h}))});
}

TEST(FuseLayerNorm, DecomposedFormsBecomeLayerNormalization) {
  for (bool pow_form : {true, false})
    for (bool affine : {true, false}) {
      G b;
      b.out(b.op("Relu", {layernorm_decomposed(b, b.in("x", {2, 5, 8}), 8, pow_form, affine)}));
      auto opt = optimize_checked(b.g, {"fuse_layernorm"});
      EXPECT_EQ(opt->nodes().size(), 2u);
      ASSERT_EQ(count(*opt, "LayerNormalization"), 1);
      const Node* ln = opt->nodes()[0];
      EXPECT_EQ(ln->attrs.get_int("axis", 0), -1);
      EXPECT_EQ(ln->onnx_nodes.size(), affine ? 9u : 7u);
      EXPECT_EQ(ln->origin, "fuse_layernorm");
    }
}

TEST(FuseLayerNorm, SharedIntermediateDoesNotFuse) {
  G b;
  Value* x = b.in("x", {2, 8});
  Value* axes = b.c(ints({-1}));
  Value* mean = b.op("ReduceMean", {x, axes});
  Value* d = b.op("Sub", {x, mean});
  Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.cf(2.f)}), axes});
  b.out(b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.cf(1e-5f)})})}));
  b.out(mean);  // the mean is also an output
  auto opt = optimize_checked(b.g, {"fuse_layernorm"});
  EXPECT_EQ(count(*opt, "LayerNormalization"), 0);
}

TEST(FuseLayerNorm, NonTrailingAxesDoNotFuse) {
  G b;
  Value* x = b.in("x", {2, 8, 3});
  Value* axes = b.c(ints({1}));
  Value* d = b.op("Sub", {x, b.op("ReduceMean", {x, axes})});
  Value* var = b.op("ReduceMean", {b.op("Pow", {d, b.cf(2.f)}), axes});
  b.out(b.op("Div", {d, b.op("Sqrt", {b.op("Add", {var, b.cf(1e-5f)})})}));
  auto opt = optimize_checked(b.g, {"fuse_layernorm"});
  EXPECT_EQ(count(*opt, "LayerNormalization"), 0);
}

// x * 0.5 * (1 + erf(x / sqrt 2)) in the three orders exporters use.
Value* gelu_erf(G& b, Value* x, int order) {
  Value* e = b.op("Add", {b.op("Erf", {order == 1 ? b.op("Mul", {x, b.cf(0.70710678f)})
                                                  : b.op("Div", {x, b.cf(1.41421356f)})}),
                          b.cf(1.f)});
  if (order == 0) return b.op("Mul", {b.op("Mul", {x, e}), b.cf(0.5f)});
  if (order == 1) return b.op("Mul", {b.op("Mul", {x, b.cf(0.5f)}), e});
  return b.op("Mul", {x, b.op("Mul", {e, b.cf(0.5f)})});
}

Value* gelu_tanh(G& b, Value* x, bool pow_form) {
  Value* cube = pow_form ? b.op("Pow", {x, b.cf(3.f)}) : b.op("Mul", {x, b.op("Mul", {x, x})});
  Value* inner =
      b.op("Mul", {b.cf(0.7978845608f), b.op("Add", {x, b.op("Mul", {cube, b.cf(0.044715f)})})});
  Value* e = b.op("Add", {b.op("Tanh", {inner}), b.cf(1.f)});
  return b.op("Mul", {b.op("Mul", {x, e}), b.cf(0.5f)});
}

TEST(FuseGelu, ErfAndTanhForms) {
  G b;
  Value* x = b.in("x", {3, 16});
  for (int order = 0; order < 3; ++order) b.out(gelu_erf(b, x, order));
  b.out(gelu_tanh(b, x, true));
  b.out(gelu_tanh(b, x, false));
  auto opt = optimize_checked(b.g, {"fuse_gelu"});
  EXPECT_EQ(opt->nodes().size(), 5u);
  EXPECT_EQ(count(*opt, "Gelu"), 5);
  int tanh = 0;
  for (const Node* n : opt->nodes()) tanh += n->attrs.get_string("approximate", "none") == "tanh";
  EXPECT_EQ(tanh, 2);
}

// A graph exported with model.half(): its constants are float16 (sqrt 2 = 1.4140625), which
// match to their own precision.
TEST(FuseGelu, Float16GraphWithItsRoundedConstants) {
  G b;
  Value* x = b.g.add_value("x", TensorType(DataType::kFloat16, {Dim(3), Dim(16)}));
  b.g.add_input(x);
  auto h = [&](float v) { return b.c(scalar_f(v).cast(DataType::kFloat16)); };
  Value* e = b.op("Add", {b.op("Erf", {b.op("Div", {x, h(1.41421356f)})}), h(1.f)});
  b.out(b.op("Mul", {b.op("Mul", {x, e}), h(0.5f)}));
  auto opt = optimize_checked(b.g, {"fuse_gelu"}, 1e-2);
  EXPECT_EQ(count(*opt, "Gelu"), 1);
}

TEST(FuseGelu, WrongConstantOrSharedIntermediateDoesNotFuse) {
  G b;
  Value* x = b.in("x", {3, 4});
  Value* e = b.op("Add", {b.op("Erf", {b.op("Div", {x, b.cf(1.5f)})}), b.cf(1.f)});  // not sqrt 2
  b.out(b.op("Mul", {b.op("Mul", {x, e}), b.cf(0.5f)}));
  Value* e2 = b.op("Add", {b.op("Erf", {b.op("Div", {x, b.cf(1.41421356f)})}), b.cf(1.f)});
  b.out(b.op("Mul", {b.op("Mul", {x, e2}), b.cf(0.5f)}));
  b.out(e2);
  auto opt = optimize_checked(b.g, {"fuse_gelu"});
  EXPECT_EQ(count(*opt, "Gelu"), 0);
}

// softmax(q @ kt / sqrt(d) + mask) @ v, and the SDPA form (q * s) @ (kt * s).
TEST(FuseAttention, ClassicAndSdpaForms) {
  G b;
  Value* q = b.in("q", {2, 3, 5, 4});
  Value* kt = b.in("kt", {2, 3, 4, 5});
  Value* v = b.in("v", {2, 3, 5, 4});
  Value* mask = b.in("mask", {2, 1, 1, 5});
  Attributes last = attrs({{"axis", Attribute::Int(-1)}});
  Value* s = b.op("Add", {b.op("Div", {b.op("MatMul", {q, kt}), b.cf(2.f)}), mask});
  b.out(b.op("MatMul", {b.op("Softmax", {s}, last), v}));
  Value* s2 = b.op("MatMul", {b.op("Mul", {q, b.cf(0.7f)}), b.op("Mul", {kt, b.cf(0.7f)})});
  b.out(b.op("MatMul", {b.op("Softmax", {b.op("Add", {s2, mask})}, last), v}));
  b.out(b.op("MatMul", {b.op("Softmax", {b.op("MatMul", {q, kt})}, last), v}));  // no scale, mask
  auto opt = optimize_checked(b.g, {"fuse_attention"});
  ASSERT_EQ(opt->nodes().size(), 3u);
  EXPECT_EQ(count(*opt, "Attention"), 3);
  EXPECT_NEAR(opt->nodes()[0]->attrs.get_float("scale", 0), 0.5f, 1e-6);
  EXPECT_NEAR(opt->nodes()[1]->attrs.get_float("scale", 0), 0.49f, 1e-6);
  EXPECT_EQ(opt->nodes()[0]->num_inputs(), 4u);
  EXPECT_EQ(opt->nodes()[2]->num_inputs(), 3u);
}

// PyTorch's scaled_dot_product_attention export: q and kt scaled by sqrt(scale) each, and a
// NaN guard after the Softmax.
TEST(FuseAttention, SdpaFormWithNanGuard) {
  G b;
  Value* q = b.in("q", {2, 3, 5, 4});
  Value* kt = b.in("kt", {2, 3, 4, 5});
  Value* v = b.in("v", {2, 3, 5, 4});
  Value* mask = b.in("mask", {2, 1, 5, 5});
  Value* s = b.op("MatMul", {b.op("Mul", {q, b.cf(0.6f)}), b.op("Mul", {kt, b.cf(0.6f)})});
  Value* p = b.op("Softmax", {b.op("Add", {s, mask})}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* guarded = b.op("Where", {b.op("IsNaN", {p}), b.cf(0.f), p});
  b.out(b.op("MatMul", {guarded, v}));
  auto opt = optimize_checked(b.g, {"fuse_attention"});
  ASSERT_EQ(opt->nodes().size(), 1u);
  const Node* n = opt->nodes()[0];
  EXPECT_EQ(n->op_type, "Attention");
  EXPECT_EQ(n->attrs.get_int("nan_to_zero", 0), 1);
  EXPECT_NEAR(n->attrs.get_float("scale", 0), 0.36f, 1e-6);
  EXPECT_EQ(n->onnx_nodes.size(), 8u);
}

// Eager attention: q / a and kt * b, the scores filled by Where(causal, s, finfo.min) before the
// padding mask is added: one kiln.Attention whose mask is the padding mask plus
// Where(causal, 0, finfo.min). A fill that is not far below any score (-1e4) stays.
TEST(FuseAttention, DivScaleAndFilledScores) {
  for (const float fill : {-3.4028235e38f, -1e4f}) {
    G b;
    const int64_t S = 5;
    Value* q = b.in("q", {2, 3, S, 4});
    Value* kt = b.in("kt", {2, 3, 4, S});
    Value* v = b.in("v", {2, 3, S, 4});
    Value* mask = b.in("mask", {2, 1, 1, S});
    Tensor tri(DataType::kFloat64, {1, 1, S, S});
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < S; ++j) tri.data<double>()[i * S + j] = j <= i ? 1.0 : 0.0;
    Value* causal = b.c(tri.cast(DataType::kBool));
    Value* s = b.op("MatMul", {b.op("Div", {q, b.cf(2.f)}), b.op("Mul", {kt, b.cf(0.5f)})});
    Value* filled = b.op("Where", {causal, s, b.cf(fill)});
    Value* p =
        b.op("Softmax", {b.op("Add", {filled, mask})}, attrs({{"axis", Attribute::Int(-1)}}));
    b.out(b.op("MatMul", {p, v}));
    auto opt = optimize_checked(b.g, {"fuse_attention"});
    if (fill > -1e30f) {
      EXPECT_EQ(count(*opt, "Attention"), 0);
      continue;
    }
    ASSERT_EQ(count(*opt, "Attention"), 1);
    const Node* n = find_op(*opt, "Attention");
    EXPECT_NEAR(n->attrs.get_float("scale", 0), 0.25f, 1e-6);
    ASSERT_EQ(n->num_inputs(), 4u);
    EXPECT_EQ(n->input(3)->producer->op_type, "Add");
  }
}

TEST(FuseAttention, SoftmaxNotOnLastAxisOrSharedProbabilitiesDoNotFuse) {
  G b;
  Value* q = b.in("q", {2, 5, 4});
  Value* kt = b.in("kt", {2, 4, 5});
  Value* v = b.in("v", {2, 5, 4});
  b.out(
      b.op("MatMul",
           {b.op("Softmax", {b.op("MatMul", {q, kt})}, attrs({{"axis", Attribute::Int(1)}})), v}));
  Value* p = b.op("Softmax", {b.op("MatMul", {q, kt})}, attrs({{"axis", Attribute::Int(-1)}}));
  b.out(b.op("MatMul", {p, v}));
  b.out(p);  // attention probabilities are an output
  auto opt = optimize_checked(b.g, {"fuse_attention"});
  EXPECT_EQ(count(*opt, "Attention"), 0);
}

// One BERT-like encoder layer as the TorchScript exporter writes it (decomposed LayerNorm,
// erf GELU, classic attention with an additive mask).
TEST(Pipeline, TransformerBlockIsRecognised) {
  G b;
  const int64_t B = 2, S = 5, H = 8, NH = 2, D = 4;
  Value* x = b.in("x", {B, S, H});
  Value* mask = b.in("mask", {B, 1, 1, S});
  auto dense = [&](Value* in, int64_t n) {
    return b.op("Add", {b.c(rand_t({n})), b.op("MatMul", {in, b.c(rand_t({H, n}))})});
  };
  auto heads = [&](Value* t, std::vector<int64_t> perm) {
    Value* r = b.op("Reshape", {t, b.c(ints({B, S, NH, D}))});
    return b.op("Transpose", {r}, attrs({{"perm", Attribute::Ints(perm)}}));
  };
  Value* q = heads(dense(x, H), {0, 2, 1, 3});
  Value* kt = heads(dense(x, H), {0, 2, 3, 1});
  Value* v = heads(dense(x, H), {0, 2, 1, 3});
  Value* s = b.op("Add", {b.op("Div", {b.op("MatMul", {q, kt}), b.cf(2.f)}), mask});
  Value* p = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* ctx = b.op("MatMul", {b.op("Dropout", {p}), v});
  Value* merged =
      b.op("Reshape", {b.op("Transpose", {ctx}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}})),
                       b.c(ints({B, S, H}))});
  Value* h1 = layernorm_decomposed(b, b.op("Add", {dense(merged, H), x}), H);
  Value* ff = gelu_erf(b, dense(h1, H), 0);
  b.out(layernorm_decomposed(b, b.op("Add", {dense(ff, H), h1}), H));

  for (int level : {1, 2}) {
    auto g = b.g.clone();
    OptimizeOptions o;
    o.opt_level = level;
    ASSERT_TRUE(optimize_graph(*g, o).ok());
    auto ins = random_inputs(b.g);
    auto ref = run_cpu(b.g, ins);
    auto got = run_cpu(*g, ins);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_LT(rel_l2(got[0], ref[0]), 1e-5) << "level " << level;
    if (level == 2) {
      // A BERT block: QKV as one GEMM, attention with the head split and merge folded in,
      // the output projection and the second FFN GEMM carrying the residual, two LayerNorms.
      EXPECT_EQ(count(*g, "LayerNormalization"), 2);
      EXPECT_EQ(count(*g, "Attention"), 0);
      EXPECT_EQ(count(*g, "MultiHeadAttention"), 1);
      EXPECT_EQ(count(*g, "Dropout"), 0);
      EXPECT_EQ(count(*g, "Reshape") + count(*g, "Transpose"), 0);
      int gelu = count(*g, "Gelu"), residual = 0;
      for (const Node* n : g->nodes()) {
        gelu += n->attrs.get_string("activation", "") == "Gelu";
        residual += n->op_type == "FusedGemm" && n->input(3) != nullptr;
        if (n->op_type == "MultiHeadAttention") {
          EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
        }
      }
      EXPECT_EQ(gelu, 1);
      EXPECT_EQ(residual, 2);
      EXPECT_EQ(count(*g, "FusedGemm"), 4);
    }
  }
}

}  // namespace
}  // namespace kiln::test
