// fuse_rotary: Hugging Face's rotate_half rotary embedding on the heads of a projection becomes
// one RotaryEmbedding in front of the head split (checked against the unfused graph on the CPU);
// fuse_attention_rotary: a rotary over exactly Q's and K's heads, read by the attention alone,
// joins kiln.MultiHeadAttention (inputs 4 to 6), and unfuse_layer splits it back out.
#include <set>

#include "ops/fused.h"
#include "pass_test_util.h"
#include "passes/passes.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 3, kD = 8;

Value* slice_last(G& b, Value* x, int64_t start, int64_t end) {
  return b.op("Slice", {x, b.c(ints({start})), b.c(ints({end})), b.c(ints({-1}))});
}

// cos and sin [1, S, D] from positions x frequencies f [1, S, D/2], as LlamaRotaryEmbedding
// computes them (Concat(f, f), then Cos/Sin times the attention scaling).
std::pair<Value*, Value*> caches(G& b, Value* f, bool equal_halves = true) {
  Value* emb = b.op("Concat", {f, equal_halves ? f : b.op("Neg", {f})},
                    attrs({{"axis", Attribute::Int(-1)}}));
  return {b.op("Mul", {b.op("Cos", {emb}), b.cf(1.f)}), b.op("Sin", {emb})};
}

// The heads of q [B, S, H*D] with the rotation applied as the exporters write it; cos and sin
// are unsqueezed at `axes` (none: they are [B or 1, 1, S, D] already).
Value* rotated_heads(G& b, Value* q, Value* cos, Value* sin, bool swap_operands,
                     std::vector<int64_t> axes = {1}) {
  Value* x = b.op("Reshape", {q, b.c(ints({kB, kS, kH, kD}))});
  x = b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  Value* rot = b.op(
      "Concat", {b.op("Neg", {slice_last(b, x, kD / 2, INT64_MAX)}), slice_last(b, x, 0, kD / 2)},
      attrs({{"axis", Attribute::Int(-1)}}));
  Value* c = axes.empty() ? cos : b.op("Unsqueeze", {cos, b.c(ints(axes))});
  Value* s = axes.empty() ? sin : b.op("Unsqueeze", {sin, b.c(ints(axes))});
  Value* a = swap_operands ? b.op("Mul", {c, x}) : b.op("Mul", {x, c});
  Value* r = swap_operands ? b.op("Mul", {s, rot}) : b.op("Mul", {rot, s});
  return swap_operands ? b.op("Add", {r, a}) : b.op("Add", {a, r});
}

TEST(FuseRotary, RotateHalfOnHeadsBecomesOneRotaryEmbedding) {
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  Value* k = b.in("k", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}));
  // Read by a layer, as attention reads them (a graph output keeps its producer).
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false)}));
  b.out(b.op("Relu", {rotated_heads(b, k, cos, sin, true)}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 2);
  EXPECT_EQ(count(*opt, "Neg"), 0);
  EXPECT_EQ(count(*opt, "Slice"), 2);  // each cache's first half, shared by q and k
  for (const Node* n : opt->nodes()) {
    if (n->op_type == "RotaryEmbedding") {
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kH);
    }
  }
}

TEST(FuseRotary, RotatedHeadsThatAreAGraphOutputKeepTheirName) {
  // A decoder's present K: the rotated heads are returned for the cache and read by the
  // attention. The rotary moves in front of the head split all the same; the output keeps its
  // name (its producer is now the head split's Transpose).
  G b;
  Value* k = b.in("k", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}));
  Value* present = rotated_heads(b, k, cos, sin, false);
  b.out(present);
  b.out(b.op("Relu", {present}));
  const std::string name = present->name;
  auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 1);
  EXPECT_EQ(count(*opt, "Neg"), 0);
  ASSERT_EQ(opt->outputs().size(), 2u);
  EXPECT_EQ(opt->outputs()[0]->name, name);
  EXPECT_EQ(opt->outputs()[0]->producer->op_type, "Transpose");
}

TEST(FuseRotary, HalvesAsASplit) {
  // rotate_half's halves as the two parts of one Split (slices_to_split's canonical form of two
  // Slices, or an exporter's chunk).
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}));
  Value* x = b.op("Reshape", {q, b.c(ints({kB, kS, kH, kD}))});
  x = b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  Node* halves =
      b.node("Split", {x, b.c(ints({kD / 2, kD / 2}))}, attrs({{"axis", Attribute::Int(-1)}}), 2);
  Value* rot = b.op("Concat", {b.op("Neg", {halves->output(1)}), halves->output(0)},
                    attrs({{"axis", Attribute::Int(-1)}}));
  Value* c = b.op("Unsqueeze", {cos, b.c(ints({1}))});
  Value* s = b.op("Unsqueeze", {sin, b.c(ints({1}))});
  b.out(b.op("Relu", {b.op("Add", {b.op("Mul", {x, c}), b.op("Mul", {rot, s})})}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 1);
  EXPECT_EQ(count(*opt, "Split"), 0);
  EXPECT_EQ(count(*opt, "Neg"), 0);
}

TEST(FuseRotary, CachesWithoutEqualHalvesStay) {
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {1, kS, kD / 2}), /*equal_halves=*/false);
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false)}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 0);
}

TEST(FuseRotary, CachesWithoutBatchAxis) {
  // transformers 5 computes cos and sin as [S, D] and unsqueezes them at axes 0 and 1.
  G b;
  Value* q = b.in("q", {kB, kS, kH * kD});
  auto [cos, sin] = caches(b, b.in("freqs", {kS, kD / 2}));
  b.out(b.op("Relu", {rotated_heads(b, q, cos, sin, false, {0, 1})}));
  auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 1);
}

// A constant [1, 1, S, D] cache (as fold_constants leaves it at static shapes) whose rows are
// f, f (or f, -f when `equal` is false).
Value* constant_cache(G& b, bool equal) {
  Tensor t = rand_t({1, 1, kS, kD});
  float* p = t.data<float>();
  for (int64_t r = 0; r < kS; ++r)
    for (int64_t i = 0; i < kD / 2; ++i) p[r * kD + kD / 2 + i] = (equal ? 1 : -1) * p[r * kD + i];
  return b.c(t);
}

TEST(FuseRotary, FoldedConstantCaches) {
  for (bool equal : {true, false}) {
    G b;
    Value* q = b.in("q", {kB, kS, kH * kD});
    b.out(b.op("Relu", {rotated_heads(b, q, constant_cache(b, equal), constant_cache(b, true),
                                      false, {})}));
    auto opt = optimize_checked(b.g, {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"});
    EXPECT_EQ(count(*opt, "RotaryEmbedding"), equal ? 1 : 0) << "equal halves " << equal;
  }
}

// --- fuse_attention_rotary: the rotary joins the attention ------------------------------------

constexpr int64_t kHq = 4, kHkv = 2, kHd = 8;  // query heads, key/value heads, head size

std::set<std::string> attention_rotary_notes(Graph& g, bool* changed) {
  return pass_notes(g, "fuse_attention_rotary", passes::fuse_attention_rotary, changed);
}

// A packed grouped-query attention on qkv [B, S, (H + 2 Hkv) D] behind a rotary over heads
// [begin, end) of it; extra attributes for the rotary; position ids (a constant: random ones
// could fall outside the caches) when `pos`.
struct PackedRotary {
  G b;
  Value* qkv;
  Node* rot;
  Node* mha;
  PackedRotary(int64_t begin, int64_t end, Attributes extra = {}, bool pos = false) {
    qkv = b.in("qkv", {kB, kS, (kHq + 2 * kHkv) * kHd});
    Value* mask = b.in("mask", {kB, 1, 1, kS});
    std::vector<Value*> ins = {qkv};
    if (pos) {
      constexpr int64_t kMaxPos = 16;
      ins.push_back(b.c(rand_t({kMaxPos, kHd / 2})));
      ins.push_back(b.c(rand_t({kMaxPos, kHd / 2})));
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < kB * kS; ++i) ids.push_back((7 * i + 3) % kMaxPos);
      ins.push_back(b.c(Tensor::from<int64_t>({kB, kS}, ids)));
    } else {
      ins.push_back(b.c(rand_t({kS, kHd / 2})));
      ins.push_back(b.c(rand_t({kS, kHd / 2})));
    }
    Attributes a = attrs({{"num_heads", Attribute::Int(kHq + 2 * kHkv)},
                          {"kiln_head_begin", Attribute::Int(begin)},
                          {"kiln_head_end", Attribute::Int(end)}});
    for (const auto& [k, v] : extra.all()) a.set(k, v);
    rot = b.node("RotaryEmbedding", ins, a);
    mha = add_mha(b, rot->output(0), nullptr, nullptr, mask, kHq);
    mha->attrs.set("kv_heads", Attribute::Int(kHkv));
    mha->attrs.set("packed", Attribute::Int(1));
  }
};

TEST(FuseAttentionRotary, PackedRotaryOverQAndKHeadsJoinsTheAttention) {
  for (bool pos : {false, true})
    for (int inter : {0, 1}) {
      SCOPED_TRACE(fmt::format("position ids {}, interleaved {}", pos, inter));
      PackedRotary p(0, kHq + kHkv, attrs({{"interleaved", Attribute::Int(inter)}}), pos);
      auto opt = optimize_checked(p.b.g, {"fuse_attention_rotary", "eliminate_dead_code"});
      EXPECT_EQ(count(*opt, "RotaryEmbedding"), 0);
      const Node* att = find_kiln(*opt, "MultiHeadAttention");
      ASSERT_NE(att, nullptr);
      EXPECT_TRUE(mha_has_rotary(*att));
      EXPECT_EQ(att->input(0)->name, "qkv");
      EXPECT_EQ(att->input(3)->name, "mask");
      ASSERT_EQ(att->num_inputs(), pos ? 7u : 6u);
      EXPECT_EQ(att->input(4), opt->find_value(p.rot->input(1)->name));
      EXPECT_EQ(att->input(5), opt->find_value(p.rot->input(2)->name));
      EXPECT_EQ(att->attrs.get_int("rotary_interleaved", 0), inter);
      EXPECT_EQ(att->attrs.get_int("packed", 0), 1);
    }
}

// The rotary must rotate exactly Q's and K's heads: Q's only, or V's too, stays a layer.
TEST(FuseAttentionRotary, HeadRangeNotExactlyQAndKStays) {
  for (auto [begin, end] :
       {std::pair<int64_t, int64_t>{0, kHq}, {0, kHq + 2 * kHkv}, {1, kHq + kHkv}}) {
    PackedRotary p(begin, end);
    bool changed = false;
    const auto notes = attention_rotary_notes(p.b.g, &changed);
    EXPECT_FALSE(changed) << begin << ".." << end;
    EXPECT_TRUE(has_note(notes, "head range is not exactly Q's and K's heads")) << dump_notes(notes);
  }
}

TEST(FuseAttentionRotary, RotaryReadElsewhereStays) {
  PackedRotary p(0, kHq + kHkv);
  p.b.out(p.b.op("Relu", {p.rot->output(0)}));
  bool changed = false;
  const auto notes = attention_rotary_notes(p.b.g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "other readers")) << dump_notes(notes);
}

TEST(FuseAttentionRotary, PartialRotaryDimStays) {
  PackedRotary p(0, kHq + kHkv, attrs({{"rotary_embedding_dim", Attribute::Int(kHd / 2)}}));
  bool changed = false;
  const auto notes = attention_rotary_notes(p.b.g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "part of each head")) << dump_notes(notes);
}

// Separate Q and K rotaries (one set of caches) join an unpacked attention; pack_qkv then packs
// it, the rotary staying in it (Llama's Q, K, V once pack_gemm has packed the projections).
TEST(FuseAttentionRotary, SeparateRotariesJoinAndPackQkvKeepsThem) {
  G b;
  Value* qkv = b.in("qkv", {kB, kS, (kHq + 2 * kHkv) * kHd});
  Node* split = b.node("Split", {qkv, b.c(ints({kHq * kHd, kHkv * kHd, kHkv * kHd}))},
                       attrs({{"axis", Attribute::Int(-1)}}), 3);
  Value* cosc = b.c(rand_t({kS, kHd / 2}));
  Value* sinc = b.c(rand_t({kS, kHd / 2}));
  auto rotary = [&](Value* v, int64_t heads) {
    return b.op("RotaryEmbedding", {v, cosc, sinc}, attrs({{"num_heads", Attribute::Int(heads)}}));
  };
  Node* mha = add_mha(b, rotary(split->output(0), kHq), rotary(split->output(1), kHkv),
                      split->output(2), nullptr, kHq);
  mha->attrs.set("kv_heads", Attribute::Int(kHkv));
  auto unpacked = optimize_checked(b.g, {"fuse_attention_rotary", "eliminate_dead_code"});
  EXPECT_EQ(count(*unpacked, "RotaryEmbedding"), 0);
  EXPECT_TRUE(mha_has_rotary(*find_kiln(*unpacked, "MultiHeadAttention")));
  auto opt = optimize_checked(b.g, {"pack_qkv", "fuse_attention_rotary", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 0);
  EXPECT_EQ(count(*opt, "Split"), 0);
  const Node* att = find_kiln(*opt, "MultiHeadAttention");
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(att->attrs.get_int("packed", 0), 1);
  EXPECT_TRUE(mha_has_rotary(*att));
}

TEST(FuseAttentionRotary, SeparateRotariesWithDifferentCachesStay) {
  G b;
  Value* q = b.in("q", {kB, kS, kHq * kHd});
  Value* k = b.in("k", {kB, kS, kHkv * kHd});
  Value* v = b.in("v", {kB, kS, kHkv * kHd});
  auto rotary = [&](Value* x, int64_t heads) {
    return b.op("RotaryEmbedding", {x, b.c(rand_t({kS, kHd / 2})), b.c(rand_t({kS, kHd / 2}))},
                attrs({{"num_heads", Attribute::Int(heads)}}));
  };
  Node* mha = add_mha(b, rotary(q, kHq), rotary(k, kHkv), v, nullptr, kHq);
  mha->attrs.set("kv_heads", Attribute::Int(kHkv));
  bool changed = false;
  const auto notes = attention_rotary_notes(b.g, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "different caches")) << dump_notes(notes);
}

// unfuse_layer splits the attention with the rotary back into the rotary and the attention (a
// backend whose attention kernels cannot apply it), computing the same.
TEST(FuseAttentionRotary, UnfuseSplitsTheRotaryBackOut) {
  PackedRotary p(0, kHq + kHkv, {}, /*pos=*/true);
  auto opt = optimize_checked(p.b.g, {"fuse_attention_rotary", "eliminate_dead_code"});
  Node* att = nullptr;
  for (Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") att = n;
  ASSERT_NE(att, nullptr);
  ASSERT_TRUE(unfuse_layer(*opt, att).ok());
  ASSERT_TRUE(opt->topo_sort().ok());
  ASSERT_TRUE(infer_shapes(*opt).ok());
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  const Node* rot = find_op(*opt, "RotaryEmbedding");
  EXPECT_EQ(rot->attrs.get_int("kiln_head_end", 0), kHq + kHkv);
  EXPECT_EQ(rot->num_inputs(), 4u);
  att = nullptr;
  for (Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") att = n;
  ASSERT_NE(att, nullptr);
  EXPECT_FALSE(mha_has_rotary(*att));
  EXPECT_EQ(att->num_inputs(), 4u);
  const auto ins = random_inputs(p.b.g);
  const auto before = run_cpu(p.b.g, ins), after = run_cpu(*opt, ins);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_LT(rel_l2(after[0], before[0]), 1e-6);
}

}  // namespace
}  // namespace kiln::test
