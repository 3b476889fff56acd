// Q, K and V of a kiln.MultiHeadAttention read from one [B, S, (H + 2*Hkv)*D] tensor (packed = 1;
// Hkv = H unless grouped-query):
//   MHA(Split(x, [H*D, Hkv*D, Hkv*D], last axis))                =>  MHA(x)[packed]
// GPT-2's c_attn followed by split(), and every separate Q, K and V projection once pack_gemm
// has made them one GEMM and a Split (BERT, ViT, Llama after fuse_rotary has made its two
// rotaries one over the packed tensor's Q and K heads, or after fuse_attention_rotary has put
// them into the attention: the rotary stays in it, over the packed Q and K heads). The attention
// layer reads the three parts through strides, so no Split runs. Each part must be used by the
// attention only.
// Then (ReadPartsInPlace below) the attention reads K and V parts of other Splits in place.
#include <algorithm>

#include "ops/fused.h"
#include "ops/shape_values.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

struct PackQkv {
  struct Match {
    Node* mha;
    Node* split;
  };

  static std::optional<Match> match(PassContext& ctx, Node& mha) {
    if (!is_kiln_op(&mha, "MultiHeadAttention") || mha.attrs.get_int("packed", 0) != 0)
      return std::nullopt;
    Value* parts[3] = {mha.input(0), mha.input(1), mha.input(2)};
    for (Value* p : parts)
      if (!p || !single_use(ctx.g, p) || p->type.rank() != 3) return std::nullopt;
    if (parts[0] == parts[1] || parts[1] == parts[2] || parts[0] == parts[2]) return std::nullopt;
    Attributes a = mha.attrs;
    a.set("packed", Attribute::Int(1));
    Node* s = parts[0]->producer;
    if (is_op(s, "Split") && s->num_outputs() == 3 && parts[1]->producer == s &&
        parts[2]->producer == s && parts[0] == s->output(0) && parts[1] == s->output(1) &&
        parts[2] == s->output(2)) {
      const Value* x = s->input(0);
      const int64_t axis = s->attrs.get_int("axis", 0);
      // Q's part is H heads wide, K's and V's Hkv heads each.
      const Dim &wq = parts[0]->type.dims->back(), &wk = parts[1]->type.dims->back();
      const int64_t h = mha.attrs.get_int("num_heads", 0), hkv = mha.attrs.get_int("kv_heads", h);
      if ((axis != -1 && axis != 2) || !wq.is_static() || !wk.is_static() ||
          wq.value * hkv != wk.value * h ||
          !same_dim(x->type.dims->back(), Dim(wq.value + 2 * wk.value)) ||
          !same_dims(parts[1]->type, parts[2]->type)) {
        ctx.note(fmt::format("{}: {} does not split its last axis into Q, K and V heads",
                             mha.label(), s->label()));
        return std::nullopt;
      }
      if (!supported(ctx, mha, a, x)) return std::nullopt;
      return Match{&mha, s};
    }
    return std::nullopt;
  }

  static bool supported(PassContext& ctx, const Node& mha, const Attributes& a, const Value* x) {
    // Q, K and V as one input; the mask and a rotary's caches and position ids (inputs 3 to 6)
    // as they are.
    std::vector<Value*> ins(mha.inputs().begin(), mha.inputs().end());
    ins.resize(std::max<size_t>(ins.size(), 4), nullptr);
    ins[0] = const_cast<Value*>(x), ins[1] = ins[2] = nullptr;
    auto layer = scratch_layer("kiln", "MultiHeadAttention", ins, a, mha.output(0));
    return ctx.backend_supports("kiln", "MultiHeadAttention", a, x->type.dtype, layer->nodes()[0]);
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Value* packed = m.split->input(0);
    g.set_input(m.mha, 0, packed);
    g.set_input(m.mha, 1, nullptr);
    g.set_input(m.mha, 2, nullptr);
    m.mha->attrs.set("packed", Attribute::Int(1));
    m.mha->origin = ctx.pass;
    merge_onnx_nodes(*m.mha, *m.split);
    KILN_RETURN_IF_ERROR(g.remove_node(m.split));
    return Status::Ok();
  }
};

// K and V (and Q) that are parts of last-axis Splits of other tensors, read in place:
//   MHA(q, Split(x)[i], Split(x)[j])  =>  MHA(q, x, x)[col_slices: x's columns of each part]
// The cross-attention of a decoder or a diffusion UNet, where pack_gemm made every layer's K and
// V projections of the one encoder output a single GEMM: without this, the Split would copy
// them apart. Only once PackQkv has had its chance (Q, K and V parts of one three-way Split
// pack), for unpacked attention without the rotary; both K and V must be parts (a rotary on K,
// which fuse_attention_rotary may yet take into the attention, keeps the layer as it is). Beside
// a KV cache (kv_head_major: K and V are the cache), Q alone: the part of a decoder's packed
// Q|K projection (after its rotary) that the attention reads, whose Split then goes.
struct ReadPartsInPlace {
  struct Match {
    Node* mha;
    std::vector<Value*> ins;
    Attributes attrs;
  };

  static std::optional<Match> match(PassContext& ctx, Node& mha) {
    if (!is_kiln_op(&mha, "MultiHeadAttention") || mha.attrs.get_int("packed", 0) != 0 ||
        mha_has_rotary(mha) || mha.attrs.has("col_slices") || mha.num_inputs() < 3)
      return std::nullopt;
    std::optional<ColumnPart> parts[3];
    for (int i = 0; i < 3; ++i) {
      const Value* v = mha.input(i);
      parts[i] = column_part(v);
      // A part of the same rank and type, its other dims x's (a last-axis Split or Slice).
      if (parts[i] && (parts[i]->x->type.dtype != v->type.dtype || v->type.rank() != 3))
        parts[i].reset();
    }
    const bool cache = mha.attrs.get_int("kv_head_major", 0) != 0;
    if (cache) parts[1].reset(), parts[2].reset();
    if (cache ? !parts[0] : !parts[1] || !parts[2]) return std::nullopt;
    std::vector<Value*> ins(mha.inputs().begin(), mha.inputs().end());
    std::vector<int64_t> cols(6, 0);
    for (int i = 0; i < 3; ++i) {
      if (!parts[i]) continue;
      ins[i] = parts[i]->x;
      cols[2 * i] = parts[i]->start;
      cols[2 * i + 1] = parts[i]->width;
    }
    Attributes a = mha.attrs;
    a.set("col_slices", Attribute::Ints(cols));
    auto layer = scratch_layer("kiln", "MultiHeadAttention", ins, a, mha.output(0));
    if (!ctx.backend_supports("kiln", "MultiHeadAttention", a, ins[0]->type.dtype,
                              layer->nodes()[0])) {
      ctx.note(fmt::format("{}: the backend cannot read its inputs as columns of wider tensors",
                           mha.label()));
      return std::nullopt;
    }
    return Match{&mha, std::move(ins), std::move(a)};
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    for (size_t i = 0; i < 3; ++i)
      if (m.mha->input(i) != m.ins[i]) ctx.g.set_input(m.mha, i, m.ins[i]);
    m.mha->attrs = m.attrs;
    m.mha->origin = ctx.pass;
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> pack_qkv(PassContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool packed, apply_pattern<PackQkv>(ctx));
  KILN_ASSIGN_OR_RETURN(bool parts, apply_pattern<ReadPartsInPlace>(ctx));
  return packed || parts;
}

}  // namespace kiln::passes
