#include "plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>
#include <limits>

#include "rtc.h"

namespace kiln::gpu {
namespace {

std::string format_str(const TensorFormat& f) {
  return f.dtype == DataType::kUndefined ? "host" : f.str();
}

Expected<TensorFormat> parse_format(const nlohmann::json& j) {
  if (!j.is_string()) return KILN_ERROR("a tensor format is not a string");
  const std::string s = j.get<std::string>();
  if (s == "host") return TensorFormat{};
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return KILN_ERROR("bad tensor format '{}'", s);
  auto dt = dtype_from_name(s.substr(0, slash));
  const std::string layout = s.substr(slash + 1);
  if (!dt || (layout != "linear" && layout != "nhwc"))
    return KILN_ERROR("bad tensor format '{}'", s);
  return TensorFormat{*dt, layout == "nhwc" ? Layout::kNHWC : Layout::kLinear};
}

Expected<std::vector<TensorFormat>> parse_formats(const nlohmann::json& j, size_t count,
                                                  const char* what) {
  if (!j.is_array() || j.size() != count)
    return KILN_ERROR("'{}' must list {} formats", what, count);
  std::vector<TensorFormat> out;
  for (const auto& e : j) {
    KILN_ASSIGN_OR_RETURN(TensorFormat f, parse_format(e));
    out.push_back(f);
  }
  return out;
}

}  // namespace

std::unordered_map<const Value*, size_t> written_through_outputs(const Plan& p, const Graph& g) {
  std::unordered_map<const Value*, size_t> out;
  auto relabels = [&](const Node* n) -> const LayerChoice* {
    if (!n || n->index < 0 || static_cast<size_t>(n->index) >= p.layers.size()) return nullptr;
    const LayerChoice& c = p.layers[n->index];
    const bool yes = !c.is_host() && c.tactic->alias_input == 0 && !c.in.empty() &&
                     !c.out.empty() && c.in[0] == c.out[0] && n->input(0);
    return yes ? &c : nullptr;
  };
  for (size_t j = 0; j < g.outputs().size(); ++j) {
    const Value* v = g.outputs()[j];
    if (std::find(g.outputs().begin(), g.outputs().end(), v) - g.outputs().begin() !=
        static_cast<std::ptrdiff_t>(j))
      continue;  // the same value as an earlier output
    while (relabels(v->producer)) {
      const Value* src = v->producer->input(0);
      if (src->is_constant() || g.is_graph_input(src) || g.is_graph_output(src) || out.count(src))
        break;
      const Node* q = src->producer;
      if (!q || q->index < 0 || static_cast<size_t>(q->index) >= p.layers.size() ||
          p.layers[q->index].is_host())
        break;
      if (!relabels(q)) {
        out[src] = j;
        break;
      }
      v = src;
    }
  }
  return out;
}

nlohmann::json plan_to_json(const Plan& p, const Graph& g) {
  nlohmann::json layers = nlohmann::json::array();
  int kernel_layers = 0;
  // A relabelling layer at a graph output launches nothing where its source is written through.
  std::unordered_set<const Value*> through_outputs;
  for (const auto& [v, j] : written_through_outputs(p, g)) through_outputs.insert(g.outputs()[j]);
  for (size_t k = 0; k < p.layers.size(); ++k) {
    const LayerChoice& c = p.layers[k];
    if (c.is_host()) {  // shape arithmetic on the host: no kernel
      layers.push_back({{"tactic", "host"}, {"launches", false}});
      continue;
    }
    // An alias tactic (the Reshape family) relabels its input's memory: no kernel either, unless
    // its output is a graph output that it copies into the caller's buffer (not where its
    // source is written through).
    const Value* y = k < g.nodes().size() ? g.nodes()[k]->output(0) : nullptr;
    const bool launches = c.tactic->alias_input < 0 ||
                          (y && g.is_graph_output(y) && !through_outputs.count(y));
    kernel_layers += launches;
    nlohmann::json in = nlohmann::json::array(), out = nlohmann::json::array();
    for (const auto& f : c.in) in.push_back(format_str(f));
    for (const auto& f : c.out) out.push_back(format_str(f));
    nlohmann::json timed = nlohmann::json::array();
    for (const auto& [name, ms] : c.timed) timed.push_back({name, ms});
    nlohmann::json r = {{"tactic", std::string(c.tactic->name)},
                        {"variant", c.variant},
                        {"precision", precision_name(c.precision)},
                        {"in", in},
                        {"out", out},
                        {"time_ms", c.time_ms},
                        {"timed", timed},
                        {"launches", launches}};
    if (!c.alternates.empty()) {
      nlohmann::json alts = nlohmann::json::array();
      for (const Alternate& a : c.alternates)
        alts.push_back({{"point", a.point},
                        {"tactic", std::string(a.tactic->name)},
                        {"variant", a.variant},
                        {"time_ms", a.time_ms}});
      r["alternates"] = std::move(alts);
    }
    if (c.dynamic) r["dynamic"] = true;
    if (!c.subplans.empty()) {
      nlohmann::json subs = nlohmann::json::object();
      const Node* n = g.nodes()[k];
      for (const auto& [name, sub] : c.subplans)
        if (const Graph* sg = n->attrs.get_graph(name)) subs[name] = plan_to_json(*sub, *sg);
      r["subplans"] = std::move(subs);
    }
    layers.push_back(std::move(r));
  }
  nlohmann::json j = {
      {"layers", layers}, {"workspace_limit", p.workspace_limit}, {"kernel_layers", kernel_layers}};
  // Layers whose sizes the data decides: the executor runs the engine as a dynamic region.
  bool dynamic = false;
  for (const LayerChoice& c : p.layers)
    dynamic |= !c.is_host() && ((c.tactic->caps & kDataDependent) || !c.subplans.empty());
  if (dynamic) j["dynamic_region"] = true;
  if (!p.points.empty()) j["points"] = p.points;
  return j;
}

size_t nearest_point(const std::vector<InputShapes>& points, const InputShapes& shapes) {
  size_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (size_t p = 0; p < points.size(); ++p) {
    double d = 0;
    for (size_t i = 0; i < shapes.size() && i < points[p].size(); ++i)
      for (size_t k = 0; k < shapes[i].size() && k < points[p][i].size(); ++k)
        if (shapes[i][k] > 0 && points[p][i][k] > 0)
          d += std::abs(std::log(double(shapes[i][k]) / double(points[p][i][k])));
    if (d < best_d) best_d = d, best = p;  // ties: the earlier point (the opt shapes first)
  }
  return best;
}

std::vector<std::string> generated_kernels(const Plan& p) {
  std::vector<std::string> keys;
  auto add = [&](const std::string& v) {
    if (v.rfind(rtc::kKeyPrefix, 0) == 0) keys.push_back(v);
  };
  for (const LayerChoice& c : p.layers) {
    add(c.variant);
    for (const Alternate& a : c.alternates) add(a.variant);
    for (const auto& [name, sub] : c.subplans)
      for (std::string& k : generated_kernels(*sub)) keys.push_back(std::move(k));
  }
  return keys;
}

Expected<Plan> plan_from_json(const Graph& g, const nlohmann::json& j) {
  Plan p;
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array())
    return KILN_ERROR("backend plan: no layer list (an engine of another backend?)");
  if (j.contains("kernels")) {
    const Status s = rtc::import_cubins(j["kernels"]);
    if (!s.ok()) return KILN_ERROR("backend plan: {}", s.message());
  }
  const auto& layers = j["layers"];
  if (layers.size() != g.nodes().size())
    return KILN_ERROR("backend plan: {} layer records for {} graph nodes", layers.size(),
                      g.nodes().size());
  if (j.contains("workspace_limit") && j["workspace_limit"].is_number_unsigned())
    p.workspace_limit = j["workspace_limit"].get<size_t>();
  if (j.contains("points")) {
    const auto& pts = j["points"];
    auto bad = [] { return KILN_ERROR("backend plan: 'points' must list input shapes per point"); };
    if (!pts.is_array()) return bad();
    for (const auto& pt : pts) {
      if (!pt.is_array() || pt.size() != g.inputs().size()) return bad();
      InputShapes shapes;
      for (const auto& s : pt) {
        if (!s.is_array()) return bad();
        std::vector<int64_t> dims;
        for (const auto& d : s) {
          if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad();
          dims.push_back(d.get<int64_t>());
        }
        shapes.push_back(std::move(dims));
      }
      p.points.push_back(std::move(shapes));
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const Node* n = g.nodes()[i];
    const auto& r = layers[i];
    auto fail = [&](const Status& s) { return s.with_context("backend plan: " + n->label()); };
    if (!r.is_object() || !r.contains("tactic") || !r["tactic"].is_string())
      return fail(KILN_ERROR("record has no tactic"));
    LayerChoice c;
    const std::string tactic = r["tactic"].get<std::string>();
    if (tactic != "host") {
      c.tactic = find_tactic(tactic);
      if (!c.tactic)
        return fail(KILN_ERROR("unknown tactic '{}' (engine from another kiln version?)", tactic));
      if (c.tactic->op_type != n->op_type)
        return fail(KILN_ERROR("tactic '{}' does not implement op {}", tactic, n->op_type));
      const std::string prec = r.value("precision", "");
      if (prec == "fp32") c.precision = Precision::kFP32;
      else if (prec == "tf32") c.precision = Precision::kTF32;
      else if (prec == "fp16") c.precision = Precision::kFP16;
      else if (prec == "int8") c.precision = Precision::kINT8;
      else return fail(KILN_ERROR("bad precision '{}'", prec));
      if (r.contains("variant") && r["variant"].is_string()) c.variant = r["variant"];
      auto in = parse_formats(r.value("in", nlohmann::json()), n->num_inputs(), "in");
      if (!in.ok()) return fail(in.status());
      auto out = parse_formats(r.value("out", nlohmann::json()), n->num_outputs(), "out");
      if (!out.ok()) return fail(out.status());
      c.in = std::move(in).value();
      c.out = std::move(out).value();
      if (r.contains("time_ms") && r["time_ms"].is_number()) c.time_ms = r["time_ms"];
      if (r.contains("timed") && r["timed"].is_array())
        for (const auto& t : r["timed"])
          if (t.is_array() && t.size() == 2 && t[0].is_string() && t[1].is_number())
            c.timed.emplace_back(t[0].get<std::string>(), t[1].get<double>());
      if (r.contains("alternates")) {
        if (!r["alternates"].is_array()) return fail(KILN_ERROR("'alternates' is not a list"));
        for (const auto& a : r["alternates"]) {
          if (!a.is_object() || !a.contains("point") || !a["point"].is_number_integer() ||
              a["point"].get<int64_t>() < 0 || !a.contains("tactic") || !a["tactic"].is_string())
            return fail(KILN_ERROR("an alternate needs a point and a tactic"));
          Alternate alt;
          alt.point = a["point"].get<size_t>();
          if (alt.point == 0 || alt.point >= p.points.size())
            return fail(
                KILN_ERROR("alternate for tuning point {} of {}", alt.point, p.points.size()));
          const std::string name = a["tactic"].get<std::string>();
          alt.tactic = find_tactic(name);
          if (!alt.tactic)
            return fail(
                KILN_ERROR("unknown tactic '{}' (engine from another kiln version?)", name));
          if (alt.tactic->op_type != n->op_type || alt.tactic->alias_input != c.tactic->alias_input)
            return fail(KILN_ERROR("alternate tactic '{}' cannot stand in for '{}'", name, tactic));
          if (a.contains("variant") && a["variant"].is_string()) alt.variant = a["variant"];
          if (a.contains("time_ms") && a["time_ms"].is_number()) alt.time_ms = a["time_ms"];
          c.alternates.push_back(std::move(alt));
        }
      }
      c.dynamic = r.contains("dynamic") && r["dynamic"].is_boolean() && r["dynamic"].get<bool>();
      if (r.contains("subplans")) {
        if (!r["subplans"].is_object()) return fail(KILN_ERROR("'subplans' is not an object"));
        for (const auto& [name, sj] : r["subplans"].items()) {
          const Graph* sg = n->attrs.get_graph(name);
          if (!sg) return fail(KILN_ERROR("a plan for '{}', which is no subgraph of the node", name));
          auto sub = plan_from_json(*sg, sj);
          if (!sub.ok()) return fail(sub.status().with_context(fmt::format("subgraph '{}'", name)));
          c.subplans.emplace_back(name, std::make_shared<Plan>(std::move(sub).value()));
        }
      }
      for (const Graph* sg : n->attrs.subgraphs()) {
        bool planned = false;
        for (const auto& sp : c.subplans) planned |= n->attrs.get_graph(sp.first) == sg;
        if (!planned) return fail(KILN_ERROR("a subgraph has no plan"));
      }
    }
    p.layers.push_back(std::move(c));
  }
  return p;
}

}  // namespace kiln::gpu
