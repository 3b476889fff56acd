// Pairs of layout ops that collapse into one (which remove_noops drops when it is the identity,
// e.g. the NHWC <-> NCHW transpose pairs of Keras-style exports):
//   Transpose(Transpose(x, p1), p2)  =>  Transpose(x, p1[p2[i]])
//   Reshape(Reshape|Flatten|Squeeze|Unsqueeze(x), s)  =>  Reshape(x, s)   (s constant, no 0s)
#include "passes/passes.h"

namespace kiln::passes {
namespace {

std::vector<int64_t> perm_of(const Node& n, int64_t rank) {
  std::vector<int64_t> p = n.attrs.get_ints("perm");
  if (p.empty() && rank >= 0)
    for (int64_t i = rank - 1; i >= 0; --i) p.push_back(i);
  return p;
}

bool keeps_element_order(const Node* n) {
  return is_op(n, "Reshape") || is_op(n, "Flatten") || is_op(n, "Squeeze") || is_op(n, "Unsqueeze");
}

struct CollapsePair {
  struct Match {
    Node* first;
    Node* second;
    std::vector<int64_t> perm;
  };

  static std::optional<Match> match(PassContext& ctx, Node& n) {
    Value* mid = n.input(0);
    if (!mid || !mid->producer) return std::nullopt;
    Node* first = mid->producer;
    if (is_op(&n, "Transpose") && is_op(first, "Transpose")) {
      const int64_t rank = mid->type.rank();
      std::vector<int64_t> p1 = perm_of(*first, rank), p2 = perm_of(n, rank);
      if (p1.empty() || p1.size() != p2.size()) {
        ctx.note(fmt::format("{}: permutation rank unknown", n.label()));
        return std::nullopt;
      }
      std::vector<int64_t> p(p2.size());
      for (size_t j = 0; j < p2.size(); ++j) {
        if (p2[j] < 0 || p2[j] >= static_cast<int64_t>(p1.size())) return std::nullopt;
        p[j] = p1[static_cast<size_t>(p2[j])];
      }
      return Match{first, &n, p};
    }
    if (is_op(&n, "Reshape") && keeps_element_order(first)) {
      const Value* shape = n.input(1);
      if (!shape || !shape->is_constant()) {
        ctx.note(fmt::format("{}: shape is not a constant", n.label()));
        return std::nullopt;
      }
      if (n.attrs.get_int("allowzero", 0) == 0)
        for (int64_t d : shape->constant->to_int64_vector())
          if (d == 0) {
            ctx.note(fmt::format("{}: shape copies a dimension (0) of its input", n.label()));
            return std::nullopt;
          }
      return Match{first, &n, {}};
    }
    return std::nullopt;
  }

  static Status rewrite(PassContext& ctx, const Match& m) {
    Graph& g = ctx.g;
    const bool first_dies = single_use(g, m.first->output(0));
    g.set_input(m.second, 0, m.first->input(0));
    if (is_op(m.second, "Transpose")) m.second->attrs.set("perm", Attribute::Ints(m.perm));
    m.second->origin = ctx.pass;
    if (first_dies) {
      merge_onnx_nodes(*m.second, *m.first);
      KILN_RETURN_IF_ERROR(g.remove_node(m.first));
    }
    return Status::Ok();
  }
};

}  // namespace

Expected<bool> cancel_transposes(PassContext& ctx) { return apply_pattern<CollapsePair>(ctx); }

}  // namespace kiln::passes
