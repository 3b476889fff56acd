#include "engine/profile.h"

#include <set>

namespace kiln {
namespace {

const Value* find_input(const Graph& g, const std::string& name) {
  for (const Value* v : g.inputs())
    if (v->name == name) return v;
  return nullptr;
}

Status check_against_decl(const Value& v, const std::vector<int64_t>& s, const char* flag) {
  if (!v.type.dims) return Status::Ok();
  const auto& dims = *v.type.dims;
  if (dims.size() != s.size())
    return KILN_ERROR("{} for input '{}': {} has rank {}, but the input is {}", flag, v.name,
                      shape_str(s), s.size(), v.type.str());
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i].is_static() && dims[i].value != s[i])
      return KILN_ERROR("{} for input '{}': dimension {} must be {} (input is {}), got {}", flag,
                        v.name, i, dims[i].value, v.type.str(), s[i]);
  for (int64_t d : s)
    if (d < 0) return KILN_ERROR("{} for input '{}': negative dimension", flag, v.name);
  return Status::Ok();
}

}  // namespace

Expected<Profile> Profile::from_config(const Graph& g, const BuildConfig& c) {
  Profile p;
  auto known = [&](const ShapeMap& m, const char* flag) -> Status {
    for (const auto& [name, s] : m) {
      const Value* v = find_input(g, name);
      if (!v) return KILN_ERROR("{}: the model has no input named '{}'", flag, name);
      KILN_RETURN_IF_ERROR(check_against_decl(*v, s, flag));
    }
    return Status::Ok();
  };
  KILN_RETURN_IF_ERROR(known(c.shapes, "--shapes"));
  KILN_RETURN_IF_ERROR(known(c.min_shapes, "--min-shapes"));
  KILN_RETURN_IF_ERROR(known(c.opt_shapes, "--opt-shapes"));
  KILN_RETURN_IF_ERROR(known(c.max_shapes, "--max-shapes"));
  for (const auto& [name, s] : c.shapes) {
    if (c.min_shapes.count(name) || c.opt_shapes.count(name) || c.max_shapes.count(name))
      return KILN_ERROR("input '{}' is given both --shapes and --min/opt/max-shapes", name);
    p.ranges_[name] = {s, s, s};
  }
  std::set<std::string> names;
  for (const auto* m : {&c.min_shapes, &c.opt_shapes, &c.max_shapes})
    for (const auto& kv : *m) names.insert(kv.first);
  for (const auto& name : names) {
    if (!c.min_shapes.count(name) || !c.max_shapes.count(name))
      return KILN_ERROR("input '{}': give both --min-shapes and --max-shapes (and optionally "
                        "--opt-shapes)", name);
    Range r{c.min_shapes.at(name), c.opt_shapes.count(name) ? c.opt_shapes.at(name)
                                                            : c.max_shapes.at(name),
            c.max_shapes.at(name)};
    if (r.min.size() != r.max.size() || r.opt.size() != r.max.size())
      return KILN_ERROR("input '{}': min/opt/max shapes have different ranks", name);
    for (size_t i = 0; i < r.min.size(); ++i)
      if (!(r.min[i] <= r.opt[i] && r.opt[i] <= r.max[i]))
        return KILN_ERROR("input '{}': dimension {} needs min <= opt <= max, got {} / {} / {}",
                          name, i, r.min[i], r.opt[i], r.max[i]);
    p.ranges_[name] = r;
  }
  return p;
}

Status Profile::apply_static_shapes(Graph& g) const {
  // The symbols of dims the profile fixes (min == max), from every input that has them.
  std::map<std::string, int64_t> fixed_symbols;
  for (const auto& [name, r] : ranges_) {
    const Value* v = find_input(g, name);
    if (!v || !v->type.dims || v->type.dims->size() != r.min.size()) continue;
    for (size_t i = 0; i < r.min.size(); ++i) {
      const Dim& d = (*v->type.dims)[i];
      if (r.min[i] != r.max[i] || d.is_static() || d.symbol.empty()) continue;
      auto [it, fresh] = fixed_symbols.emplace(d.symbol, r.min[i]);
      if (!fresh && it->second != r.min[i])
        return KILN_ERROR("--shapes: dimension '{}' is {} in one input and {} in another", d.symbol,
                          it->second, r.min[i]);
    }
  }
  for (Value* v : g.inputs()) {
    auto it = ranges_.find(v->name);
    const Range* r = it != ranges_.end() ? &it->second : nullptr;
    if (!v->type.dims) {
      if (r && r->min == r->max) v->type.dims = std::vector<Dim>(r->min.begin(), r->min.end());
      continue;
    }
    for (size_t i = 0; i < v->type.dims->size(); ++i) {
      Dim& d = (*v->type.dims)[i];
      if (r && i < r->min.size() && r->min[i] == r->max[i]) d = Dim(r->min[i]);
      else if (!d.is_static() && fixed_symbols.count(d.symbol)) d = Dim(fixed_symbols[d.symbol]);
    }
  }
  return Status::Ok();
}

Status Profile::check(const std::string& input, const std::vector<int64_t>& shape) const {
  auto it = ranges_.find(input);
  if (it == ranges_.end()) return Status::Ok();
  const Range& r = it->second;
  if (shape.size() != r.min.size())
    return KILN_ERROR("input '{}': shape {} has rank {}, the engine's profile expects rank {}", input,
                      shape_str(shape), shape.size(), r.min.size());
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] < r.min[i] || shape[i] > r.max[i])
      return KILN_ERROR("input '{}': shape {} is outside the engine's profile (min {}, max {})",
                        input, shape_str(shape), shape_str(r.min), shape_str(r.max));
  return Status::Ok();
}

nlohmann::json Profile::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, r] : ranges_) j[name] = {{"min", r.min}, {"opt", r.opt}, {"max", r.max}};
  return j;
}

Expected<Profile> Profile::from_json(const Graph& g, const std::string& options_json) {
  Profile p;
  nlohmann::json opts = nlohmann::json::parse(options_json, nullptr, false);
  if (opts.is_discarded() || !opts.is_object()) return p;
  if (!opts.contains("profile") || !opts["profile"].is_object()) return p;
  try {
    for (const auto& [name, r] : opts["profile"].items()) {
      if (!find_input(g, name)) return KILN_ERROR("engine profile names unknown input '{}'", name);
      p.ranges_[name] = {r.at("min").get<std::vector<int64_t>>(),
                         r.at("opt").get<std::vector<int64_t>>(),
                         r.at("max").get<std::vector<int64_t>>()};
    }
  } catch (const std::exception& e) {
    return KILN_ERROR("engine profile is malformed: {}", e.what());
  }
  return p;
}

}  // namespace kiln
