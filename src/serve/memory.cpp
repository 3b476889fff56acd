#include "serve/memory.h"

#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

namespace kiln::serve {
namespace {

double env_seconds(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atof(v) : 0.0;
}

constexpr double kMB = 1 << 20;

}  // namespace

size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  if (!(f >> pages >> resident)) return 0;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

MemoryWatch::MemoryWatch(std::function<void(const std::string&)> log) : log_(std::move(log)) {
  const double log_s = env_seconds("KILN_SERVE_MEMORY_LOG"),
               trim_s = env_seconds("KILN_SERVE_TRIM_S");
  if (log_s > 0 || trim_s > 0) thread_ = std::thread([=, this] { run(log_s, trim_s); });
}

MemoryWatch::~MemoryWatch() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MemoryWatch::run(double log_s, double trim_s) {
  using Clock = std::chrono::steady_clock;
  auto every = [](double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  };
  auto next_log = Clock::now() + every(log_s), next_trim = Clock::now() + every(trim_s);
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    const auto wake = log_s <= 0    ? next_trim
                      : trim_s <= 0 ? next_log
                                    : std::min(next_log, next_trim);
    cv_.wait_until(lk, wake, [&] { return stop_; });
    if (stop_) return;
    const auto now = Clock::now();
    if (trim_s > 0 && now >= next_trim) {
      const size_t before = rss_bytes();
      const auto t0 = Clock::now();
      malloc_trim(0);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      log_(fmt::format("kiln serve: malloc_trim (pid {}): rss {:.1f} -> {:.1f} MB in {:.1f} ms",
                       getpid(), before / kMB, rss_bytes() / kMB, ms));
      next_trim = now + every(trim_s);
    }
    if (log_s > 0 && now >= next_log) {
      const struct mallinfo2 mi = mallinfo2();
      log_(fmt::format(
          "kiln serve: memory (pid {}): rss {:.1f} MB, malloc in use {:.1f} MB, free "
          "in arenas {:.1f} MB, mmapped {:.1f} MB",
          getpid(), rss_bytes() / kMB, mi.uordblks / kMB, mi.fordblks / kMB, mi.hblkhd / kMB));
      next_log = now + every(log_s);
    }
  }
}

}  // namespace kiln::serve
