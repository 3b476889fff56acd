// ONNX's Attention (opset 23; 24 adds nonpad_kv_seqlen; 25 adds left/right_window_size):
//
//   Y = Softmax(softcap(Q' K'^T) + bias) V'     (scores in float, rounded like the reference)
//
// Q, K, V are 4-D [batch, heads, seq, head_size], or 3-D [batch, seq, heads * head_size] with
// q_num_heads / kv_num_heads. Grouped-query attention: query head h reads kv head
// h / (q_heads / kv_heads). past_key/past_value are prepended to K/V along the sequence and the
// result is returned as present_key/present_value. bias adds the attention mask (boolean: false
// = masked; numeric: added), the causal mask (bottom-right aligned: query i sees key j iff
// j <= i + offset, offset = past length, or nonpad_kv_seqlen[b] - q_len), the sliding window
// and the padding mask of nonpad_kv_seqlen. A row whose bias is -inf everywhere gives zeros.
// qk_matmul_output (mode 0/1: scores after softcap, 2: plus bias, 3: probabilities).
//
// The kernel computes in double but rounds to the input type after every step the onnx
// reference rounds at (Q and K are each scaled by sqrt(scale); scores; biased scores; the
// softmax in softmax_precision), so bfloat16 and float16 results match it closely.
// The optimizer maps the plain cases onto kiln.Attention (src/passes/map_onnx_attention.cpp).
#include <cmath>
#include <limits>

#include "core/dispatch.h"
#include "ops/op.h"
#include "ops/shape_values.h"

namespace kiln {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

double round_to(DataType t, double x) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<float>(x);
    case DataType::kFloat16:
      return static_cast<float>(Half(static_cast<float>(x)));
    case DataType::kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(x)));
    default:
      return x;
  }
}

// The sizes of one attention call, from the input types or tensors.
struct AttnShape {
  bool packed = false;  // 3-D inputs
  Dim B, Sq, Skv, P, Hq, Hkv, D, Dv;
};

Status check_float(const Node& n, DataType t, const char* what) {
  if (t == DataType::kUndefined || dtype_is_float(t)) return Status::Ok();
  return KILN_ERROR("{}: {} must be float16, bfloat16, float32 or float64, got {}", n.label(), what,
                    dtype_name(t));
}

Dim div_dim(const Dim& d, int64_t k) { return d.is_static() && k > 0 ? Dim(d.value / k) : Dim(); }

// Reads the shapes of Q, K, V (and past_key) into AttnShape; checks what is known.
Expected<AttnShape> attn_shape(const Node& n, const TensorType& q, const TensorType& k,
                               const TensorType& v, const TensorType* past) {
  AttnShape s;
  if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
    return KILN_ERROR("{}: Q, K and V must all be 3-D or all 4-D, got {}, {} and {}", n.label(),
                      q.str(), k.str(), v.str());
  const auto& qd = *q.dims;
  const auto& kd = *k.dims;
  const auto& vd = *v.dims;
  s.B = qd[0];
  if (q.rank() == 4) {
    s.Hq = qd[1], s.Sq = qd[2], s.D = qd[3], s.Hkv = kd[1], s.Skv = kd[2], s.Dv = vd[3];
    if (kd[3].is_static() && s.D.is_static() && kd[3].value != s.D.value)
      return KILN_ERROR("{}: Q and K head sizes differ ({} vs {})", n.label(), s.D.str(),
                        kd[3].str());
  } else {
    s.packed = true;
    const int64_t hq = n.attrs.get_int("q_num_heads", 0), hkv = n.attrs.get_int("kv_num_heads", 0);
    if (hq <= 0 || hkv <= 0)
      return KILN_ERROR("{}: 3-D inputs need q_num_heads and kv_num_heads", n.label());
    const Dim hidden[3] = {qd[2], kd[2], vd[2]};
    for (int i = 0; i < 3; ++i) {
      const int64_t h = i == 0 ? hq : hkv;
      if (hidden[i].is_static() && hidden[i].value % h != 0)
        return KILN_ERROR("{}: {} hidden size {} is not a multiple of its {} heads", n.label(),
                          "QKV"[i], hidden[i].value, h);
    }
    s.Hq = hq, s.Hkv = hkv, s.Sq = qd[1], s.Skv = kd[1];
    s.D = div_dim(qd[2], hq), s.Dv = div_dim(vd[2], hkv);
    const Dim dk = div_dim(kd[2], hkv);
    if (dk.is_static() && s.D.is_static() && dk.value != s.D.value)
      return KILN_ERROR("{}: Q and K head sizes differ ({} vs {})", n.label(), s.D.value, dk.value);
  }
  if (s.Hq.is_static() && s.Hkv.is_static() && (s.Hkv.value == 0 || s.Hq.value % s.Hkv.value != 0))
    return KILN_ERROR("{}: q heads ({}) must be a multiple of kv heads ({})", n.label(), s.Hq.value,
                      s.Hkv.value);
  s.P = 0;
  if (past) {
    if (past->rank() != 4)
      return KILN_ERROR("{}: past_key must be 4-D, got {}", n.label(), past->str());
    s.P = (*past->dims)[2];
  }
  return s;
}

Status infer_attention_onnx(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType &q = ctx.input_type(0), &k = ctx.input_type(1), &v = ctx.input_type(2);
  for (size_t i : {0, 1, 2, 4, 5})
    KILN_RETURN_IF_ERROR(check_float(n, ctx.input_type(i).dtype, "Q, K, V and the past"));
  if (ctx.has_input(4) != ctx.has_input(5))
    return KILN_ERROR("{}: past_key and past_value must be given together", n.label());
  if (ctx.has_input(6) && ctx.has_input(4))
    return KILN_ERROR("{}: nonpad_kv_seqlen cannot be combined with past_key", n.label());
  const DataType t = q.dtype;
  if (!q.has_rank() || !k.has_rank() || !v.has_rank()) {
    for (size_t i = 0; i < ctx.num_outputs(); ++i)
      ctx.set_output(i, TensorType::unknown_rank(i == 2 ? v.dtype : t));
    return Status::Ok();
  }
  const TensorType& past = ctx.input_type(4);
  KILN_ASSIGN_OR_RETURN(
      AttnShape s, attn_shape(n, q, k, v, ctx.has_input(4) && past.has_rank() ? &past : nullptr));
  if (ctx.has_input(4) && !past.has_rank()) s.P = Dim();
  const Dim L = add_dims(s.P, s.Skv);
  int64_t hq_dv = 0;
  const Dim hidden = s.Hq.is_static() && s.Dv.is_static() &&
                             !__builtin_mul_overflow(s.Hq.value, s.Dv.value, &hq_dv)
                         ? Dim(hq_dv)
                         : Dim();
  ctx.set_output(
      0, s.packed ? TensorType(t, {s.B, s.Sq, hidden}) : TensorType(t, {s.B, s.Hq, s.Sq, s.Dv}));
  ctx.set_output(1, TensorType(k.dtype, {s.B, s.Hkv, L, s.D}));
  ctx.set_output(2, TensorType(v.dtype, {s.B, s.Hkv, L, s.Dv}));
  ctx.set_output(3, TensorType(t, {s.B, s.Hq, s.Sq, L}));
  return Status::Ok();
}

// A [B, H, S, D] float64 copy of a 3-D (packed heads) or 4-D input.
std::vector<double> unpack(const Tensor& t, bool packed, int64_t B, int64_t H, int64_t S,
                           int64_t D) {
  std::vector<double> out(static_cast<size_t>(B * H * S * D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t src =
              packed ? ((b * S + s) * H + h) * D + d : ((b * H + h) * S + s) * D + d;
          out[static_cast<size_t>(((b * H + h) * S + s) * D + d)] = t.at_double(src);
        }
  return out;
}

// [B, H, S, D] -> [B, S, H * D].
Tensor pack_heads(const Tensor& y) {
  const int64_t B = y.dim(0), H = y.dim(1), S = y.dim(2), D = y.dim(3);
  Tensor packed(DataType::kFloat64, {B, S, H * D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t d = 0; d < D; ++d)
          packed.data<double>()[((b * S + i) * H + h) * D + d] =
              y.data<double>()[((b * H + h) * S + i) * D + d];
  return packed;
}

// past ++ cur along the sequence: [B, H, P + S, D].
Tensor concat_seq(const std::vector<double>& past, const std::vector<double>& cur, int64_t B,
                  int64_t H, int64_t P, int64_t S, int64_t D, DataType t) {
  Tensor out(DataType::kFloat64, {B, H, P + S, D});
  double* o = out.data<double>();
  for (int64_t bh = 0; bh < B * H; ++bh) {
    std::copy(past.begin() + bh * P * D, past.begin() + (bh + 1) * P * D, o);
    o += P * D;
    std::copy(cur.begin() + bh * S * D, cur.begin() + (bh + 1) * S * D, o);
    o += S * D;
  }
  return out.cast(t);
}

struct Options {
  DataType t, sp;  // input type; softmax precision
  double scale_sqrt, softcap;
  bool causal;
  int64_t mode, left, right;
};

Expected<Options> read_options(const Node& n, DataType t, int64_t D) {
  Options o;
  o.t = t;
  const int64_t sp = n.attrs.get_int("softmax_precision", 0);
  o.sp = sp == 0 ? t : static_cast<DataType>(sp);
  if (sp != 0 && (!dtype_code_is_valid(sp) || !dtype_is_float(o.sp)))
    return KILN_ERROR("{}: softmax_precision {} is not a float type", n.label(), sp);
  const double scale = n.attrs.get_float("scale", 0.f);
  o.scale_sqrt = round_to(t, std::sqrt(scale != 0 ? scale : 1.0 / std::sqrt(double(D))));
  o.softcap = n.attrs.get_float("softcap", 0.f);
  o.causal = n.attrs.get_int("is_causal", 0) != 0;
  o.mode = n.attrs.get_int("qk_matmul_output_mode", 0);
  if (o.mode < 0 || o.mode > 3)
    return KILN_ERROR("{}: qk_matmul_output_mode must be 0..3, got {}", n.label(), o.mode);
  o.left = n.attrs.get_int("left_window_size", -1);
  o.right = n.attrs.get_int("right_window_size", -1);
  if (o.left < -1 || o.right < -1)
    return KILN_ERROR("{}: window sizes must be -1 or >= 0", n.label());
  return o;
}

// The additive bias of one score: the attention mask (right-aligned against [B, Hq, Sq, Lm];
// keys past its last dim are masked), the causal mask, the window and the padding mask.
struct Bias {
  const Options* o;
  const Tensor *mask = nullptr, *nonpad = nullptr;
  std::vector<int64_t> mstr;
  int64_t Lm = 0, Sq = 0, past = -1;  // past: its length, -1 without past key/value

  double at(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double bias = 0;
    if (mask) {
      if (j >= Lm) return kNegInf;
      const double m = mask->at_double(b * mstr[0] + h * mstr[1] + i * mstr[2] + j * mstr[3]);
      bias = mask->dtype() == DataType::kBool ? (m != 0 ? 0.0 : kNegInf) : round_to(o->t, m);
    }
    const int64_t offset = past >= 0 ? past : nonpad ? nonpad->at_int(b) - Sq : 0;
    if (o->causal && j > i + offset) return kNegInf;
    const int64_t diff = i + offset - j;
    if ((o->left >= 0 && diff > o->left) || (o->right >= 0 && -diff > o->right)) return kNegInf;
    if (nonpad && j >= nonpad->at_int(b)) return kNegInf;
    return bias;
  }
};

Expected<Bias> make_bias(const Node& n, const Options& o, const Tensor* mask, const Tensor* nonpad,
                         int64_t past, std::vector<int64_t> scores) {
  Bias bias{&o, mask, nonpad, {}, scores[3], scores[2], past};
  if (!mask) return bias;
  const std::string want = shape_str(scores);
  if (mask->rank() < 1 || mask->rank() > 4 || mask->dim(-1) > scores[3])
    return KILN_ERROR("{}: attn_mask {} does not fit scores {}", n.label(), mask->desc(), want);
  scores[3] = bias.Lm = mask->dim(-1);
  for (int64_t d = 0; d < mask->rank(); ++d) {
    const int64_t md = mask->dim(d), fd = scores[static_cast<size_t>(4 - mask->rank() + d)];
    if (md != 1 && md != fd)
      return KILN_ERROR("{}: attn_mask {} does not broadcast to scores {}", n.label(), mask->desc(),
                        want);
  }
  bias.mstr = broadcast_strides(mask->shape(), scores);
  return bias;
}

// Softmax of one row of biased scores in softmax_precision, rounded back to the input type; a
// row masked everywhere gives zeros.
void softmax_row(std::vector<double>& row, bool all_masked, const Options& o) {
  auto rs = [&](double x) { return round_to(o.sp, x); };
  double mx = kNegInf;
  for (double x : row) mx = std::max(mx, rs(x));
  if (mx == kNegInf) mx = 0;
  double sum = 0;
  for (double& x : row) {
    x = rs(std::exp(rs(rs(x) - mx)));
    sum = o.sp == DataType::kBFloat16 ? rs(sum + x) : sum + x;  // numpy's bfloat16 sum rounds
  }
  sum = rs(sum);
  if (sum == 0) sum = 1;
  for (double& x : row) x = all_masked ? 0.0 : round_to(o.t, rs(x / sum));
}

Status cpu_attention_onnx(KernelContext& ctx) {
  const Node& n = ctx.node();
  const Tensor *q = ctx.input(0), *k = ctx.input(1), *v = ctx.input(2);
  const Tensor *mask = ctx.input(3), *pk = ctx.input(4), *pv = ctx.input(5);
  const Tensor* nonpad = ctx.input(6);
  if (!q || !k || !v) return KILN_ERROR("{}: Q, K and V are required", n.label());
  for (const Tensor* x : {q, k, v, pk, pv})
    if (x) KILN_RETURN_IF_ERROR(check_float(n, x->dtype(), "Q, K, V and the past"));
  if (!pk != !pv)
    return KILN_ERROR("{}: past_key and past_value must be given together", n.label());
  if (nonpad && pk)
    return KILN_ERROR("{}: nonpad_kv_seqlen cannot be combined with past_key", n.label());
  const TensorType pkt = pk ? TensorType::of(*pk) : TensorType();
  KILN_ASSIGN_OR_RETURN(AttnShape s, attn_shape(n, TensorType::of(*q), TensorType::of(*k),
                                                TensorType::of(*v), pk ? &pkt : nullptr));
  const int64_t B = s.B.value, Hq = s.Hq.value, Hkv = s.Hkv.value, Sq = s.Sq.value;
  const int64_t Skv = s.Skv.value, P = s.P.value, D = s.D.value, Dv = s.Dv.value, L = P + Skv;
  const int64_t G = Hq / Hkv;
  if (pk && (pk->dim(0) != B || pk->dim(1) != Hkv || pk->dim(3) != D || pv->rank() != 4 ||
             pv->dim(0) != B || pv->dim(1) != Hkv || pv->dim(2) != P || pv->dim(3) != Dv))
    return KILN_ERROR("{}: past_key {} / past_value {} do not fit K and V", n.label(), pk->desc(),
                      pv->desc());
  if (nonpad && (nonpad->numel() != B || !dtype_is_integer(nonpad->dtype())))
    return KILN_ERROR("{}: nonpad_kv_seqlen must hold {} integers, got {}", n.label(), B,
                      nonpad->desc());
  KILN_ASSIGN_OR_RETURN(Options o, read_options(n, q->dtype(), D));
  auto r = [&](double x) { return round_to(o.t, x); };

  // K and V with the past prepended; present_key/present_value are exactly these.
  std::vector<double> kc = unpack(*k, s.packed, B, Hkv, Skv, D);
  std::vector<double> vc = unpack(*v, s.packed, B, Hkv, Skv, Dv);
  if (pk) {
    Tensor pres_k = concat_seq(unpack(*pk, false, B, Hkv, P, D), kc, B, Hkv, P, Skv, D, k->dtype());
    Tensor pres_v =
        concat_seq(unpack(*pv, false, B, Hkv, P, Dv), vc, B, Hkv, P, Skv, Dv, v->dtype());
    kc = unpack(pres_k, false, B, Hkv, L, D);
    vc = unpack(pres_v, false, B, Hkv, L, Dv);
    ctx.set_output(1, std::move(pres_k));
    ctx.set_output(2, std::move(pres_v));
  } else {
    ctx.set_output(1, k->rank() == 4 ? *k : concat_seq({}, kc, B, Hkv, 0, L, D, k->dtype()));
    ctx.set_output(2, v->rank() == 4 ? *v : concat_seq({}, vc, B, Hkv, 0, L, Dv, v->dtype()));
  }
  std::vector<double> qs = unpack(*q, s.packed, B, Hq, Sq, D);
  for (double& x : qs) x = r(x * o.scale_sqrt);
  for (double& x : kc) x = r(x * o.scale_sqrt);

  KILN_ASSIGN_OR_RETURN(Bias bias_of, make_bias(n, o, mask, nonpad, pk ? P : -1, {B, Hq, Sq, L}));

  Tensor y(DataType::kFloat64, {B, Hq, Sq, Dv});
  Tensor qk(DataType::kFloat64, {B, Hq, Sq, L});
  std::vector<double> row(static_cast<size_t>(L)), bias(static_cast<size_t>(L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t kvh = h / G;
        const double* qrow = &qs[static_cast<size_t>(((b * Hq + h) * Sq + i) * D)];
        double* qk_out = qk.data<double>() + ((b * Hq + h) * Sq + i) * L;
        bool all_masked = true;
        for (int64_t j = 0; j < L; ++j) {
          const double* krow = &kc[static_cast<size_t>(((b * Hkv + kvh) * L + j) * D)];
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += qrow[d] * krow[d];
          double x = r(acc);
          if (o.softcap > 0) x = r(r(std::tanh(r(x / o.softcap))) * o.softcap);
          bias[j] = bias_of.at(b, h, i, j);
          all_masked = all_masked && bias[j] == kNegInf;
          row[j] = r(x + bias[j]);
          qk_out[j] = o.mode == 2 ? row[j] : x;
        }
        softmax_row(row, all_masked, o);
        if (o.mode == 3) std::copy(row.begin(), row.end(), qk_out);
        double* yrow = y.data<double>() + ((b * Hq + h) * Sq + i) * Dv;
        for (int64_t d = 0; d < Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < L; ++j)
            acc += row[j] * vc[static_cast<size_t>(((b * Hkv + kvh) * L + j) * Dv + d)];
          yrow[d] = acc;
        }
      }
  if (s.packed) y = pack_heads(y);
  ctx.set_output(0, y.cast(o.t));
  ctx.set_output(3, qk.cast(o.t));
  return Status::Ok();
}

constexpr OpDef kOps[] = {
    {"", "Attention", infer_attention_onnx, cpu_attention_onnx, nullptr},
};

}  // namespace

std::span<const OpDef> attention_ops() { return kOps; }

}  // namespace kiln
