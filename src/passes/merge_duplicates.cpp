// Nodes computing the same op on the same inputs are computed once (common subexpressions):
//   y1 = Op(a, b); y2 = Op(a, b)  =>  y2's readers read y1
// Inputs count as the same when they are the same value, or small constants of equal contents.
// TorchScript exports repeat the attention mask's Where(mask, 0, -inf) in every layer, each with
// its own copy of the two constants; merged, the mask is made once per inference.
#include <functional>
#include <string_view>
#include <unordered_map>

#include "passes/passes.h"

namespace kiln::passes {
namespace {

constexpr size_t kMaxComparedBytes = 4096;  // larger constants count as the same only as one value

std::string input_key(const Value* v) {
  if (!v) return "_";
  if (v->is_constant()) {
    const Tensor& t = *v->constant;
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    if (bytes <= kMaxComparedBytes)
      return fmt::format("c{}:{}:{}", dtype_name(t.dtype()), shape_str(t.shape()),
                         std::hash<std::string_view>{}(
                             std::string_view(static_cast<const char*>(t.raw()), bytes)));
  }
  return fmt::format("v{}", static_cast<const void*>(v));
}

bool deterministic(const Node& n) {
  return n.op_type.find("Random") == std::string::npos && n.op_type != "Multinomial" &&
         n.op_type != "Bernoulli";
}

std::string node_key(const Node& n) {
  std::string k = n.domain + "." + n.op_type + "(";
  for (const Value* v : n.inputs()) k += input_key(v) + ",";
  k += ")[";
  for (const auto& [name, a] : n.attrs.all()) k += name + "=" + a.str() + ";";
  return k + "]" + std::to_string(n.num_outputs());
}

}  // namespace

Expected<bool> merge_duplicates(PassContext& ctx) {
  Graph& g = ctx.g;
  std::unordered_map<std::string, Node*> seen;
  std::vector<std::pair<Node*, Node*>> dup;  // (duplicate, original)
  for (Node* n : g.nodes()) {
    // Subgraphs are not compared: two Ifs with the same inputs may branch differently.
    if (!deterministic(*n) || n->num_outputs() == 0 || !n->attrs.subgraphs().empty()) continue;
    auto [it, fresh] = seen.emplace(node_key(*n), n);
    if (!fresh) dup.emplace_back(n, it->second);
  }
  int merged = 0;
  for (auto [d, orig] : dup) {
    bool output = false;
    for (const Value* o : d->outputs()) output |= o && g.is_graph_output(o);
    if (output) {
      ctx.note(fmt::format("{}: duplicates {} but is a graph output", d->label(), orig->label()));
      continue;
    }
    for (size_t i = 0; i < d->num_outputs(); ++i)
      if (d->output(i) && orig->output(i)) g.replace_all_uses(d->output(i), orig->output(i));
    merge_onnx_nodes(*orig, *d);
    KILN_RETURN_IF_ERROR(g.remove_node(d, /*force=*/true));
    ++merged;
  }
  ctx.rewrites += merged;
  return merged > 0;
}

}  // namespace kiln::passes
