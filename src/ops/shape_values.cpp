#include "ops/shape_values.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <string>

#include "ops/op.h"

namespace kiln {
namespace {

// A dim as a polynomial over symbols: a sum of terms, each a coefficient times a multiset of
// symbols ("2*N*S", "past+seq", "N-1"); `ok` false for an unknown dim. Canonical: terms sorted
// by their symbols (the constant last), equal ones merged, none with a zero coefficient.
struct Term {
  int64_t coef = 1;
  std::vector<std::string> syms;  // sorted
};
struct Poly {
  std::vector<Term> terms;
  bool ok = true;
};

bool plain_token(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool all_digits(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// Past these a polynomial is left unknown: products of sums grow their terms multiplicatively
// (fuzz_build writes such graphs), and no shape a model computes needs more.
constexpr size_t kMaxTerms = 8, kMaxFactors = 8;

Poly canonical(Poly p) {
  if (!p.ok) return p;
  if (p.terms.size() > kMaxTerms * kMaxTerms) return Poly{{}, false};
  std::sort(p.terms.begin(), p.terms.end(), [](const Term& a, const Term& b) {
    if (a.syms.empty() != b.syms.empty()) return b.syms.empty();  // the constant last
    return a.syms < b.syms;
  });
  std::vector<Term> merged;
  for (Term& t : p.terms) {
    if (!merged.empty() && merged.back().syms == t.syms) {
      if (__builtin_add_overflow(merged.back().coef, t.coef, &merged.back().coef)) return Poly{{}, false};
    } else {
      merged.push_back(std::move(t));
    }
  }
  p.terms.clear();
  for (Term& t : merged) {
    // INT64_MIN has no negation to print or subtract.
    if (t.syms.size() > kMaxFactors || t.coef == std::numeric_limits<int64_t>::min())
      return Poly{{}, false};
    if (t.coef != 0) p.terms.push_back(std::move(t));
  }
  if (p.terms.size() > kMaxTerms) return Poly{{}, false};
  return p;
}

// One term of a symbol ("2*N*S"), or nullopt when a factor is not a plain token or a number.
std::optional<Term> term_of(const std::string& s) {
  Term t;
  size_t start = 0;
  for (;;) {
    const size_t star = s.find('*', start);
    const std::string f = s.substr(start, star == std::string::npos ? star : star - start);
    if (all_digits(f)) {
      if (f.size() > 18 || __builtin_mul_overflow(t.coef, std::stoll(f), &t.coef)) return std::nullopt;
    } else if (plain_token(f)) {
      t.syms.push_back(f);
    } else {
      return std::nullopt;
    }
    if (star == std::string::npos) break;
    start = star + 1;
  }
  std::sort(t.syms.begin(), t.syms.end());
  return t;
}

Poly poly_of(const Dim& d) {
  if (d.is_static()) return canonical(Poly{{Term{d.value, {}}}, true});
  if (d.symbol.empty()) return Poly{{}, false};
  // "a + b - 2*c" (exporters write spaces) splits into signed terms; a symbol with any other
  // syntax ("((a*b)//c)") is one opaque factor.
  std::string s;
  for (char c : d.symbol)
    if (c != ' ') s += c;
  Poly p;
  size_t i = 0;
  while (i < s.size()) {
    int64_t sign = 1;
    if (s[i] == '+' || s[i] == '-') {
      sign = s[i] == '-' ? -1 : 1;
      ++i;
    }
    const size_t next = s.find_first_of("+-", i);
    const auto t = term_of(s.substr(i, next == std::string::npos ? next : next - i));
    if (!t) return Poly{{Term{1, {d.symbol}}}, true};
    p.terms.push_back(Term{sign * t->coef, t->syms});
    if (next == std::string::npos) break;
    i = next;
  }
  return canonical(std::move(p));
}

// A polynomial as a Dim: static when it is a constant that is a size (>= 0), a symbol otherwise
// ("2*N*S", "past+seq"), unknown for a negative constant or an unknown dim.
Dim dim_of(const Poly& p) {
  if (!p.ok) return Dim();
  if (p.terms.empty()) return Dim(0);
  if (p.terms.size() == 1 && p.terms[0].syms.empty())
    return p.terms[0].coef >= 0 ? Dim(p.terms[0].coef) : Dim();
  std::string s;
  for (const Term& t : p.terms) {
    if (t.coef < 0)
      s += "-";
    else if (!s.empty())
      s += "+";
    const int64_t c = t.coef < 0 ? -t.coef : t.coef;
    std::string term = c == 1 && !t.syms.empty() ? "" : std::to_string(c);
    for (const std::string& x : t.syms) term += (term.empty() ? "" : "*") + x;
    s += term;
  }
  return Dim::sym(s);
}

// a + sign * b.
Poly add_polys(const Poly& a, const Poly& b, int64_t sign) {
  if (!a.ok || !b.ok) return Poly{{}, false};
  Poly p = a;
  for (const Term& t : b.terms) p.terms.push_back(Term{sign * t.coef, t.syms});
  return canonical(std::move(p));
}

// A sum of sizes: no term subtracts (it is never negative, whatever its symbols are).
bool nonnegative(const Poly& p) {
  return p.ok && std::all_of(p.terms.begin(), p.terms.end(), [](const Term& t) { return t.coef > 0; });
}

bool int_like(DataType t) { return t == DataType::kBool || dtype_is_integer(t); }

// Elementwise f over two known vectors that broadcast (equal sizes, or one of size 1).
using Elems = std::vector<SymInt>;

template <typename F>
std::optional<Elems> elementwise(const std::optional<Elems>& a, const std::optional<Elems>& b,
                                 F f) {
  if (!a || !b) return std::nullopt;
  const size_t n = std::max(a->size(), b->size());
  if ((a->size() != n && a->size() != 1) || (b->size() != n && b->size() != 1)) return std::nullopt;
  Elems out;
  for (size_t i = 0; i < n; ++i)
    out.push_back(f((*a)[a->size() == 1 ? 0 : i], (*b)[b->size() == 1 ? 0 : i]));
  return out;
}

std::optional<std::vector<int64_t>> all_static(const std::optional<Elems>& v) {
  if (!v) return std::nullopt;
  std::vector<int64_t> out;
  for (const SymInt& d : *v) {
    if (!d.value) return std::nullopt;
    out.push_back(*d.value);
  }
  return out;
}

// Slice of a 1-D value: starts/ends/steps as ONNX clamps them (axis 0 only).
std::optional<Elems> slice_value(const Node& n) {
  auto data = known_shape_value(n.input(0));
  auto starts = all_static(known_shape_value(n.input(1)));
  auto ends = all_static(known_shape_value(n.input(2)));
  if (!data || !starts || !ends || starts->size() != 1 || ends->size() != 1) return std::nullopt;
  if (n.input(3)) {
    auto axes = all_static(known_shape_value(n.input(3)));
    if (!axes || axes->size() != 1 || ((*axes)[0] != 0 && (*axes)[0] != -1)) return std::nullopt;
  }
  int64_t step = 1;
  if (n.input(4)) {
    auto steps = all_static(known_shape_value(n.input(4)));
    if (!steps || steps->size() != 1 || (*steps)[0] == 0) return std::nullopt;
    step = (*steps)[0];
  }
  const int64_t len = static_cast<int64_t>(data->size());
  auto clampi = [&](int64_t v, int64_t lo, int64_t hi) {
    if (v < 0) v += len;
    return std::clamp(v, lo, hi);
  };
  Elems out;
  if (step > 0) {
    for (int64_t i = clampi((*starts)[0], 0, len), e = clampi((*ends)[0], 0, len); i < e; i += step)
      out.push_back((*data)[i]);
  } else {
    for (int64_t i = clampi((*starts)[0], -1, len - 1), e = clampi((*ends)[0], -1, len - 1); i > e;
         i += step)
      out.push_back((*data)[i]);
  }
  return out;
}

std::optional<Elems> gather_value(const Node& n) {
  auto data = known_shape_value(n.input(0));
  auto idx = all_static(known_shape_value(n.input(1)));
  if (!data || !idx || n.attrs.get_int("axis", 0) != 0) return std::nullopt;
  const int64_t len = static_cast<int64_t>(data->size());
  Elems out;
  for (int64_t i : *idx) {
    if (i < 0) i += len;
    if (i < 0 || i >= len) return std::nullopt;
    out.push_back((*data)[i]);
  }
  return out;
}

SymInt arith(const std::string& op, const SymInt& a, const SymInt& b) {
  if (a.value && b.value) {
    const int64_t x = *a.value, y = *b.value;
    if (op == "Add") return SymInt::known(x + y);
    if (op == "Sub") return SymInt::known(x - y);
    if (op == "Mul") return SymInt::known(x * y);
    // ONNX's integer Div truncates toward zero, as C++ does.
    if (op == "Div") return y != 0 ? SymInt::known(x / y) : SymInt{};
    if (op == "Max") return SymInt::known(std::max(x, y));
    if (op == "Min") return SymInt::known(std::min(x, y));
    return SymInt{};
  }
  // A symbol is a size (>= 0); combined with a negative constant it is left unknown.
  if ((a.value && *a.value < 0) || (b.value && *b.value < 0)) return SymInt{};
  const Dim da = a.dim(), db = b.dim();
  if (op == "Mul") return SymInt::of(mul_dims(da, db));
  if (op == "Div") return SymInt::of(div_dims(da, db));
  if ((op == "Add" || op == "Sub") && b.value == 0) return a;
  if (op == "Add" && a.value == 0) return b;
  // Sums and differences of sizes as polynomials: a size less itself is 0 (GPT-2's causal-mask
  // slice starts at key_length - query_length), a KV cache's total length less its past is the
  // new tokens' (past + seq - past = seq).
  if (op == "Add") return SymInt::of(add_dims(da, db));
  if (op == "Sub") return SymInt::of(sub_dims(da, db));
  if ((op == "Max" || op == "Min") && same_dim(da, db)) return a;
  return SymInt{};
}

// Equal as 1/0: a size (a symbol, or a sum of them) never equals a negative constant.
SymInt equal_elems(const SymInt& a, const SymInt& b) {
  if (a.value && b.value) return SymInt::known(*a.value == *b.value ? 1 : 0);
  if ((a.value && *a.value < 0 && !b.symbol.empty() && nonnegative(poly_of(b.dim()))) ||
      (b.value && *b.value < 0 && !a.symbol.empty() && nonnegative(poly_of(a.dim()))))
    return SymInt::known(0);
  if (same_dim(a.dim(), b.dim())) return SymInt::known(1);
  return SymInt{};
}

std::optional<Elems> where_value(const Node& n) {
  auto c = all_static(known_shape_value(n.input(0)));
  auto x = known_shape_value(n.input(1));
  auto y = known_shape_value(n.input(2));
  if (!c || !x || !y) return std::nullopt;
  const size_t len = std::max({c->size(), x->size(), y->size()});
  for (size_t s : {c->size(), x->size(), y->size()})
    if (s != len && s != 1) return std::nullopt;
  Elems out;
  for (size_t i = 0; i < len; ++i) {
    const bool pick = (*c)[c->size() == 1 ? 0 : i] != 0;
    const auto& src = pick ? *x : *y;
    out.push_back(src[src.size() == 1 ? 0 : i]);
  }
  return out;
}

std::optional<Elems> constant_of_shape_value(const Node& n) {
  auto shape = all_static(known_shape_value(n.input(0)));
  if (!shape || shape->size() > 1) return std::nullopt;
  const int64_t count = shape->empty() ? 1 : (*shape)[0];
  if (count < 0 || count > kMaxShapeValueElements) return std::nullopt;
  int64_t fill = 0;
  if (const Tensor* t = n.attrs.get_tensor("value")) {
    if (!int_like(t->dtype()) || t->numel() != 1) return std::nullopt;
    fill = t->to_int64_vector()[0];
  }
  return Elems(count, SymInt::known(fill));
}

std::optional<Elems> value_of(const Node& n) {
  const std::string& op = n.op_type;
  const Value* x = n.input(0);
  if (op == "Shape") {
    if (!x || !x->type.has_rank()) return std::nullopt;
    const int64_t rank = x->type.rank();
    auto clampi = [&](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + rank : v, 0, rank); };
    const int64_t start = clampi(n.attrs.get_int("start", 0));
    const int64_t end = n.attrs.has("end") ? clampi(n.attrs.get_int("end", rank)) : rank;
    Elems out;
    for (int64_t k = start; k < end; ++k) out.push_back(SymInt::of((*x->type.dims)[k]));
    return out;
  }
  if (op == "Size") {
    if (!x || !x->type.has_rank()) return std::nullopt;
    Dim p(1);
    for (const Dim& d : *x->type.dims) p = mul_dims(p, d);
    return Elems{SymInt::of(p)};
  }
  if (op == "Identity" || op == "Squeeze" || op == "Unsqueeze" || op == "Reshape" ||
      op == "Flatten" || op == "Cast")
    return known_shape_value(x);
  if (op == "Gather") return gather_value(n);
  if (op == "Slice") return slice_value(n);
  if (op == "Concat") {
    Elems out;
    for (const Value* v : n.inputs()) {
      auto part = known_shape_value(v);
      if (!part) return std::nullopt;
      out.insert(out.end(), part->begin(), part->end());
    }
    return out;
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Max" || op == "Min") {
    if (n.num_inputs() != 2) return std::nullopt;
    return elementwise(known_shape_value(n.input(0)), known_shape_value(n.input(1)),
                       [&](const SymInt& a, const SymInt& b) { return arith(op, a, b); });
  }
  if (op == "Equal")
    return elementwise(known_shape_value(n.input(0)), known_shape_value(n.input(1)), equal_elems);
  if (op == "Where") return where_value(n);
  if (op == "ConstantOfShape") return constant_of_shape_value(n);
  return std::nullopt;
}

}  // namespace

Dim mul_dims(const Dim& a, const Dim& b) {
  if ((a.is_static() && a.value == 0) || (b.is_static() && b.value == 0)) return Dim(0);
  if (a.is_static() && b.is_static()) {
    int64_t v = 0;
    return __builtin_mul_overflow(a.value, b.value, &v) ? Dim() : Dim(v);
  }
  const Poly pa = poly_of(a), pb = poly_of(b);
  if (!pa.ok || !pb.ok) return Dim();
  Poly p;
  for (const Term& x : pa.terms)
    for (const Term& y : pb.terms) {
      Term t{0, x.syms};
      // A product past int64 is no size (fuzz_build: a Reshape of an input declared with huge dims).
      if (__builtin_mul_overflow(x.coef, y.coef, &t.coef)) return Dim();
      t.syms.insert(t.syms.end(), y.syms.begin(), y.syms.end());
      std::sort(t.syms.begin(), t.syms.end());
      p.terms.push_back(std::move(t));
    }
  return dim_of(canonical(std::move(p)));
}

namespace {

// One term over another ("6*B*past" over "2*past" is "3*B"), or nullopt where it does not divide.
std::optional<Term> divide_term(Term t, const Term& d) {
  if (d.coef <= 0 || t.coef % d.coef != 0) return std::nullopt;
  t.coef /= d.coef;
  for (const std::string& x : d.syms) {
    auto it = std::find(t.syms.begin(), t.syms.end(), x);
    if (it == t.syms.end()) return std::nullopt;
    t.syms.erase(it);
  }
  return t;
}

// a / b for a sum b ("past+seq"): the monomial m with a = m * b ("2*B*past+2*B*seq" over
// "past+seq" is "2*B"), else unknown. m is a's first term over one of b's, checked on the whole.
Dim div_by_sum(const Dim& a, const Poly& pa, const Dim& b, const Poly& pb) {
  if (pa.terms.size() != pb.terms.size()) return Dim();
  for (const Term& d : pb.terms) {
    const std::optional<Term> q = divide_term(pa.terms[0], d);
    if (!q || q->coef <= 0) continue;
    const Dim m = dim_of(Poly{{*q}, true});
    if (same_dim(a, mul_dims(m, b))) return m;
  }
  return Dim();
}

}  // namespace

Dim div_dims(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static())
    return b.value > 0 && a.value % b.value == 0 ? Dim(a.value / b.value) : Dim();
  const Poly pa = poly_of(a), pb = poly_of(b);
  if (!pa.ok || !pb.ok || pb.terms.empty()) return Dim();
  if (pb.terms.size() > 1) return div_by_sum(a, pa, b, pb);
  Poly p;
  for (const Term& t : pa.terms) {
    std::optional<Term> q = divide_term(t, pb.terms[0]);
    if (!q) return Dim();
    p.terms.push_back(std::move(*q));
  }
  return dim_of(canonical(std::move(p)));
}

// Static dims take the integer paths (no polynomial is built): the dynamic region infers shapes
// at every new shape, a Loop body's Concats each iteration.
Dim add_dims(const Dim& a, const Dim& b) {
  int64_t v = 0;
  if (a.is_static() && b.is_static()) return __builtin_add_overflow(a.value, b.value, &v) ? Dim() : Dim(v);
  return dim_of(add_polys(poly_of(a), poly_of(b), 1));
}
bool nonnegative_dim(const Dim& d) { return d.is_static() || (!d.symbol.empty() && nonnegative(poly_of(d))); }
Dim sub_dims(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return a.value >= b.value ? Dim(a.value - b.value) : Dim();
  return dim_of(add_polys(poly_of(a), poly_of(b), -1));
}

bool same_dim(const Dim& a, const Dim& b) {
  if (a.is_static() || b.is_static()) return a.is_static() && b.is_static() && a.value == b.value;
  const Poly pa = poly_of(a), pb = poly_of(b);
  if (!pa.ok || !pb.ok || pa.terms.size() != pb.terms.size()) return false;
  for (size_t i = 0; i < pa.terms.size(); ++i)
    if (pa.terms[i].coef != pb.terms[i].coef || pa.terms[i].syms != pb.terms[i].syms) return false;
  return true;
}

std::optional<std::vector<SymInt>> known_shape_value(const Value* v) {
  if (!v) return std::nullopt;
  if (v->constant) {
    const Tensor& t = *v->constant;
    if (!int_like(t.dtype()) || t.rank() > 1 || t.numel() > kMaxShapeValueElements)
      return std::nullopt;
    Elems out;
    for (int64_t x : t.to_int64_vector()) out.push_back(SymInt::known(x));
    return out;
  }
  return v->shape_value;
}

void propagate_shape_value(Node& n) {
  for (Value* v : n.outputs())
    if (v) v->shape_value.reset();
  Value* y = n.output(0);
  if (!y || (!n.domain.empty() && n.domain != "ai.onnx") || !int_like(y->type.dtype)) return;
  auto v = value_of(n);
  if (v && static_cast<int64_t>(v->size()) <= kMaxShapeValueElements) y->shape_value = std::move(v);
}

}  // namespace kiln
