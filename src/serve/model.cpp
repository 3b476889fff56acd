#include "serve/model.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "serve/device.h"

namespace kiln::serve {
namespace fs = std::filesystem;

std::vector<InputSpec> input_specs(const Engine& e) {
  nlohmann::json profile;
  try {
    auto opts = nlohmann::json::parse(e.build_options_json());
    if (opts.is_object() && opts.contains("profile") && opts["profile"].is_object())
      profile = opts["profile"];
  } catch (const nlohmann::json::exception&) {
    // an engine without readable options has no profile: shapes are checked against dims only
  }
  std::vector<InputSpec> specs;
  for (const TensorInfo& t : e.inputs()) {
    InputSpec s{t.name, t.dtype, t.dims, {}, {}, {}};
    if (profile.contains(t.name)) {
      const auto& p = profile[t.name];
      try {
        s.min = p.at("min").get<std::vector<int64_t>>();
        s.opt = p.at("opt").get<std::vector<int64_t>>();
        s.max = p.at("max").get<std::vector<int64_t>>();
      } catch (const nlohmann::json::exception&) {
        s.min.clear(), s.opt.clear(), s.max.clear();
      }
      if (s.min.size() != s.dims.size() || s.max.size() != s.dims.size())
        s.min.clear(), s.opt.clear(), s.max.clear();
    }
    specs.push_back(std::move(s));
  }
  return specs;
}

int batch_limit(const Engine& e, const std::vector<InputSpec>& specs, int cap) {
  int limit = cap > 0 ? cap : 32;
  for (const TensorInfo& t : e.outputs())
    if (t.dims.empty() || t.dims[0] >= 0) return 1;
  for (const InputSpec& s : specs) {
    if (s.dims.empty() || s.dims[0] >= 0) return 1;
    if (!s.max.empty()) {
      const int hi = static_cast<int>(std::min<int64_t>(s.max[0], 1 << 20));
      limit = cap > 0 ? std::min(limit, hi) : hi;
    }
  }
  return std::max(limit, 1);
}

Expected<std::unique_ptr<ServedModel>> ServedModel::load(const std::string& name,
                                                         const std::string& version,
                                                         const std::string& path,
                                                         const std::vector<int>& devices,
                                                         int max_batch_cap) {
  auto m = std::unique_ptr<ServedModel>(new ServedModel());
  m->name_ = name, m->version_ = version, m->path_ = path;
  const int first = devices.empty() ? -1 : devices.front();
  if (!use_device(first)) return KILN_ERROR("model {}: cannot use CUDA device {}", name, first);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::load(path));
  const bool gpu = e->backend() == "cuda";
  m->engines_.push_back(
      {gpu ? first : -1, gpu ? fmt::format("cuda:{}", std::max(first, 0)) : "cpu", std::move(e)});
  // Each GPU holds its own weights and contexts; a cpu engine is one "device" however many
  // GPUs there are.
  for (size_t i = 1; gpu && i < devices.size(); ++i) {
    if (!use_device(devices[i]))
      return KILN_ERROR("model {}: cannot use CUDA device {}", name, devices[i]);
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Engine> more, Engine::load(path));
    m->engines_.push_back({devices[i], fmt::format("cuda:{}", devices[i]), std::move(more)});
  }
  use_device(first);
  m->inputs_ = input_specs(m->engine());
  m->max_batch_ = batch_limit(m->engine(), m->inputs_, max_batch_cap);
  return m;
}

int ServedModel::output_index(const std::string& name) const {
  const auto& outs = outputs();
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].name == name) return static_cast<int>(i);
  return -1;
}

Result<int> ServedModel::check_request(InferRequest& req) const {
  for (const InputTensor& t : req.inputs) {
    const bool known = std::any_of(inputs_.begin(), inputs_.end(),
                                   [&](const InputSpec& s) { return s.name == t.name; });
    if (!known) {
      std::vector<std::string> names;
      for (const InputSpec& s : inputs_) names.push_back(s.name);
      return api_error(400, "unknown input '{}' (the model's inputs: {})", t.name,
                       fmt::join(names, ", "));
    }
  }
  std::vector<InputTensor> ordered;
  ordered.reserve(inputs_.size());
  int64_t batch = -1;
  for (const InputSpec& s : inputs_) {
    auto it = std::find_if(req.inputs.begin(), req.inputs.end(),
                           [&](const InputTensor& t) { return t.name == s.name; });
    if (it == req.inputs.end()) return api_error(400, "input '{}' is missing", s.name);
    const InputTensor& t = *it;
    if (t.dtype != s.dtype)
      return api_error(400, "input '{}': datatype {}, the model takes {}", s.name,
                       v2_datatype(t.dtype), v2_datatype(s.dtype));
    bool fits = t.shape.size() == s.dims.size();
    for (size_t i = 0; fits && i < s.dims.size(); ++i)
      fits = s.dims[i] < 0 || s.dims[i] == t.shape[i];
    if (!fits)
      return api_error(400, "input '{}': shape {}, the model takes {}", s.name, shape_text(t.shape),
                       shape_text(s.dims));
    if (!s.min.empty()) {
      for (size_t i = 0; i < s.dims.size(); ++i)
        if (t.shape[i] < s.min[i] || t.shape[i] > s.max[i])
          return api_error(400,
                           "input '{}': shape {} is outside the model's range (min {}, max {})",
                           s.name, shape_text(t.shape), shape_text(s.min), shape_text(s.max));
    }
    if (max_batch_ > 1) {
      if (batch >= 0 && t.shape[0] != batch)
        return api_error(400, "input '{}': batch {}, other inputs have {}", s.name, t.shape[0],
                         batch);
      batch = t.shape[0];
    }
    ordered.push_back(std::move(*it));
  }
  req.inputs = std::move(ordered);
  return static_cast<int>(batch > 0 ? batch : (max_batch_ > 1 ? 0 : 1));
}

Check ServedModel::check_outputs(InferRequest& req) const {
  if (req.outputs.empty()) {
    for (const TensorInfo& t : outputs())
      req.outputs.push_back({t.name, std::nullopt, std::nullopt});
    return std::nullopt;
  }
  for (const OutputRequest& o : req.outputs) {
    if (output_index(o.name) < 0) {
      std::vector<std::string> names;
      for (const TensorInfo& t : outputs()) names.push_back(t.name);
      return api_error(400, "unknown output '{}' (the model's outputs: {})", o.name,
                       fmt::join(names, ", "));
    }
  }
  return std::nullopt;
}

Expected<std::vector<RepositoryEntry>> find_models(const std::string& repository) {
  std::error_code ec;
  if (!fs::is_directory(repository, ec))
    return KILN_ERROR("model repository '{}' is not a folder", repository);
  std::vector<fs::path> entries;
  for (const auto& d : fs::directory_iterator(repository, ec)) entries.push_back(d.path());
  if (ec) return KILN_ERROR("cannot list model repository '{}': {}", repository, ec.message());
  std::sort(entries.begin(), entries.end());
  std::vector<RepositoryEntry> found;
  for (const fs::path& p : entries) {
    const std::string file = p.filename().string();
    if (p.extension() == ".kiln" && fs::is_regular_file(p, ec)) {
      found.push_back({p.stem().string(), "1", p.string()});
    } else if (fs::is_regular_file(p / "model.kiln", ec)) {
      found.push_back({file, "1", (p / "model.kiln").string()});
    } else if (fs::is_directory(p, ec)) {
      // Triton's layout: NAME/<version>/model.kiln, versions as whole numbers.
      std::vector<std::pair<long, fs::path>> versions;
      for (const auto& v : fs::directory_iterator(p, ec)) {
        const std::string vn = v.path().filename().string();
        if (vn.empty() || vn.size() > 9 || !std::all_of(vn.begin(), vn.end(), ::isdigit)) continue;
        if (fs::is_regular_file(v.path() / "model.kiln", ec))
          versions.emplace_back(std::stol(vn), v.path() / "model.kiln");
      }
      std::sort(versions.begin(), versions.end());
      for (const auto& [n, path] : versions)
        found.push_back({file, std::to_string(n), path.string()});
    }
  }
  return found;
}

}  // namespace kiln::serve
