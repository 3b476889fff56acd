#include "lower.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "format_choice.h"
#include "keep_fp32.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "quant/int8.h"
#include "rtc.h"
#include "shape_eval.h"
#include "tuner.h"

namespace kiln::gpu {
namespace {

// The storage type of a tensor of logical type `t` in a layer of precision `p`.
DataType storage_type(DataType t, Precision p) {
  if (t == DataType::kFloat32) return p == Precision::kFP16 ? DataType::kFloat16 : t;
  return t;
}

// A kLayoutSwap tactic (layer.h) relabels a Transpose between channels-first and channels-last:
// its candidate stores the channels-first side NHWC and the channels-last side row-major, the
// same bytes (its supports() checks the permutation).
void swap_layouts(const Node& n, LayerChoice* c) {
  if (c->in.empty() || c->out.empty() || n.output(0)->type.rank() != 4) return;
  const std::vector<int64_t> perm = n.attrs.get_ints("perm");
  if (perm == std::vector<int64_t>{0, 2, 3, 1}) c->in[0].layout = Layout::kNHWC;
  if (perm == std::vector<int64_t>{0, 3, 1, 2}) c->out[0].layout = Layout::kNHWC;
}

// A kRawIn0 tactic (layer.h) reads input 0 as the model stores it: its own type, row-major,
// whatever the candidate's precision and layout.
void read_raw_in0(const Node& n, const TacticDef& t, LayerChoice* c) {
  if ((t.caps & kRawIn0) && n.input(0))
    c->in[0] = TensorFormat{n.input(0)->type.dtype, Layout::kLinear};
}

}  // namespace

LayerChoice float_choice(const Node& n, const TacticDef& t, Precision p, bool nhwc) {
  LayerChoice c;
  c.tactic = &t;
  c.precision = p;
  auto fmt_of = [&](const Value* v) {
    if (!v) return TensorFormat{};
    const bool four_d = v->type.rank() == 4;
    return TensorFormat{storage_type(v->type.dtype, p),
                        nhwc && four_d ? Layout::kNHWC : Layout::kLinear};
  };
  for (size_t i = 0; i < n.num_inputs(); ++i)
    c.in.push_back((t.host_inputs >> i) & 1u ? TensorFormat{} : fmt_of(n.input(i)));
  for (size_t o = 0; o < n.num_outputs(); ++o) c.out.push_back(fmt_of(n.output(o)));
  read_raw_in0(n, t, &c);
  return c;
}

// The formats of an INT8 candidate of a layer marked int8 = 1 (docs/quantization.md): X
// (slot 0, and a FusedConvPair's X2 in slot 3) int8; the residual (FusedConv slot 3) and Y int8
// when their values carry a scale, else in the float storage type `flt` of the build's fallback
// precision (a FusedGemm's residual always `flt`); other float inputs float32; 4-D tensors
// NHWC. Constants (the weights, the bias, Gemm's C) get no format: an INT8 tactic reads them on
// the host and keeps its own device copy (int8 weights, per-channel epilogue arrays), so the
// engine uploads no float copy; the same for inputs the tactic reads on the host. A kRawIn0
// tactic reads X as the model stores it.
LayerChoice make_int8_choice(const Node& n, const TacticDef& t, DataType flt) {
  LayerChoice c;
  c.tactic = &t;
  c.precision = Precision::kINT8;
  auto fmt_of = [](const Value* v, DataType storage) {
    return TensorFormat{storage, v->type.rank() == 4 ? Layout::kNHWC : Layout::kLinear};
  };
  const bool conv = n.op_type == "FusedConv";
  const bool pair = n.op_type == "FusedConvPair";  // X2 (slot 3) is quantized as X is
  for (size_t i = 0; i < n.num_inputs(); ++i) {
    const Value* v = n.input(i);
    if (!v || v->is_constant() || (t.host_inputs >> i) & 1u) {
      c.in.push_back(TensorFormat{});
      continue;
    }
    DataType st = v->type.dtype;
    if (st == DataType::kFloat32 && (i == 0 || (pair && i == 3))) st = DataType::kInt8;
    else if (st == DataType::kFloat32 && i == 3 && conv)
      st = v->has_quant_scale() ? DataType::kInt8 : flt;
    else if (st == DataType::kFloat32 && i == 3 && n.op_type == "FusedGemm")
      st = flt;
    c.in.push_back(fmt_of(v, st));
  }
  for (size_t o = 0; o < n.num_outputs(); ++o) {
    const Value* v = n.output(o);
    if (!v) {
      c.out.push_back(TensorFormat{});
      continue;
    }
    DataType st = v->type.dtype;
    if (st == DataType::kFloat32) st = o == 0 && v->has_quant_scale() ? DataType::kInt8 : flt;
    c.out.push_back(fmt_of(v, st));
  }
  read_raw_in0(n, t, &c);  // an INT8 one quantizes X as it reads it
  return c;
}

namespace {

// Does the tactic take these storage types at all (before its own supports())?
bool caps_allow(const LayerChoice& c, std::string* why) {
  const uint32_t caps = c.tactic->caps;
  auto check = [&](const TensorFormat& f) {
    // int8 storage of a float value (an INT8 candidate); a tensor that is int8 in the model is
    // stored as itself by every tactic.
    if (c.precision == Precision::kINT8 && f.dtype == DataType::kInt8 && !(caps & kI8))
      return false;
    if (f.dtype == DataType::kFloat32 && !(caps & kF32)) return false;
    if (f.dtype == DataType::kFloat16 && !(caps & kF16)) return false;
    if (f.dtype == DataType::kFloat64 && !(caps & kF64)) return false;
    return true;
  };
  for (const auto& f : c.in)
    if (!check(f)) return *why = "no " + std::string(dtype_name(f.dtype)) + " kernel", false;
  for (const auto& f : c.out)
    if (!check(f)) return *why = "no " + std::string(dtype_name(f.dtype)) + " kernel", false;
  return true;
}

struct Lowering {
  Graph& g;
  const GpuBuildOptions& o;
  std::vector<bool> host;
  std::unordered_map<const Value*, TensorFormat> produced;  // format each device value has
  std::unordered_map<const Node*, LayerChoice> choice;
  std::unordered_map<const Node*, std::string> keep_fp32;  // keep_fp32.h: why, per node

  // kAnyLayout: NHWC only when every device input is a 4-D tensor of the output's shape whose
  // producer already made it NHWC (so the layer adds no reformat of its own), or a single value
  // broadcast over everything (every dim 1: NFNet's scalar gains), which reads the same in any
  // layout.
  bool follows_nhwc(const Node& n) const {
    const Value* y = n.output(0);
    if (!y || y->type.rank() != 4) return false;
    bool any = false;
    for (const Value* v : n.inputs()) {
      if (!v) continue;
      if (v->type.has_rank() && std::all_of(v->type.dims->begin(), v->type.dims->end(),
                                            [](const Dim& d) { return d.value == 1; }))
        continue;
      if (v->type.dims != y->type.dims) return false;
      auto it = produced.find(v);
      if (it != produced.end() && it->second.layout == Layout::kNHWC) any = true;
      else if (!v->is_constant()) return false;
    }
    return any;
  }

  // Whether a non-constant 4-D input of `n` is produced row-major.
  bool arrives_linear(const Node& n) const {
    for (const Value* v : n.inputs()) {
      if (!v || v->is_constant() || v->type.rank() != 4) continue;
      auto it = produced.find(v);
      if (it != produced.end() && it->second.layout == Layout::kLinear) return true;
    }
    return false;
  }

  // The candidates of a node: for a layer marked int8 = 1, its INT8 candidates first, then the
  // float ones at the build's precision (the tuner times them all and keeps the fastest; an
  // untuned build takes INT8 when a tactic supports it). Float candidates: most preferred
  // layout first.
  Expected<std::vector<LayerChoice>> candidates(const Node& n, std::string* why_none) {
    auto tactics = tactics_for(n.domain, n.op_type);
    // force_tactic: NAME, or NAME/VARIANT (only that variant of it).
    const std::string_view forced = std::string_view(o.force_tactic).substr(0, o.force_tactic.find('/'));
    std::string forced_variant =
        forced.size() < o.force_tactic.size() ? o.force_tactic.substr(forced.size() + 1) : "";
    if (!forced.empty() &&
        std::any_of(tactics.begin(), tactics.end(), [&](auto* t) { return t->name == forced; }))
      std::erase_if(tactics, [&](auto* t) { return t->name != forced; });
    else if (!forced.empty())
      forced_variant.clear();
    if (tactics.empty()) {
      *why_none = "no GPU kernel exists for this op";
      return std::vector<LayerChoice>{};
    }
    const std::string* pin = quant::layer_pin(o.layer_precisions, n.name);
    // A pin (--layer-precisions) decides; else a layer keep_fp32 names stays at FP32.
    const bool want16 = pin && *pin != "int8" ? *pin == "fp16" : o.fp16 && !keep_fp32.count(&n);
    std::string reasons;
    std::vector<LayerChoice> out;
    if (quant::runs_int8(n)) {
      const DataType flt = want16 ? DataType::kFloat16 : DataType::kFloat32;
      for (const TacticDef* t : tactics) {
        LayerChoice c = make_int8_choice(n, *t, flt);
        // A FusedGemm whose Y has a scale may also write it in float, not requantized (after the
        // int8 form, which an untuned build takes): in a transformer its readers (attention,
        // LayerNorm) are float layers. The format choice weighs both with their reformats.
        const bool wide = n.op_type == "FusedGemm" && !c.out.empty() &&
                          c.out[0].dtype == DataType::kInt8 &&
                          n.output(0)->type.dtype == DataType::kFloat32;
        LayerChoice w = wide ? c : LayerChoice{};
        add_if_supported(n, std::move(c), &out, &reasons, forced_variant);
        if (!wide) continue;
        w.out[0].dtype = flt;
        add_if_supported(n, std::move(w), &out, &reasons, forced_variant);
      }
      // Pinned to int8 (--layer-precisions NAME:int8, or *:int8): INT8 kernels only, however
      // slow, where one takes the layer (TensorRT's obeyed precision constraints); float
      // otherwise, as for any INT8 layer no INT8 kernel takes.
      if (pin && *pin == "int8" && !out.empty()) return out;
    }
    std::vector<Precision> precisions;
    if (want16) precisions.push_back(Precision::kFP16);
    precisions.push_back(o.tf32 ? Precision::kTF32 : Precision::kFP32);
    // A 4-D input that arrives row-major (a graph input, a LayerNorm's or a GEMM's output)
    // makes the row-major candidates worth timing beside the NHWC ones: the format choice weighs
    // them with the reformats the NHWC ones would add (Swin's shifts, slices and pads of
    // [B, H, W, C] tensors; a CNN's first convolution).
    const bool linear_input = o.layout == "auto" && arrives_linear(n);
    for (Precision p : precisions) {
      const bool nhwc_wanted =
          o.layout == "nhwc" || (o.layout == "auto" && p != Precision::kFP32);
      for (bool nhwc : {true, false}) {
        const size_t before = out.size();
        for (const TacticDef* t : tactics) {
          if (nhwc) {
            const bool can = ((t->caps & kNHWC) && nhwc_wanted && n.output(0) &&
                              n.output(0)->type.rank() == 4) ||
                             ((t->caps & kAnyLayout) && follows_nhwc(n));
            if (!can) continue;
          }
          LayerChoice c = float_choice(n, *t, p, nhwc);
          if (t->caps & kLayoutSwap) swap_layouts(n, &c);
          // kQuantOut / kQuantIn0 (layer.h): output 0 / input 0 stored as its value's int8
          // codes, only where the value has a scale.
          auto as_codes = [&](const Value* v, std::vector<TensorFormat>& f, const char* what) {
            if (!v || !v->has_quant_scale() || !dtype_is_float(v->type.dtype) || f.empty()) {
              reasons += fmt::format("{}{}: its {} has no INT8 scale", reasons.empty() ? "" : "; ",
                                     t->name, what);
              return false;
            }
            f[0].dtype = DataType::kInt8;
            return true;
          };
          if ((t->caps & kQuantOut) && !as_codes(n.output(0), c.out, "output")) continue;
          if ((t->caps & kQuantIn0) && !as_codes(n.input(0), c.in, "input")) continue;
          // kF32Out: also the candidate writing a float32 graph output itself.
          const Value* y = n.output(0);
          if ((t->caps & kF32Out) && p == Precision::kFP16 && y && g.is_graph_output(y) &&
              y->type.dtype == DataType::kFloat32 && !c.out.empty()) {
            LayerChoice wide = c;
            wide.out[0].dtype = DataType::kFloat32;
            add_if_supported(n, std::move(wide), &out, &reasons, forced_variant);
          }
          add_if_supported(n, std::move(c), &out, &reasons, forced_variant);
        }
        if (out.size() > before && !(nhwc && linear_input)) return out;
      }
    }
    if (out.empty()) *why_none = reasons;
    return out;
  }

  // Appends candidate `c` (one per variant of its tactic) when the tactic takes it, else the
  // reason to `reasons`.
  static void add_if_supported(const Node& n, LayerChoice c, std::vector<LayerChoice>* out,
                               std::string* reasons, const std::string& only_variant = "") {
    const TacticDef* t = c.tactic;
    std::string why;
    LayerDesc d = c.desc(&n);
    if (!caps_allow(c, &why) || !tactic_supports(*t, d, &why)) {
      *reasons += fmt::format("{}{} ({}): {}", reasons->empty() ? "" : "; ", t->name,
                              precision_name(c.precision), why.empty() ? "not supported" : why);
      return;
    }
    const auto variants = t->variants ? t->variants(d) : std::vector<std::string>{""};
    for (const auto& v : variants) {
      if (!only_variant.empty() && v != only_variant) continue;
      c.variant = v;
      out->push_back(c);
    }
  }

  // Where value `v` must be in format `want` for a consumer placed before `pos`: the value itself,
  // or a kiln.Reformat of it (one per value and format, shared by consumers).
  std::map<std::pair<const Value*, std::string>, Value*> reformats;
  Expected<Value*> in_format(Value* v, const TensorFormat& want, Node* pos) {
    auto it = produced.find(v);
    if (it == produced.end() || it->second == want) return v;  // constant/host: converted at load
    auto key = std::make_pair(static_cast<const Value*>(v), want.str());
    if (auto r = reformats.find(key); r != reformats.end()) return r->second;
    // int8 storage of a float value is its INT8 code (value / scale): only a value with a scale.
    const bool to_codes = want.dtype == DataType::kInt8 && v->type.dtype != DataType::kInt8;
    if (to_codes && !v->has_quant_scale())
      return KILN_ERROR("'{}' would be stored as int8 for {}, but the value has no INT8 scale",
                        v->name, pos ? pos->label() : std::string("a graph output"));
    const std::string name = g.unique_name(v->name + "_to_" + want.str());
    Node* r = pos ? g.insert_node_before(pos, "Reformat", name, {v}, {name}, "kiln")
                  : g.add_node("Reformat", name, {v}, {name}, "kiln");
    r->origin = "lower";
    r->output(0)->type = v->type;
    // The reformat reads the scale of its input; its output is the same value, so it keeps the
    // scale too (the INT8 layer consuming it reads X's and the residual's scales there).
    r->output(0)->quant_scales = v->quant_scales;
    r->output(0)->quant_axis = v->quant_axis;
    // Between layouts that hold the same bytes ([N, C, 1, 1]) the reformat relabels memory.
    const bool relabel = it->second.dtype == want.dtype && layouts_share_bytes(v->type);
    const TacticDef* t = find_tactic(relabel ? "reformat.relabel" : "reformat");
    LayerChoice c;
    c.tactic = t;
    c.precision = Precision::kFP32;
    c.in = {it->second};
    c.out = {want};
    choice[r] = c;
    produced[r->output(0)] = want;
    reformats[key] = r->output(0);
    return r->output(0);
  }
};

}  // namespace

namespace {
std::string choice_name(const LayerChoice& c) {
  return fmt::format("{}/{} ({}, {})", c.tactic->name, c.variant, precision_name(c.precision),
                     c.out.empty() ? "" : c.out[0].str());
}

// Step 2 of lower_for_gpu: the format choice over the timed candidates (format_choice.h), with
// each reformat timed by the tuner (and cached like a layer).
void choose_formats(const Graph& g, const std::vector<Node*>& nodes, const std::vector<bool>& host,
                      const ShapeResult& shapes, Tuner& tuner,
                      const std::vector<std::vector<LayerChoice>>& cands, std::vector<size_t>& pick,
                      std::ostream* log) {
  std::unordered_map<const Value*, int> id;
  std::vector<const Value*> value_of;
  std::vector<FormatValue> values;
  auto add_value = [&](const Value* v) {
    id[v] = static_cast<int>(value_of.size());
    value_of.push_back(v);
    values.emplace_back();
  };
  for (const Value* v : g.inputs()) {
    add_value(v);
    values.back().fixed = TensorFormat{v->type.dtype, Layout::kLinear};
  }
  for (size_t k = 0; k < nodes.size(); ++k)
    if (!host[k])
      for (const Value* v : nodes[k]->outputs())
        if (v) add_value(v);
  for (const Value* v : g.outputs())
    if (auto it = id.find(v); it != id.end())
      values[it->second].wanted.push_back(TensorFormat{v->type.dtype, Layout::kLinear});
  std::vector<FormatLayer> layers;
  std::vector<size_t> layer_node, lpick;
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (host[k]) continue;
    FormatLayer L;
    const bool timed = cands[k][pick[k]].time_ms >= 0;
    for (const LayerChoice& c : cands[k]) {
      // An untimed layer (one candidate) costs nothing of its own: only its formats count.
      L.time_ms.push_back(timed ? c.time_ms : (&c == &cands[k][pick[k]] ? 0.0 : -1.0));
      L.in.push_back(c.in);
      L.out.push_back(c.out);
    }
    for (const Value* v : nodes[k]->inputs()) {
      auto it = v ? id.find(v) : id.end();
      L.inputs.push_back(it == id.end() ? -1 : it->second);
    }
    for (const Value* v : nodes[k]->outputs()) L.outputs.push_back(v ? id.at(v) : -1);
    layers.push_back(std::move(L));
    layer_node.push_back(k);
    lpick.push_back(pick[k]);
  }
  std::map<std::tuple<int, std::string, std::string>, double> timed;
  auto cost = [&](int v, const TensorFormat& from, const TensorFormat& to) {
    auto key = std::make_tuple(v, from.str(), to.str());
    if (auto it = timed.find(key); it != timed.end()) return it->second;
    // A reformat that cannot be timed counts as free (the build still inserts it; its own errors
    // surface there).
    auto ms = tuner.reformat_ms(*value_of[v], from, to, shapes);
    return timed[key] = ms.ok() ? *ms : 0.0;
  };
  FormatChoice choice(std::move(layers), std::move(values), cost);
  // Two starts: each layer's fastest candidate, and its fastest float one (differs only in INT8
  // builds). Local search from the first can end in a mix that costs more than no INT8 at all
  // (chains of INT8 layers whose quantizing and dequantizing reformats exceed what they save);
  // the cheaper result wins, so an INT8 build is never slower, by the tuner's times, than its
  // float fallback.
  // A float candidate: neither an INT8 layer nor a float one that writes or reads int8 codes.
  auto is_float = [](const LayerChoice& c) {
    return c.precision != Precision::kINT8 && !(c.tactic->caps & (kQuantOut | kQuantIn0));
  };
  std::vector<size_t> float_pick = lpick;
  for (size_t l = 0; l < lpick.size(); ++l) {
    const auto& cs = cands[layer_node[l]];
    for (size_t c = 0; c < cs.size(); ++c)
      if (is_float(cs[c]) && cs[c].time_ms >= 0 &&
          (!is_float(cs[float_pick[l]]) || cs[c].time_ms < cs[float_pick[l]].time_ms))
        float_pick[l] = c;
  }
  const double before = choice.total_ms(lpick);
  std::vector<FormatMove> moves = choice.refine(lpick);
  if (float_pick != lpick) {
    const double float_before = choice.total_ms(float_pick);
    std::vector<FormatMove> float_moves = choice.refine(float_pick);
    const double mixed = choice.total_ms(lpick), floats = choice.total_ms(float_pick);
    if (log)
      *log << fmt::format("format choice: from the fastest candidates {:.4f} ms -> {:.4f} ms; "
                          "from the fastest float candidates {:.4f} ms -> {:.4f} ms: {} wins\n",
                          before, mixed, float_before, floats,
                          floats < mixed ? "the float start" : "the fastest start");
    if (floats < mixed) lpick = float_pick, moves = std::move(float_moves);
  }
  for (size_t l = 0; l < lpick.size(); ++l) pick[layer_node[l]] = lpick[l];
  if (log) {
    for (const FormatMove& m : moves) {
      const size_t k = layer_node[m.layer];
      *log << fmt::format("format choice: {}: {} instead of {}: {:.4f} ms less in the layer and "
                          "its reformats\n", nodes[k]->label(), choice_name(cands[k][m.to]),
                          choice_name(cands[k][m.from]), m.saved_ms);
    }
    *log << fmt::format("format choice: {} moves; layers and reformats {:.4f} ms\n", moves.size(),
                        choice.total_ms(lpick));
  }
}
// An alternate must be at least 3% faster than the opt shapes' choice at its point.
constexpr double kAlternateGain = 0.97;

// Step 2b of lower_for_gpu: at a further tuning point, each tuned layer's candidates of the
// chosen formats and precision are timed again, and the fastest, where it is not the choice
// made at the opt shapes, becomes that point's Alternate. Only the tactic and variant differ,
// so the weights, the reformats and the neighbours stay as chosen.
void tune_alternates(const Graph& g, const std::vector<Node*>& nodes,
                     const std::vector<bool>& host, const InputShapes& point, size_t index,
                     Tuner& tuner, const std::vector<std::vector<LayerChoice>>& cands,
                     const std::vector<size_t>& pick,
                     std::vector<std::vector<Alternate>>& alternates, std::ostream* log) {
  auto evaluated = evaluate_shapes(g, host, point);
  if (!evaluated.ok()) {
    if (log) *log << "tuning point " << index << ": " << evaluated.status().message() << "\n";
    return;  // tuned at the opt shapes alone
  }
  const ShapeResult& shapes = *evaluated;
  size_t moved = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (host[k] || cands[k].size() < 2 || cands[k][pick[k]].time_ms < 0) continue;
    const LayerChoice& chosen = cands[k][pick[k]];
    std::vector<LayerChoice> same;
    for (const LayerChoice& c : cands[k])
      if (c.in == chosen.in && c.out == chosen.out && c.precision == chosen.precision &&
          c.tactic->alias_input == chosen.tactic->alias_input)
        same.push_back(c);
    if (same.size() < 2) continue;
    std::vector<std::string> failed;
    auto best = tuner.choose(*nodes[k], same, shapes, &failed);
    if (!best.ok()) continue;  // none runs there: the opt shapes' choice stays
    const LayerChoice& b = same[*best];
    if (b.tactic == chosen.tactic && b.variant == chosen.variant) continue;
    double chosen_ms = -1;
    for (const LayerChoice& c : same)
      if (c.tactic == chosen.tactic && c.variant == chosen.variant) chosen_ms = c.time_ms;
    // Within the timing's noise the opt shapes' choice stays: an alternate is another Layer
    // (and its own buffers) in every context.
    if (chosen_ms >= 0 && b.time_ms > kAlternateGain * chosen_ms) continue;
    alternates[k].push_back({index, b.tactic, b.variant, b.time_ms});
    ++moved;
    if (log)
      *log << fmt::format("{}: at tuning point {} {}/{} ({:.4f} ms) instead of {}/{} ({:.4f} ms)\n",
                          nodes[k]->label(), index, b.tactic->name, b.variant, b.time_ms,
                          chosen.tactic->name, chosen.variant, chosen_ms);
  }
  if (log)
    *log << fmt::format("tuning point {}: {} layers take another tactic there\n", index, moved);
}
}  // namespace

std::vector<InputShapes> tuning_points(const std::vector<std::vector<int64_t>>& min_shapes,
                                       const std::vector<std::vector<int64_t>>& opt_shapes) {
  InputShapes small = opt_shapes;
  bool differs = false;
  for (size_t i = 0; i < small.size() && i < min_shapes.size(); ++i)
    if (!small[i].empty() && !min_shapes[i].empty() && min_shapes[i][0] > 0 &&
        min_shapes[i][0] < small[i][0]) {
      small[i][0] = min_shapes[i][0];
      differs = true;
    }
  if (!differs) return {};
  return {small};
}

bool some_tactic_takes(const Node& n, const GpuBuildOptions& o) {
  std::vector<Precision> precisions;
  if (o.fp16) precisions.push_back(Precision::kFP16);
  precisions.push_back(o.tf32 ? Precision::kTF32 : Precision::kFP32);
  for (const TacticDef* t : tactics_for(n.domain, n.op_type))
    for (Precision p : precisions)
      for (bool nhwc : {true, false}) {
        // NHWC candidates only where lowering offers them (Lowering::candidates): an FP32
        // build keeps row-major layers unless --layout nhwc.
        if (nhwc && !(o.layout == "nhwc" || (o.layout == "auto" && p != Precision::kFP32)))
          continue;
        const LayerChoice c = float_choice(n, *t, p, nhwc);
        std::string why;
        if (caps_allow(c, &why) && tactic_supports(*t, c.desc(&n), &why)) return true;
      }
  return false;
}

Expected<Plan> lower_for_gpu(Graph& g, const std::vector<std::vector<int64_t>>& opt_shapes,
                             const GpuBuildOptions& o) {
  KILN_RETURN_IF_ERROR(prepare_for_gpu(g, o));
  const std::vector<bool> host_in = host_value_inputs(g);
  Lowering L{g, o, host_nodes(g, host_in), {}, {}, {}};
  if (o.fp16) {
    L.keep_fp32 = keep_fp32_nodes(g);
    if (o.log)
      for (const Node* n : g.nodes())
        if (auto it = L.keep_fp32.find(n); it != L.keep_fp32.end())
          *o.log << n->label() << ": FP32 in an FP16 build, " << it->second << "\n";
  }
  // Inputs read on the host have no values at build time: when shapes depend on them, the
  // layers are not timed (each takes its first supported tactic).
  bool tune = o.tune;
  ShapeResult shapes;
  // Shapes that the data decides (data-dependent ops, control flow and what follows them) are
  // known only at run time: those layers take their first supported tactic, untimed.
  auto evaluated = evaluate_shapes(g, L.host, opt_shapes, {}, /*partial=*/true);
  if (evaluated.ok()) {
    shapes = std::move(evaluated).value();
  } else if (std::find(host_in.begin(), host_in.end(), true) != host_in.end()) {
    tune = false;
    if (o.log)
      *o.log << "the model has inputs read on the host (shape tensors) that decide shapes: "
             << "tactics are not timed (" << evaluated.status().message() << ")\n";
  } else {
    return evaluated.status();
  }
  // Refuse a build that cannot fit before timing anything (memory_check.h).
  if (evaluated.ok()) {
    bool no_room = false;
    const std::optional<GpuMemory> mem = o.gpu_memory ? o.gpu_memory : query_gpu_memory(&no_room);
    if (no_room)
      return Status::Error("out of GPU memory: the GPU has no room for kiln's CUDA context "
                           "(other processes hold its memory; nvidia-smi lists them)");
    if (mem) {
      std::string at;
      for (size_t i = 0; i < g.inputs().size() && i < opt_shapes.size(); ++i)
        at += fmt::format("{}{}:{}", at.empty() ? "" : ",", g.inputs()[i]->name,
                          fmt::join(opt_shapes[i], "x"));
      const BuildMemoryEstimate need = estimate_build_memory(g, L.host, shapes, o.fp16 ? 2 : 4);
      KILN_RETURN_IF_ERROR(check_build_memory(need, *mem, at.empty() ? "these shapes" : at));
    }
  }
  // The cache's times hold for this GPU, these libraries and the tuner's way of timing (a
  // round replayed as a CUDA graph: tuner.h; with programmatic dependent launch or without).
  KILN_ASSIGN_OR_RETURN(
      TimingCache cache,
      TimingCache::open(o.timing_cache,
                        device_signature() + " graph-timed" + (pdl_available() ? " pdl" : "")));
  if (cache.device_mismatch() && o.log)
    *o.log << "timing cache " << o.timing_cache
           << " is from another GPU, library version or kiln tuner: its times are not used\n";
  std::unique_ptr<Tuner> tuner;
  bool timed = false;  // some layer's candidates were timed (the format choice needs times)
  std::unordered_set<const Value*> host_vals;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    Value* v = g.inputs()[i];
    L.produced[v] = i < o.input_formats.size() ? o.input_formats[i]
                                               : TensorFormat{v->type.dtype, Layout::kLinear};
    if (host_in[i]) host_vals.insert(v);
  }
  // A layer that reads or writes a value the data sizes runs in the executor's dynamic region.
  auto dynamic_layer = [&](const Node& n) {
    for (const Value* v : n.inputs())
      if (v && shapes.dynamic.count(v)) return true;
    for (const Value* v : n.outputs())
      if (v && shapes.dynamic.count(v)) return true;
    return false;
  };
  // 1. Per node, its candidates, each timed (the provisional pick, the fastest, decides the
  //    formats later nodes see). 2. The format choice (format_choice.h) moves picks where that
  //    saves reformats. 3. The picks are placed, with kiln.Reformat layers where formats differ.
  const std::vector<Node*> nodes = g.nodes();  // reformat layers are inserted in step 3
  double tuning_s = 0;  // wall time in Tuner::choose (the --verbose log's summary)
  size_t tuned = 0;
  const rtc::CompileStats rtc0 = rtc::compile_stats();
  std::vector<std::vector<LayerChoice>> cands(nodes.size());
  std::vector<size_t> pick(nodes.size(), 0);
  for (size_t k = 0; k < nodes.size(); ++k) {
    Node* n = nodes[k];
    if (L.host[k]) {
      for (const Value* v : n->outputs()) host_vals.insert(v);
      continue;
    }
    std::string why;
    KILN_ASSIGN_OR_RETURN(cands[k], L.candidates(*n, &why));
    if (cands[k].empty())
      return KILN_ERROR("{}: cannot run on the GPU: {}", n->label(), why);
    // A candidate that relabels its input's memory in its own format launches nothing: no
    // kernel beats it (a Cast between types an FP16 layer stores alike:
    // movement.cast_same_storage). One that relabels between layouts (kLayoutSwap) stays beside
    // the kernels: the format choice weighs the reformats its layouts may cost.
    if (std::any_of(cands[k].begin(), cands[k].end(), [](const LayerChoice& c) {
          return c.tactic->alias_input >= 0 && !(c.tactic->caps & kLayoutSwap);
        }))
      std::erase_if(cands[k], [](const LayerChoice& c) { return c.tactic->alias_input < 0; });
    const bool dyn = dynamic_layer(*n);
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      const Value* v = n->input(i);
      // An engine with a dynamic region runs as one (dynamic.h), and so does a subgraph: the
      // executor reads such a value back when the layer needs it.
      if (v && (cands[k][0].tactic->host_inputs >> i) & 1u && !v->is_constant() &&
          !host_vals.count(v) && !dyn && !o.subgraph && shapes.dynamic.empty())
        return KILN_ERROR("{}: input {} ('{}') must be known before the layer runs (a constant "
                          "or computed from shapes), but it is computed on the GPU",
                          n->label(), i, v->name);
    }
    if (cands[k].size() > 1 && tune && !dyn) {
      if (!tuner) {
        KILN_ASSIGN_OR_RETURN(tuner, Tuner::create(&cache, o.workspace_limit));
      }
      std::vector<std::string> failed;
      const auto t0 = std::chrono::steady_clock::now();
      KILN_ASSIGN_OR_RETURN(pick[k], tuner->choose(*n, cands[k], shapes, &failed));
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tuning_s += wall;
      ++tuned;
      timed = true;
      if (o.log) {
        *o.log << fmt::format("{}: {} candidates, fastest {}/{} ({:.4f} ms); tuned in {:.3f} s\n",
                              n->label(), cands[k].size(), cands[k][pick[k]].tactic->name,
                              cands[k][pick[k]].variant, cands[k][pick[k]].time_ms, wall);
        const std::vector<double>& walls = tuner->last_walls();
        for (size_t i = 0; i < cands[k].size(); ++i) {
          const LayerChoice& c = cands[k][i];
          if (c.time_ms >= 0)
            *o.log << fmt::format("    {}/{} {} {} {:.4f} ms (tuning {:.3f} s)\n", c.tactic->name,
                                  c.variant, precision_name(c.precision),
                                  c.out.empty() ? "" : c.out[0].str(), c.time_ms,
                                  i < walls.size() ? walls[i] : 0.0);
        }
        for (const auto& f : failed) *o.log << "    failed " << f << "\n";
      }
    } else {
      // A single candidate is not timed, but it must still fit at these shapes (SD 1.5's FP32
      // attention outgrew the workspace limit and failed only when the engine first ran). A
      // build without timing takes the first candidate untried: the engine checks it at load.
      // Not control flow: its subplans are made below, and its bodies' shapes known as it runs.
      if (tune && !dyn && n->attrs.subgraphs().empty()) {
        if (!tuner) {
          KILN_ASSIGN_OR_RETURN(tuner, Tuner::create(&cache, o.workspace_limit));
        }
        KILN_RETURN_IF_ERROR(tuner->check(*n, cands[k][0], shapes));
      }
      if (o.log)
        *o.log << fmt::format("{}: {} ({}, {})\n", n->label(), cands[k][0].tactic->name,
                              precision_name(cands[k][0].precision),
                              cands[k][0].out.empty() ? "" : cands[k][0].out[0].str());
    }
    for (size_t out = 0; out < n->num_outputs(); ++out)
      if (const Value* v = n->output(out)) L.produced[v] = cands[k][pick[k]].out[out];
  }
  if (timed) choose_formats(g, nodes, L.host, shapes, *tuner, cands, pick, o.log);
  std::vector<InputShapes> points;
  std::vector<std::vector<Alternate>> alternates(nodes.size());
  if (timed && !o.extra_points.empty()) {
    points.push_back(opt_shapes);
    for (const InputShapes& pt : o.extra_points) {
      points.push_back(pt);
      tune_alternates(g, nodes, L.host, pt, points.size() - 1, *tuner, cands, pick, alternates,
                      o.log);
    }
  }
  // Step 3, in node order: producers' formats are known before their consumers are placed.
  for (size_t k = 0; k < nodes.size(); ++k) {
    Node* n = nodes[k];
    if (L.host[k]) {
      L.choice[n] = LayerChoice{};
      continue;
    }
    std::vector<std::pair<std::string, double>> timed;
    for (const LayerChoice& other : cands[k])
      if (other.time_ms >= 0)
        timed.emplace_back(std::string(other.tactic->name) + "/" + other.variant, other.time_ms);
    LayerChoice c = std::move(cands[k][pick[k]]);
    if (c.time_ms >= 0) c.timed = std::move(timed);
    c.alternates = std::move(alternates[k]);
    c.dynamic = dynamic_layer(*n);
    if (!n->attrs.subgraphs().empty()) KILN_RETURN_IF_ERROR(lower_subgraphs(*n, o, &c));
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      Value* v = n->input(i);
      if (!v || c.in[i].dtype == DataType::kUndefined) continue;
      KILN_ASSIGN_OR_RETURN(Value * r, L.in_format(v, c.in[i], n));
      if (r != v) g.set_input(n, i, r);
    }
    for (size_t out = 0; out < n->num_outputs(); ++out)
      if (const Value* v = n->output(out)) L.produced[v] = c.out[out];
    L.choice[n] = std::move(c);
  }
  // Graph outputs leave in their declared type, row-major: reformat where needed, keeping the
  // output's name on the reformatted value.
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    Value* v = g.outputs()[i];
    const TensorFormat want = i < o.output_formats.size()
                                  ? o.output_formats[i]
                                  : TensorFormat{v->type.dtype, Layout::kLinear};
    KILN_ASSIGN_OR_RETURN(Value * r, L.in_format(v, want, nullptr));
    if (r == v) continue;
    const std::string name = v->name;
    KILN_RETURN_IF_ERROR(g.rename_value(v, g.unique_name(name + "_kiln")));
    KILN_RETURN_IF_ERROR(g.rename_value(r, name));
    for (size_t j = 0; j < g.outputs().size(); ++j)
      if (g.outputs()[j] == v) g.set_output(j, r);
  }
  g.renumber();
  KILN_RETURN_IF_ERROR(cache.save());
  if (o.log && tuned) {
    const rtc::CompileStats rtc1 = rtc::compile_stats();
    *o.log << fmt::format("tuning: {} layers timed in {:.2f} s, of which {} generated kernels "
                          "compiled in {:.2f} s\n",
                          tuned, tuning_s, rtc1.kernels - rtc0.kernels, rtc1.seconds - rtc0.seconds);
  }
  if (o.log && !o.timing_cache.empty())
    *o.log << fmt::format("timing cache: {} entries, {} hits\n", cache.size(), cache.hits());
  Plan plan;
  plan.workspace_limit = o.workspace_limit;
  plan.points = std::move(points);
  for (const Node* n : g.nodes()) plan.layers.push_back(L.choice.at(n));
  return plan;
}

}  // namespace kiln::gpu
