// fold_attention_heads' layout walk: Q, K and V reached from a projection through any chain of
// layout ops (Reshape, Transpose, Squeeze, Unsqueeze, Gather of one index, Slice, Split) fold into
// kiln.MultiHeadAttention when the chain is provably a view of the heads, in either layout:
// nn.MultiheadAttention's sequence-first packed projection as PyTorch's dynamo export writes it
// becomes one packed, sequence-first layer, and timm's reshape/permute/unbind in every unbind
// form one packed layer (checked against the unfused graph on the CPU); a chain that mixes heads
// with positions, or is read elsewhere too, stays.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 2, kD = 4, kE = kH * kD;

Value* perm(G& b, Value* x, std::vector<int64_t> p) {
  return b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
}
Value* reshape(G& b, Value* x, std::vector<int64_t> s) { return b.op("Reshape", {x, b.c(ints(s))}); }

// torch's multi_head_attention_forward on a [S, B, E] input: one in-projection, the packed
// result unflattened, moved to the front and selected, each part split into B*H heads.
void build(G& b, bool mix_heads) {
  Value* x = b.in("x", {kS, kB, kE});
  Value* qkv = b.op("MatMul", {x, b.c(rand_t({kE, 3 * kE}))});
  Value* p = reshape(b, qkv, {kS, kB, 3, kE});
  p = b.op("Unsqueeze", {p, b.c(ints({0}))});
  p = perm(b, p, {3, 1, 2, 0, 4});
  p = b.op("Squeeze", {p, b.c(ints({3}))});
  auto part = [&](int64_t i) {
    Value* t = b.op("Gather", {p, b.c(Tensor::scalar<int64_t>(i))}, attrs({{"axis", Attribute::Int(0)}}));
    t = reshape(b, t, {kS, kB * kH, kD});
    // mix_heads: heads and positions swapped by a reshape that is not a view of the heads.
    t = mix_heads ? reshape(b, t, {kB * kH, kS, kD}) : perm(b, t, {1, 0, 2});
    return reshape(b, t, {kB, kH, kS, kD});
  };
  Value* q = part(0);
  Value* kt = perm(b, part(1), {0, 1, 3, 2});
  Value* v = part(2);
  Value* s = b.op("Mul", {b.op("MatMul", {q, kt}), b.cf(0.5f)});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b, b.op("MatMul", {pr, v}), {2, 0, 1, 3});  // [S, B, H, D]
  b.out(b.op("Relu", {reshape(b, y, {kS * kB, kE})}));
}

TEST(AttentionLayouts, SequenceFirstPackedProjectionIsOneLayer) {
  G b;
  build(b, false);
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*opt, "Gather") + count(*opt, "Transpose") + count(*opt, "Squeeze") +
                count(*opt, "Unsqueeze"),
            0);
  for (const Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
      EXPECT_EQ(n->attrs.get_int("seq_first", 0), 1);
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kH);
    }
}

TEST(AttentionLayouts, ChainThatMixesHeadsAndPositionsStays) {
  G b;
  build(b, true);
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "MultiHeadAttention"), 0);
}

// timm's Attention: qkv.reshape(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0), the unbind in
// each form the exporters write (Gather, Squeeze(Slice), Squeeze(Split)); `whole_too` also
// reads the permuted tensor whole, so part of its chain is not the attention's alone.
void timm(G& b, const std::string& form, bool whole_too) {
  Value* x = b.in("x", {kB, kS, kE});
  Value* qkv = b.op("MatMul", {x, b.c(rand_t({kE, 3 * kE}))});
  Value* t = perm(b, reshape(b, qkv, {kB, kS, 3, kH, kD}), {2, 0, 3, 1, 4});
  std::vector<Value*> parts;
  if (form == "split") {
    Node* sp = b.node("Split", {t, b.c(ints({1, 1, 1}))}, attrs({{"axis", Attribute::Int(0)}}), 3);
    for (size_t i = 0; i < 3; ++i) parts.push_back(b.op("Squeeze", {sp->output(i), b.c(ints({0}))}));
  } else {
    for (int64_t i = 0; i < 3; ++i)
      parts.push_back(form == "gather"
                          ? b.op("Gather", {t, b.c(Tensor::scalar<int64_t>(i))},
                                 attrs({{"axis", Attribute::Int(0)}}))
                          : b.op("Squeeze", {b.op("Slice", {t, b.c(ints({i})), b.c(ints({i + 1})),
                                                            b.c(ints({0}))}),
                                             b.c(ints({0}))}));
  }
  Value* s = b.op("Mul", {b.op("MatMul", {parts[0], perm(b, parts[1], {0, 1, 3, 2})}), b.cf(0.5f)});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b, b.op("MatMul", {pr, parts[2]}), {0, 2, 1, 3});
  b.out(b.op("Relu", {reshape(b, y, {kB, kS, kE})}));
  if (whole_too) b.out(b.op("Neg", {t}));
}

TEST(AttentionLayouts, EveryUnbindFormOfAPackedProjection) {
  for (const char* form : {"split", "slice", "gather"}) {
    G b;
    timm(b, form, false);
    ASSERT_TRUE(infer_shapes(b.g).ok()) << form;
    auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                      "eliminate_dead_code"});
    ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1) << form;
    EXPECT_EQ(count(*opt, "Split") + count(*opt, "Squeeze") + count(*opt, "Gather") +
                  count(*opt, "Slice") + count(*opt, "Transpose"),
              0)
        << form;
    EXPECT_EQ(find_op(*opt, "MultiHeadAttention")->attrs.get_int("packed", 0), 1) << form;
  }
}

TEST(AttentionLayouts, ChainReadElsewhereStaysForItsOtherReader) {
  // The permuted tensor is read whole as well (as a decoder returns its present K and V heads):
  // the attention still reads the projection in place, and the reshape and permute stay for
  // the other reader; the Gathers, read by the attention only, go.
  G b;
  timm(b, "gather", true);
  ASSERT_TRUE(infer_shapes(b.g).ok());
  auto opt = optimize_checked(b.g, {"fuse_attention", "fold_attention_heads",
                                    "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
  EXPECT_EQ(find_op(*opt, "MultiHeadAttention")->attrs.get_int("packed", 0), 1);
  EXPECT_EQ(count(*opt, "Transpose"), 1);
  EXPECT_EQ(count(*opt, "Gather"), 0);
}

// nn.MultiheadAttention with batch_first=True: [B, S, E] swapped to [S, B, E] in front of the
// in-projection and back after the out-projection; sink_transposes moves both swaps past the
// projections and the attention, where they meet and cancel_transposes removes them.
TEST(AttentionLayouts, BatchFirstModuleLosesItsSwaps) {
  G b;
  Value* x = b.in("x", {kB, kS, kE});
  Value* t = perm(b, x, {1, 0, 2});
  Value* qkv = b.op("MatMul", {t, b.c(rand_t({kE, 3 * kE}))});
  Value* y = b.g.add_node("MultiHeadAttention", "mha", {qkv, nullptr, nullptr, nullptr}, {"y"},
                          "kiln")
                 ->output(0);
  Node* mha = y->producer;
  mha->attrs.set("num_heads", Attribute::Int(kH));
  mha->attrs.set("packed", Attribute::Int(1));
  mha->attrs.set("seq_first", Attribute::Int(1));
  mha->attrs.set("scale", Attribute::Float(0.5f));
  Value* o = b.op("MatMul", {y, b.c(rand_t({kE, kE}))});
  b.out(b.op("Relu", {perm(b, o, {1, 0, 2})}));
  auto opt = optimize_checked(b.g, {"sink_transposes", "cancel_transposes", "remove_noops",
                                    "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Transpose"), 0);
  for (const Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("seq_first", 0), 0);
    }
}

// A transpose in front of a widening product with nothing after it to take the transpose stays
// where it moves the fewest bytes.
TEST(AttentionLayouts, TransposeBeforeAWideningProductStays) {
  G b;
  Value* x = b.in("x", {kB, kS, kE});
  Value* y = b.op("MatMul", {perm(b, x, {1, 0, 2}), b.c(rand_t({kE, 3 * kE}))});
  b.out(b.op("Relu", {y}));
  auto opt = optimize_checked(b.g, {"sink_transposes"});
  ASSERT_NE(find_op(*opt, "Transpose"), nullptr);
  EXPECT_EQ(find_op(*opt, "Transpose")->output(0)->uses()[0].first->op_type, "MatMul");
}

}  // namespace
}  // namespace kiln::test
