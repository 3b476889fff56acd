#include "ir/verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ops/op.h"

namespace kiln {
namespace {

constexpr size_t kMaxReported = 10;

class Checker {
 public:
  explicit Checker(const Graph& g) : g_(g) {
    for (Value* v : g.values()) values_.insert(v);
    for (size_t i = 0; i < g.nodes().size(); ++i) position_[g.nodes()[i]] = i;
  }

  Status run() {
    check_names();
    check_ops();
    check_nodes();
    check_values();
    check_graph_io();
    check_subgraphs();
    if (problems_.empty()) return Status::Ok();
    std::string msg = fmt::format("graph '{}' is malformed: ", g_.name);
    for (size_t i = 0; i < problems_.size() && i < kMaxReported; ++i)
      msg += (i ? "; " : "") + problems_[i];
    if (problems_.size() > kMaxReported)
      msg += fmt::format("; and {} more problems", problems_.size() - kMaxReported);
    return Status::Error(msg);
  }

 private:
  template <typename... Args>
  void report(fmt::format_string<Args...> f, Args&&... args) {
    problems_.push_back(fmt::format(f, std::forward<Args>(args)...));
  }

  bool in_graph(const Node* n) const { return position_.count(n) != 0; }

  void check_names() {
    std::map<std::string, int> value_names;
    for (Value* v : g_.values()) ++value_names[v->name];
    for (const auto& [name, count] : value_names)
      if (count > 1) report("value name '{}' is used by {} values", name, count);
    std::map<std::string, int> node_names;
    for (Node* n : g_.nodes()) ++node_names[n->name];
    for (const auto& [name, count] : node_names)
      if (count > 1) report("node name '{}' is used by {} nodes", name, count);
  }

  void check_ops() {
    std::vector<std::string> unknown;
    for (Node* n : g_.nodes()) {
      if (find_op(n->domain, n->op_type)) continue;
      const std::string op = n->domain.empty() ? n->op_type : n->domain + "." + n->op_type;
      unknown.push_back(fmt::format("{} ({})", op, n->label()));
    }
    if (!unknown.empty()) report("unknown ops: {}", fmt::join(unknown, ", "));
  }

  void check_nodes() {
    std::unordered_map<const Value*, const Node*> produced_by;
    for (size_t pos = 0; pos < g_.nodes().size(); ++pos) {
      const Node* n = g_.nodes()[pos];
      if (n->index != static_cast<int>(pos))
        report("{} sits at position {} (stale index; call renumber())", n->label(), pos);
      for (size_t i = 0; i < n->num_inputs(); ++i) check_input(n, i, pos);
      for (size_t i = 0; i < n->num_outputs(); ++i) {
        const Value* o = n->output(i);
        if (!o) continue;
        if (!values_.count(o)) {
          report("{}: output {} is not a value of this graph", n->label(), i);
          continue;
        }
        if (auto [it, fresh] = produced_by.emplace(o, n); !fresh)
          report("value '{}' is an output of both {} and {}", o->name, it->second->label(),
                 n->label());
        if (o->producer != n || o->producer_index != static_cast<int>(i))
          report("{}: output {} '{}' does not name the node as its producer", n->label(), i,
                 o->name);
      }
    }
  }

  void check_input(const Node* n, size_t i, size_t pos) {
    const Value* v = n->input(i);
    if (!v) return;  // omitted optional input
    if (!values_.count(v)) {
      report("{}: input {} is not a value of this graph", n->label(), i);
      return;
    }
    const auto& uses = v->uses();
    const auto count = std::count(uses.begin(), uses.end(),
                                  std::make_pair(const_cast<Node*>(n), static_cast<int>(i)));
    if (count != 1)
      report("{}: input {} '{}' appears {} times in the value's use list (expected once)",
             n->label(), i, v->name, count);
    if (v->producer) {
      if (!in_graph(v->producer)) return;  // reported by check_values
      if (position_.at(v->producer) >= pos)
        report("{}: input {} '{}' is used before it is defined (by {})", n->label(), i, v->name,
               v->producer->label());
    } else if (!v->is_constant() && !g_.is_graph_input(v)) {
      report("{}: input {} '{}' has no producer and is neither a graph input nor a constant",
             n->label(), i, v->name);
    }
  }

  void check_values() {
    for (const Value* v : g_.values()) {
      if (v->producer) {
        if (!in_graph(v->producer)) {
          report("value '{}' names a producer that is not in the graph", v->name);
        } else if (v->producer->output(static_cast<size_t>(std::max(v->producer_index, 0))) != v ||
                   v->producer_index < 0) {
          report("value '{}' claims to be output {} of {}, which does not list it", v->name,
                 v->producer_index, v->producer->label());
        }
      }
      for (const auto& [user, idx] : v->uses()) {
        if (!in_graph(user)) {
          report("value '{}' lists a use by a node that is not in the graph", v->name);
        } else if (idx < 0 || user->input(static_cast<size_t>(idx)) != v) {
          report("value '{}' lists a use as input {} of {}, which reads something else", v->name,
                 idx, user->label());
        }
      }
    }
  }

  void check_graph_io() {
    for (const Value* v : g_.inputs()) {
      if (!v || !values_.count(v)) {
        report("a graph input is not a value of this graph");
        continue;
      }
      if (v->producer)
        report("graph input '{}' is produced by {}", v->name,
               in_graph(v->producer) ? v->producer->label() : "a removed node");
    }
    for (size_t i = 0; i < g_.outputs().size(); ++i) {
      const Value* v = g_.outputs()[i];
      if (!v || !values_.count(v)) {
        report("graph output {} is not a value of this graph", i);
        continue;
      }
      const bool produced = v->producer && in_graph(v->producer);
      if (!produced && !v->is_constant() && !g_.is_graph_input(v))
        report(
            "graph output '{}' is dangling: no node produces it and it is neither an input "
            "nor a constant",
            v->name);
    }
  }

  // A subgraph is checked as a graph of its own (it reads no outer value: captures are inputs).
  void check_subgraphs() {
    for (const Node* n : g_.nodes())
      for (const auto& [name, a] : n->attrs.all()) {
        if (a.kind != Attribute::Kind::kGraph) continue;
        if (!a.g) {
          report("{}: graph attribute '{}' holds no graph", n->label(), name);
          continue;
        }
        Status st = Checker(*a.g).run();
        if (!st.ok()) report("{}: attribute '{}': {}", n->label(), name, st.message());
      }
  }

  const Graph& g_;
  std::unordered_set<const Value*> values_;
  std::unordered_map<const Node*, size_t> position_;
  std::vector<std::string> problems_;
};

}  // namespace

Status verify_graph(const Graph& g) { return Checker(g).run(); }

}  // namespace kiln
