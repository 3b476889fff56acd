// regroup_head_parts: a projection whose heads interleave Q, K and V (GPT-NeoX's query_key_value
// viewed [B, S, H, 3*D] and cut into three) is reordered part-major at build time, so
// fold_attention_heads folds the attention into one packed kiln.MultiHeadAttention (checked
// against the unfused graph on the CPU); a cut read by no attention, or whose parts reach one input
// of it together (rotate_half's halves of a head), stays as it is.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kH = 2, kD = 4, kE = kH * kD;

Value* perm(G& b, Value* x, std::vector<int64_t> p) {
  return b.op("Transpose", {x}, attrs({{"perm", Attribute::Ints(std::move(p))}}));
}
Value* reshape(G& b, Value* x, std::vector<int64_t> s) {
  return b.op("Reshape", {x, b.c(ints(s))});
}
Value* slice_last(G& b, Value* x, int64_t start, int64_t end) {
  return b.op("Slice", {x, b.c(ints({start})), b.c(ints({end})), b.c(ints({-1}))});
}

// GPT-NeoX's attention: qkv = x W + b, viewed [B, S, H, 3D], transposed to [B, H, S, 3D] and
// cut into Q, K and V by a Split (dynamo) or three Slices (TorchScript's chunk); `attend`
// false reads the parts by elementwise ops instead of an attention.
void neox(G& b, bool slices, bool attend = true) {
  Value* x = b.in("x", {kB, kS, kE});
  Value* qkv = b.op("Add", {b.op("MatMul", {x, b.c(rand_t({kE, 3 * kE}))}), b.c(rand_t({3 * kE}))});
  Value* t = perm(b, reshape(b, qkv, {kB, kS, kH, 3 * kD}), {0, 2, 1, 3});
  std::vector<Value*> p;
  if (slices) {
    for (int64_t i = 0; i < 3; ++i) p.push_back(slice_last(b, t, i * kD, (i + 1) * kD));
  } else {
    Node* sp =
        b.node("Split", {t, b.c(ints({kD, kD, kD}))}, attrs({{"axis", Attribute::Int(-1)}}), 3);
    for (size_t i = 0; i < 3; ++i) p.push_back(sp->output(i));
  }
  if (!attend) {
    b.out(b.op("Add", {b.op("Mul", {p[0], p[1]}), p[2]}));
    return;
  }
  Value* s = b.op("Mul", {b.op("MatMul", {p[0], perm(b, p[1], {0, 1, 3, 2})}), b.cf(0.5f)});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  Value* y = perm(b, b.op("MatMul", {pr, p[2]}), {0, 2, 1, 3});
  b.out(b.op("Relu", {reshape(b, y, {kB, kS, kE})}));
}

const std::vector<std::string> kPasses = {"fuse_attention", "regroup_head_parts",
                                          "fold_attention_heads", "eliminate_dead_code"};

TEST(RegroupHeadParts, InterleavedQkvHeadsBecomeOnePackedAttention) {
  for (bool slices : {false, true}) {
    G b;
    neox(b, slices);
    auto opt = optimize_checked(b.g, kPasses);
    ASSERT_EQ(count(*opt, "MultiHeadAttention"), 1) << "slices " << slices;
    const Node* mha = find_kiln(*opt, "MultiHeadAttention");
    EXPECT_EQ(mha->attrs.get_int("packed", 0), 1);
    EXPECT_EQ(mha->attrs.get_int("num_heads", 0), kH);
    // It reads the product (its bias added) in place: no layout op is left.
    EXPECT_EQ(count(*opt, "Transpose") + count(*opt, "Split") + count(*opt, "Slice"), 0);
  }
}

TEST(RegroupHeadParts, PartsReadByNoAttentionStay) {
  G b;
  neox(b, false, /*attend=*/false);
  auto opt = optimize_checked(b.g, {"regroup_head_parts", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Transpose"), 1);  // no reorder, no view added
}

TEST(RegroupHeadParts, HalvesOfOneHeadStay) {
  // rotate_half cuts each head of Q into two halves that are rejoined before the attention: the
  // cut reaches the attention's Q only, so nothing is regrouped (that would only add a copy).
  G b;
  Value* x = b.in("x", {kB, kS, kE});
  Value* q = perm(b, reshape(b, b.op("MatMul", {x, b.c(rand_t({kE, kE}))}), {kB, kS, kH, kD}),
                  {0, 2, 1, 3});
  Value* rot =
      b.op("Concat", {b.op("Neg", {slice_last(b, q, kD / 2, kD)}), slice_last(b, q, 0, kD / 2)},
           attrs({{"axis", Attribute::Int(-1)}}));
  Value* k = perm(b, reshape(b, b.op("MatMul", {x, b.c(rand_t({kE, kE}))}), {kB, kS, kH, kD}),
                  {0, 2, 1, 3});
  Value* s = b.op("Mul", {b.op("MatMul", {rot, perm(b, k, {0, 1, 3, 2})}), b.cf(0.5f)});
  Value* pr = b.op("Softmax", {s}, attrs({{"axis", Attribute::Int(-1)}}));
  b.out(b.op("MatMul", {pr, k}));
  auto opt = optimize_checked(b.g, {"fuse_attention", "regroup_head_parts", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Transpose"), 3);  // q's, k's and K^T: no view added
}

}  // namespace
}  // namespace kiln::test
