// fuse_groupnorm_act: a GroupNorm takes its activation and a per-image, per-channel term added to
// its input (a diffusion UNet's timestep embedding) as one kiln.FusedGroupNorm; the graph computes
// what it did, and unfuse_layer splits the layer back into the same ops.
#include "ops/fused.h"
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Attributes gn_attrs(int64_t groups) {
  return attrs({{"num_groups", Attribute::Int(groups)}, {"epsilon", Attribute::Float(1e-5f)}});
}

// conv-like x [2, 6, 4, 5] (+ t) -> GroupNormalization(3 groups) -> act.
std::unique_ptr<Graph> norm_graph(std::vector<int64_t> t_shape, const std::string& act) {
  G b;
  Value* x = b.in("x", {2, 6, 4, 5});
  Value* h = b.op("Relu", {x});
  if (!t_shape.empty()) h = b.op("Add", {b.in("t", t_shape), h});
  Value* y = b.op("GroupNormalization", {h, b.c(rand_t({6})), b.c(rand_t({6}))}, gn_attrs(3));
  if (!act.empty()) y = b.op(act, {y});
  b.out(b.op("Neg", {y}));
  return b.g.clone();
}

TEST(FuseGroupNormAct, NormAndSwishBecomeOneLayer) {
  for (const char* act : {"Swish", "Relu", "Sigmoid"}) {
    auto opt = optimize_checked(*norm_graph({}, act), {"fuse_groupnorm_act"});
    const Node* n = find_kiln(*opt, "FusedGroupNorm");
    ASSERT_NE(n, nullptr) << act;
    EXPECT_EQ(n->attrs.get_string("activation", ""), act);
    EXPECT_EQ(n->attrs.get_int("num_groups", 0), 3);
    EXPECT_EQ(count(*opt, "GroupNormalization"), 0);
    EXPECT_EQ(count(*opt, act), std::string(act) == "Relu" ? 1 : 0) << act;  // x goes through a Relu
  }
}

TEST(FuseGroupNormAct, TimestepTermJoinsTheNorm) {
  // [N, C, 1, 1] (the UNet's embedding after time_emb_proj), [C, 1, 1] and [1, C, 1, 1].
  for (std::vector<int64_t> t : {std::vector<int64_t>{2, 6, 1, 1}, {6, 1, 1}, {1, 6, 1, 1}}) {
    for (const char* act : {"Swish", ""}) {
      auto opt = optimize_checked(*norm_graph(t, act), {"fuse_groupnorm_act"});
      const Node* n = find_kiln(*opt, "FusedGroupNorm");
      ASSERT_NE(n, nullptr);
      ASSERT_EQ(n->num_inputs(), 4u);
      EXPECT_EQ(n->input(3)->name, "t");
      EXPECT_EQ(n->input(0)->producer->op_type, "Relu");
      EXPECT_EQ(count(*opt, "Add"), 0);
      EXPECT_EQ(n->attrs.get_string("activation", ""), act);
    }
  }
}

TEST(FuseGroupNormAct, TermsThatVaryOverPixelsOrSharedSumsStay) {
  bool changed = false;
  auto g = norm_graph({2, 6, 4, 1}, "");  // varies along H: not one value per channel
  auto notes = pass_notes(*g, "fuse_groupnorm_act", passes::fuse_groupnorm_act, &changed);
  EXPECT_FALSE(changed);
  EXPECT_TRUE(has_note(notes, "no operand is one value per image and channel")) << dump_notes(notes);

  // The norm's output read twice: its activation stays apart.
  G b;
  Value* x = b.in("x", {2, 6, 4, 5});
  Value* y = b.op("GroupNormalization", {x, b.c(rand_t({6})), b.c(rand_t({6}))}, gn_attrs(2));
  b.out(b.op("Swish", {y}));
  b.out(y);
  auto opt = optimize_checked(b.g, {"fuse_groupnorm_act"});
  EXPECT_EQ(find_kiln(*opt, "FusedGroupNorm"), nullptr);
}

TEST(FuseGroupNormAct, PerGroupParametersStay) {
  G b;
  Value* x = b.in("x", {2, 6, 4, 5});
  Attributes a = gn_attrs(3);
  a.set("kiln_per_group", Attribute::Int(1));  // the opset-18 form
  b.out(b.op("Swish", {b.op("GroupNormalization", {x, b.c(rand_t({3})), b.c(rand_t({3}))}, a)}));
  auto opt = optimize_checked(b.g, {"fuse_groupnorm_act"});
  EXPECT_EQ(find_kiln(*opt, "FusedGroupNorm"), nullptr);
}

TEST(FuseGroupNormAct, UnfuseGivesTheOpsBack) {
  auto g = norm_graph({2, 6, 1, 1}, "Swish");
  auto opt = optimize_checked(*g, {"fuse_groupnorm_act"});
  Node* n = nullptr;
  for (Node* m : opt->nodes())
    if (m->op_type == "FusedGroupNorm") n = m;
  ASSERT_NE(n, nullptr);
  ASSERT_TRUE(unfuse_layer(*opt, n).ok());
  ASSERT_TRUE(infer_shapes(*opt).ok());
  EXPECT_EQ(find_kiln(*opt, "FusedGroupNorm"), nullptr);
  EXPECT_EQ(count(*opt, "Add"), 1);
  EXPECT_EQ(count(*opt, "GroupNormalization"), 1);
  EXPECT_EQ(count(*opt, "Swish"), 1);
  expect_same_outputs(*g, *opt, 1e-5);
}

}  // namespace
}  // namespace kiln::test
