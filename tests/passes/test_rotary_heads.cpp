// fuse_rotary on rotate_every_two (GPT-J's, EVA's interleaved pairs) with constant caches, and
// rotary_before_heads: unrotated prefix rows join the rotary (RotaryPrefixRows), and a rotary on
// a view of a projection's heads moves in front of the head split (RotaryBeforeHeads), packed
// Q | K | V included. Each result is checked against the unfused graph on the CPU.
#include <set>

#include "pass_test_util.h"
#include "passes/passes.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kN = 5, kH = 2, kD = 8;  // batch, tokens, heads, head size

// A constant [rows, D] cache whose pairs (2k, 2k + 1) are equal (unless `equal` is false).
Value* pair_cache(G& b, int64_t rows, bool equal = true) {
  Tensor t = rand_t({rows, kD});
  float* p = t.data<float>();
  for (int64_t i = 0; i < rows * kD; i += 2) p[i + 1] = equal ? p[i] : -p[i];
  return b.c(t);
}

Attributes axis(int64_t a) { return attrs({{"axis", Attribute::Int(a)}}); }

Value* slice(G& b, Value* x, int64_t start, int64_t end, int64_t ax, int64_t step = 1) {
  return b.op("Slice",
              {x, b.c(ints({start})), b.c(ints({end})), b.c(ints({ax})), b.c(ints({step}))});
}

// rotate_every_two as torch exports `stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`, x
// [B, H, S, D] with S = rows, applied with caches [rows, D].
Value* every_two(G& b, Value* x, Value* cos, Value* sin, int64_t rows) {
  Value* odd = b.op("Neg", {slice(b, x, 1, INT64_MAX, -1, 2)});
  Value* even = slice(b, x, 0, INT64_MAX, -1, 2);
  Value* st =
      b.op("Concat",
           {b.op("Unsqueeze", {odd, b.c(ints({-1}))}), b.op("Unsqueeze", {even, b.c(ints({-1}))})},
           axis(-1));
  Value* rot = b.op("Reshape", {st, b.c(ints({kB, kH, rows, kD}))});
  return b.op("Add", {b.op("Mul", {x, cos}), b.op("Mul", {rot, sin})});
}

// The heads of part `i` of a packed [B, N, 3*H*D] projection as timm writes them:
// reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4), then part i (Slice and Squeeze).
Value* packed_part(G& b, Value* t, int64_t i) {
  return b.op("Squeeze", {slice(b, t, i, i + 1, 0), b.c(ints({0}))});
}

Value* packed_heads(G& b, Value* qkv) {
  Value* r = b.op("Reshape", {qkv, b.c(ints({kB, kN, 3, kH, kD}))});
  return b.op("Transpose", {r}, attrs({{"perm", Attribute::Ints({2, 0, 3, 1, 4})}}));
}

std::vector<std::string> kPasses = {"fuse_rotary", "rotary_before_heads", "eliminate_dead_code"};

TEST(RotaryForms, RotateEveryTwoOnHeadsMovesInFrontOfTheSplit) {
  G b;
  Value* q = b.in("q", {kB, kN, kH * kD});
  Value* x = b.op("Reshape", {q, b.c(ints({kB, kN, kH, kD}))});
  x = b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  b.out(b.op("Relu", {every_two(b, x, pair_cache(b, kN), pair_cache(b, kN), kN)}));
  auto opt = optimize_checked(b.g, kPasses);
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  const Node* r = find_op(*opt, "RotaryEmbedding");
  EXPECT_EQ(r->input(0)->name, "q");
  EXPECT_EQ(r->attrs.get_int("interleaved", 0), 1);
  EXPECT_EQ(r->attrs.get_int("num_heads", 0), kH);
  EXPECT_EQ(count(*opt, "Neg"), 0);
  EXPECT_EQ(count(*opt, "Concat"), 0);
}

TEST(RotaryForms, CachesWithUnequalPairsStay) {
  G b;
  Value* x = b.in("x", {kB, kH, kN, kD});
  b.out(b.op("Relu", {every_two(b, x, pair_cache(b, kN, false), pair_cache(b, kN), kN)}));
  auto opt = optimize_checked(b.g, kPasses);
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 0);
}

TEST(RotaryForms, RotaryOnHeadsWithoutASplitStaysOnTheHeads) {
  // x is a graph input [B, H, S, D]: ONNX's 4-D rotary form, nothing to move.
  G b;
  Value* x = b.in("x", {kB, kH, kN, kD});
  b.out(b.op("Relu", {every_two(b, x, pair_cache(b, kN), pair_cache(b, kN), kN)}));
  auto opt = optimize_checked(b.g, kPasses);
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  EXPECT_EQ(find_op(*opt, "RotaryEmbedding")->input(0)->name, "x");
}

TEST(RotaryForms, PartialRotaryOnHeadsCoversTheHeads) {
  // GPT-NeoX's and Phi's partial rotary: rotate_half on the first R features of each head, the
  // rest passed on, concatenated back.
  constexpr int64_t R = kD / 2;
  G b;
  Value* q = b.in("q", {kB, kN, kH * kD});
  Value* x = b.op("Reshape", {q, b.c(ints({kB, kN, kH, kD}))});
  x = b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints({0, 2, 1, 3})}}));
  Value* xr = slice(b, x, 0, R, -1);
  Value* xp = slice(b, x, R, INT64_MAX, -1);
  Value* rot = b.op("Concat",
                    {b.op("Neg", {slice(b, xr, R / 2, INT64_MAX, -1)}), slice(b, xr, 0, R / 2, -1)},
                    axis(-1));
  Tensor ct = rand_t({kN, R}), st = rand_t({kN, R});
  for (Tensor* t : {&ct, &st})
    for (int64_t i = 0; i < kN; ++i)
      for (int64_t k = 0; k < R / 2; ++k)
        t->data<float>()[i * R + R / 2 + k] = t->data<float>()[i * R + k];
  Value* y = b.op("Add", {b.op("Mul", {xr, b.c(ct)}), b.op("Mul", {rot, b.c(st)})});
  b.out(b.op("Relu", {b.op("Concat", {y, xp}, axis(-1))}));
  auto opt = optimize_checked(b.g, kPasses);
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  const Node* r = find_op(*opt, "RotaryEmbedding");
  EXPECT_EQ(r->input(0)->name, "q");
  EXPECT_EQ(r->attrs.get_int("rotary_embedding_dim", 0), R);
  EXPECT_EQ(r->attrs.get_int("num_heads", 0), kH);
  EXPECT_EQ(count(*opt, "Concat"), 0);
}

// EVA's attention: packed Q | K | V heads, the rotary on every token but the first (the class
// token), V read as it is; the rotated Q and K and V are the outputs (as the attention reads
// them).
struct EvaHeads {
  G b;
  Value* qkv;
  EvaHeads(bool q_also_read_unrotated = false) {
    qkv = b.in("qkv", {kB, kN, 3 * kH * kD});
    Value* t = packed_heads(b, qkv);
    Value* cos = pair_cache(b, kN - 1);
    Value* sin = pair_cache(b, kN - 1);
    for (int64_t i = 0; i < 3; ++i) {
      Value* part = packed_part(b, t, i);
      if (i == 2) {
        b.out(b.op("Relu", {part}));
        break;
      }
      Value* rest = slice(b, part, 1, INT64_MAX, 2);
      Value* rot = every_two(b, rest, cos, sin, kN - 1);
      b.out(b.op("Relu", {b.op("Concat", {slice(b, part, 0, 1, 2), rot}, axis(2))}));
      if (i == 0 && q_also_read_unrotated) b.out(b.op("Sigmoid", {part}));
    }
  }
};

TEST(RotaryForms, PackedHeadsWithAnUnrotatedPrefixRowBecomeOneRotaryOverTheProjection) {
  EvaHeads e;
  auto opt = optimize_checked(e.b.g, kPasses);
  ASSERT_EQ(count(*opt, "RotaryEmbedding"), 1);
  const Node* r = find_op(*opt, "RotaryEmbedding");
  EXPECT_EQ(r->input(0)->name, "qkv");
  EXPECT_EQ(r->attrs.get_int("num_heads", 0), 3 * kH);
  EXPECT_EQ(r->attrs.get_int("kiln_head_begin", -1), 0);
  EXPECT_EQ(r->attrs.get_int("kiln_head_end", -1), 2 * kH);
  EXPECT_EQ(r->attrs.get_int("interleaved", 0), 1);
  // The caches hold the prefix row: cos 1 and sin 0.
  ASSERT_TRUE(r->input(1)->is_constant());
  const Tensor& c = *r->input(1)->constant;
  ASSERT_EQ(c.shape(), (std::vector<int64_t>{kN, kD / 2}));
  EXPECT_EQ(c.data<float>()[0], 1.f);
  EXPECT_EQ(r->input(2)->constant->data<float>()[0], 0.f);
  EXPECT_EQ(count(*opt, "Concat"), 0);
}

TEST(RotaryForms, HeadsAlsoReadUnrotatedKeepTheirRotary) {
  // Q's heads are read before the rotation too: rotating them in the projection would change
  // that reader, so the rotaries stay on the heads (rotary_before_heads says why).
  EvaHeads e(/*q_also_read_unrotated=*/true);
  bool changed = false;
  auto g = e.b.g.clone();
  pass_notes(*g, "fuse_rotary", passes::fuse_rotary, &changed);
  EXPECT_TRUE(changed);
  const auto notes = pass_notes(*g, "rotary_before_heads", passes::rotary_before_heads, &changed);
  EXPECT_TRUE(has_note(notes, "reads rotated heads")) << dump_notes(notes);
  auto opt = optimize_checked(e.b.g, kPasses);
  EXPECT_EQ(count(*opt, "RotaryEmbedding"), 2);
  for (const Node* n : opt->nodes()) {
    if (n->op_type == "RotaryEmbedding") {
      EXPECT_EQ(n->input(0)->type.rank(), 4);
    }
  }
}

}  // namespace
}  // namespace kiln::test
