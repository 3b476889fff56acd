// Gemm and MatMul: known values, random cases against a direct triple loop, C broadcasting,
// numpy MatMul promotion/broadcasting, integer types, the Gemm-6 upgrade, inference and errors.
#include <cmath>

#include "ops/gemm.h"
#include "ops/op_test_util.h"

namespace kiln::test {
namespace {

// Direct Y = alpha * op(A) op(B) + beta * C (C broadcast through strides cs).
std::vector<double> naive_gemm(const Tensor& a, const Tensor& b, const Tensor* c, bool ta,
                               bool tb, double alpha, double beta) {
  const int64_t M = a.dim(ta ? 1 : 0), K = a.dim(ta ? 0 : 1), N = b.dim(tb ? 0 : 1);
  std::vector<double> y;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += a.at_double(ta ? k * M + i : i * K + k) * b.at_double(tb ? j * K + k : k * N + j);
      double cv = 0;
      if (c) {
        const auto& cs = c->shape();
        const int64_t ci = cs.size() == 2 ? (cs[0] == 1 ? 0 : i) : 0;
        const int64_t cj = cs.empty() ? 0 : (cs.back() == 1 ? 0 : j);
        cv = c->at_double(cs.size() == 2 ? ci * cs[1] + cj : cj);
      }
      y.push_back(alpha * s + beta * cv);
    }
  return y;
}

TEST(Gemm, KnownValues) {
  Tensor a = Tensor::from<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = Tensor::from<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor c = Tensor::from<float>({2}, {10, 20});
  auto r = run_op("Gemm", {&a, &b, &c},
                  attrs({{"alpha", Attribute::Float(2.f)}, {"beta", Attribute::Float(0.5f)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_inferred_matches(r);
  expect_values(r.outputs[0], {2 * 4 + 5, 2 * 5 + 10, 2 * 10 + 5, 2 * 11 + 10});
}

TEST(Gemm, RandomTransposesAlphaBetaAndCBroadcast) {
  const int64_t M = 5, K = 7, N = 4;
  const std::vector<std::vector<int64_t>> c_shapes = {{}, {1}, {N}, {M, 1}, {1, N}, {M, N}};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (size_t ci = 0; ci <= c_shapes.size(); ++ci) {
        Tensor a = random_tensor(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K});
        Tensor b = random_tensor(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N});
        const bool has_c = ci < c_shapes.size();
        Tensor c = has_c ? random_tensor(c_shapes[ci]) : Tensor();
        const Attributes at = attrs({{"transA", Attribute::Int(ta)},
                                     {"transB", Attribute::Int(tb)},
                                     {"alpha", Attribute::Float(0.75f)},
                                     {"beta", Attribute::Float(-1.5f)}});
        auto r = run_op("Gemm", {&a, &b, has_c ? &c : nullptr}, at);
        ASSERT_TRUE(r.status.ok()) << r.status.message();
        expect_inferred_matches(r);
        ASSERT_EQ(r.outputs[0].shape(), (std::vector<int64_t>{M, N}));
        expect_values(r.outputs[0], naive_gemm(a, b, has_c ? &c : nullptr, ta, tb, 0.75, -1.5),
                      1e-4, 1e-4);
      }
}

TEST(Gemm, DtypesIntegersAndLargeBlocks) {
  Tensor a = random_tensor({3, 300}), b = random_tensor({300, 600}), c = random_tensor({600});
  auto ref = run_op("Gemm", {&a, &b, &c}, {});
  ASSERT_TRUE(ref.status.ok());
  expect_values(ref.outputs[0], naive_gemm(a, b, &c, false, false, 1, 1), 1e-4, 1e-4);
  for (DataType dt : {DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    Tensor ac = a.cast(dt), bc = b.cast(dt), cc = c.cast(dt);
    auto r = run_op("Gemm", {&ac, &bc, &cc}, {});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    const double tol = dt == DataType::kFloat64 ? 1e-4 : 0.25;  // sums of 300 products
    for (int64_t i = 0; i < r.outputs[0].numel(); ++i)
      EXPECT_NEAR(r.outputs[0].at_double(i), ref.outputs[0].at_double(i), tol);
  }
  Tensor ai = Tensor::from<int32_t>({2, 2}, {1, -2, 3, 4});
  Tensor bi = Tensor::from<int32_t>({2, 2}, {5, 6, -7, 8});
  Tensor ci = Tensor::from<int32_t>({2, 1}, {100, 200});
  auto r = run_op("Gemm", {&ai, &bi, &ci}, attrs({{"transB", Attribute::Int(1)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt32);
  expect_values(r.outputs[0], {100 + 5 - 12, 100 - 7 - 16, 200 + 15 + 24, 200 - 21 + 32});
  Tensor a64 = Tensor::from<int64_t>({1, 2}, {3, 4});
  Tensor b64 = Tensor::from<int64_t>({2, 1}, {5, 6});
  r = run_op("Gemm", {&a64, &b64}, attrs({{"alpha", Attribute::Float(2.f)}}));
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  expect_values(r.outputs[0], {78});
  // Integer alpha/beta scaling truncates toward zero and saturates to the type's range.
  Tensor au = Tensor::from<uint32_t>({1, 1}, {5}), bu = Tensor::from<uint32_t>({1, 1}, {3});
  r = run_op("Gemm", {&au, &bu}, attrs({{"alpha", Attribute::Float(-1.f)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].data<uint32_t>()[0], 0u);
  r = run_op("Gemm", {&au, &bu}, attrs({{"alpha", Attribute::Float(0.5f)}}));
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].data<uint32_t>()[0], 7u);
}

TEST(Gemm, OldOpsetBroadcastAttributeIsDropped) {
  Graph g;
  Value* a = g.add_value("a", TensorType(DataType::kFloat32, {2, 3}));
  Value* b = g.add_value("b", TensorType(DataType::kFloat32, {3, 4}));
  Value* c = g.add_value("c", TensorType(DataType::kFloat32, {4}));
  Node* n = g.add_node("Gemm", "gemm", {a, b, c}, {"y"});
  n->attrs.set("broadcast", Attribute::Int(1));
  const OpDef* def = find_op("", "Gemm");
  ASSERT_NE(def->upgrade, nullptr);
  ImportContext ictx(g, *n, 6);
  ASSERT_TRUE(def->upgrade(ictx).ok());
  EXPECT_FALSE(n->attrs.has("broadcast"));
  // Without C the model is invalid before opset 11, valid from 11 on.
  Node* no_c = g.add_node("Gemm", "gemm_no_c", {a, b}, {"y2"});
  ImportContext old_ctx(g, *no_c, 9);
  EXPECT_FALSE(def->upgrade(old_ctx).ok());
  ImportContext new_ctx(g, *no_c, 11);
  EXPECT_TRUE(def->upgrade(new_ctx).ok());
  // Then a Gemm-6 style call (C broadcast along rows) runs like the canonical one.
  Tensor ta = random_tensor({2, 3}), tb = random_tensor({3, 4}), tc = random_tensor({4});
  auto r = run_op("Gemm", {&ta, &tb, &tc}, n->attrs);
  ASSERT_TRUE(r.status.ok());
  expect_values(r.outputs[0], naive_gemm(ta, tb, &tc, false, false, 1, 1), 1e-5, 1e-5);
}

TEST(Gemm, ErrorsAndInference) {
  Tensor a = random_tensor({2, 3}), b = random_tensor({4, 5}), c = random_tensor({3, 5});
  EXPECT_FALSE(run_op("Gemm", {&a, &b}, {}).status.ok());  // K 3 vs 4
  Tensor b2 = random_tensor({3, 5});
  EXPECT_FALSE(run_op("Gemm", {&a, &b2, &c}, {}).status.ok());  // C [3,5] vs Y [2,5]
  Tensor v = random_tensor({3});
  EXPECT_FALSE(run_op("Gemm", {&v, &b2}, {}).status.ok());  // A not 2-D
  Tensor bi = b2.cast(DataType::kInt32);
  EXPECT_FALSE(run_op("Gemm", {&a, &bi}, {}).status.ok());  // mixed types
  const TensorType av(DataType::kFloat32, {Dim::sym("B"), 3});
  auto out =
      infer("Gemm", {av, TensorType(DataType::kFloat32, {7, 3})}, attrs({{"transB", Int(1)}}));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[B,7]");
  // B of unknown rank: M still known.
  out = infer("Gemm", {av, TensorType::unknown_rank(DataType::kFloat32)}, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[B,?]");
}

TEST(GemmF32, ReusableKernelBetaZeroIgnoresC) {
  const int64_t M = 3, N = 700, K = 300;  // crosses the block sizes
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = random_tensor(ta ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K});
      Tensor b = random_tensor(tb ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N});
      std::vector<float> c(M * N, std::nanf(""));
      gemm_f32(ta, tb, M, N, K, 1.f, a.data<float>(), b.data<float>(), 0.f, c.data());
      const auto want = naive_gemm(a, b, nullptr, ta, tb, 1, 0);
      for (int64_t i = 0; i < M * N; ++i) ASSERT_NEAR(c[i], want[i], 1e-4 * (1 + std::fabs(want[i])));
      std::vector<float> c2(M * N, 1.f);
      gemm_f32(ta, tb, M, N, K, 2.f, a.data<float>(), b.data<float>(), 3.f, c2.data());
      for (int64_t i = 0; i < M * N; ++i)
        ASSERT_NEAR(c2[i], 2 * want[i] + 3, 2e-4 * (1 + std::fabs(want[i])));
    }
}

// --- MatMul ----------------------------------------------------------------------------------

TEST(MatMul, NumpyPromotionAndBroadcasting) {
  struct Case {
    std::vector<int64_t> a, b, out;
  };
  const std::vector<Case> cases = {
      {{3}, {3}, {}},          {{3}, {3, 4}, {4}},        {{2, 3}, {3}, {2}},
      {{2, 3}, {3, 4}, {2, 4}}, {{5, 2, 3}, {3, 4}, {5, 2, 4}}, {{3}, {2, 3, 4}, {2, 4}},
      {{2, 1, 2, 3}, {5, 3, 2}, {2, 5, 2, 2}}, {{2, 3}, {6, 3, 0}, {6, 2, 0}},
      {{0, 2, 3}, {3, 4}, {0, 2, 4}},
  };
  for (const Case& c : cases) {
    Tensor a = random_tensor(c.a), b = random_tensor(c.b);
    auto r = run_op("MatMul", {&a, &b}, {});
    ASSERT_TRUE(r.status.ok()) << r.status.message();
    expect_inferred_matches(r);
    ASSERT_EQ(r.outputs[0].shape(), c.out);
    // Independent check: promote, broadcast batch dims, dot products.
    std::vector<int64_t> as = c.a, bs = c.b;
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
    const size_t rank = std::max(as.size(), bs.size());
    as.insert(as.begin(), rank - as.size(), 1);
    bs.insert(bs.begin(), rank - bs.size(), 1);
    std::vector<int64_t> batch;
    for (size_t d = 0; d + 2 < rank; ++d) batch.push_back(std::max(as[d], bs[d]));
    int64_t nb = 1;
    for (int64_t d : batch) nb *= d;
    int64_t out_i = 0;
    for (int64_t bi = 0; bi < nb; ++bi) {
      int64_t oa = 0, ob = 0, rem = bi, sa = 1, sb = 1;
      for (int64_t d = static_cast<int64_t>(batch.size()) - 1; d >= 0; --d) {
        const int64_t id = rem % batch[d];
        rem /= batch[d];
        oa += (as[d] == 1 ? 0 : id) * sa;
        ob += (bs[d] == 1 ? 0 : id) * sb;
        sa *= as[d];
        sb *= bs[d];
      }
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j, ++out_i) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k)
            s += a.at_double(oa * M * K + i * K + k) * b.at_double(ob * K * N + k * N + j);
          ASSERT_NEAR(r.outputs[0].at_double(out_i), s, 1e-5);
        }
    }
  }
}

TEST(MatMul, IntegerTypesWrapAndHalfFloats) {
  Tensor a = Tensor::from<int64_t>({2, 2}, {1, 2, 3, 4});
  Tensor b = Tensor::from<int64_t>({2}, {-1, 10});
  auto r = run_op("MatMul", {&a, &b}, {});
  ASSERT_TRUE(r.status.ok()) << r.status.message();
  EXPECT_EQ(r.outputs[0].dtype(), DataType::kInt64);
  expect_values(r.outputs[0], {19, 37});
  Tensor u = Tensor::from<uint32_t>({1, 2}, {4000000000u, 1});
  Tensor v = Tensor::from<uint32_t>({2, 1}, {2, 5});
  r = run_op("MatMul", {&u, &v}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].data<uint32_t>()[0], static_cast<uint32_t>(8000000005ull));
  Tensor i32 = Tensor::from<int32_t>({1, 1}, {-7});
  r = run_op("MatMul", {&i32, &i32}, {});
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.outputs[0].data<int32_t>()[0], 49);
  Tensor fa = random_tensor({2, 3, 4}), fb = random_tensor({4, 5});
  auto ref = run_op("MatMul", {&fa, &fb}, {});
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64}) {
    Tensor ac = fa.cast(dt), bc = fb.cast(dt);
    r = run_op("MatMul", {&ac, &bc}, {});
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.outputs[0].dtype(), dt);
    for (int64_t i = 0; i < r.outputs[0].numel(); ++i)
      EXPECT_NEAR(r.outputs[0].at_double(i), ref.outputs[0].at_double(i), 5e-2);
  }
}

TEST(MatMul, ErrorsAndSymbolicInference) {
  Tensor a = random_tensor({2, 3}), b = random_tensor({4, 2});
  EXPECT_FALSE(run_op("MatMul", {&a, &b}, {}).status.ok());
  Tensor s = Tensor::scalar<float>(1.f);
  EXPECT_FALSE(run_op("MatMul", {&s, &a}, {}).status.ok());
  Tensor x = random_tensor({2, 2, 3}), y = random_tensor({3, 3, 4});
  EXPECT_FALSE(run_op("MatMul", {&x, &y}, {}).status.ok());  // batch 2 vs 3
  Tensor bb = Tensor::from<bool>({3, 1}, {true, false, true});
  Tensor ab = Tensor::from<bool>({1, 3}, {true, true, true});
  EXPECT_FALSE(run_op("MatMul", {&ab, &bb}, {}).status.ok());
  auto out = infer("MatMul",
                   {TensorType(DataType::kFloat32, {Dim::sym("B"), Dim::sym("S"), 64}),
                    TensorType(DataType::kFloat32, {64, 32})},
                   {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ((*out)[0].str(), "float32[B,S,32]");
}

}  // namespace
}  // namespace kiln::test
