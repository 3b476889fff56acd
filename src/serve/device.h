// The few CUDA runtime calls the server needs, compiled to nothing without CUDA.
#pragma once

#include <string>

namespace kiln::serve {

// GPUs visible to this process (0 without CUDA or a GPU).
int visible_gpus();
// Makes `device` current for this thread (-1: leaves it); false when CUDA refuses.
bool use_device(int device);
// How threads wait for the GPUs ("block", "spin"): each device context's scheduling flag, set
// before any context exists. "" when set (or nothing to set), else why not.
std::string set_gpu_wait(bool spin);

}  // namespace kiln::serve
