// Debugging aids for a long-running server's memory (the soak's RSS plot reads the same
// numbers): KILN_SERVE_MEMORY_LOG=SECONDS logs the resident size and glibc's heap that often,
// KILN_SERVE_TRIM_S=SECONDS gives free heap pages back to the system (malloc_trim) that often.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace kiln::serve {

// The process's resident set size in bytes (0 where /proc is not there).
size_t rss_bytes();

class MemoryWatch {
 public:
  // Starts the thread when either variable is set; `log` takes each line.
  explicit MemoryWatch(std::function<void(const std::string&)> log);
  ~MemoryWatch();

 private:
  void run(double log_s, double trim_s);
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kiln::serve
