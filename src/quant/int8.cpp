// The INT8 representation's helpers and the step that marks the layers running in INT8.
#include "quant/int8.h"

#include <algorithm>
#include <cmath>

#include "core/dispatch.h"

namespace kiln::quant {

int8_t quantize_value(float v, float scale) {
  const float q = v / scale;
  if (std::isnan(q)) return 0;
  const float r = std::nearbyint(q);  // default rounding mode: half to even
  return static_cast<int8_t>(r < -128.f ? -128.f : (r > 127.f ? 127.f : r));
}

namespace {

// Conv, kiln.FusedConv, and kiln.FusedConvPool (a stem and its max-pool: the pool follows the
// INT8 convolution's epilogue).
bool is_conv(const Node& n) {
  return (n.domain.empty() && n.op_type == "Conv") ||
         (n.domain == "kiln" && (n.op_type == "FusedConv" || n.op_type == "FusedConvPool"));
}
// kiln.FusedConvPair: two convolutions, W (input 1) and W2 (input 4) both KCRS.
bool is_conv_pair(const Node& n) { return n.domain == "kiln" && n.op_type == "FusedConvPair"; }
// "Gemm", "MatMul" or "" for what a node computes.
std::string gemm_base(const Node& n) {
  if (n.domain.empty() && (n.op_type == "Gemm" || n.op_type == "MatMul")) return n.op_type;
  if (n.domain == "kiln" && n.op_type == "FusedGemm") return n.attrs.get_string("base", "");
  return "";
}

}  // namespace

int64_t weight_channel_axis(const Node& n) {
  if (is_conv(n) || is_conv_pair(n)) return 0;
  const std::string base = gemm_base(n);
  if (base == "Gemm") return n.attrs.get_int("transB", 0) != 0 ? 0 : 1;
  if (base == "MatMul") return 1;  // B is 2-D [K, N] (int8_blocker checks)
  return -1;
}

std::vector<float> weight_scales(const Tensor& w, int64_t axis) {
  const Tensor f = w.dtype() == DataType::kFloat32 ? w : w.cast(DataType::kFloat32);
  const int64_t channels = f.dim(axis);
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < f.rank(); ++d) inner *= f.dim(d);
  std::vector<float> amax(static_cast<size_t>(channels), 0.f);
  const float* p = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i) {
    const auto c = static_cast<size_t>((i / inner) % channels);
    amax[c] = std::max(amax[c], std::fabs(p[i]));
  }
  for (float& a : amax) a = a > 0 && std::isfinite(a) ? a / 127.f : 1.f;
  return amax;
}

Tensor quantize_weights(const Tensor& w, const std::vector<float>& scales, int64_t axis) {
  const Tensor f = w.dtype() == DataType::kFloat32 ? w : w.cast(DataType::kFloat32);
  Tensor q(DataType::kInt8, f.shape());
  int64_t inner = 1;
  for (int64_t d = axis + 1; d < f.rank(); ++d) inner *= f.dim(d);
  const int64_t channels = scales.size() == 1 ? 1 : f.dim(axis);
  const float* p = f.data<float>();
  int8_t* out = q.data<int8_t>();
  for (int64_t i = 0; i < f.numel(); ++i)
    out[i] = quantize_value(p[i], scales[static_cast<size_t>((i / inner) % channels)]);
  return q;
}

namespace {

// Why scales already on weight `w` do not fit output-channel axis `axis` ("" when they do, or
// when there are none: marking gives them).
std::string weight_scales_blocker(const Value* w, int64_t axis) {
  if (w->quant_scales.size() <= 1) return "";
  if (w->quant_axis != axis)
    return fmt::format("weight '{}' has scales along axis {}, but its output channels are axis {}",
                       w->name, w->quant_axis, axis);
  if (static_cast<int64_t>(w->quant_scales.size()) != w->constant->dim(axis))
    return fmt::format("weight '{}' has {} scales for {} channels", w->name, w->quant_scales.size(),
                       w->constant->dim(axis));
  return "";
}

// FusedConvPair's second convolution: X2 (input 3) and W2 (input 4) as X and W.
std::string second_conv_blocker(const Node& n) {
  const Value* x2 = n.input(3);
  const Value* w2 = n.input(4);
  if (!x2 || x2->type.dtype != DataType::kFloat32) return "its second input is not float32";
  if (!x2->has_quant_scale()) return fmt::format("input '{}' has no INT8 scale", x2->name);
  if (!w2 || !w2->is_constant() || w2->type.dtype != DataType::kFloat32)
    return "its second weights are not a float32 constant";
  return weight_scales_blocker(w2, 0);
}

}  // namespace

std::string int8_blocker(const Node& n) {
  const int64_t axis = weight_channel_axis(n);
  if (axis < 0) return "not a convolution or matrix product";
  const Value* x = n.input(0);
  const Value* w = n.input(1);
  if (!x || x->type.dtype != DataType::kFloat32) return "its input is not float32";
  if (!x->has_quant_scale()) return fmt::format("input '{}' has no INT8 scale", x->name);
  if (!w || !w->is_constant() || w->type.dtype != DataType::kFloat32)
    return "its weights are not a float32 constant";
  const Value* y = n.output(0);
  if (!y || y->type.dtype != DataType::kFloat32) return "its output is not float32";
  const std::string base = gemm_base(n);
  if (base == "Gemm" && n.attrs.get_int("transA", 0) != 0) return "Gemm with transA = 1";
  if (base == "MatMul" && (w->constant->rank() != 2 || x->type.rank() < 2))
    return "MatMul whose weights are not 2-D";
  if (std::string why = weight_scales_blocker(w, axis); !why.empty()) return why;
  return is_conv_pair(n) ? second_conv_blocker(n) : "";
}

bool runs_int8(const Node& n) { return n.attrs.get_int("int8", 0) == 1; }

Expected<Int8Summary> mark_int8_layers(Graph& g, const std::map<std::string, std::string>& pins,
                                       bool explicit_scales) {
  Int8Summary out;
  for (Node* n : g.nodes()) {
    if (weight_channel_axis(*n) < 0) continue;
    const std::string* pin = layer_pin(pins, n->name);
    std::string why = int8_blocker(*n);
    // A FusedConvPair is made from INT8 layers after marking (passes/fuse_conv_pair.cpp); marked
    // again, both of its weights are treated alike.
    const std::vector<Value*> weights = is_conv_pair(*n)
                                            ? std::vector<Value*>{n->input(1), n->input(4)}
                                            : std::vector<Value*>{n->input(1)};
    if (why.empty() && explicit_scales &&
        std::any_of(weights.begin(), weights.end(),
                    [](const Value* w) { return w->quant_scales.empty(); }))
      why = "the model does not quantize its weights (no DequantizeLinear)";
    if (why.empty() && pin && *pin != "int8") why = "pinned to " + *pin;
    if (!why.empty()) {
      n->attrs.erase("int8");
      out.float_layers[n->name] = why;
      continue;
    }
    // An INT8 layer is always a kiln fused layer, so its kernels live in one place.
    if (n->domain.empty()) {
      if (n->op_type != "Conv") n->attrs.set("base", Attribute::String(n->op_type));
      n->op_type = n->op_type == "Conv" ? "FusedConv" : "FusedGemm";
      n->domain = "kiln";
    }
    const int64_t axis = weight_channel_axis(*n);
    for (Value* w : weights)
      if (w->quant_scales.empty()) {
        w->quant_scales = weight_scales(*w->constant, axis);
        w->quant_axis = axis;
      }
    n->attrs.set("int8", Attribute::Int(1));
    out.int8_layers.push_back(n->name);
  }
  return out;
}

void apply_activation_scales(Graph& g, const std::map<std::string, float>& scales) {
  for (const Value* cv : calibration_tensors(g)) {
    auto it = scales.find(cv->name);
    if (it == scales.end()) continue;
    Value* v = g.find_value(cv->name);
    v->quant_scales = {it->second};
    v->quant_axis = -1;
  }
}

std::vector<const Value*> calibration_tensors(const Graph& g) {
  std::vector<const Value*> out;
  for (const Value* v : g.values())
    if (!v->is_constant() && v->type.dtype == DataType::kFloat32 && !g.is_graph_output(v) &&
        (v->producer || g.is_graph_input(v)))
      out.push_back(v);
  return out;
}

namespace {

bool is_affine_op(const std::string& op) {
  return op == "Add" || op == "Sub" || op == "Mul" || op == "Div";
}

// The one non-constant input of n, or nullptr.
const Value* sole_variable_input(const Node& n) {
  const Value* x = nullptr;
  for (const Value* v : n.inputs()) {
    if (!v || v->is_constant()) continue;
    if (x) return nullptr;
    x = v;
  }
  return x;
}

// Is n's output an affine map, by constants, of its one non-constant input x: Add, Sub, Mul,
// x / c, or a kiln.ElementwiseChain of such steps, each reading the running value once?
bool affine_of(const Node& n, const Value* x) {
  if (n.domain.empty() && is_affine_op(n.op_type))
    return n.num_inputs() == 2 && (n.op_type != "Div" || n.input(0) == x);  // c / x is not
  if (n.domain != "kiln" || n.op_type != "ElementwiseChain") return false;
  if (n.attrs.get_int("concat_parts", 0) != 0) return false;  // reads several tensors
  const std::vector<std::string> ops = n.attrs.get_strings("ops");
  const std::vector<int64_t> arity = n.attrs.get_ints("arity");
  const std::vector<int64_t> operands = n.attrs.get_ints("operands");  // -1: the previous step's
  int64_t xi = -1;
  for (size_t i = 0; i < n.num_inputs(); ++i)
    if (n.input(i) == x) xi = static_cast<int64_t>(i);
  auto is_const = [&](int64_t i) {
    return i >= 0 && i != xi && n.input(static_cast<size_t>(i)) &&
           n.input(static_cast<size_t>(i))->is_constant();
  };
  if (arity.size() != ops.size() || operands.size() != 2 * ops.size()) return false;
  for (size_t s = 0; s < ops.size(); ++s) {
    const int64_t running = s == 0 ? xi : -1, a = operands[2 * s], b = operands[2 * s + 1];
    if (arity[s] != 2 || !is_affine_op(ops[s])) return false;
    if (!(a == running && is_const(b)) && !(b == running && is_const(a) && ops[s] != "Div"))
      return false;
  }
  return true;
}

}  // namespace

std::set<std::string> input_like_values(const Graph& g) {
  std::set<std::string> out;
  for (const Value* v : g.inputs()) out.insert(v->name);
  for (const Node* n : g.nodes()) {  // topological order
    if (n->num_outputs() != 1 || !n->output(0)) continue;
    const std::string& op = n->op_type;
    const bool moves =
        n->domain.empty() && (op == "Reshape" || op == "Flatten" || op == "Squeeze" ||
                              op == "Unsqueeze" || op == "Transpose" || op == "Identity");
    const Value* x = moves ? n->input(0) : sole_variable_input(*n);
    if (x && out.count(x->name) && (moves || affine_of(*n, x))) out.insert(n->output(0)->name);
  }
  return out;
}

}  // namespace kiln::quant
