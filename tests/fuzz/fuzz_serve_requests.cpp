// libFuzzer harness over `kiln serve`'s request decoding (src/serve): the first byte picks the
// REST decoder (JSON and binary tensors: the next two bytes, when the first's bit 1 is set, give
// the Inference-Header-Content-Length) or the gRPC one (a ModelInferRequest parsed by protobuf
// and decoded, or explained when it does not parse). Every refusal must be a 4xx with a one-line
// message; anything else (a crash, a sanitizer report, a 5xx) is a finding.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "serve/rest.h"
#include "serve/shm.h"
#ifdef KILN_SERVE_GRPC
#include "serve/grpc_codec.h"
#endif

namespace {

void check(const kiln::serve::ApiError& e) {
  if (e.status < 400 || e.status >= 500 || e.message.empty() ||
      e.message.find('\n') != std::string::npos)
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::serve;
  if (size < 1) return 0;
  static ShmRegistry shm;  // none registered: a region named is an unknown one
  const uint8_t mode = data[0];
  ++data, --size;
  if (mode % 2 == 0) {
    std::optional<std::string> header_length;
    if (mode & 2) {
      if (size < 2) return 0;
      header_length = std::to_string(data[0] | (data[1] << 8));
      data += 2, size -= 2;
    }
    auto body = std::make_shared<const std::string>(reinterpret_cast<const char*>(data), size);
    auto r = decode_rest_infer(body, header_length, shm);
    if (!r.ok()) check(r.error());
    return 0;
  }
#ifdef KILN_SERVE_GRPC
  auto msg = std::make_shared<inference::ModelInferRequest>();
  if (!msg->ParseFromArray(data, static_cast<int>(size))) {
    if (why_not_a_message(data, size).empty()) std::abort();
    return 0;
  }
  auto r = decode_grpc_infer(msg, shm);
  if (!r.ok()) check(r.error());
#endif
  return 0;
}
