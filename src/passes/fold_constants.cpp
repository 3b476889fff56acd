// Constant folding: a node whose inputs are all constants (or a Shape/Size whose input shape is
// fully known, or any node computing a small integer tensor from shapes whose every element is
// known, as shape inference records it) is replaced by its value, computed with the CPU
// reference kernel.
//   Op(const...)  =>  const          Shape(x: static [a,b,c])  =>  const [a,b,c]
//   Gather(Shape(x: [N, 197, 768]), 1)  =>  const 197   (N a symbol: Shape itself stays)
//   CastLike(const, x: known type)  =>  const     (x gives only its type, as ONNX's Attention
//                                                  function writes CastLike(-inf, mask))
//   EyeLike(x: static [a, b])  =>  const          (x gives only its shape)
// Shape -> Gather -> Concat -> Reshape chains fold in one sweep because nodes are visited in
// topological order. Random ops never fold; results above kMaxFoldBytes stay computed at run
// time so that folding cannot blow up the engine's size, unless they are no larger than the
// constants they are made of (a Transpose or Reshape of a weight: GPT-2's tied LM head); so do
// results above kMaxGrowBytes that are over 4x their constants (a broadcast or Tile of a small
// mask over the batch: Swin's shifted-window masks at batch 32 would add 133 MB to the engine).
#include <set>

#include "ops/op.h"
#include "ops/shape_util.h"
#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr size_t kMaxFoldBytes = size_t{64} << 20;
constexpr size_t kMaxGrowBytes = size_t{16} << 20;

bool is_random_op(const Node& n) {
  static const std::set<std::string> kRandom = {"RandomNormal",     "RandomUniform",
                                                "RandomNormalLike", "RandomUniformLike",
                                                "Multinomial",      "Bernoulli"};
  return kRandom.count(n.op_type) != 0;
}

// The value of a node's only output when shape inference knows every element of it (a shape
// computation's result that does not depend on the symbolic dims).
std::optional<Tensor> known_shape_value(const Node& n) {
  if (n.num_outputs() != 1 || !n.output(0)) return std::nullopt;
  const Value* o = n.output(0);
  const DataType t = o->type.dtype;
  if (!o->shape_value || o->is_constant() || (t != DataType::kInt64 && t != DataType::kInt32))
    return std::nullopt;
  const auto shape = o->type.static_shape();
  if (!shape || shape->size() > 1) return std::nullopt;
  std::vector<int64_t> v;
  for (const SymInt& e : *o->shape_value) {
    if (!e.value) return std::nullopt;
    v.push_back(*e.value);
  }
  if (static_cast<int64_t>(v.size()) != (shape->empty() ? 1 : (*shape)[0])) return std::nullopt;
  Tensor r = shape->empty() ? Tensor::scalar<int64_t>(v[0])
                            : Tensor::from<int64_t>({static_cast<int64_t>(v.size())}, v);
  return t == DataType::kInt64 ? r : r.cast(t);
}

// Shape/Size of a value whose dims are all known, without touching its data.
std::optional<Tensor> fold_shape_query(const Node& n) {
  const Value* x = n.input(0);
  if (!x || !x->type.is_static() || n.num_outputs() != 1) return std::nullopt;
  const std::vector<int64_t> shape = *x->type.static_shape();
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (n.op_type == "Size") {
    int64_t p = 1;
    for (int64_t d : shape) p *= d;
    return Tensor::scalar<int64_t>(p);
  }
  auto clamp = [&](int64_t a) {
    return std::min(std::max(a < 0 ? a + rank : a, int64_t{0}), rank);
  };
  const int64_t start = clamp(n.attrs.get_int("start", 0));
  const int64_t end = clamp(n.attrs.get_int("end", rank));
  std::vector<int64_t> dims;
  for (int64_t i = start; i < end; ++i) dims.push_back(shape[static_cast<size_t>(i)]);
  return Tensor::from<int64_t>({static_cast<int64_t>(dims.size())}, dims);
}

// EyeLike reads only its input's shape: with a static one, its value (through the CPU kernel, on
// a stand-in of that shape) while neither is larger than kMaxFoldBytes.
std::optional<std::vector<Tensor>> fold_eye_like(PassContext& ctx, const Node& n) {
  const Value* x = n.input(0);
  if (!x || x->is_constant() || !x->type.is_static() || n.num_outputs() != 1) return std::nullopt;
  const std::vector<int64_t> shape = *x->type.static_shape();
  const std::optional<int64_t> numel = shape_detail::static_product(*x->type.dims);
  if (!numel || *numel > static_cast<int64_t>(kMaxFoldBytes / 8)) return std::nullopt;
  const Tensor stand_in(x->type.dtype == DataType::kUndefined ? DataType::kFloat32 : x->type.dtype,
                        shape);
  std::vector<Tensor> outs(1);
  KernelContext kctx(n, {&stand_in}, outs);
  const OpDef* def = find_op(n.domain, n.op_type);
  const Status st = def && def->cpu ? def->cpu(kctx) : Status::Error("no cpu kernel");
  if (!st.ok()) {
    ctx.note(fmt::format("{}: kernel failed: {}", n.label(), st.message()));
    return std::nullopt;
  }
  return outs;
}

struct FoldConstant {
  struct Match {
    Node* node;
    std::vector<Tensor> values;
  };

  // Computes the folded outputs (pure: the graph is not touched).
  static std::optional<std::vector<Tensor>> evaluate(PassContext& ctx, Node& n) {
    std::vector<Tensor> outs(n.num_outputs());
    if (auto t = fold_shape_query(n); t && !n.input(0)->is_constant()) {
      outs[0] = std::move(*t);
      return outs;
    }
    const OpDef* def = find_op(n.domain, n.op_type);
    std::vector<const Tensor*> ins;
    std::vector<Tensor> like;  // empty stand-ins for inputs read only for their type
    like.reserve(n.num_inputs());
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      const Value* v = n.input(i);
      if (v && !v->is_constant() && input_is_type_only(n, i)) {
        like.emplace_back(v->type.dtype, std::vector<int64_t>{0});
        ins.push_back(&like.back());
      } else {
        ins.push_back(v ? v->constant.get() : nullptr);
      }
    }
    KernelContext kctx(n, ins, outs);
    Status st = def && def->cpu ? def->cpu(kctx) : Status::Error("no cpu kernel");
    if (!st.ok()) {
      // Not ours to report: the node stays and reports (or not) at run time.
      ctx.note(fmt::format("{}: kernel failed: {}", n.label(), st.message()));
      return std::nullopt;
    }
    for (size_t i = 0; i < outs.size(); ++i)
      if (n.output(i) && outs[i].empty_storage()) return std::nullopt;
    return outs;
  }

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    // kiln's own ops fold too (by their CPU kernels): a fusion may have taken a chain whose
    // inputs became constants only later (timm's "same" padding, computed from the input's size,
    // then fused into a kiln.ElementwiseChain), and every shape after it would stay unknown.
    if ((!n.domain.empty() && n.domain != "kiln") || is_random_op(n)) return std::nullopt;
    if ((n.op_type == "Shape" || n.op_type == "Size") && n.input(0) && !n.input(0)->is_constant()) {
      if (!fold_shape_query(n)) return std::nullopt;
      auto v = evaluate(ctx, n);
      return v ? std::optional<Match>(Match{&n, std::move(*v)}) : std::nullopt;
    }
    if (n.domain.empty() && n.op_type == "EyeLike" && n.input(0) && !n.input(0)->is_constant()) {
      auto v = fold_eye_like(ctx, n);
      return v ? std::optional<Match>(Match{&n, std::move(*v)}) : std::nullopt;
    }
    if (auto t = known_shape_value(n)) {
      std::vector<Tensor> outs;
      outs.push_back(std::move(*t));
      return Match{&n, std::move(outs)};
    }
    bool any = false;
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      const Value* v = n.input(i);
      if (!v) continue;
      if (input_is_type_only(n, i) && v->type.dtype != DataType::kUndefined) continue;
      if (!v->is_constant()) return std::nullopt;
      any = true;
    }
    if (!any) return std::nullopt;
    // Sizes from a fresh inference (the values' types may predate folding of the inputs).
    const OpDef* def = find_op(n.domain, n.op_type);
    std::vector<TensorType> types(n.num_outputs());
    InferContext ictx(n, types);
    if (!def || !def->infer || !def->infer(ictx).ok()) return std::nullopt;
    size_t in_bytes = 0, out_bytes = 0;
    for (const Value* v : n.inputs())
      if (v && v->is_constant()) in_bytes += v->constant->nbytes();
    for (size_t i = 0; i < types.size(); ++i) {
      if (!n.output(i)) continue;
      if (!types[i].is_static()) {
        ctx.note(fmt::format("{}: output {} has no static shape", n.label(), i));
        return std::nullopt;
      }
      // Checked: an output whose size passes int64 (fuzz_build: a Reshape whose shape input
      // became constant after the import's checks) is never folded.
      const std::optional<int64_t> numel = shape_detail::static_product(*types[i].dims);
      int64_t bytes = 0;
      if (!numel || __builtin_mul_overflow(*numel, int64_t(dtype_size(types[i].dtype)), &bytes)) {
        ctx.note(fmt::format("{}: output {} would hold more than 2^63 bytes", n.label(), i));
        return std::nullopt;
      }
      out_bytes += static_cast<size_t>(bytes);
    }
    if (out_bytes > kMaxFoldBytes && out_bytes > in_bytes) {
      ctx.note(fmt::format("{}: its output would be larger than {} MiB and than its inputs",
                           n.label(), kMaxFoldBytes >> 20));
      return std::nullopt;
    }
    if (out_bytes > kMaxGrowBytes && out_bytes > 4 * in_bytes) {
      ctx.note(fmt::format("{}: its output would be larger than {} MiB and 4x its inputs",
                           n.label(), kMaxGrowBytes >> 20));
      return std::nullopt;
    }
    auto v = evaluate(ctx, n);
    return v ? std::optional<Match>(Match{&n, std::move(*v)}) : std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Node& n = *m.node;
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      Value* o = n.output(i);
      if (!o) continue;
      o->type = TensorType::of(m.values[i]);
      o->constant = std::make_shared<const Tensor>(m.values[i]);
    }
    return ctx.g.remove_node(&n, /*force=*/true);
  }
};

}  // namespace

Expected<bool> fold_constants(PassContext& ctx) { return apply_pattern<FoldConstant>(ctx); }

}  // namespace kiln::passes
