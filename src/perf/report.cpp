#include "perf/report.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::perf {
namespace {

using json = nlohmann::json;

bool rate_mode(const PerfOptions& o) { return o.mode == LoadMode::kRequestRate; }

// "1x12 2x40 4x3": inferences per batch size, the kMaxBatchSizes most frequent sizes (the JSON
// has them all).
constexpr size_t kMaxBatchSizes = 8;
std::string batch_text(const ServerCounters& c) {
  std::vector<std::pair<double, int64_t>> by_count;
  for (const auto& [size, n] : c.batches) by_count.emplace_back(n, size);
  std::sort(by_count.begin(), by_count.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::map<int64_t, double> shown;
  for (size_t i = 0; i < by_count.size() && i < kMaxBatchSizes; ++i)
    shown[by_count[i].second] = by_count[i].first;
  std::string s;
  for (const auto& [size, n] : shown)
    s += fmt::format("{}{}x{:.0f}", s.empty() ? "" : " ", size, n);
  if (by_count.size() > shown.size())
    s += fmt::format(" (+{} sizes)", by_count.size() - shown.size());
  return s.empty() ? "-" : s;
}

}  // namespace

ServerSplit server_split(const ServerCounters& c) {
  ServerSplit s;
  if (c.requests > 0) {
    s.queue_us = c.queue_us / c.requests;
    s.request_us = c.request_us / c.requests;
  }
  if (c.inferences > 0) {
    s.compute_us = c.compute_us / c.inferences;
    s.avg_batch = c.samples / c.inferences;
  }
  return s;
}

double throughput(const PerfOptions& o, const LevelResult& r) {
  return r.duration_s > 0 ? static_cast<double>(r.requests) * o.batch / r.duration_s : 0;
}

std::string table_header(const PerfOptions& o) {
  return fmt::format(
      "{:>12} {:>11} {:>9} {:>7} {:>10} {:>10} {:>10} {:>10} {:>9} {:>10} {:>6}  {}\n",
      rate_mode(o) ? "rate/s" : "concurrency", "infer/sec", "requests", "errors", "p50 us",
      "p90 us", "p99 us", "avg us", "queue us", "compute us", "batch", "batches formed");
}

std::string table_row(const PerfOptions& o, const LevelResult& r) {
  std::string server = fmt::format("{:>9} {:>10} {:>6}  {}", "-", "-", "-", "-");
  if (r.has_server) {
    const ServerSplit s = server_split(r.server);
    server = fmt::format("{:>9.0f} {:>10.0f} {:>6.2f}  {}", s.queue_us, s.compute_us, s.avg_batch,
                         batch_text(r.server));
  }
  return fmt::format("{:>12} {:>11.1f} {:>9} {:>7} {:>10.0f} {:>10.0f} {:>10.0f} {:>10.0f} {}\n",
                     fmt::format("{:g}", r.level), throughput(o, r), r.requests, r.errors,
                     r.latency.p50_us, r.latency.p90_us, r.latency.p99_us, r.latency.avg_us,
                     server);
}

std::string to_csv(const PerfOptions& o, const RunResult& run) {
  std::string out = fmt::format(
      "{},Inferences/Second,Requests,Errors,Server Queue,Server Compute Infer,Server Request,"
      "Avg Batch,p50 latency,p90 latency,p95 latency,p99 latency,Avg latency\n",
      rate_mode(o) ? "Request Rate" : "Concurrency");
  for (const LevelResult& r : run.levels) {
    std::string server = ",,,";
    if (r.has_server) {
      const ServerSplit s = server_split(r.server);
      server = fmt::format("{:.1f},{:.1f},{:.1f},{:.3f}", s.queue_us, s.compute_us, s.request_us,
                           s.avg_batch);
    }
    out += fmt::format("{:g},{:.2f},{},{},{},{:.1f},{:.1f},{:.1f},{:.1f},{:.1f}\n", r.level,
                       throughput(o, r), r.requests, r.errors, server, r.latency.p50_us,
                       r.latency.p90_us, r.latency.p95_us, r.latency.p99_us, r.latency.avg_us);
  }
  return out;
}

json to_json(const PerfOptions& o, const RunResult& run) {
  json levels = json::array();
  for (const LevelResult& r : run.levels) {
    json l = {
        {rate_mode(o) ? "request_rate" : "concurrency",
         rate_mode(o) ? json(r.level) : json(static_cast<int64_t>(r.level))},
        {"requests", r.requests},
        {"errors", r.errors},
        {"duration_s", r.duration_s},
        {"throughput_infer_per_s", throughput(o, r)},
        {"requests_per_s", r.duration_s > 0 ? static_cast<double>(r.requests) / r.duration_s : 0.0},
        {"latency_us",
         {{"avg", r.latency.avg_us},
          {"stddev", r.latency.stddev_us},
          {"min", r.latency.min_us},
          {"p50", r.latency.p50_us},
          {"p90", r.latency.p90_us},
          {"p95", r.latency.p95_us},
          {"p99", r.latency.p99_us},
          {"max", r.latency.max_us}}}};
    if (rate_mode(o)) l["delayed"] = r.delayed;
    json errors = json::array();
    for (const auto& [m, n] : r.error_messages) errors.push_back({{"message", m}, {"count", n}});
    l["error_messages"] = errors;
    if (r.has_server) {
      const ServerCounters& c = r.server;
      const ServerSplit s = server_split(c);
      json batches = json::object();
      for (const auto& [size, n] : c.batches) batches[std::to_string(size)] = n;
      l["server"] = {{"requests", c.requests},
                     {"inferences", c.inferences},
                     {"samples", c.samples},
                     {"padded_samples", c.padded_samples},
                     {"failed", c.failed},
                     {"rejected", c.rejected},
                     {"queue_us_per_request", s.queue_us},
                     {"compute_us_per_inference", s.compute_us},
                     {"request_us_per_request", s.request_us},
                     {"avg_batch", s.avg_batch},
                     {"batch_inferences", batches}};
    } else {
      l["server"] = nullptr;
    }
    levels.push_back(std::move(l));
  }
  json inputs = json::array();
  for (const InputPlan& in : run.plan.inputs)
    inputs.push_back(
        {{"name", in.tensor.name}, {"datatype", in.tensor.datatype}, {"shape", in.tensor.shape}});
  return {{"kiln_version", KILN_VERSION_STRING},
          {"model", o.model},
          {"model_version", o.version},
          {"protocol", o.protocol == Protocol::kGrpc ? "grpc" : "http"},
          {"url", o.url.text()},
          {"metrics_url", o.metrics ? json(o.metrics_url.text()) : json(nullptr)},
          {"shared_memory", o.shm ? "system" : "none"},
          {"batch_size", o.batch},
          {"mode", rate_mode(o) ? "request_rate" : "concurrency"},
          {"measurement_interval_ms", o.measurement_ms},
          {"max_requests", o.max_requests},
          {"inputs", inputs},
          {"stopped", run.stopped.empty() ? json(nullptr) : json(run.stopped)},
          {"server_counters", run.metrics_problem.empty() ? json("ok") : json(run.metrics_problem)},
          {"results", levels}};
}

}  // namespace kiln::perf
