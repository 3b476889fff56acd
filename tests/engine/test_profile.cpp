// Optimization profiles: a dim the profile fixes (min == max) is static in the graph the passes
// see, with every other dim of its symbol, while the dims it lets range stay symbolic (a UNet
// built for a range of batches at one image size: its height and width are static, so its
// GroupNorm views and attention reshapes fold as they do at fixed shapes).
#include <gtest/gtest.h>

#include "engine/profile.h"
#include "ops/op.h"

namespace kiln {
namespace {

TEST(Profile, DimsTheProfileFixesBecomeStaticWithTheirSymbol) {
  Graph g;
  Value* x = g.add_value("x", TensorType(DataType::kFloat32, {Dim::sym("batch"), Dim(4),
                                                               Dim::sym("height"), Dim::sym("width")}));
  Value* c = g.add_value("c", TensorType(DataType::kFloat32, {Dim::sym("batch"), Dim::sym("seq"), Dim(8)}));
  Value* m = g.add_value("m", TensorType(DataType::kFloat32, {Dim::sym("height")}));
  for (Value* v : {x, c, m}) g.add_input(v);
  BuildConfig cfg;
  cfg.min_shapes = {{"x", {2, 4, 64, 64}}, {"c", {2, 77, 8}}};
  cfg.opt_shapes = {{"x", {8, 4, 64, 64}}, {"c", {8, 77, 8}}};
  cfg.max_shapes = {{"x", {16, 4, 64, 64}}, {"c", {16, 77, 8}}};
  auto p = Profile::from_config(g, cfg);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_TRUE(p->apply_static_shapes(g).ok());
  EXPECT_EQ(x->type.str(), TensorType(DataType::kFloat32, {Dim::sym("batch"), Dim(4), Dim(64), Dim(64)}).str());
  EXPECT_EQ(c->type.str(), TensorType(DataType::kFloat32, {Dim::sym("batch"), Dim(77), Dim(8)}).str());
  EXPECT_EQ(m->type.str(), TensorType(DataType::kFloat32, {Dim(64)}).str());  // height, bound by x

  // One symbol fixed to two sizes is an error.
  Graph h;
  Value* a = h.add_value("a", TensorType(DataType::kFloat32, {Dim::sym("n"), Dim(3)}));
  Value* b = h.add_value("b", TensorType(DataType::kFloat32, {Dim::sym("n")}));
  h.add_input(a);
  h.add_input(b);
  BuildConfig bad;
  bad.min_shapes = bad.opt_shapes = bad.max_shapes = {{"a", {2, 3}}, {"b", {5}}};
  auto q = Profile::from_config(h, bad);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_FALSE(q->apply_static_shapes(h).ok());
}

}  // namespace
}  // namespace kiln
