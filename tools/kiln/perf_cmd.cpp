// kiln perf: load kiln serve as Triton's perf_analyzer loads Triton (its flag names where they
// mean the same): a concurrency sweep or request rates over HTTP or gRPC, with or without
// system shared memory; throughput, latency percentiles and the server's own queue and compute
// time from /metrics (src/perf/).
#include <signal.h>

#include <fstream>
#include <iostream>

#include "cli.h"
#include "perf/load.h"
#include "perf/report.h"

namespace kiln::cli {
namespace {

struct PerfFlags {
  std::string model, version, url, protocol = "http", concurrency, rate, distribution = "constant";
  std::string shared_memory = "none", input_data = "random", csv, json, metrics_url;
  std::vector<std::string> shapes;
  int batch = 1, measurement_ms = 5000, max_threads = 16, timeout_ms = 30000;
  uint64_t max_requests = 0, output_shm_size = 102400, seed = 0;
  double time_limit_s = 600;
  bool allow_remote = false, no_metrics = false;
};

Expected<perf::PerfOptions> to_options(const PerfFlags& f) {
  perf::PerfOptions o;
  o.model = f.model;
  o.version = f.version;
  if (f.protocol == "http" || f.protocol == "HTTP")
    o.protocol = perf::Protocol::kHttp;
  else if (f.protocol == "grpc" || f.protocol == "gRPC" || f.protocol == "GRPC")
    o.protocol = perf::Protocol::kGrpc;
  else
    return KILN_ERROR("-i takes grpc or http, not '{}'", f.protocol);
  const bool grpc = o.protocol == perf::Protocol::kGrpc;
  const int port = grpc ? perf::kDefaultGrpcPort : perf::kDefaultHttpPort;
  KILN_ASSIGN_OR_RETURN(o.url,
                        perf::parse_endpoint(f.url.empty() ? "localhost" : f.url, port, "-u"));
  if (!f.metrics_url.empty()) {
    KILN_ASSIGN_OR_RETURN(o.metrics_url, perf::parse_endpoint(f.metrics_url, perf::kDefaultHttpPort,
                                                              "--metrics-url"));
  } else {
    // Over HTTP /metrics is on the same port; over gRPC on kiln serve's default REST port.
    o.metrics_url = o.url;
    if (grpc) o.metrics_url.port = perf::kDefaultHttpPort;
  }
  o.metrics = !f.no_metrics;
  if (!f.allow_remote) {
    if (!perf::is_loopback(o.url.host))
      return KILN_ERROR(
          "-u {}: '{}' is not this machine; kiln perf loads localhost only unless "
          "--allow-remote is given",
          f.url, o.url.host);
    if (o.metrics && !perf::is_loopback(o.metrics_url.host))
      return KILN_ERROR(
          "--metrics-url {}: '{}' is not this machine; kiln perf reads localhost "
          "only unless --allow-remote is given",
          f.metrics_url, o.metrics_url.host);
  }
  if (!f.concurrency.empty() && !f.rate.empty())
    return KILN_ERROR("--concurrency-range and --request-rate-range exclude each other");
  if (!f.rate.empty()) {
    o.mode = perf::LoadMode::kRequestRate;
    KILN_ASSIGN_OR_RETURN(o.levels, perf::parse_range(f.rate, "--request-rate-range", false));
  } else {
    KILN_ASSIGN_OR_RETURN(o.levels, perf::parse_range(f.concurrency.empty() ? "1" : f.concurrency,
                                                      "--concurrency-range", true));
  }
  if (f.distribution != "constant" && f.distribution != "poisson")
    return KILN_ERROR("--request-distribution takes constant or poisson, not '{}'", f.distribution);
  o.poisson = f.distribution == "poisson";
  if (f.shared_memory == "cuda")
    return KILN_ERROR(
        "--shared-memory cuda: kiln serve has system shared memory only (use system)");
  if (f.shared_memory != "none" && f.shared_memory != "system")
    return KILN_ERROR("--shared-memory takes none or system, not '{}'", f.shared_memory);
  o.shm = f.shared_memory == "system";
  o.output_shm_size = f.output_shm_size;
  o.batch = f.batch;
  o.input_data = f.input_data;
  KILN_ASSIGN_OR_RETURN(o.shapes, perf::parse_shape_specs(f.shapes));
  o.measurement_ms = f.measurement_ms;
  o.max_requests = f.max_requests;
  o.time_limit_s = f.time_limit_s;
  o.max_threads = f.max_threads;
  o.timeout_ms = f.timeout_ms;
  o.seed = f.seed;
  return o;
}

Status write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  if (!f) return KILN_ERROR("{}: cannot write '{}'", flag, path);
  return Status::Ok();
}

Status run_perf_command(const PerfFlags& f) {
  KILN_ASSIGN_OR_RETURN(perf::PerfOptions o, to_options(f));
  signal(SIGPIPE, SIG_IGN);  // a server that goes away mid-request is an error counted, not death
  // Refuse an unwritable report before the load, not after it.
  for (auto [path, flag] : {std::pair{f.csv, "-f"}, std::pair{f.json, "--json"}}) {
    if (path.empty() || path == "-") continue;
    std::ofstream probe(path, std::ios::app);
    if (!probe) return KILN_ERROR("{}: cannot write '{}'", flag, path);
  }
  const bool table = f.json != "-";
  if (table) {
    std::cout << fmt::format(
        "kiln perf: model '{}' over {} at {}, batch {}, shared memory {}, {} ms windows{}\n",
        o.model, o.protocol == perf::Protocol::kGrpc ? "gRPC" : "HTTP", o.url.text(), o.batch,
        o.shm ? "system" : "none", o.measurement_ms,
        o.max_requests ? fmt::format(" of at most {} requests", o.max_requests) : "");
  }
  bool header = false;
  auto on_level = [&](const perf::LevelResult& r) {
    if (!table) return;
    if (!header) std::cout << perf::table_header(o);
    header = true;
    std::cout << perf::table_row(o, r) << std::flush;
  };
  auto warn = [](const std::string& m) { std::cerr << "kiln perf: warning: " << m << std::endl; };
  KILN_ASSIGN_OR_RETURN(perf::RunResult run, perf::run_perf(o, on_level, warn));
  if (!f.csv.empty()) KILN_RETURN_IF_ERROR(write_file(f.csv, perf::to_csv(o, run), "-f"));
  if (f.json == "-")
    std::cout << perf::to_json(o, run).dump(2) << "\n";
  else if (!f.json.empty())
    KILN_RETURN_IF_ERROR(write_file(f.json, perf::to_json(o, run).dump(2) + "\n", "--json"));

  uint64_t ok = 0, errors = 0;
  std::string first;
  for (const perf::LevelResult& r : run.levels) {
    ok += r.requests;
    errors += r.errors;
    if (first.empty() && !r.error_messages.empty()) first = r.error_messages.begin()->first;
  }
  if (run.stopped == "interrupted")
    return KILN_ERROR("interrupted after {} of {} levels (reports hold those)", run.levels.size(),
                      o.levels.size());
  if (errors && !ok) return KILN_ERROR("every request failed ({} of them): {}", errors, first);
  if (errors) warn(fmt::format("{} requests failed, e.g.: {}", errors, first));
  if (!run.stopped.empty()) warn(run.stopped);
  return Status::Ok();
}

}  // namespace

Runner add_perf_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "perf",
      "Load a kiln serve (Triton's perf_analyzer's flags): throughput, latency percentiles, the "
      "server's queue and compute time and the batches it formed");
  auto f = std::make_shared<PerfFlags>();
  cmd->add_option("-m,--model-name", f->model, "Model to load")->required();
  cmd->add_option("-x,--model-version", f->version, "Version (default: the server's, the highest)");
  cmd->add_option("-u,--url", f->url,
                  "Server HOST:PORT (default localhost:8080 over HTTP, localhost:8081 over gRPC)");
  cmd->add_option("-i,--protocol", f->protocol, "grpc or http (default http)");
  cmd->add_option("--concurrency-range", f->concurrency,
                  "Clients each with one request in flight, START[:END[:STEP]]; a STEP of xK "
                  "multiplies (1:64:x2). Default 1");
  cmd->add_option("--request-rate-range", f->rate,
                  "Requests started a second, START[:END[:STEP]], by --max-threads clients");
  cmd->add_option("--request-distribution", f->distribution,
                  "Request rate: constant (even gaps) or poisson");
  cmd->add_option("-p,--measurement-interval", f->measurement_ms,
                  "Milliseconds measured per level (default 5000)")
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--max-requests", f->max_requests,
                  "A level ends after this many requests, if its window has not (default: no "
                  "limit)");
  cmd->add_option("--time-limit", f->time_limit_s,
                  "Seconds the whole sweep may take; levels past it are not run (default 600)")
      ->check(CLI::Range(0.001, 864000.0));
  cmd->add_option("--shared-memory", f->shared_memory,
                  "none, or system: inputs and outputs in a POSIX shared memory region per client "
                  "(Triton's system shared memory), unregistered and unlinked at exit");
  cmd->add_option("--output-shared-memory-size", f->output_shm_size,
                  "Shared memory: bytes reserved per output, at least (default 102400; more where "
                  "the metadata makes an output larger)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 34));
  cmd->add_option("-b,--batch-size", f->batch,
                  "Samples a request: the dynamic leading dimension (default 1)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--input-data", f->input_data,
                  "random (default), zero, a folder of raw files named after the inputs, or a "
                  "JSON file as perf_analyzer's ({\"data\": [{\"INPUT\": [values]}]}); one "
                  "sample's data is repeated over the batch");
  cmd->add_option("--shape", f->shapes,
                  "NAME:D1,D2,...: an input's dims past the batch where the model leaves them "
                  "dynamic (repeat per input)");
  cmd->add_option("-f,--latency-report-file", f->csv, "Write the results as CSV here");
  cmd->add_option("--json", f->json, "Write the results as JSON here ('-': on stdout, no table)");
  cmd->add_option("--metrics-url", f->metrics_url,
                  "HOST:PORT of the server's /metrics (default: -u over HTTP, port 8080 over "
                  "gRPC)");
  cmd->add_flag("--no-metrics", f->no_metrics, "Do not read the server's counters");
  cmd->add_option("--max-threads", f->max_threads,
                  "Request rate: the clients that send (default 16)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--request-timeout-ms", f->timeout_ms,
                  "A request not answered in this long counts as an error (default 30000)")
      ->check(CLI::Range(1, 3600000));
  cmd->add_option("--seed", f->seed, "Seed of the random input data and poisson gaps");
  cmd->add_flag("--allow-remote", f->allow_remote,
                "Allow a server that is not on this machine (by default only localhost)");
  return [f]() { return run_perf_command(*f); };
}

}  // namespace kiln::cli
