// A multiplication by a constant that varies only along a product's output channels folds into
// the product's weights and bias:
//   Conv|FusedConv(x, W, b) -> Mul(c)              =>  Conv|FusedConv(x, W * c, b * c)
//   Gemm|MatMul|FusedGemm(a, B, C) -> Mul(c)       =>  the same with op(B)'s columns and C * c
// c broadcasting along the channel axis only (or a scalar): a transformer's or ConvNeXt's layer
// scale (x * gamma: BEiT, CaiT, DeiT III, EVA, ConvNeXt), a per-channel gain. A Transpose
// between the product and the Mul (ConvNeXt's permute back to NCHW before its gamma) is seen
// through: c's varying axis must be the one the channels moved to. The product then writes the
// scaled values and the Mul goes, with the pass over the tensor it made; an Add after it (the
// residual) meets the product or a LayerNorm directly. Only for constant weights and bias, no
// activation or residual in the fused layer yet, and an output read by the Mul (and the
// Transpose) alone.
#include <algorithm>
#include <cmath>

#include "ops/fused.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

bool const_or_absent(const Node& n, size_t i) { return !n.input(i) || n.input(i)->is_constant(); }

// The product's kind, its output channel axis and count, or nullopt (with the reason) when it
// cannot take a scale.
struct Product {
  bool conv = false;  // Conv/FusedConv (W [M, ...]); else a GEMM (B [K, N] or [N, K])
  bool trans_b = false;
  int64_t axis = 0;   // of its output
  int64_t channels = 0;
  // The output channel of weight element i (of `w`, this product's weights).
  size_t channel_of(size_t i, const Tensor& w) const {
    const size_t cols = static_cast<size_t>(w.dim(1));
    if (conv) return i / (static_cast<size_t>(w.numel()) / static_cast<size_t>(channels));
    return trans_b ? i / cols : i % cols;
  }
};
constexpr size_t kBiasSlot = 2;  // Conv's B, Gemm's C, FusedConv's and FusedGemm's bias

std::optional<Product> product_of(const Node& p, std::string* why) {
  const bool conv = is_op(&p, "Conv") || is_kiln_op(&p, "FusedConv");
  const bool gemm = is_op(&p, "Gemm") || is_op(&p, "MatMul") || is_kiln_op(&p, "FusedGemm");
  if (!conv && !gemm) return *why = "not a convolution or matrix product", std::nullopt;
  if (p.domain == "kiln" && (!p.attrs.get_string("activation", "").empty() ||
                             has_post_steps(p) || (p.num_inputs() > 3 && p.input(3))))
    return *why = "the layer already applies an activation or adds a residual", std::nullopt;
  if (p.attrs.get_int("int8", 0) != 0) return *why = "an INT8 layer", std::nullopt;
  if (!p.input(1) || !p.input(1)->is_constant() || !const_or_absent(p, 2))
    return *why = "weights or bias are not constant", std::nullopt;
  const Tensor& w = *p.input(1)->constant;
  const Value* y = p.output(0);
  if (!dtype_is_float(w.dtype()) || !y || !y->type.has_rank())
    return *why = "not float weights and an output of known rank", std::nullopt;
  Product r;
  r.conv = conv;
  if (conv) {
    if (w.rank() < 3) return *why = "weights of rank < 3", std::nullopt;
    r.axis = 1;
    r.channels = w.dim(0);
    return r;
  }
  const std::string base = p.domain.empty() ? p.op_type : p.attrs.get_string("base", "");
  if (w.rank() != 2) return *why = "batched weights", std::nullopt;
  r.trans_b = base == "Gemm" && p.attrs.get_int("transB", 0) != 0;
  r.axis = y->type.rank() - 1;
  r.channels = r.trans_b ? w.dim(0) : w.dim(1);
  return r;
}

struct FoldChannelScale {
  struct Match {
    Node* product;
    Node* mul;
    Product kind;
    std::vector<double> scale;  // per channel
  };

  static std::optional<Match> match(PassContext& ctx, Node& mul) {
    if (!is_op(&mul, "Mul") || mul.num_inputs() != 2) return std::nullopt;
    const int k = mul.input(1) && mul.input(1)->is_constant() ? 1
                  : mul.input(0) && mul.input(0)->is_constant() ? 0
                                                                 : -1;
    if (k < 0) return std::nullopt;
    const Value* x = mul.input(1 - k);
    const Tensor& c = *mul.input(k)->constant;
    Node* t = producer_if(x, "Transpose");
    const Value* y = t ? t->input(0) : x;
    Node* p = y ? y->producer : nullptr;
    if (!p || y->producer_index != 0) return std::nullopt;
    auto reject = [&](const std::string& why) {
      ctx.note(fmt::format("{} -> {}: {}", p->label(), mul.label(), why));
      return std::nullopt;
    };
    std::string why;
    const std::optional<Product> kind = product_of(*p, &why);
    if (!kind) return reject(why);
    if (!single_use(ctx.g, y) || (t && !single_use(ctx.g, x)))
      return reject("the product's output is read elsewhere too");
    // (The Mul's output may be a graph output: the product or the Transpose, whose output the
    // Mul alone reads, takes it over.)
    if (!dtype_is_float(c.dtype()) || !x->type.has_rank() || c.rank() > x->type.rank())
      return reject("not a float constant of at most the operand's rank");
    // The axis of the Mul's operand along which c varies (-1: nowhere, a scalar).
    const int64_t rank = x->type.rank();
    int64_t varying = -1;
    for (int64_t i = 0; i < c.rank(); ++i)
      if (c.dim(i) != 1) {
        if (varying >= 0) return reject("the constant varies along more than one axis");
        varying = rank - c.rank() + i;
      }
    if (varying >= 0) {
      const std::vector<int64_t> perm = t ? transpose_perm(*t) : std::vector<int64_t>{};
      if (t && static_cast<int64_t>(perm.size()) != rank) return reject("unknown permutation");
      const int64_t from = t ? perm[static_cast<size_t>(varying)] : varying;
      if (from != kind->axis || c.dim(varying - (rank - c.rank())) != kind->channels)
        return reject("the constant does not vary along the product's output channels");
    }
    // Gemm's C (or FusedGemm's bias) must be scalable per column: of the columns' length, or
    // uniform when c is not.
    if (const Value* b = p->input(kBiasSlot); b && !kind->conv) {
      const Tensor& bt = *b->constant;
      const bool per_col = bt.rank() >= 1 && bt.dim(bt.rank() - 1) == kind->channels;
      if (!per_col && !(bt.numel() == 1 && varying < 0))
        return reject("the bias does not run along the product's columns");
    }
    std::vector<double> s(static_cast<size_t>(kind->channels));
    const std::vector<double> cv = tensor_values(c);
    for (size_t i = 0; i < s.size(); ++i) s[i] = cv[varying < 0 ? 0 : i];
    if (loses_half_precision(*p->input(1)->constant, *kind, s))
      return reject("the scaled weights would fall below float16's normal range");
    return Match{p, &mul, *kind, std::move(s)};
  }

  // Weights stored in float16 (an FP16 or INT8 build's float layers, a model.half() export)
  // keep 11 bits relative to themselves only down to 2^-14; below, the step is a fixed 2^-24. A
  // small layer scale (ConvNeXt's and DeiT III's start at 1e-6) would push a channel's weights
  // there, where the unfolded Mul scales the product's float32 sums instead. The fold is refused
  // when a channel shrinks (|s| < 1) and its largest scaled weight is under 2^-12: above that,
  // the fixed step is at most 2^-12 of the channel's largest weight, half float16's own rounding
  // step of it. Whatever the build's precision: INT8 calibration optimizes the model at FP32 and
  // its graph serves the FP16 and INT8 builds too.
  static bool loses_half_precision(const Tensor& w, const Product& kind,
                                   const std::vector<double>& s) {
    constexpr double kFloor = 1.0 / 4096;  // 2^-12
    const std::vector<double> wv = tensor_values(w);
    std::vector<double> top(s.size(), 0.0);
    for (size_t i = 0; i < wv.size(); ++i) {
      const size_t ch = kind.channel_of(i, w);
      top[ch] = std::max(top[ch], std::abs(wv[i] * s[ch]));
    }
    for (size_t ch = 0; ch < s.size(); ++ch)
      if (std::abs(s[ch]) < 1 && top[ch] < kFloor) return true;
    return false;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    Node& p = *m.product;
    const size_t C = m.scale.size();
    const Tensor& w = *p.input(1)->constant;
    std::vector<double> wv = tensor_values(w);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] *= m.scale[m.kind.channel_of(i, w)];
    g.set_input(&p, 1,
                g.add_constant(g.unique_name(p.name + "_w_scaled"),
                               Tensor::from<double>(w.shape(), wv).cast(w.dtype())));
    if (const Value* b = p.input(kBiasSlot)) {
      const Tensor& bt = *b->constant;
      std::vector<double> bv = tensor_values(bt);
      if (bt.numel() == 1) {
        bv[0] *= m.scale[0];  // uniform: c is a scalar (match)
      } else {
        for (size_t i = 0; i < bv.size(); ++i) bv[i] *= m.scale[i % C];
      }
      g.set_input(&p, kBiasSlot,
                  g.add_constant(g.unique_name(p.name + "_b_scaled"),
                                 Tensor::from<double>(bt.shape(), bv).cast(bt.dtype())));
    }
    merge_onnx_nodes(p, *m.mul);
    // The Mul's output value stays, made now by the product (or the Transpose after it): what
    // they write are the scaled values, so no tensor keeps the name of an unscaled one of the
    // model (kiln compare --per-layer matches tensors by name). Behind a Transpose the product's
    // output gets a new name.
    Node* mul = m.mul;
    Value* operand = mul->input(mul->input(1)->is_constant() ? 0 : 1);
    Value* out = mul->output(0);
    Node* maker = operand->producer;
    const auto idx = static_cast<size_t>(operand->producer_index);
    KILN_RETURN_IF_ERROR(g.remove_node(mul, true));
    g.set_node_output(maker, idx, out);
    if (maker != &p)
      KILN_RETURN_IF_ERROR(
          g.rename_value(p.output(0), g.unique_name(p.output(0)->name + "_scaled")));
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> fold_channel_scale(PassContext& ctx) {
  return apply_pattern<FoldChannelScale>(ctx);
}

}  // namespace kiln::passes
