// Kernels generated at build time: CUDA source written by a tactic for one layer (a fused
// region's op list), compiled by NVRTC into a cubin for this GPU, and kept by key.
//
// A tactic registers its source with add_source(), which returns the key ("rtc:" and a 64-bit
// hash of the source): the tactic's variant, so that the tuner's timing cache and the engine
// name the kernel. kernel() compiles on first use (NVRTC, opened with dlopen: libkiln has no
// link dependency on it) and loads the cubin as a context-independent CUDA library. Engines
// store the cubins of the kernels their plan names (plan.cpp: "kernels"), and timing caches
// every cubin they have seen, so `kiln run` needs no compiler and a rebuild does not recompile.
// One process-wide store, safe to use from several threads.
#pragma once

#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/status.h"

namespace kiln::gpu::rtc {

constexpr const char* kKeyPrefix = "rtc:";

// Keeps `source` (the whole translation unit; it may include nothing) and returns its key.
// KILN_RTC_DUMP=DIR also writes each new source to DIR/<hash>.cu.
std::string add_source(const std::string& source);

// The __global__ function `name` (extern "C") of the key's module, loaded for every device.
// Compiles the source for the current device's architecture where no cubin is known yet.
Expected<cudaKernel_t> kernel(const std::string& key, const char* name);

// The cubins known for `keys` (compiling any whose source is known but not yet compiled), as
// {key: base64}. Keys that are not rtc keys are skipped.
Expected<nlohmann::json> export_cubins(const std::vector<std::string>& keys);
// Every cubin compiled or imported so far, as {key: base64}.
nlohmann::json export_all();
// Adds cubins written by export_*(): an entry that is not base64 is an error naming its key.
Status import_cubins(const nlohmann::json& j);

// Compiles the key's source for compute capability `sm` (90: sm_90) and returns the cubin's
// size without keeping it: a test that generated sources compile, on a machine without a GPU.
Expected<size_t> compile_check(const std::string& key, int sm);

// NVRTC compilations in this process so far, and the seconds they took (the build's --verbose
// summary).
struct CompileStats {
  uint64_t kernels = 0;
  double seconds = 0;
};
CompileStats compile_stats();

// Whether NVRTC can be opened here (a machine without the CUDA toolkit's libnvrtc can still run
// engines whose cubins are stored, but cannot build new kernels).
bool compiler_available(std::string* why = nullptr);

}  // namespace kiln::gpu::rtc
