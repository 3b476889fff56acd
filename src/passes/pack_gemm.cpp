// Horizontal GEMM packing: sibling products of one activation by constant weights become one
// GEMM whose weight is theirs side by side; each sibling's result is a column range of it:
//   Y1 = G(X, W1, b1), ..., Yn = G(X, Wn, bn)
//     =>  P = FusedGemm(X, [W1 | ... | Wn], [b1 | ... | bn]);  (Y1, ..., Yn) = Split(P, last axis)
// G is a MatMul by a constant [K, Ni] weight or a FusedGemm[MatMul] with a constant weight, an
// optional constant bias of Ni values and no residual or INT8; siblings pack when their weights
// have one type and they carry the same activation (an absent bias packs as zeros). n >= 2, in
// node order.
//
// The Split is the packed form's notation, not a copy: the readers of the parts read them in
// place, each by its own rule: kiln.MultiHeadAttention reads Q, K and V parts of one tensor as a
// packed input (pack_qkv), RotaryEmbeddings on parts become one rotary over a head range of the
// packed tensor (fuse_rotary), an elementwise chain reads its operands as column slices
// (fuse_elementwise), and a region of layout ops that copies reads its part as a Slice
// (fuse_relayout). So a sibling packs only where every reader of its result is one of these
// (else the note names the reader that would need a copy of its columns). Llama's Q, K and V
// projections and its MLP's gate and up projections each become one GEMM this way; BERT's and
// ViT's Q, K and V too.
#include <cstring>
#include <algorithm>

#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// Concatenates 2-D [K, Ni] weights along axis 1 (rows > 0), or 1-D biases (rows == 0; absent
// ones as zeros).
Tensor concat_last(const std::vector<const Tensor*>& parts, const std::vector<int64_t>& widths,
                   DataType dt, int64_t rows) {
  int64_t total = 0;
  for (int64_t w : widths) total += w;
  Tensor out(dt, rows == 0 ? std::vector<int64_t>{total} : std::vector<int64_t>{rows, total});
  const size_t es = dtype_size(dt);
  auto* dst = static_cast<uint8_t*>(out.raw());
  std::memset(dst, 0, static_cast<size_t>(out.numel()) * es);
  const int64_t r = std::max<int64_t>(rows, 1);
  int64_t col = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p]) {
      const auto* src = static_cast<const uint8_t*>(parts[p]->raw());
      for (int64_t i = 0; i < r; ++i)
        std::memcpy(dst + (i * total + col) * es, src + i * widths[p] * es, widths[p] * es);
    }
    col += widths[p];
  }
  return out;
}

// Whether layout op n (reading the part) leads, through layout ops whose results nothing else
// reads, to one that copies (Transpose, Slice, Concat, Pad, Expand): then fuse_relayout makes them
// one kiln.Relayout reading the part as a Slice of the packed result (a decoder's V projection
// going into its KV cache's Concat).
bool reaches_relayout_copy(const Graph& g, const Node* n) {
  for (int steps = 0; n && steps < 12; ++steps) {
    if (!n->domain.empty() || !relayout_op_supported(n->op_type) || n->num_outputs() != 1)
      return false;
    const std::string& op = n->op_type;
    for (size_t j = 1; j < n->num_inputs() && op != "Concat"; ++j)  // shapes, starts, pads
      if (n->input(j) && !n->input(j)->is_constant()) return false;
    if (op != "Reshape" && op != "Squeeze" && op != "Unsqueeze" && op != "Flatten") return true;
    const Value* o = n->output(0);
    if (!o || o->uses().size() != 1 || g.is_graph_output(o)) return false;
    n = o->uses()[0].first;
  }
  return false;
}

// Can `reader` read its operand `v` as a column slice of a packed result in place? (The rules
// that make it do so are in the passes named above.)
bool reads_slice_in_place(const Graph& g, const Node* reader, const Value* v) {
  if (is_kiln_op(reader, "MultiHeadAttention")) {
    for (size_t i = 0; i < 3; ++i)
      if (reader->input(i) == v) return reader->input(3) != v;
    return false;
  }
  if (is_op(reader, "RotaryEmbedding"))
    return reader->input(0) == v && v->type.rank() == 3 && reader->input(1) != v &&
           reader->input(2) != v;
  if (is_kiln_op(reader, "ElementwiseChain")) return true;
  if (reader->domain.empty() && relayout_op_supported(reader->op_type) &&
      (reader->op_type == "Concat" || reader->input(0) == v))
    return reaches_relayout_copy(g, reader);
  return reader->domain.empty() && chain_op_supported(reader->op_type) &&
         reader->num_outputs() == 1 && reader->output(0) &&
         reader->output(0)->type.dtype == v->type.dtype && same_dims(reader->output(0)->type, v->type);
}

struct PackGemm {
  struct Match {
    Value* x;
    std::vector<Node*> gemms;  // in node order
    Attributes attrs;          // the packed FusedGemm's
  };

  // The weight of a packable product, or nullptr (with the reason in *why).
  static const Tensor* weight(const Node* n, std::string* why) {
    const bool fused = is_kiln_op(n, "FusedGemm");
    if (!is_op(n, "MatMul") && !fused) return nullptr;
    if (fused && (n->attrs.get_string("base", "") != "MatMul" || n->input(3) ||
                  n->attrs.get_int("int8", 0) != 0)) {
      *why = "a residual, INT8 or a Gemm base";
      return nullptr;
    }
    const Value* w = n->input(1);
    if (!w || !w->is_constant()) {
      *why = "its weight is not a constant";
      return nullptr;
    }
    if (w->constant->rank() != 2) {
      *why = "its weight is not a 2-D [K, N] matrix";
      return nullptr;
    }
    const Value* b = n->input(2);
    if (fused && b && (!b->is_constant() || b->constant->rank() != 1 ||
                       b->constant->dim(0) != w->constant->dim(1) ||
                       b->constant->dtype() != w->constant->dtype())) {
      *why = "its bias is not a constant of N values";
      return nullptr;
    }
    const Value* y = n->output(0);
    if (!y || !y->type.has_rank() || y->type.rank() < 2) {
      *why = "its result's rank is unknown";
      return nullptr;
    }
    return w->constant.get();
  }

  // The attributes a packed layer keeps (the activation), as a key: products with different
  // epilogues do not pack.
  static Attributes epilogue(const Node* n) {
    Attributes a;
    if (is_kiln_op(n, "FusedGemm"))
      for (const auto& [name, v] : n->attrs.all())
        if (name != "base") a.set(name, v);
    a.set("base", Attribute::String("MatMul"));
    return a;
  }
  static std::string key(const Attributes& a, DataType dt) {
    std::string k(dtype_name(dt));
    for (const auto& [name, v] : a.all()) k += ";" + name + "=" + v.str();
    return k;
  }

  static std::optional<Match> match(PassContext& ctx, Node& first) {
    std::string why;
    const Tensor* w0 = weight(&first, &why);
    if (!w0) return std::nullopt;
    Value* x = first.input(0);
    if (!x) return std::nullopt;
    const std::string k0 = key(epilogue(&first), w0->dtype());
    std::vector<Node*> group;
    std::vector<std::string> notes;  // kept only where `first` leads its group
    // Siblings: the products of x in node order; `first` must be the earliest that packs.
    std::vector<Node*> readers;
    for (const auto& [n, slot] : x->uses())
      if (slot == 0 && std::find(readers.begin(), readers.end(), n) == readers.end())
        readers.push_back(n);
    std::sort(readers.begin(), readers.end(),
              [](const Node* a, const Node* b) { return a->index < b->index; });
    for (Node* n : readers) {
      std::string reason;
      const Tensor* w = weight(n, &reason);
      if (!w) {
        if (!reason.empty() && n != &first)
          notes.push_back(fmt::format("{} and {}: the second does not pack: {}", first.label(),
                                      n->label(), reason));
        continue;
      }
      if (n->input(1) == x) continue;  // x times itself
      if (w->dim(0) != w0->dim(0)) {
        notes.push_back(fmt::format("{} and {}: the weights' K differ ({} and {})", first.label(),
                             n->label(), w0->dim(0), w->dim(0)));
        continue;
      }
      const std::string k = key(epilogue(n), w->dtype());
      if (k != k0) {
        notes.push_back(fmt::format("{} and {}: different weight types or epilogues ({} and {})",
                             first.label(), n->label(), k0, k));
        continue;
      }
      const Value* y = n->output(0);
      if (ctx.g.is_graph_output(y)) {
        notes.push_back(fmt::format("{}: its result is a graph output", n->label()));
        continue;
      }
      const Node* copier = nullptr;
      for (const auto& [r, slot] : y->uses())
        if (!reads_slice_in_place(ctx.g, r, y)) copier = r;
      if (copier) {
        notes.push_back(fmt::format("{}: its reader {} cannot read a column slice in place (packed, the "
                             "columns would be copied)",
                             n->label(), copier->label()));
        continue;
      }
      group.push_back(n);
    }
    if (group.size() >= 2 && group[0] == &first && !rotaries_merge(group))
      notes.push_back(fmt::format(
          "{} and its siblings: rotaries on their results read different caches or attributes, "
          "or rotate parts that are not adjacent (one rotary could not take them: packed, the "
          "columns would be copied)",
          first.label()));
    if (group.empty() || group[0] == &first)
      for (std::string& s : notes) ctx.note(std::move(s));
    if (group.size() < 2 || group[0] != &first || !rotaries_merge(group)) return std::nullopt;
    return Match{x, group, epilogue(&first)};
  }

  // Whether the RotaryEmbeddings reading the group's results can become one rotary over the
  // packed tensor (fuse_rotary's RotaryOverSplit): one reader each, the same caches, position ids
  // and attributes but num_heads, on results next to each other.
  static bool rotaries_merge(const std::vector<Node*>& group) {
    const Node* r0 = nullptr;
    size_t last = 0;
    for (size_t i = 0; i < group.size(); ++i) {
      const Value* y = group[i]->output(0);
      const Node* r = nullptr;
      for (const auto& [n, slot] : y->uses())
        if (is_op(n, "RotaryEmbedding")) r = n;
      if (!r) continue;
      if (y->uses().size() != 1) return false;
      if (!r0) {
        r0 = r;
      } else {
        if (i != last + 1) return false;
        for (size_t k = 1; k < std::max(r->num_inputs(), r0->num_inputs()); ++k)
          if (r->input(k) != r0->input(k)) return false;
        for (const Node* a : {r, r0})
          for (const auto& [name, v] : a->attrs.all()) {
            const Attribute* o = (a == r ? r0 : r)->attrs.find(name);
            if (name != "num_heads" && (!o || o->str() != v.str())) return false;
          }
      }
      last = i;
    }
    return true;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    std::vector<const Tensor*> ws, bs;
    std::vector<int64_t> widths;
    bool any_bias = false;
    for (Node* p : m.gemms) {
      ws.push_back(p->input(1)->constant.get());
      const bool fused = is_kiln_op(p, "FusedGemm");
      bs.push_back(fused && p->input(2) ? p->input(2)->constant.get() : nullptr);
      any_bias |= bs.back() != nullptr;
      widths.push_back(ws.back()->dim(1));
    }
    Node* first = m.gemms[0];
    const Tensor& w0 = *ws[0];
    const std::string base = first->name + "_packed";
    Value* w = g.add_constant(g.unique_name(base + "_weight"),
                              concat_last(ws, widths, w0.dtype(), w0.dim(0)));
    Value* b =
        any_bias ? g.add_constant(g.unique_name(base + "_bias"), concat_last(bs, widths, w0.dtype(), 0))
                 : nullptr;
    Node* fused = g.insert_node_before(first, "FusedGemm", g.unique_name(base), {m.x, w, b},
                                       {g.unique_name(base)}, "kiln");
    fused->attrs = m.attrs;
    fused->origin = ctx.pass;
    Value* sizes = g.add_constant(g.unique_name(base + "_widths"),
                                  Tensor::from<int64_t>({int64_t(widths.size())}, widths));
    std::vector<std::string> names;
    for (Node* p : m.gemms) names.push_back(g.unique_name(p->output(0)->name + "_part"));
    Node* split = g.insert_node_before(first, "Split", g.unique_name(base + "_split"),
                                       {fused->output(0), sizes}, names);
    split->attrs.set("axis", Attribute::Int(-1));
    split->origin = ctx.pass;
    for (size_t i = 0; i < m.gemms.size(); ++i) {
      Node* p = m.gemms[i];
      merge_onnx_nodes(*fused, *p);
      merge_onnx_nodes(*split, *p);
      split->output(i)->type = p->output(0)->type;
      g.replace_all_uses(p->output(0), split->output(i));
    }
    for (Node* p : m.gemms) KILN_RETURN_IF_ERROR(g.remove_node(p));
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> pack_gemm(PassContext& ctx) { return apply_pattern<PackGemm>(ctx); }

}  // namespace kiln::passes
