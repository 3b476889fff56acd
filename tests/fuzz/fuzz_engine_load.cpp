// libFuzzer harness: bytes -> kiln Engine for the CPU backend, as `kiln run` loads an engine file
// (Engine::load: read_plan_file, the header, metadata, graph and weights sections, verify_graph,
// the target check), then create_context (the CPU executor and the stored profile).
// docs/engine-format.md promises that every offset, size, count and reference is checked even
// when the checksum is forged, so the harness forges it: before loading, it writes the input's
// size into the header and reseals the XXH64 trailer, letting mutations reach the sections
// instead of stopping at "checksum mismatch". The bytes go through a memfd (no disk).
// tests/fuzz/README.md says how to build and run it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/plan_format.h"
#include "kiln/engine.h"

namespace {
int memfd() {
  static const int fd = memfd_create("kiln-fuzz-engine", 0);
  return fd;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace pi = kiln::plan_internal;
  std::vector<uint8_t> image(data, data + size);
  if (image.size() >= pi::kOffFileSize + 8) pi::store_u64(image.data() + pi::kOffFileSize, image.size());
  pi::reseal(image);
  const int fd = memfd();
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 ||
      (size && pwrite(fd, image.data(), image.size(), 0) != static_cast<ssize_t>(image.size())))
    std::abort();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto engine = kiln::Engine::load(path);
  if (!engine.ok()) {
    if (engine.status().message().empty()) std::abort();  // an error says what is wrong
    return 0;
  }
  auto ctx = (*engine)->create_context();
  if (!ctx.ok() && ctx.status().message().empty()) std::abort();
  return 0;
}
