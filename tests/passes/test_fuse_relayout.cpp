// fuse_relayout: a connected region of layout ops becomes one kiln.Relayout (checked against the
// unfused graph on the CPU by optimize_checked, which also runs the pass twice).
#include "pass_test_util.h"

namespace kiln::test {
namespace {

Value* slice(G& b, Value* x, int64_t start, int64_t end, int64_t axis) {
  return b.op("Slice", {x, b.c(ints({start})), b.c(ints({end})), b.c(ints({axis}))});
}
// torch.roll(x, -s, axis) as the exporters write it.
Value* roll(G& b, Value* x, int64_t s, int64_t n, int64_t axis) {
  return b.op("Concat", {slice(b, x, s, n, axis), slice(b, x, 0, s, axis)},
              attrs({{"axis", Attribute::Int(axis)}}));
}
// Swin's window partition of [B, 8, 8, C] into [B*4, 16, C].
Value* windows(G& b, Value* x, int64_t c) {
  Value* v = b.op("Reshape", {x, b.c(ints({-1, 2, 4, 2, 4, c}))});
  v = b.op("Transpose", {v}, attrs({{"perm", Attribute::Ints({0, 1, 3, 2, 4, 5})}}));
  return b.op("Reshape", {v, b.c(ints({-1, 16, c}))});
}

TEST(FuseRelayout, ShiftAndWindowPartitionBecomeOneLayer) {
  G b;
  Value* x = b.in("x", {2, 8, 8, 3});
  Value* shifted = roll(b, roll(b, b.op("Relu", {x}), 2, 8, 1), 2, 8, 2);
  b.out(b.op("Sigmoid", {windows(b, shifted, 3)}));
  auto opt = optimize_checked(b.g, {"fuse_relayout", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Relayout"), 1);
  for (const char* op : {"Slice", "Concat", "Reshape", "Transpose"}) EXPECT_EQ(count(*opt, op), 0) << op;
  const Node* r = find_op(*opt, "Relayout");
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->num_inputs(), 1u);  // the four slices read one tensor
  EXPECT_EQ(r->attrs.get_strings("ops").size(), 9u);
}

TEST(FuseRelayout, PadTransposeAndExpandJoinAcrossTwoInputs) {
  G b;
  Value* x = b.in("x", {3, 5, 7});
  Value* y = b.in("y", {3, 1, 7});
  Value* p = b.op("Pad", {x, b.c(ints({0, 1, 0, 0, 0, 2})), b.cf(0.5f)});  // [3, 6, 9]
  Value* t = b.op("Transpose", {b.op("Expand", {y, b.c(ints({3, 6, 7}))})},
                  attrs({{"perm", Attribute::Ints({0, 1, 2})}}));
  Value* cat = b.op("Concat", {slice(b, p, 0, 7, 2), t}, attrs({{"axis", Attribute::Int(0)}}));
  b.out(b.op("Relu", {cat}));
  auto opt = optimize_checked(b.g, {"fuse_relayout", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Relayout"), 1);
  EXPECT_EQ(find_op(*opt, "Relayout")->num_inputs(), 2u);
}

TEST(FuseRelayout, SharedValuesAndLoneCopiesStay) {
  G b;
  Value* x = b.in("x", {2, 8, 8, 3});
  // One copy among reshapes: already one kernel.
  b.out(b.op("Relu", {windows(b, x, 3)}));
  // The first roll's result is also a graph output, so it stays a tensor: the second roll cannot
  // take the first in, and each roll becomes a layer of its own.
  Value* r1 = roll(b, b.op("Tanh", {x}), 2, 8, 1);
  b.out(r1);
  b.out(b.op("Relu", {roll(b, r1, 2, 8, 2)}));
  auto opt = optimize_checked(b.g, {"fuse_relayout", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Relayout"), 2);
  EXPECT_EQ(count(*opt, "Transpose"), 1);
  EXPECT_EQ(count(*opt, "Concat"), 0);
}

TEST(FuseRelayout, ComputedParametersAreNotTaken) {
  G b;
  Value* x = b.in("x", {4, 6});
  Value* ends = b.op("Shape", {x});  // not a constant: the Slice stays out of any region
  Value* s = b.op("Slice", {b.op("Transpose", {x}), b.c(ints({0, 0})), ends});
  b.out(b.op("Relu", {b.op("Transpose", {s})}));
  auto opt = optimize_checked(b.g, {"fuse_relayout", "eliminate_dead_code"});
  EXPECT_EQ(count(*opt, "Relayout"), 0);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// A kiln.Relayout as an engine file could hold it, malformed: one clear error, no crash.
Status infer_relayout_graph(std::vector<std::string> ops, std::vector<int64_t> arity,
                            std::vector<int64_t> operands) {
  G b;
  Value* x = b.in("x", {2, 3});
  Node* n = b.g.add_node("Relayout", "bad", {x}, {"y"}, "kiln");
  n->attrs.set("ops", Attribute::Strings(std::move(ops)));
  n->attrs.set("arity", Attribute::Ints(std::move(arity)));
  n->attrs.set("operands", Attribute::Ints(std::move(operands)));
  b.out(n->output(0));
  return infer_shapes(b.g);
}

TEST(FuseRelayout, MalformedProgramsAreOneLineErrors) {
  EXPECT_TRUE(infer_relayout_graph({"Transpose", "Transpose"}, {1, 1}, {0, -2}).ok());
  const Status later = infer_relayout_graph({"Transpose", "Transpose"}, {1, 1}, {-3, 0});
  ASSERT_FALSE(later.ok());
  EXPECT_NE(later.message().find("refers to"), std::string::npos) << later.message();
  const Status op = infer_relayout_graph({"Relu"}, {1}, {0});
  ASSERT_FALSE(op.ok());
  EXPECT_NE(op.message().find("not a layout op"), std::string::npos) << op.message();
  const Status count = infer_relayout_graph({"Transpose"}, {1}, {0, 0});
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.message().find("arity adds up"), std::string::npos) << count.message();
  const Status input = infer_relayout_graph({"Transpose"}, {1}, {4});
  ASSERT_FALSE(input.ok());
  EXPECT_NE(input.message().find("refers to"), std::string::npos) << input.message();
}

}  // namespace
}  // namespace kiln::test
