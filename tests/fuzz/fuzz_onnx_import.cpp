// libFuzzer harness: bytes -> ONNX ModelProto -> kiln Graph, as `kiln build` reads a model
// (import_onnx_bytes: protobuf parse, unsupported-op check, initializers, Constant nodes, upgrade
// to the newest opset form, shape inference, verify_graph). Every input must come back as a
// value or a Status; a crash, a sanitizer report, a hang or an unbounded allocation is a bug.
// A graph that imports is also written as an engine image and read back: serialize_plan refuses
// what the reader would refuse, so a written image that does not read back is a bug too.
// tests/fuzz/README.md says how to build and run it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/plan_format.h"
#include "fuzz_onnx_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kiln::fuzz::quiet_stderr();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = kiln::fuzz::import_fuzzed(data, size);
  if (!g.ok()) return 0;
  kiln::EngineMetadata meta;
  meta.backend = "cpu";
  meta.target = "fuzz";
  auto image = kiln::serialize_plan(**g, meta);
  if (!image.ok()) return 0;
  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(*image));
  auto back = kiln::deserialize_plan(shared, "fuzz.kiln");
  if (!back.ok()) {
    std::fprintf(stdout, "written engine image does not read back: %s\n",
                 back.status().message().c_str());
    std::abort();
  }
  return 0;
}
