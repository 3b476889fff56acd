// The core of `kiln serve`: the models of a repository, each version with its dynamic batcher,
// the shared memory regions, and the counters; what every front end (HTTP, gRPC) hands its
// decoded requests to. Front ends answer bad requests themselves, before the core; the core
// answers unknown models (404), requests that do not fit the model (400) and a full queue (429).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/batcher.h"
#include "serve/model.h"
#include "serve/shm.h"

namespace kiln::serve {

struct CoreOptions {
  std::string repository;
  std::vector<int> devices;  // empty: where each engine was built for (cpu engines always)
  int max_batch_cap = 0;     // --max-batch-size (0: the profile's)
  std::string pad_batches;   // --pad-batches sizes ("pow2", "1,2,4"), "" none
  bool pad = false;
  BatcherOptions batcher;
};

struct ModelEntry {
  std::unique_ptr<ServedModel> model;
  std::unique_ptr<Batcher> batcher;
};

class Core {
 public:
  // Loads every model of the repository; a model that fails to load is reported through `log`
  // and left out; an error when none loads.
  static Expected<std::unique_ptr<Core>> load(const CoreOptions& options,
                                              const std::function<void(const std::string&)>& log);
  ~Core();

  // Model `name` at `version` ("" = the highest); 404 naming it when there is none.
  Result<ModelEntry*> find(const std::string& name, const std::string& version);
  // Every version of `name` (highest last); empty when unknown.
  std::vector<std::string> versions(const std::string& name) const;
  const std::map<std::string, std::map<long, ModelEntry>>& models() const { return models_; }

  // Checks `req` against its model and queues it. `done` is called once: from a worker thread
  // with the outputs, or before this returns with the error.
  void infer(InferRequest req, Done done);

  ShmRegistry& shm() { return shm_; }
  bool ready() const { return !draining_; }
  // Stops taking inferences (503); the queued ones run. Returns once they have.
  void drain();
  // Counts an answered request by its status (front ends call it; /metrics shows it).
  void count_response(const char* protocol, int status);
  // The Prometheus text of /metrics.
  std::string metrics_text();

 private:
  Core() = default;
  std::map<std::string, std::map<long, ModelEntry>> models_;  // name -> version -> entry
  ShmRegistry shm_;
  std::atomic<bool> draining_{false};
  std::mutex counts_mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;  // (protocol, status) -> count
};

// `--devices`: "all" or "" for every visible GPU, else distinct indices below `visible`.
Expected<std::vector<int>> parse_devices(const std::string& text, int visible);

}  // namespace kiln::serve
