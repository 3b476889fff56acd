#include "backends/cpu/cpu_executor.h"

#include <chrono>
#include <map>
#include <unordered_map>

#include "ops/op.h"

namespace kiln {

Status check_input(const Value& decl, const Tensor& t, std::map<std::string, int64_t>& dims_seen) {
  if (decl.type.dtype != DataType::kUndefined && t.dtype() != decl.type.dtype)
    return KILN_ERROR("input '{}': expected {} but got {}", decl.name, dtype_name(decl.type.dtype),
                      dtype_name(t.dtype()));
  if (!decl.type.dims) return Status::Ok();
  const auto& dims = *decl.type.dims;
  if (static_cast<int64_t>(dims.size()) != t.rank())
    return KILN_ERROR("input '{}': expected shape {} but got {}", decl.name, decl.type.str(),
                      t.desc());
  for (size_t i = 0; i < dims.size(); ++i) {
    const Dim& d = dims[i];
    const int64_t got = t.shape()[i];
    if (d.is_static() && d.value != got)
      return KILN_ERROR("input '{}': dimension {} must be {} (shape {}) but is {}", decl.name, i,
                        d.value, decl.type.str(), got);
    if (!d.is_static() && !d.symbol.empty()) {
      auto [it, fresh] = dims_seen.emplace(d.symbol, got);
      if (!fresh && it->second != got)
        return KILN_ERROR("input '{}': dimension '{}' is {} here but {} in another input",
                          decl.name, d.symbol, got, it->second);
    }
  }
  return Status::Ok();
}

// Runs the subgraphs of a node (ops/op.h) with the executors made for them at create().
class CpuExecutor::Subgraphs final : public SubgraphRunner {
 public:
  explicit Subgraphs(const CpuExecutor& ex) : ex_(ex) {}
  Expected<std::vector<Tensor>> run(const Graph& g, const std::vector<Tensor>& inputs) override {
    auto it = ex_.subgraphs_.find(&g);
    if (it == ex_.subgraphs_.end())
      return KILN_ERROR("subgraph '{}' has no executor (the graph changed after create())", g.name);
    return it->second->run_impl(inputs, nullptr, nullptr, nullptr, /*nested=*/true);
  }

 private:
  const CpuExecutor& ex_;
};

Expected<std::unique_ptr<CpuExecutor>> CpuExecutor::create(const Graph& g, bool float64) {
  std::unique_ptr<CpuExecutor> ex(new CpuExecutor(g, float64));
  std::unordered_map<const Value*, int> slot;
  auto slot_of = [&](const Value* v) {
    auto [it, fresh] = slot.emplace(v, ex->num_slots_);
    if (fresh) ++ex->num_slots_;
    return it->second;
  };
  for (const Value* v : g.inputs()) ex->input_slots_.push_back(slot_of(v));
  for (const Value* v : g.values()) {
    if (!v->is_constant()) continue;
    // In float64 mode the constants are widened once here, not on every run.
    auto c = float64 && v->constant->dtype() == DataType::kFloat32
                 ? std::make_shared<const Tensor>(v->constant->cast(DataType::kFloat64))
                 : v->constant;
    ex->constants_.push_back({slot_of(v), std::move(c)});
  }
  std::unordered_map<int, size_t> last_use;
  for (const Node* n : g.nodes()) {
    const OpDef* def = find_op(n->domain, n->op_type);
    if (!def || !def->cpu)
      return KILN_ERROR("{}: the cpu backend has no kernel for op '{}'", n->label(), n->op_type);
    for (const Graph* sub : n->attrs.subgraphs()) {
      auto sx = create(*sub, float64);
      if (!sx) return sx.status().with_context(n->label());
      ex->subgraphs_[sub] = std::move(*sx);
    }
    Step s{n, def, {}, {}, {}};
    for (const Value* v : n->inputs()) {
      s.inputs.push_back(v ? slot_of(v) : -1);
      if (v) last_use[slot_of(v)] = ex->steps_.size();
    }
    for (const Value* v : n->outputs()) s.outputs.push_back(v ? slot_of(v) : -1);
    ex->steps_.push_back(std::move(s));
  }
  for (const Value* v : g.outputs()) ex->output_slots_.push_back(slot_of(v));
  for (const auto& [v, s] : slot) ex->slot_by_name_[v->name] = s;
  // Free intermediates after their last use; never graph inputs, constants or outputs.
  std::vector<bool> keep(static_cast<size_t>(ex->num_slots_), false);
  for (int s : ex->input_slots_) keep[s] = true;
  for (int s : ex->output_slots_) keep[s] = true;
  for (const auto& c : ex->constants_) keep[c.first] = true;
  for (auto [s, step] : last_use)
    if (!keep[s]) ex->steps_[step].release.push_back(s);
  return ex;
}

Expected<std::vector<std::pair<int, std::string>>> CpuExecutor::debug_slots(
    const std::vector<std::string>& names) const {
  std::vector<std::pair<int, std::string>> out;
  for (const std::string& n : names) {
    auto it = slot_by_name_.find(n);
    if (it == slot_by_name_.end()) return KILN_ERROR("debug tensor '{}': the graph has no value of that name", n);
    out.push_back({it->second, n});
  }
  return out;
}

Expected<std::vector<Tensor>> CpuExecutor::run(const std::vector<Tensor>& inputs,
                                               std::vector<LayerTiming>* timings,
                                               Debug* debug, const Observer* observe) const {
  return run_impl(inputs, timings, debug, observe, /*nested=*/false);
}

Expected<std::vector<Tensor>> CpuExecutor::run_impl(const std::vector<Tensor>& inputs,
                                                    std::vector<LayerTiming>* timings,
                                                    Debug* debug, const Observer* observe,
                                                    bool nested) const {
  if (inputs.size() != input_slots_.size())
    return KILN_ERROR("expected {} inputs but got {}", input_slots_.size(), inputs.size());
  std::vector<Tensor> slots(static_cast<size_t>(num_slots_));
  std::vector<bool> set(static_cast<size_t>(num_slots_), false);
  std::map<std::string, int64_t> dims_seen;
  auto widen = [&](const Tensor& t) {
    return float64_ && t.dtype() == DataType::kFloat32 ? t.cast(DataType::kFloat64) : t;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!nested) KILN_RETURN_IF_ERROR(check_input(*graph_.inputs()[i], inputs[i], dims_seen));
    slots[input_slots_[i]] = nested ? inputs[i] : widen(inputs[i]);
    set[input_slots_[i]] = true;
  }
  for (const auto& [s, t] : constants_) {
    slots[s] = *t;
    set[s] = true;
  }
  // Debug values are kept as they are produced, before their slots are released.
  std::multimap<int, const std::string*> keep;
  if (debug) {
    debug->values.clear();
    for (const auto& [s, name] : debug->slots) {
      if (set[s]) debug->values[name] = slots[s];
      else keep.emplace(s, &name);
    }
  }
  for (const Step& st : steps_) {
    std::vector<const Tensor*> ins;
    for (int s : st.inputs) {
      if (s >= 0 && !set[s])
        return KILN_ERROR("{}: an input was not computed (graph order broken)", st.node->label());
      ins.push_back(s >= 0 ? &slots[s] : nullptr);
    }
    std::vector<Tensor> outs(st.outputs.size());
    Subgraphs subs(*this);
    KernelContext ctx(*st.node, std::move(ins), outs, subgraphs_.empty() ? nullptr : &subs);
    const auto t0 = std::chrono::steady_clock::now();
    Status status = static_cast<const OpDef*>(st.def)->cpu(ctx);
    if (timings) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      timings->push_back({st.node->name, st.node->op_type, ms});
    }
    if (!status.ok()) {
      if (status.message().find(st.node->label()) != std::string::npos) return status;
      return status.with_context(st.node->label());
    }
    for (size_t k = 0; k < st.outputs.size(); ++k) {
      if (st.outputs[k] < 0) continue;
      if (outs[k].empty_storage())
        return KILN_ERROR("{}: kernel produced no value for output {}", st.node->label(), k);
      // Float64 mode: values a kernel makes in float32 from other types (Cast from integers,
      // ConstantOfShape) are widened, so later kernels see one float type; a Cast of a float64
      // value to float32 keeps it as it is (the reference does not round midway).
      if (float64_ && outs[k].dtype() == DataType::kFloat32) {
        const Tensor* in0 = ctx.input(0);
        outs[k] = st.node->op_type == "Cast" && in0 && in0->dtype() == DataType::kFloat64
                      ? *in0
                      : outs[k].cast(DataType::kFloat64);
      }
      slots[st.outputs[k]] = std::move(outs[k]);
      set[st.outputs[k]] = true;
      for (auto [it, end] = keep.equal_range(st.outputs[k]); it != end; ++it)
        debug->values[*it->second] = slots[st.outputs[k]];
      if (observe) (*observe)(*st.node->output(k), slots[st.outputs[k]]);
    }
    for (int s : st.release) { slots[s] = Tensor(); set[s] = false; }
  }
  std::vector<Tensor> result;
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    const int s = output_slots_[i];
    if (!set[s]) return KILN_ERROR("graph output '{}' was not computed", graph_.outputs()[i]->name);
    const Value* decl = graph_.outputs()[i];
    Tensor t = slots[s];
    if (!nested && float64_ && t.dtype() == DataType::kFloat64 &&
        decl->type.dtype == DataType::kFloat32)
      t = t.cast(DataType::kFloat32);
    result.push_back(std::move(t));
  }
  return result;
}

}  // namespace kiln
