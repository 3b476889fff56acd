#include "perf/load.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "perf/client.h"
#include "perf/shm_region.h"

namespace kiln::perf {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorMessages = 10;  // distinct messages kept per level

// Set by SIGINT or SIGTERM while a run is under way; the loops look at it between requests.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_interrupt(int) { g_interrupted.store(true); }

// Routes SIGINT and SIGTERM to g_interrupted while it lives, so that the run ends through its
// normal path (regions unregistered and unlinked), then puts the old handlers back.
class InterruptGuard {
 public:
  InterruptGuard() {
    g_interrupted = false;
    SigAction sa{};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~InterruptGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  using SigAction = struct sigaction;
  SigAction old_int_{}, old_term_{};
};

uint64_t align64(uint64_t v) { return (v + 63) / 64 * 64; }

// One load thread's connection and, with shared memory, its region (registered as `region`).
struct Worker {
  std::unique_ptr<Client> client;
  std::unique_ptr<ShmRegion> shm;
  std::string region;
};

// The clients of a run; unregisters every region from the server before it unlinks them.
class Workers {
 public:
  Workers(const PerfOptions& o, const RequestPlan& plan,
          const std::function<void(const std::string&)>& warn)
      : o_(o), plan_(plan), warn_(warn) {
    uint64_t at = 0;
    for (const InputPlan& in : plan.inputs) {
      layout_.input_offsets.push_back(at);
      at = align64(at + in.data.size());
    }
    for (const OutputPlan& out : plan.outputs) {
      layout_.output_offsets.push_back(at);
      at = align64(at + out.bytes);
    }
    region_bytes_ = std::max<uint64_t>(at, 64);
  }
  ~Workers() {
    for (Worker& w : workers_) {
      if (w.region.empty()) continue;
      Status st = w.client->unregister_shm(w.region);
      if (!st.ok()) warn_(st.message());
    }
  }

  // Makes clients until there are `n`.
  Status ensure(size_t n) {
    while (workers_.size() < n) {
      const bool first = workers_.empty();
      KILN_ASSIGN_OR_RETURN(auto client, connect(o_));
      // Kept from here on, so that the destructor unregisters what registration did.
      Worker& w = workers_.emplace_back(Worker{std::move(client), nullptr, ""});
      if (o_.shm) {
        const std::string name = fmt::format("kiln_perf_{}_{}", ::getpid(), workers_.size() - 1);
        KILN_ASSIGN_OR_RETURN(w.shm, ShmRegion::create("/" + name, region_bytes_));
        for (size_t i = 0; i < plan_.inputs.size(); ++i)
          std::memcpy(w.shm->data() + layout_.input_offsets[i], plan_.inputs[i].data.data(),
                      plan_.inputs[i].data.size());
        w.region = name;
        KILN_RETURN_IF_ERROR(w.client->register_shm(name, "/" + name, region_bytes_));
        ShmLayout layout = layout_;
        layout.region = name;
        KILN_RETURN_IF_ERROR(w.client->prepare(plan_, &layout));
      } else {
        KILN_RETURN_IF_ERROR(w.client->prepare(plan_, nullptr));
      }
      if (first) {
        // One request before any measurement: a request the server refuses (a batch over its
        // maximum, a shape out of its profile) stops the run at once with the server's reason.
        Status st = w.client->infer();
        if (!st.ok()) {
          // An output whose size the metadata leaves open gets --output-shared-memory-size.
          const bool small = o_.shm && st.message().find("too small") != std::string::npos;
          return KILN_ERROR("the first request failed: {}{}", st.message(),
                            small ? " (give its size with --output-shared-memory-size)" : "");
        }
      }
    }
    return Status::Ok();
  }

  Client& client(size_t i) { return *workers_[i].client; }

  static Expected<std::unique_ptr<Client>> connect(const PerfOptions& o) {
    return o.protocol == Protocol::kGrpc ? connect_grpc(o.url, o.timeout_ms)
                                         : connect_http(o.url, o.timeout_ms);
  }

 private:
  const PerfOptions& o_;
  const RequestPlan& plan_;
  std::function<void(const std::string&)> warn_;
  ShmLayout layout_;
  uint64_t region_bytes_ = 0;
  std::vector<Worker> workers_;
};

// What one load thread saw.
struct ThreadTally {
  std::vector<int64_t> latencies_ns;
  uint64_t errors = 0, delayed = 0;
  std::map<std::string, uint64_t> messages;
  Clock::time_point last_end{};
  void send(Client& c) {
    const auto start = Clock::now();
    const Status st = c.infer();
    last_end = Clock::now();
    if (st.ok()) {
      latencies_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(last_end - start).count());
      return;
    }
    ++errors;
    auto it = messages.find(st.message());
    if (it != messages.end())
      ++it->second;
    else if (messages.size() < kMaxErrorMessages)
      messages[st.message()] = 1;
  }
};

LevelResult merge(double level, std::vector<ThreadTally>& tallies, Clock::time_point start) {
  LevelResult r;
  r.level = level;
  std::vector<int64_t> all;
  Clock::time_point end = start;
  for (ThreadTally& t : tallies) {
    all.insert(all.end(), t.latencies_ns.begin(), t.latencies_ns.end());
    r.errors += t.errors;
    r.delayed += t.delayed;
    end = std::max(end, t.last_end);
    for (const auto& [m, n] : t.messages)
      if (r.error_messages.count(m) || r.error_messages.size() < kMaxErrorMessages)
        r.error_messages[m] += n;
  }
  r.requests = all.size();
  r.duration_s = std::chrono::duration<double>(end - start).count();
  r.latency = summarize(all);
  return r;
}

// `concurrency` clients, each sending its next request when its last is answered, until the
// window ends, the level has sent max_requests, or the run is interrupted.
LevelResult closed_loop(Workers& workers, int concurrency, const PerfOptions& o,
                        Clock::time_point deadline) {
  std::vector<ThreadTally> tallies(static_cast<size_t>(concurrency));
  std::atomic<uint64_t> tickets{0};
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < concurrency; ++i)
    threads.emplace_back([&, i] {
      ThreadTally& t = tallies[static_cast<size_t>(i)];
      while (!g_interrupted && Clock::now() < deadline) {
        if (o.max_requests && tickets.fetch_add(1) >= o.max_requests) break;
        t.send(workers.client(static_cast<size_t>(i)));
      }
    });
  for (std::thread& th : threads) th.join();
  return merge(concurrency, tallies, start);
}

// The start times of an open loop's requests, in seconds from the level's start: k / rate, or
// sums of exponential gaps; handed out one at a time to the threads that send them.
class Schedule {
 public:
  Schedule(double rate, bool poisson, uint64_t seed, uint64_t max_requests)
      : rate_(rate), poisson_(poisson), rng_(seed), gap_(rate), max_(max_requests) {}
  // The next request's start, or a negative number when max_requests have been handed out.
  double next() {
    std::lock_guard<std::mutex> lk(mu_);
    if (max_ && count_ >= max_) return -1;
    const double t = poisson_ ? at_ : static_cast<double>(count_) / rate_;
    if (poisson_) at_ += gap_(rng_);
    ++count_;
    return t;
  }

 private:
  std::mutex mu_;
  double rate_;
  bool poisson_;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  uint64_t max_, count_ = 0;
  double at_ = 0;
};

// Requests started at `rate` a second (evenly, or with exponential gaps), by max_threads
// clients; a request whose time comes while every thread is busy starts late (`delayed`).
LevelResult open_loop(Workers& workers, double rate, const PerfOptions& o,
                      Clock::time_point deadline) {
  const auto start = Clock::now();
  Schedule schedule(rate, o.poisson, o.seed + static_cast<uint64_t>(rate * 1000), o.max_requests);
  std::vector<ThreadTally> tallies(static_cast<size_t>(o.max_threads));
  std::vector<std::thread> threads;
  for (int i = 0; i < o.max_threads; ++i)
    threads.emplace_back([&, i] {
      ThreadTally& t = tallies[static_cast<size_t>(i)];
      for (double at = schedule.next(); at >= 0; at = schedule.next()) {
        const auto when =
            start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
        if (when >= deadline) break;
        while (!g_interrupted && Clock::now() < when)
          std::this_thread::sleep_for(
              std::min<Clock::duration>(when - Clock::now(), std::chrono::milliseconds(50)));
        if (g_interrupted || Clock::now() >= deadline) break;
        if (Clock::now() - when > std::chrono::milliseconds(1)) ++t.delayed;
        t.send(workers.client(static_cast<size_t>(i)));
      }
    });
  for (std::thread& th : threads) th.join();
  return merge(rate, tallies, start);
}

Expected<ServerCounters> read_counters(const PerfOptions& o) {
  KILN_ASSIGN_OR_RETURN(std::string text, http_get(o.metrics_url, "/metrics", o.timeout_ms));
  KILN_ASSIGN_OR_RETURN(auto samples, parse_prometheus(text));
  return model_counters(samples, o.model, o.version);
}

}  // namespace

Expected<RunResult> run_perf(const PerfOptions& o,
                             const std::function<void(const LevelResult&)>& on_level,
                             const std::function<void(const std::string&)>& warn) {
  InterruptGuard guard;
  const auto run_start = Clock::now();
  const auto run_deadline = run_start + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(o.time_limit_s));
  RunResult result;
  {
    KILN_ASSIGN_OR_RETURN(auto control, Workers::connect(o));
    KILN_ASSIGN_OR_RETURN(result.model, control->metadata(o.model, o.version));
  }
  KILN_ASSIGN_OR_RETURN(result.plan, make_plan(result.model, o.version, o.batch, o.shapes,
                                               o.input_data, o.output_shm_size, o.seed));
  bool metrics = o.metrics;
  if (metrics) {
    auto c = read_counters(o);
    if (!c.ok())
      result.metrics_problem = fmt::format("no server counters: {}", c.status().message());
    else if (!c->found)
      result.metrics_problem = fmt::format("no server counters: {}/metrics has none for model '{}'",
                                           o.metrics_url.text(), o.model);
    if (!result.metrics_problem.empty()) {
      warn(result.metrics_problem);
      metrics = false;
    }
  } else {
    result.metrics_problem = "not read (--no-metrics)";
  }

  Workers workers(o, result.plan, warn);
  for (double level : o.levels) {
    if (g_interrupted) {
      result.stopped = "interrupted";
      break;
    }
    if (Clock::now() >= run_deadline) {
      result.stopped = fmt::format("time limit of {} s reached", o.time_limit_s);
      break;
    }
    const bool rate = o.mode == LoadMode::kRequestRate;
    KILN_RETURN_IF_ERROR(
        workers.ensure(rate ? static_cast<size_t>(o.max_threads) : static_cast<size_t>(level)));
    ServerCounters before;
    if (metrics) {
      auto c = read_counters(o);
      if (!c.ok()) return KILN_ERROR("reading the server's counters: {}", c.status().message());
      before = *c;
    }
    const auto deadline =
        std::min(run_deadline, Clock::now() + std::chrono::milliseconds(o.measurement_ms));
    LevelResult r = rate ? open_loop(workers, level, o, deadline)
                         : closed_loop(workers, static_cast<int>(level), o, deadline);
    if (metrics) {
      auto after = read_counters(o);
      if (!after.ok())
        return KILN_ERROR("reading the server's counters: {}", after.status().message());
      r.server = delta(*after, before);
      r.has_server = true;
    }
    on_level(r);
    result.levels.push_back(std::move(r));
  }
  if (g_interrupted && result.stopped.empty() && result.levels.size() < o.levels.size())
    result.stopped = "interrupted";
  return result;
}

}  // namespace kiln::perf
