// The load loop of kiln perf: clients made once (a connection each and, with shared memory, a
// region each), then for every level of the sweep a measurement bounded in time and count,
// closed-loop (a number of clients each sending its next request when the last is answered)
// or open-loop (requests started at a rate), with the server's counters read around it.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "perf/metrics.h"
#include "perf/model_io.h"
#include "perf/options.h"
#include "perf/stats.h"

namespace kiln::perf {

struct LevelResult {
  double level = 0;       // the concurrency, or the request rate (requests/s)
  uint64_t requests = 0;  // answered without error
  uint64_t errors = 0;
  uint64_t delayed = 0;    // request rate: started over 1 ms after their time (threads all busy)
  double duration_s = 0;   // from the first request sent to the last answer
  LatencySummary latency;  // of the requests answered without error
  std::map<std::string, uint64_t> error_messages;  // the first distinct ones, with counts
  bool has_server = false;
  ServerCounters server;  // the level's counters (after - before)
};

struct RunResult {
  ModelMeta model;
  RequestPlan plan;
  std::vector<LevelResult> levels;
  std::string stopped;          // why the sweep ended early ("" when it ran every level)
  std::string metrics_problem;  // why there are no server counters ("" when there are)
};

// Runs the sweep of `o`, calling `on_level` as each level ends and `warn` for a problem that
// does not stop the run (no /metrics, a region the server would not unregister). SIGINT and
// SIGTERM end the sweep early (the clients' regions are unregistered and unlinked as always).
// Errors: the server unreachable, the model unknown, the shapes or input data unusable.
Expected<RunResult> run_perf(const PerfOptions& o,
                             const std::function<void(const LevelResult&)>& on_level,
                             const std::function<void(const std::string&)>& warn);

}  // namespace kiln::perf
