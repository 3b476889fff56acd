// kiln's transformer layers (see fused.h for their inputs and attributes):
//   kiln.MultiHeadAttention: a kiln.Attention with the head split and merge folded in;
//   kiln.SkipLayerNorm: LayerNormalization of a sum, optionally returning the sum.
// Their CPU kernels chain the reference kernels of the ops they replace (Slice, Reshape,
// Transpose, kiln.Attention, Add, LayerNormalization), so an optimized graph computes what the
// exported one does.
#include "ops/fused.h"
#include "ops/fused_util.h"
#include "ops/shape_util.h"

namespace kiln {

Status cpu_attention(KernelContext& ctx);  // fused_chain.cpp

namespace {

Tensor ints(std::vector<int64_t> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from<int64_t>({n}, std::move(v));
}

// --- kiln.MultiHeadAttention
// -------------------------------------------------------------------------------

// Head counts and sizes from the attributes and the input shapes: Q [B, Sq, H*D] (packed: Q, K
// and V side by side, [B, S, (H + 2*Hkv)*D]), K [B, Sk, Hkv*D], V [B, Sk, Hkv*Dv]. kv_heads
// (Hkv, default H) divides H: grouped-query attention, query head h reading key/value head
// h / (H / Hkv).
struct MhaDims {
  int64_t heads = 0, kv_heads = 0, d = 0, dv = 0;
};

Expected<MhaDims> mha_dims(const Node& n, const Dim& q_last, const Dim& v_last) {
  MhaDims m;
  m.heads = n.attrs.get_int("num_heads", 0);
  m.kv_heads = n.attrs.get_int("kv_heads", m.heads);
  if (m.heads <= 0 || m.kv_heads <= 0 || m.heads % m.kv_heads != 0)
    return KILN_ERROR("{}: num_heads ({}) must be a positive multiple of kv_heads ({})",
                      n.label(), m.heads, m.kv_heads);
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  const int64_t parts = packed ? m.heads + 2 * m.kv_heads : m.heads;
  if (!q_last.is_static() || q_last.value % parts != 0)
    return KILN_ERROR("{}: Q's last dim {} is not {} heads x a head size", n.label(),
                      q_last.str(), parts);
  m.d = q_last.value / parts;
  m.dv = m.d;
  if (!packed) {
    if (!v_last.is_static() || v_last.value % m.kv_heads != 0)
      return KILN_ERROR("{}: V's last dim {} is not kv_heads ({}) x a head size", n.label(),
                        v_last.str(), m.kv_heads);
    m.dv = v_last.value / m.kv_heads;
  }
  return m;
}

}  // namespace

// Inputs 4, 5 and 6: the rotary embedding's caches and position ids (ops/fused.h).
bool mha_has_rotary(const Node& n) { return n.num_inputs() > 4 && n.input(4) != nullptr; }

std::pair<int64_t, int64_t> mha_col_slice(const Node& n, int slot) {
  const std::vector<int64_t> c = n.attrs.get_ints("col_slices");
  if (c.size() != 6 || slot < 0 || slot > 2) return {0, 0};
  return {c[2 * slot], c[2 * slot + 1]};
}

namespace {

// The attributes of the RotaryEmbedding that rotates the heads of input `slot` (0: Q, or packed
// Q | K | V; 1: K) of an attention with the rotary (m: its head counts).
Attributes rotary_attrs(const Node& n, const MhaDims& m, int slot) {
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  Attributes a;
  if (packed) {
    a.set("num_heads", Attribute::Int(m.heads + 2 * m.kv_heads));
    a.set("kiln_head_begin", Attribute::Int(0));
    a.set("kiln_head_end", Attribute::Int(m.heads + m.kv_heads));
  } else {
    a.set("num_heads", Attribute::Int(slot == 0 ? m.heads : m.kv_heads));
  }
  if (n.attrs.get_int("rotary_interleaved", 0) != 0) a.set("interleaved", Attribute::Int(1));
  return a;
}

Status check_mha_rotary(const Node& n, bool has_cos, bool has_sin, DataType q, DataType cos,
                        DataType sin, DataType pos, bool has_pos) {
  if (has_cos != has_sin)
    return KILN_ERROR("{}: the rotary needs both cos_cache and sin_cache (inputs 4 and 5)",
                      n.label());
  if (!has_cos) {
    if (has_pos) return KILN_ERROR("{}: position_ids (input 6) without the caches", n.label());
    return Status::Ok();
  }
  if (n.attrs.get_int("seq_first", 0) != 0)
    return KILN_ERROR("{}: the rotary is not applied with seq_first", n.label());
  if (q != DataType::kUndefined &&
      ((cos != DataType::kUndefined && cos != q) || (sin != DataType::kUndefined && sin != q)))
    return KILN_ERROR("{}: the rotary's caches must have Q's type {}", n.label(), dtype_name(q));
  if (has_pos && pos != DataType::kUndefined && pos != DataType::kInt64)
    return KILN_ERROR("{}: position_ids must be int64", n.label());
  return Status::Ok();
}

// kv_head_major: K [B, Hkv, Sk, D] and V [B, Hkv, Sk, Dv] (ops/fused.h), on none of the other
// forms; an error names what does not fit.
Status check_head_major(const Node& n, bool rotary, const TensorType& k, const TensorType& v) {
  const bool kv_cols = mha_col_slice(n, 1).second > 0 || mha_col_slice(n, 2).second > 0;
  if (n.attrs.get_int("packed", 0) != 0 || n.attrs.get_int("seq_first", 0) != 0 || rotary ||
      kv_cols)
    return KILN_ERROR("{}: kv_head_major excludes packed, seq_first, rotary, K/V col_slices",
                      n.label());
  const int64_t h = n.attrs.get_int("num_heads", 0), hkv = n.attrs.get_int("kv_heads", h);
  if (!k.has_rank() || !v.has_rank()) return Status::Ok();
  if (k.rank() != 4 || v.rank() != 4)
    return KILN_ERROR("{}: head-major K {} and V {} must be 4-D [batch, kv_heads, seq, head]",
                      n.label(), k.str(), v.str());
  for (const TensorType* t : {&k, &v})
    if ((*t->dims)[1].is_static() && (*t->dims)[1].value != hkv)
      return KILN_ERROR("{}: head-major {} has not {} key/value heads", n.label(), t->str(), hkv);
  return Status::Ok();
}

// The width of V's rows as the attention reads them ([B, Sk, Hkv*Dv]): a head-major V's
// Hkv * Dv.
Dim v_row_width(const Node& n, const TensorType& v) {
  if (n.attrs.get_int("kv_head_major", 0) == 0) return v.dims->back();
  const Dim& dv = v.dims->back();
  return dv.is_static()
             ? Dim(n.attrs.get_int("kv_heads", n.attrs.get_int("num_heads", 0)) * dv.value)
             : dv;
}

Status infer_mha(InferContext& ctx) {
  const Node& n = ctx.node();
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  const bool major = n.attrs.get_int("kv_head_major", 0) != 0;
  const TensorType& q = ctx.input_type(0);
  const TensorType& v = ctx.input_type(packed ? 0 : 2);
  if (!packed && (!ctx.has_input(1) || !ctx.has_input(2)))
    return KILN_ERROR("{}: K and V are required unless Q is packed", n.label());
  if (major) {
    KILN_RETURN_IF_ERROR(check_head_major(n, ctx.has_input(4), ctx.input_type(1), v));
  } else if (q.rank() != 3 || v.rank() != 3) {
    return KILN_ERROR("{}: Q, K and V must be 3-D [batch, sequence, heads x head size]", n.label());
  }
  if (q.rank() != 3)
    return KILN_ERROR("{}: Q must be 3-D [batch, sequence, heads x head size]", n.label());
  auto type_of = [&](size_t i) {
    return ctx.has_input(i) ? ctx.input_type(i).dtype : DataType::kUndefined;
  };
  KILN_RETURN_IF_ERROR(check_mha_rotary(n, ctx.has_input(4), ctx.has_input(5), q.dtype, type_of(4),
                                        type_of(5), type_of(6), ctx.has_input(6)));
  // A column slice (col_slices) is as wide as it says.
  auto last = [&](const TensorType& t, int slot) {
    const int64_t w = packed ? 0 : mha_col_slice(n, slot).second;
    return w > 0 ? Dim(w) : t.dims->back();
  };
  KILN_ASSIGN_OR_RETURN(MhaDims m, mha_dims(n, last(q, 0), major ? v_row_width(n, v) : last(v, 2)));
  ctx.set_output(0, TensorType(q.dtype, {(*q.dims)[0], (*q.dims)[1], Dim(m.heads * m.dv)}));
  return Status::Ok();
}

// x [B, S, G*D] -> [B, G*rep, S, D] (perm 0,2,1,3) or, for K, [B, G*rep, D, S] (perm 0,2,3,1):
// each of x's G heads repeated rep times in a row (grouped-query attention's K and V).
Expected<Tensor> split_heads(const Node& n, const Tensor& x, int64_t heads, bool k,
                             int64_t rep = 1) {
  const int64_t d = x.dim(2) / heads;
  const Tensor shape = ints({x.dim(0), x.dim(1), heads, 1, d});
  KILN_ASSIGN_OR_RETURN(Tensor r, fused::run_op(n, "Reshape", {}, {&x, &shape}));
  if (rep > 1) {
    const Tensor to = ints({x.dim(0), x.dim(1), heads, rep, d});
    KILN_ASSIGN_OR_RETURN(r, fused::run_op(n, "Expand", {}, {&r, &to}));
  }
  const Tensor flat = ints({x.dim(0), x.dim(1), heads * rep, d});
  KILN_ASSIGN_OR_RETURN(r, fused::run_op(n, "Reshape", {}, {&r, &flat}));
  Attributes perm;
  perm.set("perm", Attribute::Ints(k ? std::vector<int64_t>{0, 2, 3, 1}
                                     : std::vector<int64_t>{0, 2, 1, 3}));
  return fused::run_op(n, "Transpose", perm, {&r});
}

Status cpu_mha(KernelContext& ctx) {
  const Node& n = ctx.node();
  const bool packed = n.attrs.get_int("packed", 0) != 0;
  const bool seq_first = n.attrs.get_int("seq_first", 0) != 0;
  // Q, K and V as the attention reads them: col_slices' columns of the inputs (unpacked).
  Tensor cols[3];
  const Tensor* qkv[3] = {ctx.input(0), ctx.input(1), ctx.input(2)};
  for (int i = 0; i < 3 && !packed; ++i) {
    const auto [start, width] = mha_col_slice(n, i);
    if (width <= 0 || !qkv[i]) continue;
    const Tensor starts = ints({start}), ends = ints({start + width}), axes = ints({-1});
    KILN_ASSIGN_OR_RETURN(cols[i], fused::run_op(n, "Slice", {}, {qkv[i], &starts, &ends, &axes}));
    qkv[i] = &cols[i];
  }
  // Head-major K and V [B, Hkv, Sk, D]: as the rows [B, Sk, Hkv*D] the attention splits.
  Tensor rows[2];
  if (n.attrs.get_int("kv_head_major", 0) != 0 && qkv[1] && qkv[2]) {
    KILN_RETURN_IF_ERROR(
        check_head_major(n, ctx.input(4) != nullptr,
                         TensorType(qkv[1]->dtype(), shape_detail::to_dims(qkv[1]->shape())),
                         TensorType(qkv[2]->dtype(), shape_detail::to_dims(qkv[2]->shape()))));
    Attributes perm;
    perm.set("perm", Attribute::Ints({0, 2, 1, 3}));
    for (int i = 0; i < 2; ++i) {
      const Tensor& t = *qkv[i + 1];
      KILN_ASSIGN_OR_RETURN(Tensor tr, fused::run_op(n, "Transpose", perm, {&t}));
      const Tensor shape = ints({t.dim(0), t.dim(2), t.dim(1) * t.dim(3)});
      KILN_ASSIGN_OR_RETURN(rows[i], fused::run_op(n, "Reshape", {}, {&tr, &shape}));
      qkv[i + 1] = &rows[i];
    }
  }
  const Tensor* q_in = qkv[0];
  const Tensor* v_in = packed ? q_in : qkv[2];
  if (!q_in || !v_in || (!packed && !qkv[1]))
    return KILN_ERROR("{}: Q, K and V are required", n.label());
  if (q_in->rank() != 3 || v_in->rank() != 3)
    return KILN_ERROR("{}: Q, K and V must be 3-D", n.label());
  KILN_ASSIGN_OR_RETURN(MhaDims m, mha_dims(n, Dim(q_in->dim(2)), Dim(v_in->dim(2))));
  // Sequence-first [S, B, ..] inputs and output: swapped to batch-first around the attention.
  Attributes swap;
  swap.set("perm", Attribute::Ints({1, 0, 2}));
  std::vector<Tensor> batch_first;
  if (seq_first) {
    for (int i = 0; i < (packed ? 1 : 3); ++i) {
      KILN_ASSIGN_OR_RETURN(Tensor t, fused::run_op(n, "Transpose", swap, {qkv[i]}));
      batch_first.push_back(std::move(t));
    }
    q_in = &batch_first[0];
  }
  // The rotary on Q and K (inputs 4 to 6): RotaryEmbedding's reference kernel on the inputs, so
  // the roundings are the standalone op's.
  const bool rotary = mha_has_rotary(n);
  KILN_RETURN_IF_ERROR(check_mha_rotary(
      n, ctx.input(4) != nullptr, ctx.input(5) != nullptr, q_in->dtype(),
      ctx.input(4) ? ctx.input(4)->dtype() : DataType::kUndefined,
      ctx.input(5) ? ctx.input(5)->dtype() : DataType::kUndefined,
      ctx.input(6) ? ctx.input(6)->dtype() : DataType::kUndefined, ctx.input(6) != nullptr));
  Tensor rotated[2];
  auto rotate = [&](const Tensor* x, int slot) -> Expected<const Tensor*> {
    KILN_ASSIGN_OR_RETURN(rotated[slot],
                          fused::run_op(n, "RotaryEmbedding", rotary_attrs(n, m, slot),
                                        {x, ctx.input(4), ctx.input(5), ctx.input(6)}));
    return &rotated[slot];
  };
  if (rotary) {
    KILN_ASSIGN_OR_RETURN(q_in, rotate(q_in, 0));
  }
  const Tensor* k_in = packed ? nullptr : qkv[1];
  if (rotary && !packed) {
    KILN_ASSIGN_OR_RETURN(k_in, rotate(k_in, 1));
  }
  Tensor q = *q_in, k, v;
  if (packed) {  // Q | K | V along the last axis
    const int64_t bounds[4] = {0, m.heads * m.d, (m.heads + m.kv_heads) * m.d,
                               (m.heads + 2 * m.kv_heads) * m.d};
    const Tensor axes = ints({2});
    Tensor parts[3];
    for (int64_t i = 0; i < 3; ++i) {
      const Tensor starts = ints({bounds[i]}), ends = ints({bounds[i + 1]});
      KILN_ASSIGN_OR_RETURN(parts[i], fused::run_op(n, "Slice", {}, {q_in, &starts, &ends, &axes}));
    }
    q = std::move(parts[0]), k = std::move(parts[1]), v = std::move(parts[2]);
  } else {
    k = seq_first ? batch_first[1] : *k_in;
    v = seq_first ? batch_first[2] : *qkv[2];
  }
  const int64_t rep = m.heads / m.kv_heads;
  KILN_ASSIGN_OR_RETURN(Tensor q4, split_heads(n, q, m.heads, false));
  KILN_ASSIGN_OR_RETURN(Tensor kt4, split_heads(n, k, m.kv_heads, true, rep));
  KILN_ASSIGN_OR_RETURN(Tensor v4, split_heads(n, v, m.kv_heads, false, rep));
  std::vector<Tensor> outs(1);
  KernelContext attn(n, {&q4, &kt4, &v4, ctx.input(3)}, outs);
  KILN_RETURN_IF_ERROR(cpu_attention(attn));
  Attributes perm;
  perm.set("perm", Attribute::Ints({0, 2, 1, 3}));
  KILN_ASSIGN_OR_RETURN(Tensor merged, fused::run_op(n, "Transpose", perm, {&outs[0]}));
  const Tensor shape = ints({merged.dim(0), merged.dim(1), m.heads * m.dv});
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::run_op(n, "Reshape", {}, {&merged, &shape}));
  if (seq_first) {
    KILN_ASSIGN_OR_RETURN(y, fused::run_op(n, "Transpose", swap, {&y}));
  }
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

}  // namespace

Status unfuse_attention_rotary(Graph& g, Node* n) {
  if (n->domain != "kiln" || n->op_type != "MultiHeadAttention" || !mha_has_rotary(*n))
    return KILN_ERROR("{}: not an attention with the rotary", n->label());
  const bool packed = n->attrs.get_int("packed", 0) != 0;
  const TensorType& q = n->input(0)->type;
  const Value* vv = n->input(packed ? 0 : 2);
  if (!q.has_rank() || !vv || !vv->type.has_rank())
    return KILN_ERROR("{}: Q's or V's rank is unknown", n->label());
  KILN_ASSIGN_OR_RETURN(MhaDims m, mha_dims(*n, q.dims->back(), vv->type.dims->back()));
  std::vector<Value*> caches = {n->input(4), n->input(5),
                                n->num_inputs() > 6 ? n->input(6) : nullptr};
  if (!caches.back()) caches.pop_back();
  for (int slot = 0; slot < (packed ? 1 : 2); ++slot) {
    std::vector<Value*> ins = {n->input(slot)};
    ins.insert(ins.end(), caches.begin(), caches.end());
    const std::string name = g.unique_name(n->name + "/RotaryEmbedding");
    Node* r = g.insert_node_before(n, "RotaryEmbedding", name, ins, {name});
    r->attrs = rotary_attrs(*n, m, slot);
    r->origin = n->origin.empty() ? "unfuse" : n->origin + "+unfuse";
    r->onnx_nodes = n->onnx_nodes;
    r->output(0)->type = n->input(slot)->type;
    g.set_input(n, slot, r->output(0));
  }
  while (n->num_inputs() > 4) g.remove_node_input(n, n->num_inputs() - 1);
  n->attrs.erase("rotary_interleaved");
  return Status::Ok();
}

namespace {

// --- kiln.SkipLayerNorm
// -------------------------------------------------------------------------------

Status infer_skip_layernorm(InferContext& ctx) {
  const Node& n = ctx.node();
  const TensorType& x = ctx.input_type(0);
  const TensorType& s = ctx.input_type(1);
  if (!ctx.has_input(1) || !ctx.has_input(2))
    return KILN_ERROR("{}: SkipLayerNorm needs X, Skip and Scale", n.label());
  if (x.has_rank() && s.has_rank() && x.rank() != s.rank())
    return KILN_ERROR("{}: X {} and Skip {} differ in rank", n.label(), x.str(), s.str());
  if (n.attrs.get_int("axis", -1) != -1)
    return KILN_ERROR("{}: SkipLayerNorm normalizes the last axis only", n.label());
  TensorType y = x;
  if (y.has_rank() && s.has_rank())  // a dim only Skip knows statically is kept
    for (size_t i = 0; i < y.dims->size(); ++i)
      if (!(*y.dims)[i].is_static()) (*y.dims)[i] = (*s.dims)[i];
  ctx.set_output(0, y);
  if (ctx.num_outputs() > 1) ctx.set_output(1, y);
  return Status::Ok();
}

Status cpu_skip_layernorm(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (!ctx.input(0) || !ctx.input(1) || !ctx.input(2))
    return KILN_ERROR("{}: SkipLayerNorm needs X, Skip and Scale", n.label());
  if (ctx.input(0)->shape() != ctx.input(1)->shape())
    return KILN_ERROR("{}: X {} and Skip {} differ in shape", n.label(),
                      shape_str(ctx.input(0)->shape()), shape_str(ctx.input(1)->shape()));
  KILN_ASSIGN_OR_RETURN(Tensor sum, fused::run_op(n, "Add", {}, {ctx.input(0), ctx.input(1)}));
  Attributes ln = n.attrs;
  ln.set("axis", Attribute::Int(-1));
  KILN_ASSIGN_OR_RETURN(
      Tensor y, fused::run_op(n, "LayerNormalization", ln, {&sum, ctx.input(2), ctx.input(3)}));
  ctx.set_output(0, std::move(y));
  if (ctx.num_outputs() > 1) ctx.set_output(1, std::move(sum));
  return Status::Ok();
}

}  // namespace

std::span<const OpDef> transformer_ops() {
  static const OpDef kOps[] = {
      {"kiln", "MultiHeadAttention", infer_mha, cpu_mha, nullptr},
      {"kiln", "SkipLayerNorm", infer_skip_layernorm, cpu_skip_layernorm, nullptr},
  };
  return kOps;
}

}  // namespace kiln
