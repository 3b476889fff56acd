#include "passes/pipeline.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/op.h"
#include "passes/passes.h"

namespace kiln {
namespace {

using passes::PassContext;

struct PassEntry {
  const char* name;
  int min_level;  // the lowest --opt-level that runs it
  Expected<bool> (*run)(PassContext&);
};

// The pipeline, in order. The list runs again and again until a whole round changes nothing
// (each pass is idempotent, so a round without changes is the fixed point). Why this order:
// - fold_constants first: with the profile's input shapes applied, Shape -> Gather -> Concat
//   -> Reshape chains become constants, which turns dynamic Reshapes into static ones that the
//   no-op and pair rules can then judge. fold_if right after it: an If whose condition folded
//   (torchvision's `boxes.numel() == 0` at a profile's static shapes) becomes its branch's
//   nodes, which the rest of the list then optimizes like any others. loop_concat_to_scan
//   after them: a Loop's initial value is a constant once the shapes that size it fold.
//   batch_select_topk beside them: an unrolled loop of per-class select and top-k chains is
//   matched on its Shape/Min arithmetic for K before detach_shapes or a fusion rewrites it.
// - detach_shapes after fold_constants: a Shape of an activation whose dims the inputs
//   determine reads the inputs' shapes instead, so it no longer counts as a consumer of the
//   activation (fold_constants folds it outright when the profile fixes every dim).
// - merge_duplicates after detach_shapes (which makes equal Shape reads of different tensors
//   equal nodes): a subexpression computed in every layer is computed once.
// - remove_noops and cancel_transposes next: they unhide producer/consumer pairs (Conv ->
//   Identity -> BatchNorm) for the patterns below; fold_reshape_transpose, just before
//   cancel_transposes, turns a transpose written through merged dims (SDPA's K) into a plain
//   Transpose that cancel_transposes composes with the head split's, in the same round.
// - reduce_to_global_pool beside the folding: a ReduceMean over every spatial axis becomes the
//   GlobalAveragePool it is, before any fusion reads either form. dft_to_matmul likewise: a DFT
//   or STFT of static sizes becomes the MatMul or Conv with a constant basis it is, for the
//   fusions to take as any other (after fold_constants, which makes its window a constant);
//   col2im_to_conv_transpose: a Col2Im (F.fold) becomes the one-hot ConvTranspose it is;
//   deform_conv_to_grid_sample: a DeformConv the bilinear gather of its taps (GridSample) and
//   the 1x1 convolution over them it is;
//   lrn_to_conv: an LRN the squares, a banded channel Conv and the division it is;
//   one_hot_to_equal: a OneHot the comparison with the positions along its axis it is;
//   max_unpool_to_scatter: a MaxUnpool the scatter of its values into zeros it is;
//   lp_pool_to_average: an LpPool or GlobalLpPool the root of a pooled sum of |x|^p it is;
//   compress_to_gather: a Compress the Gather of its condition's NonZero positions it is;
//   qoperator_to_qdq: ONNX Runtime's QLinearConv/QLinearMatMul the Q(Conv/MatMul(DQ, DQ)) they
//   are, and a MatMulInteger/ConvInteger read by a Cast to float the float product of its
//   centered operands (engine.cpp runs it once more before quant::map_qdq for --int8 builds).
// - fold_batchnorm before any fusion: BN folds into the weights of a plain Conv/Gemm/MatMul;
//   once an activation fused in between, it no longer could. fold_pad_into_conv beside it: a
//   zero Pad (TensorFlow's SAME padding) becomes a plain Conv's pads before fusions take it.
// - fuse_layernorm, fuse_gelu, fuse_swish and fuse_attention before the generic fusions: they
// recognise
//   composite ops made of MatMul/Add/elementwise pieces that fuse_matmul_add and
//   fuse_elementwise would otherwise swallow piecemeal. map_onnx_attention beside them: ONNX's
//   own Attention op becomes the same kiln.Attention layer (its Where/Add for the mask are
//   left to the later passes). fuse_rmsnorm after fuse_layernorm: a LayerNorm's tail
//   (x - mean) / sqrt(mean((x - mean)^2) + eps) has RMSNorm's shape and belongs to LayerNorm.
// - fuse_groupnorm_act after fuse_groupnorm and fuse_swish (the norm and its SiLU exist as ops)
//   and before fuse_residual_add: the timestep term added in front of a norm belongs to the
//   norm's kernel, not to the convolution before it as a residual that broadcasts.
// - unflatten_batched_matmul just before fuse_attention: a product over merged batch dims
//   (PyTorch's matmul decomposition as torch 2.5's dynamo exports it) becomes the 4-D MatMul
//   that fuse_attention matches.
// - fold_periodic_add just before fuse_attention: a constant added per group of rows through a
//   split and a merge of axis 0 (Swin's shifted-window mask) becomes a plain Add of the constant
//   tiled over the groups, which fuse_attention takes as one more additive term of the scores.
// - regroup_head_parts after fuse_attention (it regroups only parts an attention reads) and
//   before fuse_rotary, fuse_matmul_add and fold_attention_heads: the projection is still
//   MatMul + Add, and the rotary and the heads are matched on the part-major layout in the same
//   round.
// - fuse_rotary, then rotary_before_heads, before fold_attention_heads: the first makes any
//   exporter's rotation of the heads one RotaryEmbedding on them, the second moves it in front
//   of the head split, which then is the plain split fold_attention_heads folds.
// - slices_to_split after fuse_rotary (which reads rotate_half's two Slices of a head) and before
//   fold_attention_heads: Slices that cut a packed projection into parts (Phi-3's qkv_proj) become
//   the Split that pack_gemm writes, so RotaryOverSplit and pack_qkv pack them in later rounds.
// - image_attention after slices_to_split (it reads the Split of the projection's
//   parts) and before fold_attention_heads, which folds the sequence-major form it writes.
// - fold_attention_heads after fuse_attention: it folds the head split and merge around a
//   kiln.Attention.
// - fold_gemm_reshape before fuse_rotary and fold_attention_heads, and before fuse_matmul_add: a
//   product over flattened rows (GPT-2's Conv1D; torch 2.5's dynamo export, whose head split
//   reshapes the flat product) becomes the [B, S, N] FusedGemm the later patterns expect, in the
//   round the rotary and the heads are first matched (later, fuse_elementwise would have taken
//   the rotary's pieces). The attention output's merge Reshape, read by the output projection
//   flattened, folds in the next round, once fold_attention_heads has made it the flattening of
//   a [B, S, H*D] tensor (GPT-2).
// - fold_patch_conv before fuse_conv_act: a ViT's patch embedding must still be a plain Conv
//   (its bias not yet fused) to become the GEMM it is.
// - sink_spatial_flatten after fold_patch_conv: a ViT's patch embedding (Conv, flatten,
//   transpose) becomes fold_patch_conv's GEMM first; the flattenings and transposes left (a VAE's
//   attention, small patch stems) become views of channels-last memory.
// - fold_channel_scale after fuse_matmul_add (a Linear's bias is in its FusedGemm, scaled with
//   its weights) and before fuse_residual_add, fuse_skip_layernorm, fuse_conv_act and
//   fuse_elementwise: a layer scale must go into the product before the product takes a
//   residual or activation, or a chain takes the Mul.
// - fuse_matmul_add and fuse_residual_add before fuse_conv_act: the layer computes
//   act(conv(x) + bias + residual), so bias and residual must join before the activation does.
// - pack_gemm after fuse_matmul_add (the products carry their biases) and before
//   fuse_residual_add and fuse_conv_act (it takes products without a residual, and siblings
//   whose activations would differ once fused: Llama's gate and up projections); its Split's
//   parts are read in place by pack_qkv right after it (Q, K and V of an attention), by
//   fuse_rotary in the next round (rotaries on parts) and by fuse_elementwise (chains).
// - fuse_attention_rotary after fuse_rotary, fold_attention_heads and pack_qkv: a rotary read
//   only by the attention (fuse_rotary's, in front of the head split fold_attention_heads
//   folded; or its one rotary over a packed projection's Q and K heads, read by the attention
//   pack_qkv packed) joins the attention, which applies it (where the backend can: mha.flash on
//   the cuda backend). Separate Q and K rotaries on parts of pack_gemm's Split join the unpacked
//   attention in the round pack_gemm packs; pack_qkv packs that attention in the next round, the
//   rotary with it (the same rotation over the packed Q and K heads).
// - sink_transposes after fold_attention_heads and fuse_matmul_add: it moves a sequence-first
//   attention's swaps past the projections (FusedGemms by then) and the layer; cancel_transposes
//   composes the pairs that meet in the next round.
// - drop_zero_mask after fold_attention_heads: the layer it edits must exist.
//   narrow_attention_mask after it: a zero mask goes altogether before a narrower one is sought.
// - fuse_skip_layernorm after fuse_residual_add, all in one round: a residual Add that a
//   projection can take goes into the GEMM's epilogue; the Adds left in front of a LayerNorm
//   (embeddings) join the norm.
// - fuse_conv_pool after fuse_conv_act: the stem's max-pool joins a convolution that already
//   carries its activation; fuse_conv_mean likewise (the pooled map is the activation's).
//   fuse_conv_tail after them: its post steps go after the activation, and a layer with post
//   steps takes nothing more (the passes before check has_post_steps).
// - batchnorm_to_affine after every fusion that could take a BatchNorm (fold_batchnorm folds
//   it into its producer; here one no producer took becomes a per-channel Mul and Add), and
//   fuse_elementwise last: it takes the elementwise chains the specific fusions left.
// - eliminate_dead_code after folding and at the end of each round.
constexpr PassEntry kPipeline[] = {
    {"fold_constants", 1, passes::fold_constants},
    {"fold_if", 1, passes::fold_if},
    {"loop_concat_to_scan", 1, passes::loop_concat_to_scan},
    {"batch_select_topk", 1, passes::batch_select_topk},
    {"remove_noops", 1, passes::remove_noops},
    {"detach_shapes", 1, passes::detach_shapes},
    {"merge_duplicates", 1, passes::merge_duplicates},
    {"fold_reshape_transpose", 1, passes::fold_reshape_transpose},
    {"cancel_transposes", 1, passes::cancel_transposes},
    {"fold_batchnorm", 1, passes::fold_batchnorm},
    {"fold_pad_into_conv", 1, passes::fold_pad_into_conv},
    {"reduce_to_global_pool", 1, passes::reduce_to_global_pool},
    {"dft_to_matmul", 1, passes::dft_to_matmul},
    {"col2im_to_conv_transpose", 1, passes::col2im_to_conv_transpose},
    {"deform_conv_to_grid_sample", 1, passes::deform_conv_to_grid_sample},
    {"lrn_to_conv", 1, passes::lrn_to_conv},
    {"one_hot_to_equal", 1, passes::one_hot_to_equal},
    {"max_unpool_to_scatter", 1, passes::max_unpool_to_scatter},
    {"lp_pool_to_average", 1, passes::lp_pool_to_average},
    {"compress_to_gather", 1, passes::compress_to_gather},
    {"qoperator_to_qdq", 1, passes::qoperator_to_qdq},
    {"eliminate_dead_code", 1, passes::eliminate_dead_code},
    {"fuse_layernorm", 2, passes::fuse_layernorm},
    {"fuse_rmsnorm", 2, passes::fuse_rmsnorm},
    {"fuse_groupnorm", 2, passes::fuse_groupnorm},
    {"fuse_gelu", 2, passes::fuse_gelu},
    {"fuse_swish", 2, passes::fuse_swish},
    {"fuse_groupnorm_act", 2, passes::fuse_groupnorm_act},
    {"fold_periodic_add", 2, passes::fold_periodic_add},
    {"unflatten_batched_matmul", 2, passes::unflatten_batched_matmul},
    {"fuse_attention", 2, passes::fuse_attention},
    {"map_onnx_attention", 2, passes::map_onnx_attention},
    {"fold_gemm_reshape", 2, passes::fold_gemm_reshape},
    {"regroup_head_parts", 2, passes::regroup_head_parts},
    {"fuse_rotary", 2, passes::fuse_rotary},
    {"rotary_before_heads", 2, passes::rotary_before_heads},
    {"slices_to_split", 2, passes::slices_to_split},
    {"image_attention", 2, passes::image_attention},
    {"fold_attention_heads", 2, passes::fold_attention_heads},
    {"fold_patch_conv", 2, passes::fold_patch_conv},
    {"sink_spatial_flatten", 2, passes::sink_spatial_flatten},
    {"fuse_matmul_add", 2, passes::fuse_matmul_add},
    {"fold_channel_scale", 2, passes::fold_channel_scale},
    {"pack_gemm", 2, passes::pack_gemm},
    {"pack_qkv", 2, passes::pack_qkv},
    {"fuse_attention_rotary", 2, passes::fuse_attention_rotary},
    {"sink_transposes", 2, passes::sink_transposes},
    {"drop_zero_mask", 2, passes::drop_zero_mask},
    {"narrow_attention_mask", 2, passes::narrow_attention_mask},
    {"fuse_residual_add", 2, passes::fuse_residual_add},
    {"fuse_skip_layernorm", 2, passes::fuse_skip_layernorm},
    {"fuse_conv_act", 2, passes::fuse_conv_act},
    {"fuse_conv_pool", 2, passes::fuse_conv_pool},
    {"fuse_conv_mean", 2, passes::fuse_conv_mean},
    {"fuse_conv_tail", 2, passes::fuse_conv_tail},
    {"batchnorm_to_affine", 2, passes::batchnorm_to_affine},
    {"fuse_elementwise", 2, passes::fuse_elementwise},
    {"eliminate_dead_code", 2, passes::eliminate_dead_code},
};

// The region stage, run once the list above has converged: fuse_relayout takes every connected
// region of layout ops that no pattern above wanted (a pattern pass that needs a Transpose or
// Reshape in its match must have run to completion first, so this cannot be in the list above,
// where a later round could find its ops already merged).
constexpr PassEntry kRegionPipeline[] = {
    {"fuse_relayout", 2, passes::fuse_relayout},
    {"eliminate_dead_code", 2, passes::eliminate_dead_code},
};

// The INT8 stage, a second list run the same way by optimize_int8_graph, on the graph the list
// above made, after quant::quantize_for_build has given the activations their scales and marked
// the layers that run in INT8 (engine.cpp; INT8 builds at --opt-level 2). Why after marking:
// - the fusions above are decided at the float precision, and marking needs their layers (an
//   INT8 layer is a FusedConv/FusedGemm with its bias, residual and activation); which layers
//   run in INT8 is known only then, so a fusion of INT8 layers cannot run before. Calibration
//   and its cache (fingerprinted on the float graph) see the unpaired layers.
// - fuse_conv_pair: an INT8 FusedConv whose residual is another INT8 FusedConv's output (no
//   activation, no residual) becomes one kiln.FusedConvPair where the backend has a kernel for
//   it; both layers keep the scales their values got.
// - eliminate_dead_code after it.
// --layer-precisions pins (and --accuracy-budget's) name the layers before pairing: a pinned
// layer is not INT8, so it does not pair; the pair is named after its first convolution.
constexpr PassEntry kInt8Pipeline[] = {
    {"fuse_conv_pair", 2, passes::fuse_conv_pair},
    {"eliminate_dead_code", 2, passes::eliminate_dead_code},
};
constexpr int kMaxRounds = 10;

const PassEntry* find_pass(const std::string& name) {
  for (std::span<const PassEntry> list :
       {std::span<const PassEntry>(kPipeline), std::span<const PassEntry>(kRegionPipeline),
        std::span<const PassEntry>(kInt8Pipeline)})
    for (const PassEntry& p : list)
      if (name == p.name) return &p;
  return nullptr;
}

bool selected(const PassEntry& p, const OptimizeOptions& options) {
  if (options.only_passes.empty()) return options.opt_level >= p.min_level;
  return std::find(options.only_passes.begin(), options.only_passes.end(), std::string(p.name)) !=
         options.only_passes.end();
}

Status dump(const Graph& g, const std::string& dir, int step, const std::string& what) {
  const std::string base = fmt::format("{}/{:02d}_{}", dir, step, what);
  std::ofstream txt(base + ".txt"), dot(base + ".dot");
  txt << graph_to_text(g);
  dot << graph_to_dot(g);
  if (!txt || !dot) return KILN_ERROR("--dump-graph: cannot write {}.txt/.dot", base);
  return Status::Ok();
}

// Runs one pass; afterwards re-infers shapes and checks the graph when it changed.
Expected<bool> run_entry(Graph& g, const PassEntry& p, const OptimizeOptions& options,
                         bool explain) {
  PassContext ctx{g, options, p.name, {}, 0};
  Expected<bool> changed = p.run(ctx);
  if (!changed.ok()) return changed.status().with_context(fmt::format("pass {}", p.name));
  if (*changed) {
    KILN_RETURN_IF_ERROR(g.topo_sort());
    Status st = infer_shapes(g);
    if (st.ok()) st = verify_graph(g);
    if (!st.ok()) return st.with_context(fmt::format("after pass {}", p.name));
  }
  if (options.verbose) {
    if (*changed) {
      std::cerr << fmt::format("{}: {} rewrite{}\n", p.name, ctx.rewrites,
                               ctx.rewrites == 1 ? "" : "s");
    } else if (explain) {
      if (ctx.notes.empty())
        std::cerr << fmt::format("{}: not applicable (no candidates)\n", p.name);
      for (const std::string& n : ctx.notes)
        std::cerr << fmt::format("{}: not applicable: {}\n", p.name, n);
    }
  }
  return *changed;
}

// The number of the next --dump-graph step in `dir`: one past the highest NN of its NN_*.txt
// files (the INT8 stage continues the float pipeline's numbering).
int next_dump_step(const std::string& dir) {
  int next = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    size_t digits = 0;
    while (digits < f.size() && digits < 6 && std::isdigit(static_cast<unsigned char>(f[digits])))
      ++digits;
    if (digits >= 2 && digits < f.size() && f[digits] == '_')
      next = std::max(next, std::stoi(f.substr(0, digits)) + 1);
  }
  return next;
}

Status create_dump_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return KILN_ERROR("--dump-graph: cannot create '{}': {}", dir, ec.message());
  return Status::Ok();
}

// Runs the selected passes of `list` round after round until a round changes nothing (or
// kMaxRounds), dumping the graph after each pass that changed it; then drops dead values,
// re-infers and verifies. Returns the number of rounds.
Expected<int> run_rounds(Graph& g, std::span<const PassEntry> list, const OptimizeOptions& options,
                         int& step) {
  int round = 0;
  for (bool changed = true; changed && round < kMaxRounds; ++round) {
    changed = false;
    for (const PassEntry& p : list) {
      if (!selected(p, options)) continue;
      KILN_ASSIGN_OR_RETURN(bool c, run_entry(g, p, options, round == 0));
      if (c && !options.dump_dir.empty())
        KILN_RETURN_IF_ERROR(dump(g, options.dump_dir, step++, p.name));
      changed |= c;
    }
  }
  g.remove_dead_values();
  KILN_RETURN_IF_ERROR(infer_shapes(g));
  KILN_RETURN_IF_ERROR(verify_graph(g));
  return round;
}

// The branches and bodies that are left (If, Loop, Scan) get the same pipeline as the graph
// holding them: closed graphs (importer.cpp), typed by the last inference of the main graph
// (a Loop body at its carried values' types joined over iterations), so a pass sees shapes
// that hold for every run of the subgraph. The main graph is inferred and verified again.
Status optimize_subgraphs(Graph& g, const OptimizeOptions& options) {
  bool any = false;
  for (Node* n : g.nodes()) {
    for (Graph* sub : n->attrs.subgraphs()) {
      if (n->op_type == "If" && !infer_shapes(*sub).ok()) {
        // A branch that cannot run at these types (infer_if: not taken, or an error in the run
        // that takes it) stays as imported.
        if (options.verbose)
          std::cerr << fmt::format("optimizer: subgraph '{}' of {} cannot run at its inputs' "
                                   "types; left as it is\n", sub->name, n->label());
        continue;
      }
      OptimizeOptions o = options;
      if (!o.dump_dir.empty())
        o.dump_dir = fmt::format("{}/subgraph_{}_{}", options.dump_dir, n->name, sub->name);
      if (options.verbose)
        std::cerr << fmt::format("optimizer: subgraph '{}' of {}:\n", sub->name, n->label());
      Status st = optimize_graph(*sub, o);
      if (!st.ok())
        return st.with_context(fmt::format("subgraph '{}' of {}", sub->name, n->label()));
      any = true;
    }
  }
  if (!any) return Status::Ok();
  KILN_RETURN_IF_ERROR(infer_shapes(g));
  return verify_graph(g);
}

Status check_opt_level(const OptimizeOptions& options) {
  if (options.opt_level < 0 || options.opt_level > 2)
    return KILN_ERROR("--opt-level must be 0, 1 or 2 (got {})", options.opt_level);
  return Status::Ok();
}

}  // namespace

std::vector<std::string> pipeline_passes(int opt_level) {
  std::vector<std::string> out;
  for (std::span<const PassEntry> list :
       {std::span<const PassEntry>(kPipeline), std::span<const PassEntry>(kRegionPipeline)})
    for (const PassEntry& p : list)
      if (opt_level >= p.min_level) out.push_back(p.name);
  return out;
}

Expected<bool> run_pass(Graph& g, const std::string& pass, const OptimizeOptions& options) {
  const PassEntry* p = find_pass(pass);
  if (!p) return KILN_ERROR("unknown pass '{}'", pass);
  return run_entry(g, *p, options, true);
}

Status optimize_graph(Graph& g, const OptimizeOptions& options) {
  KILN_RETURN_IF_ERROR(check_opt_level(options));
  KILN_RETURN_IF_ERROR(infer_shapes(g));
  int step = 0;
  if (!options.dump_dir.empty()) {
    KILN_RETURN_IF_ERROR(create_dump_dir(options.dump_dir));
    KILN_RETURN_IF_ERROR(dump(g, options.dump_dir, step++, "import"));
  }
  if (options.opt_level == 0 && options.only_passes.empty()) return Status::Ok();
  const size_t before = g.nodes().size();
  KILN_ASSIGN_OR_RETURN(const int rounds, run_rounds(g, kPipeline, options, step));
  KILN_RETURN_IF_ERROR(run_rounds(g, kRegionPipeline, options, step).status());
  KILN_RETURN_IF_ERROR(optimize_subgraphs(g, options));
  if (options.verbose)
    std::cerr << fmt::format("optimizer: {} nodes -> {} layers in {} round{} (opt level {})\n",
                             before, g.nodes().size(), rounds, rounds == 1 ? "" : "s",
                             options.opt_level);
  if (!options.dump_dir.empty()) KILN_RETURN_IF_ERROR(dump(g, options.dump_dir, step, "final"));
  return Status::Ok();
}

Status optimize_int8_graph(Graph& g, const OptimizeOptions& options) {
  KILN_RETURN_IF_ERROR(check_opt_level(options));
  if (std::none_of(std::begin(kInt8Pipeline), std::end(kInt8Pipeline),
                   [&](const PassEntry& p) { return selected(p, options); }))
    return Status::Ok();
  int step = 0;
  if (!options.dump_dir.empty()) {
    KILN_RETURN_IF_ERROR(create_dump_dir(options.dump_dir));
    step = next_dump_step(options.dump_dir);
  }
  KILN_RETURN_IF_ERROR(infer_shapes(g));
  const size_t before = g.nodes().size();
  KILN_ASSIGN_OR_RETURN(const int rounds, run_rounds(g, kInt8Pipeline, options, step));
  if (options.verbose)
    std::cerr << fmt::format("INT8 optimizer: {} layers -> {} in {} round{}\n", before,
                             g.nodes().size(), rounds, rounds == 1 ? "" : "s");
  if (!options.dump_dir.empty())
    KILN_RETURN_IF_ERROR(dump(g, options.dump_dir, step, "int8_final"));
  return Status::Ok();
}

std::vector<std::string> int8_pipeline_passes(int opt_level) {
  std::vector<std::string> out;
  for (const PassEntry& p : kInt8Pipeline)
    if (opt_level >= p.min_level) out.push_back(p.name);
  return out;
}

}  // namespace kiln
