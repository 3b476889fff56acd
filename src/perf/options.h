// What `kiln perf` measures and how: the options of a run, and the parsers of its flag values
// (perf_analyzer's ranges, URLs, --shape), kept apart from the CLI so that they can be tested.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::perf {

enum class Protocol { kHttp, kGrpc };
enum class LoadMode { kConcurrency, kRequestRate };

// kiln serve's default ports (perf_analyzer's are Triton's 8000 and 8001).
constexpr int kDefaultHttpPort = 8080;
constexpr int kDefaultGrpcPort = 8081;

struct Endpoint {
  std::string host = "localhost";
  int port = kDefaultHttpPort;
  // "host:port" ("[::1]:port" for an IPv6 address), as gRPC and the Host header take it.
  std::string text() const;
};

struct PerfOptions {
  std::string model, version;  // version "": the server's default (the highest)
  Protocol protocol = Protocol::kHttp;
  Endpoint url;
  Endpoint metrics_url;  // where /metrics is read (HTTP)
  bool metrics = true;
  LoadMode mode = LoadMode::kConcurrency;
  std::vector<double> levels = {1};  // concurrencies, or request rates (requests/s)
  bool poisson = false;              // request rate: exponential gaps instead of even ones
  int batch = 1;
  bool shm = false;                   // Triton's system shared memory for inputs and outputs
  uint64_t output_shm_size = 102400;  // bytes of an output whose size the metadata leaves open
  std::string input_data = "random";  // random, zero, or a folder of raw files named by input
  std::map<std::string, std::vector<int64_t>> shapes;  // --shape: dims past the batch
  int measurement_ms = 5000;                           // each level's measurement window
  uint64_t max_requests = 0;  // a level stops after this many requests (0: the window only)
  double time_limit_s = 600;  // the whole run stops after this long
  int max_threads = 16;       // request rate: the threads that send
  int timeout_ms = 30000;     // one request's deadline
  uint64_t seed = 0;
};

// perf_analyzer's "start[:end[:step]]" (end defaults to start, step to 1); kiln also takes a
// step of "xK" (multiply by K: "1:256:x2" is 1, 2, 4, ..., 256). `integral`: whole numbers >= 1
// (concurrencies), else positive numbers (request rates).
Expected<std::vector<double>> parse_range(const std::string& text, const std::string& flag,
                                          bool integral);

// "host[:port]", optionally after "http://" or "grpc://" and before a path ("/metrics");
// IPv6 addresses in brackets.
Expected<Endpoint> parse_endpoint(const std::string& text, int default_port,
                                  const std::string& flag);

// True for names that can only mean this machine: localhost, 127.0.0.0/8, ::1.
bool is_loopback(const std::string& host);

// --shape values "name:d1,d2,..." (perf_analyzer's; the name may itself hold ':').
Expected<std::map<std::string, std::vector<int64_t>>> parse_shape_specs(
    const std::vector<std::string>& specs);

}  // namespace kiln::perf
