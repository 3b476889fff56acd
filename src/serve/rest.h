// The Open Inference Protocol's REST infer body: JSON tensors (flat or nested `data`) and the
// binary-tensor extension (a JSON header of Inference-Header-Content-Length bytes, then each
// binary input's bytes in order), decoded into an InferRequest; and the response, each output
// binary where its `binary_data` parameter (or the request's `binary_data_output`) asks, else
// JSON, or written into a shared memory region.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "serve/model.h"
#include "serve/shm.h"
#include "serve/types.h"

namespace kiln::serve {

// Decodes `body` (kept alive by the request's binary inputs, which view it). `header_length`:
// the Inference-Header-Content-Length header's value, when given. Shared memory inputs are read
// through `shm`. `model` and `version` come from the path.
Result<InferRequest> decode_rest_infer(std::shared_ptr<const std::string> body,
                                       const std::optional<std::string>& header_length,
                                       const ShmRegistry& shm);

struct RestBody {
  std::string body;
  std::optional<size_t> json_length;  // set when binary outputs follow the JSON
};
// The response to `req` (checked: ServedModel::check_outputs) with the model's `outputs`.
Result<RestBody> encode_rest_infer(const InferRequest& req, const ServedModel& model,
                                   const Outputs& outputs, const ShmRegistry& shm);
// Before the inference: every output region of `req` exists and the span lies within it.
Check check_output_regions(const InferRequest& req, const ShmRegistry& shm);

// {"error": message} as the protocol answers errors.
std::string error_json(const std::string& message);

}  // namespace kiln::serve
