// The layout walk (head_walk.h).
#include "passes/head_walk.h"

#include <algorithm>

#include "ops/shape_values.h"

namespace kiln::passes {
namespace {

// --- the layout walk ------------------------------------------------------------------------
// A chain of layout ops from a 3-D tensor x to a head tensor, followed as a strided view of x:
// every dim of the view is a list of factors (outer to inner), each a size and a stride that is
// a multiple of one of x's axes' strides, so a reshape that merges dims whose strides do not
// line up (nn.MultiheadAttention's [S, B*H, D]) stays exact. Sizes may be symbolic (a dynamic
// batch or sequence); reshapes regroup factors by comparing sizes symbolically.

struct Factor {
  Dim size;
  int axis = 0;      // x's axis whose stride this is a multiple of; -1: a repetition
  int64_t mult = 0;  // the stride in units of that axis's stride (0 for a repetition)
};
constexpr int kRepeat = -1;           // the axis of a stride-0 factor (Expand, Tile, copies)
using ViewDim = std::vector<Factor>;  // no factors: size 1

struct View {
  std::vector<ViewDim> dims;
  int64_t off[4] = {0, 0, 0, 0};  // per axis of x
};

bool unknown(const Dim& d) { return !d.is_static() && d.symbol.empty(); }
bool is_one(const Dim& d) { return d.is_static() && d.value == 1; }

// The dims' factors, outer to inner, without size-1 ones.
std::vector<Factor> flatten(const std::vector<ViewDim>& dims) {
  std::vector<Factor> f;
  for (const ViewDim& d : dims)
    for (const Factor& x : d)
      if (!is_one(x.size)) f.push_back(x);
  return f;
}

// The view reshaped to `to` (every dim known), splitting a static factor where a new dim ends
// inside it; false where the factors cannot be regrouped so (symbolic sizes that do not divide).
bool reshape(View& v, const std::vector<Dim>& to) {
  std::vector<Factor> flat = flatten(v.dims);
  std::vector<ViewDim> dims;
  size_t i = 0;
  for (const Dim& t : to) {
    if (unknown(t)) return false;
    ViewDim dim;
    Dim acc(1);
    while (!same_dim(acc, t)) {
      const Dim need = div_dims(t, acc);
      if (i == flat.size() || unknown(need)) return false;
      Factor& f = flat[i];
      if (!unknown(div_dims(need, f.size))) {  // the whole factor fits
        dim.push_back(f);
        acc = mul_dims(acc, f.size);
        ++i;
      } else if (f.size.is_static() && need.is_static() && f.size.value % need.value == 0) {
        const int64_t inner = f.size.value / need.value;  // the new dim ends inside f
        dim.push_back({need, f.axis, f.mult * inner});
        f.size = Dim(inner);
        acc = t;
      } else {
        return false;
      }
    }
    dims.push_back(std::move(dim));
  }
  if (i != flat.size()) return false;
  v.dims = std::move(dims);
  return true;
}

// The dim repeated `times` times as a whole (Tile's order: the copy index outermost).
void repeat_outer(ViewDim& dim, int64_t times) {
  if (times > 1) dim.insert(dim.begin(), Factor{Dim(times), kRepeat, 0});
}

// Gather of axis a with 1-D constant indices that repeat the axis's n elements: each r times in
// a row (repeat_interleave: i / r) or the whole axis r times (Tile: i % n).
bool gather_repeat(View& v, int64_t a, const Tensor& idx) {
  if (idx.rank() != 1) return false;
  std::vector<Factor> f;
  for (const Factor& x : v.dims[a])
    if (!is_one(x.size)) f.push_back(x);
  if (f.size() > 1 || (f.size() == 1 && !f[0].size.is_static())) return false;
  const int64_t n = f.empty() ? 1 : f[0].size.value, m = idx.numel();
  if (m % n != 0) return false;
  const int64_t rep = m / n;
  bool interleave = true, tile = true;
  for (int64_t i = 0; i < m; ++i) {
    int64_t j = idx.at_int(i);
    if (j < 0) j += n;
    interleave &= j == i / rep;
    tile &= j == i % n;
  }
  if (interleave) {
    if (rep > 1) f.push_back(Factor{Dim(rep), kRepeat, 0});
    v.dims[a] = f;
    return true;
  }
  if (!tile) return false;
  v.dims[a] = f;
  repeat_outer(v.dims[a], rep);
  return true;
}

// Expand to `out`'s (known) shape: a dim of size 1 broadcast to a larger one is a repetition.
bool expand(View& v, const Node& n, const Value* out) {
  const Value* in = n.input(0);
  if (!out->type.has_rank() || !in->type.has_rank()) return false;
  const std::vector<Dim>&od = *out->type.dims, &id = *in->type.dims;
  const size_t ro = od.size(), ri = id.size();
  if (ri != v.dims.size() || ro < ri) return false;
  std::vector<ViewDim> dims;
  for (size_t i = 0; i < ro; ++i) {
    const Dim& o = od[i];
    if (unknown(o)) return false;
    if (i < ro - ri) {  // a new leading dim
      dims.push_back(is_one(o) ? ViewDim{} : ViewDim{Factor{o, kRepeat, 0}});
      continue;
    }
    const size_t j = i - (ro - ri);
    if (same_dim(o, id[j])) {
      dims.push_back(v.dims[j]);
    } else if (is_one(id[j])) {
      dims.push_back({Factor{o, kRepeat, 0}});
    } else {
      return false;
    }
  }
  v.dims = std::move(dims);
  return true;
}

// Elements [b, b + len) of dim a of the view, where that is a view again: a range of one of its
// factors, the factors inside it whole and those outside it at one index each (their offsets
// added). A dim of one factor always is; GPT-NeoX's Q, K and V cut from heads whose parts were
// regrouped (regroup_head_parts) need the factors.
bool take_range(View& v, int64_t a, int64_t b, int64_t len) {
  std::vector<Factor> f;
  for (const Factor& x : v.dims[a])
    if (!is_one(x.size)) f.push_back(x);
  if (f.empty()) return b == 0 && len == 1;
  for (const Factor& x : f)
    if (!x.size.is_static()) return false;
  int64_t inner = 1;  // the size of the factors inside factor i
  for (size_t i = f.size(); i-- > 0; inner *= f[i].size.value) {
    if (len % inner || b % inner) continue;
    const int64_t m = len / inner, at = b / inner, n = f[i].size.value;
    if (at % n + m > n) continue;
    if (f[i].axis != kRepeat) v.off[f[i].axis] += (at % n) * f[i].mult;
    int64_t outer = at / n;  // the index of the factors outside, inner to outer
    for (size_t j = i; j-- > 0;) {
      const int64_t idx = outer % f[j].size.value;
      outer /= f[j].size.value;
      if (f[j].axis != kRepeat) v.off[f[j].axis] += idx * f[j].mult;
    }
    if (outer) return false;
    f[i].size = Dim(m);
    v.dims[a].assign(f.begin() + static_cast<std::ptrdiff_t>(i), f.end());
    return true;
  }
  return false;
}

// Applies layout op n (whose input is the view) to the view, as it makes `out`; false where it is
// not a layout op the walk knows or does not keep the view exact.
bool apply(View& v, const Node& n, const Value* out) {
  const int64_t r = static_cast<int64_t>(v.dims.size());
  if (is_op(&n, "Transpose")) {
    const std::vector<int64_t> p = transpose_perm(n);
    if (static_cast<int64_t>(p.size()) != r) return false;
    std::vector<ViewDim> d;
    for (int64_t a : p) d.push_back(v.dims[a]);
    v.dims = std::move(d);
    return true;
  }
  if (is_op(&n, "Reshape") || is_op(&n, "Flatten") || is_op(&n, "Squeeze") ||
      is_op(&n, "Unsqueeze")) {
    if (!out->type.has_rank()) return false;
    return reshape(v, *out->type.dims);  // each a reshape to its (known) output shape
  }
  if (is_op(&n, "Gather")) {  // one constant index of an axis, or a repetition of its elements
    const Value* idx = n.input(1);
    if (!idx || !idx->is_constant()) return false;
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r) return false;
    if (idx->constant->numel() != 1) return gather_repeat(v, a, *idx->constant);
    const ViewDim& dim = v.dims[a];
    std::vector<Factor> f;
    for (const Factor& x : dim)
      if (!is_one(x.size)) f.push_back(x);
    int64_t i = idx->constant->at_int(0);
    if (f.size() > 1) return false;
    if (!f.empty()) {
      if (!f[0].size.is_static()) return false;
      if (i < 0) i += f[0].size.value;
      if (i < 0 || i >= f[0].size.value) return false;
      if (f[0].axis != kRepeat) v.off[f[0].axis] += i * f[0].mult;
    } else if (i != 0 && i != -1) {
      return false;
    }
    if (idx->constant->rank() == 0)
      v.dims.erase(v.dims.begin() + a);
    else
      v.dims[a] = {};
    return true;
  }
  if (is_op(&n, "Split")) {  // one part: a range of one axis, after the parts before it
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r || !out->type.has_rank() || !(*out->type.dims)[a].is_static()) return false;
    int64_t begin = 0;
    for (size_t k = 0; k < n.num_outputs() && n.output(k) != out; ++k) {
      const Value* o = n.output(k);
      if (!o || !o->type.has_rank() || !(*o->type.dims)[a].is_static()) return false;
      begin += (*o->type.dims)[a].value;
    }
    return take_range(v, a, begin, (*out->type.dims)[a].value);
  }
  if (is_op(&n, "Expand")) return expand(v, n, out);
  if (is_op(&n, "Tile")) {
    const auto reps = known_shape_value(n.input(1));
    if (!reps || static_cast<int64_t>(reps->size()) != r) return false;
    for (int64_t a = 0; a < r; ++a) {
      if (!(*reps)[a].value || *(*reps)[a].value < 1) return false;
      repeat_outer(v.dims[a], *(*reps)[a].value);
    }
    return true;
  }
  if (is_op(&n, "Concat")) {  // copies of one tensor: a Tile of one axis
    int64_t a = n.attrs.get_int("axis", 0);
    if (a < 0) a += r;
    if (a < 0 || a >= r) return false;
    for (size_t i = 1; i < n.num_inputs(); ++i)
      if (n.input(i) != n.input(0)) return false;
    repeat_outer(v.dims[a], static_cast<int64_t>(n.num_inputs()));
    return true;
  }
  if (is_op(&n, "Slice")) {  // a step-1 range of one axis
    const auto sl = axis_slice(&n, r);
    if (!sl || sl->step != 1) return false;
    int64_t size = 1;
    for (const Factor& f : v.dims[sl->axis]) {
      if (!f.size.is_static()) return false;
      size *= f.size.value;
    }
    auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + size : x, int64_t{0}, size); };
    const int64_t b = clamp(sl->start), e = clamp(sl->end);
    return e > b && take_range(v, sl->axis, b, e - b);
  }
  return false;
}

}  // namespace

bool layout_op(const Node* n) {
  for (const char* op : {"Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Gather",
                         "Slice", "Split", "Expand", "Tile", "Concat"})
    if (is_op(n, op)) return true;
  return false;
}

namespace {

// The heads t4 reads when chain[0..n) (chain[0] makes t4) replays as a view of x, the input of
// chain[n - 1]; see walk_heads.
std::optional<Heads> heads_from(Value* t4, const char (&order)[5], const std::vector<Node*>& chain,
                                const std::vector<const Value*>& made, size_t n) {
  Value* x = n ? chain[n - 1]->input(0) : t4;
  if (!x->type.has_rank() || t4->type.rank() != 4) return std::nullopt;
  const int xr = static_cast<int>(x->type.rank());
  const std::vector<Dim>& xd = *x->type.dims;
  if ((xr != 3 && xr != 4) || !xd[xr - 1].is_static() || (xr == 4 && !xd[1].is_static()))
    return std::nullopt;
  View v;
  for (int a = 0; a < xr; ++a) v.dims.push_back({{xd[a], a, 1}});
  for (size_t i = n; i-- > 0;)
    if (!apply(v, *chain[i], made[i])) return std::nullopt;
  // One factor a dim (none: size 1), at the expected axes and strides.
  std::optional<Factor> at[4];
  int pos[4];  // b, h, s, d in t4's dims
  for (int i = 0; i < 4; ++i) pos[std::string("bhsd").find(order[i])] = i;
  int64_t rep = 1;  // the head dim's repetition: its innermost factor, of stride 0
  for (int i = 0; i < 4; ++i) {
    std::vector<Factor> f;
    for (const Factor& x : v.dims[pos[i]])
      if (!is_one(x.size)) f.push_back(x);
    if (i == 1 && !f.empty() && f.back().axis == kRepeat) {
      if (!f.back().size.is_static()) return std::nullopt;
      rep = f.back().size.value;
      f.pop_back();
    }
    // Any other repetition (of the batch, the sequence, or the heads in Tile's order) is not
    // grouped-query attention's.
    if (f.size() > 1 || (!f.empty() && f[0].axis == kRepeat)) return std::nullopt;
    if (!f.empty()) at[i] = f[0];
  }
  const auto& [fb, fh, fs, fd] = at;
  const std::vector<Dim>& td = *t4->type.dims;
  if (!td[pos[1]].is_static() || !td[pos[3]].is_static() || td[pos[1]].value % rep)
    return std::nullopt;
  const int64_t h = td[pos[1]].value / rep, d = td[pos[3]].value;
  if (xr == 4) {  // x's own heads, each axis whole and in place
    auto whole = [&](const std::optional<Factor>& f, int axis) {
      return f ? f->axis == axis && f->mult == 1 && same_dim(f->size, xd[axis]) : is_one(xd[axis]);
    };
    if (!whole(fb, 0) || !whole(fh, 1) || !whole(fs, 2) || !whole(fd, 3) || xd[1].value != h ||
        v.off[0] || v.off[1] || v.off[2] || v.off[3])
      return std::nullopt;
    Heads hs{x, h, d, rep, 0, false, true, {}};
    hs.nodes.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
    return hs;
  }
  if (!fd || fd->axis != 2 || fd->mult != 1 || (h > 1 && (!fh || fh->axis != 2 || fh->mult != d)))
    return std::nullopt;
  // The sequence's axis decides the layout; the batch has the other one, whole. Both of size 1
  // (one position of one sequence): batch-first.
  int s_axis = fs ? fs->axis : -1, b_axis = fb ? fb->axis : -1;
  if (s_axis < 0) s_axis = b_axis == 1 ? 0 : 1;
  if (b_axis < 0) b_axis = 1 - s_axis;
  if (s_axis == 2 || b_axis + s_axis != 1) return std::nullopt;
  if ((fs && (fs->mult != 1 || !same_dim(fs->size, xd[s_axis]))) ||
      (fb && (fb->mult != 1 || !same_dim(fb->size, xd[b_axis]))) || (!fs && !is_one(xd[s_axis])) ||
      (!fb && !is_one(xd[b_axis])))
    return std::nullopt;
  if (v.off[0] || v.off[1] || v.off[2] % d || v.off[2] + h * d > xd[2].value) return std::nullopt;
  Heads hs{x, h, d, rep, v.off[2], b_axis == 1, false, {}};
  hs.nodes.assign(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(n));
  return hs;
}

}  // namespace

std::vector<Heads> walk_heads(Value* t4, const char (&order)[5]) {
  std::vector<Node*> chain;
  std::vector<const Value*> made;  // what each op of the chain makes on the way
  Value* x = t4;
  while (x->producer && layout_op(x->producer) && x->producer->input(0)) {
    chain.push_back(x->producer);
    made.push_back(x);
    x = x->producer->input(0);
  }
  std::vector<Heads> found;
  for (size_t n = chain.size() + 1; n-- > 0;)  // n = 0: t4 is x (head-major)
    if (auto hs = heads_from(t4, order, chain, made, n)) found.push_back(std::move(*hs));
  return found;
}

}  // namespace kiln::passes
