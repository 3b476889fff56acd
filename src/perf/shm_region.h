// A POSIX shared memory object that kiln perf creates for one client's inputs and outputs
// (shm_open + mmap, the object kiln serve's system shared memory maps by its key). It is
// unlinked when destroyed, so that nothing is left in /dev/shm.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/status.h"

namespace kiln::perf {

class ShmRegion {
 public:
  // Creates `key` ("/name") of `size` bytes, zeroed; an error when it exists already.
  static Expected<std::unique_ptr<ShmRegion>> create(const std::string& key, size_t size);
  ~ShmRegion();
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;

  uint8_t* data() { return base_; }
  size_t size() const { return size_; }
  const std::string& key() const { return key_; }

 private:
  ShmRegion() = default;
  std::string key_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln::perf
