// A zero Pad in front of convolutions becomes the convolutions' own padding:
//   Conv(Pad(x, pads, 0))  =>  Conv(x, pads = conv pads + the Pad's spatial pads)
// TensorFlow's "SAME" padding as tf2onnx and timm's TF ports (EfficientNet-TF, MaxViT-TF,
// MobileNet-TF) export it: a strided convolution's padding is asymmetric (0 before, 1 after on
// an even image), which ONNX Conv's pads attribute can say but PyTorch's conv cannot, so it is a
// Pad of its own. Folded, the copy of the padded tensor goes: kiln's depthwise kernels read
// asymmetric padding directly, and where a library takes only symmetric padding the convolution
// layer pads into its workspace itself (as the Pad did, one copy fewer to plan and launch).
// Applies where the Pad is mode constant with value 0 (or none), its pads are constant, not
// negative, zero on the batch and channel axes, and every reader of its output is a Conv (or a
// fused one) with auto_pad NOTSET taking it as X (the Pad goes with the last of them).
#include <algorithm>

#include "ops/shape_util.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

// The Pad's amounts as 2 * rank values, begins then ends (ops' full_pads), or why not a zero
// Pad that a convolution can take.
std::string spatial_pads(const Node& pad, int64_t rank, std::vector<int64_t>* pads) {
  if (pad.attrs.get_string("mode", "constant") != "constant") return "not a constant pad";
  const Value* p = pad.input(1);
  if (!p || !p->is_constant()) return "pads are not constant";
  if (const Value* v = pad.num_inputs() > 2 ? pad.input(2) : nullptr) {
    if (!v->is_constant()) return "the pad value is not constant";
    const std::vector<double> vals = tensor_values(*v->constant);
    if (std::any_of(vals.begin(), vals.end(), [](double d) { return d != 0.0; }))
      return "the pad value is not zero";
  }
  const Value* ax = pad.num_inputs() > 3 ? pad.input(3) : nullptr;
  if (ax && !ax->is_constant()) return "axes are not constant";
  auto full = shape_detail::full_pads(pad, rank, p->constant->to_int64_vector(),
                                      ax ? ax->constant.get() : nullptr);
  if (!full.ok()) return full.status().message();
  *pads = std::move(full).value();
  for (int64_t a = 0; a < rank; ++a) {
    const int64_t b = (*pads)[static_cast<size_t>(a)], e = (*pads)[static_cast<size_t>(rank + a)];
    if (b < 0 || e < 0) return "negative pads (a crop)";
    if (a < 2 && (b != 0 || e != 0)) return "pads on the batch or channel axis";
  }
  return "";
}

// Conv, or a fused convolution made of one (kiln.FusedConv, kiln.FusedConvMean: a Pad whose
// Shape reader folded only after fuse_conv_act took its convolution); their convolution
// attributes are the Conv's own.
bool takes_pads(const Node* c) {
  return is_op(c, "Conv") || is_kiln_op(c, "FusedConv") || is_kiln_op(c, "FusedConvMean");
}

struct FoldPadIntoConv {
  struct Match {
    Node* pad;
    std::vector<Node*> convs;
    std::vector<int64_t> pads;  // per axis of X: begins, then ends
  };

  static std::optional<Match> match(PassContext& ctx, Node& pad) {
    if (!is_op(&pad, "Pad") || !pad.output(0) || !pad.input(0)) return std::nullopt;
    const Value* y = pad.output(0);
    const int64_t rank = pad.input(0)->type.has_rank()
                             ? static_cast<int64_t>(pad.input(0)->type.rank())
                             : (y->type.has_rank() ? static_cast<int64_t>(y->type.rank()) : -1);
    if (rank < 3) {
      ctx.note(fmt::format("{}: {}", pad.label(), rank < 0 ? "rank unknown" : "no spatial axes"));
      return std::nullopt;
    }
    Match m{&pad, {}, {}};
    if (std::string why = spatial_pads(pad, rank, &m.pads); !why.empty()) {
      ctx.note(fmt::format("{}: {}", pad.label(), why));
      return std::nullopt;
    }
    if (ctx.g.is_graph_output(y)) return std::nullopt;
    for (const auto& [c, slot] : y->uses()) {
      if (!takes_pads(c) || slot != 0) {
        ctx.note(fmt::format("{}: read by {}, not as a convolution's input", pad.label(),
                             c->label()));
        return std::nullopt;
      }
      const std::string ap = c->attrs.get_string("auto_pad", "NOTSET");
      if (ap != "NOTSET" && ap != "") {
        ctx.note(fmt::format("{}: {} pads by auto_pad {}", pad.label(), c->label(), ap));
        return std::nullopt;
      }
      const auto cp = c->attrs.get_ints("pads");
      if (!cp.empty() && cp.size() != 2 * static_cast<size_t>(rank - 2)) {
        ctx.note(fmt::format("{}: {} has {} pads", pad.label(), c->label(), cp.size()));
        return std::nullopt;
      }
      m.convs.push_back(c);
    }
    if (m.convs.empty()) return std::nullopt;
    return m;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    const size_t rank = m.pads.size() / 2, sp = rank - 2;  // spatial axes
    for (Node* c : m.convs) {
      std::vector<int64_t> pads = c->attrs.get_ints("pads");
      if (pads.empty()) pads.assign(2 * sp, 0);
      for (size_t d = 0; d < sp; ++d) {
        pads[d] += m.pads[d + 2];
        pads[sp + d] += m.pads[rank + d + 2];
      }
      c->attrs.set("pads", Attribute::Ints(std::move(pads)));
      c->attrs.erase("auto_pad");
      ctx.g.set_input(c, 0, m.pad->input(0));
    }
    return Status::Ok();  // the Pad, now unread, goes with eliminate_dead_code
  }
};

}  // namespace

Expected<bool> fold_pad_into_conv(PassContext& ctx) { return apply_pattern<FoldPadIntoConv>(ctx); }

}  // namespace kiln::passes
