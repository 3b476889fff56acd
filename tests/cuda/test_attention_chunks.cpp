// The chunk plan of kiln.Attention's batched-GEMM layer (layers/attention_chunks.h), on the host:
// every piece run as an attention of its own shapes at its offsets must give the whole problem's
// Y exactly, write each element of Y once, and fit the workspace limit. The attention here is a
// plain double-precision loop with numpy broadcasting, standing in for the layer's GEMM ->
// softmax -> GEMM (whose chunks test-backend-ops runs on the GPU: the *_chunked cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backends/cuda/layers/attention_chunks.h"

namespace kiln::gpu {
namespace {

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// `shape` with leading 1s to `rank` dims.
std::vector<int64_t> pad(std::vector<int64_t> shape, size_t rank) {
  shape.insert(shape.begin(), rank - shape.size(), 1);
  return shape;
}

// The element offset of batch index `idx` (over Y's batch dims) in an operand of `shape` (its
// last two dims the matrix), broadcast numpy-style.
int64_t batch_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  const std::vector<int64_t> p = pad(shape, idx.size() + 2);
  int64_t off = 0, stride = p[idx.size()] * p[idx.size() + 1];
  for (size_t d = idx.size(); d-- > 0;) {
    if (p[d] != 1) off += idx[d] * stride;
    stride *= p[d];
  }
  return off;
}

// Y = softmax(Q Kt * 0.3 + mask) V over `s`'s shapes, reading and writing at the pointers;
// `writes` counts the writes of each Y element.
void reference_attention(const AttentionShapes& s, const double* q, const double* k,
                         const double* v, const double* m, double* y, int* writes) {
  const size_t r = s.y.size() - 2;
  const int64_t S = s.q[s.q.size() - 2], D = s.q.back(), T = s.k.back(), Dv = s.v.back();
  const std::vector<int64_t> mp = pad(s.mask, std::max<size_t>(s.mask.size(), 2));
  const int64_t ms = mp[mp.size() - 2], mt = mp.back();
  std::vector<int64_t> idx(r, 0);
  std::vector<double> row(static_cast<size_t>(T));
  const int64_t batches = numel(std::vector<int64_t>(s.y.begin(), s.y.end() - 2));
  for (int64_t b = 0; b < batches; ++b) {
    for (size_t d = r, rem = static_cast<size_t>(b); d-- > 0;) {
      idx[d] = static_cast<int64_t>(rem % static_cast<size_t>(s.y[d]));
      rem /= static_cast<size_t>(s.y[d]);
    }
    const double* qb = q + batch_offset(s.q, idx);
    const double* kb = k + batch_offset(s.k, idx);
    const double* vb = v + batch_offset(s.v, idx);
    const double* mb = s.masked ? m + batch_offset(mp, idx) : nullptr;
    const int64_t yo = batch_offset(s.y, idx);
    for (int64_t i = 0; i < S; ++i) {
      double mx = -INFINITY, sum = 0;
      for (int64_t t = 0; t < T; ++t) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += qb[i * D + d] * kb[d * T + t];
        acc *= 0.3;
        if (mb) acc += mb[(ms == 1 ? 0 : i) * mt + (mt == 1 ? 0 : t)];
        row[t] = acc;
        mx = std::max(mx, acc);
      }
      for (int64_t t = 0; t < T; ++t) sum += row[t] = std::exp(row[t] - mx);
      for (int64_t j = 0; j < Dv; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < T; ++t) acc += row[t] / sum * vb[t * Dv + j];
        y[yo + i * Dv + j] = acc;
        ++writes[yo + i * Dv + j];
      }
    }
  }
}

// Score cells of a piece: its scores' batch (Q's, Kt's and the mask's broadcast) x Sq x Sk.
int64_t score_cells(const AttentionShapes& s) {
  const size_t r = s.y.size() - 2;
  int64_t n = s.q[s.q.size() - 2] * s.k.back();
  const std::vector<int64_t> q = pad(s.q, r + 2), k = pad(s.k, r + 2);
  const std::vector<int64_t> m = s.masked ? pad(s.mask, r + 2) : std::vector<int64_t>(r + 2, 1);
  for (size_t d = 0; d < r; ++d) n *= std::max({q[d], k[d], m[d]});
  return n;
}

// Runs `s` whole and in the pieces planned for `limit`; returns the plan.
AttentionChunks check_pieces(const AttentionShapes& s, size_t score_size, size_t prob_size,
                             size_t limit, std::mt19937_64& rng) {
  auto plan = plan_attention_chunks(s, score_size, prob_size, limit, "node 'a'");
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  if (!plan.ok()) return {};
  std::uniform_real_distribution<double> u(-2, 2);
  auto random = [&](const std::vector<int64_t>& shape) {
    std::vector<double> x(static_cast<size_t>(numel(shape)));
    for (double& e : x) e = u(rng);
    return x;
  };
  const auto q = random(s.q), k = random(s.k), v = random(s.v), m = random(s.mask);
  const size_t ny = static_cast<size_t>(numel(s.y));
  std::vector<double> whole(ny, NAN), pieces(ny, NAN);
  std::vector<int> w1(ny, 0), w2(ny, 0);
  reference_attention(s, q.data(), k.data(), v.data(), m.data(), whole.data(), w1.data());
  for (int64_t i = 0; i < plan->count(); ++i) {
    const AttentionChunks::Offsets o = plan->at(i);
    const AttentionShapes& p = o.tail ? plan->tail : plan->full;
    EXPECT_EQ(score_cells(p), o.tail ? plan->tail_cells : plan->full_cells);
    EXPECT_LE(attention_workspace(score_cells(p), score_size, prob_size), plan->workspace);
    reference_attention(p, q.data() + o.q, k.data() + o.k, v.data() + o.v, m.data() + o.mask,
                        pieces.data() + o.y, w2.data() + o.y);
  }
  EXPECT_LE(plan->workspace, limit);
  for (size_t i = 0; i < ny; ++i) {
    if (w2[i] != 1 || pieces[i] != whole[i]) {
      ADD_FAILURE() << "Y element " << i << ": written " << w2[i] << " times, " << pieces[i]
                    << " vs the whole problem's " << whole[i];
      break;
    }
  }
  return *plan;
}

AttentionShapes shapes(std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v,
                       std::vector<int64_t> y) {
  return {std::move(q), std::move(k), std::move(v), {}, std::move(y), false};
}
AttentionShapes masked(std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v,
                       std::vector<int64_t> y, std::vector<int64_t> mask) {
  return {std::move(q), std::move(k), std::move(v), std::move(mask), std::move(y), true};
}

TEST(AttentionChunks, WholeWhenItFits) {
  const AttentionShapes s = masked({2, 3, 5, 8}, {2, 3, 8, 6}, {2, 3, 6, 4}, {2, 3, 5, 4}, {6});
  auto p = plan_attention_chunks(s, 4, 0, 1 << 20, "node 'a'");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->count(), 1);
  EXPECT_FALSE(p->chunked());
  EXPECT_EQ(p->full.q, s.q);  // the layer plans the whole from its own shapes, as before
  EXPECT_EQ(p->full.mask, s.mask);
  EXPECT_EQ(p->workspace, attention_workspace(2 * 3 * 5 * 6, 4, 0));
}

// SD 1.5's full-resolution self-attention in an FP32 engine (mha.unfused: [2, 8, 4096, 40]
// heads, the copies of Q, K, V and Y beside the scores under the 1 GiB limit): two pieces of 8
// heads, 512 MiB of scores each.
TEST(AttentionChunks, StableDiffusionSelfAttentionFp32) {
  const size_t copies = 4 * size_t{2 * 8 * 4096 * 40} * 4;
  const AttentionShapes s =
      shapes({2, 8, 4096, 40}, {2, 8, 40, 4096}, {2, 8, 4096, 40}, {2, 8, 4096, 40});
  auto p = plan_attention_chunks(s, 4, 0, (size_t(1) << 30) - copies, "node 'a'");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->axis, 0u);
  EXPECT_EQ(p->count(), 2);
  EXPECT_EQ(p->full.q, (std::vector<int64_t>{1, 8, 4096, 40}));
  EXPECT_EQ(p->workspace, size_t(512) << 20);
  EXPECT_EQ(p->at(1).q, 8 * 4096 * 40);
  EXPECT_EQ(p->at(1).k, 8 * 40 * 4096);
}

TEST(AttentionChunks, EvenPiecesAlongHeads) {
  std::mt19937_64 rng(1);
  // 3 heads of 37 x 45 float32 scores (6660 bytes each), 2 at a time under 16 KiB: per batch, a
  // piece of 2 heads and one of 1.
  const AttentionShapes s = shapes({2, 3, 37, 8}, {2, 3, 8, 45}, {2, 3, 45, 5}, {2, 3, 37, 5});
  const AttentionChunks p = check_pieces(s, 4, 0, 16 << 10, rng);
  EXPECT_EQ(p.axis, 1u);
  EXPECT_EQ(p.count(), 4);
  EXPECT_EQ(p.step, 2);
  EXPECT_EQ(p.last, 1);
  // Float16: float32 scores and float16 probabilities, one head a piece.
  const AttentionChunks h = check_pieces(s, 4, 2, 16 << 10, rng);
  EXPECT_EQ(h.count(), 6);
}

TEST(AttentionChunks, QueryRowsWhereOneHeadDoesNotFit) {
  std::mt19937_64 rng(2);
  // A key-padding mask [B, 1, 1, Sk]; 53 x 300 scores per head, 6 rows (7200 bytes) under 8 KiB:
  // 9 pieces of 6, 6, .., 5 rows per head.
  const AttentionShapes pad_mask =
      masked({2, 2, 53, 16}, {2, 2, 16, 300}, {2, 2, 300, 7}, {2, 2, 53, 7}, {2, 1, 1, 300});
  const AttentionChunks p = check_pieces(pad_mask, 4, 0, 8 << 10, rng);
  EXPECT_EQ(p.axis, 2u);
  EXPECT_EQ(p.count(), 4 * 9);
  EXPECT_EQ(p.step, 6);
  EXPECT_EQ(p.last, 5);
  EXPECT_EQ(p.full.mask, (std::vector<int64_t>{1, 300}));
  check_pieces(pad_mask, 4, 2, 8 << 10, rng);
  // A causal mask [1, 1, S, S]: each piece reads its own rows of it.
  const AttentionShapes causal =
      masked({1, 2, 70, 8}, {1, 2, 8, 70}, {1, 2, 70, 3}, {1, 2, 70, 3}, {1, 1, 70, 70});
  const AttentionChunks c = check_pieces(causal, 4, 0, 4 << 10, rng);
  EXPECT_EQ(c.full.mask, (std::vector<int64_t>{14, 70}));
  EXPECT_EQ(c.count(), 2 * 5);
}

TEST(AttentionChunks, BroadcastOperandsAndMasks) {
  std::mt19937_64 rng(3);
  // A full mask [B, H, Sq, Sk].
  check_pieces(masked({3, 4, 29, 8}, {3, 4, 8, 31}, {3, 4, 31, 7}, {3, 4, 29, 7}, {3, 4, 29, 31}),
               4, 0, 8 << 10, rng);
  // Kt and V shared by the heads; a row mask [Sk].
  check_pieces(masked({2, 3, 17, 8}, {2, 1, 8, 19}, {2, 1, 19, 5}, {2, 3, 17, 5}, {19}), 4, 2,
               2 << 10, rng);
  // V wider than the scores (their batch [1, 3], Y's [2, 3]): the scores of a piece are made
  // again for each index of Y's first axis.
  check_pieces(shapes({1, 3, 11, 8}, {1, 3, 8, 13}, {2, 3, 13, 4}, {2, 3, 11, 4}), 4, 0, 1 << 10,
               rng);
  // The mask widens the batch (Q, Kt and V shared by 4 of its entries).
  check_pieces(masked({2, 1, 9, 4}, {2, 1, 4, 12}, {2, 1, 12, 3}, {2, 4, 9, 3}, {1, 4, 9, 12}), 8,
               0, 2 << 10, rng);
  // 3-D and 2-D problems; a scalar mask.
  check_pieces(masked({5, 33, 12}, {5, 12, 41}, {5, 41, 9}, {5, 33, 9}, {33, 41}), 4, 0, 12 << 10,
               rng);
  check_pieces(masked({40, 6}, {6, 50}, {50, 2}, {40, 2}, {}), 8, 0, 2 << 10, rng);
}

TEST(AttentionChunks, RandomProblems) {
  std::mt19937_64 rng(4);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 300; ++iter) {
    const size_t r = static_cast<size_t>(pick(0, 3));
    std::vector<int64_t> batch(r);
    for (int64_t& d : batch) d = pick(1, 4);
    // Each operand keeps a batch dim or broadcasts it, and may drop leading dims.
    auto operand = [&](int64_t rows, int64_t cols) {
      std::vector<int64_t> s;
      const size_t drop = static_cast<size_t>(pick(0, static_cast<int64_t>(r)));
      for (size_t d = drop; d < r; ++d) s.push_back(pick(0, 2) ? batch[d] : 1);
      s.push_back(rows);
      s.push_back(cols);
      return s;
    };
    const int64_t S = pick(1, 20), T = pick(1, 20), D = pick(1, 6), Dv = pick(1, 5);
    AttentionShapes s;
    s.q = operand(S, D);
    s.k = operand(D, T);
    s.v = operand(T, Dv);
    s.masked = pick(0, 1) == 1;
    if (s.masked) {
      s.mask = operand(pick(0, 1) ? S : 1, pick(0, 1) ? T : 1);
      s.mask.erase(s.mask.begin(), s.mask.begin() + pick(0, 2));
    }
    // Y's batch: the broadcast of all (a dim every operand broadcast stays 1).
    s.y.assign(r, 1);
    for (const auto* x : {&s.q, &s.k, &s.v, &s.mask}) {
      if (x == &s.mask && !s.masked) continue;
      const std::vector<int64_t> p = pad(*x, r + 2);
      for (size_t d = 0; d < r; ++d) s.y[d] = std::max(s.y[d], p[d]);
    }
    s.y.push_back(S);
    s.y.push_back(Dv);
    const size_t sizes[3][2] = {{4, 0}, {4, 2}, {8, 0}};
    const auto& z = sizes[pick(0, 2)];
    const size_t row = attention_workspace(T, z[0], z[1]);
    const size_t whole = attention_workspace(score_cells(s), z[0], z[1]);
    const size_t limit = static_cast<size_t>(
        pick(static_cast<int64_t>(row), static_cast<int64_t>(std::max(row, whole))));
    SCOPED_TRACE(::testing::Message() << "iteration " << iter << ", limit " << limit);
    check_pieces(s, z[0], z[1], limit, rng);
  }
}

TEST(AttentionChunks, OneRowThatDoesNotFitIsAnError) {
  const AttentionShapes s = shapes({1, 2, 4, 8}, {1, 2, 8, 4096}, {1, 2, 4096, 8}, {1, 2, 4, 8});
  auto p = plan_attention_chunks(s, 4, 0, 8 << 10, "node 'attn' (Attention, #3)");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "node 'attn' (Attention, #3): one query row's scores over 4096 keys need 16.0 KiB of "
            "workspace, over the limit of 8.0 KiB (raise it: --mem-pool-size workspace:N)");
}

}  // namespace
}  // namespace kiln::gpu
