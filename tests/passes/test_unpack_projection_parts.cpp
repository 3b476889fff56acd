// unpack_projection_parts: the parts of a packed projection taken after one joint head split
// (timm's qkv.reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)), in the three forms the
// exporters write the unbind, become each part's own head split of a Split of the projection.
#include "pass_test_util.h"

namespace kiln::test {
namespace {

// qkv [2, 5, 3*2*4] -> [2, 5, 3, 2, 4] -> perm (2, 0, 3, 1, 4) -> parts by `form`; each part
// [2, 2, 5, 4] goes to an output through a Mul (so every part is used).
void packed(G& b, const std::string& form) {
  Value* qkv = b.in("qkv", {2, 5, 24});
  Value* r = b.op("Reshape", {qkv, b.c(ints({2, 5, 3, 2, 4}))});
  Value* t = b.op("Transpose", {r}, attrs({{"perm", Attribute::Ints({2, 0, 3, 1, 4})}}));
  std::vector<Value*> parts;
  if (form == "split") {
    Node* sp = b.node("Split", {t, b.c(ints({1, 1, 1}))}, attrs({{"axis", Attribute::Int(0)}}), 3);
    for (size_t i = 0; i < 3; ++i)
      parts.push_back(b.op("Squeeze", {sp->output(i), b.c(ints({0}))}));
  } else {
    for (int64_t i = 0; i < 3; ++i) {
      if (form == "gather") {
        parts.push_back(b.op("Gather", {t, b.c(Tensor::scalar<int64_t>(i))},
                             attrs({{"axis", Attribute::Int(0)}})));
      } else {  // slice
        Value* s = b.op("Slice", {t, b.c(ints({i})), b.c(ints({i + 1})), b.c(ints({0}))});
        parts.push_back(b.op("Squeeze", {s, b.c(ints({0}))}));
      }
    }
  }
  for (Value* p : parts) b.out(b.op("Mul", {p, b.cf(2.f)}));
}

TEST(UnpackProjectionParts, EveryUnbindForm) {
  for (const char* form : {"split", "slice", "gather"}) {
    G b;
    packed(b, form);
    ASSERT_TRUE(infer_shapes(b.g).ok()) << form;
    auto opt = optimize_checked(b.g, {"unpack_projection_parts"});
    EXPECT_EQ(count(*opt, "Split"), 1) << form;
    EXPECT_EQ(count(*opt, "Reshape"), 3) << form;
    EXPECT_EQ(count(*opt, "Transpose"), 3) << form;
    EXPECT_EQ(count(*opt, "Squeeze") + count(*opt, "Gather") + count(*opt, "Slice"), 0) << form;
    const Node* sp = find_op(*opt, "Split");
    ASSERT_NE(sp, nullptr);
    EXPECT_EQ(sp->attrs.get_int("axis", 0), 2) << form;  // the projection's last axis
    const Node* tr = find_op(*opt, "Transpose");
    EXPECT_EQ(tr->attrs.get_ints("perm"), (std::vector<int64_t>{0, 2, 1, 3})) << form;
  }
}

TEST(UnpackProjectionParts, OtherUsesStay) {
  G b;
  packed(b, "gather");
  // The head-split tensor read whole as well: not only selections.
  Value* t = nullptr;
  for (Node* n : b.g.nodes())
    if (n->op_type == "Transpose") t = n->output(0);
  b.out(b.op("Neg", {t}));
  ASSERT_TRUE(infer_shapes(b.g).ok());
  auto opt = optimize_checked(b.g, {"unpack_projection_parts"});
  EXPECT_EQ(count(*opt, "Split"), 0);
  EXPECT_EQ(count(*opt, "Gather"), 3);
}

}  // namespace
}  // namespace kiln::test
