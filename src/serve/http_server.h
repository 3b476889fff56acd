// The Open Inference Protocol's HTTP/REST front end (cpp-httplib): health, server and model
// metadata and readiness, the repository index, infer (JSON and binary tensors), Triton's system
// shared memory endpoints, and /metrics. Each connection is served by a thread of a pool; an
// infer request waits on its thread for the batcher to answer it.
#pragma once

#include <memory>
#include <string>

#include "serve/server.h"

namespace kiln::serve {

struct HttpOptions {
  std::string host = "0.0.0.0";
  int port = 8080;
  size_t max_request_bytes = 64 << 20;
  int threads = 64;       // connections served at once (more wait for a thread)
  bool log_requests = false;
};

// Why `host`:`port` cannot be listened on ("cannot listen on HOST:PORT (WHAT): Address already
// in use"), or "" when it can: checked before the models load, so a taken port costs no wait.
std::string port_problem(const std::string& host, int port, const char* what);

class HttpServer {
 public:
  HttpServer(Core& core, HttpOptions options);
  ~HttpServer();
  // Binds the port (0: any free one); an error says why not.
  Status bind();
  // The port bound.
  int port() const;
  // Serves until stop(); call from its own thread after bind().
  void serve();
  // Stops taking connections; requests being answered finish first (serve() returns then).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
