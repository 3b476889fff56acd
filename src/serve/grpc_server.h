// The Open Inference Protocol's gRPC front end (grpc++'s callback API: a call is a reactor that
// the batcher's worker finishes, so no thread waits per call), with Triton's repository index
// and system shared memory methods. ModelInfer takes the serialized request itself, so that a
// malformed message is INVALID_ARGUMENT saying so (gRPC's own parsing would answer INTERNAL).
#pragma once

#include <memory>
#include <string>

#include "serve/server.h"

namespace kiln::serve {

struct GrpcOptions {
  std::string host = "0.0.0.0";
  int port = 8081;
  size_t max_request_bytes = 64 << 20;
  bool log_requests = false;
};

class GrpcServer {
 public:
  GrpcServer(Core& core, GrpcOptions options);
  ~GrpcServer();
  // Binds the port and starts serving; an error says why not.
  Status start();
  // Stops taking calls; calls in progress finish first (up to a few seconds).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serve
