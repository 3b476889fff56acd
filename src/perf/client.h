// A connection of kiln perf to kiln serve: the model's metadata, Triton's system shared memory
// registration, and one inference request sent again and again (HTTP/REST with binary tensors,
// or gRPC). Each load thread owns one client.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/status.h"
#include "perf/model_io.h"
#include "perf/options.h"

namespace kiln::perf {

// Where a request's tensors lie in a client's shared memory region (offsets in it).
struct ShmLayout {
  std::string region;
  std::vector<uint64_t> input_offsets, output_offsets;
};

class Client {
 public:
  virtual ~Client() = default;
  // The model's inputs and outputs (an error with the server's message, e.g. an unknown model).
  virtual Expected<ModelMeta> metadata(const std::string& model, const std::string& version) = 0;
  virtual Status register_shm(const std::string& name, const std::string& key, uint64_t size) = 0;
  virtual Status unregister_shm(const std::string& name) = 0;
  // Makes the request that infer() sends: the inputs' bytes in the request, or with `shm`
  // (whose region holds them already) references to the region, outputs included.
  virtual Status prepare(const RequestPlan& plan, const ShmLayout* shm) = 0;
  // Sends the request and checks the answer: OK, or the error (the server's message, a
  // transport error, a malformed or incomplete answer).
  virtual Status infer() = 0;
};

// Connects (an error naming the endpoint when nothing answers there).
Expected<std::unique_ptr<Client>> connect_http(const Endpoint& at, int timeout_ms);
Expected<std::unique_ptr<Client>> connect_grpc(const Endpoint& at, int timeout_ms);

// The body of GET `target` (an error unless the status is 200).
Expected<std::string> http_get(const Endpoint& at, const std::string& target, int timeout_ms);

// "/v2/models/NAME[/versions/V]", the name and version percent-encoded.
std::string model_path(const std::string& model, const std::string& version);

}  // namespace kiln::perf
