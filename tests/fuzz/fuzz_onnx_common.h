// What the harnesses that take ONNX bytes share (fuzz_onnx_import, fuzz_build).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>

#include "onnx/importer.h"

namespace kiln::fuzz {

// External data is resolved relative to the model's folder: an empty one, so a fuzzed model can
// only name files that are not there (the path checks are exercised all the same).
inline const std::string& empty_model_dir() {
  static const std::string dir = [] {
    char tmpl[] = "/tmp/kiln-fuzz-onnx-XXXXXX";
    const char* d = mkdtemp(tmpl);
    return std::string(d ? d : "/nonexistent");
  }();
  return dir;
}

// The importer's and the optimizer's warnings would flood the log. Only the stdio stream moves:
// file descriptor 2, where libFuzzer and the sanitizers report, stays open.
inline void quiet_stderr() {
  if (FILE* null = std::fopen("/dev/null", "w")) stderr = null;
}

// The bytes imported as `kiln build` reads a model; an error without a message aborts (a finding).
inline Expected<std::unique_ptr<Graph>> import_fuzzed(const uint8_t* data, size_t size) {
  auto g = import_onnx_bytes(std::string(reinterpret_cast<const char*>(data), size),
                             empty_model_dir(), "fuzz.onnx");
  if (!g.ok() && g.status().message().empty()) std::abort();
  return g;
}

}  // namespace kiln::fuzz
