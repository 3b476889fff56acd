// The Open Inference Protocol's REST API, apart from the transport (http_server.cpp carries it
// over Boost.Beast): health, server and model metadata and readiness, Triton's model
// configuration and repository index, infer (JSON and binary tensors), Triton's system shared
// memory endpoints, and /metrics. Every error is a status and {"error": one line}.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "serve/server.h"

namespace kiln::serve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // the request target as sent: path (percent-encoded) and query
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  // True once the client has closed its connection (the transport watches it while the
  // request waits); empty when the transport cannot tell.
  std::function<bool()> gone;
};

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

class HttpApi {
 public:
  HttpApi(Core& core, size_t max_request_bytes) : core_(core), limit_(max_request_bytes) {}
  // Answers `req` through `send`: at once, or (infer) from the batcher's worker thread.
  void handle(HttpRequest req, std::function<void(HttpReply)> send);
  // The 413 of a body over the limit (`length`: its Content-Length, 0 when not known).
  HttpReply too_large(uint64_t length) const;
  size_t limit() const { return limit_; }

 private:
  void infer(HttpRequest& req, const std::string& model, const std::string& version,
             std::function<void(HttpReply)> send);
  HttpReply shared_memory(const HttpRequest& req, const std::string& path);
  HttpReply register_cuda(ShmRegistry& reg, const std::string& name, const nlohmann::json& body);
  Core& core_;
  size_t limit_;
};

// A path's segments, percent-decoded ("/v2/models/a%2Fb/infer" -> v2, models, a/b, infer); the
// query is dropped. False when an escape is malformed.
bool path_segments(const std::string& target, std::vector<std::string>* out);

}  // namespace kiln::serve
