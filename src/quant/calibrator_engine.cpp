// Calibration on the GPU: the FP32 network as a strict-FP32 cuda engine of the same graph,
// whose execution context keeps the tensors calibration needs as debug tensors
// (ExecutionContext::set_debug_tensors, as `kiln compare --per-layer` uses it).
#include <set>

#include "kiln/engine.h"
#include "quant/calibrator.h"

namespace kiln::quant {
namespace {

class EngineActivationSource final : public ActivationSource {
 public:
  EngineActivationSource(const Graph& g, std::vector<std::string> wanted)
      : g_(g), wanted_(std::move(wanted)) {}

  Status run(const Feed& feed, const Visitor& visit) override {
    ShapeMap shapes;
    for (const Value* v : g_.inputs()) {
      auto it = feed.find(v->name);
      if (it == feed.end())
        return KILN_ERROR("calibration data has no tensor for input '{}'", v->name);
      shapes[v->name] = it->second.shape();
      visit(v->name, it->second);
    }
    if (!ctx_ || shapes != shapes_) KILN_RETURN_IF_ERROR(build(shapes));
    KILN_RETURN_IF_ERROR(ctx_->execute(feed).status());
    for (const auto& [name, t] : ctx_->debug_tensors()) visit(name, t);
    return Status::Ok();
  }

 private:
  // One engine per input shapes (calibration batches normally share one): the graph as it is
  // (already optimized for the build), strict FP32 so the ranges are the FP32 network's, untuned
  // (any correct tactic will do for statistics).
  Status build(const ShapeMap& shapes) {
    ctx_.reset();
    BuildConfig c;
    c.backend = "cuda";
    c.tf32 = false;
    c.tune = false;
    c.opt_level = 0;
    c.shapes = shapes;
    KILN_ASSIGN_OR_RETURN(engine_, Engine::build_from_graph(g_.clone(), c, "calibration"));
    KILN_ASSIGN_OR_RETURN(ctx_, engine_->create_context());
    std::vector<std::string> names;
    for (const std::string& n : wanted_) {
      const Value* v = engine_->graph().find_value(n);
      if (v && !v->is_constant() && v->producer) names.push_back(n);
    }
    KILN_RETURN_IF_ERROR(ctx_->set_debug_tensors(names));
    shapes_ = shapes;
    return Status::Ok();
  }

  const Graph& g_;
  std::vector<std::string> wanted_;
  ShapeMap shapes_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ExecutionContext> ctx_;
};

}  // namespace

Expected<std::unique_ptr<ActivationSource>> engine_activation_source(
    const Graph& g, const std::vector<std::string>& tensors) {
  return std::unique_ptr<ActivationSource>(new EngineActivationSource(g, tensors));
}

}  // namespace kiln::quant
