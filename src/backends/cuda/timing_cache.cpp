#include "timing_cache.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rtc.h"

namespace kiln::gpu {

Expected<TimingCache> TimingCache::open(const std::string& path, const std::string& device) {
  TimingCache c;
  c.path_ = path;
  c.device_ = device;
  if (path.empty() || !std::filesystem::exists(path)) return c;
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f) return KILN_ERROR("timing cache '{}': cannot read the file", path);
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("entries") || !j["entries"].is_object())
    return KILN_ERROR("timing cache '{}': not a kiln timing cache (expected JSON with \"entries\")",
                      path);
  if (j.value("device", "") != device) {
    c.mismatch_ = true;  // another GPU or library version: its times say nothing here
    return c;
  }
  for (const auto& [k, v] : j["entries"].items())
    if (v.is_number()) c.entries_[k] = v.get<double>();
  // The generated kernels' cubins (rtc.h), so that a rebuild does not compile them again.
  if (j.contains("kernels")) {
    const Status s = rtc::import_cubins(j["kernels"]);
    if (!s.ok()) return KILN_ERROR("timing cache '{}': {}", path, s.message());
  }
  return c;
}

std::optional<double> TimingCache::find(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  ++hits_;
  return it->second;
}

Status TimingCache::save() const {
  if (path_.empty()) return Status::Ok();
  nlohmann::json j = {{"device", device_}, {"entries", entries_}, {"kernels", rtc::export_all()}};
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(1) << "\n";
    if (!f) return KILN_ERROR("timing cache '{}': cannot write", path_);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) return KILN_ERROR("timing cache '{}': cannot write ({})", path_, ec.message());
  return Status::Ok();
}

}  // namespace kiln::gpu
