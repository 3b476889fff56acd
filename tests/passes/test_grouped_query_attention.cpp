// fold_attention_heads on grouped-query attention: K and V with fewer heads, each repeated however
// the exporter wrote it (Hugging Face's repeat_kv as Unsqueeze, Expand, Reshape; K then
// transposed plainly or through merged dims; repeat_interleave as a Gather; Unsqueeze, Tile,
// Reshape; Tile or Concat of one K/V head's copies), become one kiln.MultiHeadAttention with
// kv_heads that reads them in place (checked against the unfused graph on the CPU); a repeat that
// is not of whole heads, or that repeats Hkv > 1 heads in Tile's order (query head h would read
// K/V head h % Hkv), stays a copy, which the layer reads head-major. A KV cache's K and V,
// already split into heads, are read head-major in place.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 4, kKv = 2, kD = 4;

Value* perm(G& b, Value* x, std::vector<int64_t> p) {
  return b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
}

// [B, S, heads*D] -> [B, heads, S, D]
Value* heads(G& b, Value* x, int64_t n) {
  return perm(b, b.op("Reshape", {x, b.c(ints({kB, kS, n, kD}))}), {0, 2, 1, 3});
}

// How the K/V heads [B, G, S, D] are repeated to [B, G*rep, S, D].
enum class Repeat {
  kExpand,         // repeat_kv: Unsqueeze, Expand, Reshape (copies at `axis`)
  kGather,         // repeat_interleave: Gather of head indices 0,0,..,1,1,..
  kUnsqueezeTile,  // Unsqueeze, Tile of the new axis, Reshape
  kTile,           // Tile of the head axis: heads in Tile's order (h % G)
  kConcat,         // Concat of rep copies on the head axis (Tile's order)
};

Value* repeat_kv(G& b, Value* x, int64_t g, int64_t rep, Repeat how, int64_t axis = 2) {
  switch (how) {
    case Repeat::kExpand: {
      Value* u = b.op("Unsqueeze", {x, b.c(ints({axis}))});
      std::vector<int64_t> to = {kB, g, kS, kD};
      to.insert(to.begin() + axis, rep);
      Value* e = b.op("Expand", {u, b.c(ints(to))});
      return b.op("Reshape", {e, b.c(ints({kB, g * rep, kS, kD}))});
    }
    case Repeat::kGather: {
      std::vector<int64_t> idx;
      for (int64_t i = 0; i < g * rep; ++i) idx.push_back(i / rep);
      return b.op("Gather", {x, b.c(ints(idx))}, attrs({{"axis", Attribute::Int(1)}}));
    }
    case Repeat::kUnsqueezeTile: {
      Value* u = b.op("Unsqueeze", {x, b.c(ints({2}))});
      Value* t = b.op("Tile", {u, b.c(ints({1, 1, rep, 1, 1}))});
      return b.op("Reshape", {t, b.c(ints({kB, g * rep, kS, kD}))});
    }
    case Repeat::kTile:
      return b.op("Tile", {x, b.c(ints({1, rep, 1, 1}))});
    case Repeat::kConcat:
      return b.op("Concat", std::vector<Value*>(static_cast<size_t>(rep), x),
                  attrs({{"axis", Attribute::Int(1)}}));
  }
  return nullptr;
}

// K^T: plainly transposed, or (merged) as dynamo writes it at static shapes:
// [B, H, S, D] -> [B*H, S, D] -> [B*H, D, S] -> [B, H, D, S].
Value* key_t(G& b, Value* k, bool merged) {
  if (!merged) return perm(b, k, {0, 1, 3, 2});
  Value* m = b.op("Reshape", {k, b.c(ints({kB * kH, kS, kD}))});
  return b.op("Reshape", {perm(b, m, {0, 2, 1}), b.c(ints({kB, kH, kD, kS}))});
}

void build(G& b, int64_t axis, Repeat how = Repeat::kExpand, int64_t kv = kKv,
           bool merged_kt = false) {
  Value* x = b.in("x", {kB, kS, kH * kD});
  Value* mask = b.in("mask", {1, 1, kS, kS});
  auto proj = [&](int64_t n) { return b.op("MatMul", {x, b.c(rand_t({kH * kD, n}))}); };
  Value* q = heads(b, proj(kH * kD), kH);
  Value* k = repeat_kv(b, heads(b, proj(kv * kD), kv), kv, kH / kv, how, axis);
  Value* v = repeat_kv(b, heads(b, proj(kv * kD), kv), kv, kH / kv, how, axis);
  Value* s =
      b.op("Add", {b.op("Mul", {b.op("MatMul", {q, key_t(b, k, merged_kt)}), b.cf(0.5f)}), mask});
  Value* p = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b, b.op("MatMul", {p, v}), {0, 2, 1, 3});
  b.out(b.op("Reshape", {y, b.c(ints({kB, kS, kH * kD}))}));
}

// The graph after fuse_attention and fold_attention_heads: one attention reading kv heads in
// place, nothing repeated, or (in_place = false) one that reads the repeated K and V as the
// copies made them, head-major with H heads (kv_head_major, no kv_heads).
void expect_folded(const G& b, int64_t kv, bool in_place = true) {
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
  if (!in_place) {
    for (const Node* n : opt->nodes())
      if (n->op_type == "MultiHeadAttention") {
        EXPECT_EQ(n->attrs.get_int("kv_head_major", 0), 1);
        EXPECT_EQ(n->attrs.get_int("kv_heads", kH), kH);
      }
    return;
  }
  for (const char* op : {"Expand", "Transpose", "Gather", "Tile", "Concat"})
    EXPECT_EQ(count(*opt, op), 0) << op;
  for (const Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kH);
      EXPECT_EQ(n->attrs.get_int("kv_heads", 0), kv);
    }
}

TEST(GroupedQueryAttention, EveryRepeatFormIsReadInPlace) {
  for (Repeat how : {Repeat::kExpand, Repeat::kGather, Repeat::kUnsqueezeTile}) {
    SCOPED_TRACE(static_cast<int>(how));
    G b;
    build(b, 2, how);
    expect_folded(b, kKv);
  }
}

TEST(GroupedQueryAttention, KeyTransposedThroughMergedDims) {
  // dynamo at static shapes: the repeat's Reshape and the merge of [B, H] are one Reshape.
  G b;
  build(b, 2, Repeat::kExpand, kKv, /*merged_kt=*/true);
  expect_folded(b, kKv);
  // and after the level-1 cleanup has merged those Reshapes
  auto opt = optimize_checked(
      b.g, {"cancel_transposes", "fuse_attention", "fold_attention_heads", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MultiHeadAttention"), 1);
}

TEST(GroupedQueryAttention, OneKeyValueHeadCopiedAnyWay) {
  // Multi-query attention: with one K/V head, Tile's order and repeat_interleave's agree.
  for (Repeat how : {Repeat::kExpand, Repeat::kGather, Repeat::kTile, Repeat::kConcat}) {
    SCOPED_TRACE(static_cast<int>(how));
    G b;
    build(b, 2, how, 1);
    expect_folded(b, 1);
  }
}

TEST(GroupedQueryAttention, HeadsInTileOrderAreReadAsCopied) {
  // Query head h reads K/V head h % Hkv: not the layer's h / (H / Hkv).
  for (Repeat how : {Repeat::kTile, Repeat::kConcat}) {
    SCOPED_TRACE(static_cast<int>(how));
    G b;
    build(b, 2, how);
    expect_folded(b, kKv, /*in_place=*/false);
  }
}

TEST(GroupedQueryAttention, WholePipelinePacksTheProjections) {
  G b;
  build(b, 2);
  auto g = b.g.clone();
  OptimizeOptions o;
  o.opt_level = 2;
  ASSERT_TRUE(optimize_graph(*g, o).ok());
  auto ins = random_inputs(b.g);
  auto ref = run_cpu(b.g, ins);
  auto got = run_cpu(*g, ins);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_LT(rel_l2(got[0], ref[0]), 1e-5);
  ASSERT_EQ(count(*g, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*g, "MatMul"), 0);  // Q, K and V: one GEMM of H + 2 Hkv heads
  for (const Node* n : g->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
      EXPECT_EQ(n->attrs.get_int("kv_heads", 0), kKv);
    }
}

TEST(GroupedQueryAttention, CopiesInterleavedAcrossHeadsAreReadAsCopied) {
  // Copies inserted after the sequence axis: [B, G, S, rep, D] -> [B, G*rep, S, D] is not a
  // repeat of whole heads.
  G b;
  build(b, 3);
  expect_folded(b, kKv, /*in_place=*/false);
}

// A decoder exported with its KV cache: K and V are Concat(past, new heads) [B, G, P + S, D],
// returned as the present cache (graph outputs) and repeated for the query heads. The layer reads
// the cache head-major in place (kv_head_major), whatever the repeat, and computes what the
// graph did; the present tensors stay as outputs.
TEST(GroupedQueryAttention, AKeyValueCacheIsReadHeadMajorInPlace) {
  constexpr int64_t kP = 3, kT = kP + kS;
  for (int64_t kv : {kKv, kH}) {
    SCOPED_TRACE(kv);
    G b;
    Value* x = b.in("x", {kB, kS, kH * kD});
    Value* mask = b.in("mask", {1, 1, kS, kT});
    auto proj = [&](int64_t n) { return b.op("MatMul", {x, b.c(rand_t({kH * kD, n}))}); };
    auto cache = [&](const char* past) {
      Value* c = b.op("Concat", {b.in(past, {kB, kv, kP, kD}), heads(b, proj(kv * kD), kv)},
                      attrs({{"axis", Attribute::Int(-2)}}));
      b.out(c);
      if (kv == kH) return c;
      Value* u = b.op("Unsqueeze", {c, b.c(ints({2}))});
      Value* e = b.op("Expand", {u, b.c(ints({kB, kv, kH / kv, kT, kD}))});
      return b.op("Reshape", {e, b.c(ints({kB, kH, kT, kD}))});
    };
    Value* q = heads(b, proj(kH * kD), kH);
    Value* k = cache("past_key");
    Value* v = cache("past_value");
    Value* s = b.op(
        "Add", {b.op("Mul", {b.op("MatMul", {q, perm(b, k, {0, 1, 3, 2})}), b.cf(0.5f)}), mask});
    Value* p = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
    Value* y = perm(b, b.op("MatMul", {p, v}), {0, 2, 1, 3});
    b.out(b.op("Reshape", {y, b.c(ints({kB, kS, kH * kD}))}));
    auto opt =
        optimize_checked(b.g, {"fuse_attention", "fold_attention_heads", "eliminate_dead_code"});
    ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
    EXPECT_EQ(count(*opt, "Expand"), 0);
    EXPECT_EQ(count(*opt, "Concat"), 2);  // the present cache, an output
    for (const Node* n : opt->nodes())
      if (n->op_type == "MultiHeadAttention") {
        EXPECT_EQ(n->attrs.get_int("kv_head_major", 0), 1);
        EXPECT_EQ(n->attrs.get_int("kv_heads", kH), kv);
        EXPECT_TRUE(opt->is_graph_output(n->input(1)));
        EXPECT_TRUE(opt->is_graph_output(n->input(2)));
      }
  }
}

}  // namespace
}  // namespace kiln::test
