// ModelInfer's messages <-> InferRequest and outputs (gRPC front end): raw_input_contents read
// where the parsed message holds them, typed contents converted once, shared memory regions in
// the tensors' parameters (Triton's); the response with every output in raw_output_contents, as
// Triton answers (an output written into shared memory: empty raw contents).
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <memory>
#include <vector>

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
// With `raw`, the raw output contents are not copied into `out` but listed there in order (an
// empty tensor for an output written to shared memory), for infer_response_buffer.
Check encode_grpc_infer(const InferRequest& req, const ServedModel& model, const Outputs& outputs,
                        const ShmRegistry& shm, inference::ModelInferResponse* out,
                        std::vector<Tensor>* raw = nullptr);
// The response as gRPC's slices: `head` serialized, then each of `raw` as a raw_output_contents
// field (Protocol Buffers read a message's fields in any order). An output of 64 KiB or more is
// a slice of its own memory, kept alive by the slice until gRPC has sent it: no copy.
grpc::ByteBuffer infer_response_buffer(const inference::ModelInferResponse& head,
                                       std::vector<Tensor> raw);

}  // namespace kiln::serve
