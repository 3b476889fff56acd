// kiln perf's reports: the table on stdout (a row per level, as perf_analyzer's summary), the
// latency report CSV (-f, perf_analyzer's column names where they mean the same) and JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "perf/load.h"
#include "perf/options.h"

namespace kiln::perf {

// What the server's counters say about a level, per request.
struct ServerSplit {
  double queue_us = 0;    // a request's wait in the queue
  double compute_us = 0;  // an inference's compute (which each request in it waited for)
  double request_us = 0;  // a request from queueing to its outputs
  double avg_batch = 0;   // samples per inference (padding aside), as `batches formed` counts
};
ServerSplit server_split(const ServerCounters& c);

std::string table_header(const PerfOptions& o);
std::string table_row(const PerfOptions& o, const LevelResult& r);
std::string to_csv(const PerfOptions& o, const RunResult& run);
nlohmann::json to_json(const PerfOptions& o, const RunResult& run);

// Inferences (samples) a second: answered requests times the batch size, over the duration.
double throughput(const PerfOptions& o, const LevelResult& r);

}  // namespace kiln::perf
