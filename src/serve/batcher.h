// The dynamic batcher of one model: a queue shared by every front end, and one worker thread per
// execution context (several per device). A free context takes the oldest request and the
// requests of the same shapes behind it, up to the model's maximum batch; it waits for more up
// to the queue delay after the oldest arrived, unless the batch is full or reaches the largest
// preferred size. The requests are gathered into the context's own input buffers (one copy each),
// run as one inference, and each gets its rows of the outputs back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve/model.h"
#include "serve/types.h"

namespace kiln::serve {

struct BatcherOptions {
  // Execution contexts per device; 0: 4 on a GPU (a batch's input copies overlap the others'
  // inferences), 2 for a cpu engine.
  int contexts = 0;
  double max_delay_ms = 2.0;   // how long the oldest request waits for others
  std::vector<int> preferred;  // hand a batch over once it reaches the largest of these
  std::vector<int> pad_sizes;  // run each batch padded to the smallest that holds it
  size_t max_queue = 4096;     // requests waiting; more get 429
  bool warm = true;            // run each context at the sizes it will see first
  // Wait out the delay even when no context of the model is running (Triton's way). Off: a
  // request that finds every context idle runs at once, as no running batch is there to make
  // others queue behind it; under load the contexts are busy and batches form as before.
  bool delay_when_idle = false;
  // Triton's priority levels: 0 (the default) queues every request alike; N > 0 takes requests
  // of level 1 first, then 2, ... N (oldest first within a level); a request's priority 0 is
  // `default_priority` (0: the middle level), one past N a 400.
  int priority_levels = 0;
  int default_priority = 0;
};

// Counters for /metrics (Prometheus), per model; times in microseconds.
struct ModelStats {
  std::atomic<uint64_t> requests{0}, failures{0}, inferences{0}, batched_requests{0};
  std::atomic<uint64_t> samples{0}, padded_samples{0}, largest_batch{0}, rejected{0};
  std::atomic<uint64_t> timed_out{0}, cancelled{0};  // dropped from the queue
  std::atomic<uint64_t> queue_us{0}, compute_us{0}, request_us{0};
  std::mutex mu;                               // the maps below
  std::map<int, uint64_t> per_batch;           // inferences per batch size run (padded)
  std::map<std::string, uint64_t> per_device;  // inferences per device
  std::map<std::string, uint64_t> device_compute_us;
};

// Called once per request, from a worker thread: the request back (for its front end to answer
// from) and its outputs (views of the batch's, kept alive by them) or why it failed.
using Done = std::function<void(InferRequest& req, Result<Outputs> outputs)>;

// One request's bytes on their way into a joined batch.
struct RowCopy {
  uint8_t* dst;
  const void* src;
  size_t bytes;
};

// Does `copies`, on several threads where they are large.
void copy_rows(const std::vector<RowCopy>& copies);

class Batcher {
 public:
  // Makes `options.contexts` contexts on each of the model's devices and starts their threads;
  // warms them when asked. An error names the context that failed.
  static Expected<std::unique_ptr<Batcher>> create(ServedModel& model, BatcherOptions options);
  ~Batcher();

  // Queues a checked request (ServedModel::check_request: `batch` is its first dimension, 0
  // for an empty batch) behind those of its priority level and above. `done` is called once,
  // from a worker thread, or here with an error (a priority past the levels: 400; queue full:
  // 429; closed: 503). A request whose deadline passes, or whose client goes, while it is
  // queued is answered 408 or 499 and not run.
  void submit(InferRequest req, int batch, Done done);
  // Stops taking requests; the queued ones still run. Waits for the workers to finish them.
  void drain();

  ModelStats& stats() { return stats_; }
  const std::vector<std::string>& devices() const { return devices_; }
  int max_batch() const { return max_batch_; }
  const std::vector<int>& pad_sizes() const { return opts_.pad_sizes; }
  int contexts() const { return opts_.contexts; }  // per device
  const BatcherOptions& options() const { return opts_; }
  size_t queued() const;

 private:
  struct Job {
    InferRequest req;
    int batch = 1;
    std::string key;  // the shapes past the first dimension: requests alike can be joined
    std::chrono::steady_clock::time_point arrival;
    uint64_t level = 0;      // priority level: lower runs first
    bool timed_out = false;  // dropped: its deadline passed (else its client went)
    Done done;
  };
  using JobPtr = std::unique_ptr<Job>;
  struct Slot;  // one execution context and its input buffers

  Batcher(ServedModel& model, BatcherOptions options);
  void work(Slot& slot);
  // Under the lock: the jobs to run next (taken out of the queue), or none yet; `wake` is when
  // to look again. Queued jobs past their deadline or cancelled go to `dropped`.
  std::vector<JobPtr> take(std::chrono::steady_clock::time_point now,
                           std::chrono::steady_clock::time_point* wake,
                           std::vector<JobPtr>* dropped);
  // Answers the dropped jobs (outside the lock).
  void answer_dropped(std::vector<JobPtr>& dropped);
  void run(Slot& slot, std::vector<JobPtr>& jobs);
  Status warm(Slot& slot);

  ServedModel& model_;
  BatcherOptions opts_;
  int max_batch_ = 1;
  std::vector<std::string> devices_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<JobPtr> queue_;
  int running_ = 0;  // workers running a batch now
  bool closed_ = false;
  ModelStats stats_;
};

// `--pad-batches`' sizes: "pow2" or "" for 1, 2, 4, ... up to max_batch, or a comma-separated
// list (sizes over max_batch dropped, max_batch always one). An error says what is wrong.
Expected<std::vector<int>> parse_pad_sizes(const std::string& text, int max_batch);
// The smallest of `sizes` (sorted) that holds `total`; `total` when none does.
int pad_target(int total, const std::vector<int>& sizes);

}  // namespace kiln::serve
