// fold_patch_conv: a vision transformer's patch embedding (a convolution whose kernel is its
// stride, flattened and transposed into [N, patches, K]) becomes a GEMM over the patches; other
// convolutions, and patch embeddings of small patches, stay as they are.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

struct Patch {
  int64_t n = 2, c = 3, hw = 32, k = 24, p = 16;
  std::vector<int64_t> stride = {};  // default: the kernel
  std::vector<int64_t> pads = {0, 0, 0, 0};
  bool bias = true;
  bool extra_use = false;  // the convolution's output also a graph output
};

// x [n, c, hw, hw] -> Conv(k, p x p, stride) -> Reshape [0, k, -1] -> Transpose(0, 2, 1)
void patch_embedding(G& b, const Patch& s) {
  Value* x = b.in("x", {s.n, s.c, s.hw, s.hw});
  std::vector<Value*> ins = {x, b.c(rand_t({s.k, s.c, s.p, s.p}))};
  if (s.bias) ins.push_back(b.c(rand_t({s.k})));
  const std::vector<int64_t> stride = s.stride.empty() ? std::vector<int64_t>{s.p, s.p} : s.stride;
  Value* y = b.op("Conv", ins,
                  attrs({{"kernel_shape", Attribute::Ints({s.p, s.p})},
                         {"strides", Attribute::Ints(stride)},
                         {"pads", Attribute::Ints(s.pads)}}));
  Value* flat = b.op("Reshape", {y, b.c(ints({0, s.k, -1}))});
  b.out(b.op("Transpose", {flat}, attrs({{"perm", Attribute::Ints({0, 2, 1})}})));
  if (s.extra_use) b.out(y);
}

TEST(FoldPatchConv, ViTPatchEmbeddingBecomesAGemmOverPatches) {
  for (bool bias : {true, false}) {
    G b;
    patch_embedding(b, {.bias = bias});
    auto opt = optimize_checked(b.g, {"fold_patch_conv"}, 1e-5);
    EXPECT_EQ(count(*opt, "Conv"), 0);
    ASSERT_EQ(count(*opt, "FusedGemm"), 1);
    EXPECT_EQ(count(*opt, "Transpose"), 1);
    EXPECT_EQ(count(*opt, "Reshape"), 2);
    for (const Node* n : opt->nodes()) {
      EXPECT_EQ(n->origin, "fold_patch_conv") << n->label();
      if (n->op_type == "FusedGemm") {
        EXPECT_EQ(n->attrs.get_string("base", ""), "MatMul");
        EXPECT_EQ(n->input(2) != nullptr, bias);
        EXPECT_EQ(n->input(1)->constant->shape(), (std::vector<int64_t>{3 * 16 * 16, 24}));
        EXPECT_EQ(*n->output(0)->type.static_shape(), (std::vector<int64_t>{2, 4, 24}));
      }
      if (n->op_type == "Transpose") {
        EXPECT_EQ(n->attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 4, 1, 3, 5}));
      }
    }
  }
}

TEST(FoldPatchConv, NonPatchConvolutionsAndSmallPatchesStay) {
  const std::vector<std::pair<const char*, Patch>> cases = {
      {"stride unlike the kernel", {.hw = 48, .stride = {8, 8}}},
      {"padding", {.pads = {1, 1, 1, 1}}},
      {"4x4 RGB patches (48 values)", {.hw = 16, .p = 4}},
      {"image not a multiple of the patch", {.hw = 40}},
      {"convolution output used elsewhere", {.extra_use = true}},
  };
  for (const auto& [what, s] : cases) {
    G b;
    patch_embedding(b, s);
    auto opt = optimize_checked(b.g, {"fold_patch_conv"}, 1e-5);
    EXPECT_EQ(count(*opt, "Conv"), 1) << what;
    EXPECT_EQ(count(*opt, "FusedGemm"), 0) << what;
  }
}

}  // namespace
}  // namespace kiln::test
