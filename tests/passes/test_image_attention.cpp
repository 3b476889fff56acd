// image_attention: timm's Attention2d (CoAtNet's and MaxViT's "rw" blocks) reads Q, K and
// V channel-first from a 1x1 convolution whose heads interleave their parts, and merges the heads
// back into an image. After the pass, fold_attention_heads folds it into one packed
// kiln.MultiHeadAttention (checked against the unfused graph on the CPU); parts that reach no
// attention, or a projection read elsewhere, stay.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kC = 8, kH = 3, kW = 4, kG = 2, kD = 4;

Value* perm(G& b, Value* x, std::vector<int64_t> p) {
  return b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
}
Value* reshape(G& b, Value* x, std::vector<int64_t> s) {
  return b.op("Reshape", {x, b.c(ints(s))});
}

// x [B, C, H, W] -> qkv = Conv1x1 [B, G*3*D, H, W] -> view [B, G, 3*D, H*W] -> chunk(3, dim 2);
// attn = softmax(q^T k * scale + bias); y = (v @ attn^T).view(B, G*D, H, W)
void attention2d(G& b, bool attend, bool qkv_read_elsewhere) {
  Value* x = b.in("x", {kB, kC, kH, kW});
  Value* qkv = b.op("Conv", {x, b.c(rand_t({kG * 3 * kD, kC, 1, 1})), b.c(rand_t({kG * 3 * kD}))});
  Value* v4 = reshape(b, qkv, {kB, kG, 3 * kD, kH * kW});
  Node* sp =
      b.node("Split", {v4, b.c(ints({kD, kD, kD}))}, attrs({{"axis", Attribute::Int(2)}}), 3);
  if (!attend) {
    for (size_t i = 0; i < 3; ++i) b.out(b.op("Relu", {sp->output(i)}));
    return;
  }
  Value* q = perm(b, sp->output(0), {0, 1, 3, 2});  // [B, G, S, D]
  Value* kt = sp->output(1);                        // [B, G, D, S]
  Value* s = b.op("Add", {b.op("Mul", {b.op("MatMul", {q, kt}), b.cf(0.5f)}),
                          b.c(rand_t({1, kG, kH * kW, kH * kW}))});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  // As TorchScript exports v @ attn^T: (attn @ v^T)^T, [B, G, D, S]
  Value* o = perm(b, b.op("MatMul", {pr, perm(b, sp->output(2), {0, 1, 3, 2})}), {0, 1, 3, 2});
  Value* y = reshape(b, o, {kB, kG * kD, kH, kW});
  b.out(b.op("Relu", {y}));
  if (qkv_read_elsewhere) b.out(b.op("Sigmoid", {qkv}));
}

const std::vector<std::string> kPasses = {"fuse_attention", "slices_to_split", "image_attention",
                                          "fold_attention_heads", "eliminate_dead_code"};

TEST(ImageAttention, Attention2dFoldsIntoOnePackedLayer) {
  G b;
  attention2d(b, true, false);
  auto opt = optimize_checked(b.g, kPasses);
  ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*opt, "Attention"), 0);
  for (const Node* n : opt->nodes())
    if (n->op_type == "MultiHeadAttention") {
      EXPECT_EQ(n->attrs.get_int("packed", 0), 1);
      EXPECT_EQ(n->attrs.get_int("num_heads", 0), kG);
    }
}

TEST(ImageAttention, PartsThatReachNoAttentionStay) {
  G b;
  attention2d(b, false, false);
  auto opt = optimize_checked(b.g, kPasses);
  EXPECT_EQ(count(*opt, "Split"), 1);
  EXPECT_EQ(count(*opt, "Transpose"), 0);
}

TEST(ImageAttention, ProjectionReadElsewhereStays) {
  G b;
  attention2d(b, true, true);
  auto opt = optimize_checked(b.g, kPasses);
  EXPECT_EQ(count(*opt, "MultiHeadAttention"), 0);
  EXPECT_EQ(count(*opt, "Attention"), 1);
}

// MaxViT's window attention (channels-last): the qkv product over [B, h, w, C] windows, reshaped
// to [B, h*w, 3, G, D] and split as timm's Attention does: the product then runs over
// [B, h*w, C] rows and the attention folds into one packed layer.
TEST(ImageAttention, ProductOverWindowPixelsFoldsIntoOnePackedLayer) {
  G b;
  Value* x = b.in("x", {kB, kH, kW, kC});
  Value* qkv = b.op(
      "Add", {b.op("MatMul", {x, b.c(rand_t({kC, 3 * kG * kD}))}), b.c(rand_t({3 * kG * kD}))});
  Value* t =
      perm(b, reshape(b, qkv, {kB, kH * kW, 3, kG, kD}), {2, 0, 3, 1, 4});  // [3, B, G, S, D]
  Node* sp = b.node("Split", {t, b.c(ints({1, 1, 1}))}, attrs({{"axis", Attribute::Int(0)}}), 3);
  std::vector<Value*> p;
  for (size_t i = 0; i < 3; ++i) p.push_back(b.op("Squeeze", {sp->output(i), b.c(ints({0}))}));
  Value* s = b.op("Mul", {b.op("MatMul", {p[0], perm(b, p[1], {0, 1, 3, 2})}), b.cf(0.5f)});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = reshape(b, perm(b, b.op("MatMul", {pr, p[2]}), {0, 2, 1, 3}), {kB, kH, kW, kG * kD});
  b.out(b.op("Relu", {y}));
  auto opt = optimize_checked(b.g, kPasses);
  EXPECT_EQ(count(*opt, "MultiHeadAttention"), 1);
  EXPECT_EQ(count(*opt, "Attention"), 0);
}

}  // namespace
}  // namespace kiln::test
