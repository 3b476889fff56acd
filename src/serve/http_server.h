// The HTTP/REST front end's transport: Boost.Beast on an Asio io_context run by a few threads.
// Each connection reads requests one after another; an infer request is handed to the core and
// the connection waits without a thread (the batcher's worker posts the answer back), so the
// number of connections is not bounded by threads. Bodies are read in large chunks; a body over
// the limit is answered 413 and the rest of it read and dropped (so the client reads the 413).
// The protocol itself is HttpApi's (http_api.h).
#pragma once

#include <memory>
#include <string>

#include "serve/server.h"

namespace kiln::serve {

struct HttpOptions {
  std::string host = "0.0.0.0";
  int port = 8080;
  size_t max_request_bytes = 64 << 20;
  int threads = 0;  // I/O threads; 0: a quarter of the cores, 2 to 8
  bool log_requests = false;
};

// Why `host`:`port` cannot be listened on ("cannot listen on HOST:PORT (WHAT): Address already
// in use"), or "" when it can: checked before the models load, so a taken port costs no wait.
std::string port_problem(const std::string& host, int port, const char* what);

class HttpServer {
 public:
  HttpServer(Core& core, HttpOptions options);
  ~HttpServer();
  // Binds and listens (port 0: any free one); an error says why not.
  Status bind();
  // The port bound.
  int port() const;
  // Serves until stop(); call from its own thread after bind().
  void serve();
  // Stops taking connections; requests being answered finish first (up to 30 s), then serve()
  // returns. Idle connections are closed.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
