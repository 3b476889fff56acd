// ONNX's own Attention op (opset 23+) onto kiln's attention layer, so a backend implements
// attention once:
//   Attention(Q, K, V, mask?)  [float32/float64, no past / nonpad_kv_seqlen, no softcap, no
//                               window, softmax in the input type, only Y used; static heads and
//                               head sizes]
//     =>  kiln.Attention(Q, Transpose(K, [0,1,3,2]), V, bias?, scale, nan_to_zero)
// bias: an additive mask as it is, a boolean one as Where(mask, 0, -inf); is_causal adds a
// constant [q_len, kv_len] triangle of 0 / -inf (static lengths only). nan_to_zero gives rows
// that the bias removes entirely zeros, as ONNX specifies.
// 3-D inputs (heads packed in the last dim) are split into heads by Reshape + Transpose and
// joined again after. With grouped-query heads (G q heads per kv head) each K and V head is
// repeated G times in a row (Unsqueeze, Tile, Reshape to H heads), the form the exporters write:
// fold_attention_heads reads it in place (kiln.MultiHeadAttention's kv_heads) where Q, K and V
// are head splits of projections.
#include <array>
#include <cmath>
#include <limits>
#include <tuple>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool same_dim(const Dim& a, const Dim& b) {
  return (a.is_static() && a.value == b.value) || (!a.symbol.empty() && a.symbol == b.symbol);
}

struct Heads {
  bool packed = false;  // 3-D inputs
  int64_t hq = 0, hkv = 0, d = 0, dv = 0;
};

struct MapMatch {
  Node* node;
  double scale;
  bool causal;
  int64_t q_len, kv_len;  // for the causal triangle
  Heads h;
};

Attributes perm(std::vector<int64_t> p) {
  Attributes a;
  a.set("perm", Attribute::Ints(std::move(p)));
  return a;
}

// Adds the helper nodes and constants around one Attention node, named after it.
struct Emit {
  PassContext& ctx;
  Node& at;          // new nodes go right before it
  std::string base;  // its name (the node itself is gone after the rewrite)

  Value* op(const char* type, std::vector<Value*> ins, Attributes a = {}) {
    Graph& g = ctx.g;
    Node* x = g.insert_node_before(&at, type, g.unique_name(base + "/" + type), ins,
                                   {g.unique_name(base + "/" + type)});
    x->attrs = std::move(a);
    x->origin = ctx.pass;
    return x->output(0);
  }
  Value* ints(std::vector<int64_t> v) {
    const int64_t k = static_cast<int64_t>(v.size());
    return ctx.g.add_constant(ctx.g.unique_name(base + "/shape"), Tensor::from<int64_t>({k}, v));
  }
  Value* constant(const char* what, Tensor t) {
    return ctx.g.add_constant(ctx.g.unique_name(base + "/" + what), std::move(t));
  }
};

// Q, Kt, V and the mask as kiln.Attention reads them: heads split out of 3-D inputs, K
// transposed, and with grouped-query heads the group as one more batch dim.
std::array<Value*, 4> layer_inputs(Emit& e, const Node& n, const Heads& h) {
  Value *q = n.input(0), *kt = nullptr, *v = n.input(2), *mask = n.input(3);
  if (h.packed) {  // [B, S, H * D] -> [B, H, S, D] (K straight to [B, H, D, S])
    q = e.op("Transpose", {e.op("Reshape", {q, e.ints({0, 0, h.hq, h.d})})}, perm({0, 2, 1, 3}));
    kt = e.op("Transpose", {e.op("Reshape", {n.input(1), e.ints({0, 0, h.hkv, h.d})})},
              perm({0, 2, 3, 1}));
    v = e.op("Transpose", {e.op("Reshape", {v, e.ints({0, 0, h.hkv, h.dv})})}, perm({0, 2, 1, 3}));
  } else {
    kt = e.op("Transpose", {n.input(1)}, perm({0, 1, 3, 2}));
  }
  if (const int64_t G = h.hq / h.hkv; G > 1) {
    // Each K and V head repeated G times in a row (Unsqueeze, Tile, Reshape: the form the
    // exporters write, which fold_attention_heads reads in place as kv_heads).
    auto repeat = [&](Value* x, std::vector<int64_t> to) {  // [B, Hkv, a, b] -> [B, H, a, b]
      Value* t = e.op("Tile", {e.op("Unsqueeze", {x, e.ints({2})}), e.ints({1, 1, G, 1, 1})});
      return e.op("Reshape", {t, e.ints(std::move(to))});
    };
    kt = repeat(kt, {0, h.hq, h.d, -1});
    v = repeat(v, {0, h.hq, -1, h.dv});
  }
  return {q, kt, v, mask};
}

// The mask as an additive bias (boolean: Where(mask, 0, -inf)) plus the causal triangle.
Value* additive_bias(Emit& e, const Value* orig_mask, Value* mask, const MapMatch& m, DataType t) {
  const double inf = std::numeric_limits<double>::infinity();
  Value* bias = mask;
  if (bias && orig_mask->type.dtype == DataType::kBool)
    bias = e.op("Where", {bias, e.constant("zero", Tensor::scalar(0.0).cast(t)),
                          e.constant("neg_inf", Tensor::scalar(-inf).cast(t))});
  if (!m.causal) return bias;
  Tensor tri(DataType::kFloat64, {m.q_len, m.kv_len});
  for (int64_t i = 0; i < m.q_len; ++i)
    for (int64_t j = 0; j < m.kv_len; ++j) tri.data<double>()[i * m.kv_len + j] = j > i ? -inf : 0;
  Value* c = e.constant("causal", tri.cast(t));
  return bias ? e.op("Add", {bias, c}) : c;
}

// The layer's output back in Y's form: a 3-D Y's heads packed.
Status join_heads(Emit& e, Node* layer, const Heads& h) {
  Graph& g = e.ctx.g;
  std::vector<std::tuple<const char*, Value*, Attributes>> steps;
  if (h.packed) {
    steps.emplace_back("Transpose", nullptr, perm({0, 2, 1, 3}));
    steps.emplace_back("Reshape", e.ints({0, 0, h.hq * h.dv}), Attributes{});
  }
  if (steps.empty()) return Status::Ok();
  Value* y = layer->output(0);
  Value* cur = g.add_value(g.unique_name(e.base + "/y"));
  g.set_node_output(layer, 0, cur);  // y loses its producer; the last step takes it
  for (size_t i = 0; i < steps.size(); ++i) {
    auto& [type, extra, attrs] = steps[i];
    std::vector<Value*> ins = {cur};
    if (extra) ins.push_back(extra);
    const bool last = i + 1 == steps.size();
    Node* x = g.add_node(
        type, g.unique_name(e.base + "/" + type), ins,
        last ? std::vector<std::string>{} : std::vector<std::string>{g.unique_name(e.base + "/y")});
    x->attrs = attrs;
    x->origin = e.ctx.pass;
    if (last) g.set_node_output(x, 0, y);
    cur = x->output(0);
  }
  return Status::Ok();
}

struct MapOnnxAttention {
  using Match = MapMatch;

  static std::optional<Match> reject(PassContext& ctx, const Node& n, const char* why) {
    ctx.note(fmt::format("{}: {}", n.label(), why));
    return std::nullopt;
  }

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    if (!is_op(&n, "Attention")) return std::nullopt;
    const TensorType& q = n.input(0)->type;
    const TensorType& k = n.input(1)->type;
    const TensorType& v = n.input(2)->type;
    const bool packed = q.rank() == 3;
    if (q.rank() != k.rank() || q.rank() != v.rank() || (q.rank() != 3 && q.rank() != 4))
      return reject(ctx, n, "Q, K and V are not all 3-D or all 4-D");
    Heads h;
    h.packed = packed;
    if (packed) {
      h.hq = n.attrs.get_int("q_num_heads", 0), h.hkv = n.attrs.get_int("kv_num_heads", 0);
      const Dim &qh = (*q.dims)[2], &vh = (*v.dims)[2];
      if (h.hq <= 0 || h.hkv <= 0 || !qh.is_static() || !vh.is_static())
        return reject(ctx, n, "3-D inputs need q_num_heads, kv_num_heads and static hidden sizes");
      h.d = qh.value / h.hq, h.dv = vh.value / h.hkv;
    } else {
      const Dim &hq = (*q.dims)[1], &hkv = (*k.dims)[1], &d = (*q.dims)[3], &dv = (*v.dims)[3];
      if (!hq.is_static() || !hkv.is_static() || !d.is_static() || !dv.is_static())
        return reject(ctx, n, "head counts or head sizes are not static");
      h.hq = hq.value, h.hkv = hkv.value, h.d = d.value, h.dv = dv.value;
    }
    if (h.hkv <= 0 || h.hq % h.hkv != 0)
      return reject(ctx, n, "q heads are not a multiple of kv heads");
    for (size_t i = 4; i < n.num_inputs(); ++i)
      if (n.input(i)) return reject(ctx, n, "past key/value or nonpad_kv_seqlen given");
    for (size_t i = 1; i < n.num_outputs(); ++i)
      if (Value* o = n.output(i); o && (!o->uses().empty() || ctx.g.is_graph_output(o)))
        return reject(ctx, n, "present_key, present_value or qk_matmul_output is used");
    const Attributes& a = n.attrs;
    if (a.get_float("softcap", 0.f) != 0.f) return reject(ctx, n, "softcap is set");
    if (a.get_int("left_window_size", -1) != -1 || a.get_int("right_window_size", -1) != -1)
      return reject(ctx, n, "a sliding window is set");
    const int64_t sp = a.get_int("softmax_precision", 0);
    if (sp != 0 && sp != static_cast<int64_t>(q.dtype))
      return reject(ctx, n, "softmax_precision differs from the input type");
    const DataType t = q.dtype;
    // The ONNX function rounds Q and K, each scaled by sqrt(scale), and every later step to a
    // 16-bit input type; one fused layer that scales the scores once cannot round the same, and
    // its results then differ from ONNX's by an ulp here and there.
    if (t == DataType::kFloat16 || t == DataType::kBFloat16)
      return reject(ctx, n, "16-bit inputs (the exact ONNX kernel rounds as ONNX does)");
    Match m{&n, a.get_float("scale", 0.f), a.get_int("is_causal", 0) != 0, -1, -1, h};
    if (m.scale == 0) m.scale = 1.0 / std::sqrt(static_cast<double>(h.d));
    const Dim &sq = (*q.dims)[packed ? 1 : 2], &skv = (*k.dims)[packed ? 1 : 2];
    if (Value* mask = n.input(3)) {
      const TensorType& mt = mask->type;
      if (mt.dtype != t && mt.dtype != DataType::kBool)
        return reject(ctx, n, "the mask is neither boolean nor of the input type");
      if (!mt.has_rank() || mt.rank() < 1 || mt.rank() > 4 || !same_dim(mt.dims->back(), skv))
        return reject(ctx, n, "the mask's last dim may be shorter than the keys (padded)");
    }
    if (m.causal) {
      if (!sq.is_static() || !skv.is_static())
        return reject(ctx, n, "is_causal needs static sequence lengths");
      m.q_len = sq.value;
      m.kv_len = skv.value;
    }
    Attributes la;
    la.set("scale", Attribute::Float(static_cast<float>(m.scale)));
    la.set("nan_to_zero", Attribute::Int(1));
    if (!ctx.backend_supports("kiln", "Attention", la, t)) return std::nullopt;
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.node;
    Emit e{ctx, n, n.name};
    auto [q, kt, v, mask] = layer_inputs(e, n, m.h);
    Value* bias = additive_bias(e, n.input(3), mask, m, n.input(0)->type.dtype);
    std::vector<Value*> ins = {q, kt, v};
    if (bias) ins.push_back(bias);
    Attributes a;
    a.set("scale", Attribute::Float(static_cast<float>(m.scale)));
    a.set("nan_to_zero", Attribute::Int(1));
    Value* y = n.output(0);
    KILN_ASSIGN_OR_RETURN(Node * f,
                          replace_with_layer(ctx, {&n}, "kiln", "Attention", ins, std::move(a), y));
    return join_heads(e, f, m.h);  // n is gone from here on
  }
};

}  // namespace

Expected<bool> map_onnx_attention(PassContext& ctx) { return apply_pattern<MapOnnxAttention>(ctx); }

}  // namespace kiln::passes
