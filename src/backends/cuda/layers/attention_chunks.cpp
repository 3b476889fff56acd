#include "layers/attention_chunks.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

namespace kiln::gpu {
namespace {

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

int64_t product(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t d = from; d < to; ++d) p *= v[d];
  return p;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest n in [1, most] whose `cells(n)` score cells fit `limit` (cells(1) fits).
template <typename F>
int64_t most_that_fit(int64_t most, F cells, size_t score_size, size_t prob_size, size_t limit) {
  const size_t per = static_cast<size_t>(cells(1)) * (score_size + prob_size);
  int64_t n = std::clamp<int64_t>(per ? static_cast<int64_t>(limit / per) : most, 1, most);
  // The estimate ignores the 256-byte alignment of each part: at most a step too many.
  while (n > 1 && attention_workspace(cells(n), score_size, prob_size) > limit) --n;
  return n;
}

}  // namespace

size_t attention_workspace(int64_t cells, size_t score_size, size_t prob_size) {
  const size_t c = static_cast<size_t>(cells);
  return align256(c * score_size) + (prob_size ? align256(c * prob_size) : 0);
}

std::string bytes_str(size_t bytes) {
  if (bytes >= (size_t(1) << 20)) return fmt::format("{:.1f} MiB", bytes / 1048576.0);
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{} bytes", bytes);
}

AttentionChunks::Offsets AttentionChunks::at(int64_t i) const {
  Offsets o;
  int64_t* off[5] = {&o.q, &o.k, &o.v, &o.mask, &o.y};
  const int64_t j = i % per_outer;
  int64_t rem = i / per_outer;
  for (size_t d = axis; d-- > 0;) {  // i's index over the batch dims before the axis
    const int64_t c = rem % batch[d];
    rem /= batch[d];
    for (int x = 0; x < 5; ++x) *off[x] += c * strides[x][d];
  }
  for (int x = 0; x < 5; ++x) *off[x] += j * step * strides[x][axis];
  o.tail = j == per_outer - 1 && last != step;
  return o;
}

Expected<AttentionChunks> plan_attention_chunks(const AttentionShapes& s, size_t score_size,
                                                size_t prob_size, size_t limit,
                                                const std::string& label) {
  AttentionChunks c;
  const size_t r = s.y.size() - 2;  // batch dims
  const bool has_mask = s.masked;
  for (const auto* x : {&s.q, &s.k, &s.v, &s.mask})
    if (x->size() > r + 2 || (x != &s.mask && x->size() < 2))
      return KILN_ERROR("{}: attention shapes of unexpected ranks", label);
  const int64_t S = s.q[s.q.size() - 2], T = s.k.back();
  c.batch.assign(s.y.begin(), s.y.end() - 2);
  // Each operand with the batch's rank (leading 1s), so that dim d is the batch's dim d.
  std::vector<int64_t> p[5];
  const std::vector<int64_t>* src[5] = {&s.q, &s.k, &s.v, &s.mask, &s.y};
  for (int x = 0; x < 5; ++x) {
    p[x].assign(r + 2 - src[x]->size(), 1);
    p[x].insert(p[x].end(), src[x]->begin(), src[x]->end());
  }
  // The scores' batch: Q's and Kt's broadcast, widened by the mask; V may widen Y's further.
  std::vector<int64_t> sb(r, 1);
  for (size_t d = 0; d < r; ++d)
    for (int x : {0, 1, 3})
      if (p[x][d] != 1) sb[d] = p[x][d];
  for (int x = 0; x < 5; ++x) {
    std::vector<int64_t> st(r + 2, 1);
    for (size_t d = r + 1; d-- > 0;) st[d] = st[d + 1] * p[x][d + 1];
    c.strides[x].assign(r + 1, 0);
    for (size_t d = 0; d < r; ++d) c.strides[x][d] = p[x][d] == 1 ? 0 : st[d];
    const bool rows = x == 0 || x == 4 || (x == 3 && p[3][r] != 1);  // Q, Y, a mask of rows
    c.strides[x][r] = rows ? st[r] : 0;
  }
  const int64_t total = product(sb, 0, r) * S * T;
  const size_t whole = attention_workspace(total, score_size, prob_size);
  if (total == 0 || product(c.batch, 0, r) == 0 || whole <= limit) {
    c.axis = 0;
    c.step = c.last = r ? c.batch[0] : S;
    c.full = c.tail = s;
    c.full_cells = c.tail_cells = total;
    c.workspace = whole;
    return c;
  }
  // The outermost axis whose later dims' scores fit: the fewest pieces, each a run along it.
  size_t a = 0;
  while (a < r && attention_workspace(product(sb, a + 1, r) * S * T, score_size, prob_size) > limit)
    ++a;
  const int64_t len = a < r ? c.batch[a] : S;
  std::function<int64_t(int64_t)> cells;
  if (a < r) {
    const int64_t trail = product(sb, a + 1, r) * S * T;
    cells = [trail, wide = sb[a] != 1](int64_t n) { return (wide ? n : 1) * trail; };
  } else {
    cells = [T](int64_t n) { return n * T; };
    if (attention_workspace(T, score_size, prob_size) > limit)
      return KILN_ERROR(
          "{}: one query row's scores over {} keys need {} of workspace, over the "
          "limit of {} (raise it: --mem-pool-size workspace:N)",
          label, T, bytes_str(attention_workspace(T, score_size, prob_size)), bytes_str(limit));
  }
  const int64_t most = most_that_fit(len, cells, score_size, prob_size, limit);
  // Even pieces: 16 heads that fit 15 at a time run as 8 + 8, not 15 + 1.
  c.axis = a;
  c.step = ceil_div(len, ceil_div(len, most));
  c.per_outer = ceil_div(len, c.step);
  c.outer = product(c.batch, 0, a);
  const int64_t last = c.last = len - (c.per_outer - 1) * c.step;
  auto piece = [&](int64_t n) {
    AttentionShapes ps;
    ps.masked = has_mask;
    std::vector<int64_t>* dst[5] = {&ps.q, &ps.k, &ps.v, &ps.mask, &ps.y};
    for (int x = 0; x < 5; ++x) {
      if (x == 3 && !has_mask) continue;
      if (a < r) {  // dims a.. of the operand, dim a cut to n where the operand has it
        dst[x]->assign(p[x].begin() + static_cast<std::ptrdiff_t>(a), p[x].end());
        if ((*dst[x])[0] != 1) (*dst[x])[0] = n;
      } else {  // one matrix each, n of Q's, Y's (and a mask's) rows
        dst[x]->assign(p[x].end() - 2, p[x].end());
        if (x == 0 || x == 4 || (x == 3 && (*dst[x])[0] != 1)) (*dst[x])[0] = n;
      }
    }
    return ps;
  };
  c.full = piece(c.step);
  c.tail = piece(last);
  c.full_cells = cells(c.step);
  c.tail_cells = cells(last);
  c.workspace = attention_workspace(c.full_cells, score_size, prob_size);
  return c;
}

}  // namespace kiln::gpu
