// kiln's fused layers: the op table, FusedConv, FusedConvMean, FusedConvPool, FusedConvPair and
// FusedGemm, and
// the helpers shared with fused_chain.cpp and fused_int8.cpp. Kernels compose the registry's
// reference kernels (see fused_util.h).
#include "ops/fused.h"

#include <algorithm>

#include "ops/fused_util.h"
#include "quant/int8.h"

namespace kiln {

const std::vector<std::string>& fused_activation_names() {
  static const std::vector<std::string> k = {"Relu",      "Clip",      "Sigmoid", "Tanh",
                                             "LeakyRelu", "HardSwish", "Gelu",    "Swish"};
  return k;
}

bool fused_activation_supported(const std::string& op_type) {
  const auto& k = fused_activation_names();
  return op_type.empty() || std::find(k.begin(), k.end(), op_type) != k.end();
}

bool chain_op_supported(const std::string& op_type) {
  static const std::vector<std::string> k = {"Add",       "Sub",
                                             "Mul",       "Div",
                                             "Pow",       "Max",
                                             "Min",       "Relu",
                                             "Sigmoid",   "Tanh",
                                             "Exp",       "Log",
                                             "Neg",       "Abs",
                                             "Sqrt",      "Reciprocal",
                                             "Erf",       "Floor",
                                             "Ceil",      "Round",
                                             "LeakyRelu", "HardSigmoid",
                                             "HardSwish", "Softplus",
                                             "Softsign",  "Elu",
                                             "Selu",      "Celu",
                                             "Gelu",      "Clip",
                                             "Sin",       "Cos",
                                             "PRelu",     "ThresholdedRelu",
                                             "Mish",      "Sign",
                                             "Swish"};
  return std::find(k.begin(), k.end(), op_type) != k.end() && find_op("", op_type) != nullptr;
}

int post_op_index(std::string_view op_type) {
  const auto* it = std::find(std::begin(kPostOps), std::end(kPostOps), op_type);
  return it == std::end(kPostOps) ? -1 : static_cast<int>(it - std::begin(kPostOps));
}

bool post_op_binary(const std::string& op_type) {
  const int i = post_op_index(op_type);
  return i >= 0 && i < kPostOpsBinary;
}

bool post_op_supported(const std::string& op_type) { return post_op_index(op_type) >= 0; }

bool fused_layer_supported(const std::string& op_type, const Attributes& attrs) {
  if (op_type == "FusedConv") {
    const auto ops = attrs.get_strings("post_ops");
    return fused_activation_supported(attrs.get_string("activation", "")) &&
           std::all_of(ops.begin(), ops.end(), post_op_supported) &&
           attrs.get_floats("post_values").size() == ops.size();
  }
  if (op_type == "FusedGemm" || op_type == "FusedConvPool" || op_type == "FusedConvPair" ||
      op_type == "FusedConvMean" || op_type == "FusedGroupNorm")
    return fused_activation_supported(attrs.get_string("activation", ""));
  if (op_type == "ElementwiseChain") {
    const auto ops = attrs.get_strings("ops");
    return !ops.empty() && std::all_of(ops.begin(), ops.end(), chain_op_supported);
  }
  if (op_type == "Relayout") {
    const auto ops = attrs.get_strings("ops");
    return !ops.empty() && std::all_of(ops.begin(), ops.end(), relayout_op_supported);
  }
  return op_type == "Attention" || op_type == "MultiHeadAttention" || op_type == "SkipLayerNorm";
}

namespace fused {

Expected<Tensor> run_op(const Node& owner, const std::string& op_type, const Attributes& attrs,
                        const std::vector<const Tensor*>& inputs) {
  const OpDef* def = find_op("", op_type);
  if (!def || !def->cpu) return KILN_ERROR("{}: no kernel for its {} step", owner.label(), op_type);
  Node step;
  step.name = owner.name + "/" + op_type;
  step.op_type = op_type;
  step.attrs = attrs;
  step.index = owner.index;
  std::vector<Tensor> outs(1);
  KernelContext ctx(step, inputs, outs);
  Status st = def->cpu(ctx);
  if (!st.ok()) return st.with_context(owner.label());
  if (outs[0].empty_storage())
    return KILN_ERROR("{}: {} step produced nothing", owner.label(), op_type);
  return std::move(outs[0]);
}

Attributes strip_prefix(const Attributes& a, const std::string& prefix) {
  Attributes out;
  for (const auto& [k, v] : a.all())
    if (k.size() > prefix.size() && k.compare(0, prefix.size(), prefix) == 0)
      out.set(k.substr(prefix.size()), v);
  return out;
}

Expected<Tensor> apply_activation(const Node& n, Tensor y) {
  const std::string act = n.attrs.get_string("activation", "");
  if (act.empty()) return y;
  if (!fused_activation_supported(act))
    return KILN_ERROR("{}: unsupported fused activation '{}'", n.label(), act);
  Attributes a = strip_prefix(n.attrs, "act_");
  if (act == "Clip") {
    Tensor lo, hi;
    const bool has_lo = a.has("min"), has_hi = a.has("max");
    if (has_lo) lo = Tensor::scalar<float>(a.get_float("min", 0)).cast(y.dtype());
    if (has_hi) hi = Tensor::scalar<float>(a.get_float("max", 0)).cast(y.dtype());
    return run_op(n, "Clip", {}, {&y, has_lo ? &lo : nullptr, has_hi ? &hi : nullptr});
  }
  return run_op(n, act, a, {&y});
}

Expected<Tensor> add_same_shape(const Node& n, const Tensor& y, const Tensor& z, const char* what) {
  KILN_ASSIGN_OR_RETURN(Tensor s, run_op(n, "Add", {}, {&y, &z}));
  if (s.shape() != y.shape())
    return KILN_ERROR("{}: {} of shape {} would broadcast the result {} to {}", n.label(), what,
                      shape_str(z.shape()), shape_str(y.shape()), shape_str(s.shape()));
  return s;
}

Expected<Tensor> apply_post(const Node& n, Tensor y) {
  const auto ops = n.attrs.get_strings("post_ops");
  const auto values = n.attrs.get_floats("post_values");
  if (values.size() != ops.size())
    return KILN_ERROR("{}: {} post_ops but {} post_values", n.label(), ops.size(), values.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!post_op_supported(ops[i]))
      return KILN_ERROR("{}: unsupported post step '{}'", n.label(), ops[i]);
    if (post_op_binary(ops[i])) {
      const Tensor c = Tensor::scalar<float>(values[i]).cast(y.dtype());
      KILN_ASSIGN_OR_RETURN(y, run_op(n, ops[i], {}, {&y, &c}));
    } else {
      KILN_ASSIGN_OR_RETURN(y, run_op(n, ops[i], {}, {&y}));
    }
  }
  return y;
}

Status check_pair_shapes(const Node& n, const Tensor& y1, const Tensor& y2) {
  if (y1.shape() != y2.shape())
    return KILN_ERROR("{}: the two convolutions' outputs differ in shape: {} and {}", n.label(),
                      shape_str(y1.shape()), shape_str(y2.shape()));
  return Status::Ok();
}

}  // namespace fused

namespace {

const OpDef& base_op(const char* op) { return *find_op("", op); }

// --- kiln.FusedConv
// -------------------------------------------------------------------------------

Status infer_fused_conv(InferContext& ctx) { return base_op("Conv").infer(ctx); }

Status cpu_fused_conv(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (quant::runs_int8(n)) return cpu_int8_layer(ctx);
  std::vector<Tensor> outs(1);
  KernelContext conv(n, {ctx.input(0), ctx.input(1), ctx.input(2)}, outs);
  KILN_RETURN_IF_ERROR(base_op("Conv").cpu(conv));
  Tensor y = std::move(outs[0]);
  if (const Tensor* z = ctx.input(3)) {
    KILN_ASSIGN_OR_RETURN(y, fused::add_same_shape(n, y, *z, "residual input"));
  }
  KILN_ASSIGN_OR_RETURN(y, fused::apply_activation(n, std::move(y)));
  KILN_ASSIGN_OR_RETURN(y, fused::apply_post(n, std::move(y)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- kiln.FusedConvMean: FusedConv, and as output 1 the mean of its output over the spatial axes
// (GlobalAveragePool of output 0: a squeeze-excitation block's pool, made by the convolution's
// kernel as it writes output 0 instead of a pass reading it back)
// -------------------------------------------------------------------------------

Status infer_fused_conv_mean(InferContext& ctx) {
  std::vector<TensorType> conv(1);
  InferContext c(ctx.node(), conv);
  KILN_RETURN_IF_ERROR(base_op("Conv").infer(c));
  TensorType mean = conv[0];
  if (mean.dims)
    for (size_t i = 2; i < mean.dims->size(); ++i) (*mean.dims)[i] = Dim(int64_t{1});
  ctx.set_output(0, conv[0]);
  ctx.set_output(1, mean);
  return Status::Ok();
}

Status cpu_fused_conv_mean(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (quant::runs_int8(n)) return KILN_ERROR("{}: FusedConvMean has no INT8 form", n.label());
  std::vector<Tensor> outs(1);
  KernelContext conv(n, {ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)}, outs);
  KILN_RETURN_IF_ERROR(cpu_fused_conv(conv));
  KILN_ASSIGN_OR_RETURN(Tensor mean, fused::run_op(n, "GlobalAveragePool", {}, {&outs[0]}));
  ctx.set_output(0, std::move(outs[0]));
  ctx.set_output(1, std::move(mean));
  return Status::Ok();
}

// --- kiln.FusedConvPool: FusedConv (no residual) then MaxPool with the attributes prefixed "pool_"
// -------------------------------------------------------------------------------

Status infer_fused_conv_pool(InferContext& ctx) {
  std::vector<TensorType> conv(1);
  InferContext c(ctx.node(), conv);
  KILN_RETURN_IF_ERROR(base_op("Conv").infer(c));
  Graph g;
  Value* y = g.add_value("conv", conv[0]);
  Node* pool = g.add_node("MaxPool", ctx.node().name + "/MaxPool", {y}, {"pooled"});
  pool->attrs = fused::strip_prefix(ctx.node().attrs, "pool_");
  std::vector<TensorType> pooled(1);
  InferContext p(*pool, pooled);
  KILN_RETURN_IF_ERROR(base_op("MaxPool").infer(p));
  ctx.set_output(0, pooled[0]);
  return Status::Ok();
}

Status cpu_fused_conv_pool(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (ctx.input(3)) return KILN_ERROR("{}: FusedConvPool takes no residual", n.label());
  if (quant::runs_int8(n)) return cpu_int8_layer(ctx);
  std::vector<Tensor> outs(1);
  KernelContext conv(n, {ctx.input(0), ctx.input(1), ctx.input(2)}, outs);
  KILN_RETURN_IF_ERROR(base_op("Conv").cpu(conv));
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::apply_activation(n, std::move(outs[0])));
  KILN_ASSIGN_OR_RETURN(Tensor pooled,
                        fused::run_op(n, "MaxPool", fused::strip_prefix(n.attrs, "pool_"), {&y}));
  ctx.set_output(0, std::move(pooled));
  return Status::Ok();
}

// --- kiln.FusedConvPair: act(Conv(X, W, B) + Conv(X2, W2, B2)), the second convolution's
// attributes prefixed "conv2_"
// -------------------------------------------------------------------------------

// The second convolution's output type: Conv's inference on inputs 3..5 in a scratch graph (an
// InferContext reads its input types from the node's values).
Expected<TensorType> infer_second_conv(const Node& n) {
  Graph g;
  std::vector<Value*> ins;
  for (size_t i = 3; i < 6; ++i) {
    const Value* v = n.input(i);
    Value* c = v ? g.add_value("in" + std::to_string(i), v->type) : nullptr;
    if (c) c->constant = v->constant;
    ins.push_back(c);
  }
  Node* conv = g.add_node("Conv", n.name + "/conv2", ins, {"y2"});
  conv->attrs = fused::strip_prefix(n.attrs, "conv2_");
  std::vector<TensorType> out(1);
  InferContext c(*conv, out);
  KILN_RETURN_IF_ERROR(base_op("Conv").infer(c));
  return out[0];
}

// Whether two inferred dims may be the same (static ones must be equal).
bool dims_may_match(const TensorType& a, const TensorType& b) {
  if (!a.dims || !b.dims) return true;
  if (a.dims->size() != b.dims->size()) return false;
  for (size_t i = 0; i < a.dims->size(); ++i) {
    const Dim &x = (*a.dims)[i], &y = (*b.dims)[i];
    if (x.is_static() && y.is_static() && x.value != y.value) return false;
  }
  return true;
}

// The two outputs are added element by element, never broadcast: a shape that only broadcasts
// would make the layer write a tensor neither convolution computes.
Status infer_fused_conv_pair(InferContext& ctx) {
  const Node& n = ctx.node();
  if (!n.input(3) || !n.input(4))
    return KILN_ERROR("{}: FusedConvPair needs X2 and W2 (inputs 3 and 4)", n.label());
  std::vector<TensorType> first(1);
  InferContext c(n, first);
  KILN_RETURN_IF_ERROR(base_op("Conv").infer(c));
  Expected<TensorType> second = infer_second_conv(n);
  if (!second.ok()) return second.status().with_context(n.label());
  if (!dims_may_match(first[0], *second))
    return KILN_ERROR("{}: the two convolutions' outputs differ in shape: {} and {}", n.label(),
                      first[0].str(), second->str());
  TensorType y = first[0];  // a dim only the second convolution knows statically is kept
  if (!y.dims && second->dims) y.dims = second->dims;
  if (y.dims && second->dims)
    for (size_t i = 0; i < y.dims->size(); ++i)
      if (!(*y.dims)[i].is_static() && (*second->dims)[i].is_static())
        (*y.dims)[i] = (*second->dims)[i];
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

Status cpu_fused_conv_pair(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (quant::runs_int8(n)) return cpu_int8_layer(ctx);
  if (!ctx.input(3) || !ctx.input(4))
    return KILN_ERROR("{}: FusedConvPair needs X2 and W2 (inputs 3 and 4)", n.label());
  std::vector<Tensor> outs(1);
  KernelContext conv(n, {ctx.input(0), ctx.input(1), ctx.input(2)}, outs);
  KILN_RETURN_IF_ERROR(base_op("Conv").cpu(conv));
  KILN_ASSIGN_OR_RETURN(Tensor y2, fused::run_op(n, "Conv", fused::strip_prefix(n.attrs, "conv2_"),
                                                 {ctx.input(3), ctx.input(4), ctx.input(5)}));
  KILN_RETURN_IF_ERROR(fused::check_pair_shapes(n, outs[0], y2));
  KILN_ASSIGN_OR_RETURN(Tensor y, fused::add_same_shape(n, outs[0], y2, "second convolution"));
  KILN_ASSIGN_OR_RETURN(y, fused::apply_activation(n, std::move(y)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// --- kiln.FusedGemm
// -------------------------------------------------------------------------------

Status check_base(const Node& n, std::string* base) {
  *base = n.attrs.get_string("base", "");
  if (*base != "Gemm" && *base != "MatMul")
    return KILN_ERROR("{}: attribute base must be \"Gemm\" or \"MatMul\", got \"{}\"", n.label(),
                      *base);
  return Status::Ok();
}

Status infer_fused_gemm(InferContext& ctx) {
  std::string base;
  KILN_RETURN_IF_ERROR(check_base(ctx.node(), &base));
  return base_op(base.c_str()).infer(ctx);
}

Status cpu_fused_gemm(KernelContext& ctx) {
  const Node& n = ctx.node();
  if (quant::runs_int8(n)) return cpu_int8_layer(ctx);
  std::string base;
  KILN_RETURN_IF_ERROR(check_base(n, &base));
  std::vector<Tensor> outs(1);
  std::vector<const Tensor*> ins = {ctx.input(0), ctx.input(1)};
  if (base == "Gemm") ins.push_back(ctx.input(2));
  KernelContext k(n, ins, outs);
  KILN_RETURN_IF_ERROR(base_op(base.c_str()).cpu(k));
  Tensor y = std::move(outs[0]);
  if (base == "MatMul" && ctx.input(2)) {
    KILN_ASSIGN_OR_RETURN(y, fused::add_same_shape(n, y, *ctx.input(2), "bias"));
  }
  if (const Tensor* r = ctx.input(3)) {
    KILN_ASSIGN_OR_RETURN(y, fused::add_same_shape(n, y, *r, "residual input"));
  }
  KILN_ASSIGN_OR_RETURN(y, fused::apply_activation(n, std::move(y)));
  ctx.set_output(0, std::move(y));
  return Status::Ok();
}

// kiln.Reformat(X) = X: a backend's explicit change of storage format (type or layout); the
// value it carries is unchanged, so its inference and reference kernel are Identity's.
Status infer_reformat(InferContext& ctx) { return infer_same_as_input(ctx, 0); }
Status cpu_reformat(KernelContext& ctx) {
  if (!ctx.input(0)) return KILN_ERROR("{}: missing input", ctx.node().label());
  ctx.set_output(0, *ctx.input(0));
  return Status::Ok();
}

}  // namespace

Status unfuse_attention_rotary(Graph& g, Node* n);  // fused_transformer.cpp
Status unfuse_groupnorm(Graph& g, Node* n);         // fused_norm.cpp

// FusedConvMean -> FusedConv, and GlobalAveragePool of its output writing output 1.
Status unfuse_conv_mean(Graph& g, Node* n) {
  if (n->num_outputs() < 2 || !n->output(0) || !n->output(1))
    return KILN_ERROR("{}: FusedConvMean without its two outputs", n->label());
  const std::vector<Value*> ins(n->inputs().begin(), n->inputs().end());
  Node* conv = g.insert_node_before(n, "FusedConv", g.unique_name(n->name), ins, {}, "kiln");
  conv->attrs = n->attrs;
  Node* pool = g.insert_node_before(n, "GlobalAveragePool", g.unique_name(n->name + "/mean"),
                                    {n->output(0)}, {});
  for (Node* p : {conv, pool}) {
    p->origin = n->origin.empty() ? "unfuse" : n->origin + "+unfuse";
    p->onnx_nodes = n->onnx_nodes;
  }
  Value* y = n->output(0);
  Value* mean = n->output(1);
  KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
  g.set_node_output(conv, 0, y);
  g.set_node_output(pool, 0, mean);
  return Status::Ok();
}

Status unfuse_layer(Graph& g, Node* n) {
  if (n->domain == "kiln" && n->op_type == "MultiHeadAttention" && mha_has_rotary(*n))
    return unfuse_attention_rotary(g, n);
  if (n->domain == "kiln" && n->op_type == "FusedConvMean") return unfuse_conv_mean(g, n);
  if (n->domain == "kiln" && n->op_type == "FusedGroupNorm") return unfuse_groupnorm(g, n);
  const bool conv = n->domain == "kiln" && n->op_type == "FusedConv";
  const bool gemm = n->domain == "kiln" && n->op_type == "FusedGemm";
  if ((!conv && !gemm) || quant::runs_int8(*n) || !n->output(0))
    return KILN_ERROR("{}: only float kiln.FusedConv and kiln.FusedGemm layers split", n->label());
  std::string base = "Conv";
  if (gemm) KILN_RETURN_IF_ERROR(check_base(*n, &base));
  Attributes base_attrs;
  for (const auto& [k, v] : n->attrs.all())
    if (k != "activation" && k != "base" && k.rfind("act_", 0) != 0 && k.rfind("post_", 0) != 0)
      base_attrs.set(k, v);
  const DataType dt = n->output(0)->type.dtype;
  Value* y = nullptr;
  // Each part is placed before the layer and named after it; the last part takes over its output.
  Node* last = nullptr;
  auto part = [&](const std::string& op, std::vector<Value*> ins, Attributes a = {}) {
    const std::string name = g.unique_name(n->name + "/" + op);
    Node* p = g.insert_node_before(n, op, name, ins, {name});
    p->attrs = std::move(a);
    p->origin = n->origin.empty() ? "unfuse" : n->origin + "+unfuse";
    p->onnx_nodes = n->onnx_nodes;
    p->output(0)->type = n->output(0)->type;
    last = p;
    y = p->output(0);
  };
  std::vector<Value*> ins = {n->input(0), n->input(1)};
  if (conv || base == "Gemm") ins.push_back(n->input(2));
  while (!ins.empty() && !ins.back()) ins.pop_back();
  part(base, ins, base_attrs);
  if (gemm && base == "MatMul" && n->input(2)) part("Add", {y, n->input(2)});
  if (n->num_inputs() > 3 && n->input(3)) part("Add", {y, n->input(3)});
  const std::string act = n->attrs.get_string("activation", "");
  if (act == "Clip") {
    std::vector<Value*> clip = {y, nullptr, nullptr};
    for (const auto& [i, key] : {std::pair<int, const char*>{1, "act_min"}, {2, "act_max"}})
      if (n->attrs.has(key))
        clip[i] = g.add_constant(g.unique_name(n->name + "/" + key),
                                 Tensor::scalar<float>(n->attrs.get_float(key, 0)).cast(dt));
    while (!clip.back()) clip.pop_back();
    part("Clip", clip);
  } else if (!act.empty()) {
    part(act, {y}, fused::strip_prefix(n->attrs, "act_"));
  }
  const auto post = n->attrs.get_strings("post_ops");
  const auto values = n->attrs.get_floats("post_values");
  for (size_t i = 0; i < post.size() && i < values.size(); ++i) {
    if (!post_op_binary(post[i])) {
      part(post[i], {y});
      continue;
    }
    Value* c = g.add_constant(g.unique_name(n->name + "/post" + std::to_string(i)),
                              Tensor::scalar<float>(values[i]).cast(dt));
    part(post[i], {y, c});
  }
  Value* out = n->output(0);
  KILN_RETURN_IF_ERROR(g.remove_node(n, /*force=*/true));
  g.set_node_output(last, 0, out);  // its own output value, unused, goes with the dead values
  g.remove_dead_values();
  return Status::Ok();
}

Status infer_elementwise_chain(InferContext& ctx);
Status cpu_elementwise_chain(KernelContext& ctx);
Status infer_relayout(InferContext& ctx);
Status cpu_relayout(KernelContext& ctx);
Status infer_attention(InferContext& ctx);
Status cpu_attention(KernelContext& ctx);

std::span<const OpDef> fused_ops() {
  static const OpDef kOps[] = {
      {"kiln", "FusedConv", infer_fused_conv, cpu_fused_conv, nullptr},
      {"kiln", "FusedConvMean", infer_fused_conv_mean, cpu_fused_conv_mean, nullptr},
      {"kiln", "FusedConvPool", infer_fused_conv_pool, cpu_fused_conv_pool, nullptr},
      {"kiln", "FusedConvPair", infer_fused_conv_pair, cpu_fused_conv_pair, nullptr},
      {"kiln", "FusedGemm", infer_fused_gemm, cpu_fused_gemm, nullptr},
      {"kiln", "ElementwiseChain", infer_elementwise_chain, cpu_elementwise_chain, nullptr},
      {"kiln", "Relayout", infer_relayout, cpu_relayout, nullptr},
      {"kiln", "Attention", infer_attention, cpu_attention, nullptr},
      {"kiln", "Reformat", infer_reformat, cpu_reformat, nullptr},
  };
  return kOps;
}

}  // namespace kiln
