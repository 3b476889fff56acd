// LSTM, GRU and RNN (opsets 7 and 14; 14 adds `layout`, 22 bfloat16; opsets 1 and 3 carried an
// `output_sequence` attribute the upgrade drops). One recurrent layer, per direction d, batch
// entry b and step over its valid time steps (all of X, or sequence_lens[b]; backwards for a
// reverse direction):
//
//   RNN:  H = f(clip(x W^T + H R^T + Wb + Rb))
//   GRU:  z = f(clip(x Wz^T + H Rz^T + Wbz + Rbz)),  r alike
//         h' = g(clip(x Wh^T + (r * H) Rh^T + Rbh + Wbh))      linear_before_reset = 0
//         h' = g(clip(x Wh^T + r * (H Rh^T + Rbh) + Wbh))      linear_before_reset = 1
//         H = (1 - z) * h' + z * H
//   LSTM: i = f(clip(x Wi^T + H Ri^T + Wbi + Rbi + Pi * C)),  f alike (or 1 - i with
//         input_forget), c' = g(clip(x Wc^T + H Rc^T + Wbc + Rbc)), C = f * C + i * c',
//         o = f(clip(x Wo^T + H Ro^T + Wbo + Rbo + Po * C)),  H = o * h(C)
//
// As onnxruntime does (the ONNX reference ignores sequence_lens): Y is zero at the steps past a
// sequence's length, Y_h and Y_c hold the state after its last valid step, and a sequence of
// length 0 gives zeros there too. clip bounds the activations' inputs (peephole terms included),
// not C. activation_alpha/beta are consumed in order by the activations that take them
// (onnxruntime's rule); a missing one takes the ONNX op's default (LeakyRelu 0.01, HardSigmoid
// 0.2/0.5, Elu 1, ThresholdedRelu 1, Affine 1/0, ScaledTanh 1/1).
//
// The reference computes in double and rounds once, to X's type, at the end.
#include "ops/rnn.h"

#include <algorithm>
#include <cctype>

#include "ops/op.h"

namespace kiln {

namespace {

struct ActInfo {
  const char* name;
  RnnAct kind;
  int params;         // how many of alpha, beta it takes
  float alpha, beta;  // their defaults
};

constexpr ActInfo kActs[] = {
    {"relu", RnnAct::kRelu, 0, 0.f, 0.f},
    {"tanh", RnnAct::kTanh, 0, 0.f, 0.f},
    {"sigmoid", RnnAct::kSigmoid, 0, 0.f, 0.f},
    {"affine", RnnAct::kAffine, 2, 1.f, 0.f},
    {"leakyrelu", RnnAct::kLeakyRelu, 1, 0.01f, 0.f},
    {"thresholdedrelu", RnnAct::kThresholdedRelu, 1, 1.f, 0.f},
    {"scaledtanh", RnnAct::kScaledTanh, 2, 1.f, 1.f},
    {"hardsigmoid", RnnAct::kHardSigmoid, 2, 0.2f, 0.5f},
    {"elu", RnnAct::kElu, 1, 1.f, 0.f},
    {"softsign", RnnAct::kSoftsign, 0, 0.f, 0.f},
    {"softplus", RnnAct::kSoftplus, 0, 0.f, 0.f},
};

const ActInfo* find_act(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const ActInfo& a : kActs)
    if (name == a.name) return &a;
  return nullptr;
}

}  // namespace

Expected<RnnSpec> read_rnn_spec(const Node& n) {
  RnnSpec s;
  s.cell = n.op_type == "LSTM"  ? RnnCell::kLstm
           : n.op_type == "GRU" ? RnnCell::kGru
                                : RnnCell::kRnn;
  s.hidden_size = n.attrs.get_int("hidden_size", 0);
  if (n.attrs.has("hidden_size") && (s.hidden_size <= 0 || s.hidden_size > kRnnMaxHidden))
    return KILN_ERROR("{}: hidden_size must be in [1, {}], got {}", n.label(), kRnnMaxHidden,
                      s.hidden_size);
  const std::string dir = n.attrs.get_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    return KILN_ERROR("{}: direction must be forward, reverse or bidirectional, got '{}'",
                      n.label(), dir);
  s.num_dirs = dir == "bidirectional" ? 2 : 1;
  s.reverse = dir == "reverse";
  const int64_t layout = n.attrs.get_int("layout", 0);
  if (layout != 0 && layout != 1)
    return KILN_ERROR("{}: layout must be 0 or 1, got {}", n.label(), layout);
  s.batch_first = layout == 1;
  if (n.attrs.has("clip")) {
    s.has_clip = true;
    s.clip = n.attrs.get_float("clip", 0.f);
    if (!(s.clip > 0.f)) return KILN_ERROR("{}: clip must be positive, got {}", n.label(), s.clip);
  }
  const int64_t forget = n.attrs.get_int("input_forget", 0);
  const int64_t lbr = n.attrs.get_int("linear_before_reset", 0);
  if ((forget != 0 && forget != 1) || (lbr != 0 && lbr != 1))
    return KILN_ERROR("{}: input_forget and linear_before_reset must be 0 or 1", n.label());
  s.input_forget = s.cell == RnnCell::kLstm && forget == 1;
  s.linear_before_reset = s.cell == RnnCell::kGru && lbr == 1;

  const int per = s.acts_per_dir();
  std::vector<std::string> names = n.attrs.get_strings("activations");
  if (names.empty()) {
    const char* defaults[] = {"Sigmoid", "Tanh", "Tanh"};
    if (s.cell == RnnCell::kRnn)
      names = {"Tanh"};
    else
      names.assign(defaults, defaults + per);
  }
  const size_t given = names.size();
  if (given != static_cast<size_t>(per) && given != static_cast<size_t>(per * s.num_dirs))
    return KILN_ERROR("{}: {} activations given, {} expects {} per direction", n.label(), given,
                      n.op_type, per);
  const std::vector<float> alphas = n.attrs.get_floats("activation_alpha");
  const std::vector<float> betas = n.attrs.get_floats("activation_beta");
  size_t ia = 0, ib = 0;
  for (size_t k = 0; k < given; ++k) {
    const ActInfo* a = find_act(names[k]);
    if (!a) return KILN_ERROR("{}: unknown activation '{}'", n.label(), names[k]);
    RnnActivation& f = s.acts[k];
    f.kind = a->kind;
    f.alpha = a->params >= 1 && ia < alphas.size() ? alphas[ia++] : a->alpha;
    f.beta = a->params >= 2 && ib < betas.size() ? betas[ib++] : a->beta;
  }
  for (size_t k = given; k < static_cast<size_t>(per * s.num_dirs); ++k)
    s.acts[k] = s.acts[k - given];  // one direction's list serves both
  return s;
}

namespace {

// Dim equality where both are known.
bool conflicts(const Dim& a, const Dim& b) {
  return a.is_static() && b.is_static() && a.value != b.value;
}

std::string dims_str(const std::vector<Dim>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ',';
    s += d[i].str();
  }
  return s + "]";
}

// The first known one of several candidates for one size.
Dim first_known(std::initializer_list<Dim> ds) {
  for (const Dim& d : ds)
    if (d.is_static()) return d;
  for (const Dim& d : ds)
    if (!d.symbol.empty()) return d;
  return Dim();
}

Dim div_dim(const Dim& d, int64_t k) {
  return d.is_static() && d.value % k == 0 ? Dim(d.value / k) : Dim();
}

}  // namespace

Expected<RnnSizes> rnn_sizes(const Node& n, const RnnSpec& s,
                             const std::vector<const std::vector<Dim>*>& shapes) {
  static const char* kNames[] = {"X",         "W",         "R", "B", "sequence_lens",
                                 "initial_h", "initial_c", "P"};
  auto shape = [&](size_t i) -> const std::vector<Dim>* {
    return i < shapes.size() ? shapes[i] : nullptr;
  };
  const size_t ranks[] = {3, 3, 3, 2, 1, 3, 3, 2};
  for (size_t i = 0; i < 8; ++i)
    if (shape(i) && shape(i)->size() != ranks[i])
      return KILN_ERROR("{}: {} must be {}-D, got {}", n.label(), kNames[i], ranks[i],
                        dims_str(*shape(i)));
  const int64_t G = s.gates(), D = s.num_dirs;
  const Dim none;
  auto at = [&](size_t i, size_t k) { return shape(i) ? (*shape(i))[k] : none; };
  RnnSizes z;
  z.seq = at(0, s.batch_first ? 1 : 0);
  z.batch = first_known({at(0, s.batch_first ? 0 : 1), at(4, 0), at(5, s.batch_first ? 0 : 1),
                         at(6, s.batch_first ? 0 : 1)});
  z.input = first_known({at(0, 2), at(1, 2)});
  z.hidden = s.hidden_size > 0 ? Dim(s.hidden_size)
                               : first_known({at(2, 2), div_dim(at(2, 1), G), div_dim(at(1, 1), G),
                                              div_dim(at(3, 1), 2 * G), at(5, 2)});
  const Dim& H = z.hidden;
  if (H.is_static() && (H.value <= 0 || H.value > kRnnMaxHidden))
    return KILN_ERROR("{}: the hidden size must be in [1, {}], got {}", n.label(), kRnnMaxHidden,
                      H.value);
  const Dim GH = H.is_static() ? Dim(G * H.value) : Dim();
  const Dim H3 = H.is_static() ? Dim(3 * H.value) : Dim();
  const Dim GH2 = H.is_static() ? Dim(2 * G * H.value) : Dim();
  auto state = [&] {
    return s.batch_first ? std::vector<Dim>{z.batch, D, H} : std::vector<Dim>{D, z.batch, H};
  };
  const std::vector<std::vector<Dim>> want = {
      s.batch_first ? std::vector<Dim>{z.batch, z.seq, z.input}
                    : std::vector<Dim>{z.seq, z.batch, z.input},
      {D, GH, z.input},
      {D, GH, H},
      {D, GH2},
      {z.batch},
      state(),
      state(),
      {D, H3},
  };
  for (size_t i = 0; i < 8; ++i) {
    if (!shape(i)) continue;
    for (size_t k = 0; k < want[i].size(); ++k)
      if (conflicts((*shape(i))[k], want[i][k]))
        return KILN_ERROR("{}: {} must be {}, got {}", n.label(), kNames[i], dims_str(want[i]),
                          dims_str(*shape(i)));
  }
  if (s.cell != RnnCell::kLstm && (shape(6) || shape(7)))
    return KILN_ERROR("{}: {} has no initial_c or P input", n.label(), n.op_type);
  return z;
}

Expected<RnnShape> rnn_shape(const Node& n, const RnnSpec& s,
                             const std::vector<const std::vector<int64_t>*>& shapes) {
  std::vector<std::vector<Dim>> dims(shapes.size());
  std::vector<const std::vector<Dim>*> ptrs(shapes.size(), nullptr);
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (!shapes[i]) continue;
    dims[i].assign(shapes[i]->begin(), shapes[i]->end());
    ptrs[i] = &dims[i];
  }
  if (shapes.empty() || !shapes[0] || shapes.size() < 3 || !shapes[1] || !shapes[2])
    return KILN_ERROR("{}: X, W and R are required", n.label());
  KILN_ASSIGN_OR_RETURN(RnnSizes z, rnn_sizes(n, s, ptrs));
  if (!z.hidden.is_static() || z.hidden.value <= 0)
    return KILN_ERROR("{}: the hidden size must be positive", n.label());
  return RnnShape{z.seq.value, z.batch.value, z.input.value, z.hidden.value};
}

namespace {

Status upgrade_rnn(ImportContext& ctx) {
  // Opsets 1-6: `output_sequence` only said whether Y was wanted, which its presence says now.
  ctx.node().attrs.erase("output_sequence");
  return Status::Ok();
}

Status check_float(const Node& n, DataType t, const char* what, DataType x) {
  if (t == DataType::kUndefined) return Status::Ok();
  if (!dtype_is_float(t))
    return KILN_ERROR("{}: {} must be a float type, got {}", n.label(), what, dtype_name(t));
  if (x != DataType::kUndefined && t != x)
    return KILN_ERROR("{}: {} must have X's type {}, got {}", n.label(), what, dtype_name(x),
                      dtype_name(t));
  return Status::Ok();
}

Status check_types(const Node& n, const std::vector<DataType>& types) {
  static const char* kNames[] = {"X",         "W",         "R", "B", "sequence_lens",
                                 "initial_h", "initial_c", "P"};
  const DataType x = types.empty() ? DataType::kUndefined : types[0];
  for (size_t i = 0; i < types.size() && i < 8; ++i) {
    if (i == 4) {
      if (types[i] != DataType::kUndefined && types[i] != DataType::kInt32 &&
          types[i] != DataType::kInt64)
        return KILN_ERROR("{}: sequence_lens must be int32, got {}", n.label(),
                          dtype_name(types[i]));
      continue;
    }
    KILN_RETURN_IF_ERROR(check_float(n, types[i], kNames[i], i == 0 ? DataType::kUndefined : x));
  }
  return Status::Ok();
}

Status infer_rnn(InferContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(RnnSpec s, read_rnn_spec(n));
  if (ctx.num_inputs() > static_cast<size_t>(s.num_inputs()))
    return KILN_ERROR("{}: {} takes at most {} inputs, got {}", n.label(), n.op_type,
                      s.num_inputs(), ctx.num_inputs());
  if (ctx.num_outputs() > static_cast<size_t>(s.num_outputs()))
    return KILN_ERROR("{}: {} has at most {} outputs, got {}", n.label(), n.op_type,
                      s.num_outputs(), ctx.num_outputs());
  if (!ctx.has_input(0) || !ctx.has_input(1) || !ctx.has_input(2))
    return KILN_ERROR("{}: X, W and R are required", n.label());
  std::vector<DataType> types;
  std::vector<const std::vector<Dim>*> shapes;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const TensorType& t = ctx.input_type(i);
    types.push_back(ctx.has_input(i) ? t.dtype : DataType::kUndefined);
    shapes.push_back(ctx.has_input(i) && t.has_rank() ? &*t.dims : nullptr);
  }
  KILN_RETURN_IF_ERROR(check_types(n, types));
  KILN_ASSIGN_OR_RETURN(RnnSizes z, rnn_sizes(n, s, shapes));
  const DataType t = types[0];
  ctx.set_output(0, TensorType(t, rnn_y_shape<Dim>(s, z.seq, z.batch, z.hidden)));
  for (size_t o = 1; o < ctx.num_outputs(); ++o)
    ctx.set_output(o, TensorType(t, rnn_state_shape<Dim>(s, z.batch, z.hidden)));
  return Status::Ok();
}

// One direction of one batch entry, in double.
struct Seq {
  const RnnSpec& s;
  int d;
  int64_t I, H;
  const double *W, *R, *Wb, *Rb, *P;  // this direction's; Wb, Rb, P nullptr when absent

  double clip(double v) const {
    return s.has_clip ? std::min<double>(std::max<double>(v, -s.clip), s.clip) : v;
  }
  double act(int k, double v) const { return rnn_activate<double>(s.act(d, k), clip(v)); }
  // out[r] = sum_k v[k] * M[r, k] for rows [r0, r1) of M (cols columns).
  static void rows(const double* M, int64_t cols, const std::vector<double>& v, int64_t r0,
                   int64_t r1, std::vector<double>& out) {
    for (int64_t r = r0; r < r1; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < cols; ++k) acc += v[k] * M[r * cols + k];
      out[r] = acc;
    }
  }
  double wb(int64_t r) const { return Wb ? Wb[r] : 0.0; }
  double rb(int64_t r) const { return Rb ? Rb[r] : 0.0; }

  // One step from state h (and c) on input x.
  void step(const std::vector<double>& x, std::vector<double>& h, std::vector<double>& c) const {
    const int64_t G = s.gates();
    std::vector<double> xw(G * H), hr(G * H);
    rows(W, I, x, 0, G * H, xw);
    rows(R, H, h, 0, G * H, hr);
    auto pre = [&](int64_t g, int64_t u) {
      const int64_t r = g * H + u;
      return xw[r] + hr[r] + wb(r) + rb(r);
    };
    if (s.cell == RnnCell::kRnn) {
      for (int64_t u = 0; u < H; ++u) h[u] = act(0, pre(0, u));
    } else if (s.cell == RnnCell::kGru) {
      std::vector<double> z(H), r(H), rh(H), hrh(G * H);
      for (int64_t u = 0; u < H; ++u) {
        z[u] = act(0, pre(0, u));
        r[u] = act(0, pre(1, u));
        rh[u] = r[u] * h[u];
      }
      if (!s.linear_before_reset) rows(R, H, rh, 2 * H, 3 * H, hrh);
      for (int64_t u = 0; u < H; ++u) {
        const int64_t k = 2 * H + u;
        const double in = s.linear_before_reset ? xw[k] + r[u] * (hr[k] + rb(k)) + wb(k)
                                                : xw[k] + hrh[k] + rb(k) + wb(k);
        const double ht = act(1, in);
        h[u] = (1 - z[u]) * ht + z[u] * h[u];
      }
    } else {
      const double* Pi = P;
      const double* Po = P ? P + H : nullptr;
      const double* Pf = P ? P + 2 * H : nullptr;
      for (int64_t u = 0; u < H; ++u) {
        const double i = act(0, pre(0, u) + (Pi ? Pi[u] * c[u] : 0));
        const double f = s.input_forget ? 1 - i : act(0, pre(2, u) + (Pf ? Pf[u] * c[u] : 0));
        const double cell = act(1, pre(3, u));
        c[u] = f * c[u] + i * cell;
        const double o = act(0, pre(1, u) + (Po ? Po[u] * c[u] : 0));
        h[u] = o * rnn_activate<double>(s.act(d, 2), c[u]);
      }
    }
  }
};

std::vector<double> doubles(const Tensor* t) {
  std::vector<double> v;
  if (!t) return v;
  v.resize(static_cast<size_t>(t->numel()));
  for (int64_t i = 0; i < t->numel(); ++i) v[i] = t->at_double(i);
  return v;
}

Status cpu_rnn(KernelContext& ctx) {
  const Node& n = ctx.node();
  KILN_ASSIGN_OR_RETURN(RnnSpec s, read_rnn_spec(n));
  std::vector<DataType> types;
  std::vector<const std::vector<int64_t>*> shapes;
  for (size_t i = 0; i < ctx.num_inputs() && i < static_cast<size_t>(s.num_inputs()); ++i) {
    const Tensor* t = ctx.input(i);
    types.push_back(t ? t->dtype() : DataType::kUndefined);
    shapes.push_back(t ? &t->shape() : nullptr);
  }
  KILN_RETURN_IF_ERROR(check_types(n, types));
  KILN_ASSIGN_OR_RETURN(RnnShape z, rnn_shape(n, s, shapes));
  const int64_t S = z.seq, Bn = z.batch, I = z.input, H = z.hidden, D = s.num_dirs;
  const int64_t G = s.gates();
  // X of input size 0 holds no elements whatever S and B say: Y's size is checked, not assumed.
  int64_t y_elems = 0;
  if (__builtin_mul_overflow(S, D, &y_elems) || __builtin_mul_overflow(y_elems, Bn, &y_elems) ||
      __builtin_mul_overflow(y_elems, H, &y_elems))
    return KILN_ERROR("{}: Y of {}x{}x{}x{} elements is too large", n.label(), S, D, Bn, H);
  const Tensor* x = ctx.input(0);
  const Tensor* lens_t = ctx.input(4);
  std::vector<int64_t> lens(static_cast<size_t>(Bn), S);
  if (lens_t) {
    for (int64_t b = 0; b < Bn; ++b) {
      lens[b] = lens_t->at_int(b);
      if (lens[b] < 0 || lens[b] > S)
        return KILN_ERROR("{}: sequence_lens[{}] = {} is outside [0, {}]", n.label(), b, lens[b],
                          S);
    }
  }
  const std::vector<double> W = doubles(ctx.input(1)), R = doubles(ctx.input(2)),
                            B = doubles(ctx.input(3)), h0 = doubles(ctx.input(5)),
                            c0 = doubles(s.cell == RnnCell::kLstm ? ctx.input(6) : nullptr),
                            P = doubles(s.cell == RnnCell::kLstm ? ctx.input(7) : nullptr);
  // Element offsets in X, Y and the states for the layout.
  auto x_at = [&](int64_t t, int64_t b) { return (s.batch_first ? b * S + t : t * Bn + b) * I; };
  auto y_at = [&](int64_t t, int64_t d, int64_t b) {
    return (s.batch_first ? (b * S + t) * D + d : (t * D + d) * Bn + b) * H;
  };
  auto st_at = [&](int64_t d, int64_t b) { return (s.batch_first ? b * D + d : d * Bn + b) * H; };
  std::vector<double> Y(static_cast<size_t>(S * D * Bn * H), 0.0);
  std::vector<double> Yh(static_cast<size_t>(D * Bn * H), 0.0), Yc(Yh.size(), 0.0);
  std::vector<double> xv(static_cast<size_t>(I)), h(static_cast<size_t>(H)), c(h.size());
  for (int d = 0; d < D; ++d) {
    const Seq seq{s,
                  d,
                  I,
                  H,
                  W.data() + d * G * H * I,
                  R.data() + d * G * H * H,
                  B.empty() ? nullptr : B.data() + d * 2 * G * H,
                  B.empty() ? nullptr : B.data() + d * 2 * G * H + G * H,
                  P.empty() ? nullptr : P.data() + d * 3 * H};
    for (int64_t b = 0; b < Bn; ++b) {
      for (int64_t u = 0; u < H; ++u) {
        h[u] = h0.empty() ? 0.0 : h0[st_at(d, b) + u];
        c[u] = c0.empty() ? 0.0 : c0[st_at(d, b) + u];
      }
      const int64_t L = lens[b];
      for (int64_t j = 0; j < L; ++j) {
        const int64_t t = s.dir_reverse(d) ? L - 1 - j : j;
        for (int64_t k = 0; k < I; ++k) xv[k] = x->at_double(x_at(t, b) + k);
        seq.step(xv, h, c);
        std::copy(h.begin(), h.end(), Y.begin() + y_at(t, d, b));
      }
      if (L == 0) continue;  // zeros, as onnxruntime gives
      std::copy(h.begin(), h.end(), Yh.begin() + st_at(d, b));
      std::copy(c.begin(), c.end(), Yc.begin() + st_at(d, b));
    }
  }
  auto out = [&](const std::vector<double>& v, std::vector<int64_t> shape) {
    return Tensor::from<double>(std::move(shape), v).cast(x->dtype());
  };
  ctx.set_output(0, out(Y, rnn_y_shape<int64_t>(s, S, Bn, H)));
  ctx.set_output(1, out(Yh, rnn_state_shape<int64_t>(s, Bn, H)));
  if (s.cell == RnnCell::kLstm) ctx.set_output(2, out(Yc, rnn_state_shape<int64_t>(s, Bn, H)));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "LSTM", infer_rnn, cpu_rnn, upgrade_rnn},
    {"", "GRU", infer_rnn, cpu_rnn, upgrade_rnn},
    {"", "RNN", infer_rnn, cpu_rnn, upgrade_rnn},
};

}  // namespace

std::span<const OpDef> rnn_ops() { return kOps; }

}  // namespace kiln
