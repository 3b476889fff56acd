// Which backends this build and machine can use.
#pragma once

#include <string>

namespace kiln {

// Number of CUDA GPUs visible (0 without a driver/GPU or in a build without CUDA); `why` gets
// the reason when there are none.
int cuda_device_count(std::string* why = nullptr);
// True when this build contains an executable CUDA backend.
bool cuda_backend_built();

}  // namespace kiln
