// fold_gemm_reshape: a 2-D product over flattened rows becomes the batched FusedGemm (GPT-2's
// Conv1D), also where the last Reshape splits N into heads at once (torch 2.5's dynamo export at
// static shapes): then the split stays, reading the batched product. Checked against the graph
// before on the CPU; a last Reshape that does not restore the leading dims stays.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

constexpr int64_t kB = 2, kS = 5, kK = 8, kN = 12;

// Reshape(MatMul(Reshape(x, [B*S, K]), W), to)
void flat_product(G& b, std::vector<int64_t> to) {
  Value* x = b.in("x", {kB, kS, kK});
  Value* flat = b.op("Reshape", {x, b.c(ints({kB * kS, kK}))});
  Value* p = b.op("MatMul", {flat, b.c(rand_t({kK, kN}))});
  b.out(b.op("Relu", {b.op("Reshape", {p, b.c(ints(std::move(to)))})}));
}

TEST(FoldGemmReshape, FlatProductRestoredBecomesOneGemm) {
  G b;
  flat_product(b, {kB, kS, kN});
  auto opt = optimize_checked(b.g, {"fold_gemm_reshape", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "FusedGemm"), 1);
  EXPECT_EQ(count(*opt, "MatMul"), 0);
  EXPECT_EQ(count(*opt, "Reshape"), 0);
}

TEST(FoldGemmReshape, HeadSplitOfTheFlatProductReadsTheBatchedProduct) {
  G b;
  flat_product(b, {kB, kS, 3, kN / 3});
  auto opt = optimize_checked(b.g, {"fold_gemm_reshape", "eliminate_dead_code"});
  ASSERT_EQ(count(*opt, "FusedGemm"), 1);
  EXPECT_EQ(count(*opt, "MatMul"), 0);
  ASSERT_EQ(count(*opt, "Reshape"), 1);  // the head split
  const Node* g = find_op(*opt, "FusedGemm");
  EXPECT_EQ(g->output(0)->type.rank(), 3);
}

TEST(FoldGemmReshape, LeadingDimsNotRestoredStay) {
  G b;
  flat_product(b, {kS, kB, kN});
  auto opt = optimize_checked(b.g, {"fold_gemm_reshape", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "FusedGemm"), 0);
}

}  // namespace
}  // namespace kiln::test
