// ModelInfer's messages <-> InferRequest and outputs (gRPC front end): raw_input_contents read
// where the parsed message holds them, typed contents converted once, shared memory regions in
// the tensors' parameters (Triton's); the response with every output in raw_output_contents, as
// Triton answers (an output written into shared memory: empty raw contents).
#pragma once

#include <memory>

#include "grpc_predict_v2.pb.h"
#include "serve/model.h"
#include "serve/shm.h"
#include "serve/types.h"

namespace kiln::serve {

// Why `n` bytes that protobuf could not parse are not a ModelInferRequest: its top-level fields
// scanned for a truncated message, a wire type it has not, a varint over 10 bytes.
std::string why_not_a_message(const uint8_t* p, size_t n);

// Decodes a parsed request (kept alive by the inputs that view it).
Result<InferRequest> decode_grpc_infer(std::shared_ptr<const inference::ModelInferRequest> msg,
                                       const ShmRegistry& shm);
// Fills `out` for `req` (checked: ServedModel::check_outputs) with the model's `outputs`.
Check encode_grpc_infer(const InferRequest& req, const ServedModel& model, const Outputs& outputs,
                        const ShmRegistry& shm, inference::ModelInferResponse* out);

}  // namespace kiln::serve
