// The calibration cache: a text file of per-tensor scales with a header naming the algorithm,
// the kiln version and the model's fingerprint (format: docs/quantization.md).
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/plan_format.h"
#include "ir/printer.h"
#include "quant/calib_io.h"

namespace kiln::quant {
namespace {

constexpr const char* kMagic = "kiln-calibration-cache 1";

void add_tensor(std::string& s, const Tensor& t) {
  s += fmt::format("{}{}#{:016x};", static_cast<int>(t.dtype()), shape_str(t.shape()),
                   plan_internal::xxh64(t.raw(), t.nbytes()));
}

}  // namespace

uint64_t graph_fingerprint(const Graph& g) {
  std::string s;
  auto value = [&](const Value* v) {
    if (!v) return s += "_,", void();
    s += v->name + ":" + std::to_string(static_cast<int>(v->type.dtype));
    if (v->constant) add_tensor(s, *v->constant);
    s += ",";
  };
  for (const Value* v : g.inputs()) value(v);
  s += "|";
  for (const Value* v : g.outputs()) value(v);
  for (const Node* n : g.nodes()) {
    s += "\n" + n->domain + "." + n->op_type + " " + n->name + " (";
    for (const Value* v : n->inputs()) value(v);
    s += ") -> (";
    for (const Value* v : n->outputs()) value(v);
    s += ")";
    for (const auto& [name, a] : n->attrs.all()) {
      s += " " + name + "=" + a.str();
      if (a.kind == Attribute::Kind::kTensor && a.t) add_tensor(s, *a.t);
      if (a.kind == Attribute::Kind::kGraph && a.g) s += "{" + graph_to_text(*a.g) + "}";
    }
  }
  return plan_internal::xxh64(s.data(), s.size());
}

Status write_calib_cache(const std::string& path, const CalibCache& c) {
  std::ostringstream out;
  out << "# kiln INT8 calibration cache: one line per tensor, 'NAME SCALE' (scale = amax / 127,\n"
         "# symmetric int8). Rebuild it by deleting this file. Format: docs/quantization.md\n";
  out << kMagic << "\n";
  out << "kiln-version " << c.kiln_version << "\n";
  out << "algorithm " << c.algorithm << "\n";
  out << fmt::format("fingerprint {:016x}\n", c.fingerprint);
  out << "tensors " << c.scales.size() << "\n";
  for (const auto& [name, scale] : c.scales) {
    if (name.find_first_of("\r\n") != std::string::npos || name.empty())
      return KILN_ERROR("calibration cache: tensor name '{}' cannot be written on one line", name);
    out << name << " " << fmt::format("{:.9g}", scale) << "\n";
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << out.str();
    if (!f) return KILN_ERROR("calibration cache '{}': cannot write", path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return KILN_ERROR("calibration cache '{}': cannot write", path);
  return Status::Ok();
}

Expected<CalibCache> read_calib_cache(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return KILN_ERROR("calibration cache '{}': cannot open", path);
  CalibCache c;
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) {
    return KILN_ERROR("calibration cache '{}' line {}: {}", path, lineno, why);
  };
  bool magic = false, have_fp = false;
  int64_t expected = -1;
  while (std::getline(f, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!magic) {
      if (line != kMagic)
        return bad(fmt::format("not a kiln calibration cache (expected '{}')", kMagic));
      magic = true;
      continue;
    }
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos || sp == 0) return bad("expected 'NAME VALUE'");
    const std::string key = line.substr(0, sp), val = line.substr(sp + 1);
    if (key == "kiln-version")
      c.kiln_version = val;
    else if (key == "algorithm")
      c.algorithm = val;
    else if (key == "fingerprint") {
      char* end = nullptr;
      c.fingerprint = std::strtoull(val.c_str(), &end, 16);
      if (val.empty() || *end) return bad("fingerprint must be 16 hex digits");
      have_fp = true;
    } else if (key == "tensors" && expected < 0) {
      expected = std::strtoll(val.c_str(), nullptr, 10);
    } else {
      char* end = nullptr;
      const float s = std::strtof(val.c_str(), &end);
      if (val.empty() || *end || !std::isfinite(s) || !(s > 0))
        return bad(fmt::format("scale '{}' of tensor '{}' is not a positive number", val, key));
      if (!c.scales.emplace(key, s).second)
        return bad(fmt::format("tensor '{}' appears twice", key));
    }
  }
  if (!magic)
    return KILN_ERROR("calibration cache '{}': empty or not a kiln calibration cache", path);
  if (!have_fp || c.algorithm.empty())
    return KILN_ERROR("calibration cache '{}': the header lacks the fingerprint or algorithm",
                      path);
  if (expected >= 0 && expected != static_cast<int64_t>(c.scales.size()))
    return KILN_ERROR(
        "calibration cache '{}': header says {} tensors but {} are listed (truncated?)", path,
        expected, c.scales.size());
  return c;
}

Status check_calib_cache(const CalibCache& c, const std::string& path, uint64_t fingerprint,
                         const std::string& algorithm, const std::vector<std::string>& needed) {
  if (c.fingerprint != fingerprint)
    return KILN_ERROR(
        "calibration cache '{}' was made for another model: fingerprint differs "
        "(cache {:016x}, this model {:016x}; other weights, graph or build options "
        "such as --opt-level); delete it or pass another --calib-cache to recalibrate",
        path, c.fingerprint, fingerprint);
  if (!algorithm.empty() && algorithm != c.algorithm)
    return KILN_ERROR("calibration cache '{}': algorithm differs (cache: {}, requested: {})", path,
                      c.algorithm, algorithm);
  for (const std::string& name : needed)
    if (!c.scales.count(name))
      return KILN_ERROR("calibration cache '{}': tensor '{}' missing", path, name);
  return Status::Ok();
}

}  // namespace kiln::quant
