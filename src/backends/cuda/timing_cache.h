// The timing cache: tuned tactic times keyed by layer signature, for one GPU and library set.
// A JSON file (`--timing-cache FILE`): {"device": "<device_signature()>", "entries": {key: ms},
// "kernels": {key: base64 cubin}} (the kernels generated so far, rtc.h).
// Entries from another device or library version are not used (and are dropped on save).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "kiln/status.h"

namespace kiln::gpu {

class TimingCache {
 public:
  // Loads `path` if it exists (a missing file is an empty cache); `device` is this machine's.
  static Expected<TimingCache> open(const std::string& path, const std::string& device);
  std::optional<double> find(const std::string& key) const;
  void put(const std::string& key, double ms) { entries_[key] = ms; }
  Status save() const;  // no-op without a path
  size_t size() const { return entries_.size(); }
  size_t hits() const { return hits_; }
  bool device_mismatch() const { return mismatch_; }

 private:
  std::string path_, device_;
  std::map<std::string, double> entries_;
  mutable size_t hits_ = 0;
  bool mismatch_ = false;
};

}  // namespace kiln::gpu
