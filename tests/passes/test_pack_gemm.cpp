// pack_gemm: sibling products of one activation by constant weights become one GEMM whose parts
// their readers take in place: an elementwise chain through col_slices (fuse_elementwise), rotaries
// on parts as one rotary over a head range (fuse_rotary) and Q, K and V as a packed attention input
// (pack_qkv). Checked against the unpacked graph on the CPU. Siblings that would not gain stay
// apart, with the reason in the pass's notes: a weight that is not a constant, a weight that is
// not a 2-D [K, N] matrix (siblings of one activation cannot differ in K otherwise), INT8 or
// another epilogue, a reader that would need a copy of the columns, rotaries that could not
// become one.
#include <set>

#include "pass_test_util.h"
#include "passes/passes.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kK = 16;

Value* matmul(G& b, Value* x, int64_t n) { return b.op("MatMul", {x, b.c(rand_t({kK, n}))}); }

// Runs pack_gemm once on g (verbose: notes kept); returns its notes.
std::set<std::string> pack_notes(Graph& g, bool* changed) {
  return pass_notes(g, "pack_gemm", passes::pack_gemm, changed);
}

// SwiGLU: silu(x W1) * (x W3); the packed GEMM's halves read in place by one chain.
TEST(PackGemm, GateAndUpBecomeOneGemmAndAChainReadingItsHalves) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* gate = matmul(b, x, 24), *up = matmul(b, x, 24);
  b.out(b.op("Mul", {b.op("Swish", {gate}), up}));
  auto opt = optimize_checked(b.g, {"pack_gemm", "fuse_elementwise", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MatMul"), 0);
  EXPECT_EQ(count(*opt, "FusedGemm"), 1);
  EXPECT_EQ(count(*opt, "Split"), 0);  // read in place, never copied
  const Node* chain = find_kiln(*opt, "ElementwiseChain");
  ASSERT_NE(chain, nullptr);
  EXPECT_EQ(chain->attrs.get_ints("col_slices"), (std::vector<int64_t>{0, 24, 24, 24}));
  EXPECT_EQ(chain->input(0), chain->input(1));
  EXPECT_EQ(find_kiln(*opt, "FusedGemm")->input(1)->constant->shape(),
            (std::vector<int64_t>{kK, 48}));
}

// Three siblings of different widths, one carrying a bias (the others' bias columns are zeros),
// each read by one elementwise op of its own: one GEMM, and every op a chain of one step that
// reads its columns.
TEST(PackGemm, AnyNumberOfSiblingsWithBiasesEachReadInPlace) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* p0 = b.op("Add", {matmul(b, x, 8), b.c(rand_t({8}))});
  Value* p1 = matmul(b, x, 16), *p2 = matmul(b, x, 4);
  b.out(b.op("Relu", {p0}));
  b.out(b.op("Tanh", {p1}));
  b.out(b.op("Sigmoid", {p2}));
  auto opt = optimize_checked(
      b.g, {"fuse_matmul_add", "pack_gemm", "fuse_elementwise", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MatMul"), 0);
  ASSERT_EQ(count(*opt, "FusedGemm"), 1);
  const Node* gemm = find_kiln(*opt, "FusedGemm");
  ASSERT_NE(gemm->input(2), nullptr);
  EXPECT_EQ(gemm->input(2)->constant->shape(), (std::vector<int64_t>{28}));
  EXPECT_EQ(count(*opt, "Split"), 0);
  EXPECT_EQ(count(*opt, "ElementwiseChain"), 3);
}

TEST(PackGemm, NonConstantWeightStaysApart) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* w = b.in("w", {kK, 8});
  b.out(b.op("Relu", {b.op("MatMul", {x, w})}));
  b.out(b.op("Relu", {matmul(b, x, 8)}));
  b.out(b.op("Relu", {matmul(b, x, 8)}));
  bool changed = false;
  auto g = b.g.clone();
  const auto notes = pack_notes(*g, &changed);
  EXPECT_TRUE(changed);  // the two constant ones pack
  EXPECT_EQ(count(*g, "MatMul"), 1);
  EXPECT_TRUE(has_note(notes, "its weight is not a constant")) << dump_notes(notes);
}

// Siblings of one activation have one K unless a weight is not a [K, N] matrix (a batched
// product): that one stays apart.
TEST(PackGemm, WeightThatIsNotAMatrixStaysApart) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  b.out(b.op("Relu", {b.op("MatMul", {x, b.c(rand_t({kB, kK, 8}))})}));
  b.out(b.op("Relu", {matmul(b, x, 8)}));
  bool changed = false;
  auto g = b.g.clone();
  const auto notes = pack_notes(*g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(count(*g, "MatMul"), 2);
  EXPECT_TRUE(has_note(notes, "not a 2-D [K, N] matrix")) << dump_notes(notes);
}

// Siblings of one activation share its type in a valid graph (a MatMul's operands have one
// type); what differs is the precision a layer runs at and its epilogue: an INT8-marked product
// and one with another activation stay apart.
TEST(PackGemm, DifferentPrecisionsOrEpiloguesStayApart) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  auto fused = [&](const char* act, bool int8) {
    Node* n = b.node("FusedGemm", {x, b.c(rand_t({kK, 8}))});
    n->domain = "kiln";
    n->attrs.set("base", Attribute::String("MatMul"));
    if (act) n->attrs.set("activation", Attribute::String(act));
    if (int8) n->attrs.set("int8", Attribute::Int(1));
    return n->output(0);
  };
  b.out(b.op("Neg", {fused(nullptr, false)}));
  b.out(b.op("Neg", {fused(nullptr, true)}));
  b.out(b.op("Neg", {fused("Relu", false)}));
  bool changed = false;
  auto g = b.g.clone();
  const auto notes = pack_notes(*g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(count(*g, "FusedGemm"), 3);
  EXPECT_TRUE(has_note(notes, "different weight types or epilogues")) << dump_notes(notes);
  EXPECT_TRUE(has_note(notes, "a residual, INT8 or a Gemm base")) << dump_notes(notes);
}

// A reader that would need the part's columns copied (a Transpose) keeps its product apart.
TEST(PackGemm, ReaderThatCannotReadASliceKeepsItsProductApart) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  b.out(b.op("Softmax", {matmul(b, x, 8)}));
  b.out(b.op("Relu", {matmul(b, x, 8)}));
  bool changed = false;
  auto g = b.g.clone();
  const auto notes = pack_notes(*g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "cannot read a column slice in place")) << dump_notes(notes);
}

// A decoder's V projection going into its KV cache (Reshape to heads, Transpose, Concat after the
// past) packs with its siblings: the region of layout ops becomes one kiln.Relayout that reads
// its columns of the packed result as a Slice; a lone Reshape (no copy after it) does not.
TEST(PackGemm, ALayoutRegionThatCopiesReadsItsPartInPlace) {
  constexpr int64_t H = 2, D = kK / 4;
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* past = b.in("past", {kB, H, 3, D});
  Value* v = b.op("Reshape", {matmul(b, x, H * D), b.c(ints({kB, kS, H, D}))});
  Value* t = b.op("Transpose", {v}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  b.out(b.op("Concat", {past, t}, attrs({{"axis", Attribute::Int(2)}})));
  b.out(b.op("Relu", {matmul(b, x, 8)}));
  auto opt = optimize_checked(b.g, {"pack_gemm", "fuse_elementwise", "eliminate_dead_code",
                                    "fuse_relayout", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MatMul") + count(*opt, "FusedGemm"), 1);
  EXPECT_EQ(count(*opt, "Relayout"), 1);
  EXPECT_EQ(count(*opt, "Split"), 0);
  G lone;
  Value* y = lone.in("x", {kB, kS, kK});
  lone.out(lone.op("Reshape", {matmul(lone, y, 8), lone.c(ints({kB * kS, 8}))}));
  lone.out(lone.op("Relu", {matmul(lone, y, 8)}));
  bool changed = false;
  auto g = lone.g.clone();
  pack_notes(*g, &changed);
  EXPECT_FALSE(changed);
}

// Llama's attention: Q, K and V projections, rotaries on Q and K (grouped-query: K and V have
// half the heads), the attention. One GEMM, one rotary over the Q and K heads of its result, one
// packed attention.
TEST(PackGemm, RotaryQkvBecomesOneGemmOneRotaryAndAPackedAttention) {
  constexpr int64_t H = 4, Hkv = 2, D = 4;
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* mask = b.in("mask", {1, 1, kS, kS});
  Value* cosc = b.c(rand_t({kS, D / 2}));
  Value* sinc = b.c(rand_t({kS, D / 2}));
  auto rotary = [&](Value* v, int64_t heads) {
    return b.op("RotaryEmbedding", {v, cosc, sinc}, attrs({{"num_heads", Attribute::Int(heads)}}));
  };
  Value* q = rotary(matmul(b, x, H * D), H);
  Value* k = rotary(matmul(b, x, Hkv * D), Hkv);
  Value* v = matmul(b, x, Hkv * D);
  Node* mha = add_mha(b, q, k, v, mask, H);
  mha->attrs.set("kv_heads", Attribute::Int(Hkv));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "pack_gemm", "pack_qkv", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MatMul"), 0);
  EXPECT_EQ(count(*opt, "FusedGemm"), 1);
  EXPECT_EQ(count(*opt, "Split"), 0);
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  const Node* rot = find_op(*opt, "RotaryEmbedding");
  EXPECT_EQ(rot->attrs.get_int("num_heads", 0), H + 2 * Hkv);
  EXPECT_EQ(rot->attrs.get_int("kiln_head_begin", -1), 0);
  EXPECT_EQ(rot->attrs.get_int("kiln_head_end", -1), H + Hkv);
  const Node* att = find_op(*opt, "MultiHeadAttention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->attrs.get_int("packed", 0), 1);
  EXPECT_EQ(att->input(0), rot->output(0));
}

// Rotaries with different caches could not become one rotary over the packed tensor: the
// products stay apart (packed, a Split would copy the columns).
TEST(PackGemm, RotariesWithDifferentCachesKeepTheirProductsApart) {
  constexpr int64_t H = 2, D = 4;
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  auto rotary = [&](Value* v) {
    return b.op("RotaryEmbedding", {v, b.c(rand_t({kS, D / 2})), b.c(rand_t({kS, D / 2}))},
                attrs({{"num_heads", Attribute::Int(H)}}));
  };
  b.out(rotary(matmul(b, x, H * D)));
  b.out(rotary(matmul(b, x, H * D)));
  bool changed = false;
  auto g = b.g.clone();
  const auto notes = pack_notes(*g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_EQ(count(*g, "MatMul"), 2);
  EXPECT_TRUE(has_note(notes, "rotaries on their results read different caches")) << dump_notes(notes);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// A kiln.MultiHeadAttention of two heads on q, k, v (layer n: its own names), its output a
// graph output.
void mha2(G& b, Value* q, Value* k, Value* v, int n) {
  const std::string s = std::to_string(n);
  Node* m = b.g.add_node("MultiHeadAttention", "mha" + s, {q, k, v}, {"att" + s}, "kiln");
  m->attrs.set("num_heads", Attribute::Int(2));
  m->attrs.set("scale", Attribute::Float(0.5f));
  m->onnx_nodes = {m->name};
  b.out(m->output(0));
}

// Cross-attention in two layers (a decoder's, a diffusion UNet's): every K and V projection reads
// the one encoder output, so pack_gemm makes them one GEMM; each attention then reads its K and
// V (and Q, whose projections of h pack as well) as columns of those GEMMs' results in place
// (pack_qkv's ReadPartsInPlace), and no Split copies them apart.
TEST(PackQkv, CrossAttentionReadsItsKeysAndValuesInPlace) {
  G b;
  Value* ctx = b.in("ctx", {kB, 7, kK});
  Value* h = b.in("h", {kB, kS, kK});
  for (int layer = 0; layer < 2; ++layer) {
    Value* q = matmul(b, h, 8);
    Value* k = matmul(b, ctx, 8), *v = matmul(b, ctx, 8);
    mha2(b, q, k, v, layer);
  }
  auto opt = optimize_checked(b.g, {"pack_gemm", "pack_qkv", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Split"), 0);
  int read = 0;
  for (const Node* n : opt->nodes()) {
    if (n->op_type != "MultiHeadAttention") continue;
    const auto cols = n->attrs.get_ints("col_slices");
    ASSERT_EQ(cols.size(), 6u);
    EXPECT_EQ(cols[1], 8);  // the layers' Q projections of h are one GEMM too
    EXPECT_EQ(n->input(0)->type.dims->back().value, 16);
    EXPECT_EQ(cols[3], 8);
    EXPECT_EQ(cols[5], 8);
    EXPECT_EQ(n->input(1), n->input(2));
    EXPECT_EQ(n->input(1)->type.dims->back().value, 32);  // both layers' K and V
    ++read;
  }
  EXPECT_EQ(read, 2);
}

// Q, K and V parts of one three-way Split still pack (PackQkv first); with only V a part (K from
// elsewhere) the attention is left as it is.
TEST(PackQkv, SelfAttentionStillPacksAndLoneValueStays) {
  G b;
  Value* x = b.in("x", {kB, kS, kK});
  Value* q = matmul(b, x, 8), *k = matmul(b, x, 8), *v = matmul(b, x, 8);
  mha2(b, q, k, v, 0);
  auto opt = optimize_checked(b.g, {"pack_gemm", "pack_qkv", "eliminate_dead_code"});
  const Node* mha = find_kiln(*opt, "MultiHeadAttention");
  ASSERT_NE(mha, nullptr);
  EXPECT_EQ(mha->attrs.get_int("packed", 0), 1);
  EXPECT_FALSE(mha->attrs.has("col_slices"));

  G c;
  Value* y = c.in("y", {kB, kS, kK});
  Node* split = c.node("Split", {y, c.c(ints({8, 8}))}, attrs({{"axis", Attribute::Int(-1)}}), 2);
  mha2(c, c.in("q", {kB, kS, 8}), c.in("k", {kB, kS, 8}), split->output(1), 0);
  c.out(split->output(0));
  auto opt2 = optimize_checked(c.g, {"pack_qkv"});
  EXPECT_FALSE(find_kiln(*opt2, "MultiHeadAttention")->attrs.has("col_slices"));
}

}  // namespace
}  // namespace kiln::test
